// The worker's library baselines: unfused attention through cuBLAS (GEMM -> our row softmax ->
// GEMM, the way a library user writes it) and the peak probes (cuBLAS GEMM TFLOP/s, device copy
// GB/s) that put measured throughput in proportion.
//
// cuBLAS goes through the CUDA runtime; the runner holds the device's primary context, which is
// the runtime's context too, so cuBLAS, our cuLaunchKernel launches and the CUDA events all live
// in one context on the legacy default stream (stream 0) and are ordered with each other.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/dtype_convert.hpp"
#include "core/timing.hpp"
#include "worker/cuda_check.hpp"
#include "worker/gpu_runner.hpp"
#include "worker/library_kernels.hpp"

using nlohmann::json;

namespace flashtune {

namespace {

// A failed cuBLAS call. A failed execution can mean a faulted context: a sticky error then
// surfaces as the CudaError (crash) it is. An allocation failure inside cuBLAS is an OOM.
void cublas_check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  const std::string msg = std::string(what) + ": " + cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")";
  const CUresult ctx = cuCtxSynchronize();
  if (ctx != CUDA_SUCCESS) throw CudaError(ctx, msg + "; context: " + describe(ctx));
  if (st == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(0, 0, "out of device memory: " + msg);
  throw std::runtime_error(msg);
}
#define CUBLAS_CHECK(call) cublas_check((call), #call)

#define CUDART_CHECK(call)                                                                                  \
  do {                                                                                                      \
    cudaError_t e_ = (call);                                                                                \
    if (e_ != cudaSuccess)                                                                                  \
      throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorName(e_) + " (" + cudaGetErrorString(e_) + ")"); \
  } while (0)

cudaDataType cuda_type(DType t) {
  switch (t) {
    case DType::fp32: return CUDA_R_32F;
    case DType::fp16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

void gemm(cublasHandle_t h, const lib::GemmShape& g, float alpha, CUdeviceptr a, cudaDataType a_type, CUdeviceptr b,
          cudaDataType b_type, CUdeviceptr c, cudaDataType c_type, cublasComputeType_t compute) {
  const float beta = 0.f;  // C is written, never read: its poison cannot leak through
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          g.m, g.n, g.k, &alpha, (const void*)a, a_type, g.lda, g.stride_a,
                                          (const void*)b, b_type, g.ldb, g.stride_b, &beta, (void*)c, c_type, g.ldc,
                                          g.stride_c, g.batch, compute, CUBLAS_GEMM_DEFAULT));
}

// Device memory for one probe, freed on every path.
struct DeviceMem {
  CUdeviceptr ptr = 0;
  ~DeviceMem() {
    if (ptr) cuMemFree(ptr);
  }
};
void alloc(CUdeviceptr& ptr, size_t bytes, const char* what) {
  const CUresult rc = cuMemAlloc(&ptr, bytes);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
    ptr = 0;
    throw OutOfMemory(bytes, 0, std::string("out of device memory: cuMemAlloc of ") + std::to_string(bytes) +
                                    " bytes for the " + what + " failed");
  }
  CU_CHECK(rc);
}

// Warm-up, then `reps` (>= 10, more while under ~300 ms) event-timed calls; the median in ms.
double median_ms(const std::function<void()>& call) {
  CUevent e0, e1;
  CU_CHECK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
  CU_CHECK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
  CU_CHECK(cuEventRecord(e0, nullptr));
  for (int i = 0; i < 3; ++i) call();
  CU_CHECK(cuEventRecord(e1, nullptr));
  CU_CHECK(cuEventSynchronize(e1));
  float warm = 0;
  CU_CHECK(cuEventElapsedTime(&warm, e0, e1));
  const int reps = std::clamp((int)(300.0 / std::max(1e-3, warm / 3.0)), 10, 100);
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    CU_CHECK(cuEventRecord(e0, nullptr));
    call();
    CU_CHECK(cuEventRecord(e1, nullptr));
    CU_CHECK(cuEventSynchronize(e1));
    CU_CHECK(cuEventElapsedTime(&ms[i], e0, e1));
  }
  cuEventDestroy(e0);
  cuEventDestroy(e1);
  return timing::percentile(ms, 0.5);
}

// A scope guard: runs `f` when the scope ends, however it ends.
struct Defer {
  std::function<void()> f;
  ~Defer() { f(); }
};

}  // namespace

struct GpuRunner::LibraryState {
  cublasHandle_t handle = nullptr;
  CUmodule module = nullptr;
  CUfunction softmax[3] = {};  // by lib::dtype_code
  CUfunction fill = nullptr;
  CUdeviceptr workspace = 0;
  size_t workspace_bytes = 0;
  int cublas_version = 0;
  ~LibraryState() {
    if (handle) cublasDestroy(handle);
    if (module) cuModuleUnload(module);
    if (workspace) cuMemFree(workspace);
  }
};

void GpuRunner::destroy_library() {
  delete lib_;
  lib_ = nullptr;
}

void GpuRunner::init_library() {
  if (lib_) return;
  auto st = std::make_unique<LibraryState>();
  // The runtime (and so cuBLAS) must use the context this runner launches in: the primary one.
  CUDART_CHECK(cudaSetDevice(ordinal_));
  CUDART_CHECK(cudaFree(nullptr));  // initialises the runtime on that device now
  CUcontext current = nullptr;
  CU_CHECK(cuCtxGetCurrent(&current));
  if (current != ctx_) throw std::runtime_error("the CUDA runtime did not bind the worker's primary context");

  CUBLAS_CHECK(cublasCreate(&st->handle));
  // Stream 0, the legacy default stream our launches and events use: everything is ordered.
  CUBLAS_CHECK(cublasSetStream(st->handle, nullptr));
  // Default math: fp32 GEMMs stay true fp32 (TF32 only where a compute type asks for it).
  CUBLAS_CHECK(cublasSetMathMode(st->handle, CUBLAS_DEFAULT_MATH));
  CUBLAS_CHECK(cublasSetPointerMode(st->handle, CUBLAS_POINTER_MODE_HOST));
  // Our own workspace, so that peak_bytes counts it: 32 MiB, cuBLAS's recommendation for Hopper.
  st->workspace_bytes = 32u << 20;
  alloc(st->workspace, st->workspace_bytes, "cuBLAS workspace");
  CUBLAS_CHECK(cublasSetWorkspace(st->handle, (void*)st->workspace, st->workspace_bytes));
  CUBLAS_CHECK(cublasGetVersion(st->handle, &st->cublas_version));

  // The softmax and fill kernels, compiled by NVRTC for this device once per worker.
  const std::string cubin = lib::compile_device_code(info_.arch);
  CU_CHECK(cuModuleLoadData(&st->module, cubin.data()));
  for (DType t : {DType::fp32, DType::fp16, DType::bf16})
    CU_CHECK(cuModuleGetFunction(&st->softmax[lib::dtype_code(t)], st->module, lib::softmax_kernel(t).c_str()));
  CU_CHECK(cuModuleGetFunction(&st->fill, st->module, lib::kFillKernel));
  lib_ = st.release();
}

json GpuRunner::run_library(const json& req) {
  if (!prepared_) throw std::runtime_error("run_library before prepare");
  const std::string impl = req.value("impl", std::string());
  const Problem& p = problem_;
  if (const std::string why = lib::unsupported_reason(impl, p); !why.empty())
    return {{"status", "error"}, {"error", why}};
  init_library();
  const size_t elements = lib::score_elements(p);
  if (elements / p.seq_k > 0x7fffffffull)
    return {{"status", "error"}, {"error", "cublas_unfused: B*H*Sq rows exceed one grid dimension"}};

  // S (fp32) and P (dtype): the unfused baseline's O(N^2) memory, this call's only.
  workspace_.bytes = 0;
  Defer free_scratch{[this] {
    for (Buffer* b : {&scores_, &probs_}) {
      if (b->ptr) cuMemFree(b->ptr);
      *b = Buffer{};
    }
  }};
  const size_t needed = problem_bytes() + lib::scratch_bytes(p) + lib_->workspace_bytes;
  try {
    ensure(scores_, elements * 4);
    ensure(probs_, elements * dtype_bytes(p.dtype));
  } catch (const OutOfMemory& e) {
    release_buffers();
    throw OutOfMemory(e.asked, needed,
                      std::string(e.what()) + "; cublas_unfused needs " + std::to_string(needed) +
                          " bytes in all (S and P: " + std::to_string(elements) + " scores each)");
  }

  cublasHandle_t h = lib_->handle;
  const lib::GemmShape qk = lib::scores_gemm(p), pv = lib::output_gemm(p);
  const cudaDataType in_type = cuda_type(p.dtype);
  const float scale = (float)(1.0 / std::sqrt((double)p.head_dim));
  CUfunction softmax = lib_->softmax[lib::dtype_code(p.dtype)];
  const unsigned rows = (unsigned)(elements / p.seq_k), threads = (unsigned)lib::softmax_threads(p.seq_k);
  CUdeviceptr s_ptr = scores_.ptr, p_ptr = probs_.ptr, lse_ptr = lse_.ptr;
  int seq_q = p.seq_q, seq_k = p.seq_k, causal = p.causal ? 1 : 0;
  void* args[] = {&s_ptr, &p_ptr, &lse_ptr, &seq_q, &seq_k, &causal};
  // The whole baseline: S = scale * Q K^T (fp32 out; fp32 compute, no TF32), row softmax -> P
  // (input dtype) and LSE, O = P V (fp32 accumulate, input dtype out).
  auto launch = [&] {
    gemm(h, qk, scale, k_.ptr, in_type, q_.ptr, in_type, scores_.ptr, CUDA_R_32F, CUBLAS_COMPUTE_32F);
    CU_CHECK(cuLaunchKernel(softmax, rows, 1, 1, threads, 1, 1, 0, nullptr, args, nullptr));
    gemm(h, pv, 1.f, v_.ptr, in_type, probs_.ptr, in_type, o_.ptr, in_type, CUBLAS_COMPUTE_32F);
  };

  // 1. One validated run, as for a family: O and LSE poisoned with NaN (S and P too, so nothing
  //    left from an earlier run can pass for a result), every O element written, sampled rows
  //    against the float64 reference.
  json out;
  out["status"] = "ok";
  CU_CHECK(cuMemsetD32(scores_.ptr, nan_bits(DType::fp32), elements));
  if (dtype_bytes(p.dtype) == 4) CU_CHECK(cuMemsetD32(probs_.ptr, nan_bits(p.dtype), elements));
  else CU_CHECK(cuMemsetD16(probs_.ptr, (unsigned short)nan_bits(p.dtype), elements));
  poison_outputs();
  launch();
  CU_CHECK(cuCtxSynchronize());
  read_outputs(outputs_);
  validate(outputs_, out);
  out["peak_bytes"] = problem_bytes() + lib_->workspace_bytes;
  out["detail"]["impl"] = impl;
  out["detail"]["cublas_version"] = lib_->cublas_version;
  out["detail"]["softmax_threads"] = threads;
  if (out["status"] != "ok") return out;

  // 2. Timing: the whole GEMM-softmax-GEMM sequence, L2-flushed repeats as for a family.
  time_repeats(launch, req.value("timing", json::object()), out);
  return out;
}

json GpuRunner::probe(const json& req) {
  init_library();
  cublasHandle_t h = lib_->handle;
  json out = {{"status", "ok"}, {"cublas_version", lib_->cublas_version}};
  auto fill = [&](CUdeviceptr ptr, size_t n, DType t, unsigned long long seed) {
    CUdeviceptr p = ptr;
    unsigned long long count = n;
    int code = lib::dtype_code(t);
    void* args[] = {&p, &count, &code, &seed};
    const unsigned blocks = (unsigned)std::min<size_t>((n + 255) / 256, (size_t)info_.sm_count * 32);
    CU_CHECK(cuLaunchKernel(lib_->fill, blocks, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  };

  // GEMM: C = A B, all N x N, random inputs in [-1, 1) (not zeros: data moves the clocks).
  {
    const int n = req.value("gemm_n", 8192);
    const size_t nn = (size_t)n * n;
    DeviceMem a, b, c;
    alloc(a.ptr, nn * 4, "probe GEMM");
    alloc(b.ptr, nn * 4, "probe GEMM");
    alloc(c.ptr, nn * 4, "probe GEMM");
    lib::GemmShape g;
    g.m = g.n = g.k = g.lda = g.ldb = g.ldc = n;
    g.batch = 1;
    struct Case {
      const char* key;
      DType in;
      cublasComputeType_t compute;
    };
    for (const Case& k : {Case{"matmul_fp32_tflops", DType::fp32, CUBLAS_COMPUTE_32F},
                          Case{"matmul_tf32_tflops", DType::fp32, CUBLAS_COMPUTE_32F_FAST_TF32},
                          Case{"matmul_bf16_tflops", DType::bf16, CUBLAS_COMPUTE_32F},
                          Case{"matmul_fp16_tflops", DType::fp16, CUBLAS_COMPUTE_32F}}) {
      fill(a.ptr, nn, k.in, 1);
      fill(b.ptr, nn, k.in, 2);
      const cudaDataType t = cuda_type(k.in);
      const double ms = median_ms([&] { gemm(h, g, 1.f, a.ptr, t, b.ptr, t, c.ptr, t, k.compute); });
      out[k.key] = 2.0 * n * n * (double)n / (ms * 1e-3) / 1e12;
    }
    out["gemm_n"] = n;
  }

  // Copy: device to device, GB/s counting the bytes read and the bytes written.
  {
    const size_t bytes = req.value("copy_bytes", (size_t)1 << 30);
    DeviceMem src, dst;
    alloc(src.ptr, bytes, "probe copy");
    alloc(dst.ptr, bytes, "probe copy");
    fill(src.ptr, bytes / 4, DType::fp32, 3);
    const double ms = median_ms([&] { CU_CHECK(cuMemcpyDtoDAsync(dst.ptr, src.ptr, bytes, nullptr)); });
    out["copy_gbps"] = 2.0 * bytes / (ms * 1e-3) / 1e9;
    out["copy_bytes"] = bytes;
  }
  CU_CHECK(cuCtxSynchronize());
  return out;
}

}  // namespace flashtune
