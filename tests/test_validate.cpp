#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/compile.hpp"
#include "core/input_files.hpp"
#include "templates/attention_params.h"
#include "tuner/space/space.hpp"
#include "worker/validate.hpp"

#include <cstddef>

using namespace flashtune;

TEST(Validate, ErrorStatsAgainstBounds) {
  ErrorStats e;
  e.add(0, 1.00005f, 1.0, 1e-4, 1e-5);
  e.add(1, 0.0f, 0.0, 1e-12, 1e-5);
  EXPECT_EQ(e.bad, 0u);
  EXPECT_NEAR(e.max_abs, 5e-5, 1e-7);  // 1.00005f is not exact
  EXPECT_NEAR(e.worst_ratio, 0.5, 0.01);
  e.add(2, 1.001f, 1.0, 1e-4, 1e-5);
  EXPECT_EQ(e.bad, 1u);
  EXPECT_NE(e.first_bad.find("[2]"), std::string::npos);
  EXPECT_EQ(e.count, 3u);
  ErrorStats f;
  f.add(0, INFINITY, INFINITY, 1e-6, 1e-5);  // fully masked row's LSE
  EXPECT_EQ(f.bad, 0u);
  f.add(1, NAN, 1.0, 1.0, 1e-5);  // poison left in place: unwritten output
  EXPECT_EQ(f.bad, 1u);
  f.add(2, 1.0f, INFINITY, 1.0, 1e-5);
  EXPECT_EQ(f.bad, 2u);
  f.add(3, INFINITY, 1.0, 1e30, 1e-5);  // no bound admits an infinite output
  EXPECT_EQ(f.bad, 3u);
}

TEST(Validate, ChunkedStatsMergeToTheSequentialOnes) {
  // The backward compares its outputs in chunks on every core; merged, they are the one-pass stats:
  // the same counts, maxima and first five bad elements, in index order.
  std::vector<double> got(1000), want(1000);
  for (size_t i = 0; i < got.size(); ++i) {
    want[i] = std::sin(0.1 * i);
    got[i] = want[i] + ((i % 97 == 3) ? 0.5 : 1e-4 * std::cos(i));
  }
  ErrorStats one;
  for (size_t i = 0; i < got.size(); ++i) one.add(i, got[i], want[i], 1e-3, 1e-6);
  for (size_t chunks : {2u, 3u, 7u, 64u}) {
    ErrorStats merged;
    for (size_t c = 0; c < chunks; ++c) {
      ErrorStats part;
      for (size_t i = got.size() * c / chunks; i < got.size() * (c + 1) / chunks; ++i) part.add(i, got[i], want[i], 1e-3, 1e-6);
      if (c == 0) merged = part;
      else merged.merge(part);
    }
    EXPECT_EQ(merged.count, one.count);
    EXPECT_EQ(merged.bad, one.bad);
    EXPECT_EQ(merged.first_bad, one.first_bad) << chunks;
    EXPECT_EQ(merged.max_abs, one.max_abs);
    EXPECT_EQ(merged.worst_ratio, one.worst_ratio);
    EXPECT_NEAR(merged.sum_sq, one.sum_sq, 1e-12 * one.sum_sq);
  }
  EXPECT_EQ(one.bad, 11u);
}

TEST(Validate, TolerancesTightenWithPrecision) {
  EXPECT_EQ(unit_roundoff(DType::fp32), 0x1p-24);
  EXPECT_LT(unit_roundoff(DType::fp32), unit_roundoff(DType::fp16));
  EXPECT_LT(unit_roundoff(DType::fp16), unit_roundoff(DType::bf16));
  for (DType t : {DType::fp32, DType::fp16, DType::bf16}) {
    const ToleranceModel f = forward_tolerance(t, 4096, 64);
    EXPECT_GT(f.bound(1, 0), 0);
    EXPECT_LT(f.floor, f.bound(1e-3, 0)) << "the floor only matters for zero references";
    // fp16's subnormal rounding (2^-25 absolute) must fit under the floor.
    if (t == DType::fp16) EXPECT_GE(f.floor, 0x1p-25);
  }
}

TEST(Compile, ParsesPtxasLog) {
  const char* log =
      "ptxas info    : Compiling entry function '_Z1k' for 'sm_90'\n"
      "ptxas info    : Function properties for _Z1k\n"
      "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 4096 bytes smem\n";
  Resources r = parse_ptxas_log(log);
  EXPECT_EQ(r.registers, 168);
  EXPECT_EQ(r.smem_static, 4096);
  EXPECT_EQ(r.stack_bytes, 16);
  EXPECT_EQ(r.spill_stores, 8);
  EXPECT_EQ(r.spill_loads, 12);
}

TEST(Compile, MultiKernelLogReportsTheWorst) {
  const char* log =
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 0 barriers\n"
      "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem\n"
      "ptxas info    : Used 96 registers, used 1 barriers\n";
  Resources r = parse_ptxas_log(log);
  EXPECT_EQ(r.registers, 255);
  EXPECT_EQ(r.spill_stores, 4);
  EXPECT_EQ(r.stack_bytes, 8);
  EXPECT_EQ(r.smem_static, 1024);
}

// Per entry function, so that one kernel's static buffer is not charged to another kernel's launch.
TEST(Compile, ParsesPtxasLogPerEntry) {
  const char* log =
      "ptxas info    : Compiling entry function '_Z4conv' for 'sm_90a'\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 32 registers, used 1 barriers, 18432 bytes smem\n"
      "ptxas info    : Compiling entry function '_Z4main' for 'sm_90a'\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 16 barriers\n";
  const auto e = parse_ptxas_entries(log);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e.at("_Z4conv").smem_static, 18432);
  EXPECT_EQ(e.at("_Z4conv").registers, 32);
  EXPECT_EQ(e.at("_Z4main").smem_static, 0);
  EXPECT_EQ(e.at("_Z4main").registers, 168);
  EXPECT_TRUE(parse_ptxas_entries("no entry here").empty());
}

TEST(Compile, ArchLimits) {
  EXPECT_EQ(arch_limits("sm_90").max_smem_per_block, 232448);
  EXPECT_EQ(arch_limits("sm_80").max_smem_per_block, 166912);
  EXPECT_THROW(arch_limits("sm_1"), std::exception);
}

#include "core/dtype_convert.hpp"

// The by-hand binary16 (compilers without _Float16) against _Float16: every half, and every float whose low
// 12 bits are one of a few patterns (with bit 12: ties, just above and below them), each rounding case of
// every exponent; 65520 rounds to inf, 2^-25 to zero, and the halves' subnormals are exact.
TEST(DtypeConvert, SoftwareHalfMatchesFloat16) {
  EXPECT_EQ(float_to_fp16_soft(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_fp16_soft(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16_soft(0x1p-25f), 0);
  EXPECT_EQ(float_to_fp16_soft(0x1p-24f), 1);
  EXPECT_EQ(float_to_fp16_soft(-0x1.8p-24f), 0x8002);  // 1.5 units: tie to even
  EXPECT_EQ(fp16_to_float_soft(0x03ff), 1023 * 0x1p-24f);
  EXPECT_TRUE(std::isnan(fp16_to_float_soft(float_to_fp16_soft(std::nanf("")))));
#if defined(__FLT16_MAX__)
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = fp16_to_float((uint16_t)h), b = fp16_to_float_soft((uint16_t)h);
    if (!std::isnan(a)) ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << std::hex << h;
  }
  for (uint32_t high = 0; high < (1u << 20); ++high)
    for (uint32_t low : {0x000u, 0x001u, 0x7ffu, 0x800u, 0x801u, 0xfffu}) {
      const uint32_t u = (high << 12) | low;
      float f;
      std::memcpy(&f, &u, 4);
      if (!std::isnan(f)) ASSERT_EQ(float_to_fp16(f), float_to_fp16_soft(f)) << std::hex << u;
    }
#endif
}

TEST(DtypeConvert, RoundToNearestEvenAndBack) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0); 1 + 3*2^-9 rounds up.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1p-9f)), 1.0f + 0x1p-7f);
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp16_to_float(float_to_fp16(-2.5f)), -2.5f);
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 0x1p-11f)), 1.0f);  // tie to even
  EXPECT_TRUE(std::isnan(bf16_to_float((uint16_t)nan_bits(DType::bf16))));
  EXPECT_TRUE(std::isnan(fp16_to_float((uint16_t)nan_bits(DType::fp16))));
  std::vector<float> v = {0.1f, -3.14159f, 1e-3f};
  auto bytes = to_device_format(v, DType::bf16);
  EXPECT_EQ(bytes.size(), 6u);
  auto back = from_device_format(bytes, DType::bf16);
  EXPECT_EQ(back, v) << "the host copy is rounded to exactly what the device holds";
  EXPECT_NEAR(v[1], -3.14159f, 3.14159f * 0x1p-8f);
}

// ---- Calibration: CPU emulations of correct and slightly wrong kernels against the bound ----------

namespace {

// The GPU's fp32 math flushes results below the smallest normal to zero (ex2.approx.ftz, -ftz).
float ftz(float x) { return std::fabs(x) < 0x1p-126f ? 0.0f : x; }

float round_to(DType t, float x) {
  if (t == DType::fp32) return x;
  return t == DType::bf16 ? bf16_to_float(float_to_bf16(x)) : fp16_to_float(float_to_fp16(x));
}

struct Inputs {
  ref::Shape shape;
  DType dtype;
  std::vector<float> q, k, v, dout;
};

// Seeded inputs like the worker's: normal, or Student-t(3) (heavy), times scale, rounded to the dtype;
// dO of the same kind, unscaled.
Inputs make_inputs(ref::Shape shape, DType t, bool heavy, double scale, uint64_t seed) {
  Inputs in{shape, t, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  auto normal = [&] {
    const double u1 = ((rng() >> 11) + 0.5) * 0x1.0p-53, u2 = (rng() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  };
  auto draw = [&](double s) {
    double x = normal();
    if (heavy) {
      double chi2 = 0;
      for (int n = 0; n < 3; ++n) chi2 += std::pow(normal(), 2);
      x = std::clamp(x / std::sqrt(chi2 / 3), -32.0, 32.0);
    }
    return round_to(t, (float)(s * x));
  };
  const size_t bh = (size_t)shape.batch * shape.heads, d = shape.head_dim;
  for (size_t i = 0; i < bh * shape.seq_q * d; ++i) in.q.push_back(draw(scale));
  for (size_t i = 0; i < bh * shape.seq_k * d; ++i) in.k.push_back(draw(scale));
  for (size_t i = 0; i < bh * shape.seq_k * d; ++i) in.v.push_back(draw(scale));
  for (size_t i = 0; i < bh * shape.seq_q * d; ++i) in.dout.push_back(draw(1.0));
  return in;
}

Problem problem_of(const Inputs& in, const char* direction) {
  Problem p;
  p.batch = in.shape.batch;
  p.heads = in.shape.heads;
  p.seq_q = in.shape.seq_q;
  p.seq_k = in.shape.seq_k;
  p.head_dim = in.shape.head_dim;
  p.causal = in.shape.causal;
  p.dtype = in.dtype;
  p.direction = direction;
  return p;
}

enum class Fault { none, skip_block, perturb_row };
constexpr int kBlockN = 64;

// What a correct FlashAttention-2 forward does, in fp32: scores by fp32 dot products, online softmax
// over blocks of 64 keys in the exp2 domain (rescaling by exp2(m_old - m_new)), P rounded to the dtype
// before P V, fp32 accumulation, O rounded to the dtype, LSE in fp32. The faults: skip_block drops
// keys [0, 64); perturb_row moves the last row of the last head by 5% of its magnitude scale (the
// mean of its o_mag).
void emulate_forward(const Inputs& in, Fault fault, std::vector<float>& o, std::vector<float>& lse,
                     const FwdReference* ref_for_perturb = nullptr) {
  const ref::Shape& s = in.shape;
  const int d = s.head_dim;
  const int64_t rows = (int64_t)s.batch * s.heads * s.seq_q;
  const float scale_log2 = (float)(s.softmax_scale() * M_LOG2E);
  o.assign(rows * d, 0.f);
  lse.assign(rows, 0.f);
  std::vector<float> acc(d), p(kBlockN), sc(kBlockN);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t bh = r / s.seq_q, i = r % s.seq_q;
    const float* q = &in.q[r * d];
    const int64_t n_keys = ref::visible_keys(s, i);
    float m = -INFINITY, l = 0;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t j0 = fault == Fault::skip_block ? kBlockN : 0; j0 < n_keys; j0 += kBlockN) {
      const int nb = (int)std::min<int64_t>(kBlockN, n_keys - j0);
      float m_new = m;
      for (int j = 0; j < nb; ++j) {
        const float* k = &in.k[(bh * s.seq_k + j0 + j) * d];
        float dot = 0;
        for (int c = 0; c < d; ++c) dot = std::fmaf(q[c], k[c], dot);
        sc[j] = dot * scale_log2;
        m_new = std::max(m_new, sc[j]);
      }
      const float alpha = std::exp2(m - m_new);
      float rowsum = 0;
      for (int j = 0; j < nb; ++j) {
        p[j] = ftz(std::exp2(sc[j] - m_new));
        rowsum += p[j];
        p[j] = round_to(in.dtype, p[j]);
      }
      l = l * alpha + rowsum;
      for (int c = 0; c < d; ++c) {
        float a = acc[c] * alpha;
        for (int j = 0; j < nb; ++j) a = std::fmaf(p[j], in.v[(bh * s.seq_k + j0 + j) * d + c], a);
        acc[c] = a;
      }
      m = m_new;
    }
    for (int c = 0; c < d; ++c) o[r * d + c] = round_to(in.dtype, l > 0 ? acc[c] / l : 0.f);
    lse[r] = l > 0 ? (m + std::log2(l)) * (float)M_LN2 : INFINITY;
  }
  if (fault == Fault::perturb_row) {
    const int64_t r = rows - 1;  // sampled first by ref::sample_rows
    const auto it = std::find(ref_for_perturb->rows.begin(), ref_for_perturb->rows.end(), r);
    const size_t n = it - ref_for_perturb->rows.begin();
    double mean_mag = 0;
    for (int c = 0; c < d; ++c) mean_mag += ref_for_perturb->o_mag[n * d + c] / d;
    for (int c = 0; c < d; ++c) o[r * d + c] = round_to(in.dtype, o[r * d + c] + (float)(0.05 * mean_mag));
  }
}

// A correct backward in fp32 (FlashAttention-2's): P = exp2(s scale log2e - lse log2e) with lse in
// fp32, delta = rowsum(dO * O) from O in the dtype, dS = P (dP - delta), P and dS rounded to the dtype
// before their products, fp32 accumulation, outputs rounded. skip_block drops keys [0, 64) from every
// sum; perturb_row moves one dK row by 5% of its magnitude scale.
void emulate_backward(const Inputs& in, const BwdReference& ref, Fault fault, std::vector<float>& dq,
                      std::vector<float>& dk, std::vector<float>& dv) {
  const ref::Shape& s = in.shape;
  const int d = s.head_dim;
  const int64_t heads = (int64_t)s.batch * s.heads;
  const float scale = (float)s.softmax_scale(), scale_log2 = (float)(s.softmax_scale() * M_LOG2E);
  std::vector<float> fq(heads * s.seq_q * d, 0.f), fk(heads * s.seq_k * d, 0.f), fv(fk.size(), 0.f);
  for (int64_t bh = 0; bh < heads; ++bh)
    for (int64_t i = 0; i < s.seq_q; ++i) {
      const int64_t r = bh * s.seq_q + i;
      const float lse_l2 = (float)ref.lse[r] * (float)M_LOG2E;
      const float* q = &in.q[r * d];
      const float* dO = &in.dout[r * d];
      float delta = 0;
      for (int c = 0; c < d; ++c) delta = std::fmaf(dO[c], round_to(in.dtype, (float)ref.o[r * d + c]), delta);
      for (int64_t j = fault == Fault::skip_block ? kBlockN : 0; j < ref::visible_keys(s, i); ++j) {
        const float* k = &in.k[(bh * s.seq_k + j) * d];
        const float* v = &in.v[(bh * s.seq_k + j) * d];
        float dot = 0, dp = 0;
        for (int c = 0; c < d; ++c) {
          dot = std::fmaf(q[c], k[c], dot);
          dp = std::fmaf(dO[c], v[c], dp);
        }
        const float p = ftz(std::exp2(std::fmaf(dot, scale_log2, -lse_l2)));
        const float ds = round_to(in.dtype, ftz(p * (dp - delta))), pr = round_to(in.dtype, p);
        for (int c = 0; c < d; ++c) {
          fv[(bh * s.seq_k + j) * d + c] = std::fmaf(pr, dO[c], fv[(bh * s.seq_k + j) * d + c]);
          fk[(bh * s.seq_k + j) * d + c] = std::fmaf(ds, q[c], fk[(bh * s.seq_k + j) * d + c]);
          fq[r * d + c] = std::fmaf(ds, k[c], fq[r * d + c]);
        }
      }
    }
  dq.resize(fq.size());
  dk.resize(fk.size());
  dv.resize(fv.size());
  for (size_t i = 0; i < fq.size(); ++i) dq[i] = round_to(in.dtype, scale * fq[i]);
  for (size_t i = 0; i < fk.size(); ++i) dk[i] = round_to(in.dtype, scale * fk[i]);
  for (size_t i = 0; i < fv.size(); ++i) dv[i] = round_to(in.dtype, fv[i]);
  if (fault == Fault::perturb_row) {
    // The key row with the largest magnitude: with a near one-hot softmax most keys win no query, and
    // their dK is 0 with magnitude 0, where 5% of nothing is no fault.
    size_t r = 0;
    double mean_mag = 0;
    for (size_t row = 0; row < fk.size() / d; ++row) {
      double m = 0;
      for (int c = 0; c < d; ++c) m += ref.dk_mag[row * d + c] / d;
      if (m > mean_mag) r = row, mean_mag = m;
    }
    for (int c = 0; c < d; ++c) dk[r * d + c] = round_to(in.dtype, dk[r * d + c] + (float)(0.05 * mean_mag));
  }
}

struct Case {
  const char* name;
  ref::Shape shape;
  bool heavy;
  double scale;
};

const Case kCases[] = {
    {"unit", {1, 2, 100, 300, 64, false}, false, 1},
    {"unit causal Sq>Sk (masked rows)", {1, 2, 300, 130, 64, true}, false, 1},
    {"x30 (near one-hot)", {1, 2, 100, 300, 64, false}, false, 30},
    {"x30 causal", {1, 1, 130, 200, 128, true}, false, 30},
    {"heavy", {1, 2, 100, 300, 64, false}, true, 1},
    {"heavy x5", {2, 1, 64, 257, 32, true}, true, 5},
    {"Sk = 1", {1, 1, 1, 1, 64, false}, false, 1},
    {"Sk = 1, Sq 200 causal", {1, 1, 200, 1, 64, true}, false, 1},
    {"Sk = 1 x30", {1, 1, 70, 1, 64, false}, false, 30},
};
constexpr DType kDtypes[] = {DType::fp32, DType::fp16, DType::bf16};
constexpr double kMargin = 0.5;  // a correct kernel uses at most half of its bound

}  // namespace

TEST(Calibration, ForwardCorrectPassesWithMarginWrongFails) {
  for (const Case& cs : kCases)
    for (DType t : kDtypes) {
      SCOPED_TRACE(std::string(cs.name) + " " + to_string(t));
      const Inputs in = make_inputs(cs.shape, t, cs.heavy, cs.scale, 7);
      const Problem p = problem_of(in, "fwd");
      const int64_t rows = (int64_t)cs.shape.batch * cs.shape.heads * cs.shape.seq_q;
      const FwdReference ref = forward_reference(cs.shape, in.q.data(), in.k.data(), in.v.data(),
                                                 ref::sample_rows(cs.shape, rows, 1));
      std::vector<float> o, lse;
      emulate_forward(in, Fault::none, o, lse);
      const Verdict ok = validate_forward(p, ref, o, lse);
      std::printf("  fwd %-32s %s worst err/bound %.3f\n", cs.name, to_string(t), ok.worst_ratio);
      EXPECT_TRUE(ok.ok) << ok.error;
      EXPECT_LT(ok.worst_ratio, kMargin) << "correct kernel too close to its bound";
      emulate_forward(in, Fault::skip_block, o, lse);
      if (cs.shape.seq_k > kBlockN || cs.shape.seq_k == 1) {  // with Sk = 1 the one block is skipped
        const Verdict bad = validate_forward(p, ref, o, lse);
        EXPECT_FALSE(bad.ok) << "skipped K/V block passed, worst " << bad.worst_ratio;
      }
      emulate_forward(in, Fault::perturb_row, o, lse, &ref);
      const Verdict bad = validate_forward(p, ref, o, lse);
      EXPECT_FALSE(bad.ok) << "perturbed row passed, worst " << bad.worst_ratio;
    }
}

TEST(Calibration, BackwardCorrectPassesWithMarginWrongFails) {
  for (const Case& cs : kCases)
    for (DType t : kDtypes) {
      if (cs.shape.seq_q * cs.shape.seq_k > 40000) continue;  // keep the float64 backward quick
      SCOPED_TRACE(std::string(cs.name) + " " + to_string(t));
      const Inputs in = make_inputs(cs.shape, t, cs.heavy, cs.scale, 11);
      const Problem p = problem_of(in, "bwd");
      const BwdReference ref = backward_reference(cs.shape, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
      std::vector<float> dq, dk, dv;
      emulate_backward(in, ref, Fault::none, dq, dk, dv);
      const Verdict ok = validate_backward(p, ref, dq, dk, dv);
      std::printf("  bwd %-32s %s worst err/bound %.3f\n", cs.name, to_string(t), ok.worst_ratio);
      EXPECT_TRUE(ok.ok) << ok.error;
      EXPECT_LT(ok.worst_ratio, kMargin) << ok.detail.dump();
      if (cs.shape.seq_k > kBlockN) {
        emulate_backward(in, ref, Fault::skip_block, dq, dk, dv);
        EXPECT_FALSE(validate_backward(p, ref, dq, dk, dv).ok) << "skipped K/V block passed";
      }
      emulate_backward(in, ref, Fault::perturb_row, dq, dk, dv);
      EXPECT_FALSE(validate_backward(p, ref, dq, dk, dv).ok) << "perturbed dK row passed";
    }
}

TEST(Validate, SkOneBackwardZeroReferences) {
  // dQ and dK are exactly zero (a softmax over one key has no gradient); rounding noise passes,
  // anything of the size of the data does not.
  const ref::Shape shape{1, 1, 64, 1, 64, false};
  for (DType t : kDtypes) {
    const Inputs in = make_inputs(shape, t, false, 1, 3);
    const BwdReference ref = backward_reference(shape, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
    for (double x : ref.dq) ASSERT_EQ(x, 0.0);
    std::vector<float> dq(ref.dq.size(), 0.f), dk(ref.dk.size(), 0.f), dv(ref.dv.begin(), ref.dv.end());
    for (float& x : dv) x = round_to(t, x);
    dq[5] = 1e-7f;  // fp32 noise of dP - delta
    EXPECT_TRUE(validate_backward(problem_of(in, "bwd"), ref, dq, dk, dv).ok);
    dq[5] = 1.0f;  // the size of a gradient of unit data
    EXPECT_FALSE(validate_backward(problem_of(in, "bwd"), ref, dq, dk, dv).ok);
  }
}

TEST(Validate, MaskedRowsNaNAndInf) {
  const ref::Shape shape{1, 1, 100, 30, 32, true};  // rows 0..69 see no key: O = 0, LSE = +inf
  const Inputs in = make_inputs(shape, DType::fp16, false, 1, 5);
  const Problem p = problem_of(in, "fwd");
  const FwdReference ref = forward_reference(shape, in.q.data(), in.k.data(), in.v.data(), ref::sample_rows(shape, 100, 1));
  ASSERT_TRUE(std::isinf(ref.lse[0]));
  std::vector<float> o, lse;
  emulate_forward(in, Fault::none, o, lse);
  ASSERT_TRUE(validate_forward(p, ref, o, lse).ok);
  auto with = [&](std::vector<float> o2, std::vector<float> lse2) { return validate_forward(p, ref, o2, lse2); };
  std::vector<float> o2 = o, lse2 = lse;
  o2[3] = 1e-3f;  // a masked row's O must be exactly 0 (its magnitude is 0)
  EXPECT_FALSE(with(o2, lse).ok);
  lse2[0] = 0.f;  // a masked row's LSE must be +inf
  EXPECT_FALSE(with(o, lse2).ok);
  o2 = o;
  o2[o.size() - 1] = NAN;  // unwritten
  const Verdict v = with(o2, lse);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.error.find("NaN"), std::string::npos);
  o2[o.size() - 1] = INFINITY;
  EXPECT_FALSE(with(o2, lse).ok);
  lse2 = lse;
  lse2[99] = NAN;
  EXPECT_FALSE(with(o, lse2).ok);
  // A NaN in a row that is not sampled is still found: every O element is scanned.
  const FwdReference few = forward_reference(shape, in.q.data(), in.k.data(), in.v.data(), {99});
  o2 = o;
  o2[80 * 32] = NAN;
  EXPECT_TRUE(validate_forward(p, few, o, lse).ok);
  EXPECT_FALSE(validate_forward(p, few, o2, lse).ok);
}

TEST(Validate, SaturatedSoftmaxAndLargeMagnitudes) {
  // x30: scores in the thousands, a one-hot softmax; the bound follows |V| (~30), not 1.
  const ref::Shape shape{1, 1, 16, 128, 64, false};
  const Inputs in = make_inputs(shape, DType::bf16, false, 30, 9);
  const FwdReference ref = forward_reference(shape, in.q.data(), in.k.data(), in.v.data(), ref::sample_rows(shape, 16, 1));
  double max_mag = 0;
  for (double m : ref.o_mag) max_mag = std::max(max_mag, m);
  EXPECT_GT(max_mag, 30.0);
  const ToleranceModel tol = forward_tolerance(DType::bf16, 128, 64);
  EXPECT_GT(tol.bound(max_mag, 0), 0.27) << "torch flash's own bf16 error on such inputs (0.255) must pass";
}

TEST(InputFiles, NonFiniteValuesFound) {
  const float f32[] = {1.f, -2.f, NAN};
  EXPECT_EQ(first_non_finite(reinterpret_cast<const uint8_t*>(f32), 8, DType::fp32), -1);
  EXPECT_EQ(first_non_finite(reinterpret_cast<const uint8_t*>(f32), 12, DType::fp32), 2);
  const uint16_t h[] = {0x3c00, 0x7c00};  // 1, +inf in fp16
  EXPECT_EQ(first_non_finite(reinterpret_cast<const uint8_t*>(h), 4, DType::fp16), 1);
  const uint16_t b[] = {0x3f80, 0x7c00, 0xff80};  // 1, a finite bf16 (2^121), -inf
  EXPECT_EQ(first_non_finite(reinterpret_cast<const uint8_t*>(b), 6, DType::bf16), 2);
}

// The forward's generated inputs at scale (validate.hpp, forward_distinct_units): every committed
// forward problem but the decoding grid's largest keeps every head distinct (its inputs as before);
// those tile, with host inputs (float values and 16-bit bytes of Q, K, V) far below a 128 GiB machine,
// and still Hk or more distinct kv heads.
TEST(Validate, ForwardInputsTileDistinctUnitsAtScale) {
  Problem small;
  small.batch = 4, small.heads = 16, small.seq_q = small.seq_k = 4096, small.head_dim = 128;
  EXPECT_EQ(forward_distinct_units(small), 64);
  for (const auto& e : std::filesystem::directory_iterator(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/problems")) {
    if (e.path().extension() != ".json" || e.path().filename() == "decode_bf16.json" ||
        e.path().filename() == "decode_paged_bf16.json" ||  // the same shapes from a paged cache
        e.path().filename() == "decode_paged_nhd_bf16.json")  // and from token-major pages
      continue;
    for (const Problem& p : load_problems(e.path().string()))
      if (p.direction == "fwd")
        EXPECT_EQ(forward_distinct_units(p), p.batch * p.kv_heads()) << e.path().filename() << " " << p.str();
  }
  auto decode = load_problems(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/problems/decode_bf16.json");
  for (const char* paged : {"decode_paged_bf16.json", "decode_paged_nhd_bf16.json"})
    for (const Problem& p : load_problems(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/problems/" + paged))
      decode.push_back(p);
  ASSERT_FALSE(decode.empty());
  int tiled = 0;
  for (const Problem& p : decode) {
    SCOPED_TRACE(p.str());
    const int64_t bhk = (int64_t)p.batch * p.kv_heads(), units = forward_distinct_units(p);
    const int64_t unit_q = (int64_t)p.group() * p.seq_q * p.head_dim, unit_k = (int64_t)p.seq_k * p.head_dim;
    EXPECT_LE(units * std::max(unit_q, unit_k), kMaxFwdDistinctElements);
    EXPECT_GE(units, std::min<int64_t>(bhk, p.kv_heads()));
    const double host_bytes = 6.0 * units * (unit_q + 2 * unit_k);  // float values + 16-bit bytes
    EXPECT_LT(host_bytes, 16e9);
    tiled += units < bhk;
    if (p.batch * p.seq_k <= 8 * 131072) EXPECT_EQ(units, bhk);  // up to B = 8 at 128k: every head distinct
  }
  EXPECT_GT(tiled, 0);  // B = 64 at 32k and 128k
  Problem huge = decode.back();
  huge.batch = 64, huge.seq_k = 131072;
  EXPECT_EQ(forward_distinct_units(huge), 64);
}

// The tiled reference is the reference of the tiled tensors, row for row, bit for bit: grouped-query
// and multi-head, causal and not, a tiling that divides the heads and one that leaves a partial run.
TEST(Validate, TiledForwardReferenceIsTheTiledTensorsReference) {
  std::mt19937 gen(7);
  std::normal_distribution<float> nd;
  for (int hk : {2, 0})
    for (bool causal : {false, true}) {
      ref::Shape full{3, 4, 5, 37, 16, causal};
      full.heads_k = hk;
      const int g = full.group_size(), bhk = full.batch * full.kv_heads();
      for (int units : {2, 4, bhk}) {
        SCOPED_TRACE("heads_k " + std::to_string(hk) + (causal ? " causal" : "") + " units " + std::to_string(units));
        const size_t unit_q = (size_t)g * full.seq_q * full.head_dim, unit_k = (size_t)full.seq_k * full.head_dim;
        std::vector<float> q(unit_q * units), k(unit_k * units), v(unit_k * units);
        for (auto* t : {&q, &k, &v})
          for (auto& x : *t) x = nd(gen);
        std::vector<float> fq(unit_q * bhk), fk(unit_k * bhk), fv(unit_k * bhk);  // what the device holds
        for (int i = 0; i < bhk; ++i) {
          std::copy_n(q.begin() + (i % units) * unit_q, unit_q, fq.begin() + i * unit_q);
          std::copy_n(k.begin() + (i % units) * unit_k, unit_k, fk.begin() + i * unit_k);
          std::copy_n(v.begin() + (i % units) * unit_k, unit_k, fv.begin() + i * unit_k);
        }
        std::vector<int64_t> rows(full.q_rows());
        for (size_t r = 0; r < rows.size(); ++r) rows[r] = (int64_t)(rows.size() - 1 - r);  // any order
        const FwdReference want = forward_reference(full, fq.data(), fk.data(), fv.data(), rows);
        const FwdReference got = tiled_forward_reference(full, units, q.data(), k.data(), v.data(), rows);
        EXPECT_EQ(got.rows, want.rows);
        EXPECT_EQ(got.o, want.o);
        EXPECT_EQ(got.o_mag, want.o_mag);
        EXPECT_EQ(got.o_logit, want.o_logit);
        EXPECT_EQ(got.lse, want.lse);
        EXPECT_EQ(got.lse_mag, want.lse_mag);
        EXPECT_EQ(got.max_abs_v, want.max_abs_v);
      }
    }
}

// ---- Packed variable-length batches: packing, the sampled reference, the validation of packed outputs ----

namespace {

// Token-major (total, heads, d) inputs of a packed problem, rounded to its dtype.
std::vector<float> packed_input(size_t n, DType t, std::mt19937& gen) {
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (auto& v : x) v = round_to(t, nd(gen));
  return x;
}

Problem varlen_problem(const char* varlen, DType t, bool causal, const char* direction = "fwd") {
  const std::string text = std::string(R"({"problems":[{"heads":4,"heads_k":2,"head_dim":64,"varlen":)") + varlen +
                           R"(,"dtype":")" + to_string(t) + R"(","causal":)" + (causal ? "true" : "false") +
                           R"(,"direction":")" + direction + R"("}]})";
  return problems_from_json(nlohmann::json::parse(text)).at(0);
}

// A correct kernel on a packed batch: each (sequence, head) as its own dense problem through
// emulate_forward (the kv head's rows repeated for the query head), O scattered to (total_q, H, d) and LSE
// to (H, total_q). shift_keys: the bug of reading keys from one token too far (a wrong sequence offset).
void emulate_varlen_forward(const Problem& p, const std::vector<float>& q, const std::vector<float>& k,
                            const std::vector<float>& v, std::vector<float>& o, std::vector<float>& lse,
                            int shift_keys = 0) {
  const int H = p.heads, Hk = p.kv_heads(), d = p.head_dim, g = p.group();
  const auto cq = p.varlen.cu_seqlens_q(), ck = p.varlen.cu_seqlens_k();
  const int64_t total_q = cq.back(), total_k = ck.back();
  o.assign((size_t)total_q * H * d, NAN);
  lse.assign((size_t)total_q * H, NAN);
  for (size_t b = 0; b + 1 < cq.size(); ++b) {
    const int lq = cq[b + 1] - cq[b], lk = ck[b + 1] - ck[b];
    if (lq == 0) continue;
    for (int h = 0; h < H; ++h) {
      Inputs in{ref::Shape{1, 1, lq, std::max(lk, 1), d, p.causal}, p.dtype, {}, {}, {}, {}};
      for (int t = 0; t < lq; ++t)
        in.q.insert(in.q.end(), q.begin() + ((cq[b] + t) * (size_t)H + h) * d, q.begin() + ((cq[b] + t) * (size_t)H + h + 1) * d);
      for (int t = 0; t < lk; ++t) {
        const int64_t tok = std::min<int64_t>(ck[b] + t + shift_keys, total_k - 1);
        in.k.insert(in.k.end(), k.begin() + (tok * Hk + h / g) * d, k.begin() + (tok * Hk + h / g + 1) * d);
        in.v.insert(in.v.end(), v.begin() + (tok * Hk + h / g) * d, v.begin() + (tok * Hk + h / g + 1) * d);
      }
      std::vector<float> oo, ll;
      if (lk == 0) {  // no keys: O = 0, LSE = +inf
        oo.assign((size_t)lq * d, 0.f), ll.assign(lq, INFINITY);
      } else {
        emulate_forward(in, Fault::none, oo, ll);
      }
      for (int t = 0; t < lq; ++t) {
        std::copy_n(oo.begin() + (size_t)t * d, d, o.begin() + ((cq[b] + t) * (size_t)H + h) * d);
        lse[(size_t)h * total_q + cq[b] + t] = ll[t];
      }
    }
  }
}

}  // namespace

// Where sequence b lives in the packed tensors (the kernels' VarlenSeq, host-compiled).
TEST(Varlen, SequenceAddressing) {
  const int cu_q[] = {0, 3, 3, 10}, cu_k[] = {0, 5, 6, 6};
  VarlenParams<AttnFwdParams> p{};
  p.batch = 3, p.heads = 8, p.heads_k = 2, p.cu_seqlens_q = cu_q, p.cu_seqlens_k = cu_k;
  const VarlenSeq s = VarlenSeq::of<true>(p, 2);
  EXPECT_EQ(s.seq_q, 7);
  EXPECT_EQ(s.seq_k, 0);
  EXPECT_EQ(s.total_q, 10);
  EXPECT_EQ(s.q_offset(8, 5, 64), (3 * 8 + 5) * 64);  // token 3, head 5: rows of H*d elements
  EXPECT_EQ(s.k_offset(2, 1, 64), (6 * 2 + 1) * 64);
  EXPECT_EQ(s.lse_offset(5), 5 * 10 + 3);  // lse (H, total_q)
  const VarlenSeq dense = VarlenSeq::of<false>(AttnFwdParams{}, 0);
  EXPECT_EQ(dense.seq_q, 0);
  // The packed argument starts with the dense one: a caller filling those bytes keeps their meaning.
  static_assert(offsetof(VarlenParams<AttnBwdParams>, heads_k) == offsetof(AttnBwdParams, heads_k));
  EXPECT_GE(offsetof(VarlenParams<AttnBwdParams>, cu_seqlens_q), sizeof(AttnBwdParams));
}

// The sampled rows hold every sequence's first, middle and last tokens (heads 0 and H - 1), sorted and
// unique, deterministic; all rows when they fit.
TEST(Varlen, SampledRowsCoverSequenceBoundaries) {
  const Problem p = varlen_problem(R"({"seq_lens":[1,17,0,130,2]})", DType::bf16, true);
  EXPECT_EQ(varlen_sample_rows(p, 10000, 1).size(), (size_t)p.rows_q());
  const auto rows = varlen_sample_rows(p, 200, 1);
  ASSERT_EQ(rows.size(), 200u);
  EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
  EXPECT_EQ(std::adjacent_find(rows.begin(), rows.end()), rows.end());
  EXPECT_EQ(rows, varlen_sample_rows(p, 200, 1));
  EXPECT_NE(rows, varlen_sample_rows(p, 200, 2));
  const auto cq = p.varlen.cu_seqlens_q();
  for (size_t b = 0; b + 1 < cq.size(); ++b)
    if (cq[b + 1] > cq[b])
      for (int64_t t : {cq[b], cq[b + 1] - 1})
        for (int64_t h : {0, p.heads - 1})
          EXPECT_TRUE(std::binary_search(rows.begin(), rows.end(), t * p.heads + h)) << "token " << t << " head " << h;
}

// The sampled reference is ref::forward_varlen's rows bit for bit; a correct packed kernel (emulated on
// the CPU) passes with margin, and a wrong sequence offset, a perturbed row, a swapped LSE or an unwritten
// row fails, in fp16 and bf16, causal and not, with empty and key-less sequences.
TEST(Varlen, ForwardValidationOfPackedOutputs) {
  std::mt19937 gen(3);
  for (DType t : {DType::fp16, DType::bf16})
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(to_string(t)) + (causal ? " causal" : ""));
      const Problem p = varlen_problem(R"({"seq_lens":[1,17,0,130,64],"seq_lens_k":[1,40,5,129,0]})", t, causal);
      const size_t nq = (size_t)p.varlen.total_q() * p.heads * p.head_dim,
                   nk = (size_t)p.varlen.total_k() * p.kv_heads() * p.head_dim;
      const auto q = packed_input(nq, t, gen), k = packed_input(nk, t, gen), v = packed_input(nk, t, gen);
      // Every row: the reference equals forward_varlen's.
      const FwdReference all = varlen_forward_reference(p, q.data(), k.data(), v.data(), varlen_sample_rows(p, 1 << 20, 0));
      {
        ref::VarlenShape vs{p.heads, p.head_dim, p.causal, 0, p.heads_k};
        const auto cq = p.varlen.cu_seqlens_q(), ck = p.varlen.cu_seqlens_k();
        const std::vector<int32_t> cu_q(cq.begin(), cq.end()), cu_k(ck.begin(), ck.end());
        std::vector<double> o(nq), lse((size_t)p.rows_q());
        ref::forward_varlen(vs, cu_q, cu_k, q.data(), k.data(), v.data(), o.data(), lse.data());
        ASSERT_EQ(all.rows.size(), (size_t)p.rows_q());
        for (size_t r = 0; r < all.rows.size(); ++r) {
          ASSERT_EQ(all.lse[r], lse[all.lse_index[r]]) << r;
          for (int c = 0; c < p.head_dim; ++c) ASSERT_EQ(all.o[r * p.head_dim + c], o[all.rows[r] * p.head_dim + c]);
        }
      }
      const FwdReference ref = varlen_forward_reference(p, q.data(), k.data(), v.data(), varlen_sample_rows(p, 300, 5));
      std::vector<float> o, lse;
      emulate_varlen_forward(p, q, k, v, o, lse);
      const Verdict ok = validate_forward(p, ref, o, lse);
      EXPECT_TRUE(ok.ok) << ok.error;
      EXPECT_LT(ok.worst_ratio, kMargin);
      EXPECT_TRUE(validate_forward(p, all, o, lse).ok);
      std::vector<float> bad_o, bad_lse;
      emulate_varlen_forward(p, q, k, v, bad_o, bad_lse, 1);  // keys one token off
      EXPECT_FALSE(validate_forward(p, ref, bad_o, bad_lse).ok) << "shifted keys passed";
      bad_o = o;
      const size_t row = (size_t)(p.varlen.cu_seqlens_q()[2] - 1) * p.heads;  // last token of sequence 1, head 0
      for (int c = 0; c < p.head_dim; ++c) bad_o[row * p.head_dim + c] += 0.05f * (1 + std::fabs(bad_o[row * p.head_dim + c]));
      EXPECT_FALSE(validate_forward(p, ref, bad_o, lse).ok) << "perturbed boundary row passed";
      bad_lse = lse;
      std::swap(bad_lse[1], bad_lse[2]);  // head 0: sequence 0's token and sequence 1's first
      EXPECT_FALSE(validate_forward(p, ref, o, bad_lse).ok) << "swapped LSE passed";
      bad_o = o;
      bad_o.back() = NAN;  // an unwritten element, whether sampled or not
      EXPECT_FALSE(validate_forward(p, ref, bad_o, lse).ok) << "unwritten O passed";
    }
}

// The backward's distinct heads repeated inside every token: the packed gradients of the repeated inputs,
// computed in full, pass against the distinct-heads reference element by element (the index mapping);
// a gradient of a later head moved, or a sequence's dK rows zeroed, fails.
namespace {
// Token-major rows of `distinct` heads of d values, widened to `heads` heads: head h repeats head h % distinct (the
// packed backward's inputs, whose query heads repeat within every token).
std::vector<float> repeat_heads(const std::vector<float>& x, int64_t tokens, int distinct, int heads, int d) {
  std::vector<float> out((size_t)tokens * heads * d);
  for (int64_t tok = 0; tok < tokens; ++tok)
    for (int h = 0; h < heads; ++h)
      std::copy_n(x.begin() + ((size_t)tok * distinct + h % distinct) * d, d, out.begin() + ((size_t)tok * heads + h) * d);
  return out;
}
}  // namespace

TEST(Varlen, BackwardValidationOfRepeatedHeads) {
  std::mt19937 gen(5);
  const DType t = DType::bf16;
  const Problem p = varlen_problem(R"({"seq_lens":[3,0,70,33],"seq_lens_k":[5,4,70,0]})", t, true, "bwd");
  const int H = p.heads, Hk = p.kv_heads(), d = p.head_dim, units = 1, hd = units * p.group();
  const int64_t tq = p.varlen.total_q(), tk = p.varlen.total_k();
  const auto q = packed_input((size_t)tq * hd * d, t, gen), k = packed_input((size_t)tk * units * d, t, gen),
             v = packed_input((size_t)tk * units * d, t, gen), dout = packed_input((size_t)tq * hd * d, t, gen);
  const BwdReference ref = varlen_backward_reference(p, hd, units, q.data(), k.data(), v.data(), dout.data());
  const auto fq = repeat_heads(q, tq, hd, H, d), fk = repeat_heads(k, tk, units, Hk, d),
             fv = repeat_heads(v, tk, units, Hk, d), fdo = repeat_heads(dout, tq, hd, H, d);
  ref::VarlenShape vs{H, d, p.causal, 0, p.heads_k};
  const auto cq = p.varlen.cu_seqlens_q(), ck = p.varlen.cu_seqlens_k();
  const std::vector<int32_t> cu_q(cq.begin(), cq.end()), cu_k(ck.begin(), ck.end());
  std::vector<double> dq(fq.size()), dk(fk.size()), dv(fv.size());
  ref::backward_varlen(vs, cu_q, cu_k, fq.data(), fk.data(), fv.data(), fdo.data(), dq.data(), dk.data(), dv.data());
  auto rounded = [&](const std::vector<double>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = round_to(t, (float)x[i]);
    return out;
  };
  const auto gq = rounded(dq), gk = rounded(dk), gv = rounded(dv);
  const Verdict ok = validate_backward(p, ref, gq, gk, gv);
  EXPECT_TRUE(ok.ok) << ok.error;
  auto moved = gk;
  const size_t tok = (size_t)ck[2] + 10, e = (tok * Hk + (Hk - 1)) * d + 3;  // sequence 2's keys, the last kv head
  moved[e] += 0.05f * (1 + std::fabs(moved[e])) + (float)(0.05 * ref.dk_mag[(tok * units + (Hk - 1) % units) * d + 3]);
  EXPECT_FALSE(validate_backward(p, ref, gq, moved, gv).ok) << "moved dK element passed";
  auto zeroed = gv;
  for (int64_t tok = ck[2]; tok < ck[3]; ++tok)
    for (int c = 0; c < Hk * d; ++c) zeroed[(size_t)tok * Hk * d + c] = 0.f;
  EXPECT_FALSE(validate_backward(p, ref, gq, gk, zeroed).ok) << "zeroed dV rows passed";
}

namespace {

// A packed ALiBi backward problem of `heads` query heads over `heads_k` kv heads (bf16, head_dim 32).
Problem alibi_varlen_problem(const char* varlen, int heads, int heads_k, bool causal) {
  const std::string text = R"({"problems":[{"heads":)" + std::to_string(heads) + R"(,"heads_k":)" +
                           std::to_string(heads_k) + R"(,"head_dim":32,"varlen":)" + varlen +
                           R"(,"dtype":"bf16","causal":)" + (causal ? "true" : "false") +
                           R"(,"alibi":true,"direction":"bwd"}]})";
  return problems_from_json(nlohmann::json::parse(text)).at(0);
}

}  // namespace

// ALiBi in the packed backward's reference: each sequence's elements are the dense backward reference of that
// sequence alone with that sequence's slopes, bit for bit (O, LSE, the gradients and their magnitudes), for slopes
// [H] (stride 0) and [sequences, H] (stride the problem's H, past the distinct heads, as the runner's), causal and
// not, multi-head, grouped and multi-query, with a sequence without queries, one without keys, Sq != Sk both ways.
TEST(Varlen, AlibiBackwardReferenceIsTheDenseOnePerSequence) {
  std::mt19937 gen(11);
  const DType t = DType::bf16;
  const char* lens = R"({"seq_lens":[3,0,40,17,6],"seq_lens_k":[5,4,33,0,21]})";
  struct Heads {
    int heads, heads_k, units;  // the problem's; the reference's distinct kv heads
  };
  for (const Heads& hh : {Heads{2, 2, 2}, Heads{4, 2, 1}, Heads{4, 1, 1}, Heads{6, 3, 2}})
    for (bool causal : {false, true})
      for (bool per_sequence : {false, true}) {
        const Problem p = alibi_varlen_problem(lens, hh.heads, hh.heads_k, causal);
        SCOPED_TRACE(p.str() + (per_sequence ? " slopes [sequences, H]" : " slopes [H]"));
        const int units = hh.units, hd = units * p.group(), d = p.head_dim;
        const auto cq = p.varlen.cu_seqlens_q(), ck = p.varlen.cu_seqlens_k();
        const int64_t tq = cq.back(), tk = ck.back();
        const auto q = packed_input((size_t)tq * hd * d, t, gen), k = packed_input((size_t)tk * units * d, t, gen),
                   v = packed_input((size_t)tk * units * d, t, gen), dout = packed_input((size_t)tq * hd * d, t, gen);
        const int64_t stride = per_sequence ? p.heads : 0;
        std::vector<float> slopes((size_t)(per_sequence ? p.batch * stride : hd));
        for (size_t x = 0; x < slopes.size(); ++x)  // every (sequence, head) its own
          slopes[x] = (float)(std::exp2(-8.0 * (double)(x % p.heads + 1) / p.heads) * (1.0 + 0.5 * (x / p.heads)));
        const BwdReference r =
            varlen_backward_reference(p, hd, units, q.data(), k.data(), v.data(), dout.data(), 0, slopes.data(), stride);
        size_t bad = 0;
        std::string first;
        auto expect = [&](const char* what, double got, double want, int64_t at) {
          if (got == want || (std::isnan(got) && std::isnan(want))) return;
          if (bad++ == 0)
            first = std::string(what) + "[" + std::to_string(at) + "] " + std::to_string(got) + " vs " + std::to_string(want);
        };
        for (size_t b = 0; b + 1 < cq.size(); ++b) {
          const int lq = cq[b + 1] - cq[b], lk = ck[b + 1] - ck[b];
          if (lq == 0 || lk == 0) {  // no queries: dK = dV = 0; no keys: O = 0, LSE = +inf, dQ = 0
            for (int64_t e = (int64_t)ck[b] * units * d; e < (int64_t)ck[b + 1] * units * d; ++e)
              expect("dk", r.dk[e], 0, e), expect("dv", r.dv[e], 0, e);
            for (int64_t e = (int64_t)cq[b] * hd * d; e < (int64_t)cq[b + 1] * hd * d; ++e)
              expect("dq", r.dq[e], 0, e), expect("o", r.o[e], 0, e);
            for (int h = 0; h < hd; ++h)
              for (int i = 0; i < lq; ++i) expect("lse", r.lse[h * tq + cq[b] + i], INFINITY, h * tq + cq[b] + i);
            continue;
          }
          // The sequence as a dense (1, hd, lq, d) problem over (1, units, lk, d) keys, with its slopes.
          std::vector<float> sq((size_t)hd * lq * d), sdo(sq.size()), sk((size_t)units * lk * d), sv(sk.size());
          for (int h = 0; h < hd; ++h)
            for (int i = 0; i < lq; ++i) {
              std::copy_n(q.begin() + ((cq[b] + i) * (size_t)hd + h) * d, d, sq.begin() + ((size_t)h * lq + i) * d);
              std::copy_n(dout.begin() + ((cq[b] + i) * (size_t)hd + h) * d, d, sdo.begin() + ((size_t)h * lq + i) * d);
            }
          for (int h = 0; h < units; ++h)
            for (int j = 0; j < lk; ++j) {
              std::copy_n(k.begin() + ((ck[b] + j) * (size_t)units + h) * d, d, sk.begin() + ((size_t)h * lk + j) * d);
              std::copy_n(v.begin() + ((ck[b] + j) * (size_t)units + h) * d, d, sv.begin() + ((size_t)h * lk + j) * d);
            }
          ref::Shape one{1, hd, lq, lk, d, p.causal};
          one.heads_k = units == hd ? 0 : units;
          one.alibi_slopes = slopes.data() + b * stride;
          const BwdReference want = backward_reference(one, sq.data(), sk.data(), sv.data(), sdo.data());
          for (int h = 0; h < hd; ++h)
            for (int i = 0; i < lq; ++i) {
              const int64_t pr = (cq[b] + i) * (int64_t)hd + h, dr = (int64_t)h * lq + i;  // packed and dense rows
              expect("lse", r.lse[h * tq + cq[b] + i], want.lse[dr], h * tq + cq[b] + i);
              for (int c = 0; c < d; ++c) {
                const int64_t e = pr * d + c, w = dr * d + c;
                expect("o", r.o[e], want.o[w], e), expect("dq", r.dq[e], want.dq[w], e);
                expect("dq_mag", r.dq_mag[e], want.dq_mag[w], e), expect("dq_logit", r.dq_logit[e], want.dq_logit[w], e);
              }
            }
          for (int h = 0; h < units; ++h)
            for (int j = 0; j < lk; ++j)
              for (int c = 0; c < d; ++c) {
                const int64_t e = ((ck[b] + j) * (int64_t)units + h) * d + c, w = ((int64_t)h * lk + j) * d + c;
                expect("dk", r.dk[e], want.dk[w], e), expect("dv", r.dv[e], want.dv[w], e);
                expect("dk_logit", r.dk_logit[e], want.dk_logit[w], e), expect("dv_mag", r.dv_mag[e], want.dv_mag[w], e);
              }
        }
        EXPECT_EQ(bad, 0u) << first;
      }
  const Problem p = alibi_varlen_problem(lens, 4, 2, true);
  std::vector<float> x((size_t)p.varlen.total_q() * 4 * 32, 0.5f);
  EXPECT_THROW(varlen_backward_reference(p, 4, 2, x.data(), x.data(), x.data(), x.data()), std::runtime_error);
}

// The packed backward's slopes as the runner uploads them (varlen_backward_alibi_slopes, [B, H]) and as its
// reference reads them: a packed ALiBi kernel (emulated on the CPU, every problem head, the slopes read at
// b * H + h) passes against the distinct-heads reference; one that reads sequence 0's slopes for every sequence
// (batch stride 0), or gives each repeated head a slope of its own, fails.
TEST(Varlen, AlibiBackwardValidationOfRepeatedHeads) {
  std::mt19937 gen(13);
  const DType t = DType::bf16;
  // Sequence 1 (odd: its slopes doubled, seeded_alibi_slopes) has queries and keys, so its slopes tell.
  const Problem p = alibi_varlen_problem(R"({"seq_lens":[3,70,0,33],"seq_lens_k":[5,60,4,0]})", 4, 2, true);
  const int H = p.heads, Hk = p.kv_heads(), d = p.head_dim, units = 1, hd = units * p.group();
  const int64_t tq = p.varlen.total_q(), tk = p.varlen.total_k();
  // Sequence b's head h: the packed forward's slope of sequence b's head h % hd.
  const std::vector<float> slopes = varlen_backward_alibi_slopes(p, hd),
                           own = seeded_alibi_slopes((long long)p.batch * H, H, (long long)p.batch * H);
  ASSERT_EQ(slopes.size(), (size_t)p.batch * H);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < H; ++h) EXPECT_EQ(slopes[(size_t)b * H + h], own[(size_t)b * H + h % hd]) << b << " " << h;
  EXPECT_NE(slopes[0], slopes[H]);  // sequences differ
  EXPECT_EQ(varlen_backward_alibi_slopes(p, H), own);  // every head distinct: the packed forward's slopes
  const auto q = packed_input((size_t)tq * hd * d, t, gen), k = packed_input((size_t)tk * units * d, t, gen),
             v = packed_input((size_t)tk * units * d, t, gen), dout = packed_input((size_t)tq * hd * d, t, gen);
  const BwdReference ref =
      varlen_backward_reference(p, hd, units, q.data(), k.data(), v.data(), dout.data(), 0, slopes.data(), H);
  const auto fq = repeat_heads(q, tq, hd, H, d), fk = repeat_heads(k, tk, units, Hk, d),
             fv = repeat_heads(v, tk, units, Hk, d), fdo = repeat_heads(dout, tq, hd, H, d);
  const auto cq = p.varlen.cu_seqlens_q(), ck = p.varlen.cu_seqlens_k();
  const std::vector<int32_t> cu_q(cq.begin(), cq.end()), cu_k(ck.begin(), ck.end());
  // The kernel's gradients, rounded to bf16, with its slopes at alibi[b * stride + h].
  auto kernel = [&](const float* alibi, int64_t stride) {
    ref::VarlenShape vs{H, d, p.causal, 0, p.heads_k};
    vs.alibi_slopes = alibi, vs.alibi_batch_stride = stride;
    std::vector<double> dq(fq.size()), dk(fk.size()), dv(fv.size());
    ref::backward_varlen(vs, cu_q, cu_k, fq.data(), fk.data(), fv.data(), fdo.data(), dq.data(), dk.data(), dv.data());
    std::array<std::vector<float>, 3> g;
    for (int i = 0; i < 3; ++i) {
      const std::vector<double>& x = i == 0 ? dq : i == 1 ? dk : dv;
      g[i].resize(x.size());
      for (size_t e = 0; e < x.size(); ++e) g[i][e] = round_to(t, (float)x[e]);
    }
    return g;
  };
  const auto ok = kernel(slopes.data(), H);
  const Verdict v_ok = validate_backward(p, ref, ok[0], ok[1], ok[2]);
  EXPECT_TRUE(v_ok.ok) << v_ok.error;
  EXPECT_LT(v_ok.worst_ratio, kMargin);
  const auto unbatched = kernel(slopes.data(), 0);
  EXPECT_FALSE(validate_backward(p, ref, unbatched[0], unbatched[1], unbatched[2]).ok) << "sequence 0's slopes passed";
  const auto per_head = kernel(own.data(), H);
  EXPECT_FALSE(validate_backward(p, ref, per_head[0], per_head[1], per_head[2]).ok) << "per-head slopes passed";
}

// ---- Paged K/V caches: the reference reads the logical cache, sequence by sequence ----

namespace {

Problem paged_problem(const char* paged, DType t, bool causal, int seq_q = 3) {
  const std::string text = R"({"problems":[{"heads":4,"heads_k":2,"seq_q":)" + std::to_string(seq_q) +
                           R"(,"head_dim":16,"dtype":")" + to_string(t) + R"(","causal":)" + (causal ? "true" : "false") +
                           (std::string(paged).find("seq_lens_k") == std::string::npos ? R"(,"batch":3,"seq_k":40)" : "") +
                           R"(,"paged":)" + paged + "}]}";
  return problems_from_json(nlohmann::json::parse(text)).at(0);
}

// A correct kernel on a paged cache: each (sequence, query head) as its own dense problem of Sk = its length
// through emulate_forward, from the logical K/V (every (batch, kv head) its own unit). ignore_lengths: the bug
// of reading every sequence's keys up to the longest (Sk); cache_of (when given): sequence b reads sequence
// cache_of[b]'s keys (a wrong block-table row).
void emulate_paged_forward(const Problem& p, const std::vector<float>& q, const std::vector<float>& k,
                           const std::vector<float>& v, std::vector<float>& o, std::vector<float>& lse,
                           bool ignore_lengths = false, const std::vector<int>& cache_of = {}) {
  const int H = p.heads, Hk = p.kv_heads(), d = p.head_dim, g = p.group(), Sq = p.seq_q;
  o.assign((size_t)p.rows_q() * d, NAN);
  lse.assign((size_t)p.rows_q(), NAN);
  for (int b = 0; b < p.batch; ++b) {
    const int len = ignore_lengths ? p.seq_k : p.paged.seq_len(b, p.seq_k);
    for (int h = 0; h < H; ++h) {
      const size_t row0 = ((size_t)b * H + h) * Sq, unit = (size_t)(cache_of.empty() ? b : cache_of[b]) * Hk + h / g;
      std::vector<float> oo, ll;
      if (len == 0) {
        oo.assign((size_t)Sq * d, 0.f), ll.assign(Sq, INFINITY);
      } else {
        Inputs in{ref::Shape{1, 1, Sq, len, d, p.causal}, p.dtype, {}, {}, {}, {}};
        in.q.assign(q.begin() + row0 * d, q.begin() + (row0 + Sq) * d);
        in.k.assign(k.begin() + unit * p.seq_k * d, k.begin() + (unit * p.seq_k + len) * d);
        in.v.assign(v.begin() + unit * p.seq_k * d, v.begin() + (unit * p.seq_k + len) * d);
        emulate_forward(in, Fault::none, oo, ll);
      }
      std::copy(oo.begin(), oo.end(), o.begin() + row0 * d);
      std::copy(ll.begin(), ll.end(), lse.begin() + row0);
    }
  }
}

}  // namespace

// Every sequence full: the paged reference is the dense one, bit for bit, tiled or not. With cache lengths:
// each row is its sequence's dense reference with Sk = its length (causal aligned to it), bit for bit; a
// sequence without keys gives O = 0, LSE = +inf.
TEST(Paged, ReferenceReadsEachSequencesLogicalKeys) {
  std::mt19937 gen(11);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const Problem full = paged_problem(R"({"page_size":16,"seed":3})", DType::bf16, causal);
    ref::Shape shape{full.batch, full.heads, full.seq_q, full.seq_k, full.head_dim, causal};
    shape.heads_k = full.heads_k;
    const int bhk = full.batch * full.kv_heads();
    const size_t unit_q = (size_t)full.group() * full.seq_q * full.head_dim, unit_k = (size_t)full.seq_k * full.head_dim;
    std::vector<int64_t> rows(shape.q_rows());
    for (size_t r = 0; r < rows.size(); ++r) rows[r] = (int64_t)r;
    for (int units : {2, bhk}) {
      const auto q = packed_input(unit_q * units, full.dtype, gen), k = packed_input(unit_k * units, full.dtype, gen),
                 v = packed_input(unit_k * units, full.dtype, gen);
      const FwdReference want = tiled_forward_reference(shape, units, q.data(), k.data(), v.data(), rows);
      const FwdReference got = paged_forward_reference(full, units, q.data(), k.data(), v.data(), rows);
      EXPECT_EQ(got.o, want.o) << units;
      EXPECT_EQ(got.o_mag, want.o_mag) << units;
      EXPECT_EQ(got.lse, want.lse) << units;
      EXPECT_EQ(got.lse_mag, want.lse_mag) << units;
    }

    const Problem p = paged_problem(R"({"page_size":16,"seed":3,"seq_lens_k":[37,0,1]})", DType::bf16, causal);
    ASSERT_EQ(p.seq_k, 37);
    const size_t uk = (size_t)p.seq_k * p.head_dim;
    const auto q = packed_input(unit_q * bhk, p.dtype, gen), k = packed_input(uk * bhk, p.dtype, gen),
               v = packed_input(uk * bhk, p.dtype, gen);
    const FwdReference got = paged_forward_reference(p, bhk, q.data(), k.data(), v.data(), rows);
    const int H = p.heads, Hk = p.kv_heads(), Sq = p.seq_q, d = p.head_dim;
    for (int b = 0; b < p.batch; ++b) {
      const int len = p.paged.seq_len(b, p.seq_k);
      std::vector<double> o((size_t)H * Sq * d, 0.0), lse((size_t)H * Sq, INFINITY);
      if (len > 0) {  // sequence b alone: (1, H, Sq, len, d) with its kv heads' first len keys
        ref::Shape one{1, H, Sq, len, d, causal};
        one.heads_k = Hk;
        std::vector<float> ks, vs;
        for (int hk = 0; hk < Hk; ++hk) {
          const size_t unit = (size_t)b * Hk + hk;
          ks.insert(ks.end(), k.begin() + unit * uk, k.begin() + unit * uk + (size_t)len * d);
          vs.insert(vs.end(), v.begin() + unit * uk, v.begin() + unit * uk + (size_t)len * d);
        }
        ref::forward(one, q.data() + (size_t)b * H * Sq * d, ks.data(), vs.data(), o.data(), lse.data());
      }
      for (int r = 0; r < H * Sq; ++r) {
        const size_t i = (size_t)b * H * Sq + r;
        ASSERT_EQ(got.lse[i], lse[r]) << "sequence " << b << " row " << r;
        for (int c = 0; c < d; ++c) ASSERT_EQ(got.o[i * d + c], o[(size_t)r * d + c]) << "sequence " << b << " row " << r;
        if (len == 0) EXPECT_EQ(got.lse_mag[i], 0.0);
      }
    }
  }
}

// A correct kernel on a paged cache (emulated) passes with margin in fp16 and bf16, causal and not; one that
// reads every sequence's keys up to the longest, or gives a sequence another's rows, fails.
TEST(Paged, ValidationTellsTheCacheLengthsApart) {
  std::mt19937 gen(13);
  for (DType t : {DType::fp16, DType::bf16})
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(to_string(t)) + (causal ? " causal" : ""));
      const Problem p = paged_problem(R"({"page_size":16,"seed":3,"seq_lens_k":[40,9,0]})", t, causal, 2);
      const int bhk = p.batch * p.kv_heads();
      const size_t unit_q = (size_t)p.group() * p.seq_q * p.head_dim, unit_k = (size_t)p.seq_k * p.head_dim;
      const auto q = packed_input(unit_q * bhk, t, gen), k = packed_input(unit_k * bhk, t, gen),
                 v = packed_input(unit_k * bhk, t, gen);
      ref::Shape shape{p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim, causal};
      shape.heads_k = p.heads_k;
      const FwdReference ref =
          paged_forward_reference(p, bhk, q.data(), k.data(), v.data(), ref::sample_rows(shape, 1 << 20, 0));
      std::vector<float> o, lse;
      emulate_paged_forward(p, q, k, v, o, lse);
      const Verdict ok = validate_forward(p, ref, o, lse);
      EXPECT_TRUE(ok.ok) << ok.error;
      EXPECT_LT(ok.worst_ratio, kMargin);
      std::vector<float> bad_o, bad_lse;
      emulate_paged_forward(p, q, k, v, bad_o, bad_lse, true);
      EXPECT_FALSE(validate_forward(p, ref, bad_o, bad_lse).ok) << "keys past the cache length passed";
      emulate_paged_forward(p, q, k, v, bad_o, bad_lse, false, {0, 0, 2});  // sequence 1 reads sequence 0's pages
      EXPECT_FALSE(validate_forward(p, ref, bad_o, bad_lse).ok) << "another sequence's keys passed";
    }
}

// An output read back short (the worker's host buffer saying 0 bytes after its first allocation: every backward
// validation of a fresh worker compared nothing and passed) is an error, never a pass.
TEST(Calibration, BackwardOutputReadBackShortIsAnError) {
  const Case& cs = kCases[0];
  const Inputs in = make_inputs(cs.shape, DType::bf16, cs.heavy, cs.scale, 11);
  const Problem p = problem_of(in, "bwd");
  const BwdReference ref = backward_reference(cs.shape, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
  std::vector<float> dq, dk, dv;
  emulate_backward(in, ref, Fault::none, dq, dk, dv);
  const std::vector<float> none;
  EXPECT_THROW(validate_backward(p, ref, none, dk, dv), std::invalid_argument);
  EXPECT_THROW(validate_backward(p, ref, dq, dk, std::vector<float>(dv.begin(), dv.begin() + dv.size() / 2)),
               std::invalid_argument);
  EXPECT_TRUE(validate_backward(p, ref, dq, dk, dv).ok);
}
