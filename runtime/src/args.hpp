// Argument checks and scratch layout for the C ABI: pure host code (no GPU), unit-tested.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flashtune/attention.h"
#include "tuner/problem.hpp"

namespace flashtune::rt {

struct Check {
  ft_status status = FT_OK;
  std::string message;  // one line when status != FT_OK
};

// Null pointers, non-positive sizes, an unknown dtype, a non-finite scale, negative strides, an output
// whose strides make elements overlap, tensors too large for the kernels' 32-bit indexing
// (FT_INVALID_ARGUMENT); a head dim or dtype no family runs in that direction (FT_UNSUPPORTED).
Check check_forward(const ft_forward_args* a);
Check check_backward(const ft_backward_args* a);

// The stride of contiguous [B, H, S, d] in dimension i (dims of extent 1 match any stride).
bool is_contiguous(const ft_tensor& t, int64_t b, int64_t h, int64_t s, int64_t d);
// Goes straight to the kernel: contiguous and 16-byte aligned (the kernels' vector loads); otherwise
// it is packed to (or, for an output, unpacked from) contiguous scratch.
bool direct(const ft_tensor& t, int64_t b, int64_t h, int64_t s, int64_t d);

// The tensors of a call, in one table for the argument checks and the packing: name, its sequence
// length, whether the call writes it.
struct TensorArg {
  const char* name;
  const ft_tensor* t;
  int64_t seq;
  bool output;
  bool kv = false;  // k, v, dk, dv: heads_k heads under grouped-query attention
};
// The kv heads a call's k and v have (heads_k, or heads when 0).
template <class Args>
int kv_heads(const Args* a) {
  return a->heads_k > 0 ? a->heads_k : a->heads;
}
std::vector<TensorArg> tensor_args(const ft_forward_args* a);
std::vector<TensorArg> tensor_args(const ft_backward_args* a);

DType to_dtype(ft_dtype);
float softmax_scale(float scale, int head_dim);  // scale <= 0: 1/sqrt(head_dim)

// One allocation, carved into 256-byte aligned pieces.
struct Layout {
  size_t total = 0;
  size_t add(size_t bytes);  // returns the piece's offset (bytes 0: offset of an empty piece)
};

}  // namespace flashtune::rt
