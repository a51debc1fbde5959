#include "args.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <mutex>
#include <set>

#include "core/util.hpp"
#include "lookup.hpp"

namespace flashtune::rt {

namespace {
constexpr int64_t kMaxElements = std::numeric_limits<int32_t>::max();  // per tensor

Check bad(ft_status s, std::string m) { return {s, std::move(m)}; }

// A tensor: pointer, non-negative strides, elements it spans within 32-bit indexing, and (outputs) no two
// elements at one address. Messages name the caller's strides (3 for a packed tensor).
std::string check_tensor(const TensorArg& t, bool size_limits) {
  const char* name = t.name;  // a std::string only for a message (this runs for every tensor of every call)
  if (!t.data) return std::string(name) + ".data is null";
  static const int dense_dims[] = {0, 1, 2, 3}, packed_dims[] = {0, 1, 3};  // view dim of the caller's stride[i]
  const int* dims = t.packed ? packed_dims : dense_dims;
  const int rank = t.packed ? 3 : 4;
  int64_t span = 0;  // the largest element offset
  for (int i = 0; i < rank; ++i) {
    const int64_t s = t.stride[dims[i]];
    if (s < 0) return std::string(name) + ".stride[" + std::to_string(i) + "] is negative";
    if (size_limits && s > kMaxElements) return std::string(name) + ".stride[" + std::to_string(i) + "] is over 2^31";
    span += s * (t.ext[dims[i]] - 1);
  }
  if (size_limits && (t.ext[0] * t.ext[1] * t.ext[2] * t.ext[3] > kMaxElements || span > kMaxElements))
    return std::string(name) + " has over 2^31 elements (unsupported)";
  if (t.output) {
    // Sorted by stride, each dimension must step past everything the smaller ones reach.
    int idx[4] = {0, 1, 2, 3};
    std::sort(idx, idx + 4, [&](int x, int y) { return t.stride[x] < t.stride[y]; });
    int64_t reach = 0;  // largest offset reachable by the smaller dimensions
    for (int i : idx) {
      if (t.ext[i] == 1) continue;
      if (t.stride[i] <= reach) return std::string(name) + " has overlapping strides (an output must not alias itself)";
      reach += t.stride[i] * (t.ext[i] - 1);
    }
  }
  return "";
}

struct Size {
  const char* name;
  int v;
};
Check check_sizes(std::initializer_list<Size> sizes) {
  for (const Size& s : sizes)
    if (s.v <= 0) return bad(FT_INVALID_ARGUMENT, std::string(s.name) + " must be positive, got " + std::to_string(s.v));
  return {};
}

Check check_common(int heads, int heads_k, int head_dim, const ft_dtype& dtype_field, float scale, const char* direction,
                   bool varlen, bool paged = false) {
  // The field's bits: a C caller may store any int there, and loading it as the enum would be undefined (UBSan).
  static_assert(sizeof(ft_dtype) == sizeof(int));
  int dtype;
  std::memcpy(&dtype, &dtype_field, sizeof dtype);
  if (dtype != FT_FP32 && dtype != FT_FP16 && dtype != FT_BF16)
    return bad(FT_INVALID_ARGUMENT, "dtype " + std::to_string(dtype) + " is not FT_FP32, FT_FP16 or FT_BF16");
  if (!std::isfinite(scale)) return bad(FT_INVALID_ARGUMENT, "scale is not finite");
  if (heads_k < 0 || (heads_k > 0 && heads % heads_k))
    return bad(FT_INVALID_ARGUMENT, "heads_k " + std::to_string(heads_k) + " must be 0 or divide heads " + std::to_string(heads));
  const bool gqa = heads_k > 0 && heads_k != heads;
  if (std::string why = unsupported_reason(direction, to_dtype((ft_dtype)dtype), head_dim, gqa, varlen, paged); !why.empty())
    return bad(FT_UNSUPPORTED, why);
  return {};
}

// The score modifications (ft_mods): their fields, then a family that has them for this call (FT_UNSUPPORTED
// naming what is missing otherwise: the forwards fa3_wgmma and fa2_mma and the Hopper backward have them so far). ALiBi's slopes: 4-byte aligned, the
// batch stride 0 ([H]) or at least heads ([B, H]) and below 2^31.
Check check_mods(const ft_mods& m, int heads, int heads_k, int head_dim, const ft_dtype& dtype, const char* direction,
                 bool varlen) {
  if (m.window != 0 && m.window != 1)
    return bad(FT_INVALID_ARGUMENT, "mods.window must be 0 (none) or 1, got " + std::to_string(m.window));
  Problem p;
  try {
    if (m.window) {
      p.window_left = check_window_edge(m.window_left, "mods.window_left");
      p.window_right = check_window_edge(m.window_right, "mods.window_right");
    }
    p.softcap = check_softcap(m.softcap, "mods.softcap");
  } catch (const std::exception& e) {
    return bad(FT_INVALID_ARGUMENT, e.what());
  }
  if (m.alibi_slopes) {
    if (reinterpret_cast<uintptr_t>(m.alibi_slopes) % 4 != 0)
      return bad(FT_INVALID_ARGUMENT, "mods.alibi_slopes must be 4-byte aligned (fp32)");
    if (m.alibi_batch_stride != 0 && (m.alibi_batch_stride < heads || m.alibi_batch_stride > INT32_MAX))
      return bad(FT_INVALID_ARGUMENT, "mods.alibi_batch_stride must be 0 (slopes [H]) or in heads (" +
                                          std::to_string(heads) + ")..2^31-1 (slopes [B, H]), got " +
                                          std::to_string(m.alibi_batch_stride));
    p.alibi = true;
  } else if (m.alibi_batch_stride != 0) {
    return bad(FT_INVALID_ARGUMENT, "mods.alibi_batch_stride " + std::to_string(m.alibi_batch_stride) +
                                        " without mods.alibi_slopes (must be 0)");
  }
  if (const unsigned mods = problem_mods(p)) {
    const bool gqa = heads_k > 0 && heads_k != heads;
    if (std::string why = unsupported_reason(direction, to_dtype(dtype), head_dim, gqa, varlen, false, mods); !why.empty())
      return bad(FT_UNSUPPORTED, why);
  }
  return {};
}

Check check_tensors(const std::vector<TensorArg>& ts, bool size_limits = true) {
  for (const TensorArg& t : ts)
    if (std::string why = check_tensor(t, size_limits); !why.empty()) return bad(FT_INVALID_ARGUMENT, why);
  return {};
}

// The most batches of [B, ...] tensors one call may index in 32 bits: every stride, one batch's elements and
// span, and the span of n batches (stride[0] (n - 1) + one batch's) within 2^31 - 1, and n batches of
// per_batch more elements (the backward's dq accumulator). 0: not even one batch.
int fit_batches(const std::vector<TensorArg>& ts, int batch, int64_t per_batch) {
  int64_t most = batch;
  for (const TensorArg& t : ts) {
    int64_t one = 1, inner = 0;  // one batch's elements and largest offset
    for (int i = 0; i < 4; ++i) {
      if (t.stride[i] > kMaxElements) return 0;
      if (i > 0) one *= t.ext[i], inner += t.stride[i] * (t.ext[i] - 1);
    }
    if (one > kMaxElements || inner > kMaxElements) return 0;
    most = std::min(most, kMaxElements / one);
    if (t.stride[0] > 0) most = std::min(most, (kMaxElements - inner) / t.stride[0] + 1);
  }
  if (per_batch > 0) most = std::min(most, kMaxElements / per_batch);
  return (int)most;
}

// Data pointer t advanced by b batches of stride stride0 elements of elem bytes.
void advance(ft_tensor& t, int64_t b, size_t elem) {
  t.data = static_cast<char*>(t.data) + b * t.stride[0] * (int64_t)elem;
}
size_t elem_bytes(ft_dtype t) { return t == FT_FP32 ? 4 : 2; }

// A device pointer to int32s the kernels read (cu_seqlens, a block table, cache lengths): not null, aligned.
Check check_int32s(const int32_t* p, const char* name, const char* what) {
  if (!p) return bad(FT_INVALID_ARGUMENT, std::string(name) + " is null (" + what + " in device memory)");
  if (reinterpret_cast<uintptr_t>(p) % 4) return bad(FT_INVALID_ARGUMENT, std::string(name) + " is not 4-byte aligned (int32)");
  return {};
}

// A packed batch's sizes and offsets: what the host can check without reading device memory.
template <class Args>
Check check_varlen_common(const Args* a, const char* direction) {
  if (Check c = check_sizes({{"batch", a->batch}, {"heads", a->heads}, {"head_dim", a->head_dim},
                             {"total_q", a->total_q}, {"total_k", a->total_k}, {"max_seqlen_q", a->max_seqlen_q},
                             {"max_seqlen_k", a->max_seqlen_k}});
      c.status != FT_OK)
    return c;
  if (a->batch > kMaxVarlenSeqs)
    return bad(FT_INVALID_ARGUMENT, "batch " + std::to_string(a->batch) + " is over " + std::to_string(kMaxVarlenSeqs) +
                                        " sequences (one grid row each)");
  const Size lengths[] = {{"total_q", a->total_q}, {"total_k", a->total_k}, {"max_seqlen_q", a->max_seqlen_q},
                          {"max_seqlen_k", a->max_seqlen_k}};
  for (const Size& s : lengths)
    if (s.v > kMaxVarlenTokens)
      return bad(FT_INVALID_ARGUMENT, std::string(s.name) + " " + std::to_string(s.v) + " is over 2^24 tokens (unsupported)");
  // Every sequence is at most max_seqlen long, so the batch holds at most batch * max_seqlen tokens; more
  // means a longer sequence, whose rows past the grid would never be computed.
  for (auto [total, max, tn, mn] : {std::tuple{a->total_q, a->max_seqlen_q, "total_q", "max_seqlen_q"},
                                    std::tuple{a->total_k, a->max_seqlen_k, "total_k", "max_seqlen_k"}})
    if ((int64_t)total > (int64_t)a->batch * max)
      return bad(FT_INVALID_ARGUMENT, std::string(tn) + " " + std::to_string(total) + " is more than batch " +
                                          std::to_string(a->batch) + " x " + mn + " " + std::to_string(max) +
                                          ": some sequence would be longer than " + mn);
  for (auto [p, n] : {std::pair{a->cu_seqlens_q, "cu_seqlens_q"}, std::pair{a->cu_seqlens_k, "cu_seqlens_k"}})
    if (Check c = check_int32s(p, n, "batch + 1 int32 offsets"); c.status != FT_OK) return c;
  if (Check c = check_common(a->heads, a->heads_k, a->head_dim, a->dtype, a->scale, direction, true); c.status != FT_OK)
    return c;
  if (Check c = check_mods(a->mods, a->heads, a->heads_k, a->head_dim, a->dtype, direction, true); c.status != FT_OK)
    return c;
  return check_tensors(tensor_args(a));
}

// A pool of pages is read in place (never packed to scratch: it may be most of the GPU's memory), so it must
// be the contiguous [num_pages, heads_k, page_size, d] the kernel addresses (paged_key_offset), or for
// token-major pages [num_pages, page_size, heads_k, d] (nhd_paged_key_offset: t's view is then that order), and
// 16-byte aligned (its 16-byte copies). No 2^31-element limit: page offsets are 64-bit in the kernel.
std::string check_pool(const TensorArg& t, PageLayout layout) {
  const std::string name = t.name;
  if (!t.data) return name + ".data is null";
  if ((long double)t.ext[0] * t.ext[1] * t.ext[2] * t.ext[3] > (long double)(int64_t{1} << 47))
    return name + " has over 2^47 elements (num_pages x heads_k x page_size x head_dim): not a device allocation";
  if (!is_contiguous(t)) {
    auto list = [](auto f) {
      std::string s;
      for (int i = 0; i < 4; ++i) s += (i ? ", " : "") + std::to_string(f(i));
      return s;
    };
    const int64_t want[4] = {t.ext[1] * t.ext[2] * t.ext[3], t.ext[2] * t.ext[3], t.ext[3], 1};
    if (layout == PageLayout::nhd)
      return name + " is not a contiguous [num_pages, page_size, heads_k, head_dim] pool (strides " +
             list([&](int i) { return t.stride[i]; }) + ", want " + list([&](int i) { return want[i]; }) +
             "): pages are read in place (layout FT_PAGES_NHD)";
    return name + " is not a contiguous [num_pages, heads_k, page_size, head_dim] pool (strides " +
           list([&](int i) { return t.stride[i]; }) + ", want " + list([&](int i) { return want[i]; }) +
           "): pages are read in place, each kv head's keys of a page adjacent (FlashAttention's [num_blocks, "
           "page_size, heads_k, d] is layout FT_PAGES_NHD)";
  }
  if (reinterpret_cast<uintptr_t>(t.data) % 16) return name + " is not 16-byte aligned (pages are read in 16-byte copies)";
  return "";
}

Check check_lse(const float* lse, bool required) {
  if (!lse) return required ? bad(FT_INVALID_ARGUMENT, "lse is null (the backward needs the forward's LSE)") : Check{};
  if (reinterpret_cast<uintptr_t>(lse) % 4) return bad(FT_INVALID_ARGUMENT, "lse is not 4-byte aligned");
  return {};
}

// [B, H, S, d] with its 4 strides, or a packed [total, H, d] as [total, H, 1, d].
TensorArg dense(const char* name, const ft_tensor& t, int64_t b, int64_t h, int64_t s, int64_t d, bool output) {
  return {name, t.data, {b, h, s, d}, {t.stride[0], t.stride[1], t.stride[2], t.stride[3]}, output};
}
TensorArg packed(const char* name, const ft_packed_tensor& t, int64_t total, int64_t h, int64_t d, bool output) {
  return {name, t.data, {total, h, 1, d}, {t.stride[0], t.stride[1], 0, t.stride[2]}, output, true};
}
}  // namespace

DType to_dtype(ft_dtype t) { return t == FT_FP16 ? DType::fp16 : t == FT_BF16 ? DType::bf16 : DType::fp32; }

float softmax_scale(float scale, int head_dim) { return scale > 0 ? scale : (float)(1.0 / std::sqrt((double)head_dim)); }

bool is_contiguous(const TensorArg& t) {
  const int64_t want[4] = {t.ext[1] * t.ext[2] * t.ext[3], t.ext[2] * t.ext[3], t.ext[3], 1};
  for (int i = 0; i < 4; ++i)
    if (t.ext[i] > 1 && t.stride[i] != want[i]) return false;
  return true;
}

bool direct(const TensorArg& t) { return is_contiguous(t) && (reinterpret_cast<uintptr_t>(t.data) % 16) == 0; }

std::vector<int> host_lengths(int batch, int total, int max_len) {
  std::vector<int> out(batch, 0);
  for (int b = 0; b < batch && total > 0; ++b) total -= out[b] = std::min(total, max_len);
  return out;
}

int batch_chunk(const ft_forward_args* a) { return fit_batches(tensor_args(a), a->batch, 0); }
int batch_chunk(const ft_backward_args* a) {
  return fit_batches(tensor_args(a), a->batch, (int64_t)a->heads * a->seq_q * a->head_dim);
}

ft_forward_args batch_slice(const ft_forward_args& a, int b0, int n) {
  ft_forward_args s = a;
  s.batch = n;
  if (s.mods.alibi_slopes) s.mods.alibi_slopes += (int64_t)b0 * a.mods.alibi_batch_stride;  // the chunk's batches'
  for (ft_tensor* t : {&s.q, &s.k, &s.v, &s.o}) advance(*t, b0, elem_bytes(a.dtype));
  if (s.lse) s.lse += (int64_t)b0 * a.heads * a.seq_q;
  return s;
}
ft_backward_args batch_slice(const ft_backward_args& a, int b0, int n) {
  ft_backward_args s = a;
  s.batch = n;
  if (s.mods.alibi_slopes) s.mods.alibi_slopes += (int64_t)b0 * a.mods.alibi_batch_stride;
  for (ft_tensor* t : {&s.q, &s.k, &s.v, &s.o, &s.dout, &s.dq, &s.dk, &s.dv}) advance(*t, b0, elem_bytes(a.dtype));
  s.lse += (int64_t)b0 * a.heads * a.seq_q;
  return s;
}

size_t Layout::add(size_t bytes) {
  const size_t off = total;
  total += (bytes + 255) / 256 * 256;
  return off;
}

std::vector<TensorArg> tensor_args(const ft_forward_args* a) {
  const int64_t B = a->batch, H = a->heads, Hk = kv_heads(a), d = a->head_dim;
  return {dense("q", a->q, B, H, a->seq_q, d, false), dense("k", a->k, B, Hk, a->seq_k, d, false),
          dense("v", a->v, B, Hk, a->seq_k, d, false), dense("o", a->o, B, H, a->seq_q, d, true)};
}
std::vector<TensorArg> tensor_args(const ft_backward_args* a) {
  const int64_t B = a->batch, H = a->heads, Hk = kv_heads(a), d = a->head_dim, Sq = a->seq_q, Sk = a->seq_k;
  return {dense("q", a->q, B, H, Sq, d, false),       dense("k", a->k, B, Hk, Sk, d, false),
          dense("v", a->v, B, Hk, Sk, d, false),      dense("o", a->o, B, H, Sq, d, false),
          dense("dout", a->dout, B, H, Sq, d, false), dense("dq", a->dq, B, H, Sq, d, true),
          dense("dk", a->dk, B, Hk, Sk, d, true),     dense("dv", a->dv, B, Hk, Sk, d, true)};
}
std::vector<TensorArg> tensor_args(const ft_varlen_forward_args* a) {
  const int64_t Tq = a->total_q, Tk = a->total_k, H = a->heads, Hk = kv_heads(a), d = a->head_dim;
  return {packed("q", a->q, Tq, H, d, false), packed("k", a->k, Tk, Hk, d, false), packed("v", a->v, Tk, Hk, d, false),
          packed("o", a->o, Tq, H, d, true)};
}
std::vector<TensorArg> tensor_args(const ft_paged_forward_args* a) {
  const int64_t B = a->batch, H = a->heads, Hk = kv_heads(a), d = a->head_dim, P = a->num_pages, S = a->page_size;
  // The pools as the 4-D view of their layout: [P, Hk, S, d], or token-major [P, S, Hk, d].
  const bool nhd = a->layout == FT_PAGES_NHD;
  const int64_t e1 = nhd ? S : Hk, e2 = nhd ? Hk : S;
  std::vector<TensorArg> ts = {dense("q", a->q, B, H, a->seq_q, d, false), dense("k_pages", a->k_pages, P, e1, e2, d, false),
                                dense("v_pages", a->v_pages, P, e1, e2, d, false), dense("o", a->o, B, H, a->seq_q, d, true)};
  ts[1].pool = ts[2].pool = true;
  return ts;
}
std::vector<TensorArg> tensor_args(const ft_varlen_backward_args* a) {
  const int64_t Tq = a->total_q, Tk = a->total_k, H = a->heads, Hk = kv_heads(a), d = a->head_dim;
  return {packed("q", a->q, Tq, H, d, false),       packed("k", a->k, Tk, Hk, d, false),
          packed("v", a->v, Tk, Hk, d, false),      packed("o", a->o, Tq, H, d, false),
          packed("dout", a->dout, Tq, H, d, false), packed("dq", a->dq, Tq, H, d, true),
          packed("dk", a->dk, Tk, Hk, d, true),     packed("dv", a->dv, Tk, Hk, d, true)};
}

Check check_mask_mod(const ft_mask_mod* m, bool compile, MaskPredicate* out) {
  if (!m) return bad(FT_INVALID_ARGUMENT, "mask_mod is null");
  if (m->struct_size < sizeof(ft_mask_mod))
    return bad(FT_INVALID_ARGUMENT, "mask_mod.struct_size " + std::to_string(m->struct_size) + " is below sizeof(ft_mask_mod) " +
                                        std::to_string(sizeof(ft_mask_mod)) + " (a caller compiled against an older header)");
  if (!m->predicate) return bad(FT_INVALID_ARGUMENT, "mask_mod.predicate is null");
  const size_t len = strnlen(m->predicate, kMaxMaskModBytes + 1);
  if (len > kMaxMaskModBytes)
    return bad(FT_INVALID_ARGUMENT, "mask_mod is more than " + std::to_string(kMaxMaskModBytes) + " bytes");
  if (m->num_tensors < 0 || m->num_tensors > FT_MAX_MASK_TENSORS)
    return bad(FT_INVALID_ARGUMENT, "mask_mod.num_tensors must be 0.." + std::to_string(FT_MAX_MASK_TENSORS) + ", got " +
                                        std::to_string(m->num_tensors));
  std::vector<std::string> names;
  for (int i = 0; i < m->num_tensors; ++i) {
    const std::string at = "mask_mod tensor " + std::to_string(i);
    if (!m->names[i]) return bad(FT_INVALID_ARGUMENT, at + ": its name is null");
    names.emplace_back(m->names[i], strnlen(m->names[i], kMaxMaskTensorName + 1));
    if (!m->tensors[i]) return bad(FT_INVALID_ARGUMENT, at + " ('" + brief(names.back(), 40) + "'): its pointer is null");
    if (reinterpret_cast<uintptr_t>(m->tensors[i]) % 4 != 0)
      return bad(FT_INVALID_ARGUMENT, at + " ('" + brief(names.back(), 40) + "') must be 4-byte aligned (int32)");
    if (m->lengths[i] < 1 || m->lengths[i] > INT32_MAX)
      return bad(FT_INVALID_ARGUMENT, at + " ('" + brief(names.back(), 40) + "'): length " +
                                          std::to_string(m->lengths[i]) + " is outside 1..2^31-1");
  }
  MaskPredicate pred;
  try {
    pred = make_mask_predicate(std::string(m->predicate, len), names);
  } catch (const std::exception& e) {
    return bad(FT_INVALID_ARGUMENT, e.what());
  }
  if (compile) {
    static std::mutex mu;
    static std::set<std::string> compiled;  // the predicates that compiled in this process, by hash
    bool known;
    {
      std::lock_guard<std::mutex> lock(mu);
      known = compiled.count(pred.hash()) > 0;
    }
    if (!known) {
      try {
        check_mask_compiles(pred);
      } catch (const UsageError& e) {
        return bad(FT_INVALID_ARGUMENT, e.what());
      } catch (const std::exception& e) {  // no NVRTC
        return bad(FT_COMPILE_ERROR, e.what());
      }
      std::lock_guard<std::mutex> lock(mu);
      compiled.insert(pred.hash());
    }
  }
  if (out) *out = std::move(pred);
  return {};
}

namespace {
// A dense call's mask_mod against its shape: not with a window or a deterministic backward, a family that has it.
Check check_call_mask(const ft_mask_mod* m, const ft_mods& mods, int heads, int heads_k, int head_dim,
                      const ft_dtype& dtype, const char* direction, bool deterministic) {
  if (!m) return {};
  if (Check c = check_mask_mod(m, true); c.status != FT_OK) return c;
  if (mods.window)
    return bad(FT_INVALID_ARGUMENT, "mask_mod and a window (mods.window) do not combine: write the window in the predicate");
  if (deterministic)
    return bad(FT_UNSUPPORTED, "a deterministic backward has no mask_mod form (its dQ order counts a range of key blocks)");
  const bool gqa = heads_k > 0 && heads_k != heads;
  unsigned mods_bits = kModMask | (mods.softcap > 0 ? kModSoftcap : 0u) | (mods.alibi_slopes ? kModAlibi : 0u);
  if (std::string why = unsupported_reason(direction, to_dtype(dtype), head_dim, gqa, false, false, mods_bits); !why.empty())
    return bad(FT_UNSUPPORTED, why);
  return {};
}
}  // namespace

Check check_forward(const ft_forward_args* a, bool size_limits) {
  if (!a) return bad(FT_INVALID_ARGUMENT, "args is null");
  if (Check c = check_sizes({{"batch", a->batch}, {"heads", a->heads}, {"seq_q", a->seq_q}, {"seq_k", a->seq_k},
                             {"head_dim", a->head_dim}});
      c.status != FT_OK)
    return c;
  if (Check c = check_common(a->heads, a->heads_k, a->head_dim, a->dtype, a->scale, "fwd", false); c.status != FT_OK)
    return c;
  if (Check c = check_mods(a->mods, a->heads, a->heads_k, a->head_dim, a->dtype, "fwd", false); c.status != FT_OK)
    return c;
  if (Check c = check_call_mask(a->mask_mod, a->mods, a->heads, a->heads_k, a->head_dim, a->dtype, "fwd", false);
      c.status != FT_OK)
    return c;
  return check_tensors(tensor_args(a), size_limits);
}

Check check_backward(const ft_backward_args* a, bool size_limits) {
  if (!a) return bad(FT_INVALID_ARGUMENT, "args is null");
  if (Check c = check_sizes({{"batch", a->batch}, {"heads", a->heads}, {"seq_q", a->seq_q}, {"seq_k", a->seq_k},
                             {"head_dim", a->head_dim}});
      c.status != FT_OK)
    return c;
  if (Check c = check_common(a->heads, a->heads_k, a->head_dim, a->dtype, a->scale, "bwd", false); c.status != FT_OK)
    return c;
  if (Check c = check_mods(a->mods, a->heads, a->heads_k, a->head_dim, a->dtype, "bwd", false); c.status != FT_OK)
    return c;
  if (Check c = check_call_mask(a->mask_mod, a->mods, a->heads, a->heads_k, a->head_dim, a->dtype, "bwd",
                                a->deterministic != 0);
      c.status != FT_OK)
    return c;
  if (Check c = check_tensors(tensor_args(a), size_limits); c.status != FT_OK) return c;
  if (Check c = check_lse(a->lse, true); c.status != FT_OK) return c;
  if (a->deterministic != 0 && a->deterministic != 1)
    return bad(FT_INVALID_ARGUMENT, "deterministic must be 0 or 1, got " + std::to_string(a->deterministic));
  if (size_limits && (int64_t)a->batch * a->heads * a->seq_q * a->head_dim > kMaxElements)
    return bad(FT_INVALID_ARGUMENT, "dq_accum would have over 2^31 elements (unsupported)");
  return {};
}

Check check_varlen_forward(const ft_varlen_forward_args* a) {
  if (!a) return bad(FT_INVALID_ARGUMENT, "args is null");
  if (Check c = check_varlen_common(a, "fwd"); c.status != FT_OK) return c;
  return check_lse(a->lse, false);
}

Check check_varlen_backward(const ft_varlen_backward_args* a) {
  if (!a) return bad(FT_INVALID_ARGUMENT, "args is null");
  if (Check c = check_varlen_common(a, "bwd"); c.status != FT_OK) return c;
  if (a->deterministic != 0 && a->deterministic != 1)
    return bad(FT_INVALID_ARGUMENT, "deterministic must be 0 or 1, got " + std::to_string(a->deterministic));
  return check_lse(a->lse, true);  // dq_accum is dq's size in fp32: covered by dq's element count
}

Check check_paged_forward(const ft_paged_forward_args* a) {
  if (!a) return bad(FT_INVALID_ARGUMENT, "args is null");
  if (Check c = check_sizes({{"batch", a->batch}, {"heads", a->heads}, {"seq_q", a->seq_q}, {"head_dim", a->head_dim},
                             {"num_pages", a->num_pages}, {"page_size", a->page_size}, {"max_pages", a->max_pages}});
      c.status != FT_OK)
    return c;
  if (a->batch > kMaxVarlenSeqs)
    return bad(FT_INVALID_ARGUMENT, "batch " + std::to_string(a->batch) + " is over " + std::to_string(kMaxVarlenSeqs) +
                                        " sequences (one grid row each)");
  if (a->layout != FT_PAGES_HND && a->layout != FT_PAGES_NHD)
    return bad(FT_INVALID_ARGUMENT, "layout must be FT_PAGES_HND (0: [num_pages, heads_k, page_size, d]) or FT_PAGES_NHD "
                                    "(1: [num_pages, page_size, heads_k, d]), got " + std::to_string(a->layout));
  const int64_t capacity = (int64_t)a->max_pages * a->page_size;
  if (capacity > kMaxPagedKeys)
    return bad(FT_INVALID_ARGUMENT, "max_pages x page_size = " + std::to_string(capacity) +
                                        " keys a sequence is over 2^30 (the kernels index keys in 32 bits)");
  if (a->max_seqlen_k < 0 || a->max_seqlen_k > capacity)
    return bad(FT_INVALID_ARGUMENT, "max_seqlen_k " + std::to_string(a->max_seqlen_k) +
                                        " is outside 0..max_pages x page_size = " + std::to_string(capacity) +
                                        " (0: that capacity)");
  if (Check c = check_int32s(a->block_table, "block_table", "int32 [batch, max_pages]"); c.status != FT_OK) return c;
  if (Check c = check_int32s(a->cache_seqlens, "cache_seqlens", "int32 [batch]"); c.status != FT_OK) return c;
  if (Check c = check_common(a->heads, a->heads_k, a->head_dim, a->dtype, a->scale, "fwd", false, true); c.status != FT_OK)
    return c;
  if (const int m = paged_max_seq_q(); m > 0 && a->seq_q > m)
    return bad(FT_UNSUPPORTED, "seq_q " + std::to_string(a->seq_q) + ": paged K/V caches are read for Sq <= " +
                                   std::to_string(m) + " only (decoding; a longer query is prefill: ft_attention_forward "
                                   "on a contiguous cache)");
  if (std::string why = paged_page_reason(to_dtype(a->dtype), a->head_dim, a->page_size); !why.empty())
    return bad(FT_UNSUPPORTED, why);
  for (const TensorArg& t : tensor_args(a))
    if (std::string why = t.pool ? check_pool(t, a->layout == FT_PAGES_NHD ? PageLayout::nhd : PageLayout::hnd)
                                 : check_tensor(t, true);
        !why.empty())
      return bad(FT_INVALID_ARGUMENT, why);
  return check_lse(a->lse, false);
}

}  // namespace flashtune::rt
