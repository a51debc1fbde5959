// Argument checks and scratch layout for the C ABI: pure host code (no GPU), unit-tested.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "flashtune/attention.h"

namespace flashtune::rt {

struct Check {
  ft_status status = FT_OK;
  std::string message;  // one line when status != FT_OK
};

// Null pointers, non-positive sizes, an unknown dtype, a non-finite scale, negative strides, an output
// whose strides make elements overlap, tensors too large for the kernels' 32-bit indexing
// (FT_INVALID_ARGUMENT; a dense call runs in batch chunks instead where a chunk fits, batch_chunk); a head dim
// or dtype no family runs in that direction (FT_UNSUPPORTED).
// size_limits false: every check but the 32-bit ones (strides, elements, spans, the dq accumulator), which a
// call in batch chunks meets chunk by chunk (batch_chunk).
Check check_forward(const ft_forward_args* a, bool size_limits);
Check check_backward(const ft_backward_args* a, bool size_limits);
inline Check check_forward(const ft_forward_args* a) { return check_forward(a, true); }
inline Check check_backward(const ft_backward_args* a) { return check_backward(a, true); }
// A dense call whose tensors pass the kernels' 32-bit indexing runs as chunks of its batch that each fit: the
// most batches a chunk may hold (the batch itself when the call fits; 0 when one batch does not), and the
// call on batches [b0, b0 + n) (every tensor's data and the lse advanced by b0 batches; workspace as given,
// reused chunk after chunk in stream order). For args that pass check_*(a, false).
int batch_chunk(const ft_forward_args* a);
int batch_chunk(const ft_backward_args* a);
ft_forward_args batch_slice(const ft_forward_args& a, int b0, int n);
ft_backward_args batch_slice(const ft_backward_args& a, int b0, int n);
// A mask predicate (ft_mask_mod): the struct's fields (its size, the text and names as C strings, the tensors'
// pointers, alignment and lengths), the text and names checked (make_mask_predicate: FT_INVALID_ARGUMENT with its
// line) and, with `compile`, compiled alone by NVRTC once per predicate in the process (check_mask_compiles:
// FT_INVALID_ARGUMENT with NVRTC's first error). The checked predicate in *out when given.
Check check_mask_mod(const ft_mask_mod* m, bool compile, MaskPredicate* out = nullptr);
// Packed variable-length batches: the same, and the batch's sizes (sequences, tokens, longest lengths),
// the cu_seqlens pointers; what lives in device memory (the offsets themselves) is not read (attention.h).
Check check_varlen_forward(const ft_varlen_forward_args* a);
Check check_varlen_backward(const ft_varlen_backward_args* a);
// Paged K/V caches: sizes and their ranges, the block table and cache lengths' pointers (their values are
// device memory: not read), the pools contiguous and 16-byte aligned (read in place), q and o as the dense
// forward's; Sq past the paged families' range, a head dim, dtype or page size they do not read: FT_UNSUPPORTED.
Check check_paged_forward(const ft_paged_forward_args* a);
// The most keys a paged call's sequence may address (max_pages * page_size): the kernels index keys in 32 bits.
inline constexpr int64_t kMaxPagedKeys = int64_t{1} << 30;

// One tensor of a call, as the checks and the packing see it: a 4-D [B, H, S, d] view. A packed
// [total, H, d] tensor is [total, H, 1, d], so that its contiguous form is token-major and the
// strided-copy kernel packs it as any other.
struct TensorArg {
  const char* name;
  void* data;
  int64_t ext[4];
  int64_t stride[4];
  bool output;
  bool packed = false;  // a [total, H, d] tensor: messages name its 3 strides
  bool pool = false;    // a paged cache's pool [num_pages, Hk, page_size, d] (token-major: [num_pages, page_size,
                        // Hk, d]): read in place, never packed
};
// The kv heads a call's k and v have (heads_k, or heads when 0).
template <class Args>
int kv_heads(const Args* a) {
  return a->heads_k > 0 ? a->heads_k : a->heads;
}
// The tensors of a call in the kernels' parameter order (q, k, v, o; backward q, k, v, o, dout, dq, dk, dv).
std::vector<TensorArg> tensor_args(const ft_forward_args* a);
std::vector<TensorArg> tensor_args(const ft_backward_args* a);
std::vector<TensorArg> tensor_args(const ft_varlen_forward_args* a);
std::vector<TensorArg> tensor_args(const ft_varlen_backward_args* a);
std::vector<TensorArg> tensor_args(const ft_paged_forward_args* a);  // q, k_pages, v_pages, o

// Contiguous in its view (dims of extent 1 match any stride).
bool is_contiguous(const TensorArg& t);
// Goes straight to the kernel: contiguous and 16-byte aligned (the kernels' vector loads, TMA); otherwise
// it is packed to (or, for an output, unpacked from) contiguous scratch.
bool direct(const TensorArg& t);

DType to_dtype(ft_dtype);
float softmax_scale(float scale, int head_dim);  // scale <= 0: 1/sqrt(head_dim)

// The lengths a packed call's Problem carries on the host (Problem::varlen): batch lengths summing to
// total, none longer than max_len (the longest first). The real lengths are in device memory; the
// families read only the totals and the count from Problem::varlen (workspace, tensor maps) and the
// longest lengths from Problem::seq_q/seq_k (grids), which test_runtime checks for every packed family.
// Needs total <= batch * max_len (check_varlen_*).
std::vector<int> host_lengths(int batch, int total, int max_len);

// One allocation, carved into 256-byte aligned pieces.
struct Layout {
  size_t total = 0;
  size_t add(size_t bytes);  // returns the piece's offset (bytes 0: offset of an empty piece)
};

}  // namespace flashtune::rt
