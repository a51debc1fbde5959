// Tests for flashtune::ref (CPU float64 attention reference).
//
// The reference is checked against an independent brute-force implementation
// (full Sq x Sk matrices per head), and the backward against finite differences
// of a float64 loss, so the gradient formula itself is verified.
#include "reference/attention_ref.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using flashtune::ref::Shape;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTol = 1e-12;  // relative, both sides float64

int64_t q_size(const Shape& s) { return int64_t{s.batch} * s.heads * s.seq_q * s.head_dim; }
int64_t k_size(const Shape& s) { return int64_t{s.batch} * s.heads * s.seq_k * s.head_dim; }
int64_t n_q_rows(const Shape& s) { return int64_t{s.batch} * s.heads * s.seq_q; }

std::vector<float> random_tensor(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> t(n);
  for (auto& x : t) x = dist(rng);
  return t;
}

std::vector<double> to_double(const std::vector<float>& t) { return {t.begin(), t.end()}; }

std::string describe(const Shape& s) {
  return "B=" + std::to_string(s.batch) + " H=" + std::to_string(s.heads) +
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

TEST(Reference, BackwardMatchesFiniteDifferences) {
  // L = sum(O * dO), so dL/dq = dQ etc. Central differences in float64 with step h
  // have error ~h^2 (truncation) + eps*|L|/h (rounding) ~ 1e-10, far below any
  // formula mistake.
  constexpr double kStep = 1e-6;
  constexpr double kFdTol = 1e-7;
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
      auto loss = [&] {
        const BruteForward f = brute_forward(s, q, k, v);
        double l = 0;
        for (size_t n = 0; n < f.o.size(); ++n) l += f.o[n] * dout[n];
        return l;
      };
      auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
        for (size_t n = 0; n < x.size(); ++n) {
          const double saved = x[n];
          x[n] = saved + kStep;
          const double up = loss();
          x[n] = saved - kStep;
          const double down = loss();
          x[n] = saved;
          EXPECT_NEAR(grad[n], (up - down) / (2 * kStep), kFdTol) << name << "[" << n << "]";
        }
      };
      check(q, dq, "dq");
      check(k, dk, "dk");
      check(v, dv, "dv");
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

}  // namespace
