// Issue 32, ALiBi: the float64 reference's bias against plain float64 attention with an explicit bias matrix built
// here from FlashAttention's definition (tests' attn_bias_from_alibi_slopes: -slope |i + Sk - Sq - j|, added to the
// scaled, and capped, scores), with the window's mask matrix, causal and not, Sq != Sk both ways, GQA, slopes [H]
// and [B, H]; the backward likewise and against central differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/attention_ref.hpp"
#include "tests/reference_inputs.hpp"

namespace {

using flashtune::ref::Shape;
namespace ref = flashtune::ref;

constexpr double kInf = std::numeric_limits<double>::infinity();

using flashtune::test::random_tensor;

std::string describe(const Shape& s) {
  return "B" + std::to_string(s.batch) + " H" + std::to_string(s.heads) + "/" + std::to_string(s.kv_heads()) + " Sq" +
         std::to_string(s.seq_q) + " Sk" + std::to_string(s.seq_k) + (s.causal ? " causal" : "") + " window " +
         std::to_string(s.window_left) + "," + std::to_string(s.window_right) + " softcap " + std::to_string(s.softcap) +
         " stride " + std::to_string(s.alibi_batch_stride);
}

// FlashAttention's slopes for H heads: 2^(-8 (h + 1) / H) (ALiBi's geometric sequence), per batch b times (1 + b).
std::vector<float> slopes_for(int batch, int heads, bool per_batch) {
  std::vector<float> out((size_t)(per_batch ? batch : 1) * heads);
  for (size_t x = 0; x < out.size(); ++x)
    out[x] = (float)(std::exp2(-8.0 * (double)(x % heads + 1) / heads) * (1.0 + (double)(x / heads)));
  return out;
}

// Explicit matrices per head: S = scale q k^T (capped), plus B[i][j] = -slope |i + Sk - Sq - j|, -inf where the
// window's (or causal's) matrix masks; softmax; P V; and the backward by its matrices (dS = P (dP - D) (1 - t^2)).
struct Result {
  std::vector<double> o, lse, dq, dk, dv;
};
Result explicit_attention(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                          const std::vector<float>& v, const std::vector<float>* dout) {
  const int Sq = s.seq_q, Sk = s.seq_k, d = s.head_dim, g = s.heads / s.kv_heads();
  const double scale = s.scale > 0 ? s.scale : 1.0 / std::sqrt((double)d);
  Result r{std::vector<double>((size_t)s.q_elements()), std::vector<double>((size_t)s.q_rows()),
           std::vector<double>((size_t)s.q_elements()), std::vector<double>((size_t)s.kv_elements()),
           std::vector<double>((size_t)s.kv_elements())};
  std::vector<double> P((size_t)Sq * Sk), T((size_t)Sq * Sk);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const double slope = s.alibi_slopes ? (double)s.alibi_slopes[b * s.alibi_batch_stride + h] : 0.0;
      const size_t qh = ((size_t)b * s.heads + h) * Sq, kh = ((size_t)b * s.kv_heads() + h / g) * Sk;
      auto dot = [&](const std::vector<float>& a, size_t ra, const std::vector<float>& c, size_t rc) {
        double acc = 0;
        for (int x = 0; x < d; ++x) acc += (double)a[ra * d + x] * (double)c[rc * d + x];
        return acc;
      };
      for (int i = 0; i < Sq; ++i) {
        double m = -kInf;
        for (int j = 0; j < Sk; ++j) {
          const long long diag = (long long)i + Sk - Sq;
          bool ok = !(s.causal && j > diag);
          if (s.window_left >= 0 && j < diag - s.window_left) ok = false;
          if (s.window_right >= 0 && j > diag + s.window_right) ok = false;
          double sc = scale * dot(q, qh + i, k, kh + j);
          T[(size_t)i * Sk + j] = s.softcap > 0 ? std::tanh(sc / s.softcap) : 0.0;
          if (s.softcap > 0) sc = s.softcap * T[(size_t)i * Sk + j];
          const double bias = -slope * (double)std::llabs((long long)i + Sk - Sq - j);
          P[(size_t)i * Sk + j] = ok ? sc + bias : -kInf;
          m = std::max(m, P[(size_t)i * Sk + j]);
        }
        if (m == -kInf) {
          r.lse[qh + i] = kInf;
          for (int j = 0; j < Sk; ++j) P[(size_t)i * Sk + j] = 0;
          continue;
        }
        double l = 0;
        for (int j = 0; j < Sk; ++j) l += std::exp(P[(size_t)i * Sk + j] - m);
        r.lse[qh + i] = m + std::log(l);
        for (int j = 0; j < Sk; ++j) P[(size_t)i * Sk + j] = std::exp(P[(size_t)i * Sk + j] - m) / l;
        for (int x = 0; x < d; ++x) {
          double acc = 0;
          for (int j = 0; j < Sk; ++j) acc += P[(size_t)i * Sk + j] * (double)v[(kh + j) * d + x];
          r.o[(qh + i) * d + x] = acc;
        }
      }
      if (!dout) continue;
      for (int i = 0; i < Sq; ++i) {
        double D = 0;
        for (int j = 0; j < Sk; ++j) D += P[(size_t)i * Sk + j] * dot(*dout, qh + i, v, kh + j);
        for (int j = 0; j < Sk; ++j) {
          const double p = P[(size_t)i * Sk + j], t = T[(size_t)i * Sk + j];
          const double ds = p * (dot(*dout, qh + i, v, kh + j) - D) * (1 - t * t);
          for (int x = 0; x < d; ++x) {
            r.dq[(qh + i) * d + x] += scale * ds * (double)k[(kh + j) * d + x];
            r.dk[(kh + j) * d + x] += scale * ds * (double)q[(qh + i) * d + x];
            r.dv[(kh + j) * d + x] += p * (double)(*dout)[(qh + i) * d + x];
          }
        }
      }
    }
  return r;
}

struct Case {
  Shape shape;
  bool per_batch;  // slopes [B, H] (stride H) or [H] (stride 0)
};

Shape shape(int batch, int sq, int sk, bool causal, int heads = 4, int heads_k = 0, int left = -1, int right = -1,
            double softcap = 0) {
  Shape s{batch, heads, sq, sk, 16, causal};
  s.heads_k = heads_k;
  s.window_left = left, s.window_right = right, s.softcap = softcap;
  return s;
}

// Causal and not; Sq = Sk, Sq > Sk (causal rows that see nothing), Sq < Sk; GQA and MQA; with a window and a
// softcap; slopes [H] and [B, H].
std::vector<Case> cases() {
  std::vector<Case> out;
  for (auto [sq, sk] : {std::pair{40, 40}, std::pair{57, 23}, std::pair{19, 70}})
    for (bool causal : {false, true})
      for (bool per_batch : {false, true}) out.push_back({shape(2, sq, sk, causal), per_batch});
  out.push_back({shape(2, 33, 50, true, 4, 2), true});                // GQA
  out.push_back({shape(1, 50, 33, false, 4, 1), false});              // MQA
  out.push_back({shape(2, 45, 60, false, 4, 0, 9, 3), true});         // window
  out.push_back({shape(2, 60, 45, true, 4, 2, 20, -1, 0.7), true});   // window, softcap, GQA
  out.push_back({shape(1, 40, 40, false, 2, 0, -1, -1, 30.0), false});  // softcap
  return out;
}

struct Inputs {
  std::vector<float> q, k, v, dout, slopes;
};
Inputs inputs_for(Shape& s, bool per_batch, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in{random_tensor(s.q_elements(), rng, 1.5f), random_tensor(s.kv_elements(), rng, 1.5f),
            random_tensor(s.kv_elements(), rng, 1.0f), random_tensor(s.q_elements(), rng, 1.0f),
            slopes_for(s.batch, s.heads, per_batch)};
  s.alibi_slopes = in.slopes.data();
  s.alibi_batch_stride = per_batch ? s.heads : 0;
  return in;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t n = 0; n < want.size(); ++n) {
    if (std::isinf(want[n])) {
      ASSERT_EQ(got[n], want[n]) << what << "[" << n << "]";
    } else {
      ASSERT_NEAR(got[n], want[n], tol * std::max(1.0, std::fabs(want[n]))) << what << "[" << n << "]";
    }
  }
}

TEST(ReferenceAlibi, ForwardMatchesExplicitBiasMatrix) {
  uint64_t seed = 7;
  for (Case c : cases()) {
    Shape& s = c.shape;
    const Inputs in = inputs_for(s, c.per_batch, seed++);
    std::vector<double> o((size_t)s.q_elements()), lse((size_t)s.q_rows());
    ref::forward(s, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), 2);
    const Result want = explicit_attention(s, in.q, in.k, in.v, nullptr);
    expect_near(lse, want.lse, 1e-12, describe(s) + " lse");
    expect_near(o, want.o, 1e-12, describe(s) + " o");
    // forward_rows agrees bit for bit (the worker samples rows).
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < s.q_rows(); r += 5) rows.push_back(r);
    std::vector<double> ro(rows.size() * s.head_dim), rl(rows.size());
    ref::forward_rows(s, in.q.data(), in.k.data(), in.v.data(), rows, ro.data(), rl.data(), 1);
    for (size_t n = 0; n < rows.size(); ++n) ASSERT_EQ(rl[n], lse[(size_t)rows[n]]) << describe(s);
  }
}

// The test can fail: without the slopes (or with [H] read as [B, H]) the outputs differ.
TEST(ReferenceAlibi, DroppingTheBiasIsSeen) {
  Shape s = shape(2, 30, 40, false);
  const Inputs in = inputs_for(s, true, 3);
  std::vector<double> o((size_t)s.q_elements()), lse((size_t)s.q_rows());
  ref::forward(s, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), 1);
  Shape head_only = s, none = s;
  head_only.alibi_batch_stride = 0;  // batch 1 would read batch 0's slopes
  none.alibi_slopes = nullptr;
  for (const Shape& t : {head_only, none}) {
    std::vector<double> o2((size_t)s.q_elements()), lse2((size_t)s.q_rows());
    ref::forward(t, in.q.data(), in.k.data(), in.v.data(), o2.data(), lse2.data(), 1);
    double diff = 0;
    for (size_t n = 0; n < o.size(); ++n) diff = std::max(diff, std::fabs(o[n] - o2[n]));
    EXPECT_GT(diff, 1e-3) << describe(t);
  }
  // Causal: a bias that is constant along a row (FlashAttention's kernels add slope * j there) gives the same O,
  // but the LSE is that of -slope |i + Sk - Sq - j| (ours, the reference's and the kernels').
  Shape causal = shape(1, 20, 20, true, 2);
  const Inputs ci = inputs_for(causal, false, 4);
  std::vector<double> oc((size_t)causal.q_elements()), lc((size_t)causal.q_rows());
  ref::forward(causal, ci.q.data(), ci.k.data(), ci.v.data(), oc.data(), lc.data(), 1);
  const Result want = explicit_attention(causal, ci.q, ci.k, ci.v, nullptr);
  expect_near(lc, want.lse, 1e-12, "causal lse");
}

TEST(ReferenceAlibi, BackwardMatchesExplicitBiasMatrix) {
  uint64_t seed = 70;
  for (Case c : cases()) {
    Shape& s = c.shape;
    const Inputs in = inputs_for(s, c.per_batch, seed++);
    std::vector<double> dq((size_t)s.q_elements()), dk((size_t)s.kv_elements()), dv((size_t)s.kv_elements());
    ref::backward(s, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), dq.data(), dk.data(), dv.data(), 2);
    const Result want = explicit_attention(s, in.q, in.k, in.v, &in.dout);
    expect_near(dq, want.dq, 1e-11, describe(s) + " dq");
    expect_near(dk, want.dk, 1e-11, describe(s) + " dk");
    expect_near(dv, want.dv, 1e-11, describe(s) + " dv");
  }
}

// dQ against central differences of L = sum(dO * O) in q (the bias does not depend on q: its gradient is the plain
// formula's, with P biased).
TEST(ReferenceAlibi, BackwardMatchesFiniteDifferences) {
  for (Case c : {Case{shape(1, 12, 17, false, 2), true}, Case{shape(2, 17, 12, true, 2, 1, -1, -1, 2.0), true}}) {
    Shape& s = c.shape;
    Inputs in = inputs_for(s, c.per_batch, 11);
    std::vector<double> dq((size_t)s.q_elements()), dk((size_t)s.kv_elements()), dv((size_t)s.kv_elements());
    ref::backward(s, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), dq.data(), dk.data(), dv.data(), 1);
    auto loss = [&](const std::vector<float>& q) {
      std::vector<double> o((size_t)s.q_elements()), lse((size_t)s.q_rows());
      ref::forward(s, q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), 1);
      double l = 0;
      for (size_t n = 0; n < o.size(); ++n) l += o[n] * in.dout[n];
      return l;
    };
    for (size_t n = 0; n < dq.size(); n += 13) {
      const float h = 1.0f / 64;  // exact in float
      std::vector<float> qp = in.q, qm = in.q;
      qp[n] += h, qm[n] -= h;
      const double fd = (loss(qp) - loss(qm)) / (2.0 * h);
      EXPECT_NEAR(dq[n], fd, 2e-3 * std::max(1.0, std::fabs(fd))) << describe(s) << " dq[" << n << "]";
    }
  }
}

// Packed batches: sequence b reads slopes b * stride (FlashAttention's varlen convention), each sequence as the
// dense problem of its own lengths.
TEST(ReferenceAlibi, VarlenSlopesPerSequence) {
  const int H = 2, d = 16;
  const std::vector<int32_t> cu_q{0, 9, 9, 30}, cu_k{0, 14, 20, 31};
  std::mt19937_64 rng(5);
  const auto q = random_tensor((int64_t)cu_q.back() * H * d, rng, 1.5f), k = random_tensor((int64_t)cu_k.back() * H * d, rng, 1.5f),
             v = random_tensor((int64_t)cu_k.back() * H * d, rng, 1.0f);
  const std::vector<float> slopes = slopes_for(3, H, true);
  ref::VarlenShape vs{H, d, true};
  vs.alibi_slopes = slopes.data(), vs.alibi_batch_stride = H;
  std::vector<double> o((size_t)cu_q.back() * H * d), lse((size_t)cu_q.back() * H);
  ref::forward_varlen(vs, cu_q, cu_k, q.data(), k.data(), v.data(), o.data(), lse.data(), 1);
  for (int b = 0; b < 3; ++b) {
    const int lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
    if (lq == 0) continue;
    Shape s = shape(1, lq, lk, true, H);
    s.alibi_slopes = slopes.data() + b * H;
    std::vector<float> qs((size_t)lq * H * d), ks((size_t)lk * H * d), vv((size_t)lk * H * d);
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < lq; ++t)
        std::copy_n(q.begin() + ((size_t)(cu_q[b] + t) * H + h) * d, d, qs.begin() + ((size_t)h * lq + t) * d);
      for (int t = 0; t < lk; ++t) {
        std::copy_n(k.begin() + ((size_t)(cu_k[b] + t) * H + h) * d, d, ks.begin() + ((size_t)h * lk + t) * d);
        std::copy_n(v.begin() + ((size_t)(cu_k[b] + t) * H + h) * d, d, vv.begin() + ((size_t)h * lk + t) * d);
      }
    }
    const Result want = explicit_attention(s, qs, ks, vv, nullptr);
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < lq; ++t) {
        const double got_lse = lse[(size_t)h * cu_q.back() + cu_q[b] + t], want_lse = want.lse[(size_t)h * lq + t];
        if (std::isinf(want_lse)) ASSERT_EQ(got_lse, want_lse) << "seq " << b;  // a causal row with no key
        else ASSERT_NEAR(got_lse, want_lse, 1e-12) << "seq " << b;
        for (int x = 0; x < d; ++x)
          ASSERT_NEAR(o[((size_t)(cu_q[b] + t) * H + h) * d + x], want.o[((size_t)h * lq + t) * d + x], 1e-12);
      }
  }
}

// The forward's magnitudes bound an emulated fp32 kernel: S in fp32 (the slope times 1/scale, the distance, the sum,
// exp2 of the product with scale log2(e)) against float64, for rows whose every key is far (Sq > Sk, non-causal:
// |b| up to slope Sq), where the bias's roundings are the error.
TEST(ReferenceAlibi, MagnitudesBoundAnFp32Exponent) {
  Shape s = shape(1, 300, 20, false, 2);
  const Inputs in = inputs_for(s, false, 9);
  const int d = s.head_dim;
  std::vector<double> o((size_t)s.q_elements()), lse((size_t)s.q_rows()), mag((size_t)s.q_elements()),
      logit((size_t)s.q_elements()), lmag((size_t)s.q_rows());
  ref::forward(s, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), 1, {mag.data(), logit.data(), lmag.data()});
  const float scale = (float)(1.0 / std::sqrt((double)d)), unit = (float)(1.0 / (double)scale);
  const float scale_log2 = (float)(scale * 1.4426950408889634);
  const double u32 = std::ldexp(1.0, -24);
  for (int h = 0; h < s.heads; ++h)
    for (int i = 0; i < s.seq_q; i += 7) {
      const size_t row = (size_t)h * s.seq_q + i;
      const float neg = -in.slopes[h] * unit;
      std::vector<float> x(s.seq_k);
      float m = -INFINITY;
      for (int j = 0; j < s.seq_k; ++j) {
        float acc = 0;
        for (int c = 0; c < d; ++c) acc = std::fma(in.q[row * d + c], in.k[((size_t)h * s.seq_k + j) * d + c], acc);
        x[j] = std::fma(neg, std::fabs((float)(i + s.seq_k - s.seq_q - j)), acc);
        m = std::max(m, x[j]);
      }
      double l = 0;
      std::vector<double> p(s.seq_k);
      for (int j = 0; j < s.seq_k; ++j) l += p[j] = std::exp2((double)std::fma(x[j], scale_log2, -m * scale_log2));
      const double lse32 = ((double)m * scale_log2 + std::log2(l)) * std::log(2.0);
      EXPECT_LE(std::fabs(lse32 - lse[row]), u32 * lmag[row] + 1e-12) << "row " << row << " lse " << lse[row];
      for (int c = 0; c < d; ++c) {
        double oc = 0;
        for (int j = 0; j < s.seq_k; ++j) oc += p[j] / l * (double)in.v[((size_t)h * s.seq_k + j) * d + c];
        EXPECT_LE(std::fabs(oc - o[row * d + c]), u32 * (logit[row * d + c] + 8 * mag[row * d + c]) + 1e-12) << "row " << row;
      }
    }
}

TEST(ReferenceAlibi, RefusesANegativeBatchStride) {
  Shape s = shape(1, 4, 4, false, 2);
  const std::vector<float> slopes{0.5f, 0.25f};
  s.alibi_slopes = slopes.data(), s.alibi_batch_stride = -1;
  std::vector<float> q(s.q_elements()), k(s.kv_elements()), v(s.kv_elements());
  std::vector<double> o(s.q_elements()), lse(s.q_rows());
  EXPECT_THROW(ref::forward(s, q.data(), k.data(), v.data(), o.data(), lse.data(), 1), std::invalid_argument);
}

}  // namespace
