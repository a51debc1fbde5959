// flashtune runtime, C++17 interface over the C ABI (flashtune/attention.h): errors as values.
//
//   flashtune::runtime::ForwardArgs f;
//   f.batch = 2; f.heads = 3; f.seq_q = 130; f.seq_k = 200; f.head_dim = 64; f.dtype = FT_BF16; f.causal = true;
//   f.q = flashtune::runtime::Tensor::bhsd(q_ptr, 2, 3, 130, 64);  // or ::bshd for [B, S, H, d] memory
//   ...
//   if (auto st = flashtune::runtime::forward(f, stream); !st) std::cerr << st.message << "\n";
//   std::cout << flashtune::runtime::explain(f) << "\n";
//
// Packed variable-length batches (flash_attn_varlen_func's layout; cu_seqlens in device memory):
//   flashtune::runtime::VarlenForwardArgs v;
//   v.batch = 3; v.heads = 32; v.heads_k = 8; v.head_dim = 128; v.dtype = FT_BF16; v.causal = true;
//   v.total_q = v.total_k = 4100; v.max_seqlen_q = v.max_seqlen_k = 2048;
//   v.cu_seqlens_q = v.cu_seqlens_k = d_cu;  // int32 {0, 2048, 3000, 4100} on the GPU
//   v.q = flashtune::runtime::PackedTensor::thd(q_ptr, 4100, 32, 128);  // [total, heads, d]
//   ...
//   if (auto st = flashtune::runtime::varlen_forward(v, stream); !st) std::cerr << st.message << "\n";
//
// Decoding from a paged K/V cache (block table and cache lengths in device memory):
//   flashtune::runtime::PagedForwardArgs pf;
//   pf.batch = 8; pf.heads = 32; pf.heads_k = 8; pf.seq_q = 1; pf.head_dim = 128; pf.dtype = FT_BF16;
//   pf.num_pages = 4096; pf.page_size = 256; pf.max_pages = 128;  // pools [4096, 8, 256, 128]
//   pf.block_table = d_table; pf.cache_seqlens = d_lens;          // int32 [8, 128] and [8]
//   pf.q = flashtune::runtime::Tensor::bhsd(q_ptr, 8, 32, 1, 128);
//   pf.k_pages = flashtune::runtime::Tensor::bhsd(k_pool, 4096, 8, 256, 128);  // contiguous pages
//   ...
//   if (auto st = flashtune::runtime::paged_forward(pf, stream); !st) std::cerr << st.message << "\n";
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

// A packed [total, H, d] tensor of a variable-length batch: device pointer and element strides.
struct PackedTensor {
  void* data = nullptr;
  std::array<int64_t, 3> stride{};
  // Contiguous [total, H, d] (flash_attn_varlen_func's layout).
  static PackedTensor thd(const void* p, int64_t /*total*/, int64_t h, int64_t d) {
    return PackedTensor{const_cast<void*>(p), {h * d, d, 1}};
  }
  ft_packed_tensor c() const { return ft_packed_tensor{data, {stride[0], stride[1], stride[2]}}; }
};

// Score modifications (ft_mods): FlashAttention's window_size (-1: unbounded), softcap (0: off) and alibi_slopes
// (fp32 device slopes, nullptr: none; batch stride 0 for [H], >= heads for [B, H]).
struct Mods {
  int window_left = -1, window_right = -1;
  float softcap = 0;
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0;
  ft_mods c() const {
    const bool windowed = window_left >= 0 || window_right >= 0;
    return ft_mods{windowed ? 1 : 0, windowed ? window_left : 0, windowed ? window_right : 0, softcap, alibi_slopes,
                   alibi_batch_stride};
  }
};

struct ForwardArgs {
  int batch = 0, heads = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  ft_dtype dtype = FT_FP32;
  bool causal = false;  // bottom-right aligned
  float scale = 0;      // <= 0: 1/sqrt(head_dim)
  Tensor q, k, v, o;
  float* lse = nullptr;  // [B, H, Sq] fp32, optional
  int heads_k = 0;       // kv heads of k and v (grouped-query attention); 0: heads
  Mods mods;             // sliding window, softcap
  const ft_mask_mod* mask_mod = nullptr;  // a mask predicate (attention.h); the caller's, alive during the call
  ft_forward_args c() const {
    return ft_forward_args{batch, heads, seq_q, seq_k, head_dim, dtype, causal ? 1 : 0, scale,
                           q.c(), k.c(), v.c(), o.c(), lse, heads_k, mods.c(), mask_mod};
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
  int heads_k = 0;             // kv heads of k, v, dk, dv; 0: heads
  bool deterministic = false;  // dq, dk, dv bitwise equal from run to run
  Mods mods;                   // the forward's
  const ft_mask_mod* mask_mod = nullptr;  // the forward's mask predicate
  ft_backward_args c() const {
    return ft_backward_args{batch, heads, seq_q, seq_k, head_dim, dtype, causal ? 1 : 0, scale, q.c(), k.c(), v.c(),
                            o.c(), dout.c(), lse, dq.c(), dk.c(), dv.c(), workspace, workspace_bytes, heads_k,
                            deterministic ? 1 : 0, mods.c(), mask_mod};
  }
};

// A packed variable-length batch (see attention.h: what is checked and what is trusted).
struct VarlenForwardArgs {
  int batch = 0, heads = 0, heads_k = 0, head_dim = 0;
  int total_q = 0, total_k = 0, max_seqlen_q = 0, max_seqlen_k = 0;
  const int32_t* cu_seqlens_q = nullptr;  // device, batch + 1 offsets
  const int32_t* cu_seqlens_k = nullptr;
  ft_dtype dtype = FT_BF16;
  bool causal = false;  // per sequence, bottom-right aligned
  float scale = 0;
  PackedTensor q, k, v, o;
  float* lse = nullptr;  // [H, total_q] fp32, optional
  Mods mods;             // sliding window (per sequence), softcap
  ft_varlen_forward_args c() const {
    return ft_varlen_forward_args{batch,        heads,        heads_k,      head_dim, total_q,    total_k,
                                  max_seqlen_q, max_seqlen_k, cu_seqlens_q, cu_seqlens_k, dtype, causal ? 1 : 0,
                                  scale,        q.c(),        k.c(),        v.c(),    o.c(),      lse, mods.c()};
  }
};

struct VarlenBackwardArgs {
  int batch = 0, heads = 0, heads_k = 0, head_dim = 0;
  int total_q = 0, total_k = 0, max_seqlen_q = 0, max_seqlen_k = 0;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  ft_dtype dtype = FT_BF16;
  bool causal = false;
  float scale = 0;
  PackedTensor q, k, v, o, dout;
  const float* lse = nullptr;  // the forward's [H, total_q] fp32 LSE, contiguous
  PackedTensor dq, dk, dv;
  void* workspace = nullptr;   // nullptr: allocated on the stream
  size_t workspace_bytes = 0;
  bool deterministic = false;
  Mods mods;                   // the forward's
  ft_varlen_backward_args c() const {
    return ft_varlen_backward_args{batch,   heads,   heads_k, head_dim, total_q, total_k, max_seqlen_q, max_seqlen_k,
                                   cu_seqlens_q, cu_seqlens_k, dtype, causal ? 1 : 0, scale, q.c(), k.c(), v.c(),
                                   o.c(),   dout.c(), lse,    dq.c(),   dk.c(),  dv.c(),  workspace,    workspace_bytes,
                                   deterministic ? 1 : 0, mods.c()};
  }
};

// Decoding from a paged K/V cache (see attention.h: the layout, what is checked and what is trusted).
struct PagedForwardArgs {
  int batch = 0, heads = 0, heads_k = 0, seq_q = 0, head_dim = 0;
  int num_pages = 0, page_size = 0, max_pages = 0;
  int max_seqlen_k = 0;                    // the longest cache length (config lookup only); 0: the capacity
  ft_dtype dtype = FT_BF16;
  bool causal = false;                     // per sequence, bottom-right aligned
  float scale = 0;
  const int32_t* block_table = nullptr;    // device, [batch, max_pages]
  const int32_t* cache_seqlens = nullptr;  // device, [batch]
  Tensor q, k_pages, v_pages, o;           // pools: Tensor::bhsd(pool, num_pages, heads_k, page_size, d)
                                           // (FT_PAGES_NHD: Tensor::bhsd(pool, num_pages, page_size, heads_k, d))
  float* lse = nullptr;                    // [B, H, Sq] fp32, optional
  ft_page_layout layout = FT_PAGES_HND;    // FT_PAGES_NHD: FlashAttention's and vLLM's [num_pages, page_size, Hk, d]
  ft_paged_forward_args c() const {
    return ft_paged_forward_args{batch,     heads,     heads_k,      seq_q, head_dim,       num_pages,
                                 page_size, max_pages, max_seqlen_k, dtype, causal ? 1 : 0, scale,
                                 block_table, cache_seqlens, q.c(), k_pages.c(), v_pages.c(), o.c(), lse, (int)layout};
  }
};

namespace detail {
// A ft_explain_*_text call on the C struct: its line, or "error: <why>" when the call could not be planned.
template <class C>
std::string explain_text(ft_status (*text)(const C*, char*, size_t), const C& c) {
  char buf[512];
  return text(&c, buf, sizeof buf) == FT_OK ? std::string(buf) : "error: " + std::string(ft_last_error());
}
}  // namespace detail

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
inline std::string explain(const ForwardArgs& a) { return detail::explain_text(ft_explain_forward_text, a.c()); }
inline std::string explain(const BackwardArgs& a) { return detail::explain_text(ft_explain_backward_text, a.c()); }
inline Status varlen_forward(const VarlenForwardArgs& a, void* stream = nullptr) {
  const ft_varlen_forward_args c = a.c();
  return status_of(ft_attention_varlen_forward(&c, stream));
}
inline Status varlen_backward(const VarlenBackwardArgs& a, void* stream = nullptr) {
  const ft_varlen_backward_args c = a.c();
  return status_of(ft_attention_varlen_backward(&c, stream));
}
inline Status varlen_backward_workspace_bytes(const VarlenBackwardArgs& a, size_t* bytes) {
  const ft_varlen_backward_args c = a.c();
  return status_of(ft_varlen_backward_workspace_bytes(&c, bytes));
}
inline Status explain(const VarlenForwardArgs& a, ft_explanation* out) {
  const ft_varlen_forward_args c = a.c();
  return status_of(ft_explain_varlen_forward(&c, out));
}
inline Status explain(const VarlenBackwardArgs& a, ft_explanation* out) {
  const ft_varlen_backward_args c = a.c();
  return status_of(ft_explain_varlen_backward(&c, out));
}
inline std::string explain(const VarlenForwardArgs& a) {
  return detail::explain_text(ft_explain_varlen_forward_text, a.c());
}
inline std::string explain(const VarlenBackwardArgs& a) {
  return detail::explain_text(ft_explain_varlen_backward_text, a.c());
}
inline Status paged_forward(const PagedForwardArgs& a, void* stream = nullptr) {
  const ft_paged_forward_args c = a.c();
  return status_of(ft_attention_paged_forward(&c, stream));
}
inline Status explain(const PagedForwardArgs& a, ft_explanation* out) {
  const ft_paged_forward_args c = a.c();
  return status_of(ft_explain_paged_forward(&c, out));
}
inline std::string explain(const PagedForwardArgs& a) {
  return detail::explain_text(ft_explain_paged_forward_text, a.c());
}
// Scratch (attention.h): the allocator calls take their scratch from (nullptr, nullptr: the library's pool), the
// pool's memory returned to the driver, and the bytes the pool holds.
inline Status set_scratch_allocator(ft_scratch_alloc_fn alloc_fn, ft_scratch_free_fn free_fn, void* user = nullptr) {
  return status_of(ft_set_scratch_allocator(alloc_fn, free_fn, user));
}
inline Status release_scratch() { return status_of(ft_release_scratch()); }
inline Status scratch_pool_bytes(size_t* bytes) { return status_of(ft_scratch_pool_bytes(bytes)); }
inline Status reload_settings() { return status_of(ft_reload_settings()); }
inline Status device_available() { return status_of(ft_device_available()); }
inline std::string version() { return ft_version(); }

}  // namespace runtime
}  // namespace flashtune
