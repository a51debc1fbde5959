// Issue 32: the float64 reference's sliding window and logit softcap against plain float64 attention with an
// explicit mask matrix and score map built here, independently of the reference's key ranges.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/attention_ref.hpp"

namespace {

using flashtune::ref::Shape;
namespace ref = flashtune::ref;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<float> random_tensor(int64_t n, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> t((size_t)n);
  for (auto& x : t) x = dist(rng);
  return t;
}

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

TEST(ReferenceMods, BackwardRefusesModifications) {
  const Shape s = shape(8, 8, false, 2, 2, 0, 1);
  std::vector<float> x((size_t)s.q_elements(), 0.5f);
  std::vector<double> g((size_t)s.q_elements());
  EXPECT_THROW(ref::backward(s, x.data(), x.data(), x.data(), x.data(), g.data(), g.data(), g.data()), std::invalid_argument);
  Shape bad = s;
  bad.window_left = -2;
  std::vector<double> o((size_t)s.q_elements()), lse(8);
  EXPECT_THROW(ref::forward(bad, x.data(), x.data(), x.data(), o.data(), lse.data()), std::invalid_argument);
}

}  // namespace
