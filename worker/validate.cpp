#include "worker/validate.hpp"

#include "core/dtype_convert.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace flashtune {

namespace {

double finite_or_big(double x) { return std::isfinite(x) ? x : 1e30; }

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

}  // namespace

double unit_roundoff(DType t) {
  switch (t) {
    case DType::fp32: return 0x1p-24;
    case DType::fp16: return 0x1p-11;
    case DType::bf16: return 0x1p-8;
  }
  return 0;
}

double report_floor(DType t) {
  switch (t) {
    case DType::fp32: return 1e-5;
    case DType::fp16: return 2e-3;
    case DType::bf16: return 1e-2;
  }
  return 0;
}

double subnormal_rounding(DType t) {
  // The kernels compute P and dS in fp32 with flush-to-zero (ex2.approx.ftz, -ftz): anything below
  // fp32's smallest normal 2^-126 may become 0, whatever the format it is stored in. fp16 also rounds
  // P and dS to its own subnormals, half of whose spacing is 2^-25.
  switch (t) {
    case DType::fp32: return 0x1p-126;
    case DType::fp16: return 0x1p-25;
    case DType::bf16: return 0x1p-126;
  }
  return 0;
}

ToleranceModel forward_tolerance(DType t, int seq_k, int head_dim, double floor_scale) {
  return {kFwdSafety, unit_roundoff(t), std::sqrt((double)seq_k) + std::sqrt((double)head_dim),
          kFwdSafety * subnormal_rounding(t) * std::max(floor_scale, 1.0)};
}

ToleranceModel backward_tolerance(DType t, int seq_q, int seq_k, int head_dim, double floor_scale) {
  return {kBwdSafety, unit_roundoff(t), std::sqrt((double)std::max(seq_q, seq_k)) + std::sqrt((double)head_dim),
          kBwdSafety * subnormal_rounding(t) * std::max(floor_scale, 1.0)};
}

namespace {
double max_abs_of(const float* x, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs((double)x[i]));
  return m;
}
// "a; b; c" -> {a, b, c} (an example holds no "; ").
std::vector<std::string> split_examples(const std::string& s) {
  std::vector<std::string> out;
  size_t from = 0;
  while (from < s.size()) {
    const size_t at = s.find("; ", from);
    out.push_back(s.substr(from, at == std::string::npos ? std::string::npos : at - from));
    if (at == std::string::npos) break;
    from = at + 2;
  }
  return out;
}

// body(c) for c in [0, chunks) on up to `threads` threads (0: every core), each chunk on one thread.
template <class Body>
void for_each_chunk(size_t chunks, int threads, Body body) {
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t workers = std::min<size_t>(chunks, threads > 0 ? (size_t)threads : cores);
  if (workers <= 1) {
    for (size_t c = 0; c < chunks; ++c) body(c);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> ts;
  for (size_t w = 0; w < workers; ++w)
    ts.emplace_back([&] {
      for (size_t c = next++; c < chunks; c = next++) body(c);
    });
  for (auto& t : ts) t.join();
}
size_t chunks_of(size_t n) { return std::max<size_t>(1, (n + kCompareChunk - 1) / kCompareChunk); }

// fp16 values as floats, one table (256 KiB) built once with fp16_to_float: x86-64's baseline has no
// conversion instruction, and the backward converts 10^8 elements per evaluation.
const float* fp16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = fp16_to_float((uint16_t)h);
    return t;
  }();
  return table.data();
}

// Element i of an output as a float, by its format (Load for OutputTensor's dtype).
struct LoadFp32 {
  const float* p;
  float operator()(size_t i) const { return p[i]; }
};
struct LoadBf16 {
  const uint16_t* p;
  float operator()(size_t i) const { return bf16_to_float(p[i]); }
};
struct LoadFp16 {
  const uint16_t* p;
  const float* table;
  float operator()(size_t i) const { return table[p[i]]; }
};
// f(load) with the loader of the tensor's format.
template <class F>
auto with_loader(const OutputTensor& t, F f) {
  switch (t.dtype) {
    case DType::bf16: return f(LoadBf16{static_cast<const uint16_t*>(t.data)});
    case DType::fp16: return f(LoadFp16{static_cast<const uint16_t*>(t.data), fp16_table()});
    case DType::fp32: break;
  }
  return f(LoadFp32{static_cast<const float*>(t.data)});
}

// Elements of [begin, end) whose exponent bits are all ones (NaN or infinite; with nan_only, NaN only), from
// the bits: no conversion.
template <class Bits>
size_t count_non_finite_bits(const Bits* x, size_t begin, size_t end, Bits exp, bool nan_only) {
  const Bits magnitude = (Bits)~(Bits)(Bits{1} << (8 * sizeof(Bits) - 1));  // all but the sign
  // Blocks of 4096 counted in the elements' own width (the compiler vectorizes these loops; with a 64-bit
  // count it widens every lane: half the speed).
  constexpr size_t kBlock = 4096;
  size_t n = 0;
  for (size_t from = begin; from < end; from += kBlock) {
    const size_t to = std::min(end, from + kBlock);
    Bits block = 0;
    if (nan_only)
      for (size_t i = from; i < to; ++i) block += (Bits)(x[i] & magnitude) > exp;
    else
      for (size_t i = from; i < to; ++i) block += (Bits)(x[i] & exp) == exp;
    n += block;
  }
  return n;
}
size_t count_non_finite_in(const OutputTensor& t, size_t begin, size_t end, bool nan_only) {
  if (t.dtype == DType::fp32)
    return count_non_finite_bits(static_cast<const uint32_t*>(t.data), begin, end, uint32_t{0x7f800000}, nan_only);
  const uint16_t exp = t.dtype == DType::bf16 ? 0x7f80 : 0x7c00;  // the exponent field
  return count_non_finite_bits(static_cast<const uint16_t*>(t.data), begin, end, exp, nan_only);
}
size_t count_non_finite(const OutputTensor& t, int threads, bool nan_only = false) {
  std::vector<size_t> counts(chunks_of(t.size));
  for_each_chunk(counts.size(), threads, [&](size_t c) {
    counts[c] = count_non_finite_in(t, c * kCompareChunk, std::min(t.size, (c + 1) * kCompareChunk), nan_only);
  });
  size_t n = 0;
  for (size_t x : counts) n += x;
  return n;
}

// One backward output's comparison over a range of its elements: the error statistics, the elements that are
// not finite, and the relative L2 error's sums (of finite elements). alignas: each chunk's on its own cache
// lines (chunks are stored side by side and written by different threads).
struct alignas(64) OutputCheck {
  ErrorStats err;
  size_t non_finite = 0;
  double diff2 = 0, ref2 = 0;
  void merge(const OutputCheck& later) {
    err.merge(later.err);
    non_finite += later.non_finite;
    diff2 += later.diff2;
    ref2 += later.ref2;
  }
};

// Elements i0 .. i0 + n - 1 against reference elements want[0 .. n-1] and their bounds. An element that is
// finite and within a positive bound is ErrorStats::add's common case, done here inline with add's arithmetic
// (its fmax are plain maxima: none of these values is NaN or -0); any other goes through add. (Copies of the
// statistics in locals, written back around add, measured slower with GCC 12: its SLP pairs them.)
template <class Load>
void compare_run(Load load, size_t i0, const double* want, const double* bound, size_t n, double rel_floor,
                 OutputCheck& c) {
  ErrorStats& e = c.err;
  for (size_t k = 0; k < n; ++k) {
    const double x = load(i0 + k), w = want[k], b = bound[k];
    const double err = std::fabs(x - w);  // NaN or infinite unless both are finite
    if (err < INFINITY && err <= b && b > 0) {
      ++e.count;
      e.sum_sq += err * err;
      e.sum_abs += err;
      e.max_abs = std::max(e.max_abs, err);
      e.max_rel = std::max(e.max_rel, err / std::max(std::fabs(w), rel_floor));
      e.worst_ratio = std::max(e.worst_ratio, err / b);
      c.diff2 += (x - w) * (x - w);
      c.ref2 += w * w;
      continue;
    }
    c.non_finite += !std::isfinite(x);
    e.add(i0 + k, x, w, b, rel_floor);
    if (std::isfinite(x)) {
      c.diff2 += (x - w) * (x - w);
      c.ref2 += w * w;
    }
  }
}

// Elements [begin, end) of a backward output against the reference, walked in runs of consecutive reference
// elements (BwdReference: element i of a dense output is reference element i % size; of a packed one, token
// t's element e is reference element t * row_ref + e % row_ref).
void compare_range(const OutputTensor& got, size_t begin, size_t end, const std::vector<double>& want,
                   const std::vector<double>& bound, size_t row, size_t row_ref, double rel_floor, OutputCheck& c) {
  with_loader(got, [&](auto load) {
    for (size_t i = begin; i < end;) {
      size_t j, run;
      if (row == 0) {
        j = i % want.size();
        run = std::min(end - i, want.size() - j);
      } else {
        const size_t e = i % row, h = e % row_ref;
        j = i / row * row_ref + h;
        run = std::min({end - i, row_ref - h, row - e});
      }
      compare_run(load, i, want.data() + j, bound.data() + j, run, rel_floor, c);
      i += run;
    }
    return 0;
  });
}
}  // namespace

float OutputTensor::at(size_t i) const {
  return with_loader(*this, [&](auto load) { return load(i); });
}

void ErrorStats::merge(const ErrorStats& later) {
  max_abs = std::fmax(max_abs, later.max_abs);
  max_rel = std::fmax(max_rel, later.max_rel);
  worst_ratio = std::fmax(worst_ratio, later.worst_ratio);
  sum_sq += later.sum_sq;
  sum_abs += later.sum_abs;
  count += later.count;
  // The first five bad elements overall: ours, then the later chunk's.
  size_t shown = std::min<size_t>(bad, 5);
  for (const std::string& e : split_examples(later.first_bad)) {
    if (shown >= 5) break;
    first_bad += (first_bad.empty() ? "" : "; ") + e;
    ++shown;
  }
  bad += later.bad;
}

void ErrorStats::add(size_t index, double got, double want, double bound, double rel_floor) {
  ++count;
  bool ok;
  double err = 0;
  if (!std::isfinite(want)) {
    ok = got == want;
    if (!ok) err = INFINITY;
  } else if (!std::isfinite(got)) {
    ok = false;
    err = INFINITY;
  } else {
    err = std::fabs(got - want);
    sum_sq += err * err;
    sum_abs += err;
    ok = err <= bound;
  }
  max_abs = std::fmax(max_abs, err);
  if (std::isfinite(want)) max_rel = std::fmax(max_rel, err / std::fmax(std::fabs(want), rel_floor));
  worst_ratio = std::fmax(worst_ratio, bound > 0 ? err / bound : (err > 0 ? INFINITY : 0));
  if (!ok && ++bad <= 5) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s[%zu] got %.7g want %.7g (bound %.3g)", first_bad.empty() ? "" : "; ", index, got,
                  want, bound);
    first_bad += buf;
  }
}

FwdReference forward_reference(const ref::Shape& shape, const float* q, const float* k, const float* v,
                               std::vector<int64_t> rows, int threads) {
  FwdReference r;
  r.shape = shape;
  r.rows = std::move(rows);
  const size_t n = r.rows.size(), d = (size_t)shape.head_dim;
  r.o.assign(n * d, 0.0);
  r.o_mag.assign(n * d, 0.0);
  r.o_logit.assign(n * d, 0.0);
  r.lse.assign(n, 0.0);
  r.lse_mag.assign(n, 0.0);
  ref::forward_rows(shape, q, k, v, r.rows, r.o.data(), r.lse.data(), threads,
                    {r.o_mag.data(), r.o_logit.data(), r.lse_mag.data()});
  r.max_abs_v = max_abs_of(v, (size_t)shape.kv_elements());
  return r;
}

int forward_distinct_units(const Problem& p, int64_t max_elements) {
  const int64_t bhk = (int64_t)p.batch * p.kv_heads();
  const int64_t unit = std::max<int64_t>((int64_t)p.group() * p.seq_q, p.seq_k) * p.head_dim;  // a unit's Q or K
  if (bhk * unit <= max_elements) return (int)bhk;
  return (int)std::clamp<int64_t>(max_elements / unit, 1, bhk);
}

FwdReference tiled_forward_reference(const ref::Shape& full, int units, const float* q, const float* k,
                                     const float* v, std::vector<int64_t> rows, int threads) {
  if ((int64_t)units >= (int64_t)full.batch * full.kv_heads()) return forward_reference(full, q, k, v, std::move(rows), threads);
  const int64_t heads = (int64_t)units * full.group_size(), sq = full.seq_q;
  ref::Shape distinct = full;
  distinct.batch = 1;
  distinct.heads = (int)heads;
  distinct.heads_k = full.heads_k > 0 ? units : 0;
  // Each row's distinct row, computed once however many rows share it.
  std::vector<int64_t> mapped(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) mapped[i] = (rows[i] / sq) % heads * sq + rows[i] % sq;
  std::vector<int64_t> unique = mapped;
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  const FwdReference u = forward_reference(distinct, q, k, v, unique, threads);
  FwdReference r;
  r.shape = full;
  r.rows = std::move(rows);
  r.max_abs_v = u.max_abs_v;  // the tiled V holds the distinct values only
  const size_t n = r.rows.size(), d = (size_t)full.head_dim;
  r.o.resize(n * d), r.o_mag.resize(n * d), r.o_logit.resize(n * d), r.lse.resize(n), r.lse_mag.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t j = std::lower_bound(unique.begin(), unique.end(), mapped[i]) - unique.begin();
    std::copy_n(u.o.begin() + j * d, d, r.o.begin() + i * d);
    std::copy_n(u.o_mag.begin() + j * d, d, r.o_mag.begin() + i * d);
    std::copy_n(u.o_logit.begin() + j * d, d, r.o_logit.begin() + i * d);
    r.lse[i] = u.lse[j];
    r.lse_mag[i] = u.lse_mag[j];
  }
  return r;
}

ref::Shape with_modifications(ref::Shape s, const Problem& p) {
  s.window_left = p.window_left, s.window_right = p.window_right, s.softcap = p.softcap;
  return s;
}

std::vector<float> seeded_alibi_slopes(long long count, int heads, long long period) {
  std::vector<float> out((size_t)std::max(0ll, count));
  for (long long x = 0; x < count; ++x) {
    const long long u = x % period;
    out[(size_t)x] = (float)(std::exp2(-8.0 * (double)(u % heads + 1) / heads) * ((u / heads) % 2 ? 2.0 : 1.0));
  }
  return out;
}

std::vector<float> varlen_backward_alibi_slopes(const Problem& p, int distinct_heads) {
  const long long H = p.heads, count = (long long)p.batch * H;
  const std::vector<float> own = seeded_alibi_slopes(count, p.heads, count);  // the packed forward's
  std::vector<float> out((size_t)count);
  for (long long x = 0; x < count; ++x) out[(size_t)x] = own[(size_t)(x - x % H + x % H % distinct_heads)];
  return out;
}

ref::VarlenShape with_modifications(ref::VarlenShape s, const Problem& p) {
  s.window_left = p.window_left, s.window_right = p.window_right, s.softcap = p.softcap;
  return s;
}

FwdReference paged_forward_reference(const Problem& p, int units, const float* q, const float* k, const float* v,
                                     std::vector<int64_t> rows, int threads) {
  if (p.alibi) throw std::runtime_error("paged problems have no ALiBi form");
  ref::Shape full = with_modifications(ref::Shape{p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim, p.causal}, p);
  full.heads_k = p.heads_k;
  const int64_t rows_per_seq = (int64_t)p.heads * p.seq_q;
  // The rows of each cache length (a sequence's rows are rows_per_seq consecutive flat rows).
  std::map<int, std::vector<size_t>> by_len;
  for (size_t i = 0; i < rows.size(); ++i) by_len[p.paged.seq_len((int)(rows[i] / rows_per_seq), p.seq_k)].push_back(i);
  if (by_len.size() == 1 && by_len.begin()->first == p.seq_k)  // every sequence full: the dense reference itself
    return tiled_forward_reference(full, units, q, k, v, std::move(rows), threads);
  FwdReference r;
  r.shape = full;
  r.rows = std::move(rows);
  const size_t n = r.rows.size(), d = (size_t)p.head_dim, unit_k = (size_t)p.seq_k * d;
  r.o.assign(n * d, 0.0), r.o_mag.assign(n * d, 0.0), r.o_logit.assign(n * d, 0.0);
  r.lse.assign(n, INFINITY), r.lse_mag.assign(n, 0.0);  // a sequence without keys: O = 0, LSE = +inf
  std::vector<float> ks, vs;
  for (const auto& [len, idx] : by_len) {
    if (len == 0) continue;
    // The units' first len keys, as a dense problem of Sk = len holds them.
    ref::Shape shape = full;
    shape.seq_k = len;
    const float *kl = k, *vl = v;
    if (len != p.seq_k) {
      ks.resize((size_t)units * len * d), vs.resize((size_t)units * len * d);
      for (int u = 0; u < units; ++u) {
        std::copy_n(k + u * unit_k, (size_t)len * d, ks.begin() + (size_t)u * len * d);
        std::copy_n(v + u * unit_k, (size_t)len * d, vs.begin() + (size_t)u * len * d);
      }
      kl = ks.data(), vl = vs.data();
    }
    std::vector<int64_t> sub;
    for (size_t i : idx) sub.push_back(r.rows[i]);
    const FwdReference s = tiled_forward_reference(shape, units, q, kl, vl, sub, threads);
    for (size_t j = 0; j < idx.size(); ++j) {
      const size_t i = idx[j];
      std::copy_n(s.o.begin() + j * d, d, r.o.begin() + i * d);
      std::copy_n(s.o_mag.begin() + j * d, d, r.o_mag.begin() + i * d);
      std::copy_n(s.o_logit.begin() + j * d, d, r.o_logit.begin() + i * d);
      r.lse[i] = s.lse[j];
      r.lse_mag[i] = s.lse_mag[j];
    }
  }
  r.max_abs_v = max_abs_of(v, (size_t)units * unit_k);  // the floor's: every logical value
  return r;
}

namespace {

// The reference's outputs sized (nq, nk: elements of Q-shaped and K-shaped tensors; lse_rows) and zeroed,
// for ref::forward and ref::backward (dense or packed) to fill.
void size_backward_reference(BwdReference& r, size_t nq, size_t nk, size_t lse_rows) {
  r.o.assign(nq, 0.0);
  r.lse.assign(lse_rows, 0.0);
  for (auto* g : {&r.dq, &r.dq_mag, &r.dq_logit}) g->assign(nq, 0.0);
  for (auto* g : {&r.dk, &r.dk_mag, &r.dk_logit, &r.dv, &r.dv_mag, &r.dv_logit}) g->assign(nk, 0.0);
}

ref::BwdMagnitudes magnitudes_of(BwdReference& r) {
  return {r.dq_mag.data(), r.dq_logit.data(), r.dk_mag.data(), r.dk_logit.data(), r.dv_mag.data(),
          r.dv_logit.data()};
}

// The inputs' max|x|, which the bounds' floors scale with.
void record_input_scales(BwdReference& r, const float* q, const float* k, const float* v, const float* dout,
                         size_t nq, size_t nk) {
  r.max_abs_q = max_abs_of(q, nq);
  r.max_abs_k = max_abs_of(k, nk);
  r.max_abs_do = max_abs_of(dout, nq);
  r.max_abs_v = max_abs_of(v, nk);
}

}  // namespace

BwdReference backward_reference(const ref::Shape& shape, const float* q, const float* k, const float* v,
                                const float* dout, int threads) {
  BwdReference r;
  r.shape = shape;
  const size_t nq = (size_t)shape.q_elements(), nk = (size_t)shape.kv_elements();
  size_backward_reference(r, nq, nk, (size_t)shape.q_rows());
  ref::forward(shape, q, k, v, r.o.data(), r.lse.data(), threads);
  ref::backward(shape, q, k, v, dout, r.dq.data(), r.dk.data(), r.dv.data(), threads, magnitudes_of(r));
  record_input_scales(r, q, k, v, dout, nq, nk);
  return r;
}

Verdict validate_forward(const Problem& p, const FwdReference& ref, OutputTensor o, OutputTensor lse, int threads) {
  const size_t d = (size_t)p.head_dim, nq = o.size;
  const ToleranceModel tol = forward_tolerance(p.dtype, p.seq_k, p.head_dim, p.seq_k * ref.max_abs_v);
  const ToleranceModel lse_tol = forward_tolerance(DType::fp32, p.seq_k, p.head_dim);
  const double rel_floor = report_floor(p.dtype);
  ErrorStats err_o, err_lse;
  const size_t non_finite_o = count_non_finite(o, threads), unwritten_lse = count_non_finite(lse, threads, true);
  for (size_t r = 0; r < ref.rows.size(); ++r) {
    const size_t row = (size_t)ref.rows[r];
    for (size_t c = 0; c < d; ++c) {
      const size_t i = r * d + c;
      err_o.add(row * d + c, o.at(row * d + c), ref.o[i], tol.bound(ref.o_mag[i], ref.o_logit[i]), rel_floor);
    }
    // LSE indices follow O's in messages.
    const size_t li = ref.lse_index.empty() ? row : (size_t)ref.lse_index[r];
    err_lse.add(nq + li, lse.at(li), ref.lse[r], lse_tol.bound(1.0, ref.lse_mag[r]), report_floor(DType::fp32));
  }
  Verdict v;
  v.max_abs = std::fmax(err_o.max_abs, err_lse.max_abs);
  v.max_rel = std::fmax(err_o.max_rel, err_lse.max_rel);
  const size_t count = err_o.count + err_lse.count;
  v.mse = count ? (err_o.sum_sq + err_lse.sum_sq) / count : 0;
  v.mean_abs = err_o.mean_abs();  // over the validated O elements
  v.worst_ratio = std::fmax(err_o.worst_ratio, err_lse.worst_ratio);
  v.detail = {{"validated_rows", ref.rows.size()},
              {"worst_err_over_bound", finite_or_big(v.worst_ratio)},
              {"lse_worst_err_over_bound", finite_or_big(err_lse.worst_ratio)}};
  std::string msg;
  if (non_finite_o) msg += std::to_string(non_finite_o) + " output elements NaN, infinite or unwritten; ";
  if (unwritten_lse) msg += std::to_string(unwritten_lse) + " LSE entries NaN or unwritten; ";
  const size_t bad = err_o.bad + err_lse.bad;
  if (bad) {
    msg += std::to_string(bad) + " of " + std::to_string(count) + " checked values off (worst error " +
           number(v.worst_ratio) + "x its bound): " + err_o.first_bad;
    if (!err_lse.first_bad.empty()) msg += (err_o.first_bad.empty() ? "" : "; ") + err_lse.first_bad;
  }
  if (!msg.empty()) {
    v.ok = false;
    v.error = msg;
  }
  return v;
}

namespace {

// The tolerances of dQ, dK and dV (worker/validate.hpp's rule).
std::array<ToleranceModel, 3> backward_tolerances(const Problem& p, const BwdReference& ref) {
  const double scale = ref.shape.softmax_scale();
  // dS = P (dP - delta) in fp32: a P flushed below 2^-126 takes |dP - delta| <= ||dO_i|| (||V_j|| +
  // ||O_i||) <= 2 d max|dO| max|V| with it; dS's own underflow or subnormal rounding is eta (the 1).
  const double ds_factor =
      1.0 + 0x1p-126 / subnormal_rounding(p.dtype) * 2.0 * p.head_dim * ref.max_abs_do * ref.max_abs_v;
  // dK and dV of a kv head sum over the group's query heads too: group * Sq terms (grouped-query attention).
  const int sq_sum = p.seq_q * p.group();
  return {backward_tolerance(p.dtype, p.seq_q, p.seq_k, p.head_dim, p.seq_k * scale * ref.max_abs_k * ds_factor),
          backward_tolerance(p.dtype, sq_sum, p.seq_k, p.head_dim, sq_sum * scale * ref.max_abs_q * ds_factor),
          backward_tolerance(p.dtype, sq_sum, p.seq_k, p.head_dim, sq_sum * ref.max_abs_do)};
}

}  // namespace

BwdBounds backward_bounds(const Problem& p, const BwdReference& ref) {
  const std::array<ToleranceModel, 3> tols = backward_tolerances(p, ref);
  auto bounds = [](const ToleranceModel& tol, const std::vector<double>& mag, const std::vector<double>& logit) {
    std::vector<double> b(mag.size());
    for (size_t j = 0; j < b.size(); ++j) b[j] = tol.bound(mag[j], logit[j]);
    return b;
  };
  return {bounds(tols[0], ref.dq_mag, ref.dq_logit), bounds(tols[1], ref.dk_mag, ref.dk_logit),
          bounds(tols[2], ref.dv_mag, ref.dv_logit)};
}

Verdict validate_backward(const Problem& p, const BwdReference& ref, OutputTensor dq, OutputTensor dk,
                          OutputTensor dv, int threads) {
  return validate_backward(p, ref, backward_bounds(p, ref), dq, dk, dv, threads);
}

Verdict validate_backward(const Problem& p, const BwdReference& ref, const BwdBounds& bounds, OutputTensor dq,
                          OutputTensor dk, OutputTensor dv, int threads) {
  const char* names[] = {"dq", "dk", "dv"};
  const OutputTensor* gots[] = {&dq, &dk, &dv};
  const std::vector<double>* refs[] = {&ref.dq, &ref.dk, &ref.dv};
  const std::vector<double>* bound_of[] = {&bounds.dq, &bounds.dk, &bounds.dv};
  const double rel_floor = report_floor(p.dtype);
  Verdict v;
  double sum_sq = 0, sum_abs = 0;
  size_t count = 0;
  std::string msg;
  for (int g = 0; g < 3; ++g) {
    const OutputTensor& got = *gots[g];
    const std::vector<double>& want = *refs[g];
    if (bound_of[g]->size() != want.size() || (want.empty() && got.size))
      throw std::invalid_argument(std::string("validate_backward: ") + names[g] + " has no reference or bounds");
    // Every head's gradient holds at least the reference's distinct heads: fewer elements (an output read back
    // short) would be a comparison of nothing, passed.
    if (got.size < want.size())
      throw std::invalid_argument(std::string("validate_backward: ") + names[g] + " has " + std::to_string(got.size) +
                                  " elements, fewer than its reference's " + std::to_string(want.size()));
    const size_t row = g == 0 ? ref.q_row : ref.k_row, row_ref = g == 0 ? ref.q_row_ref : ref.k_row_ref;
    std::vector<OutputCheck> parts(chunks_of(got.size));
    for_each_chunk(parts.size(), threads, [&](size_t c) {
      compare_range(got, c * kCompareChunk, std::min(got.size, (c + 1) * kCompareChunk), want, *bound_of[g], row,
                    row_ref, rel_floor, parts[c]);
    });
    OutputCheck all = parts[0];
    for (size_t c = 1; c < parts.size(); ++c) all.merge(parts[c]);
    const ErrorStats& err = all.err;
    const std::string name = names[g];
    // Relative L2 error, reported (not judged): 0 / 0 (Sk = 1's dQ, dK) is reported as the absolute norm.
    const double rel_l2 = all.ref2 > 0 ? std::sqrt(all.diff2 / all.ref2) : std::sqrt(all.diff2);
    v.detail[name + "_rel_l2"] = finite_or_big(rel_l2);
    v.detail[name + "_worst_err_over_bound"] = finite_or_big(err.worst_ratio);
    v.max_abs = std::fmax(v.max_abs, err.max_abs);
    v.max_rel = std::fmax(v.max_rel, err.max_rel);
    v.worst_ratio = std::fmax(v.worst_ratio, err.worst_ratio);
    sum_sq += err.sum_sq;
    sum_abs += err.sum_abs;
    count += err.count;
    if (all.non_finite)
      msg += name + ": " + std::to_string(all.non_finite) + " elements NaN, infinite or unwritten; ";
    else if (err.bad)
      msg += name + ": " + std::to_string(err.bad) + " of " + std::to_string(err.count) + " off (worst error " +
             number(err.worst_ratio) + "x its bound): " + err.first_bad + "; ";
  }
  v.mse = count ? sum_sq / count : 0;
  v.mean_abs = count ? sum_abs / count : 0;
  v.detail["worst_err_over_bound"] = finite_or_big(v.worst_ratio);
  v.detail["distinct_heads"] = ref.shape.batch * ref.shape.heads;
  if (!msg.empty()) {
    v.ok = false;
    v.error = msg.substr(0, msg.size() - 2);
  }
  return v;
}

std::vector<int64_t> varlen_sample_rows(const Problem& p, int64_t max_rows, uint64_t seed) {
  const int64_t H = p.heads, rows = p.rows_q();
  std::vector<int64_t> out;
  if (max_rows <= 0) return out;
  if (rows <= max_rows) {
    out.resize(rows);
    for (int64_t r = 0; r < rows; ++r) out[r] = r;
    return out;
  }
  std::vector<int64_t> fixed;
  const std::vector<int> cu = p.varlen.cu_seqlens_q();
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int64_t first = cu[b], len = cu[b + 1] - cu[b];
    if (len == 0) continue;
    for (int64_t h : {int64_t{0}, H - 1, (int64_t)(b * 7 + 3) % H})
      for (int64_t t : {first, first + len / 2, first + len - 1}) fixed.push_back(t * H + h);
  }
  std::sort(fixed.begin(), fixed.end());
  fixed.erase(std::unique(fixed.begin(), fixed.end()), fixed.end());
  if ((int64_t)fixed.size() > max_rows / 2) fixed.resize(max_rows / 2);  // leave room for random rows
  out = fixed;
  uint64_t x = seed ^ 0x7661726c656eull;  // "varlen"
  auto next = [&] {  // splitmix64
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::sort(out.begin(), out.end());
  while ((int64_t)out.size() < max_rows) {
    const int64_t r = (int64_t)(next() % (uint64_t)rows);
    auto it = std::lower_bound(out.begin(), out.end(), r);
    if (it == out.end() || *it != r) out.insert(it, r);
  }
  return out;
}

FwdReference varlen_forward_reference(const Problem& p, const float* q, const float* k, const float* v,
                                      std::vector<int64_t> rows, int threads, const float* alibi_slopes) {
  if (p.alibi && !alibi_slopes) throw std::runtime_error("varlen_forward_reference: an ALiBi problem without slopes");
  const int H = p.heads, Hk = p.kv_heads(), d = p.head_dim, g = p.group();
  const std::vector<int> cu_q = p.varlen.cu_seqlens_q(), cu_k = p.varlen.cu_seqlens_k();
  const int64_t total_q = cu_q.back();
  FwdReference r;
  r.shape = with_modifications(ref::Shape{p.batch, H, p.seq_q, p.seq_k, d, p.causal}, p);
  r.shape.heads_k = p.heads_k;
  if (p.alibi) r.shape.alibi_slopes = alibi_slopes, r.shape.alibi_batch_stride = H;
  r.rows = std::move(rows);
  const size_t n = r.rows.size();
  r.o.assign(n * d, 0.0), r.o_mag.assign(n * d, 0.0), r.o_logit.assign(n * d, 0.0);
  r.lse.assign(n, INFINITY), r.lse_mag.assign(n, 0.0);  // a row without keys: O = 0, LSE = +inf
  r.lse_index.resize(n);
  // Rows grouped by (sequence, head): one gather of that head's sequence and one forward_rows each.
  std::map<std::pair<int, int>, std::vector<size_t>> groups;
  for (size_t i = 0; i < n; ++i) {
    const int64_t t = r.rows[i] / H, h = r.rows[i] % H;
    const int b = (int)(std::upper_bound(cu_q.begin(), cu_q.end(), (int)t) - cu_q.begin()) - 1;
    groups[{b, (int)h}].push_back(i);
    r.lse_index[i] = h * total_q + t;
  }
  std::vector<float> qs, ks, vs;
  for (const auto& [key, idx] : groups) {
    const auto [b, h] = key;
    const int64_t q0 = cu_q[b], lq = cu_q[b + 1] - q0, k0 = cu_k[b], lk = cu_k[b + 1] - k0;
    if (lk == 0) continue;  // no keys: the defaults above
    qs.resize(lq * d), ks.resize(lk * d), vs.resize(lk * d);
    const int hk = h / g;
    for (int64_t t = 0; t < lq; ++t) std::copy_n(q + ((q0 + t) * H + h) * d, d, qs.data() + t * d);
    for (int64_t t = 0; t < lk; ++t) {
      std::copy_n(k + ((k0 + t) * Hk + hk) * d, d, ks.data() + t * d);
      std::copy_n(v + ((k0 + t) * Hk + hk) * d, d, vs.data() + t * d);
    }
    ref::Shape one = with_modifications(ref::Shape{1, 1, (int)lq, (int)lk, d, p.causal}, p);
    if (p.alibi) one.alibi_slopes = alibi_slopes + (size_t)b * H + h;  // sequence b's head h
    std::vector<int64_t> local;
    for (size_t i : idx) local.push_back(r.rows[i] / H - q0);
    std::vector<double> o(local.size() * d), o_mag(local.size() * d), o_logit(local.size() * d), lse(local.size()),
        lse_mag(local.size());
    ref::forward_rows(one, qs.data(), ks.data(), vs.data(), local, o.data(), lse.data(), threads,
                      {o_mag.data(), o_logit.data(), lse_mag.data()});
    for (size_t j = 0; j < idx.size(); ++j) {
      const size_t i = idx[j];
      std::copy_n(o.begin() + j * d, d, r.o.begin() + i * d);
      std::copy_n(o_mag.begin() + j * d, d, r.o_mag.begin() + i * d);
      std::copy_n(o_logit.begin() + j * d, d, r.o_logit.begin() + i * d);
      r.lse[i] = lse[j];
      r.lse_mag[i] = lse_mag[j];
    }
  }
  r.max_abs_v = max_abs_of(v, (size_t)p.varlen.total_k() * Hk * d);
  return r;
}

BwdReference varlen_backward_reference(const Problem& p, int heads, int kv_heads, const float* q, const float* k,
                                       const float* v, const float* dout, int threads, const float* alibi_slopes,
                                       int64_t alibi_batch_stride) {
  if (p.alibi && !alibi_slopes) throw std::runtime_error("varlen_backward_reference: an ALiBi problem without slopes");
  BwdReference r;
  const int d = p.head_dim;
  r.shape = with_modifications(ref::Shape{1, heads, p.seq_q, p.seq_k, d, p.causal}, p);
  r.shape.heads_k = kv_heads == heads ? 0 : kv_heads;
  r.q_row = (size_t)p.heads * d, r.q_row_ref = (size_t)heads * d;
  r.k_row = (size_t)p.kv_heads() * d, r.k_row_ref = (size_t)kv_heads * d;
  ref::VarlenShape vs = with_modifications(ref::VarlenShape{heads, d, p.causal, 0, r.shape.heads_k}, p);
  // ALiBi: each sequence's own slopes (ref::backward_varlen takes sequence b's at b * alibi_batch_stride).
  if (p.alibi) vs.alibi_slopes = alibi_slopes, vs.alibi_batch_stride = alibi_batch_stride;
  const std::vector<int> cq = p.varlen.cu_seqlens_q(), ck = p.varlen.cu_seqlens_k();
  const std::vector<int32_t> cu_q(cq.begin(), cq.end()), cu_k(ck.begin(), ck.end());
  const size_t nq = (size_t)cu_q.back() * heads * d, nk = (size_t)cu_k.back() * kv_heads * d;
  size_backward_reference(r, nq, nk, (size_t)cu_q.back() * heads);
  ref::forward_varlen(vs, cu_q, cu_k, q, k, v, r.o.data(), r.lse.data(), threads);
  ref::backward_varlen(vs, cu_q, cu_k, q, k, v, dout, r.dq.data(), r.dk.data(), r.dv.data(), threads,
                       magnitudes_of(r));
  record_input_scales(r, q, k, v, dout, nq, nk);
  return r;
}

void write_verdict(const Verdict& v, nlohmann::json& out) {
  out["max_abs"] = finite_or_big(v.max_abs);
  out["max_rel"] = finite_or_big(v.max_rel);
  out["mse"] = finite_or_big(v.mse);
  out["mean_abs"] = finite_or_big(v.mean_abs);
  if (!out.contains("detail") || !out["detail"].is_object()) out["detail"] = nlohmann::json::object();
  for (auto& [key, value] : v.detail.items()) out["detail"][key] = value;
  if (!v.ok) {
    out["status"] = "invalid";
    out["error"] = v.error;
  }
}

}  // namespace flashtune
