// Issue 32, part 3: the float64 reference's explicit mask (Shape::mask: a mask_mod materialised), against the plain
// reference with the masks it already has (causal, the window, written here as explicit matrices) and against
// documents attended one by one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "reference/attention_ref.hpp"
#include "tests/reference_inputs.hpp"

namespace {

namespace ref = flashtune::ref;
using flashtune::test::random_tensor;
using ref::Shape;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Inputs {
  std::vector<float> q, k, v, dout;
};
Inputs inputs(const Shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return {random_tensor(s.q_elements(), rng), random_tensor(s.kv_elements(), rng), random_tensor(s.kv_elements(), rng),
          random_tensor(s.q_elements(), rng)};
}

struct Grads {
  std::vector<double> o, lse, dq, dk, dv;
  ref::FwdMagnitudes fm;
  std::vector<double> o_mag, o_logit, lse_mag, dq_mag, dq_logit, dk_mag, dk_logit, dv_mag, dv_logit;
};
Grads run(const Shape& s, const Inputs& in) {
  Grads g;
  g.o.resize(s.q_elements()), g.lse.resize(s.q_rows()), g.dq.resize(s.q_elements());
  g.dk.resize(s.kv_elements()), g.dv.resize(s.kv_elements());
  g.o_mag.resize(s.q_elements()), g.o_logit.resize(s.q_elements()), g.lse_mag.resize(s.q_rows());
  g.dq_mag.resize(s.q_elements()), g.dq_logit.resize(s.q_elements());
  g.dk_mag.resize(s.kv_elements()), g.dk_logit.resize(s.kv_elements());
  g.dv_mag.resize(s.kv_elements()), g.dv_logit.resize(s.kv_elements());
  ref::forward(s, in.q.data(), in.k.data(), in.v.data(), g.o.data(), g.lse.data(), 2,
               {g.o_mag.data(), g.o_logit.data(), g.lse_mag.data()});
  ref::backward(s, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), g.dq.data(), g.dk.data(), g.dv.data(), 2,
                {g.dq_mag.data(), g.dq_logit.data(), g.dk_mag.data(), g.dk_logit.data(), g.dv_mag.data(),
                 g.dv_logit.data()});
  return g;
}

// Every output and magnitude bit for bit: the explicit mask skips exactly the pairs the built-in masks skip, in the
// same order.
void expect_same(const Grads& a, const Grads& b) {
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
  EXPECT_EQ(a.o_mag, b.o_mag);
  EXPECT_EQ(a.o_logit, b.o_logit);
  EXPECT_EQ(a.lse_mag, b.lse_mag);
  EXPECT_EQ(a.dq_logit, b.dq_logit);
  EXPECT_EQ(a.dk_logit, b.dk_logit);
  EXPECT_EQ(a.dv_logit, b.dv_logit);
}

// The built-in masks of s (causal, the window) as one explicit [Sq, Sk] matrix.
std::vector<uint8_t> as_matrix(const Shape& s) {
  std::vector<uint8_t> m((size_t)s.seq_q * s.seq_k);
  for (int i = 0; i < s.seq_q; ++i) {
    const ref::KeySpan keys = ref::visible_range(s, i);
    for (int j = 0; j < s.seq_k; ++j) m[(size_t)i * s.seq_k + j] = j >= keys.first && j < keys.end;
  }
  return m;
}

}  // namespace

// Causal and windows, with and without a softcap, ALiBi, GQA, Sq != Sk: the explicit matrix (broadcast over batch
// and heads) gives the built-in mask's every output bit for bit.
TEST(ReferenceMask, ExplicitMatrixIsTheBuiltInMask) {
  const std::vector<float> slopes = {0.25f, 0.125f, 0.5f, 0.0625f};
  struct Case {
    int sq, sk, left, right;
    bool causal;
    double softcap;
    bool alibi;
    int heads_k;
  };
  for (const Case c : {Case{37, 37, -1, -1, true, 0, false, 0}, Case{19, 45, 7, 3, false, 0, false, 0},
                       Case{45, 19, -1, -1, true, 30, false, 2}, Case{33, 40, 5, -1, true, 0, true, 1},
                       Case{24, 24, 0, 0, false, 0, true, 0}}) {
    Shape s{2, 4, c.sq, c.sk, 16, c.causal};
    s.window_left = c.left, s.window_right = c.right, s.softcap = c.softcap, s.heads_k = c.heads_k;
    if (c.alibi) s.alibi_slopes = slopes.data();
    const Inputs in = inputs(s, 11 + c.sq);
    const Grads built_in = run(s, in);
    const std::vector<uint8_t> m = as_matrix(s);
    Shape e = s;
    e.causal = false, e.window_left = e.window_right = -1;
    e.mask = m.data();  // strides 0: every batch entry and head
    expect_same(run(e, in), built_in);
    // And ANDed: the same matrix on top of the built-in masks changes nothing.
    Shape both = s;
    both.mask = m.data();
    expect_same(run(both, in), built_in);
  }
}

// A document mask: each document's rows attended alone (the plain reference on the document's tokens) are the masked
// call's rows, bit for bit; per-head and per-batch masks through the strides; rows it empties give O = 0, lse = +inf
// and dQ = 0; keys no query sees get dK = dV = 0.
TEST(ReferenceMask, DocumentsAttendedAlone) {
  const int S = 41, d = 16;
  const std::vector<int> lens = {9, 1, 20, 11};
  std::vector<int> doc;
  for (int x = 0; x < (int)lens.size(); ++x) doc.insert(doc.end(), lens[x], x);
  std::vector<uint8_t> m((size_t)S * S);
  for (int i = 0; i < S; ++i)
    for (int j = 0; j < S; ++j) m[(size_t)i * S + j] = doc[i] == doc[j];
  for (bool causal : {false, true}) {
    Shape s{1, 2, S, S, d, causal};
    s.mask = m.data();
    const Inputs in = inputs(s, 5);
    const Grads g = run(s, in);
    int start = 0;
    for (int len : lens) {
      Shape one{1, 1, len, len, d, causal};
      for (int h = 0; h < 2; ++h) {
        auto slice = [&](const std::vector<float>& t) {
          return std::vector<float>(t.begin() + ((size_t)h * S + start) * d, t.begin() + ((size_t)h * S + start + len) * d);
        };
        const Inputs part{slice(in.q), slice(in.k), slice(in.v), slice(in.dout)};
        const Grads alone = run(one, part);
        for (int i = 0; i < len; ++i) {
          EXPECT_EQ(g.lse[(size_t)h * S + start + i], alone.lse[i]);
          for (int x = 0; x < d; ++x) {
            const size_t at = ((size_t)h * S + start + i) * d + x;
            EXPECT_EQ(g.o[at], alone.o[(size_t)i * d + x]);
            EXPECT_EQ(g.dq[at], alone.dq[(size_t)i * d + x]);
            EXPECT_EQ(g.dk[at], alone.dk[(size_t)i * d + x]);
            EXPECT_EQ(g.dv[at], alone.dv[(size_t)i * d + x]);
          }
        }
      }
      start += len;
    }
  }
  // Per head (stride S*S) and per batch entry: head 1 of batch 1 sees nothing; everything else every key.
  Shape s{2, 2, 13, 17, 8, false};
  std::vector<uint8_t> per(2 * 2 * 13 * 17, 1);
  std::fill(per.begin() + 3 * 13 * 17, per.end(), 0);
  s.mask = per.data(), s.mask_batch_stride = 2 * 13 * 17, s.mask_head_stride = 13 * 17;
  const Inputs in = inputs(s, 9);
  const Grads g = run(s, in);
  Shape plain = s;
  plain.mask = nullptr;
  const Grads p = run(plain, in);
  const size_t rows = 13, dq_head = rows * 8;
  for (size_t x = 0; x < 3 * dq_head; ++x) {
    EXPECT_EQ(g.o[x], p.o[x]);
    EXPECT_EQ(g.dq[x], p.dq[x]);
  }
  for (size_t x = 3 * dq_head; x < 4 * dq_head; ++x) {
    EXPECT_EQ(g.o[x], 0.0);
    EXPECT_EQ(g.dq[x], 0.0);
    EXPECT_EQ(g.o_mag[x], 0.0);
  }
  for (size_t r = 3 * rows; r < 4 * rows; ++r) EXPECT_EQ(g.lse[r], kInf);
  // Batch 1's kv head 1 serves only the masked head: its dK and dV are 0.
  for (size_t x = 3 * 17 * 8; x < 4 * 17 * 8; ++x) {
    EXPECT_EQ(g.dk[x], 0.0);
    EXPECT_EQ(g.dv[x], 0.0);
  }
  Shape bad = s;
  bad.mask_head_stride = -1;
  std::vector<double> o(s.q_elements()), lse(s.q_rows());
  EXPECT_THROW(ref::forward(bad, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data()), std::invalid_argument);
}
