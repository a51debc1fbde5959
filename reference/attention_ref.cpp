#include "reference/attention_ref.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>

namespace flashtune::ref {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Lambda_ij's weight on |s_ij| + |lse_i| (attention_ref.hpp): up to three fp32 roundings of each, in
// the log2 domain (the scale*log2(e) constant, its product with s, lse rounded to fp32 and times
// log2(e)), i.e. ~3 * 1.44 u32 in log2 units = ~3 u32 of relative error of P.
constexpr double kExponentRoundings = 3;

// Rows (or key rows) handed to a thread at a time. Small enough that causal
// shapes, where row cost varies, still balance; large enough to amortise the
// atomic and the per-chunk scratch allocation.
constexpr int64_t kRowsPerChunk = 16;

// Tile height FlashAttention kernels use along Sq; the last tile is where ragged
// (partial) tiles and their masking bugs live.
constexpr int64_t kTileRows = 128;

void check_shape(const Shape& s) {
  if (s.batch <= 0 || s.heads <= 0 || s.seq_q <= 0 || s.seq_k <= 0 || s.head_dim <= 0) {
    throw std::invalid_argument("flashtune::ref: all Shape dimensions must be positive");
  }
  if (s.window_left < -1 || s.window_right < -1 || !(s.softcap >= 0) || !std::isfinite(s.softcap)) {
    throw std::invalid_argument("flashtune::ref: window edges must be >= -1 and softcap finite and >= 0");
  }
  if (s.alibi_batch_stride < 0) throw std::invalid_argument("flashtune::ref: alibi_batch_stride must be >= 0");
  if (s.mask_batch_stride < 0 || s.mask_head_stride < 0)
    throw std::invalid_argument("flashtune::ref: mask strides must be >= 0");
  if (s.heads_k < 0 || (s.heads_k > 0 && s.heads % s.heads_k != 0)) {
    throw std::invalid_argument("flashtune::ref: heads (" + std::to_string(s.heads) +
                                ") must be a positive multiple of heads_k (" +
                                std::to_string(s.heads_k) + "), or heads_k 0 for multi-head");
  }
}

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

// Runs body(begin, end) over [0, n) in chunks, on up to `threads` std::threads.
// Each index is processed by exactly one thread, and each output element is
// written by the one index that owns it, so results do not depend on threads.
template <class Body>
void parallel_for(int64_t n, int threads, Body body) {
  const int64_t n_chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  const int n_workers = static_cast<int>(std::min<int64_t>(resolve_threads(threads), n_chunks));
  std::atomic<int64_t> next_chunk{0};
  auto worker = [&] {
    for (int64_t c = next_chunk++; c < n_chunks; c = next_chunk++) {
      body(c * kRowsPerChunk, std::min(n, (c + 1) * kRowsPerChunk));
    }
  };
  if (n_workers <= 1) {
    worker();
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(n_workers);
  for (int t = 0; t < n_workers; ++t) pool.emplace_back(worker);
  for (auto& th : pool) th.join();
}

double norm2(const float* a, int d) {
  double acc = 0;
  for (int x = 0; x < d; ++x) acc += static_cast<double>(a[x]) * static_cast<double>(a[x]);
  return std::sqrt(acc);
}

double dot(const float* a, const float* b, int d) {
  double acc = 0;
  for (int x = 0; x < d; ++x) acc += static_cast<double>(a[x]) * static_cast<double>(b[x]);
  return acc;
}

// Dot products of `a` with n rows of b (row t at b + t * stride) into out[0 .. n-1], and the squared norms of
// n rows (norms2_rows: norm2 before its sqrt): each one summed in x order exactly as dot() and norm2() sum it
// (the same bits), kDotRows of them side by side. A dot of length d is a chain of d dependent additions; the
// float64 reference spent most of its time waiting on those chains (issue 33: the backward's references are
// what the GPUs of a multi-GPU sweep wait for), and independent chains interleaved fill the pipeline.
constexpr int kDotRows = 4;
void dot_rows(const float* a, const float* b, int64_t stride, int d, int n, double* out) {
  if (n != kDotRows) {
    for (int t = 0; t < n; ++t) out[t] = dot(a, b + t * stride, d);
    return;
  }
  double acc[kDotRows] = {0, 0, 0, 0};
  const float *b0 = b, *b1 = b + stride, *b2 = b + 2 * stride, *b3 = b + 3 * stride;
  for (int x = 0; x < d; ++x) {
    const double ax = static_cast<double>(a[x]);
    acc[0] += ax * static_cast<double>(b0[x]);
    acc[1] += ax * static_cast<double>(b1[x]);
    acc[2] += ax * static_cast<double>(b2[x]);
    acc[3] += ax * static_cast<double>(b3[x]);
  }
  for (int t = 0; t < kDotRows; ++t) out[t] = acc[t];
}
void norms2_rows(const float* b, int64_t stride, int d, int n, double* out) {
  if (n != kDotRows) {
    for (int t = 0; t < n; ++t) out[t] = dot(b + t * stride, b + t * stride, d);
    return;
  }
  double acc[kDotRows] = {0, 0, 0, 0};
  const float *b0 = b, *b1 = b + stride, *b2 = b + 2 * stride, *b3 = b + 3 * stride;
  for (int x = 0; x < d; ++x) {
    const double x0 = b0[x], x1 = b1[x], x2 = b2[x], x3 = b3[x];
    acc[0] += x0 * x0;
    acc[1] += x1 * x1;
    acc[2] += x2 * x2;
    acc[3] += x3 * x3;
  }
  for (int t = 0; t < kDotRows; ++t) out[t] = acc[t];
}

// Flat (b, kv head) pair of the flat (b, h) pair bh: with H = Hk * group,
// (b*H + h) / group = b*Hk + h / group.
int64_t kv_pair_of(const Shape& s, int64_t bh) { return bh / s.group_size(); }

// The keys a row attends: [begin, end) cut to the causal mask's visible keys, and the lse of a row
// left with none (+inf for the dense rule, -inf for a split; attention_ref.hpp).
struct KeyRange {
  int64_t begin = 0, end = std::numeric_limits<int64_t>::max();
  double empty_lse = kInf;
};

// A scaled score through the softcap (Shape::softcap; itself when 0).
double capped(const Shape& s, double score) { return s.softcap > 0 ? s.softcap * std::tanh(score / s.softcap) : score; }

// Lambda_ij (attention_ref.hpp), in units of fp32's roundoff: raw the scaled score before any softcap, capped after
// it, qk_norms = ||q_i|| ||k_j||, bias ALiBi's b_ij (0 without).
double exponent_units(const Shape& s, double raw, double capped_score, double lse, double qk_norms, double root_d,
                      double bias = 0) {
  return kExponentRoundings * (std::fabs(raw) + std::fabs(lse)) + root_d * s.softmax_scale() * qk_norms +
         (s.softcap > 0 ? kTanhUnits * std::fabs(capped_score) : 0.0) + kAlibiRoundings * std::fabs(bias);
}

// One (query i, key j) pair of the backward, for both passes (so that they agree bit for bit).
//   raw = scale q_i . k_j, P = exp(c(raw) - lse_i), dP = dO_i . v_j,
//   dS = P (dP - D_i) c'(raw),  c'(raw) = 1 - tanh^2(raw / softcap) (1 without a softcap),
// dS the gradient with respect to raw (dQ_i = scale sum_j dS_ij k_j). dS_tanh = 2 tanh^2 |P (dP - D_i)|: what a
// kernel's fast tanh (relative error <= kTanhUnits u32) can move the derivative factor by, in units of that error
// (1 - t^2 (1 + e)^2 = 1 - t^2 - 2 t^2 e - t^2 e^2), 0 without a softcap.
// ALiBi: P = exp(c(raw) + bias - lse); dS as above (the bias does not depend on q or k).
struct PairGrad {
  double raw, capped, p, ds, ds_tanh;
};
// qk = q_i . k_j, dov = dO_i . v_j (dot() or dot_rows: the same bits).
PairGrad pair_grad(const Shape& s, double scale, double qk, double dov, double lse, double delta, double bias) {
  PairGrad g;
  g.raw = scale * qk;
  g.capped = capped(s, g.raw);
  g.p = std::exp(g.capped + bias - lse);
  const double ds_capped = g.p * (dov - delta);
  g.ds = ds_capped, g.ds_tanh = 0;
  if (s.softcap > 0) {
    const double t = g.capped / s.softcap;
    g.ds = ds_capped * (1 - t * t);
    g.ds_tanh = 2 * t * t * std::fabs(ds_capped);
  }
  return g;
}

// One query row of the forward pass, the single kernel shared by forward,
// forward_rows, forward_split and backward (so they agree bit for bit).
// row is a flat index into (B*H*Sq); scores is scratch of at least Sk doubles.
// Writes o_row (d) and *lse; with mag_o / logit_o / mag_lse non-null also the row's magnitudes
// (FwdMagnitudes), in a second pass over the keys once O and lse are known.
void forward_row(const Shape& s, const float* q, const float* k, const float* v, int64_t row,
                 const KeyRange& keys, double* o_row, double* lse, double* scores,
                 double* mag_o = nullptr, double* logit_o = nullptr, double* mag_lse = nullptr) {
  const int d = s.head_dim;
  const int64_t bh = row / s.seq_q;  // flat (b, h) pair
  const int64_t i = row % s.seq_q;
  const int64_t kv_bh = kv_pair_of(s, bh);
  const float* q_row = q + row * d;                          // q is (B, H, Sq, d)
  const float* k_head = k + kv_bh * s.seq_k * d;             // k is (B, Hk, Sk, d)
  const float* v_head = v + kv_bh * s.seq_k * d;             // v is (B, Hk, Sk, d)
  const double scale = s.softmax_scale();
  const KeySpan vis = visible_range(s, i);
  const int64_t first_key = std::max(keys.begin, vis.first), end_key = std::min(keys.end, vis.end);

  std::fill(o_row, o_row + d, 0.0);
  if (mag_o) std::fill(mag_o, mag_o + d, 0.0);
  if (logit_o) std::fill(logit_o, logit_o + d, 0.0);
  if (mag_lse) *mag_lse = 0;
  if (end_key <= first_key) {  // no key to attend: O = 0, lse by the caller's rule
    *lse = keys.empty_lse;
    return;
  }

  // scores[j] = scale * q_i . k_j; track the max for a stable softmax.
  // softcap c: scores[j] = c tanh(scale q_i . k_j / c); ALiBi: plus the bias.
  double row_max = -kInf;
  for (int64_t j0 = first_key; j0 < end_key; j0 += kDotRows) {
    const int n = static_cast<int>(std::min<int64_t>(kDotRows, end_key - j0));
    double qk[kDotRows];
    dot_rows(q_row, k_head + j0 * d, d, d, n, qk);
    for (int t = 0; t < n; ++t) {
      const int64_t j = j0 + t;
      scores[j] = s.allowed(bh, i, j) ? capped(s, scale * qk[t]) + s.alibi_bias(bh, i, j) : -kInf;  // explicit mask
      row_max = std::max(row_max, scores[j]);
    }
  }
  if (row_max == -kInf) {  // the explicit mask left no key: as a row with none
    *lse = keys.empty_lse;
    return;
  }

  // o_i = sum_j exp(s_ij - max) v_j / sum_j exp(s_ij - max)
  double row_sum = 0;
  for (int64_t j = first_key; j < end_key; ++j) {
    if (scores[j] == -kInf) continue;  // masked: P = 0
    const double p = std::exp(scores[j] - row_max);
    row_sum += p;
    const float* v_row = v_head + j * d;
    for (int x = 0; x < d; ++x) o_row[x] += p * static_cast<double>(v_row[x]);
  }
  for (int x = 0; x < d; ++x) o_row[x] /= row_sum;
  *lse = row_max + std::log(row_sum);
  if (!mag_o && !logit_o && !mag_lse) return;

  // Magnitudes: P_ij exactly as above, Lambda_ij as in the header.
  const double q_norm = norm2(q_row, d), root_d = std::sqrt(static_cast<double>(d));
  double lse_acc = 0;
  double qk[kDotRows], k2[kDotRows];
  for (int64_t j = first_key; j < end_key; ++j) {
    const int t = static_cast<int>((j - first_key) % kDotRows);
    if (t == 0) {  // the next block's ||k_j||^2 (and q_i . k_j with a softcap), as norm2 and dot sum them
      const int n = static_cast<int>(std::min<int64_t>(kDotRows, end_key - j));
      norms2_rows(k_head + j * d, d, d, n, k2);
      if (s.softcap > 0) dot_rows(q_row, k_head + j * d, d, d, n, qk);
    }
    if (scores[j] == -kInf) continue;  // masked: in no sum
    const double p = std::exp(scores[j] - row_max) / row_sum;
    // The uncapped score for the roundings' term (it bounds the capped one's), the fast tanh's on the capped one,
    // each without ALiBi's bias, which has its own.
    const double bias = s.alibi_bias(bh, i, j);
    const double raw = s.softcap > 0 ? scale * qk[t] : scores[j] - bias;
    const double lambda = exponent_units(s, raw, scores[j] - bias, *lse, q_norm * std::sqrt(k2[t]), root_d, bias);
    lse_acc += p * lambda;
    const float* v_row = v_head + j * d;
    for (int x = 0; x < d; ++x) {
      const double vx = static_cast<double>(v_row[x]);
      if (mag_o) mag_o[x] += p * std::fabs(vx);
      if (logit_o) logit_o[x] += p * lambda * std::fabs(vx - o_row[x]);
    }
  }
  if (mag_lse) *mag_lse = lse_acc;
}

}  // namespace

int64_t visible_keys(const Shape& s, int64_t i) {
  if (!s.causal) return s.seq_k;
  const int64_t last = i + (static_cast<int64_t>(s.seq_k) - s.seq_q);
  return std::clamp<int64_t>(last + 1, 0, s.seq_k);
}

KeySpan visible_queries(const Shape& s, int64_t j) {
  // Query i sees key j iff j <= i + off (causal), i + off - left <= j (left >= 0), j <= i + off + right
  // (right >= 0), off = Sk - Sq: i >= j - off, i >= j - off - right, i <= j - off + left.
  const int64_t off = static_cast<int64_t>(s.seq_k) - s.seq_q;
  int64_t first = 0, end = s.seq_q;
  if (s.causal) first = std::max<int64_t>(first, j - off);
  if (s.window_right >= 0) first = std::max<int64_t>(first, j - off - s.window_right);
  if (s.window_left >= 0) end = std::min<int64_t>(end, j - off + s.window_left + 1);
  return {first, std::max(first, end)};
}

KeySpan visible_range(const Shape& s, int64_t i) {
  const int64_t diag = i + (static_cast<int64_t>(s.seq_k) - s.seq_q);
  int64_t first = 0, end = visible_keys(s, i);
  if (s.window_left >= 0) first = std::max<int64_t>(first, diag - s.window_left);
  if (s.window_right >= 0) end = std::min<int64_t>(end, diag + s.window_right + 1);
  return {first, std::max(first, end)};
}

double Shape::alibi_bias(int64_t bh, int64_t i, int64_t j) const {
  if (!alibi_slopes) return 0;
  const int64_t b = bh / heads, h = bh % heads;
  const double slope = static_cast<double>(alibi_slopes[b * alibi_batch_stride + h]);
  return -slope * static_cast<double>(std::llabs(i + (static_cast<int64_t>(seq_k) - seq_q) - j));
}

double Shape::softmax_scale() const {
  return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

int Shape::kv_heads() const { return heads_k > 0 ? heads_k : heads; }
int Shape::group_size() const { return kv_heads() > 0 ? heads / kv_heads() : 0; }  // 0: no heads at all
int Shape::kv_head_of(int h) const { return h / group_size(); }
int64_t Shape::q_rows() const { return int64_t{batch} * heads * seq_q; }
int64_t Shape::q_elements() const { return q_rows() * head_dim; }
int64_t Shape::kv_elements() const { return int64_t{batch} * kv_heads() * seq_k * head_dim; }

// Row n's slice of an optional per-row output (d values per row, or one with d = 1).
static double* row_of(double* base, int64_t n, int d) { return base ? base + n * d : nullptr; }

void forward(const Shape& s, const float* q, const float* k, const float* v, double* o,
             double* lse, int threads, const FwdMagnitudes& mag) {
  check_shape(s);
  const int64_t n_rows = s.q_rows();
  parallel_for(n_rows, threads, [&](int64_t begin, int64_t end) {
    std::vector<double> scores(s.seq_k);
    for (int64_t r = begin; r < end; ++r) {
      forward_row(s, q, k, v, r, {}, o + r * s.head_dim, lse + r, scores.data(), row_of(mag.o_mag, r, s.head_dim),
                  row_of(mag.o_logit, r, s.head_dim), row_of(mag.lse_mag, r, 1));
    }
  });
}

void forward_rows(const Shape& s, const float* q, const float* k, const float* v,
                  std::span<const int64_t> rows, double* o, double* lse, int threads,
                  const FwdMagnitudes& mag) {
  check_shape(s);
  const int64_t n_rows = s.q_rows();
  for (int64_t r : rows) {
    if (r < 0 || r >= n_rows) {
      throw std::out_of_range("flashtune::ref::forward_rows: row " + std::to_string(r) +
                              " outside [0, " + std::to_string(n_rows) + ")");
    }
  }
  parallel_for(static_cast<int64_t>(rows.size()), threads, [&](int64_t begin, int64_t end) {
    std::vector<double> scores(s.seq_k);
    for (int64_t n = begin; n < end; ++n) {
      forward_row(s, q, k, v, rows[n], {}, o + n * s.head_dim, lse + n, scores.data(), row_of(mag.o_mag, n, s.head_dim),
                  row_of(mag.o_logit, n, s.head_dim), row_of(mag.lse_mag, n, 1));
    }
  });
}

// Two passes so every output row has exactly one writer and all passes parallelise
// over rows, whatever B*H is:
//   pass 1, over query rows i: recompute o_i and lse_i, D_i = dO_i . o_i, and
//           dQ_i = scale * sum_j dS_ij k_j
//   pass 2, over key rows j:   dV_j = sum_i P_ij dO_i,  dK_j = scale * sum_i dS_ij q_i
// with P_ij = exp(s_ij - lse_i), dP_ij = dO_i . v_j, dS_ij = P_ij (dP_ij - D_i) (pair_grad: s_ij capped and dS_ij
// times the softcap's derivative with a softcap; only the visible pairs, visible_range and visible_queries).
// Pass 2 recomputes s_ij instead of storing P (Sq x Sk per head would not fit for
// long sequences), the same trade FlashAttention makes. Under GQA a key row of kv head
// g serves the query heads of g's group: pass 2 sums each head's share on its own and
// adds the shares in group order, so the result does not depend on who owns what.
void backward(const Shape& s, const float* q, const float* k, const float* v, const float* dout,
              double* dq, double* dk, double* dv, int threads, const BwdMagnitudes& mag) {
  check_shape(s);
  const int d = s.head_dim;
  const int group = s.group_size();
  const double scale = s.softmax_scale();
  const int64_t n_q_rows = s.q_rows();
  const int64_t n_k_rows = static_cast<int64_t>(s.batch) * s.kv_heads() * s.seq_k;

  std::vector<double> lse(n_q_rows);    // (B, H, Sq)
  std::vector<double> delta(n_q_rows);  // D = rowsum(dO * O), (B, H, Sq)

  // Magnitudes (BwdMagnitudes): row norms of Q, dO, O (per query row) and K, V (per key row).
  const bool mq = mag.dq_mag && mag.dq_logit, mk = mag.dk_mag && mag.dk_logit, mv = mag.dv_mag && mag.dv_logit;
  const bool any_mag = mq || mk || mv;
  const double root_d = std::sqrt(static_cast<double>(d));
  std::vector<double> q_norm, do_norm, o_norm, k_norm, v_norm;
  if (any_mag) {
    q_norm.resize(n_q_rows);
    do_norm.resize(n_q_rows);
    o_norm.resize(n_q_rows);
    k_norm.resize(n_k_rows);
    v_norm.resize(n_k_rows);
    parallel_for(n_q_rows, threads, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        q_norm[r] = norm2(q + r * d, d);
        do_norm[r] = norm2(dout + r * d, d);
      }
    });
    parallel_for(n_k_rows, threads, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        k_norm[r] = norm2(k + r * d, d);
        v_norm[r] = norm2(v + r * d, d);
      }
    });
  }

  // Pass 1: per query row.
  parallel_for(n_q_rows, threads, [&](int64_t begin, int64_t end) {
    std::vector<double> scores(s.seq_k);
    std::vector<double> o_row(d);
    for (int64_t r = begin; r < end; ++r) {
      forward_row(s, q, k, v, r, {}, o_row.data(), &lse[r], scores.data());
      const float* do_row = dout + r * d;  // dout is (B, H, Sq, d)
      double D = 0, o2 = 0;
      for (int x = 0; x < d; ++x) {
        D += static_cast<double>(do_row[x]) * o_row[x];
        o2 += o_row[x] * o_row[x];
      }
      delta[r] = D;
      if (any_mag) o_norm[r] = std::sqrt(o2);
      double* mq_row = mq ? mag.dq_mag + r * d : nullptr;
      double* lq_row = mq ? mag.dq_logit + r * d : nullptr;
      if (mq) {
        std::fill(mq_row, mq_row + d, 0.0);
        std::fill(lq_row, lq_row + d, 0.0);
      }

      const int64_t kv_bh = kv_pair_of(s, r / s.seq_q);
      const float* q_row = q + r * d;
      const float* k_head = k + kv_bh * s.seq_k * d;  // k, v are (B, Hk, Sk, d)
      const float* v_head = v + kv_bh * s.seq_k * d;
      double* dq_row = dq + r * d;  // dq is (B, H, Sq, d)
      std::fill(dq_row, dq_row + d, 0.0);
      // Masked keys (outside [first, end): causal, the window) have P = 0 and contribute nothing; a fully
      // masked row has first == end, so its dQ stays 0.
      const KeySpan keys = visible_range(s, r % s.seq_q);
      double qk[kDotRows], dov[kDotRows];
      for (int64_t j = keys.first; j < keys.end; ++j) {
        const int t = static_cast<int>((j - keys.first) % kDotRows);
        if (t == 0) {  // the next block's dots
          const int n = static_cast<int>(std::min<int64_t>(kDotRows, keys.end - j));
          dot_rows(q_row, k_head + j * d, d, d, n, qk);
          dot_rows(do_row, v_head + j * d, d, d, n, dov);
        }
        if (!s.allowed(r / s.seq_q, r % s.seq_q, j)) continue;  // the explicit mask: P = 0
        const float* k_row = k_head + j * d;
        const double bias = s.alibi_bias(r / s.seq_q, r % s.seq_q, j);
        const PairGrad pg = pair_grad(s, scale, qk[t], dov[t], lse[r], D, bias);
        for (int x = 0; x < d; ++x) dq_row[x] += scale * pg.ds * static_cast<double>(k_row[x]);
        if (mq) {
          const int64_t kr = kv_bh * s.seq_k + j;
          const double w = do_norm[r] * (v_norm[kr] + o_norm[r]);
          const double lambda = exponent_units(s, pg.raw, pg.capped, lse[r], q_norm[r] * k_norm[kr], root_d, bias);
          const double a = scale * pg.p * w, b = scale * (lambda * std::fabs(pg.ds) + kTanhUnits * pg.ds_tanh);
          for (int x = 0; x < d; ++x) {
            const double kx = std::fabs(static_cast<double>(k_row[x]));
            mq_row[x] += a * kx;
            lq_row[x] += b * kx;
          }
        }
      }
    }
  });

  // Pass 2: per key row of (B, Hk, Sk).
  parallel_for(n_k_rows, threads, [&](int64_t begin, int64_t end) {
    // One query head's share of a key row: dK, dV and their four magnitudes, d each.
    std::vector<double> share(6 * d);
    double *dk_share = share.data(), *dv_share = dk_share + d;
    double *mk_share = dv_share + d, *lk_share = mk_share + d, *mv_share = lk_share + d, *lv_share = mv_share + d;
    for (int64_t kr = begin; kr < end; ++kr) {
      const int64_t kv_bh = kr / s.seq_k;
      const int64_t j = kr % s.seq_k;
      const float* k_row = k + kr * d;  // k is (B, Hk, Sk, d)
      const float* v_row = v + kr * d;
      double* dk_row = dk + kr * d;     // dk, dv are (B, Hk, Sk, d)
      double* dv_row = dv + kr * d;
      std::fill(dk_row, dk_row + d, 0.0);
      std::fill(dv_row, dv_row + d, 0.0);
      double* mk_row = mk ? mag.dk_mag + kr * d : nullptr;
      double* lk_row = mk ? mag.dk_logit + kr * d : nullptr;
      double* mv_row = mv ? mag.dv_mag + kr * d : nullptr;
      double* lv_row = mv ? mag.dv_logit + kr * d : nullptr;
      for (double* m : {mk_row, lk_row, mv_row, lv_row})
        if (m) std::fill(m, m + d, 0.0);
      // The queries that see key j (causal, the window): the rest have P = 0.
      const KeySpan queries = visible_queries(s, j);
      for (int64_t bh = kv_bh * group; bh < (kv_bh + 1) * group; ++bh) {  // the group's query heads, in order
        std::fill(share.begin(), share.end(), 0.0);
        double qk[kDotRows], dov[kDotRows];
        for (int64_t i = queries.first; i < queries.end; ++i) {
          const int64_t r = bh * s.seq_q + i;
          const float* q_row = q + r * d;
          const float* do_row = dout + r * d;
          const int t = static_cast<int>((i - queries.first) % kDotRows);
          if (t == 0) {  // the next block's dots (q_i . k_j = k_j . q_i: the same products, in the same order)
            const int n = static_cast<int>(std::min<int64_t>(kDotRows, queries.end - i));
            dot_rows(k_row, q_row, d, d, n, qk);
            dot_rows(v_row, do_row, d, d, n, dov);
          }
          if (!s.allowed(bh, i, j)) continue;  // the explicit mask: P = 0
          const double bias = s.alibi_bias(bh, i, j);
          const PairGrad pg = pair_grad(s, scale, qk[t], dov[t], lse[r], delta[r], bias);
          const double p = pg.p;
          for (int x = 0; x < d; ++x) {
            dv_share[x] += p * static_cast<double>(do_row[x]);
            dk_share[x] += scale * pg.ds * static_cast<double>(q_row[x]);
          }
          if (mk || mv) {
            const double lambda = exponent_units(s, pg.raw, pg.capped, lse[r], q_norm[r] * k_norm[kr], root_d, bias);
            const double a = scale * p * do_norm[r] * (v_norm[kr] + o_norm[r]);
            const double b = scale * (lambda * std::fabs(pg.ds) + kTanhUnits * pg.ds_tanh);
            const double pl = p * lambda;
            for (int x = 0; x < d; ++x) {
              const double qx = std::fabs(static_cast<double>(q_row[x])), dox = std::fabs(static_cast<double>(do_row[x]));
              mk_share[x] += a * qx;
              lk_share[x] += b * qx;
              mv_share[x] += p * dox;
              lv_share[x] += pl * dox;
            }
          }
        }
        // With one head per group this is 0 + share = share, the multi-head sum exactly.
        for (int x = 0; x < d; ++x) {
          dk_row[x] += dk_share[x];
          dv_row[x] += dv_share[x];
          if (mk) {
            mk_row[x] += mk_share[x];
            lk_row[x] += lk_share[x];
          }
          if (mv) {
            mv_row[x] += mv_share[x];
            lv_row[x] += lv_share[x];
          }
        }
      }
    }
  });
}

// --- packed variable-length batches ---------------------------------------------------------

int VarlenShape::kv_heads() const { return heads_k > 0 ? heads_k : heads; }

namespace {

// Checks one offsets array (batch + 1 entries from 0, non-decreasing); what names it in errors.
void check_offsets(std::span<const int32_t> cu, const std::string& what) {
  if (cu.empty()) throw std::invalid_argument(what + " needs batch + 1 entries, has none");
  if (cu[0] != 0) throw std::invalid_argument(what + " must start at 0, starts at " + std::to_string(cu[0]));
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    if (cu[b + 1] < cu[b]) {
      throw std::invalid_argument(what + " decreases at entry " + std::to_string(b + 1) + " (" +
                                  std::to_string(cu[b]) + " then " + std::to_string(cu[b + 1]) + ")");
    }
  }
}

// Checks a packed batch and returns its number of sequences.
int check_varlen(const VarlenShape& vs, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k,
                 const char* function) {
  const std::string where = std::string("flashtune::ref::") + function + ": ";
  if (vs.heads <= 0 || vs.head_dim <= 0) throw std::invalid_argument(where + "heads and head_dim must be positive");
  check_shape(Shape{1, vs.heads, 1, 1, vs.head_dim, vs.causal, vs.scale, vs.heads_k, vs.window_left, vs.window_right,
                    vs.softcap, vs.alibi_slopes, vs.alibi_batch_stride});  // heads_k, window, softcap, slopes
  check_offsets(cu_q, where + "cu_seqlens_q");
  check_offsets(cu_k, where + "cu_seqlens_k");
  if (cu_q.size() != cu_k.size()) {
    throw std::invalid_argument(where + "cu_seqlens_q and cu_seqlens_k differ in length (" +
                                std::to_string(cu_q.size()) + " and " + std::to_string(cu_k.size()) + ")");
  }
  return static_cast<int>(cu_q.size() - 1);
}

// One sequence of a packed batch, as the dense problem it is (batch 1). A length may be 0,
// which check_shape refuses: callers handle those sequences without the dense path.
// Sequence b's slopes (ALiBi) at its batch stride.
Shape sequence_shape(const VarlenShape& vs, int b, int64_t len_q, int64_t len_k) {
  return Shape{1,          vs.heads, static_cast<int>(len_q), static_cast<int>(len_k), vs.head_dim, vs.causal, vs.scale,
               vs.heads_k, vs.window_left, vs.window_right, vs.softcap,
               vs.alibi_slopes ? vs.alibi_slopes + b * vs.alibi_batch_stride : nullptr, 0};
}

// Between the packed layout (tokens, heads, d) and a sequence's dense one (1, heads, len, d):
// tokens [first, first + len) of the packed tensor are the dense tensor's rows.
template <class T>
void gather_tokens(const T* packed, int64_t first, int64_t len, int heads, int d, T* dense) {
  for (int h = 0; h < heads; ++h)
    for (int64_t t = 0; t < len; ++t)
      std::copy_n(packed + ((first + t) * heads + h) * d, d, dense + (h * len + t) * d);
}

void scatter_tokens(const double* dense, int64_t first, int64_t len, int heads, int d, double* packed) {
  for (int h = 0; h < heads; ++h)
    for (int64_t t = 0; t < len; ++t)
      std::copy_n(dense + (h * len + t) * d, d, packed + ((first + t) * heads + h) * d);
}

// lse: dense (1, H, len) into packed (H, total_q).
void scatter_lse(const double* dense, int64_t first, int64_t len, int heads, int64_t total_q, double* packed) {
  for (int h = 0; h < heads; ++h) std::copy_n(dense + h * len, len, packed + h * total_q + first);
}

// A dense buffer for an optional output: n zeros when wanted, else none (and a nullptr).
struct OptionalBuffer {
  std::vector<double> data;
  OptionalBuffer(bool wanted, int64_t n) : data(wanted ? n : 0) {}
  double* ptr() { return data.empty() ? nullptr : data.data(); }
};

}  // namespace

// Each sequence is gathered into its dense layout and run through forward(), so that it matches
// that call bit for bit; sequences run one after another, each on all threads.
void forward_varlen(const VarlenShape& vs, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k,
                    const float* q, const float* k, const float* v, double* o, double* lse, int threads,
                    const FwdMagnitudes& mag) {
  const int batch = check_varlen(vs, cu_q, cu_k, "forward_varlen");
  const int H = vs.heads, d = vs.head_dim;
  const int Hk = vs.kv_heads();
  const int64_t total_q = cu_q[batch];
  for (int b = 0; b < batch; ++b) {
    const int64_t first_q = cu_q[b], len_q = cu_q[b + 1] - first_q;
    const int64_t first_k = cu_k[b], len_k = cu_k[b + 1] - first_k;
    if (len_q == 0) continue;  // nothing to write
    const int64_t n_q = len_q * H * d;
    std::vector<double> o_seq(n_q, 0.0), lse_seq(len_q * H, kInf);  // no keys: O = 0, lse = +inf
    OptionalBuffer o_mag(mag.o_mag != nullptr, n_q), o_logit(mag.o_logit != nullptr, n_q),
        lse_mag(mag.lse_mag != nullptr, len_q * H);  // zeros: a row without keys has none
    if (len_k > 0) {
      const Shape s = sequence_shape(vs, b, len_q, len_k);
      std::vector<float> q_seq(n_q), k_seq(len_k * Hk * d), v_seq(len_k * Hk * d);
      gather_tokens(q, first_q, len_q, H, d, q_seq.data());
      gather_tokens(k, first_k, len_k, Hk, d, k_seq.data());
      gather_tokens(v, first_k, len_k, Hk, d, v_seq.data());
      forward(s, q_seq.data(), k_seq.data(), v_seq.data(), o_seq.data(), lse_seq.data(), threads,
              {o_mag.ptr(), o_logit.ptr(), lse_mag.ptr()});
    }
    scatter_tokens(o_seq.data(), first_q, len_q, H, d, o);
    scatter_lse(lse_seq.data(), first_q, len_q, H, total_q, lse);
    if (mag.o_mag) scatter_tokens(o_mag.ptr(), first_q, len_q, H, d, mag.o_mag);
    if (mag.o_logit) scatter_tokens(o_logit.ptr(), first_q, len_q, H, d, mag.o_logit);
    if (mag.lse_mag) scatter_lse(lse_mag.ptr(), first_q, len_q, H, total_q, mag.lse_mag);
  }
}

// As forward_varlen: one dense backward() per sequence. A sequence without queries still owns its
// keys' rows of dK and dV (zeros); one without keys, its queries' rows of dQ (zeros).
void backward_varlen(const VarlenShape& vs, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k,
                     const float* q, const float* k, const float* v, const float* dout, double* dq,
                     double* dk, double* dv, int threads, const BwdMagnitudes& mag) {
  const int batch = check_varlen(vs, cu_q, cu_k, "backward_varlen");
  const int H = vs.heads, d = vs.head_dim;
  const int Hk = vs.kv_heads();
  // As in backward(): a gradient's magnitudes are computed when both of its arrays are given.
  const bool mq = mag.dq_mag && mag.dq_logit, mk = mag.dk_mag && mag.dk_logit, mv = mag.dv_mag && mag.dv_logit;
  for (int b = 0; b < batch; ++b) {
    const int64_t first_q = cu_q[b], len_q = cu_q[b + 1] - first_q;
    const int64_t first_k = cu_k[b], len_k = cu_k[b + 1] - first_k;
    const int64_t n_q = len_q * H * d, n_k = len_k * Hk * d;
    std::vector<double> dq_seq(n_q, 0.0), dk_seq(n_k, 0.0), dv_seq(n_k, 0.0);
    OptionalBuffer dq_mag(mq, n_q), dq_logit(mq, n_q), dk_mag(mk, n_k), dk_logit(mk, n_k),
        dv_mag(mv, n_k), dv_logit(mv, n_k);
    if (len_q > 0 && len_k > 0) {
      const Shape s = sequence_shape(vs, b, len_q, len_k);
      std::vector<float> q_seq(n_q), do_seq(n_q), k_seq(n_k), v_seq(n_k);
      gather_tokens(q, first_q, len_q, H, d, q_seq.data());
      gather_tokens(dout, first_q, len_q, H, d, do_seq.data());
      gather_tokens(k, first_k, len_k, Hk, d, k_seq.data());
      gather_tokens(v, first_k, len_k, Hk, d, v_seq.data());
      backward(s, q_seq.data(), k_seq.data(), v_seq.data(), do_seq.data(), dq_seq.data(), dk_seq.data(),
               dv_seq.data(), threads,
               {dq_mag.ptr(), dq_logit.ptr(), dk_mag.ptr(), dk_logit.ptr(), dv_mag.ptr(), dv_logit.ptr()});
    }
    scatter_tokens(dq_seq.data(), first_q, len_q, H, d, dq);
    scatter_tokens(dk_seq.data(), first_k, len_k, Hk, d, dk);
    scatter_tokens(dv_seq.data(), first_k, len_k, Hk, d, dv);
    if (mq) {
      scatter_tokens(dq_mag.ptr(), first_q, len_q, H, d, mag.dq_mag);
      scatter_tokens(dq_logit.ptr(), first_q, len_q, H, d, mag.dq_logit);
    }
    if (mk) {
      scatter_tokens(dk_mag.ptr(), first_k, len_k, Hk, d, mag.dk_mag);
      scatter_tokens(dk_logit.ptr(), first_k, len_k, Hk, d, mag.dk_logit);
    }
    if (mv) {
      scatter_tokens(dv_mag.ptr(), first_k, len_k, Hk, d, mag.dv_mag);
      scatter_tokens(dv_logit.ptr(), first_k, len_k, Hk, d, mag.dv_logit);
    }
  }
}

// --- split-KV ---------------------------------------------------------------------------------

void forward_split(const Shape& s, const float* q, const float* k, const float* v, int64_t key_begin,
                   int64_t key_end, double* o, double* lse, int threads) {
  check_shape(s);
  if (key_begin < 0 || key_begin > key_end || key_end > s.seq_k) {
    throw std::invalid_argument("flashtune::ref::forward_split: keys [" + std::to_string(key_begin) + ", " +
                                std::to_string(key_end) + ") not a range within [0, " +
                                std::to_string(s.seq_k) + "]");
  }
  const KeyRange keys{key_begin, key_end, -kInf};  // an empty split: lse = -inf
  parallel_for(s.q_rows(), threads, [&](int64_t begin, int64_t end) {
    std::vector<double> scores(s.seq_k);
    for (int64_t r = begin; r < end; ++r) {
      forward_row(s, q, k, v, r, keys, o + r * s.head_dim, lse + r, scores.data());
    }
  });
}

void combine_splits(const Shape& s, int n_splits, const double* o_splits, const double* lse_splits,
                    double* o, double* lse, int threads) {
  check_shape(s);
  if (n_splits < 1) {
    throw std::invalid_argument("flashtune::ref::combine_splits: n_splits must be positive, is " +
                                std::to_string(n_splits));
  }
  const int d = s.head_dim;
  const int64_t n_rows = s.q_rows();
  parallel_for(n_rows, threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      // An empty split (infinite LSE_s) has weight 0: skipped, rather than risk inf - inf.
      auto split_lse = [&](int sp) { return lse_splits[sp * n_rows + r]; };
      double lse_max = -kInf;
      for (int sp = 0; sp < n_splits; ++sp)
        if (!std::isinf(split_lse(sp))) lse_max = std::max(lse_max, split_lse(sp));
      double* o_row = o + r * d;
      std::fill(o_row, o_row + d, 0.0);
      if (lse_max == -kInf) {  // every split empty: the dense rule for a fully masked row
        lse[r] = kInf;
        continue;
      }
      // Subtracting the max keeps every exp <= 1, as in the softmax itself.
      double sum = 0;
      for (int sp = 0; sp < n_splits; ++sp)
        if (!std::isinf(split_lse(sp))) sum += std::exp(split_lse(sp) - lse_max);
      lse[r] = lse_max + std::log(sum);
      for (int sp = 0; sp < n_splits; ++sp) {
        if (std::isinf(split_lse(sp))) continue;
        const double weight = std::exp(split_lse(sp) - lse[r]);
        const double* o_split = o_splits + (sp * n_rows + r) * d;
        for (int x = 0; x < d; ++x) o_row[x] += weight * o_split[x];
      }
    }
  });
}

std::vector<int64_t> sample_rows(const Shape& s, int64_t max_rows, uint64_t seed) {
  check_shape(s);
  const int64_t n_heads = static_cast<int64_t>(s.batch) * s.heads;
  const int64_t n_rows = n_heads * s.seq_q;
  std::vector<int64_t> out;
  if (max_rows <= 0) return out;
  if (n_rows <= max_rows) {
    out.resize(n_rows);
    for (int64_t r = 0; r < n_rows; ++r) out[r] = r;
    return out;
  }

  // Own mapping from raw 64-bit draws (not std::uniform_int_distribution, whose
  // algorithm is implementation-defined) so a seed picks the same rows everywhere.
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };

  // Fixed rows, in priority order. (b, h) pairs: last, first, middle, one random.
  const int64_t pairs[] = {n_heads - 1, 0, n_heads / 2, uniform(n_heads)};
  const int64_t last_tile_start = (s.seq_q - 1) / kTileRows * kTileRows;
  const int64_t last_tile_rows = s.seq_q - last_tile_start;
  std::vector<int64_t> must;
  for (int64_t bh : pairs) {
    const int64_t base = bh * s.seq_q;
    must.push_back(base + s.seq_q - 1);                             // last row
    must.push_back(base);                                           // first row
    must.push_back(base + last_tile_start);                         // start of last tile
    must.push_back(base + last_tile_start + last_tile_rows / 2);    // middle of last tile
    must.push_back(base + last_tile_start + uniform(last_tile_rows));  // random in last tile
  }

  std::unordered_set<int64_t> chosen;
  for (int64_t r : must) {
    if (static_cast<int64_t>(out.size()) == max_rows) break;
    if (chosen.insert(r).second) out.push_back(r);
  }

  // Top up with uniformly random rows. Terminates because n_rows > max_rows.
  while (static_cast<int64_t>(out.size()) < max_rows) {
    const int64_t r = uniform(n_rows);
    if (chosen.insert(r).second) out.push_back(r);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace flashtune::ref
