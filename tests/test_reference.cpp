// Tests for flashtune::ref (CPU float64 attention reference).
//
// The reference is checked against an independent brute-force implementation
// (full Sq x Sk matrices per head), and the backward against finite differences
// of a float64 loss, so the gradient formula itself is verified.
#include "reference/attention_ref.hpp"
#include "tests/reference_inputs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using flashtune::ref::Shape;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTol = 1e-12;  // relative, both sides float64

int64_t q_size(const Shape& s) { return s.q_elements(); }
int64_t k_size(const Shape& s) { return s.kv_elements(); }  // (B, Hk, Sk, d)
int64_t n_q_rows(const Shape& s) { return s.q_rows(); }

using flashtune::test::random_tensor;

std::vector<double> to_double(const std::vector<float>& t) { return {t.begin(), t.end()}; }

std::string describe(const Shape& s) {
  return "B=" + std::to_string(s.batch) + " H=" + std::to_string(s.heads) +
         " Hk=" + std::to_string(s.kv_heads()) +
         " Sq=" + std::to_string(s.seq_q) + " Sk=" + std::to_string(s.seq_k) +
         " d=" + std::to_string(s.head_dim) + (s.causal ? " causal" : "") +
         " scale=" + std::to_string(s.scale);
}

// ---------------------------------------------------------------------------
// Brute force: whole score matrix per head, masked, softmaxed, multiplied out.
// Templated so the finite-difference test can feed perturbed double inputs.
// ---------------------------------------------------------------------------

struct BruteForward {
  std::vector<double> o, lse;  // (B, H, Sq, d), (B, H, Sq)
  std::vector<double> p;       // softmax probabilities, (B, H, Sq, Sk)
};

bool masked(const Shape& s, int i, int j) { return s.causal && j - i > s.seq_k - s.seq_q; }

template <class T>
BruteForward brute_forward(const Shape& s, const std::vector<T>& q, const std::vector<T>& k,
                           const std::vector<T>& v) {
  const int Sq = s.seq_q, Sk = s.seq_k, d = s.head_dim;
  const double scale = s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(d));
  BruteForward out;
  out.o.assign(q_size(s), 0.0);
  out.lse.assign(n_q_rows(s), 0.0);
  out.p.assign(n_q_rows(s) * Sk, 0.0);
  for (int64_t bh = 0; bh < int64_t{s.batch} * s.heads; ++bh) {
    const T* Q = q.data() + bh * Sq * d;
    const T* K = k.data() + bh * Sk * d;
    const T* V = v.data() + bh * Sk * d;
    // S = scale * Q K^T with masked entries at -inf.
    std::vector<double> S(int64_t{Sq} * Sk);
    for (int i = 0; i < Sq; ++i)
      for (int j = 0; j < Sk; ++j) {
        double acc = 0;
        for (int x = 0; x < d; ++x) acc += double(Q[i * d + x]) * double(K[j * d + x]);
        S[i * Sk + j] = masked(s, i, j) ? -kInf : scale * acc;
      }
    for (int i = 0; i < Sq; ++i) {
      double* P = out.p.data() + (bh * Sq + i) * Sk;
      const double m = *std::max_element(&S[i * Sk], &S[i * Sk] + Sk);
      if (m == -kInf) {  // fully masked row: P = 0, O = 0, lse = +inf
        out.lse[bh * Sq + i] = kInf;
        continue;
      }
      double l = 0;
      for (int j = 0; j < Sk; ++j) l += std::exp(S[i * Sk + j] - m);
      for (int j = 0; j < Sk; ++j) P[j] = std::exp(S[i * Sk + j] - m) / l;
      out.lse[bh * Sq + i] = m + std::log(l);
      for (int x = 0; x < d; ++x) {
        double acc = 0;
        for (int j = 0; j < Sk; ++j) acc += P[j] * double(V[j * d + x]);
        out.o[(bh * Sq + i) * d + x] = acc;
      }
    }
  }
  return out;
}

struct Grads {
  std::vector<double> dq, dk, dv;
};

Grads brute_backward(const Shape& s, const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, const std::vector<double>& dout) {
  const int Sq = s.seq_q, Sk = s.seq_k, d = s.head_dim;
  const double scale = s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(d));
  const BruteForward f = brute_forward(s, q, k, v);
  Grads g{std::vector<double>(q_size(s), 0.0), std::vector<double>(k_size(s), 0.0),
          std::vector<double>(k_size(s), 0.0)};
  for (int64_t bh = 0; bh < int64_t{s.batch} * s.heads; ++bh) {
    const double* Q = q.data() + bh * Sq * d;
    const double* K = k.data() + bh * Sk * d;
    const double* V = v.data() + bh * Sk * d;
    const double* dO = dout.data() + bh * Sq * d;
    const double* O = f.o.data() + bh * Sq * d;
    const double* P = f.p.data() + bh * Sq * Sk;
    // dP = dO V^T, D = rowsum(dO * O), dS = P * (dP - D)
    std::vector<double> dS(int64_t{Sq} * Sk);
    for (int i = 0; i < Sq; ++i) {
      double D = 0;
      for (int x = 0; x < d; ++x) D += dO[i * d + x] * O[i * d + x];
      for (int j = 0; j < Sk; ++j) {
        double dP = 0;
        for (int x = 0; x < d; ++x) dP += dO[i * d + x] * V[j * d + x];
        dS[i * Sk + j] = P[i * Sk + j] * (dP - D);
      }
    }
    // dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO
    for (int i = 0; i < Sq; ++i)
      for (int x = 0; x < d; ++x) {
        double acc = 0;
        for (int j = 0; j < Sk; ++j) acc += dS[i * Sk + j] * K[j * d + x];
        g.dq[(bh * Sq + i) * d + x] = scale * acc;
      }
    for (int j = 0; j < Sk; ++j)
      for (int x = 0; x < d; ++x) {
        double acc_k = 0, acc_v = 0;
        for (int i = 0; i < Sq; ++i) {
          acc_k += dS[i * Sk + j] * Q[i * d + x];
          acc_v += P[i * Sk + j] * dO[i * d + x];
        }
        g.dk[(bh * Sk + j) * d + x] = scale * acc_k;
        g.dv[(bh * Sk + j) * d + x] = acc_v;
      }
  }
  return g;
}

// |got - want| <= tol * max(1, max|want|): relative to the tensor's magnitude, so
// entries that cancel to near zero do not demand impossible relative accuracy.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_abs = 1.0;
  for (double w : want)
    if (std::isfinite(w)) max_abs = std::max(max_abs, std::abs(w));
  for (size_t n = 0; n < got.size(); ++n) {
    if (std::isinf(want[n])) {
      ASSERT_EQ(got[n], want[n]) << what << " [" << n << "]";
      continue;
    }
    ASSERT_NEAR(got[n], want[n], tol * max_abs) << what << " [" << n << "]";
  }
}

struct Problem {
  Shape shape;
  std::vector<float> q, k, v, dout;
};

Problem make_problem(const Shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Problem p{s, random_tensor(q_size(s), rng), random_tensor(k_size(s), rng),
            random_tensor(k_size(s), rng), random_tensor(q_size(s), rng)};
  return p;
}

std::vector<Shape> comparison_shapes() {
  std::vector<Shape> base = {
      {1, 1, 1, 1, 1},     // smallest possible
      {2, 3, 17, 17, 32},  // square
      {1, 2, 5, 23, 3},    // Sq < Sk
      {2, 1, 23, 5, 3},    // Sq > Sk (causal: leading rows fully masked)
      {1, 2, 64, 48, 32},  // Sq > Sk, longer
      {2, 2, 9, 13, 1},    // head_dim 1
      {1, 1, 40, 70, 32},  // Sq < Sk, longer
  };
  std::vector<Shape> out;
  for (Shape s : base)
    for (bool causal : {false, true})
      for (double scale : {0.0, 0.37}) {
        s.causal = causal;
        s.scale = scale;
        out.push_back(s);
      }
  return out;
}

// ---------------------------------------------------------------------------

TEST(Reference, SoftmaxScale) {
  Shape s{1, 1, 1, 1, 64};
  EXPECT_DOUBLE_EQ(s.softmax_scale(), 0.125);
  s.scale = 0.5;
  EXPECT_EQ(s.softmax_scale(), 0.5);
  s.scale = -1;
  EXPECT_DOUBLE_EQ(s.softmax_scale(), 0.125);
}

TEST(Reference, ForwardMatchesBruteForce) {
  uint64_t seed = 1;
  for (const Shape& s : comparison_shapes()) {
    SCOPED_TRACE(describe(s));
    const Problem p = make_problem(s, seed++);
    std::vector<double> o(q_size(s)), lse(n_q_rows(s));
    flashtune::ref::forward(s, p.q.data(), p.k.data(), p.v.data(), o.data(), lse.data(), 3);
    const BruteForward want = brute_forward(s, p.q, p.k, p.v);
    expect_close(o, want.o, kTol, "o");
    expect_close(lse, want.lse, kTol, "lse");
  }
}

TEST(Reference, BackwardMatchesBruteForce) {
  uint64_t seed = 100;
  for (const Shape& s : comparison_shapes()) {
    SCOPED_TRACE(describe(s));
    const Problem p = make_problem(s, seed++);
    std::vector<double> dq(q_size(s)), dk(k_size(s)), dv(k_size(s));
    flashtune::ref::backward(s, p.q.data(), p.k.data(), p.v.data(), p.dout.data(), dq.data(),
                             dk.data(), dv.data(), 3);
    const Grads want = brute_backward(s, to_double(p.q), to_double(p.k), to_double(p.v),
                                      to_double(p.dout));
    expect_close(dq, want.dq, kTol, "dq");
    expect_close(dk, want.dk, kTol, "dk");
    expect_close(dv, want.dv, kTol, "dv");
  }
}

TEST(Reference, FullyMaskedRows) {
  // Causal, Sq = 10 > Sk = 4: query i sees keys j <= i - 6, so rows 0..5 see nothing.
  const Shape s{2, 2, 10, 4, 8, /*causal=*/true};
  constexpr int kMaskedRows = 6;
  const Problem p = make_problem(s, 7);
  std::vector<double> o(q_size(s)), lse(n_q_rows(s));
  flashtune::ref::forward(s, p.q.data(), p.k.data(), p.v.data(), o.data(), lse.data());
  std::vector<double> dq(q_size(s)), dk(k_size(s)), dv(k_size(s));
  flashtune::ref::backward(s, p.q.data(), p.k.data(), p.v.data(), p.dout.data(), dq.data(),
                           dk.data(), dv.data());

  for (int64_t r = 0; r < n_q_rows(s); ++r) {
    const int64_t i = r % s.seq_q;
    for (int x = 0; x < s.head_dim; ++x) {
      if (i < kMaskedRows) {
        EXPECT_EQ(o[r * s.head_dim + x], 0.0) << "row " << r;
        EXPECT_EQ(dq[r * s.head_dim + x], 0.0) << "row " << r;
      } else {
        EXPECT_NE(o[r * s.head_dim + x], 0.0) << "row " << r;
      }
    }
    if (i < kMaskedRows) {
      EXPECT_EQ(lse[r], kInf) << "row " << r;
    } else {
      EXPECT_TRUE(std::isfinite(lse[r])) << "row " << r;
    }
  }
  for (double g : dk) EXPECT_TRUE(std::isfinite(g));
  for (double g : dv) EXPECT_TRUE(std::isfinite(g));
  // Row i = 6 sees exactly key 0, so its output is v_0 and its lse is s_00.
  for (int x = 0; x < s.head_dim; ++x) {
    EXPECT_NEAR(o[kMaskedRows * s.head_dim + x], double(p.v[x]), 1e-15);
  }
}

TEST(Reference, LargeScoresStayFinite) {
  // Scores of order 1e3: exp without subtracting the max would overflow.
  Shape s{1, 2, 16, 16, 32};
  s.scale = 100.0;
  const Problem p = make_problem(s, 11);
  std::vector<double> o(q_size(s)), lse(n_q_rows(s));
  flashtune::ref::forward(s, p.q.data(), p.k.data(), p.v.data(), o.data(), lse.data());
  for (double x : o) ASSERT_TRUE(std::isfinite(x));
  for (double x : lse) ASSERT_TRUE(std::isfinite(x));
  const BruteForward want = brute_forward(s, p.q, p.k, p.v);
  expect_close(o, want.o, kTol, "o");
  // lse ~ 1e3 here, so a relative bound scales with it.
  expect_close(lse, want.lse, kTol, "lse");
}

TEST(Reference, ForwardRowsMatchesForward) {
  for (bool causal : {false, true}) {
    Shape s{2, 3, 37, 29, 16, causal};
    SCOPED_TRACE(describe(s));
    const Problem p = make_problem(s, 21);
    std::vector<double> o(q_size(s)), lse(n_q_rows(s));
    flashtune::ref::forward(s, p.q.data(), p.k.data(), p.v.data(), o.data(), lse.data(), 2);

    // Unsorted, with a duplicate: forward_rows must not care.
    std::vector<int64_t> rows = {n_q_rows(s) - 1, 0, 5, 36, 37, 100, 5, 150, 221};
    std::vector<double> o_rows(rows.size() * s.head_dim), lse_rows(rows.size());
    flashtune::ref::forward_rows(s, p.q.data(), p.k.data(), p.v.data(), rows, o_rows.data(),
                                 lse_rows.data(), 3);
    for (size_t n = 0; n < rows.size(); ++n) {
      EXPECT_EQ(lse_rows[n], lse[rows[n]]) << "row " << rows[n];
      for (int x = 0; x < s.head_dim; ++x)
        EXPECT_EQ(o_rows[n * s.head_dim + x], o[rows[n] * s.head_dim + x]) << "row " << rows[n];
    }

    const std::vector<int64_t> bad = {n_q_rows(s)};
    EXPECT_THROW(flashtune::ref::forward_rows(s, p.q.data(), p.k.data(), p.v.data(), bad,
                                              o_rows.data(), lse_rows.data()),
                 std::out_of_range);
  }
}

TEST(Reference, ThreadCountDoesNotChangeBits) {
  for (bool causal : {false, true}) {
    const Shape s{2, 3, 45, 70, 32, causal};
    SCOPED_TRACE(describe(s));
    const Problem p = make_problem(s, 31);
    auto run = [&](int threads) {
      std::vector<double> o(q_size(s)), lse(n_q_rows(s)), dq(q_size(s)), dk(k_size(s)),
          dv(k_size(s));
      flashtune::ref::forward(s, p.q.data(), p.k.data(), p.v.data(), o.data(), lse.data(),
                              threads);
      flashtune::ref::backward(s, p.q.data(), p.k.data(), p.v.data(), p.dout.data(), dq.data(),
                               dk.data(), dv.data(), threads);
      return std::vector<std::vector<double>>{o, lse, dq, dk, dv};
    };
    const auto one = run(1), four = run(4);
    for (size_t t = 0; t < one.size(); ++t) {
      ASSERT_EQ(one[t].size(), four[t].size());
      EXPECT_EQ(0, std::memcmp(one[t].data(), four[t].data(), one[t].size() * sizeof(double)))
          << "tensor " << t;
    }
  }
}

// L = sum(O * dO) for O = forward(q, k, v): dL/dq = dQ etc. Central differences of L in float64 with
// step h have error ~h^2 (truncation) + eps*|L|/h (rounding) ~ 1e-10, far below any formula mistake.
// forward(q, k, v) -> O (as BruteForward); x is one of q, k, v (perturbed in place and restored).
template <class Forward>
void expect_finite_differences(Forward forward, const std::vector<double>& dout, std::vector<double>& x,
                               const std::vector<double>& grad, const char* name) {
  constexpr double kStep = 1e-6, kFdTol = 1e-7;
  auto loss = [&] {
    const BruteForward f = forward();
    double l = 0;
    for (size_t n = 0; n < f.o.size(); ++n) l += f.o[n] * dout[n];
    return l;
  };
  for (size_t n = 0; n < x.size(); ++n) {
    const double saved = x[n];
    x[n] = saved + kStep;
    const double up = loss();
    x[n] = saved - kStep;
    const double down = loss();
    x[n] = saved;
    EXPECT_NEAR(grad[n], (up - down) / (2 * kStep), kFdTol) << name << "[" << n << "]";
  }
}

TEST(Reference, BackwardMatchesFiniteDifferences) {
  for (bool causal : {false, true})
    for (auto [sq, sk] : {std::pair{3, 5}, std::pair{5, 3}}) {
      Shape s{1, 2, sq, sk, 3, causal};
      s.scale = causal ? 0.0 : 0.7;
      SCOPED_TRACE(describe(s));
      const Problem p = make_problem(s, 41 + sq);
      std::vector<double> dq(q_size(s)), dk(k_size(s)), dv(k_size(s));
      flashtune::ref::backward(s, p.q.data(), p.k.data(), p.v.data(), p.dout.data(), dq.data(),
                               dk.data(), dv.data());

      const std::vector<double> dout = to_double(p.dout);
      std::vector<double> q = to_double(p.q), k = to_double(p.k), v = to_double(p.v);
      auto forward = [&] { return brute_forward(s, q, k, v); };
      expect_finite_differences(forward, dout, q, dq, "dq");
      expect_finite_differences(forward, dout, k, dk, "dk");
      expect_finite_differences(forward, dout, v, dv, "dv");
    }
}

TEST(Reference, SampleRowsSmallProblemReturnsAll) {
  const Shape s{2, 3, 10, 12, 8};
  const auto rows = flashtune::ref::sample_rows(s, 60, 5);
  ASSERT_EQ(rows.size(), 60u);
  for (int64_t r = 0; r < 60; ++r) EXPECT_EQ(rows[r], r);
  EXPECT_TRUE(flashtune::ref::sample_rows(s, 0, 5).empty());
}

TEST(Reference, SampleRowsLargeProblem) {
  const Shape s{4, 16, 1000, 1000, 128, true};  // 64000 rows, last tile 896..999 is ragged
  const int64_t total = n_q_rows(s);
  constexpr int64_t kMaxRows = 500;
  const auto rows = flashtune::ref::sample_rows(s, kMaxRows, 123);
  ASSERT_EQ(int64_t(rows.size()), kMaxRows);
  EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
  EXPECT_EQ(std::adjacent_find(rows.begin(), rows.end()), rows.end()) << "duplicates";
  EXPECT_GE(rows.front(), 0);
  EXPECT_LT(rows.back(), total);
  auto has = [&](int64_t r) { return std::binary_search(rows.begin(), rows.end(), r); };
  EXPECT_TRUE(has(total - 1));               // last row of the last (b, h)
  EXPECT_TRUE(has(0));                       // first row of the first (b, h)
  EXPECT_TRUE(has(s.seq_q - 1));             // last row of the first (b, h)
  EXPECT_TRUE(has(total - s.seq_q));         // first row of the last (b, h)
  EXPECT_TRUE(has(total - s.seq_q + 896));   // start of the ragged last tile
  // Random top-up spreads over many (b, h) pairs, not just the fixed ones.
  std::vector<int64_t> heads;
  for (int64_t r : rows) heads.push_back(r / s.seq_q);
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  EXPECT_GT(heads.size(), 30u);

  EXPECT_EQ(rows, flashtune::ref::sample_rows(s, kMaxRows, 123));  // deterministic
  EXPECT_NE(rows, flashtune::ref::sample_rows(s, kMaxRows, 124));  // seed matters

  // Fewer rows than the fixed set: still capped, sorted, and keeps the last row.
  const auto few = flashtune::ref::sample_rows(s, 3, 9);
  ASSERT_EQ(few.size(), 3u);
  EXPECT_TRUE(std::is_sorted(few.begin(), few.end()));
  EXPECT_EQ(few.back(), total - 1);
}

// ---------------------------------------------------------------------------
// Grouped-query attention: checked against multi-head attention on K and V
// with each kv head repeated over its group, which is what GQA means.
// ---------------------------------------------------------------------------

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// The multi-head twin of a GQA shape.
Shape as_multi_head(Shape s) {
  s.heads_k = 0;
  return s;
}

// (B, Hk, Sk, d) -> (B, H, Sk, d): query head h gets a copy of kv head kv_head_of(h).
template <class T>
std::vector<T> repeat_kv(const Shape& s, const std::vector<T>& kv) {
  const int64_t head_size = int64_t{s.seq_k} * s.head_dim;
  std::vector<T> out;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const T* src = kv.data() + (int64_t{b} * s.kv_heads() + s.kv_head_of(h)) * head_size;
      out.insert(out.end(), src, src + head_size);
    }
  return out;
}

// (B, H, Sk, d) -> (B, Hk, Sk, d): a kv head's entry is 0 + head 0 + head 1 + ... of its group,
// the order the reference promises, so the sums match bit for bit.
std::vector<double> sum_over_groups(const Shape& s, const std::vector<double>& per_head) {
  const int64_t head_size = int64_t{s.seq_k} * s.head_dim;
  std::vector<double> out(k_size(s), 0.0);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const double* src = per_head.data() + (int64_t{b} * s.heads + h) * head_size;
      double* dst = out.data() + (int64_t{b} * s.kv_heads() + s.kv_head_of(h)) * head_size;
      for (int64_t n = 0; n < head_size; ++n) dst[n] += src[n];
    }
  return out;
}

std::vector<Shape> gqa_shapes() {
  std::vector<Shape> out;
  for (int heads_k : {1, 2, 3, 6})  // MQA, two groupings, and heads_k = heads (plain multi-head)
    for (bool causal : {false, true})
      for (auto [sq, sk] : {std::pair{13, 29}, std::pair{29, 13}}) {
        Shape s{2, 6, sq, sk, 16, causal};
        s.heads_k = heads_k;
        out.push_back(s);
      }
  return out;
}

struct ForwardOut {
  std::vector<double> o, lse, o_mag, o_logit, lse_mag;
};

ForwardOut run_forward(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                       const std::vector<float>& v, int threads) {
  ForwardOut f{std::vector<double>(q_size(s)), std::vector<double>(n_q_rows(s)),
               std::vector<double>(q_size(s)), std::vector<double>(q_size(s)),
               std::vector<double>(n_q_rows(s))};
  flashtune::ref::forward(s, q.data(), k.data(), v.data(), f.o.data(), f.lse.data(), threads,
                          {f.o_mag.data(), f.o_logit.data(), f.lse_mag.data()});
  return f;
}

struct BackwardOut {
  std::vector<double> dq, dk, dv, dq_mag, dq_logit, dk_mag, dk_logit, dv_mag, dv_logit;
};

BackwardOut run_backward(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                         const std::vector<float>& v, const std::vector<float>& dout, int threads) {
  const int64_t nq = q_size(s), nk = k_size(s);
  BackwardOut g{std::vector<double>(nq), std::vector<double>(nk), std::vector<double>(nk),
                std::vector<double>(nq), std::vector<double>(nq), std::vector<double>(nk),
                std::vector<double>(nk), std::vector<double>(nk), std::vector<double>(nk)};
  flashtune::ref::backward(s, q.data(), k.data(), v.data(), dout.data(), g.dq.data(), g.dk.data(),
                           g.dv.data(), threads,
                           {g.dq_mag.data(), g.dq_logit.data(), g.dk_mag.data(), g.dk_logit.data(),
                            g.dv_mag.data(), g.dv_logit.data()});
  return g;
}

TEST(Reference, KvHeadOf) {
  Shape s{1, 8, 4, 4, 16};
  EXPECT_EQ(s.kv_heads(), 8);  // heads_k = 0: multi-head
  EXPECT_EQ(s.kv_head_of(5), 5);
  s.heads_k = 2;
  EXPECT_EQ(s.kv_heads(), 2);
  EXPECT_EQ(s.group_size(), 4);
  EXPECT_EQ(s.kv_head_of(3), 0);
  EXPECT_EQ(s.kv_head_of(4), 1);
  EXPECT_EQ(s.q_elements(), 8 * 4 * 16);
  EXPECT_EQ(s.kv_elements(), 2 * 4 * 16);
}

TEST(Reference, GqaForwardMatchesRepeatedKv) {
  uint64_t seed = 200;
  for (const Shape& s : gqa_shapes()) {
    SCOPED_TRACE(describe(s));
    const Problem p = make_problem(s, seed++);
    const Shape mha = as_multi_head(s);
    const ForwardOut got = run_forward(s, p.q, p.k, p.v, 3);
    const ForwardOut want = run_forward(mha, p.q, repeat_kv(s, p.k), repeat_kv(s, p.v), 3);
    EXPECT_TRUE(same_bits(got.o, want.o));
    EXPECT_TRUE(same_bits(got.lse, want.lse));
    EXPECT_TRUE(same_bits(got.o_mag, want.o_mag));
    EXPECT_TRUE(same_bits(got.o_logit, want.o_logit));
    EXPECT_TRUE(same_bits(got.lse_mag, want.lse_mag));

    // forward_rows reads the same kv head for a row.
    const std::vector<int64_t> rows = {n_q_rows(s) - 1, 0, s.seq_q, 3 * s.seq_q + 2};
    std::vector<double> o_rows(rows.size() * s.head_dim), lse_rows(rows.size());
    std::vector<double> mag_rows(rows.size() * s.head_dim), logit_rows(rows.size() * s.head_dim),
        lse_mag_rows(rows.size());
    flashtune::ref::forward_rows(s, p.q.data(), p.k.data(), p.v.data(), rows, o_rows.data(),
                                 lse_rows.data(), 2,
                                 {mag_rows.data(), logit_rows.data(), lse_mag_rows.data()});
    for (size_t n = 0; n < rows.size(); ++n) {
      EXPECT_EQ(lse_rows[n], got.lse[rows[n]]) << "row " << rows[n];
      EXPECT_EQ(lse_mag_rows[n], got.lse_mag[rows[n]]) << "row " << rows[n];
      for (int x = 0; x < s.head_dim; ++x) {
        const int64_t at = rows[n] * s.head_dim + x;
        EXPECT_EQ(o_rows[n * s.head_dim + x], got.o[at]) << "row " << rows[n];
        EXPECT_EQ(mag_rows[n * s.head_dim + x], got.o_mag[at]) << "row " << rows[n];
        EXPECT_EQ(logit_rows[n * s.head_dim + x], got.o_logit[at]) << "row " << rows[n];
      }
    }
  }
}

TEST(Reference, GqaBackwardMatchesGroupSums) {
  uint64_t seed = 300;
  for (const Shape& s : gqa_shapes()) {
    SCOPED_TRACE(describe(s));
    const Problem p = make_problem(s, seed++);
    const BackwardOut got = run_backward(s, p.q, p.k, p.v, p.dout, 3);
    const BackwardOut mha =
        run_backward(as_multi_head(s), p.q, repeat_kv(s, p.k), repeat_kv(s, p.v), p.dout, 3);
    EXPECT_TRUE(same_bits(got.dq, mha.dq));
    EXPECT_TRUE(same_bits(got.dq_mag, mha.dq_mag));
    EXPECT_TRUE(same_bits(got.dq_logit, mha.dq_logit));
    EXPECT_TRUE(same_bits(got.dk, sum_over_groups(s, mha.dk)));
    EXPECT_TRUE(same_bits(got.dv, sum_over_groups(s, mha.dv)));
    EXPECT_TRUE(same_bits(got.dk_mag, sum_over_groups(s, mha.dk_mag)));
    EXPECT_TRUE(same_bits(got.dk_logit, sum_over_groups(s, mha.dk_logit)));
    EXPECT_TRUE(same_bits(got.dv_mag, sum_over_groups(s, mha.dv_mag)));
    EXPECT_TRUE(same_bits(got.dv_logit, sum_over_groups(s, mha.dv_logit)));
  }
}

TEST(Reference, MqaBackwardMatchesFiniteDifferences) {
  // Independent of the bit-for-bit comparisons above: with one kv head shared by all query
  // heads, dK and dV must be the loss's derivatives w.r.t. the shared K and V.
  for (bool causal : {false, true}) {
    Shape s{1, 3, 4, 5, 3, causal};
    s.heads_k = 1;
    SCOPED_TRACE(describe(s));
    const Problem p = make_problem(s, 51);
    const BackwardOut g = run_backward(s, p.q, p.k, p.v, p.dout, 2);
    const std::vector<double> q = to_double(p.q), dout = to_double(p.dout);
    std::vector<double> k = to_double(p.k), v = to_double(p.v);
    auto forward = [&] { return brute_forward(as_multi_head(s), q, repeat_kv(s, k), repeat_kv(s, v)); };
    expect_finite_differences(forward, dout, k, g.dk, "dk");
    expect_finite_differences(forward, dout, v, g.dv, "dv");
  }
}

TEST(Reference, GqaThreadCountDoesNotChangeBits) {
  for (bool causal : {false, true}) {
    Shape s{2, 6, 45, 70, 16, causal};
    s.heads_k = 2;
    SCOPED_TRACE(describe(s));
    const Problem p = make_problem(s, 33);
    auto run = [&](int threads) {
      const ForwardOut f = run_forward(s, p.q, p.k, p.v, threads);
      const BackwardOut g = run_backward(s, p.q, p.k, p.v, p.dout, threads);
      return std::vector<std::vector<double>>{f.o, f.lse, f.o_mag, f.o_logit, f.lse_mag,
                                              g.dq, g.dk, g.dv, g.dq_mag, g.dq_logit,
                                              g.dk_mag, g.dk_logit, g.dv_mag, g.dv_logit};
    };
    const auto one = run(1), four = run(4);
    for (size_t t = 0; t < one.size(); ++t) EXPECT_TRUE(same_bits(one[t], four[t])) << "tensor " << t;
  }
}

TEST(Reference, BadHeadsKThrows) {
  const Shape good{1, 6, 4, 4, 8};
  const Problem p = make_problem(good, 3);  // big enough for any heads_k below
  std::vector<double> o(q_size(good)), lse(n_q_rows(good)), dk(k_size(good)), dv(k_size(good));
  const std::vector<int64_t> rows = {0};
  for (int heads_k : {4, -1, 12}) {  // not a divisor, negative, more kv heads than heads
    Shape s = good;
    s.heads_k = heads_k;
    SCOPED_TRACE("heads_k=" + std::to_string(heads_k));
    EXPECT_THROW(flashtune::ref::forward(s, p.q.data(), p.k.data(), p.v.data(), o.data(), lse.data()),
                 std::invalid_argument);
    EXPECT_THROW(flashtune::ref::forward_rows(s, p.q.data(), p.k.data(), p.v.data(), rows, o.data(),
                                              lse.data()),
                 std::invalid_argument);
    EXPECT_THROW(flashtune::ref::backward(s, p.q.data(), p.k.data(), p.v.data(), p.dout.data(),
                                          o.data(), dk.data(), dv.data()),
                 std::invalid_argument);
    EXPECT_THROW(flashtune::ref::forward_split(s, p.q.data(), p.k.data(), p.v.data(), 0, 4, o.data(),
                                               lse.data()),
                 std::invalid_argument);
  }
}

// ---------------------------------------------------------------------------
// Packed variable-length batches: each sequence must be exactly the dense
// problem it is on its own.
// ---------------------------------------------------------------------------

using flashtune::ref::VarlenShape;

std::vector<int32_t> offsets_of(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu = {0};
  for (int32_t n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

// Tokens [first, first + len) of a packed (tokens, heads, d) tensor as a dense (1, heads, len, d) one.
template <class T>
std::vector<T> unpack(const std::vector<T>& packed, int64_t first, int64_t len, int heads, int d) {
  std::vector<T> dense(len * heads * d);
  for (int h = 0; h < heads; ++h)
    for (int64_t t = 0; t < len; ++t)
      for (int x = 0; x < d; ++x) dense[(h * len + t) * d + x] = packed[((first + t) * heads + h) * d + x];
  return dense;
}

// Queries [first, first + len) of a packed (heads, total) lse as a dense (1, heads, len) one.
std::vector<double> unpack_lse(const std::vector<double>& packed, int64_t first, int64_t len, int heads) {
  const int64_t total = static_cast<int64_t>(packed.size()) / heads;
  std::vector<double> dense(len * heads);
  for (int h = 0; h < heads; ++h)
    for (int64_t t = 0; t < len; ++t) dense[h * len + t] = packed[h * total + first + t];
  return dense;
}

bool all_equal(const std::vector<double>& t, double value) {
  return std::all_of(t.begin(), t.end(), [&](double x) { return x == value; });
}

// Outputs start as NaN so that an element the reference forgot to write shows.
std::vector<double> unwritten(int64_t n) { return std::vector<double>(n, std::nan("")); }

struct VarlenProblem {
  VarlenShape shape;
  std::vector<int32_t> cu_q, cu_k;
  std::vector<float> q, k, v, dout;  // packed
  int kv_heads() const { return shape.kv_heads(); }
  int64_t total_q() const { return cu_q.back(); }
  int64_t total_k() const { return cu_k.back(); }
  Shape sequence(int b) const {
    return Shape{1, shape.heads, cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b], shape.head_dim,
                 shape.causal, shape.scale, shape.heads_k};
  }
};

VarlenProblem make_varlen(const VarlenShape& vs, const std::vector<int32_t>& len_q,
                          const std::vector<int32_t>& len_k, uint64_t seed) {
  VarlenProblem p{vs, offsets_of(len_q), offsets_of(len_k), {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  const int64_t nq = p.total_q() * vs.heads * vs.head_dim, nk = p.total_k() * p.kv_heads() * vs.head_dim;
  p.q = random_tensor(nq, rng);
  p.k = random_tensor(nk, rng);
  p.v = random_tensor(nk, rng);
  p.dout = random_tensor(nq, rng);
  return p;
}

struct VarlenOut {
  ForwardOut f;   // packed: o and magnitudes (total_q, H, d), lse and lse_mag (H, total_q)
  BackwardOut g;  // packed: dq* (total_q, H, d), dk* and dv* (total_k, Hk, d)
};

VarlenOut run_varlen(const VarlenProblem& p, int threads) {
  const int64_t nq = p.total_q() * p.shape.heads * p.shape.head_dim;
  const int64_t nk = p.total_k() * p.kv_heads() * p.shape.head_dim;
  const int64_t n_lse = p.total_q() * p.shape.heads;
  VarlenOut r{{unwritten(nq), unwritten(n_lse), unwritten(nq), unwritten(nq), unwritten(n_lse)},
              {unwritten(nq), unwritten(nk), unwritten(nk), unwritten(nq), unwritten(nq),
               unwritten(nk), unwritten(nk), unwritten(nk), unwritten(nk)}};
  ForwardOut& f = r.f;
  BackwardOut& g = r.g;
  flashtune::ref::forward_varlen(p.shape, p.cu_q, p.cu_k, p.q.data(), p.k.data(), p.v.data(),
                                 f.o.data(), f.lse.data(), threads,
                                 {f.o_mag.data(), f.o_logit.data(), f.lse_mag.data()});
  flashtune::ref::backward_varlen(p.shape, p.cu_q, p.cu_k, p.q.data(), p.k.data(), p.v.data(),
                                  p.dout.data(), g.dq.data(), g.dk.data(), g.dv.data(), threads,
                                  {g.dq_mag.data(), g.dq_logit.data(), g.dk_mag.data(),
                                   g.dk_logit.data(), g.dv_mag.data(), g.dv_logit.data()});
  return r;
}

TEST(Reference, VarlenMatchesDensePerSequence) {
  // Sequences: ordinary, no queries, no keys, 1 x 1, Sk > Sq, neither, Sq > Sk (causal: masked rows).
  const std::vector<int32_t> len_q = {5, 0, 17, 1, 9, 0, 12};
  const std::vector<int32_t> len_k = {7, 3, 0, 1, 30, 0, 4};
  uint64_t seed = 400;
  for (int heads_k : {0, 2})
    for (bool causal : {false, true})
      for (double scale : {0.0, 0.37}) {
        const VarlenShape vs{4, 8, causal, scale, heads_k};
        const VarlenProblem p = make_varlen(vs, len_q, len_k, seed++);
        const int H = vs.heads, Hk = p.kv_heads(), d = vs.head_dim;
        const VarlenOut got = run_varlen(p, 3);
        for (int b = 0; b + 1 < static_cast<int>(p.cu_q.size()); ++b) {
          const Shape s = p.sequence(b);
          SCOPED_TRACE("sequence " + std::to_string(b) + ": " + describe(s));
          const int64_t first_q = p.cu_q[b], first_k = p.cu_k[b];
          auto q_part = [&](const std::vector<double>& t) { return unpack(t, first_q, s.seq_q, H, d); };
          auto k_part = [&](const std::vector<double>& t) { return unpack(t, first_k, s.seq_k, Hk, d); };
          auto lse_part = [&](const std::vector<double>& t) { return unpack_lse(t, first_q, s.seq_q, H); };
          if (s.seq_q == 0) {  // keys nobody attends: zero gradients
            for (const auto* t : {&got.g.dk, &got.g.dv, &got.g.dk_mag, &got.g.dk_logit, &got.g.dv_mag,
                                  &got.g.dv_logit})
              EXPECT_TRUE(all_equal(k_part(*t), 0.0));
            continue;
          }
          if (s.seq_k == 0) {  // queries with no key: the fully masked rule
            EXPECT_TRUE(all_equal(lse_part(got.f.lse), kInf));
            for (const auto* t : {&got.f.o, &got.f.o_mag, &got.f.o_logit, &got.g.dq, &got.g.dq_mag,
                                  &got.g.dq_logit})
              EXPECT_TRUE(all_equal(q_part(*t), 0.0));
            EXPECT_TRUE(all_equal(lse_part(got.f.lse_mag), 0.0));
            continue;
          }
          const std::vector<float> q = unpack(p.q, first_q, s.seq_q, H, d), dout = unpack(p.dout, first_q, s.seq_q, H, d);
          const std::vector<float> k = unpack(p.k, first_k, s.seq_k, Hk, d), v = unpack(p.v, first_k, s.seq_k, Hk, d);
          const ForwardOut f = run_forward(s, q, k, v, 2);
          const BackwardOut g = run_backward(s, q, k, v, dout, 2);
          EXPECT_TRUE(same_bits(q_part(got.f.o), f.o));
          EXPECT_TRUE(same_bits(lse_part(got.f.lse), f.lse));
          EXPECT_TRUE(same_bits(q_part(got.f.o_mag), f.o_mag));
          EXPECT_TRUE(same_bits(q_part(got.f.o_logit), f.o_logit));
          EXPECT_TRUE(same_bits(lse_part(got.f.lse_mag), f.lse_mag));
          EXPECT_TRUE(same_bits(q_part(got.g.dq), g.dq));
          EXPECT_TRUE(same_bits(q_part(got.g.dq_mag), g.dq_mag));
          EXPECT_TRUE(same_bits(q_part(got.g.dq_logit), g.dq_logit));
          EXPECT_TRUE(same_bits(k_part(got.g.dk), g.dk));
          EXPECT_TRUE(same_bits(k_part(got.g.dv), g.dv));
          EXPECT_TRUE(same_bits(k_part(got.g.dk_mag), g.dk_mag));
          EXPECT_TRUE(same_bits(k_part(got.g.dk_logit), g.dk_logit));
          EXPECT_TRUE(same_bits(k_part(got.g.dv_mag), g.dv_mag));
          EXPECT_TRUE(same_bits(k_part(got.g.dv_logit), g.dv_logit));
        }
        // Every element was written: no NaN left from unwritten().
        for (const auto* t : {&got.f.o, &got.f.lse, &got.f.o_mag, &got.f.o_logit, &got.f.lse_mag,
                              &got.g.dq, &got.g.dk, &got.g.dv, &got.g.dq_mag, &got.g.dq_logit,
                              &got.g.dk_mag, &got.g.dk_logit, &got.g.dv_mag, &got.g.dv_logit})
          EXPECT_TRUE(std::none_of(t->begin(), t->end(), [](double x) { return std::isnan(x); }));
      }
}

TEST(Reference, VarlenEmptySequences) {
  // No queries / no keys / neither, and a batch of no sequences at all.
  const VarlenShape vs{2, 4, /*causal=*/true};
  const VarlenProblem p = make_varlen(vs, {0, 3, 0}, {4, 0, 0}, 5);
  const VarlenOut got = run_varlen(p, 2);
  EXPECT_TRUE(all_equal(got.f.o, 0.0));
  EXPECT_TRUE(all_equal(got.f.lse, kInf));
  EXPECT_TRUE(all_equal(got.g.dq, 0.0));
  EXPECT_TRUE(all_equal(got.g.dk, 0.0));
  EXPECT_TRUE(all_equal(got.g.dv, 0.0));

  const std::vector<int32_t> none = {0};
  EXPECT_NO_THROW(flashtune::ref::forward_varlen(vs, none, none, nullptr, nullptr, nullptr, nullptr, nullptr));
  EXPECT_NO_THROW(flashtune::ref::backward_varlen(vs, none, none, nullptr, nullptr, nullptr, nullptr,
                                                  nullptr, nullptr, nullptr));
}

TEST(Reference, VarlenBadOffsetsThrow) {
  const VarlenShape vs{2, 4};
  const VarlenProblem p = make_varlen(vs, {3, 2}, {2, 4}, 6);
  std::vector<double> o(p.q.size()), lse(p.total_q() * vs.heads), dk(p.k.size()), dv(p.k.size());
  auto forward = [&](const VarlenShape& shape, std::vector<int32_t> cu_q, std::vector<int32_t> cu_k) {
    flashtune::ref::forward_varlen(shape, cu_q, cu_k, p.q.data(), p.k.data(), p.v.data(), o.data(), lse.data());
  };
  auto backward = [&](const VarlenShape& shape, std::vector<int32_t> cu_q, std::vector<int32_t> cu_k) {
    flashtune::ref::backward_varlen(shape, cu_q, cu_k, p.q.data(), p.k.data(), p.v.data(), p.dout.data(),
                                    o.data(), dk.data(), dv.data());
  };
  for (auto run : {std::function(forward), std::function(backward)}) {
    EXPECT_NO_THROW(run(vs, p.cu_q, p.cu_k));
    EXPECT_THROW(run(vs, {}, {}), std::invalid_argument);                    // no entries
    EXPECT_THROW(run(vs, {1, 5}, {0, 6}), std::invalid_argument);            // not from 0
    EXPECT_THROW(run(vs, {0, 3, 2}, {0, 2, 6}), std::invalid_argument);      // decreasing
    EXPECT_THROW(run(vs, {0, 3, 5}, {0, 6}), std::invalid_argument);         // batches differ
    EXPECT_THROW(run(VarlenShape{2, 4, false, 0, 3}, p.cu_q, p.cu_k), std::invalid_argument);  // heads_k
    EXPECT_THROW(run(VarlenShape{0, 4}, p.cu_q, p.cu_k), std::invalid_argument);               // heads
  }
  try {  // the message names the bad array
    forward(vs, {0, 3, 2}, {0, 2, 6});
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cu_seqlens_q"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------
// Split-KV: combining per-range forwards must give the dense forward.
// ---------------------------------------------------------------------------

// Key ranges of n_splits splits as FlashAttention's split-KV cuts them: whole blocks of
// block_keys keys, ceil(blocks / n_splits) blocks a split, so trailing splits may be empty.
std::vector<std::pair<int64_t, int64_t>> split_ranges(int64_t seq_k, int n_splits, int64_t block_keys = 64) {
  const int64_t blocks = (seq_k + block_keys - 1) / block_keys;
  const int64_t blocks_per_split = (blocks + n_splits - 1) / n_splits;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int sp = 0; sp < n_splits; ++sp) {
    ranges.emplace_back(std::min(seq_k, sp * blocks_per_split * block_keys),
                        std::min(seq_k, (sp + 1) * blocks_per_split * block_keys));
  }
  return ranges;
}

struct Combined {
  std::vector<double> o, lse;
};

Combined split_and_combine(const Shape& s, const Problem& p, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                           int threads) {
  const int n = static_cast<int>(ranges.size());
  std::vector<double> o_splits(n * q_size(s)), lse_splits(n * n_q_rows(s));
  for (int sp = 0; sp < n; ++sp) {
    flashtune::ref::forward_split(s, p.q.data(), p.k.data(), p.v.data(), ranges[sp].first, ranges[sp].second,
                                  o_splits.data() + sp * q_size(s), lse_splits.data() + sp * n_q_rows(s), threads);
  }
  Combined c{unwritten(q_size(s)), unwritten(n_q_rows(s))};
  flashtune::ref::combine_splits(s, n, o_splits.data(), lse_splits.data(), c.o.data(), c.lse.data(), threads);
  return c;
}

TEST(Reference, SplitKvCombineMatchesForward) {
  uint64_t seed = 500;
  for (int heads_k : {0, 2, 1})
    for (int sq : {1, 5, 16})
      for (int sk : {1, 100, 2049})
        for (bool causal : {false, true}) {
          Shape s{2, 4, sq, sk, 32, causal};
          s.heads_k = heads_k;
          SCOPED_TRACE(describe(s));
          const Problem p = make_problem(s, seed++);
          std::vector<double> o(q_size(s)), lse(n_q_rows(s));
          flashtune::ref::forward(s, p.q.data(), p.k.data(), p.v.data(), o.data(), lse.data(), 2);
          const int blocks = (sk + 63) / 64;
          for (int n_splits : {1, 2, 3, 7, blocks + 3}) {  // the last has more splits than blocks
            SCOPED_TRACE("splits=" + std::to_string(n_splits));
            const Combined c = split_and_combine(s, p, split_ranges(sk, n_splits), 2);
            expect_close(c.o, o, kTol, "o");
            expect_close(c.lse, lse, kTol, "lse");
          }
          // Ranges not on block boundaries, one per key at the extreme.
          const Combined per_key = split_and_combine(s, p, split_ranges(sk, std::min(sk, 40), 1), 2);
          expect_close(per_key.o, o, kTol, "o, unaligned ranges");
          expect_close(per_key.lse, lse, kTol, "lse, unaligned ranges");
        }
}

TEST(Reference, SplitKvOneSplitIsForward) {
  // One split over all keys: weight exp(0) = 1 and log(1) = 0, so bit for bit.
  for (bool causal : {false, true}) {
    Shape s{2, 4, 23, 11, 16, causal};  // causal Sq > Sk: fully masked rows too
    s.heads_k = 2;
    SCOPED_TRACE(describe(s));
    const Problem p = make_problem(s, 61);
    std::vector<double> o(q_size(s)), lse(n_q_rows(s));
    flashtune::ref::forward(s, p.q.data(), p.k.data(), p.v.data(), o.data(), lse.data(), 2);
    const Combined c = split_and_combine(s, p, {{0, s.seq_k}}, 3);
    EXPECT_TRUE(same_bits(c.o, o));
    EXPECT_TRUE(same_bits(c.lse, lse));
  }
}

TEST(Reference, SplitKvEmptySplits) {
  // Causal, Sq = 4, Sk = 10: query i sees keys j <= i + 6.
  const Shape s{1, 2, 4, 10, 8, /*causal=*/true};
  const Problem p = make_problem(s, 71);
  const int d = s.head_dim;
  std::vector<double> o(q_size(s)), lse(n_q_rows(s));

  // Keys [8, 10): rows 0 and 1 see none of them (empty split), rows 2 and 3 do.
  flashtune::ref::forward_split(s, p.q.data(), p.k.data(), p.v.data(), 8, 10, o.data(), lse.data());
  for (int64_t r = 0; r < n_q_rows(s); ++r) {
    const bool empty = r % s.seq_q < 2;
    SCOPED_TRACE("row " + std::to_string(r));
    if (empty) {
      EXPECT_EQ(lse[r], -kInf);
      for (int x = 0; x < d; ++x) EXPECT_EQ(o[r * d + x], 0.0);
    } else {
      EXPECT_TRUE(std::isfinite(lse[r]));
    }
  }
  // An empty range: every row empty.
  flashtune::ref::forward_split(s, p.q.data(), p.k.data(), p.v.data(), 3, 3, o.data(), lse.data());
  EXPECT_TRUE(all_equal(o, 0.0));
  EXPECT_TRUE(all_equal(lse, -kInf));

  // Every split empty: the dense fully masked rule.
  Combined all_empty = split_and_combine(s, p, {{3, 3}, {10, 10}}, 1);
  EXPECT_TRUE(all_equal(all_empty.o, 0.0));
  EXPECT_TRUE(all_equal(all_empty.lse, kInf));

  // A split with lse = +inf (the dense rule) is ignored like one with -inf, whatever its O.
  std::vector<double> dense_o(q_size(s)), dense_lse(n_q_rows(s));
  flashtune::ref::forward(s, p.q.data(), p.k.data(), p.v.data(), dense_o.data(), dense_lse.data());
  std::vector<double> o_splits = dense_o, lse_splits = dense_lse;
  o_splits.insert(o_splits.end(), q_size(s), 123.0);
  lse_splits.insert(lse_splits.end(), n_q_rows(s), kInf);
  flashtune::ref::combine_splits(s, 2, o_splits.data(), lse_splits.data(), o.data(), lse.data());
  EXPECT_TRUE(same_bits(o, dense_o));
  EXPECT_TRUE(same_bits(lse, dense_lse));

  // Bad ranges and split counts.
  for (auto [b, e] : {std::pair{-1, 3}, std::pair{5, 3}, std::pair{0, 11}}) {
    EXPECT_THROW(flashtune::ref::forward_split(s, p.q.data(), p.k.data(), p.v.data(), b, e, o.data(), lse.data()),
                 std::invalid_argument)
        << "[" << b << ", " << e << ")";
  }
  EXPECT_THROW(flashtune::ref::combine_splits(s, 0, o_splits.data(), lse_splits.data(), o.data(), lse.data()),
               std::invalid_argument);
}

TEST(Reference, SplitKvThreadCountDoesNotChangeBits) {
  Shape s{2, 6, 9, 300, 16, /*causal=*/true};
  s.heads_k = 3;
  const Problem p = make_problem(s, 81);
  const auto ranges = split_ranges(s.seq_k, 3);
  const Combined one = split_and_combine(s, p, ranges, 1), four = split_and_combine(s, p, ranges, 4);
  EXPECT_TRUE(same_bits(one.o, four.o));
  EXPECT_TRUE(same_bits(one.lse, four.lse));
}

}  // namespace
