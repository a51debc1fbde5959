// The library baselines without a GPU: the unfused attention's cuBLAS GEMM geometry, run through a
// CPU emulation of cublasGemmStridedBatchedEx (column-major, op(A), op(B), leading dimensions,
// strides) and a CPU mirror of the softmax kernel, matches the float64 reference on ragged,
// causal and fully-masked-row shapes; the softmax/fill device code compiles with NVRTC for sm_80
// and sm_90 without spills and exports the kernels the worker looks up.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <regex>

#include "reference/attention_ref.hpp"
#include "worker/library_kernels.hpp"

using namespace flashtune;

namespace {

// cuBLAS semantics, column-major: C[i + j*ldc] = alpha * sum_l op(A)(i, l) * op(B)(l, j), per batch.
void gemm_emulated(const lib::GemmShape& g, float alpha, const float* a, const float* b, float* c) {
  // cuBLAS's own argument rules: leading dimensions cover the stored rows.
  ASSERT_GE(g.lda, g.trans_a ? g.k : g.m);
  ASSERT_GE(g.ldb, g.trans_b ? g.n : g.k);
  ASSERT_GE(g.ldc, g.m);
  for (int e = 0; e < g.batch; ++e) {
    const float* A = a + e * g.stride_a;
    const float* B = b + e * g.stride_b;
    float* C = c + e * g.stride_c;
    for (int j = 0; j < g.n; ++j)
      for (int i = 0; i < g.m; ++i) {
        double sum = 0;
        for (int l = 0; l < g.k; ++l) {
          const float av = g.trans_a ? A[l + (size_t)i * g.lda] : A[i + (size_t)l * g.lda];
          const float bv = g.trans_b ? B[j + (size_t)l * g.ldb] : B[l + (size_t)j * g.ldb];
          sum += (double)av * bv;
        }
        C[i + (size_t)j * g.ldc] = (float)(alpha * sum);
      }
  }
}

// What ft_unfused_softmax does per row (one block per row of S; bottom-right causal mask).
void softmax_mirror(const Problem& p, const std::vector<float>& s, std::vector<float>& prob, std::vector<float>& lse) {
  const size_t rows = (size_t)p.batch * p.heads * p.seq_q;
  for (size_t r = 0; r < rows; ++r) {
    const int i = (int)(r % p.seq_q);
    int visible = p.seq_k;
    if (p.causal) {
      const long long last = (long long)i + p.seq_k - p.seq_q;
      visible = last < 0 ? 0 : (int)std::min<long long>(last + 1, p.seq_k);
    }
    const float* srow = &s[r * p.seq_k];
    float m = -std::numeric_limits<float>::infinity(), l = 0;
    for (int j = 0; j < visible; ++j) m = std::max(m, srow[j]);
    for (int j = 0; j < visible; ++j) l += std::exp(srow[j] - m);
    lse[r] = visible ? m + std::log(l) : std::numeric_limits<float>::infinity();
    for (int j = 0; j < p.seq_k; ++j) prob[r * p.seq_k + j] = j < visible ? std::exp(srow[j] - m) / l : 0.f;
  }
}

void check_against_reference(const Problem& p) {
  SCOPED_TRACE(p.str());
  const size_t nq = (size_t)p.batch * p.heads * p.seq_q * p.head_dim;
  const size_t nk = (size_t)p.batch * p.heads * p.seq_k * p.head_dim;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> q(nq), k(nk), v(nk);
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = normal(rng);

  const size_t ns = lib::score_elements(p);
  std::vector<float> s(ns, NAN), prob(ns, NAN), o(nq, NAN), lse((size_t)p.batch * p.heads * p.seq_q, NAN);
  const float scale = (float)(1.0 / std::sqrt((double)p.head_dim));
  gemm_emulated(lib::scores_gemm(p), scale, k.data(), q.data(), s.data());  // A = K, B = Q, C = S
  softmax_mirror(p, s, prob, lse);
  gemm_emulated(lib::output_gemm(p), 1.f, v.data(), prob.data(), o.data());  // A = V, B = P, C = O

  std::vector<double> ref_o(nq), ref_lse(lse.size());
  ref::forward({p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim, p.causal}, q.data(), k.data(), v.data(), ref_o.data(),
               ref_lse.data());
  double worst = 0;
  for (size_t i = 0; i < nq; ++i) worst = std::max(worst, std::fabs(o[i] - ref_o[i]));
  EXPECT_LT(worst, 1e-5);
  size_t masked = 0;
  for (size_t r = 0; r < lse.size(); ++r) {
    if (std::isinf(ref_lse[r])) {
      ++masked;
      EXPECT_EQ(lse[r], ref_lse[r]) << "row " << r;
    } else {
      EXPECT_NEAR(lse[r], ref_lse[r], 1e-4) << "row " << r;
    }
  }
  if (p.causal && p.seq_q > p.seq_k) EXPECT_GT(masked, 0u) << "the shape was meant to have fully masked rows";
}

}  // namespace

TEST(LibraryGeometry, UnfusedMatchesReference) {
  // Ragged, both aspect ratios, causal and not; Sq > Sk causal has fully masked rows.
  check_against_reference(Problem{2, 3, 37, 53, 16, DType::fp32, false, "fwd"});
  check_against_reference(Problem{2, 3, 37, 53, 16, DType::fp32, true, "fwd"});
  check_against_reference(Problem{1, 2, 53, 37, 24, DType::fp32, true, "fwd"});
  check_against_reference(Problem{1, 2, 53, 37, 8, DType::fp32, false, "fwd"});
  check_against_reference(Problem{1, 1, 1, 70, 32, DType::fp32, true, "fwd"});
}

TEST(LibraryGeometry, ScratchAndSupport) {
  const Problem p{2, 4, 100, 300, 64, DType::bf16, true, "fwd"};
  EXPECT_EQ(lib::score_elements(p), 2u * 4 * 100 * 300);
  EXPECT_EQ(lib::scratch_bytes(p), lib::score_elements(p) * (4 + 2));  // S fp32 + P bf16
  EXPECT_EQ(lib::unsupported_reason("cublas_unfused", p), "");
  Problem bwd = p;
  bwd.direction = "bwd";
  EXPECT_NE(lib::unsupported_reason("cublas_unfused", bwd), "");
  EXPECT_NE(lib::unsupported_reason("cudnn", p).find("unknown"), std::string::npos);
  for (int sk : {1, 31, 256, 257, 1024, 1025, 65536}) {
    const int t = lib::softmax_threads(sk);
    EXPECT_EQ(t % 32, 0);
    EXPECT_GE(t, 32);
    EXPECT_LE(t, 1024);
  }
  // Huge shapes: sizes are 64-bit (the out-of-memory case must be reported, not wrapped around).
  const Problem huge{64, 64, 65536, 65536, 64, DType::fp32, false, "fwd"};
  EXPECT_EQ(lib::score_elements(huge), (size_t)64 * 64 * 65536 * 65536);
  EXPECT_EQ(lib::scores_gemm(huge).stride_c, 65536ll * 65536);
}

namespace {
void compile_for(const std::string& arch) {
  std::string log;
  const std::string cubin = lib::compile_device_code(arch, &log);
  EXPECT_GT(cubin.size(), 1000u);
  for (DType t : {DType::fp32, DType::fp16, DType::bf16})
    EXPECT_NE(cubin.find(lib::softmax_kernel(t)), std::string::npos) << lib::softmax_kernel(t) << " not in the cubin";
  EXPECT_NE(cubin.find(lib::kFillKernel), std::string::npos);
  // ptxas -v reports each kernel's spills: none anywhere.
  const std::regex spills(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  int kernels = 0;
  for (std::sregex_iterator it(log.begin(), log.end(), spills), end; it != end; ++it, ++kernels) {
    EXPECT_EQ((*it)[1].str(), "0") << log;
    EXPECT_EQ((*it)[2].str(), "0") << log;
  }
  EXPECT_GE(kernels, 4) << log;
}
}  // namespace

TEST(LibraryNvrtc, CompilesSm80) { compile_for("sm_80"); }
TEST(LibraryNvrtc, CompilesSm90) { compile_for("sm_90"); }
TEST(LibraryNvrtc, BadArchIsAnError) { EXPECT_THROW(lib::compile_device_code("sm_1"), std::runtime_error); }
