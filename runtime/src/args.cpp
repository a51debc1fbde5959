#include "args.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lookup.hpp"

namespace flashtune::rt {

namespace {
constexpr int64_t kMaxElements = std::numeric_limits<int32_t>::max();  // per tensor

Check bad(ft_status s, std::string m) { return {s, std::move(m)}; }

// A tensor [b, h, s, d]: pointer, non-negative strides, elements it spans within 32-bit indexing,
// and (outputs) no two elements at one address.
std::string check_tensor(const char* name, const ft_tensor& t, int64_t b, int64_t h, int64_t s, int64_t d, bool output) {
  if (!t.data) return std::string(name) + ".data is null";
  const int64_t ext[4] = {b, h, s, d};
  int64_t span = 0;  // the largest element offset
  for (int i = 0; i < 4; ++i) {
    if (t.stride[i] < 0) return std::string(name) + ".stride[" + std::to_string(i) + "] is negative";
    if (t.stride[i] > kMaxElements) return std::string(name) + ".stride[" + std::to_string(i) + "] is over 2^31";
    span += t.stride[i] * (ext[i] - 1);
  }
  if (b * h * s * d > kMaxElements || span > kMaxElements)
    return std::string(name) + " has over 2^31 elements (unsupported)";
  if (output) {
    // Sorted by stride, each dimension must step past everything the smaller ones reach.
    int idx[4] = {0, 1, 2, 3};
    std::sort(idx, idx + 4, [&](int x, int y) { return t.stride[x] < t.stride[y]; });
    int64_t reach = 0;  // largest offset reachable by the smaller dimensions
    for (int i : idx) {
      if (ext[i] == 1) continue;
      if (t.stride[i] <= reach) return std::string(name) + " has overlapping strides (an output must not alias itself)";
      reach += t.stride[i] * (ext[i] - 1);
    }
  }
  return "";
}

Check check_common(int batch, int heads, int heads_k, int seq_q, int seq_k, int head_dim, ft_dtype dtype, float scale,
                   const char* direction) {
  const struct {
    const char* name;
    int v;
  } sizes[] = {{"batch", batch}, {"heads", heads}, {"seq_q", seq_q}, {"seq_k", seq_k}, {"head_dim", head_dim}};
  for (const auto& s : sizes)
    if (s.v <= 0) return bad(FT_INVALID_ARGUMENT, std::string(s.name) + " must be positive, got " + std::to_string(s.v));
  if (dtype != FT_FP32 && dtype != FT_FP16 && dtype != FT_BF16)
    return bad(FT_INVALID_ARGUMENT, "dtype " + std::to_string((int)dtype) + " is not FT_FP32, FT_FP16 or FT_BF16");
  if (!std::isfinite(scale)) return bad(FT_INVALID_ARGUMENT, "scale is not finite");
  if (heads_k < 0 || (heads_k > 0 && heads % heads_k))
    return bad(FT_INVALID_ARGUMENT, "heads_k " + std::to_string(heads_k) + " must be 0 or divide heads " + std::to_string(heads));
  const bool gqa = heads_k > 0 && heads_k != heads;
  if (std::string why = unsupported_reason(direction, to_dtype(dtype), head_dim, gqa); !why.empty())
    return bad(FT_UNSUPPORTED, why);
  return {};
}
}  // namespace

DType to_dtype(ft_dtype t) { return t == FT_FP16 ? DType::fp16 : t == FT_BF16 ? DType::bf16 : DType::fp32; }

float softmax_scale(float scale, int head_dim) { return scale > 0 ? scale : (float)(1.0 / std::sqrt((double)head_dim)); }

bool is_contiguous(const ft_tensor& t, int64_t b, int64_t h, int64_t s, int64_t d) {
  const int64_t ext[4] = {b, h, s, d}, want[4] = {h * s * d, s * d, d, 1};
  for (int i = 0; i < 4; ++i)
    if (ext[i] > 1 && t.stride[i] != want[i]) return false;
  return true;
}

bool direct(const ft_tensor& t, int64_t b, int64_t h, int64_t s, int64_t d) {
  return is_contiguous(t, b, h, s, d) && (reinterpret_cast<uintptr_t>(t.data) % 16) == 0;
}

size_t Layout::add(size_t bytes) {
  const size_t off = total;
  total += (bytes + 255) / 256 * 256;
  return off;
}

std::vector<TensorArg> tensor_args(const ft_forward_args* a) {
  return {{"q", &a->q, a->seq_q, false},      {"k", &a->k, a->seq_k, false, true}, {"v", &a->v, a->seq_k, false, true},
          {"o", &a->o, a->seq_q, true}};
}
std::vector<TensorArg> tensor_args(const ft_backward_args* a) {
  return {{"q", &a->q, a->seq_q, false},        {"k", &a->k, a->seq_k, false, true},
          {"v", &a->v, a->seq_k, false, true},  {"o", &a->o, a->seq_q, false},
          {"dout", &a->dout, a->seq_q, false},  {"dq", &a->dq, a->seq_q, true},
          {"dk", &a->dk, a->seq_k, true, true}, {"dv", &a->dv, a->seq_k, true, true}};
}

Check check_forward(const ft_forward_args* a) {
  if (!a) return bad(FT_INVALID_ARGUMENT, "args is null");
  if (Check c = check_common(a->batch, a->heads, a->heads_k, a->seq_q, a->seq_k, a->head_dim, a->dtype, a->scale, "fwd");
      c.status != FT_OK)
    return c;
  const int64_t B = a->batch, d = a->head_dim;
  for (const TensorArg& t : tensor_args(a))
    if (std::string why = check_tensor(t.name, *t.t, B, t.kv ? kv_heads(a) : a->heads, t.seq, d, t.output); !why.empty())
      return bad(FT_INVALID_ARGUMENT, why);
  return {};
}

Check check_backward(const ft_backward_args* a) {
  if (!a) return bad(FT_INVALID_ARGUMENT, "args is null");
  if (Check c = check_common(a->batch, a->heads, a->heads_k, a->seq_q, a->seq_k, a->head_dim, a->dtype, a->scale, "bwd");
      c.status != FT_OK)
    return c;
  const int64_t B = a->batch, H = a->heads, Sq = a->seq_q, d = a->head_dim;
  for (const TensorArg& t : tensor_args(a))
    if (std::string why = check_tensor(t.name, *t.t, B, t.kv ? kv_heads(a) : a->heads, t.seq, d, t.output); !why.empty())
      return bad(FT_INVALID_ARGUMENT, why);
  if (!a->lse) return bad(FT_INVALID_ARGUMENT, "lse is null (the backward needs the forward's LSE)");
  if (reinterpret_cast<uintptr_t>(a->lse) % 4) return bad(FT_INVALID_ARGUMENT, "lse is not 4-byte aligned");
  if (B * H * Sq * d > kMaxElements) return bad(FT_INVALID_ARGUMENT, "dq_accum would have over 2^31 elements (unsupported)");
  return {};
}

}  // namespace flashtune::rt
