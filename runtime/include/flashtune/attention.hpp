// flashtune runtime, C++17 interface over the C ABI (flashtune/attention.h): errors as values.
//
//   flashtune::runtime::ForwardArgs f;
//   f.batch = 2; f.heads = 3; f.seq_q = 130; f.seq_k = 200; f.head_dim = 64; f.dtype = FT_BF16; f.causal = true;
//   f.q = flashtune::runtime::Tensor::bhsd(q_ptr, 2, 3, 130, 64);  // or ::bshd for [B, S, H, d] memory
//   ...
//   if (auto st = flashtune::runtime::forward(f, stream); !st) std::cerr << st.message << "\n";
//   std::cout << flashtune::runtime::explain(f) << "\n";
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "flashtune/attention.h"

namespace flashtune {
namespace runtime {

struct Status {
  ft_status code = FT_OK;
  std::string message;  // one line; empty when ok
  bool ok() const { return code == FT_OK; }
  explicit operator bool() const { return ok(); }
};

inline Status status_of(ft_status s) { return Status{s, s == FT_OK ? std::string() : std::string(ft_last_error())}; }

// A [B, H, S, d] tensor: device pointer and element strides.
struct Tensor {
  void* data = nullptr;
  std::array<int64_t, 4> stride{};
  // Contiguous [B, H, S, d] (torch's default layout for attention).
  static Tensor bhsd(const void* p, int64_t /*b*/, int64_t h, int64_t s, int64_t d) {
    return Tensor{const_cast<void*>(p), {h * s * d, s * d, d, 1}};
  }
  // [B, S, H, d] memory seen as [B, H, S, d] (q.transpose(1, 2) of a projection's output).
  static Tensor bshd(const void* p, int64_t /*b*/, int64_t h, int64_t s, int64_t d) {
    return Tensor{const_cast<void*>(p), {s * h * d, d, h * d, 1}};
  }
  ft_tensor c() const { return ft_tensor{data, {stride[0], stride[1], stride[2], stride[3]}}; }
};

struct ForwardArgs {
  int batch = 0, heads = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  ft_dtype dtype = FT_FP32;
  bool causal = false;  // bottom-right aligned
  float scale = 0;      // <= 0: 1/sqrt(head_dim)
  Tensor q, k, v, o;
  float* lse = nullptr;  // [B, H, Sq] fp32, optional
  ft_forward_args c() const {
    return ft_forward_args{batch, heads, seq_q, seq_k, head_dim, dtype, causal ? 1 : 0, scale,
                           q.c(), k.c(), v.c(), o.c(), lse};
  }
};

struct BackwardArgs {
  int batch = 0, heads = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  ft_dtype dtype = FT_FP32;
  bool causal = false;
  float scale = 0;
  Tensor q, k, v, o, dout;
  const float* lse = nullptr;  // the forward's [B, H, Sq] fp32 LSE, contiguous
  Tensor dq, dk, dv;
  void* workspace = nullptr;   // nullptr: allocated on the stream
  size_t workspace_bytes = 0;
  ft_backward_args c() const {
    return ft_backward_args{batch, heads, seq_q, seq_k, head_dim, dtype, causal ? 1 : 0, scale, q.c(), k.c(), v.c(),
                            o.c(), dout.c(), lse, dq.c(), dk.c(), dv.c(), workspace, workspace_bytes};
  }
};

inline Status forward(const ForwardArgs& a, void* stream = nullptr) {
  const ft_forward_args c = a.c();
  return status_of(ft_attention_forward(&c, stream));
}
inline Status backward(const BackwardArgs& a, void* stream = nullptr) {
  const ft_backward_args c = a.c();
  return status_of(ft_attention_backward(&c, stream));
}
inline Status backward_workspace_bytes(const BackwardArgs& a, size_t* bytes) {
  const ft_backward_args c = a.c();
  return status_of(ft_backward_workspace_bytes(&c, bytes));
}
inline Status explain(const ForwardArgs& a, ft_explanation* out) {
  const ft_forward_args c = a.c();
  return status_of(ft_explain_forward(&c, out));
}
inline Status explain(const BackwardArgs& a, ft_explanation* out) {
  const ft_backward_args c = a.c();
  return status_of(ft_explain_backward(&c, out));
}
// One line: which family and config a call runs, where the config and the kernel come from, and why
// a tabled config was not used; "error: <why>" when the call could not be planned.
inline std::string explain(const ForwardArgs& a) {
  const ft_forward_args c = a.c();
  char buf[512];
  return ft_explain_forward_text(&c, buf, sizeof buf) == FT_OK ? std::string(buf) : "error: " + std::string(ft_last_error());
}
inline std::string explain(const BackwardArgs& a) {
  const ft_backward_args c = a.c();
  char buf[512];
  return ft_explain_backward_text(&c, buf, sizeof buf) == FT_OK ? std::string(buf) : "error: " + std::string(ft_last_error());
}
inline Status device_available() { return status_of(ft_device_available()); }
inline std::string version() { return ft_version(); }

}  // namespace runtime
}  // namespace flashtune
