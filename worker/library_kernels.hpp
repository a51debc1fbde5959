// The library baselines' host logic that needs no GPU: the unfused attention's GEMM geometry in
// cuBLAS's column-major terms, its O(N^2) scratch size, and the NVRTC compile of its device code
// (templates/library/unfused_softmax.cuh). The worker (library_runner.cpp) launches them; the
// unit tests check the geometry against the float64 reference and the compile for sm_80/sm_90.
#pragma once
#include <cstddef>
#include <string>

#include "core/problem.hpp"

namespace flashtune::lib {

// The implementations run_library knows (forward only).
inline constexpr const char* kCublasUnfused = "cublas_unfused";

// Empty when `impl` can run `p`; otherwise the one-line reason.
std::string unsupported_reason(const std::string& impl, const Problem& p);

// One cublasGemmStridedBatchedEx: C = alpha * op(A) op(B) + beta * C per batch entry, column-major.
struct GemmShape {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;
  long long stride_a = 0, stride_b = 0, stride_c = 0;
  int batch = 0;
};

// Row-major (B, H, S, d) tensors seen column-major are their transposes, so
// S (Sq x Sk, row-major) = Q K^T  is  S^T (Sk x Sq, col-major) = op_T(K as d x Sk) * (Q as d x Sq):
// A = K, B = Q, C = S.
GemmShape scores_gemm(const Problem&);
// O (Sq x d, row-major) = P V  is  O^T (d x Sq) = (V as d x Sk) * (P as Sk x Sq): A = V, B = P, C = O.
GemmShape output_gemm(const Problem&);

// Elements of S (and of P): B*H*Sq*Sk. Bytes: S in fp32, P in the problem's dtype.
size_t score_elements(const Problem&);
size_t scratch_bytes(const Problem&);

// Threads per softmax block (one block per row of S): enough to cover a row in a few strides.
int softmax_threads(int seq_k);
// "ft_unfused_softmax_fp32" / _fp16 / _bf16
std::string softmax_kernel(DType);
inline constexpr const char* kFillKernel = "ft_fill_uniform";
// The dtype code the kernels take (0 fp32, 1 fp16, 2 bf16).
int dtype_code(DType);

// The embedded text of templates/library/unfused_softmax.cuh.
const char* device_source();
// NVRTC to a cubin for `arch` ("sm_90"); throws std::runtime_error with the first error line.
// `log`, when given, receives the compiler's log (ptxas -v: registers, spills).
std::string compile_device_code(const std::string& arch, std::string* log = nullptr);

}  // namespace flashtune::lib
