// Issue 32: the float64 reference's sliding window and logit softcap against plain float64 attention with an
// explicit mask matrix and score map built here, independently of the reference's key ranges.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "reference/attention_ref.hpp"
#include "tests/reference_inputs.hpp"

namespace {

using flashtune::ref::Shape;
namespace ref = flashtune::ref;

constexpr double kInf = std::numeric_limits<double>::infinity();

using flashtune::test::random_tensor;

// The mask as a matrix, from FlashAttention's definition (flash_attn_func's docstring): query i, key j, bottom-right
// aligned, "query at position i will only attend to keys between [i + seqlen_k - seqlen_q - window_size[0],
// i + seqlen_k - seqlen_q + window_size[1]] inclusive", causal = window_size[1] 0, -1 unbounded.
std::vector<char> mask_matrix(const Shape& s) {
  std::vector<char> allowed((size_t)s.seq_q * s.seq_k);
  for (int i = 0; i < s.seq_q; ++i)
    for (int j = 0; j < s.seq_k; ++j) {
      const long long lo = (long long)i + s.seq_k - s.seq_q - s.window_left;
      const long long hi = (long long)i + s.seq_k - s.seq_q + s.window_right;
      const long long diag = (long long)i + s.seq_k - s.seq_q;
      bool ok = true;
      if (s.window_left >= 0 && j < lo) ok = false;
      if (s.window_right >= 0 && j > hi) ok = false;
      if (s.causal && j > diag) ok = false;
      allowed[(size_t)i * s.seq_k + j] = ok;
    }
  return allowed;
}

struct Out {
  std::vector<double> o, lse;
};

// Whole score matrix per head: S = scale q k^T, through c tanh(S / c) when capped, -inf where the matrix says
// masked, softmax, P V. A row with nothing allowed: O = 0, lse = +inf.
Out plain_attention(const Shape& s, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v) {
  const int Sq = s.seq_q, Sk = s.seq_k, d = s.head_dim, g = s.heads / s.kv_heads();
  const double scale = s.scale > 0 ? s.scale : 1.0 / std::sqrt((double)d);
  const std::vector<char> allowed = mask_matrix(s);
  Out out{std::vector<double>((size_t)s.q_elements(), 0.0), std::vector<double>((size_t)s.q_rows(), 0.0)};
  std::vector<double> S((size_t)Sk);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const size_t qh = ((size_t)b * s.heads + h) * Sq, kh = ((size_t)b * s.kv_heads() + h / g) * Sk;
      for (int i = 0; i < Sq; ++i) {
        double m = -kInf;
        for (int j = 0; j < Sk; ++j) {
          double acc = 0;
          for (int x = 0; x < d; ++x) acc += (double)q[(qh + i) * d + x] * (double)k[(kh + j) * d + x];
          double sc = scale * acc;
          if (s.softcap > 0) sc = s.softcap * std::tanh(sc / s.softcap);
          S[j] = allowed[(size_t)i * Sk + j] ? sc : -kInf;
          m = std::max(m, S[j]);
        }
        if (m == -kInf) {
          out.lse[qh + i] = kInf;
          continue;
        }
        double l = 0;
        for (int j = 0; j < Sk; ++j) l += std::exp(S[j] - m);
        out.lse[qh + i] = m + std::log(l);
        for (int x = 0; x < d; ++x) {
          double acc = 0;
          for (int j = 0; j < Sk; ++j) acc += std::exp(S[j] - m) / l * (double)v[(kh + j) * d + x];
          out.o[(qh + i) * d + x] = acc;
        }
      }
    }
  return out;
}

struct Case {
  Shape shape;
  float input_scale;  // q and k: larger scores make the softcap bite
};

std::string describe(const Shape& s) {
  return "B" + std::to_string(s.batch) + " H" + std::to_string(s.heads) + "/" + std::to_string(s.kv_heads()) + " Sq" +
         std::to_string(s.seq_q) + " Sk" + std::to_string(s.seq_k) + " d" + std::to_string(s.head_dim) +
         (s.causal ? " causal" : "") + " window " + std::to_string(s.window_left) + "," + std::to_string(s.window_right) +
         " softcap " + std::to_string(s.softcap);
}

Shape shape(int sq, int sk, bool causal, int left, int right, double softcap, int heads = 2, int heads_k = 0) {
  Shape s{1, heads, sq, sk, 16, causal};
  s.heads_k = heads_k;
  s.window_left = left, s.window_right = right, s.softcap = softcap;
  return s;
}

// Windows of 0, 1, a block (64), a block + 1, past the sequence; non-causal and causal; Sq = Sk, Sq > Sk (rows
// that see nothing), Sq < Sk; softcap 30 and 0.5 alone and with a window; GQA.
std::vector<Case> cases() {
  std::vector<Case> out;
  for (auto [sq, sk] : {std::pair{70, 70}, std::pair{90, 40}, std::pair{33, 150}})
    for (bool causal : {false, true})
      for (auto [l, r] : {std::pair{0, 0}, std::pair{1, 1}, std::pair{64, 64}, std::pair{65, -1}, std::pair{-1, 1},
                          std::pair{1000, 1000}, std::pair{0, -1}, std::pair{3, 17}})
        out.push_back({shape(sq, sk, causal, l, r, 0), 1.0f});
  for (double c : {30.0, 0.5})
    for (bool causal : {false, true}) {
      out.push_back({shape(70, 70, causal, -1, -1, c), 4.0f});
      out.push_back({shape(90, 40, causal, 5, 2, c), 4.0f});
    }
  out.push_back({shape(50, 80, true, 7, -1, 30.0, 4, 2), 4.0f});  // GQA, causal, window and softcap
  out.push_back({shape(50, 80, false, 2, 9, 0.5, 4, 1), 4.0f});   // MQA
  return out;
}

void expect_matches(const Shape& s, const Out& got, const Out& want) {
  ASSERT_EQ(got.o.size(), want.o.size());
  for (size_t n = 0; n < want.lse.size(); ++n) {
    if (std::isinf(want.lse[n])) {
      ASSERT_EQ(got.lse[n], want.lse[n]) << describe(s) << " row " << n;
    } else {
      ASSERT_NEAR(got.lse[n], want.lse[n], 1e-12 * std::max(1.0, std::fabs(want.lse[n]))) << describe(s) << " row " << n;
    }
  }
  for (size_t n = 0; n < want.o.size(); ++n) ASSERT_NEAR(got.o[n], want.o[n], 1e-12) << describe(s) << " element " << n;
}

TEST(ReferenceMods, ForwardMatchesExplicitMaskAndSoftcap) {
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    const Shape& s = c.shape;
    std::mt19937_64 rng(seed++);
    const auto q = random_tensor(s.q_elements(), rng, c.input_scale), k = random_tensor(s.kv_elements(), rng, c.input_scale),
               v = random_tensor(s.kv_elements(), rng, 1.0f);
    Out got{std::vector<double>((size_t)s.q_elements()), std::vector<double>((size_t)s.q_rows())};
    ref::forward(s, q.data(), k.data(), v.data(), got.o.data(), got.lse.data(), 2);
    expect_matches(s, got, plain_attention(s, q, k, v));
    // forward_rows gives the same rows bit for bit (the worker samples rows).
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < s.q_rows(); r += 7) rows.push_back(r);
    std::vector<double> o((size_t)rows.size() * s.head_dim), lse(rows.size());
    ref::forward_rows(s, q.data(), k.data(), v.data(), rows, o.data(), lse.data(), 1);
    for (size_t n = 0; n < rows.size(); ++n) {
      ASSERT_EQ(lse[n], got.lse[(size_t)rows[n]]) << describe(s);
      for (int x = 0; x < s.head_dim; ++x) ASSERT_EQ(o[n * s.head_dim + x], got.o[(size_t)rows[n] * s.head_dim + x]);
    }
  }
}

// The test can fail: the explicit reference with the window or the softcap left out differs from ref::forward.
TEST(ReferenceMods, DroppingAModificationIsSeen) {
  for (Shape s : {shape(70, 70, false, 1, 1, 0), shape(70, 70, true, 64, -1, 0), shape(70, 70, false, -1, -1, 30.0),
                  shape(70, 70, false, -1, -1, 0.5)}) {
    std::mt19937_64 rng(11);
    const auto q = random_tensor(s.q_elements(), rng, 4.0f), k = random_tensor(s.kv_elements(), rng, 4.0f),
               v = random_tensor(s.kv_elements(), rng, 1.0f);
    Out got{std::vector<double>((size_t)s.q_elements()), std::vector<double>((size_t)s.q_rows())};
    ref::forward(s, q.data(), k.data(), v.data(), got.o.data(), got.lse.data(), 1);
    Shape plain = s;
    plain.window_left = plain.window_right = -1;
    plain.softcap = 0;
    const Out wrong = plain_attention(plain, q, k, v);
    double diff = 0;
    for (size_t n = 0; n < got.o.size(); ++n) diff = std::max(diff, std::fabs(got.o[n] - wrong.o[n]));
    EXPECT_GT(diff, 1e-3) << describe(s);
  }
}

// Windows that leave rows without keys: O = 0 and lse = +inf, as the causal rule for rows that see nothing.
TEST(ReferenceMods, RowsOutsideTheWindowAreEmpty) {
  // Sq 10 > Sk 4, window (0, 0): query i sees key i - 6 only, so rows 0..5 see nothing, rows 6..9 one key each.
  const Shape s = shape(10, 4, false, 0, 0, 0, 1);
  std::mt19937_64 rng(3);
  const auto q = random_tensor(s.q_elements(), rng, 1.0f), k = random_tensor(s.kv_elements(), rng, 1.0f),
             v = random_tensor(s.kv_elements(), rng, 1.0f);
  std::vector<double> o((size_t)s.q_elements()), lse((size_t)s.q_rows());
  ref::forward(s, q.data(), k.data(), v.data(), o.data(), lse.data(), 1);
  for (int i = 0; i < 10; ++i) {
    const ref::KeySpan r = ref::visible_range(s, i);
    if (i < 6) {
      EXPECT_EQ(r.first, r.end) << i;
      EXPECT_EQ(lse[i], kInf) << i;
      for (int x = 0; x < 16; ++x) EXPECT_EQ(o[i * 16 + x], 0.0);
    } else {
      EXPECT_EQ(r.first, i - 6);
      EXPECT_EQ(r.end, i - 5);
      for (int x = 0; x < 16; ++x) EXPECT_EQ(o[i * 16 + x], (double)v[(i - 6) * 16 + x]);  // the one key's value
    }
  }
}

TEST(ReferenceMods, VarlenWindowPerSequence) {
  // Each sequence aligned to its own lengths: equal to forward() on the sequence alone with the same window.
  ref::VarlenShape vs{2, 16, true, 0, 0};
  vs.window_left = 5, vs.softcap = 30;
  const std::vector<int32_t> cu_q{0, 7, 7, 40}, cu_k{0, 20, 25, 60};
  std::mt19937_64 rng(5);
  const auto q = random_tensor(40 * 2 * 16, rng, 4.0f), k = random_tensor(60 * 2 * 16, rng, 4.0f),
             v = random_tensor(60 * 2 * 16, rng, 1.0f);
  std::vector<double> o(40 * 2 * 16), lse(2 * 40);
  ref::forward_varlen(vs, cu_q, cu_k, q.data(), k.data(), v.data(), o.data(), lse.data(), 1);
  for (int b = 0; b < 3; ++b) {
    const int lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
    if (lq == 0) continue;
    Shape s = shape(lq, lk, true, 5, -1, 30, 2);
    std::vector<float> qs((size_t)s.q_elements()), ks((size_t)s.kv_elements()), vv((size_t)s.kv_elements());
    for (int h = 0; h < 2; ++h) {
      for (int t = 0; t < lq; ++t)
        for (int x = 0; x < 16; ++x) qs[((size_t)h * lq + t) * 16 + x] = q[((size_t)(cu_q[b] + t) * 2 + h) * 16 + x];
      for (int t = 0; t < lk; ++t)
        for (int x = 0; x < 16; ++x) {
          ks[((size_t)h * lk + t) * 16 + x] = k[((size_t)(cu_k[b] + t) * 2 + h) * 16 + x];
          vv[((size_t)h * lk + t) * 16 + x] = v[((size_t)(cu_k[b] + t) * 2 + h) * 16 + x];
        }
    }
    const Out want = plain_attention(s, qs, ks, vv);
    for (int h = 0; h < 2; ++h)
      for (int t = 0; t < lq; ++t) {
        ASSERT_NEAR(lse[(size_t)h * 40 + cu_q[b] + t], want.lse[(size_t)h * lq + t], 1e-12);
        for (int x = 0; x < 16; ++x)
          ASSERT_NEAR(o[((size_t)(cu_q[b] + t) * 2 + h) * 16 + x], want.o[((size_t)h * lq + t) * 16 + x], 1e-12);
      }
  }
}

// The softcap's term in the exponent's error budget (kTanhUnits |c tanh(s / c)|): present with a softcap, absent
// without, so that a kernel's fast tanh has its bound and a plain kernel's bound is unchanged.
TEST(ReferenceMods, SoftcapWidensTheLogitMagnitudes) {
  Shape s = shape(32, 32, false, -1, -1, 0, 1);
  std::mt19937_64 rng(9);
  const auto q = random_tensor(s.q_elements(), rng, 4.0f), k = random_tensor(s.kv_elements(), rng, 4.0f),
             v = random_tensor(s.kv_elements(), rng, 1.0f);
  std::vector<double> o((size_t)s.q_elements()), lse(32), om((size_t)s.q_elements()), ol((size_t)s.q_elements()), lm(32);
  ref::forward(s, q.data(), k.data(), v.data(), o.data(), lse.data(), 1, {om.data(), ol.data(), lm.data()});
  const std::vector<double> plain_lm = lm;
  s.softcap = 1e6;  // a cap far above every score: the same probabilities (to ~1e-10), the tanh term on top
  ref::forward(s, q.data(), k.data(), v.data(), o.data(), lse.data(), 1, {om.data(), ol.data(), lm.data()});
  for (int i = 0; i < 32; ++i) EXPECT_GT(lm[i], plain_lm[i] + 100.0) << i;
}

// --- backward -------------------------------------------------------------------------------

struct Grads {
  std::vector<double> dq, dk, dv;
};

// The backward of plain_attention by its matrices, per head: P from the explicit mask and score map, dP = dO V^T,
// D_i = sum_j P_ij dP_ij (not dO . O: another route to the same number), dS = P (dP - D) (1 - tanh^2(S / c)) with a
// softcap, dQ = scale dS K, dK = scale dS^T Q and dV = P^T dO summed over a kv head's query group.
Grads plain_backward(const Shape& s, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                     const std::vector<float>& dout) {
  const int Sq = s.seq_q, Sk = s.seq_k, d = s.head_dim, g = s.heads / s.kv_heads();
  const double scale = s.scale > 0 ? s.scale : 1.0 / std::sqrt((double)d);
  const std::vector<char> allowed = mask_matrix(s);
  Grads out{std::vector<double>((size_t)s.q_elements(), 0.0), std::vector<double>((size_t)s.kv_elements(), 0.0),
            std::vector<double>((size_t)s.kv_elements(), 0.0)};
  std::vector<double> P((size_t)Sq * Sk), dS((size_t)Sq * Sk), T((size_t)Sq * Sk);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const size_t qh = ((size_t)b * s.heads + h) * Sq, kh = ((size_t)b * s.kv_heads() + h / g) * Sk;
      auto dot = [&](const std::vector<float>& a, size_t ra, const std::vector<float>& c, size_t rc) {
        double acc = 0;
        for (int x = 0; x < d; ++x) acc += (double)a[ra * d + x] * (double)c[rc * d + x];
        return acc;
      };
      for (int i = 0; i < Sq; ++i) {
        double m = -kInf;
        for (int j = 0; j < Sk; ++j) {
          double sc = scale * dot(q, qh + i, k, kh + j);
          T[(size_t)i * Sk + j] = s.softcap > 0 ? std::tanh(sc / s.softcap) : 0.0;
          if (s.softcap > 0) sc = s.softcap * T[(size_t)i * Sk + j];
          P[(size_t)i * Sk + j] = allowed[(size_t)i * Sk + j] ? sc : -kInf;
          m = std::max(m, P[(size_t)i * Sk + j]);
        }
        double l = 0;
        for (int j = 0; j < Sk; ++j) l += m == -kInf ? 0.0 : std::exp(P[(size_t)i * Sk + j] - m);
        for (int j = 0; j < Sk; ++j) P[(size_t)i * Sk + j] = m == -kInf ? 0.0 : std::exp(P[(size_t)i * Sk + j] - m) / l;
        double D = 0;
        for (int j = 0; j < Sk; ++j) D += P[(size_t)i * Sk + j] * dot(dout, qh + i, v, kh + j);
        for (int j = 0; j < Sk; ++j) {
          const double t = T[(size_t)i * Sk + j];
          dS[(size_t)i * Sk + j] = P[(size_t)i * Sk + j] * (dot(dout, qh + i, v, kh + j) - D) * (1 - t * t);
        }
      }
      for (int i = 0; i < Sq; ++i)
        for (int j = 0; j < Sk; ++j)
          for (int x = 0; x < d; ++x) {
            out.dq[(qh + i) * d + x] += scale * dS[(size_t)i * Sk + j] * (double)k[(kh + j) * d + x];
            out.dk[(kh + j) * d + x] += scale * dS[(size_t)i * Sk + j] * (double)q[(qh + i) * d + x];
            out.dv[(kh + j) * d + x] += P[(size_t)i * Sk + j] * (double)dout[(qh + i) * d + x];
          }
    }
  return out;
}

Grads reference_backward(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                         const std::vector<float>& v, const std::vector<float>& dout, int threads = 2) {
  Grads g{std::vector<double>((size_t)s.q_elements()), std::vector<double>((size_t)s.kv_elements()),
          std::vector<double>((size_t)s.kv_elements())};
  ref::backward(s, q.data(), k.data(), v.data(), dout.data(), g.dq.data(), g.dk.data(), g.dv.data(), threads);
  return g;
}

void expect_grads_match(const Shape& s, const Grads& got, const Grads& want) {
  const std::pair<const char*, const std::vector<double>*> pairs[][2] = {
      {{"dq", &got.dq}, {"dq", &want.dq}}, {{"dk", &got.dk}, {"dk", &want.dk}}, {{"dv", &got.dv}, {"dv", &want.dv}}};
  for (const auto& pr : pairs) {
    const auto &a = *pr[0].second, &b = *pr[1].second;
    ASSERT_EQ(a.size(), b.size());
    for (size_t n = 0; n < b.size(); ++n)
      ASSERT_NEAR(a[n], b[n], 1e-11 * std::max(1.0, std::fabs(b[n]))) << describe(s) << " " << pr[0].first << "[" << n << "]";
  }
}

TEST(ReferenceMods, BackwardMatchesExplicitMaskAndSoftcap) {
  uint64_t seed = 100;
  for (const Case& c : cases()) {
    const Shape& s = c.shape;
    std::mt19937_64 rng(seed++);
    const auto q = random_tensor(s.q_elements(), rng, c.input_scale), k = random_tensor(s.kv_elements(), rng, c.input_scale),
               v = random_tensor(s.kv_elements(), rng, 1.0f), dout = random_tensor(s.q_elements(), rng, 1.0f);
    expect_grads_match(s, reference_backward(s, q, k, v, dout), plain_backward(s, q, k, v, dout));
  }
}

// The test can fail: the explicit backward with the window or the softcap left out differs from ref::backward in
// every gradient.
TEST(ReferenceMods, BackwardDroppingAModificationIsSeen) {
  for (Shape s : {shape(70, 70, false, 1, 1, 0), shape(70, 70, true, 64, -1, 0), shape(70, 40, false, 3, 9, 0),
                  shape(70, 70, false, -1, -1, 30.0), shape(70, 70, true, -1, -1, 0.5)}) {
    std::mt19937_64 rng(12);
    const auto q = random_tensor(s.q_elements(), rng, 4.0f), k = random_tensor(s.kv_elements(), rng, 4.0f),
               v = random_tensor(s.kv_elements(), rng, 1.0f), dout = random_tensor(s.q_elements(), rng, 1.0f);
    const Grads got = reference_backward(s, q, k, v, dout);
    for (unsigned drop : {1u, 2u}) {  // 1: the window, 2: the softcap
      Shape without = s;
      if (drop == 1) {
        if (s.window_left < 0 && s.window_right < 0) continue;
        without.window_left = without.window_right = -1;
      } else {
        if (s.softcap == 0) continue;
        without.softcap = 0;
      }
      const Grads wrong = plain_backward(without, q, k, v, dout);
      for (const auto& [name, a, b] : {std::tuple{"dq", &got.dq, &wrong.dq}, std::tuple{"dk", &got.dk, &wrong.dk},
                                       std::tuple{"dv", &got.dv, &wrong.dv}}) {
        double diff = 0;
        for (size_t n = 0; n < a->size(); ++n) diff = std::max(diff, std::fabs((*a)[n] - (*b)[n]));
        EXPECT_GT(diff, 1e-3) << describe(s) << " " << name << " without modification " << drop;
      }
    }
  }
}

// The softcap's gradient against central differences of the reference forward (an independent route: only
// forward() and calculus): L = sum O . dO, so dL/dq = dQ, dL/dk = dK, dL/dv = dV. Richardson's extrapolation of
// two steps leaves an O(h^4) truncation error.
TEST(ReferenceMods, BackwardSoftcapMatchesFiniteDifferences) {
  for (Shape s : {shape(9, 12, false, -1, -1, 0.5, 2, 1), shape(12, 12, true, 3, -1, 2.0, 1), shape(12, 7, false, 2, 4, 30.0, 1)}) {
    s.head_dim = 8;
    std::mt19937_64 rng(21);
    auto q = random_tensor(s.q_elements(), rng, 3.0f), k = random_tensor(s.kv_elements(), rng, 3.0f),
         v = random_tensor(s.kv_elements(), rng, 1.0f);
    const auto dout = random_tensor(s.q_elements(), rng, 1.0f);
    // On a grid of 2^-12, so that x +- 2^-8 and 2^-9 are exact floats: symmetric steps.
    for (auto* t : {&q, &k, &v})
      for (float& x : *t) x = std::ldexp(std::nearbyint(std::ldexp(x, 12)), -12);
    const Grads g = reference_backward(s, q, k, v, dout, 1);
    auto loss = [&] {
      std::vector<double> o((size_t)s.q_elements()), lse((size_t)s.q_rows());
      ref::forward(s, q.data(), k.data(), v.data(), o.data(), lse.data(), 1);
      double l = 0;
      for (size_t n = 0; n < o.size(); ++n) l += o[n] * (double)dout[n];
      return l;
    };
    // The derivative along element x of t, by the steps h and h / 2 (each the float step actually taken).
    auto derivative = [&](std::vector<float>& t, size_t x) {
      const float x0 = t[x];
      auto central = [&](float h) {
        t[x] = x0 + h;
        const double l_up = loss();
        t[x] = x0 - h;
        const double l_down = loss();
        t[x] = x0;
        return (l_up - l_down) / (2.0 * h);
      };
      const double d1 = central(0x1p-8f), d2 = central(0x1p-9f);
      return (4 * d2 - d1) / 3;
    };
    int checked = 0;
    for (auto [t, grad, name] : {std::tuple{&q, &g.dq, "dq"}, std::tuple{&k, &g.dk, "dk"}, std::tuple{&v, &g.dv, "dv"}})
      for (size_t x = 0; x < t->size(); x += 3) {
        const double fd = derivative(*t, x);
        EXPECT_NEAR((*grad)[x], fd, 2e-6 * std::max(1.0, std::fabs(fd))) << describe(s) << " " << name << "[" << x << "]";
        ++checked;
      }
    EXPECT_GE(checked, 60);
  }
}

// Rows that see no key get dQ = 0, and keys that no row sees dK = dV = 0 (exactly: nothing is summed).
TEST(ReferenceMods, BackwardOutsideTheWindowIsZero) {
  for (const auto& [s, empty_rows, empty_keys] :
       {std::tuple{shape(10, 4, false, 0, 0, 0, 1), 6, 0},    // query i sees key i - 6: rows 0..5 see nothing
        std::tuple{shape(4, 10, false, 0, 0, 30, 1), 0, 6}}) {  // query i sees key i + 6: keys 0..5 unseen
    std::mt19937_64 rng(4);
    const auto q = random_tensor(s.q_elements(), rng, 1.0f), k = random_tensor(s.kv_elements(), rng, 1.0f),
               v = random_tensor(s.kv_elements(), rng, 1.0f), dout = random_tensor(s.q_elements(), rng, 1.0f);
    const Grads g = reference_backward(s, q, k, v, dout, 1);
    for (int i = 0; i < s.seq_q; ++i)
      for (int x = 0; x < 16; ++x)
        if (i < empty_rows) EXPECT_EQ(g.dq[i * 16 + x], 0.0) << describe(s) << " row " << i;
    for (int j = 0; j < s.seq_k; ++j) {
      const ref::KeySpan seen = ref::visible_queries(s, j);
      EXPECT_EQ(seen.first == seen.end, j < empty_keys) << describe(s) << " key " << j;
      bool nonzero = false;
      for (int x = 0; x < 16; ++x) {
        if (j < empty_keys) {
          EXPECT_EQ(g.dk[j * 16 + x], 0.0);
          EXPECT_EQ(g.dv[j * 16 + x], 0.0);
        }
        nonzero |= g.dv[j * 16 + x] != 0.0;
      }
      EXPECT_EQ(nonzero, j >= empty_keys) << describe(s) << " key " << j;
    }
  }
  // visible_queries is visible_range transposed, over the cases' masks.
  for (const Case& c : cases())
    for (int j = 0; j < c.shape.seq_k; ++j) {
      const ref::KeySpan qs = ref::visible_queries(c.shape, j);
      for (int i = 0; i < c.shape.seq_q; ++i) {
        const ref::KeySpan ks = ref::visible_range(c.shape, i);
        ASSERT_EQ(i >= qs.first && i < qs.end, j >= ks.first && j < ks.end) << describe(c.shape) << " " << i << "," << j;
      }
    }
}

TEST(ReferenceMods, VarlenBackwardWindowPerSequence) {
  // Each sequence on its own with the batch's window and softcap: the explicit backward of the sequence alone.
  ref::VarlenShape vs{2, 16, true, 0, 1};
  vs.window_left = 5, vs.softcap = 30;
  const std::vector<int32_t> cu_q{0, 7, 7, 40, 52}, cu_k{0, 20, 25, 60, 60};
  std::mt19937_64 rng(6);
  const int tq = 52, tk = 60;
  const auto q = random_tensor(tq * 2 * 16, rng, 4.0f), k = random_tensor(tk * 16, rng, 4.0f),
             v = random_tensor(tk * 16, rng, 1.0f), dout = random_tensor(tq * 2 * 16, rng, 1.0f);
  std::vector<double> dq(tq * 2 * 16), dk(tk * 16), dv(tk * 16);
  ref::backward_varlen(vs, cu_q, cu_k, q.data(), k.data(), v.data(), dout.data(), dq.data(), dk.data(), dv.data(), 1);
  for (int b = 0; b < 4; ++b) {
    const int lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
    if (lq == 0 || lk == 0) {  // nothing to attend: zeros
      for (int t = 0; t < lq * 2 * 16; ++t) ASSERT_EQ(dq[(size_t)cu_q[b] * 2 * 16 + t], 0.0);
      for (int t = 0; t < lk * 16; ++t) ASSERT_EQ(dk[(size_t)cu_k[b] * 16 + t], 0.0);
      continue;
    }
    const Shape s = shape(lq, lk, true, 5, -1, 30, 2, 1);
    std::vector<float> qs((size_t)s.q_elements()), dos((size_t)s.q_elements()), ks((size_t)s.kv_elements()),
        vv((size_t)s.kv_elements());
    for (int h = 0; h < 2; ++h)
      for (int t = 0; t < lq; ++t)
        for (int x = 0; x < 16; ++x) {
          qs[((size_t)h * lq + t) * 16 + x] = q[((size_t)(cu_q[b] + t) * 2 + h) * 16 + x];
          dos[((size_t)h * lq + t) * 16 + x] = dout[((size_t)(cu_q[b] + t) * 2 + h) * 16 + x];
        }
    for (int t = 0; t < lk; ++t)
      for (int x = 0; x < 16; ++x) {
        ks[(size_t)t * 16 + x] = k[(size_t)(cu_k[b] + t) * 16 + x];
        vv[(size_t)t * 16 + x] = v[(size_t)(cu_k[b] + t) * 16 + x];
      }
    const Grads want = plain_backward(s, qs, ks, vv, dos);
    for (int h = 0; h < 2; ++h)
      for (int t = 0; t < lq; ++t)
        for (int x = 0; x < 16; ++x)
          ASSERT_NEAR(dq[((size_t)(cu_q[b] + t) * 2 + h) * 16 + x], want.dq[((size_t)h * lq + t) * 16 + x], 1e-11) << b;
    for (int t = 0; t < lk; ++t)
      for (int x = 0; x < 16; ++x) {
        ASSERT_NEAR(dk[(size_t)(cu_k[b] + t) * 16 + x], want.dk[(size_t)t * 16 + x], 1e-11) << b;
        ASSERT_NEAR(dv[(size_t)(cu_k[b] + t) * 16 + x], want.dv[(size_t)t * 16 + x], 1e-11) << b;
      }
  }
}

// The magnitudes stay bounds with the modifications: |dQ|, |dK|, |dV| <= their *_mag (each a sum of the terms'
// absolute values), and a kernel's fast tanh -- P from c t (1 + e), the derivative 1 - t^2 (1 + e)^2, |e| the PTX
// bound -- moves each gradient by at most u32 times its *_logit (to first order; emulated here in float64 with
// both signs of e, the forward's exact lse and delta as a kernel is given them).
TEST(ReferenceMods, BackwardMagnitudesBoundTheModifiedGradients) {
  for (Shape s : {shape(40, 56, true, 9, -1, 0.5, 2, 1), shape(56, 40, false, 4, 20, 30.0, 2), shape(48, 48, false, -1, -1, 1.0, 1)}) {
    std::mt19937_64 rng(31);
    const auto q = random_tensor(s.q_elements(), rng, 4.0f), k = random_tensor(s.kv_elements(), rng, 4.0f),
               v = random_tensor(s.kv_elements(), rng, 1.0f), dout = random_tensor(s.q_elements(), rng, 1.0f);
    const size_t nq = (size_t)s.q_elements(), nk = (size_t)s.kv_elements();
    Grads g{std::vector<double>(nq), std::vector<double>(nk), std::vector<double>(nk)};
    std::vector<double> dq_mag(nq), dq_logit(nq), dk_mag(nk), dk_logit(nk), dv_mag(nk), dv_logit(nk);
    ref::backward(s, q.data(), k.data(), v.data(), dout.data(), g.dq.data(), g.dk.data(), g.dv.data(), 1,
                  {dq_mag.data(), dq_logit.data(), dk_mag.data(), dk_logit.data(), dv_mag.data(), dv_logit.data()});
    for (size_t n = 0; n < nq; ++n) ASSERT_LE(std::fabs(g.dq[n]), dq_mag[n] * (1 + 1e-12)) << describe(s);
    for (size_t n = 0; n < nk; ++n) {
      ASSERT_LE(std::fabs(g.dk[n]), dk_mag[n] * (1 + 1e-12)) << describe(s);
      ASSERT_LE(std::fabs(g.dv[n]), dv_mag[n] * (1 + 1e-12)) << describe(s);
    }
    // The emulated fast tanh, with lse and delta from the exact forward.
    std::vector<double> o(nq), lse((size_t)s.q_rows());
    ref::forward(s, q.data(), k.data(), v.data(), o.data(), lse.data(), 1);
    const int d = s.head_dim, Sq = s.seq_q, Sk = s.seq_k, grp = s.group_size();
    const double scale = s.softmax_scale(), u32 = 0x1p-24;
    const double e_max = std::exp2(-10.987);  // tanh.approx.f32's relative error bound (PTX ISA)
    for (double e : {e_max, -e_max}) {
      Grads em{std::vector<double>(nq, 0.0), std::vector<double>(nk, 0.0), std::vector<double>(nk, 0.0)};
      for (int h = 0; h < s.heads; ++h)
        for (int i = 0; i < Sq; ++i) {
          const size_t r = (size_t)h * Sq + i, kh = (size_t)(h / grp) * Sk;
          if (std::isinf(lse[r])) continue;
          double D = 0;
          for (int x = 0; x < d; ++x) D += (double)dout[r * d + x] * o[r * d + x];
          const ref::KeySpan keys = ref::visible_range(s, i);
          for (int64_t j = keys.first; j < keys.end; ++j) {
            double qk = 0, dp = 0;
            for (int x = 0; x < d; ++x) {
              qk += (double)q[r * d + x] * (double)k[(kh + j) * d + x];
              dp += (double)dout[r * d + x] * (double)v[(kh + j) * d + x];
            }
            const double t = std::tanh(scale * qk / s.softcap) * (1 + e);
            const double p = std::exp(s.softcap * t - lse[r]), ds = p * (dp - D) * (1 - t * t);
            for (int x = 0; x < d; ++x) {
              em.dq[r * d + x] += scale * ds * (double)k[(kh + j) * d + x];
              em.dk[(kh + j) * d + x] += scale * ds * (double)q[r * d + x];
              em.dv[(kh + j) * d + x] += p * (double)dout[r * d + x];
            }
          }
        }
      double worst = 0;  // the largest error over its u32 * logit bound
      for (const auto& [got, want, logit] : {std::tuple{&em.dq, &g.dq, &dq_logit}, std::tuple{&em.dk, &g.dk, &dk_logit},
                                             std::tuple{&em.dv, &g.dv, &dv_logit}})
        for (size_t n = 0; n < want->size(); ++n) {
          const double err = std::fabs((*got)[n] - (*want)[n]), bound = u32 * (*logit)[n];
          ASSERT_LE(err, bound * 1.01 + 1e-14) << describe(s) << " e " << e << " element " << n;
          if (bound > 0) worst = std::max(worst, err / bound);
        }
      EXPECT_GT(worst, 0.3) << describe(s) << ": the emulated tanh's error uses a fair part of its bound (0.7-0.95 measured)";
    }
  }
}

// Bad modifications are refused by every entry point (check_shape).
TEST(ReferenceMods, RefusesBadModifications) {
  const Shape s = shape(8, 8, false, 2, 2, 0, 1);
  std::vector<float> x((size_t)s.q_elements(), 0.5f);
  std::vector<double> g((size_t)s.q_elements()), o((size_t)s.q_elements()), lse(8);
  Shape bad = s;
  bad.window_left = -2;
  EXPECT_THROW(ref::forward(bad, x.data(), x.data(), x.data(), o.data(), lse.data()), std::invalid_argument);
  EXPECT_THROW(ref::backward(bad, x.data(), x.data(), x.data(), x.data(), g.data(), g.data(), g.data()), std::invalid_argument);
  bad.window_left = 2, bad.softcap = -1;
  EXPECT_THROW(ref::backward(bad, x.data(), x.data(), x.data(), x.data(), g.data(), g.data(), g.data()), std::invalid_argument);
}

}  // namespace
