// The straightforward comparison of outputs against the reference, as worker/validate.cpp had it before its
// fast path: the outputs converted to floats first, every element through ErrorStats::add, its reference
// element found by division. The specification the fast validate_forward / validate_backward are held to
// (test_validate.cpp: the same verdicts, bit for bit) and bench_validate's baseline. Chunked like the fast
// one (kCompareChunk elements, merged in order) so that its sums are added in the same order.
#pragma once
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/dtype_convert.hpp"
#include "worker/validate.hpp"

namespace flashtune::plain {

inline std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}
inline double finite_or_big(double x) { return std::isfinite(x) ? x : 1e30; }

// The output's bytes as floats.
inline std::vector<float> floats(const OutputTensor& t) {
  const size_t bytes = t.size * (size_t)dtype_bytes(t.dtype);
  const auto* b = static_cast<const uint8_t*>(t.data);
  return from_device_format(std::vector<uint8_t>(b, b + bytes), t.dtype);
}

inline Verdict validate_forward(const Problem& p, const FwdReference& ref, const OutputTensor& o_out,
                                const OutputTensor& lse_out) {
  const std::vector<float> o = floats(o_out), lse = floats(lse_out);
  const size_t d = (size_t)p.head_dim, nq = o.size();
  const ToleranceModel tol = forward_tolerance(p.dtype, p.seq_k, p.head_dim, p.seq_k * ref.max_abs_v);
  const ToleranceModel lse_tol = forward_tolerance(DType::fp32, p.seq_k, p.head_dim);
  const double rel_floor = report_floor(p.dtype);
  ErrorStats err_o, err_lse;
  size_t non_finite_o = 0, unwritten_lse = 0;
  for (float x : o) non_finite_o += !std::isfinite(x);
  for (float x : lse) unwritten_lse += std::isnan(x);
  for (size_t r = 0; r < ref.rows.size(); ++r) {
    const size_t row = (size_t)ref.rows[r];
    for (size_t c = 0; c < d; ++c) {
      const size_t i = r * d + c;
      err_o.add(row * d + c, o[row * d + c], ref.o[i], tol.bound(ref.o_mag[i], ref.o_logit[i]), rel_floor);
    }
    const size_t li = ref.lse_index.empty() ? row : (size_t)ref.lse_index[r];
    err_lse.add(nq + li, lse[li], ref.lse[r], lse_tol.bound(1.0, ref.lse_mag[r]), report_floor(DType::fp32));
  }
  Verdict v;
  v.max_abs = std::fmax(err_o.max_abs, err_lse.max_abs);
  v.max_rel = std::fmax(err_o.max_rel, err_lse.max_rel);
  const size_t count = err_o.count + err_lse.count;
  v.mse = count ? (err_o.sum_sq + err_lse.sum_sq) / count : 0;
  v.mean_abs = err_o.mean_abs();
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

inline Verdict validate_backward(const Problem& p, const BwdReference& ref, const BwdBounds& bounds,
                                 const OutputTensor& dq, const OutputTensor& dk, const OutputTensor& dv) {
  const char* names[] = {"dq", "dk", "dv"};
  const std::vector<float> gots[] = {floats(dq), floats(dk), floats(dv)};
  const std::vector<double>* refs[] = {&ref.dq, &ref.dk, &ref.dv};
  const std::vector<double>* bound_of[] = {&bounds.dq, &bounds.dk, &bounds.dv};
  const double rel_floor = report_floor(p.dtype);
  Verdict v;
  double sum_sq = 0, sum_abs = 0;
  size_t count = 0;
  std::string msg;
  for (int g = 0; g < 3; ++g) {
    const std::vector<float>& got = gots[g];
    const std::vector<double>& want = *refs[g];
    const size_t row = g == 0 ? ref.q_row : ref.k_row, row_ref = g == 0 ? ref.q_row_ref : ref.k_row_ref;
    auto ref_index = [&](size_t i) { return row ? i / row * row_ref + i % row % row_ref : i % want.size(); };
    struct Part {
      ErrorStats err;
      size_t non_finite = 0;
      double diff2 = 0, ref2 = 0;
    };
    const size_t chunks = std::max<size_t>(1, (got.size() + kCompareChunk - 1) / kCompareChunk);
    std::vector<Part> parts(chunks);
    for (size_t c = 0; c < chunks; ++c) {
      Part& part = parts[c];
      for (size_t i = c * kCompareChunk; i < std::min(got.size(), (c + 1) * kCompareChunk); ++i) {
        const size_t j = ref_index(i);
        part.non_finite += !std::isfinite(got[i]);
        part.err.add(i, got[i], want[j], (*bound_of[g])[j], rel_floor);
        if (std::isfinite(got[i])) {
          part.diff2 += (got[i] - want[j]) * (got[i] - want[j]);
          part.ref2 += want[j] * want[j];
        }
      }
    }
    ErrorStats err = parts[0].err;
    size_t non_finite = parts[0].non_finite;
    double diff2 = parts[0].diff2, ref2 = parts[0].ref2;
    for (size_t c = 1; c < chunks; ++c) {
      err.merge(parts[c].err);
      non_finite += parts[c].non_finite;
      diff2 += parts[c].diff2;
      ref2 += parts[c].ref2;
    }
    const std::string name = names[g];
    const double rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    v.detail[name + "_rel_l2"] = finite_or_big(rel_l2);
    v.detail[name + "_worst_err_over_bound"] = finite_or_big(err.worst_ratio);
    v.max_abs = std::fmax(v.max_abs, err.max_abs);
    v.max_rel = std::fmax(v.max_rel, err.max_rel);
    v.worst_ratio = std::fmax(v.worst_ratio, err.worst_ratio);
    sum_sq += err.sum_sq;
    sum_abs += err.sum_abs;
    count += err.count;
    if (non_finite) msg += name + ": " + std::to_string(non_finite) + " elements NaN, infinite or unwritten; ";
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

}  // namespace flashtune::plain
