// The fast comparison (worker/validate.cpp: outputs read in their own format, runs of reference elements,
// the in-bound element inline) against the straightforward one (validate_plain.hpp): the same verdicts, bit
// for bit, on crafted outputs: NaN and infinities, infinite references, zero and NaN bounds, more than five
// bad elements across chunk boundaries, tiled heads and packed rows, in every format and thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/dtype_convert.hpp"
#include "tests/validate_plain.hpp"
#include "worker/validate.hpp"

using namespace flashtune;

namespace {

uint64_t bits(double x) {
  uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
}

void expect_same_verdict(const Verdict& fast, const Verdict& plain, const std::string& what) {
  EXPECT_EQ(fast.ok, plain.ok) << what;
  EXPECT_EQ(fast.error, plain.error) << what;
  EXPECT_EQ(bits(fast.max_abs), bits(plain.max_abs)) << what;
  EXPECT_EQ(bits(fast.max_rel), bits(plain.max_rel)) << what;
  EXPECT_EQ(bits(fast.mse), bits(plain.mse)) << what;
  EXPECT_EQ(bits(fast.mean_abs), bits(plain.mean_abs)) << what;
  EXPECT_EQ(bits(fast.worst_ratio), bits(plain.worst_ratio)) << what;
  EXPECT_EQ(fast.detail.dump(), plain.detail.dump()) << what;
}

// An output in the format: its bytes, and the view the validators take.
struct Output {
  std::vector<uint8_t> bytes;
  OutputTensor view(DType t) const { return {bytes.data(), bytes.size() / (size_t)dtype_bytes(t), t}; }
};
Output output_of(std::vector<float> x, DType t) { return {to_device_format(x, t)}; }

// One backward output: got element i stands for reference element ref_of(i) (the layouts BwdReference
// describes), close to it, except the elements `faults` sets.
struct Crafted {
  std::vector<double> want, bound;
  std::vector<float> got;
};
template <class RefOf>
Crafted crafted(size_t n_ref, size_t n, RefOf ref_of, std::mt19937& gen) {
  std::normal_distribution<double> nd;
  Crafted c;
  c.want.resize(n_ref);
  c.bound.resize(n_ref);
  for (size_t j = 0; j < n_ref; ++j) {
    c.want[j] = nd(gen);
    c.bound[j] = 0.05 * (1 + std::fabs(c.want[j]));
  }
  c.got.resize(n);
  for (size_t i = 0; i < n; ++i) c.got[i] = (float)(c.want[ref_of(i)] * (1 + 0.01 * nd(gen)));
  return c;
}

}  // namespace

TEST(ValidateFast, BackwardVerdictsAreThePlainOnes) {
  std::mt19937 gen(33);
  const size_t d = 16;
  for (bool packed : {false, true}) {
    // Dense: 2 distinct heads of 300 x 16 tiled over 2.6 M elements (2.5 chunks; runs wrap inside chunks).
    // Packed: 80,000 tokens of 3 query heads (2 distinct: a token's third head is distinct head 0 again) and
    // 2 kv heads (1 distinct).
    BwdReference ref;
    ref.shape = ref::Shape{1, 2, 300, 300, (int)d};
    const size_t tokens = 80000;
    size_t n_ref_q = 2 * 300 * d, n_q = n_ref_q * 273, n_ref_k = n_ref_q, n_k = n_q;
    if (packed) {
      ref.q_row = 3 * d, ref.q_row_ref = 2 * d, ref.k_row = 2 * d, ref.k_row_ref = d;
      n_ref_q = tokens * ref.q_row_ref, n_q = tokens * ref.q_row;
      n_ref_k = tokens * ref.k_row_ref, n_k = tokens * ref.k_row;
    }
    auto ref_of = [&](size_t row, size_t row_ref, size_t n_ref) {
      return [=](size_t i) { return row ? i / row * row_ref + i % row % row_ref : i % n_ref; };
    };
    Crafted q = crafted(n_ref_q, n_q, ref_of(ref.q_row, ref.q_row_ref, n_ref_q), gen),
            k = crafted(n_ref_k, n_k, ref_of(ref.k_row, ref.k_row_ref, n_ref_k), gen),
            v = crafted(n_ref_k, n_k, ref_of(ref.k_row, ref.k_row_ref, n_ref_k), gen);
    // dQ: unwritten (NaN) and infinite elements, on both sides of a chunk boundary.
    for (size_t i : {size_t{7}, kCompareChunk - 1, kCompareChunk, 2 * kCompareChunk + 5}) q.got[i] = NAN;
    q.got[kCompareChunk + 1] = INFINITY;
    q.got[n_q - 1] = -INFINITY;
    // dK: nine elements off their bound, around both chunk boundaries (the message shows the first five).
    for (size_t i : {kCompareChunk - 3, kCompareChunk - 2, kCompareChunk - 1, kCompareChunk, kCompareChunk + 2,
                     2 * kCompareChunk - 1, 2 * kCompareChunk, 2 * kCompareChunk + 1, n_k - 1})
      k.got[i] += 3.0f * (float)k.bound[ref_of(ref.k_row, ref.k_row_ref, n_ref_k)(i)];
    // dV: infinite references (matched, and not), a zero bound (met exactly, and not), a NaN bound.
    const auto v_ref = ref_of(ref.k_row, ref.k_row_ref, n_ref_k);
    v.want[3] = INFINITY, v.want[4] = -INFINITY, v.bound[5] = 0, v.want[5] = 0.5, v.bound[6] = NAN;
    for (size_t i = 0; i < n_k; ++i) {
      const size_t j = v_ref(i);
      if (j == 3) v.got[i] = i < kCompareChunk ? INFINITY : 2.0f;  // matched in the first chunk only
      if (j == 4) v.got[i] = -INFINITY;
      if (j == 5) v.got[i] = i % 2 ? 0.5f : 0.75f;
    }
    v.got[kCompareChunk + 9] = v.got[kCompareChunk + 9] + 1.0f;  // one more off its bound
    ref.dq = q.want, ref.dk = k.want, ref.dv = v.want;
    const BwdBounds bounds{q.bound, k.bound, v.bound};
    for (DType t : {DType::fp32, DType::bf16, DType::fp16}) {
      Problem p;
      p.dtype = t;
      p.direction = "bwd";
      const Output oq = output_of(q.got, t), ok = output_of(k.got, t), ov = output_of(v.got, t);
      const Verdict plain = plain::validate_backward(p, ref, bounds, oq.view(t), ok.view(t), ov.view(t));
      EXPECT_FALSE(plain.ok);
      EXPECT_NE(plain.error.find("dq: 6 elements NaN, infinite or unwritten"), std::string::npos) << plain.error;
      EXPECT_NE(plain.error.find("dk: 9 of"), std::string::npos) << plain.error;
      EXPECT_NE(plain.error.find("dv: "), std::string::npos) << plain.error;
      for (int threads : {1, 2, 5}) {
        const std::string what = std::string(packed ? "packed " : "dense ") + to_string(t) + " on " +
                                 std::to_string(threads) + " threads";
        expect_same_verdict(validate_backward(p, ref, bounds, oq.view(t), ok.view(t), ov.view(t), threads), plain,
                            what);
      }
      // Outputs equal to their references (rounded to the format) pass alike.
      auto exact = [&](const Crafted& c, size_t row, size_t row_ref) {
        std::vector<float> x(c.got.size());
        for (size_t i = 0; i < x.size(); ++i) x[i] = (float)c.want[ref_of(row, row_ref, c.want.size())(i)];
        return output_of(x, t);
      };
      ref.dv = k.want;  // finite everywhere
      const BwdBounds finite{q.bound, k.bound, k.bound};
      const Output cq = exact(q, ref.q_row, ref.q_row_ref), ck = exact(k, ref.k_row, ref.k_row_ref);
      const Verdict plain_ok = plain::validate_backward(p, ref, finite, cq.view(t), ck.view(t), ck.view(t));
      EXPECT_TRUE(plain_ok.ok) << plain_ok.error;
      expect_same_verdict(validate_backward(p, ref, finite, cq.view(t), ck.view(t), ck.view(t), 3), plain_ok,
                          "exact");
      ref.dv = v.want;
    }
  }
}

TEST(ValidateFast, BackwardBoundsAreTheToleranceModels) {
  // backward_bounds is validate_backward's bound element by element: the call without bounds is the one with.
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> ud(0, 5);
  Problem p;
  p.batch = 1, p.heads = 4, p.heads_k = 2, p.seq_q = 40, p.seq_k = 50, p.head_dim = 16, p.dtype = DType::fp16;
  p.direction = "bwd";
  BwdReference ref;
  ref.shape = ref::Shape{1, 4, 40, 50, 16, false, 0, 2};
  for (auto* x : {&ref.dq, &ref.dq_mag, &ref.dq_logit}) x->resize(4 * 40 * 16);
  for (auto* x : {&ref.dk, &ref.dk_mag, &ref.dk_logit, &ref.dv, &ref.dv_mag, &ref.dv_logit}) x->resize(2 * 50 * 16);
  for (auto* x : {&ref.dq, &ref.dq_mag, &ref.dq_logit, &ref.dk, &ref.dk_mag, &ref.dk_logit, &ref.dv, &ref.dv_mag,
                  &ref.dv_logit})
    for (double& y : *x) y = ud(gen);
  ref.max_abs_q = 3, ref.max_abs_k = 2, ref.max_abs_do = 1, ref.max_abs_v = 4;
  const BwdBounds b = backward_bounds(p, ref);
  const double scale = 0.25, sq_sum = 40 * 2;
  const double ds = 1.0 + 0x1p-126 / subnormal_rounding(p.dtype) * 2.0 * 16 * 1 * 4;
  const ToleranceModel tq = backward_tolerance(p.dtype, 40, 50, 16, 50 * scale * 2 * ds),
                       tk = backward_tolerance(p.dtype, 80, 50, 16, sq_sum * scale * 3 * ds),
                       tv = backward_tolerance(p.dtype, 80, 50, 16, sq_sum * 1);
  for (size_t j = 0; j < ref.dq.size(); ++j) EXPECT_EQ(b.dq[j], tq.bound(ref.dq_mag[j], ref.dq_logit[j]));
  for (size_t j = 0; j < ref.dk.size(); ++j) {
    EXPECT_EQ(b.dk[j], tk.bound(ref.dk_mag[j], ref.dk_logit[j]));
    EXPECT_EQ(b.dv[j], tv.bound(ref.dv_mag[j], ref.dv_logit[j]));
  }
  std::vector<float> q(ref.dq.begin(), ref.dq.end()), k(ref.dk.begin(), ref.dk.end()), v(ref.dv.begin(), ref.dv.end());
  q[5] += 1.0f;
  expect_same_verdict(validate_backward(p, ref, q, k, v), validate_backward(p, ref, b, q, k, v), "bounds");
}

TEST(ValidateFast, ForwardVerdictsAreThePlainOnes) {
  // 2 x 3 x 30,000 rows of 16: O is 2.9 M elements (three chunks of the non-finite count); 200 sampled rows.
  std::mt19937 gen(7);
  std::normal_distribution<double> nd;
  Problem p;
  p.batch = 2, p.heads = 3, p.seq_q = 30000, p.seq_k = 64, p.head_dim = 16, p.direction = "fwd";
  const size_t d = 16, rows = (size_t)2 * 3 * 30000;
  FwdReference ref;
  ref.shape = ref::Shape{2, 3, 30000, 64, 16};
  for (size_t r = 0; r < 200; ++r) ref.rows.push_back((int64_t)(r * 1399 % rows));
  std::vector<float> o(rows * d), lse(rows);
  for (float& x : o) x = (float)nd(gen);
  for (float& x : lse) x = (float)(4 + nd(gen));
  for (size_t r = 0; r < ref.rows.size(); ++r) {
    for (size_t c = 0; c < d; ++c) {
      ref.o.push_back(o[ref.rows[r] * d + c] * (1 + 1e-3 * nd(gen)));
      ref.o_mag.push_back(1 + std::fabs(ref.o.back()));
      ref.o_logit.push_back(10);
    }
    ref.lse.push_back(lse[ref.rows[r]]);
    ref.lse_mag.push_back(5);
  }
  ref.max_abs_v = 4;
  for (size_t r : {size_t{3}, size_t{77}, size_t{150}, size_t{151}, size_t{152}, size_t{190}, size_t{199}})
    o[ref.rows[r] * d + 2] += 1.0f;  // seven sampled elements off
  const size_t sampled = (size_t)ref.rows[10] * d + 5;
  o[sampled] = INFINITY;                    // a sampled element infinite
  o[kCompareChunk + 17] = NAN;              // an unsampled one unwritten
  lse[(size_t)ref.rows[20]] = NAN;          // a sampled LSE entry unwritten
  lse[rows - 1] = INFINITY;                 // an infinite LSE is written (a fully masked row's)
  for (DType t : {DType::fp32, DType::bf16, DType::fp16}) {
    p.dtype = t;
    const Output oo = output_of(o, t), ol = output_of(lse, DType::fp32);
    const Verdict plain = plain::validate_forward(p, ref, oo.view(t), ol.view(DType::fp32));
    EXPECT_FALSE(plain.ok);
    EXPECT_NE(plain.error.find("2 output elements NaN"), std::string::npos) << plain.error;
    EXPECT_NE(plain.error.find("1 LSE entries NaN"), std::string::npos) << plain.error;
    for (int threads : {1, 2, 4})
      expect_same_verdict(validate_forward(p, ref, oo.view(t), ol.view(DType::fp32), threads), plain,
                          std::string(to_string(t)) + " on " + std::to_string(threads) + " threads");
    // Lse entries of a packed batch (lse_index) and clean outputs.
    FwdReference packed = ref;
    for (size_t r = 0; r < ref.rows.size(); ++r) packed.lse_index.push_back((int64_t)((r * 7919) % rows));
    std::vector<float> clean_o = o, clean_lse = lse;
    clean_o[sampled] = 0, clean_o[kCompareChunk + 17] = 0, clean_lse[(size_t)ref.rows[20]] = 0;
    for (size_t r = 0; r < ref.rows.size(); ++r) {
      for (size_t c = 0; c < d; ++c) clean_o[ref.rows[r] * d + c] = (float)ref.o[r * d + c];
      clean_lse[packed.lse_index[r]] = (float)ref.lse[r];
    }
    const Output co = output_of(clean_o, t), cl = output_of(clean_lse, DType::fp32);
    const Verdict plain_ok = plain::validate_forward(p, packed, co.view(t), cl.view(DType::fp32));
    EXPECT_TRUE(plain_ok.ok) << plain_ok.error;
    expect_same_verdict(validate_forward(p, packed, co.view(t), cl.view(DType::fp32), 3), plain_ok, "packed clean");
  }
}

TEST(ValidateFast, OutputTensorReadsEveryFormat) {
  // Every 16-bit pattern reads as the float from_device_format makes of it (NaN as NaN).
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = (uint16_t)h;
  for (DType t : {DType::bf16, DType::fp16}) {
    const std::vector<uint8_t> bytes((uint8_t*)all.data(), (uint8_t*)all.data() + all.size() * 2);
    const std::vector<float> want = from_device_format(bytes, t);
    const OutputTensor view{all.data(), all.size(), t};
    for (size_t i = 0; i < all.size(); ++i) {
      const float x = view.at(i);
      if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(x)) << i;
      else EXPECT_EQ(x, want[i]) << to_string(t) << " " << i;
    }
  }
}
