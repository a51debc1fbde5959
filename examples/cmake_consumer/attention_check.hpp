// One attention case through flashtune::runtime (forward, then backward), checked against the float64
// reference with the tuner's bounds (worker/validate.hpp: each element within a few unit roundoffs of
// its dtype times what it sums). Used by this example and by tests/gpu_runtime_test.cpp.
// Memory through the CUDA runtime, as an application (or PyTorch) would allocate it.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/dtype_convert.hpp"
#include "flashtune/attention.hpp"
#include "worker/validate.hpp"

namespace attention_check {

struct Case {
  int batch = 2, heads = 3, seq_q = 130, seq_k = 200, head_dim = 64;
  int heads_k = 0;       // k and v heads (grouped-query attention, fp16/bf16); 0: heads
  ft_dtype dtype = FT_BF16;
  bool causal = true;
  bool bshd = false;     // tensors in [B, S, H, d] memory (transposed strides: packed by the library)
  float scale = 0;       // <= 0: 1/sqrt(d)
  bool caller_workspace = false;  // backward workspace from ft_backward_workspace_bytes
  std::string str() const {
    const char* t = dtype == FT_FP32 ? "fp32" : dtype == FT_FP16 ? "fp16" : "bf16";
    return "B" + std::to_string(batch) + " H" + std::to_string(heads) +
           (heads_k && heads_k != heads ? "/" + std::to_string(heads_k) : "") + " Sq" + std::to_string(seq_q) + " Sk" +
           std::to_string(seq_k) + " d" + std::to_string(head_dim) + " " + t + (causal ? " causal" : "") +
           (bshd ? " bshd" : "") + (scale > 0 ? " scale" + std::to_string(scale) : "") +
           (caller_workspace ? " workspace" : "");
  }
};

struct Result {
  bool ok = false;
  std::string error;               // why not, one line
  std::string fwd_explain, bwd_explain;
};

namespace detail {
inline flashtune::DType dtype(ft_dtype t) {
  return t == FT_FP16 ? flashtune::DType::fp16 : t == FT_BF16 ? flashtune::DType::bf16 : flashtune::DType::fp32;
}

// Device buffer in the case's layout; host values always [B, H, S, d].
struct Tensor {
  void* ptr = nullptr;
  size_t bytes = 0;
  ~Tensor() { if (ptr) cudaFree(ptr); }
};

inline std::string cuda_error(cudaError_t e, const char* what) { return std::string(what) + ": " + cudaGetErrorString(e); }

// [B, H, S, d] <-> the memory order of the case ([B, S, H, d] when bshd); heads: the tensor's (q's or k's).
inline size_t mem_index(const Case& c, size_t heads, size_t b, size_t h, size_t s, size_t d, int seq) {
  return c.bshd ? ((b * seq + s) * heads + h) * c.head_dim + d : ((b * heads + h) * seq + s) * c.head_dim + d;
}
template <class F>
inline void for_each(const Case& c, int heads, int seq, F f) {
  for (size_t b = 0; b < (size_t)c.batch; ++b)
    for (size_t h = 0; h < (size_t)heads; ++h)
      for (size_t s = 0; s < (size_t)seq; ++s)
        for (size_t d = 0; d < (size_t)c.head_dim; ++d)
          f(((b * heads + h) * seq + s) * c.head_dim + d, mem_index(c, heads, b, h, s, d, seq));
}
}  // namespace detail

inline Result run_case(const Case& c, unsigned seed = 1) {
  using namespace detail;
  namespace rt = flashtune::runtime;
  Result r;
  const flashtune::DType t = dtype(c.dtype);
  const size_t elem = flashtune::dtype_bytes(t);
  const int H = c.heads, Hk = c.heads_k > 0 ? c.heads_k : c.heads;
  const size_t nq = (size_t)c.batch * H * c.seq_q * c.head_dim, nk = (size_t)c.batch * Hk * c.seq_k * c.head_dim;
  const size_t rows = (size_t)c.batch * c.heads * c.seq_q;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = normal(rng);
    flashtune::to_device_format(v, t);  // rounded to the dtype: the reference sees what the kernel sees
    return v;
  };
  const std::vector<float> q = random(nq), k = random(nk), v = random(nk), dout = random(nq);

  cudaStream_t stream;
  if (cudaError_t e = cudaStreamCreate(&stream)) return r.error = cuda_error(e, "cudaStreamCreate"), r;
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } stream_guard{stream};
  // Host [B,H,S,d] floats -> device buffer in the case's layout.
  auto upload = [&](Tensor& dst, const std::vector<float>& src, int heads, int seq) -> std::string {
    std::vector<float> mem(src.size());
    for_each(c, heads, seq, [&](size_t i, size_t m) { mem[m] = src[i]; });
    const auto bytes = flashtune::to_device_format(mem, t);
    dst.bytes = bytes.size();
    if (cudaError_t e = cudaMalloc(&dst.ptr, dst.bytes)) return cuda_error(e, "cudaMalloc");
    if (cudaError_t e = cudaMemcpy(dst.ptr, bytes.data(), dst.bytes, cudaMemcpyHostToDevice)) return cuda_error(e, "cudaMemcpy");
    return "";
  };
  auto download = [&](const Tensor& src, int heads, int seq, std::vector<float>& out) -> std::string {
    std::vector<uint8_t> bytes(src.bytes);
    if (cudaError_t e = cudaMemcpy(bytes.data(), src.ptr, src.bytes, cudaMemcpyDeviceToHost)) return cuda_error(e, "cudaMemcpy");
    const std::vector<float> mem = flashtune::from_device_format(bytes, t);
    out.assign(mem.size(), 0.f);
    for_each(c, heads, seq, [&](size_t i, size_t m) { out[i] = mem[m]; });
    return "";
  };
  auto tensor = [&](const Tensor& x, int heads, int seq) {
    return c.bshd ? rt::Tensor::bshd(x.ptr, c.batch, heads, seq, c.head_dim)
                  : rt::Tensor::bhsd(x.ptr, c.batch, heads, seq, c.head_dim);
  };
  Tensor dq, dk, dv, o_in;
  Tensor dQ, dK, dV, dO, dOut, dLse;
  std::string err;
  if (!(err = upload(dQ, q, H, c.seq_q)).empty() || !(err = upload(dK, k, Hk, c.seq_k)).empty() ||
      !(err = upload(dV, v, Hk, c.seq_k)).empty() || !(err = upload(dOut, dout, H, c.seq_q)).empty() ||
      !(err = upload(dO, std::vector<float>(nq, NAN), H, c.seq_q)).empty())
    return r.error = err, r;
  dLse.bytes = rows * 4;
  if (cudaError_t e = cudaMalloc(&dLse.ptr, dLse.bytes)) return r.error = cuda_error(e, "cudaMalloc"), r;

  // ---- forward ----
  rt::ForwardArgs f;
  f.batch = c.batch, f.heads = c.heads, f.seq_q = c.seq_q, f.seq_k = c.seq_k, f.head_dim = c.head_dim;
  f.dtype = c.dtype, f.causal = c.causal, f.scale = c.scale, f.heads_k = c.heads_k;
  f.q = tensor(dQ, H, c.seq_q), f.k = tensor(dK, Hk, c.seq_k), f.v = tensor(dV, Hk, c.seq_k), f.o = tensor(dO, H, c.seq_q);
  f.lse = (float*)dLse.ptr;
  r.fwd_explain = rt::explain(f);
  if (rt::Status s = rt::forward(f, stream); !s) return r.error = "forward: " + s.message, r;
  if (cudaError_t e = cudaStreamSynchronize(stream)) return r.error = cuda_error(e, "forward"), r;
  std::vector<float> o, lse(rows);
  if (!(err = download(dO, H, c.seq_q, o)).empty()) return r.error = err, r;
  cudaMemcpy(lse.data(), dLse.ptr, rows * 4, cudaMemcpyDeviceToHost);

  flashtune::Problem p;
  p.batch = c.batch, p.heads = c.heads, p.seq_q = c.seq_q, p.seq_k = c.seq_k, p.head_dim = c.head_dim;
  p.dtype = t, p.causal = c.causal, p.heads_k = Hk == H ? 0 : Hk;
  const flashtune::ref::Shape shape{c.batch, c.heads, c.seq_q, c.seq_k, c.head_dim, c.causal, (double)c.scale, p.heads_k};
  std::vector<int64_t> all_rows(rows);
  for (size_t i = 0; i < rows; ++i) all_rows[i] = (int64_t)i;
  const flashtune::FwdReference fref = flashtune::forward_reference(shape, q.data(), k.data(), v.data(), all_rows);
  const flashtune::Verdict fv = flashtune::validate_forward(p, fref, o, lse);
  if (!fv.ok) return r.error = "forward: " + fv.error, r;

  // ---- backward: the reference forward's O (rounded to the dtype) and LSE as inputs, as the tuner does ----
  p.direction = "bwd";
  const flashtune::BwdReference bref = flashtune::backward_reference(shape, q.data(), k.data(), v.data(), dout.data());
  std::vector<float> o_ref(bref.o.begin(), bref.o.end()), lse_ref(bref.lse.begin(), bref.lse.end());
  flashtune::to_device_format(o_ref, t);
  if (!(err = upload(o_in, o_ref, H, c.seq_q)).empty() || !(err = upload(dq, std::vector<float>(nq, NAN), H, c.seq_q)).empty() ||
      !(err = upload(dk, std::vector<float>(nk, NAN), Hk, c.seq_k)).empty() ||
      !(err = upload(dv, std::vector<float>(nk, NAN), Hk, c.seq_k)).empty())
    return r.error = err, r;
  cudaMemcpy(dLse.ptr, lse_ref.data(), rows * 4, cudaMemcpyHostToDevice);
  rt::BackwardArgs b;
  b.batch = c.batch, b.heads = c.heads, b.seq_q = c.seq_q, b.seq_k = c.seq_k, b.head_dim = c.head_dim;
  b.dtype = c.dtype, b.causal = c.causal, b.scale = c.scale, b.heads_k = c.heads_k;
  b.q = f.q, b.k = f.k, b.v = f.v, b.o = tensor(o_in, H, c.seq_q), b.dout = tensor(dOut, H, c.seq_q);
  b.lse = (const float*)dLse.ptr;
  b.dq = tensor(dq, H, c.seq_q), b.dk = tensor(dk, Hk, c.seq_k), b.dv = tensor(dv, Hk, c.seq_k);
  Tensor ws;
  if (c.caller_workspace) {
    if (rt::Status s = rt::backward_workspace_bytes(b, &ws.bytes); !s) return r.error = "workspace: " + s.message, r;
    if (ws.bytes && cudaMalloc(&ws.ptr, ws.bytes)) return r.error = "cudaMalloc workspace", r;
    b.workspace = ws.ptr, b.workspace_bytes = ws.bytes;
  }
  r.bwd_explain = rt::explain(b);
  if (rt::Status s = rt::backward(b, stream); !s) return r.error = "backward: " + s.message, r;
  if (cudaError_t e = cudaStreamSynchronize(stream)) return r.error = cuda_error(e, "backward"), r;
  std::vector<float> gq, gk, gv;
  if (!(err = download(dq, H, c.seq_q, gq)).empty() || !(err = download(dk, Hk, c.seq_k, gk)).empty() ||
      !(err = download(dv, Hk, c.seq_k, gv)).empty())
    return r.error = err, r;
  const flashtune::Verdict bv = flashtune::validate_backward(p, bref, gq, gk, gv);
  if (!bv.ok) return r.error = "backward: " + bv.error, r;
  r.ok = true;
  return r;
}

}  // namespace attention_check
