// flashtune's PyTorch extension (libflashtune_torch.so): the ops of flashtune.torch registered with torch's
// dispatcher from C++, calling the runtime's C ABI (runtime/include/flashtune/attention.h) directly.
//
// Why C++: through ctypes a forward spent ~45 us on the host before its kernel and a forward + backward 0.64 ms
// against SDPA's 0.39 ms (reports/nvidia-h100-80gb-hbm3/host_time.txt, issue 31): argument packing, Python
// checks, two torch.empty calls from Python, and a backward that runs Python in autograd's engine thread (it
// waits for the GIL). Here the checks, the allocations and the runtime call are C++, and autograd's node is a
// C++ torch::autograd::Function, so a backward never enters Python.
//
// Ops (schemas as flashtune.torch's ctypes fallback registers them under torch.ops.flashtune_ctypes):
//   flashtune::attention_fwd(q, k, v, causal, scale) -> (o, lse)            autograd through attention_bwd
//   flashtune::attention_bwd(dout, q, k, v, o, lse, causal, scale) -> (dq, dk, dv)
//   flashtune::attention_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale) -> (o, lse [H, total_q])
//   flashtune::attention_varlen_bwd(dout, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal, scale)
//   flashtune::attention_paged_fwd(q, k_pages, v_pages, block_table, cache_seqlens, causal, scale,
//                                  max_seqlen_k, layout) -> (o, lse)            forward only; layout an
//                                  ft_page_layout code (0 "hnd", 1 "nhd": flashtune.torch maps the names)
// Kernels: CUDA (the work) and CPU (only to say, in one line, that the tensors must be on a GPU); Autograd for
// the two forwards (lse is an output without a gradient: marked non-differentiable). The fake (meta)
// implementations torch.compile needs live in Python (flashtune/torch.py, named by set_python_module).
// Scratch: at bind the runtime is given torch's caching allocator (ft_set_scratch_allocator), so every call's
// scratch (packed copies, the backward's delta and dq accumulator, split-KV partials) is a block of torch's on the
// op's stream: counted in torch.cuda.memory_stats, reused by torch, returned by torch.cuda.empty_cache.
// Errors: TypeError/ValueError (one line) for bad arguments, as flashtune.torch's Python checks word them; a
// runtime status other than FT_OK raises with "[FT_<STATUS>] " in front of the runtime's line, which
// flashtune.torch turns into flashtune.UnsupportedError and its siblings.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <climits>
#include <optional>
#include <cmath>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "flashtune/attention.h"

namespace flashtune::torch_ext {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kDense = "flashtune.torch.attention";
constexpr const char* kVarlen = "flashtune.torch.attention_varlen";
constexpr const char* kPaged = "flashtune.torch.attention_paged";
// The runtime's limits for packed batches (attention.h), as flashtune/_lib.py states them.
constexpr int64_t kMaxVarlenSeqs = 65535;
constexpr int64_t kMaxVarlenTokens = int64_t{1} << 24;
constexpr int64_t kMaxPagedKeys = int64_t{1} << 30;

// ---- the runtime, bound by flashtune.torch -------------------------------------------------------------------
// The runtime library is the one flashtune/_lib.py loads ($FLASHTUNE_LIBRARY, else beside the package): flashtune.torch
// passes its path to flashtune_torch_bind() once, at import, before any op runs, so that both paths share one
// library (one kernel cache, one plan cache) and this .so needs no RPATH or SONAME of its own.
struct Runtime {
  decltype(&ft_attention_forward) forward = nullptr;
  decltype(&ft_attention_backward) backward = nullptr;
  decltype(&ft_attention_varlen_forward) varlen_forward = nullptr;
  decltype(&ft_attention_varlen_backward) varlen_backward = nullptr;
  decltype(&ft_attention_paged_forward) paged_forward = nullptr;
  decltype(&ft_last_error) last_error = nullptr;
  decltype(&ft_set_scratch_allocator) set_scratch_allocator = nullptr;
};
Runtime g_runtime;

const Runtime& rt() {
  TORCH_CHECK(g_runtime.forward, "flashtune's runtime library is not bound to libflashtune_torch.so: import "
              "flashtune.torch, which binds it, rather than loading the extension alone");
  return g_runtime;
}

// ---- one-line errors --------------------------------------------------------------------------------
std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kDouble: return "torch.float64";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    default: return std::string("torch.") + c10::toString(t);
  }
}

const char* status_name(ft_status s) {
  switch (s) {
    case FT_OK: return "FT_OK";
    case FT_INVALID_ARGUMENT: return "FT_INVALID_ARGUMENT";
    case FT_UNSUPPORTED: return "FT_UNSUPPORTED";
    case FT_NO_GPU: return "FT_NO_GPU";
    case FT_CUDA_ERROR: return "FT_CUDA_ERROR";
    case FT_COMPILE_ERROR: return "FT_COMPILE_ERROR";
  }
  return "FT_CUDA_ERROR";
}

// ---- scratch from torch's caching allocator ------------------------------------------------------------------
// What torch's allocator threw inside a runtime call (out of memory, ...): an exception may not cross the C ABI,
// so it waits here and check_status rethrows it on the same thread, as if an at::empty of the op had thrown.
thread_local std::exception_ptr t_scratch_error;

// ft_scratch_alloc_fn: a block of torch's on the call's device and stream, freed back to it in stream order (the
// runtime calls scratch_free after queueing the call's kernels on that stream, as a tensor's last use would).
void* scratch_alloc(size_t bytes, int device, void* stream, void*) {
  try {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));  // raw_alloc takes the current device
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
  } catch (...) {
    t_scratch_error = std::current_exception();
    return nullptr;
  }
}
void scratch_free(void* ptr, size_t, int, void*, void*) {
  try {
    c10::cuda::CUDACachingAllocator::raw_delete(ptr);  // the block knows its device and stream
  } catch (...) {  // not expected (a pointer torch gave); nothing to report it through
  }
}

// A runtime status: "[FT_<STATUS>] <what>: <ft_last_error()>", a ValueError where the Python classes are
// ValueErrors (invalid argument, unsupported), else a RuntimeError; torch's own exception when its allocator
// threw during the call (torch.OutOfMemoryError for out of memory).
void check_status(ft_status s, const char* what) {
  if (s == FT_OK) return;
  // Only for the allocator's own failure: one left by a call made elsewhere (ctypes) must not stand for another.
  const std::exception_ptr alloc_error = std::exchange(t_scratch_error, nullptr);
  if (alloc_error && std::string(rt().last_error()).rfind("the scratch allocator", 0) == 0)
    std::rethrow_exception(alloc_error);
  const char* why = rt().last_error();
  if (s == FT_INVALID_ARGUMENT || s == FT_UNSUPPORTED)
    TORCH_CHECK_VALUE(false, "[", status_name(s), "] ", what, ": ", why);
  TORCH_CHECK(false, "[", status_name(s), "] ", what, ": ", why);
}

// A shape as Python prints it, "(2, 64, 64)", as flashtune/torch.py's messages show it.
std::string shape_str(const Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + (t.dim() == 1 ? ",)" : ")");
}

// A number for a message: c10::str streams integers through the process's iostream locale, which crashed
// (SIGSEGV) on the H100 machine (gcc 13.3, torch 2.11) where strings did not; std::to_string needs no locale.
std::string n(int64_t x) { return std::to_string(x); }

int to_int(int64_t x, const char* what, const char* fn) {
  TORCH_CHECK_VALUE(x >= 0 && x <= INT_MAX, fn, ": ", what, " = ", n(x), " does not fit the runtime's 32-bit field");
  return static_cast<int>(x);
}

ft_dtype dtype_code(at::ScalarType t) {
  return t == at::kFloat ? FT_FP32 : t == at::kHalf ? FT_FP16 : FT_BF16;
}

// ---- tensors as the runtime takes them ----------------------------------------------------------------
// t when its layout can go to the runtime as it is (unit-stride head dim, positive strides, no two elements at
// one address), else a contiguous copy; the runtime packs any such layout itself (flashtune/torch.py's
// _runtime_layout, the same rule).
Tensor runtime_layout(const Tensor& t) {
  if (t.is_contiguous()) return t;
  const auto st = t.strides();
  const auto sh = t.sizes();
  const int64_t n = t.dim();
  if (sh[n - 1] != 1 && st[n - 1] != 1) return t.contiguous();
  std::array<std::pair<int64_t, int64_t>, 4> dims{};
  int m = 0;
  for (int64_t i = 0; i < n && m < 4; ++i)
    if (sh[i] != 1) dims[m++] = {st[i], sh[i]};
  std::sort(dims.begin(), dims.begin() + m);
  int64_t span = 1;
  for (int i = 0; i < m; ++i) {
    if (dims[i].first < span) return t.contiguous();
    span = dims[i].first * dims[i].second;
  }
  return t;
}

// A size-1 dim's stride, which torch leaves arbitrary, goes as 0 (never read).
ft_tensor ref4(const Tensor& t) {
  ft_tensor r;
  r.data = t.data_ptr();
  for (int i = 0; i < 4; ++i) r.stride[i] = t.size(i) != 1 ? t.stride(i) : 0;
  return r;
}
ft_packed_tensor ref3(const Tensor& t) {
  ft_packed_tensor r;
  r.data = t.data_ptr();
  for (int i = 0; i < 3; ++i) r.stride[i] = t.size(i) != 1 ? t.stride(i) : 0;
  return r;
}

void* stream_of(const Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

// ---- checks (the messages of flashtune/torch.py's _check, so either path words an error alike) --------------
void check_qkv_devices(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v) {
  const char* names[] = {"q", "k", "v"};
  const Tensor* ts[] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i)
    TORCH_CHECK_VALUE(ts[i]->is_cuda(), fn, ": ", names[i], " is on ", ts[i]->device(),
                      "; flashtune runs on CUDA tensors (move them with .cuda())");
  TORCH_CHECK_VALUE(k.device() == q.device() && v.device() == q.device(), fn, ": q, k, v are on different devices (",
                    q.device(), ", ", k.device(), ", ", v.device(), ")");
}

void check_same_dtype(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v) {
  TORCH_CHECK_TYPE(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), fn,
                   ": mixed dtypes (q ", dtype_name(q.scalar_type()), ", k ", dtype_name(k.scalar_type()), ", v ",
                   dtype_name(v.scalar_type()), "); give all three one dtype");
}

// q [B, H, Sq, d], k and v [B, Hk, Sk, d] on one CUDA device, one floating dtype, Hk dividing H.
void check_dense(const Tensor& q, const Tensor& k, const Tensor& v) {
  const char* fn = kDense;
  const char* names[] = {"q", "k", "v"};
  const Tensor* ts[] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i)
    TORCH_CHECK_VALUE(ts[i]->dim() == 4, fn, ": ", names[i],
                      " must be 4-D [batch, heads, seq, head_dim] (torch SDPA's layout), got shape ", shape_str(*ts[i]));
  check_qkv_devices(fn, q, k, v);
  check_same_dtype(fn, q, k, v);
  const auto dt = q.scalar_type();
  TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16, fn, ": dtype ", dtype_name(dt),
                   " is not supported; use torch.float32, torch.float16 or torch.bfloat16");
  const int64_t B = q.size(0), H = q.size(1), d = q.size(3);
  TORCH_CHECK_VALUE(k.size(0) == B && v.size(0) == B, fn, ": batch sizes differ (q ", n(B), ", k ", n(k.size(0)), ", v ",
                    n(v.size(0)), ")");
  TORCH_CHECK_VALUE(v.size(1) == k.size(1) && k.size(1) != 0 && H % k.size(1) == 0, fn, ": q has ", n(H),
                    " heads, k ", n(k.size(1)), " and v ", n(v.size(1)),
                    "; k and v need the same number of heads, dividing q's (grouped-query attention, as torch "
                    "SDPA's enable_gqa=True)");
  TORCH_CHECK_VALUE(k.size(3) == d && v.size(3) == d, fn, ": head dims differ (q ", n(d), ", k ", n(k.size(3)), ", v ",
                    n(v.size(3)), ")");
  TORCH_CHECK_VALUE(v.size(2) == k.size(2), fn, ": k and v have different sequence lengths (", n(k.size(2)), ", ",
                    n(v.size(2)), ")");
}

void check_int_tensor(const char* fn, const char* name, const Tensor& t, int64_t dims, const Tensor& q) {
  TORCH_CHECK_VALUE(t.dim() == dims && t.scalar_type() == at::kInt, fn, ": ", name, " must be a ", dims,
                    "-D torch.int32 tensor, got ", dtype_name(t.scalar_type()), " of shape ", shape_str(t));
  TORCH_CHECK_VALUE(t.device() == q.device(), fn, ": ", name, " is on ", t.device(), ", q on ", q.device(),
                    "; the kernels read it on the GPU");
}

// The packed layout: q [total_q, H, d], k and v [total_k, Hk, d], int32 offsets [batch + 1] on q's device,
// fp16/bf16, max_seqlen in range; flashtune.torch.attention_varlen words these errors first (Python).
void check_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q, const Tensor& cu_k,
                  int64_t max_q, int64_t max_k) {
  const char* fn = kVarlen;
  const char* names[] = {"q", "k", "v"};
  const Tensor* ts[] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i)
    TORCH_CHECK_VALUE(ts[i]->dim() == 3, fn, ": ", names[i],
                      " must be 3-D [total_tokens, heads, head_dim] (flash_attn_varlen_func's layout), got shape ",
                      shape_str(*ts[i]));
  check_qkv_devices(fn, q, k, v);
  check_int_tensor(fn, "cu_seqlens_q", cu_q, 1, q);
  check_int_tensor(fn, "cu_seqlens_k", cu_k, 1, q);
  TORCH_CHECK_VALUE(cu_q.numel() == cu_k.numel(), fn, ": cu_seqlens_q has ", n(cu_q.numel()), " offsets, cu_seqlens_k ",
                    n(cu_k.numel()), "; both hold batch + 1");
  const int64_t batch = cu_q.numel() - 1;
  TORCH_CHECK_VALUE(batch >= 1 && batch <= kMaxVarlenSeqs, fn, ": cu_seqlens_q has ", n(batch + 1),
                    " offsets: batch + 1 for a batch of 1 to ", n(kMaxVarlenSeqs), " sequences");
  TORCH_CHECK_VALUE(max_q >= 1 && max_q <= kMaxVarlenTokens, fn, ": max_seqlen_q = ", n(max_q), " is out of range [1, ",
                    n(kMaxVarlenTokens), "]");
  TORCH_CHECK_VALUE(max_k >= 1 && max_k <= kMaxVarlenTokens, fn, ": max_seqlen_k = ", n(max_k), " is out of range [1, ",
                    n(kMaxVarlenTokens), "]");
  check_same_dtype(fn, q, k, v);
  TORCH_CHECK_TYPE(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, fn, ": dtype ",
                   dtype_name(q.scalar_type()),
                   " is not supported for packed batches; use torch.float16 or torch.bfloat16");
  TORCH_CHECK_VALUE(v.size(0) == k.size(0), fn, ": k and v have different token counts (", n(k.size(0)), ", ",
                    n(v.size(0)), ")");
  TORCH_CHECK_VALUE(v.size(1) == k.size(1) && k.size(1) != 0 && q.size(1) % k.size(1) == 0, fn, ": q has ",
                    n(q.size(1)), " heads, k ", n(k.size(1)), " and v ", n(v.size(1)),
                    "; k and v need the same number of heads, dividing q's (grouped-query attention)");
  TORCH_CHECK_VALUE(k.size(2) == q.size(2) && v.size(2) == q.size(2), fn, ": head dims differ (q ", n(q.size(2)), ", k ",
                    n(k.size(2)), ", v ", n(v.size(2)), ")");
  TORCH_CHECK_VALUE(q.size(0) <= batch * max_q, fn, ": q has ", n(q.size(0)), " tokens, more than batch ", n(batch),
                    " x max_seqlen_q ", n(max_q), ": some sequence would be longer than max_seqlen_q");
  TORCH_CHECK_VALUE(k.size(0) <= batch * max_k, fn, ": k has ", n(k.size(0)), " tokens, more than batch ", n(batch),
                    " x max_seqlen_k ", n(max_k), ": some sequence would be longer than max_seqlen_k");
}

// The pools' dimensions of their layout: heads_k and page_size are dims 1 and 2 (hnd), or 2 and 1 (nhd).
struct PoolDims {
  int heads_k_dim, page_dim;
  const char* shape;
};
PoolDims pool_dims(int64_t layout) {
  return layout == FT_PAGES_NHD ? PoolDims{2, 1, "[num_pages, page_size, heads_k, head_dim]"}
                                : PoolDims{1, 2, "[num_pages, heads_k, page_size, head_dim]"};
}

// The paged layout: q [B, H, Sq, d], contiguous pools [num_pages, Hk, page_size, d] (layout 1, nhd: [num_pages,
// page_size, Hk, d]), int32 block table [B, max_pages] and cache lengths [B] on q's device;
// flashtune.torch.attention_paged words these errors first.
void check_paged(const Tensor& q, const Tensor& kp, const Tensor& vp, const Tensor& table, const Tensor& lens,
                 int64_t max_seqlen_k, int64_t layout) {
  const char* fn = kPaged;
  TORCH_CHECK_VALUE(layout == FT_PAGES_HND || layout == FT_PAGES_NHD, fn,
                    ": layout must be 0 (\"hnd\") or 1 (\"nhd\"), got ", n(layout));
  const PoolDims pd = pool_dims(layout);
  TORCH_CHECK_VALUE(q.dim() == 4 && kp.dim() == 4 && vp.dim() == 4, fn,
                    ": q [batch, heads, seq_q, head_dim] and the pools ", pd.shape, " must be 4-D, got ",
                    shape_str(q), ", ", shape_str(kp), ", ", shape_str(vp));
  check_qkv_devices(fn, q, kp, vp);
  check_int_tensor(fn, "block_table", table, 2, q);
  check_int_tensor(fn, "cache_seqlens", lens, 1, q);
  TORCH_CHECK_TYPE(kp.scalar_type() == vp.scalar_type() && q.scalar_type() == kp.scalar_type(), fn, ": q is ",
                   dtype_name(q.scalar_type()), ", k_pages ", dtype_name(kp.scalar_type()), ", v_pages ",
                   dtype_name(vp.scalar_type()), "; give all three one dtype");
  TORCH_CHECK_TYPE(kp.scalar_type() == at::kHalf || kp.scalar_type() == at::kBFloat16, fn, ": dtype ",
                   dtype_name(kp.scalar_type()), " is not supported for paged caches; use torch.float16 or "
                   "torch.bfloat16");
  TORCH_CHECK_VALUE(kp.sizes() == vp.sizes(), fn, ": k_pages ", shape_str(kp), " and v_pages ", shape_str(vp),
                    " differ in shape");
  const int64_t B = q.size(0), H = q.size(1), Hk = kp.size(pd.heads_k_dim);
  TORCH_CHECK_VALUE(Hk != 0 && H % Hk == 0, fn, ": q has ", n(H), " heads, the pools ", n(Hk), " (pools ", pd.shape,
                    ")", "; the pools' heads must divide q's (grouped-query attention)");
  TORCH_CHECK_VALUE(kp.size(3) == q.size(3), fn, ": head dims differ (q ", n(q.size(3)), ", pools ", n(kp.size(3)), ")");
  TORCH_CHECK_VALUE(kp.is_contiguous() && vp.is_contiguous(), fn, ": the pools must be contiguous ", pd.shape,
                    " (read in place, never copied)");
  TORCH_CHECK_VALUE(table.size(0) == B && lens.size(0) == B, fn, ": batch sizes differ (q ", n(B), ", block_table ",
                    n(table.size(0)), ", cache_seqlens ", n(lens.size(0)), ")");
  TORCH_CHECK_VALUE(table.size(1) != 0, fn, ": block_table has no columns (max_pages must be at least 1)");
  const int64_t capacity = table.size(1) * kp.size(pd.page_dim);
  TORCH_CHECK_VALUE(max_seqlen_k >= 0 && max_seqlen_k <= capacity, fn, ": max_seqlen_k = ", n(max_seqlen_k),
                    " is out of range [0, max_pages x page_size = ", n(capacity), "]");
  TORCH_CHECK_VALUE(capacity <= kMaxPagedKeys, fn, ": max_pages x page_size = ", n(capacity),
                    " keys a sequence is over 2^30 (the kernels index keys in 32 bits)");
}

// ---- the CUDA kernels ------------------------------------------------------------------------------------
// Options of a backward call that do not change the forward's outputs: the keywords of attention() that select
// among backward kernels, from the ops' arguments (the forward keeps them for its backward) to the runtime's args.
struct BackwardOptions {
  bool deterministic = false;  // only bitwise-reproducible configs (the runtime's deterministic picks)
};
void apply_options(const BackwardOptions& o, ft_backward_args& a) { a.deterministic = o.deterministic ? 1 : 0; }
void apply_options(const BackwardOptions& o, ft_varlen_backward_args& a) { a.deterministic = o.deterministic ? 1 : 0; }

// The score modifications of a call (FlashAttention's window_size, softcap and alibi_slopes), the ops' last four
// arguments, as the runtime's ft_mods (which checks their ranges, and that a family has them, in one line).
struct Mods {
  int64_t window_left = -1, window_right = -1;
  double softcap = 0;
  std::optional<Tensor> alibi;  // fp32 [H] or [batch, H] on q's device (checked by with_alibi)
  ft_mods c() const {
    const bool windowed = window_left >= 0 || window_right >= 0;
    auto edge = [](int64_t e, const char* name) {
      TORCH_CHECK_VALUE(e >= -1 && e <= (int64_t{1} << 30), "flashtune: ", name,
                        " must be -1 (unbounded) or a key count in 0..1073741824, got ", e);
      return static_cast<int>(e);
    };
    ft_mods m{windowed ? 1 : 0, windowed ? edge(window_left, "window_size[0]") : 0,
              windowed ? edge(window_right, "window_size[1]") : 0, static_cast<float>(softcap), nullptr, 0};
    if (alibi) {
      m.alibi_slopes = alibi->data_ptr<float>();
      m.alibi_batch_stride = alibi->dim() == 2 ? alibi->size(1) : 0;
    }
    return m;
  }
};

// ALiBi's slopes checked against q (heads H = q.size(1); batch: B, or a packed call's sequences), contiguous: the
// Mods to pass on. One line for a wrong dtype, device or shape, as flashtune/torch.py's _alibi words it.
Mods with_alibi(Mods m, const std::optional<Tensor>& slopes, const Tensor& q, int64_t batch, const char* fn) {
  if (!slopes) return m;
  const Tensor& a = *slopes;
  TORCH_CHECK_TYPE(a.scalar_type() == at::kFloat, fn, ": alibi_slopes must be torch.float32 (FlashAttention's), got ",
                   a.scalar_type());
  TORCH_CHECK_VALUE(a.device() == q.device(), fn, ": alibi_slopes is on ", a.device(), ", q on ", q.device(),
                    "; the kernels read it on q's GPU");
  const int64_t H = q.size(1);
  TORCH_CHECK_VALUE((a.dim() == 1 && a.size(0) == H) || (a.dim() == 2 && a.size(0) == batch && a.size(1) == H), fn,
                    ": alibi_slopes must have shape (", H, ",) or (", batch, ", ", H, ") ([heads] or [batch, heads]), got ",
                    shape_str(a));
  m.alibi = a.contiguous();
  return m;
}

std::tuple<Tensor, Tensor> attention_fwd_cuda(const Tensor& q_, const Tensor& k_, const Tensor& v_, bool causal,
                                              double scale, bool /*deterministic: the backward's*/,
                                              int64_t window_left, int64_t window_right, double softcap,
                                              const std::optional<Tensor>& alibi_slopes) {
  check_dense(q_, k_, v_);
  const c10::cuda::CUDAGuard guard(q_.device());
  const int64_t B = q_.size(0), H = q_.size(1), Sq = q_.size(2), d = q_.size(3), Sk = k_.size(2);
  Tensor o = at::empty({B, H, Sq, d}, q_.options());
  Tensor lse = at::empty({B, H, Sq}, q_.options().dtype(at::kFloat));
  if (o.numel() == 0) return {o, lse};
  if (Sk == 0) {  // no keys: every row fully masked
    o.zero_();
    lse.fill_(std::numeric_limits<float>::infinity());
    return {o, lse};
  }
  const Tensor q = runtime_layout(q_), k = runtime_layout(k_), v = runtime_layout(v_);
  ft_forward_args a{};
  a.batch = to_int(B, "batch", kDense);
  a.heads = to_int(H, "heads", kDense);
  a.seq_q = to_int(Sq, "seq_q", kDense);
  a.seq_k = to_int(Sk, "seq_k", kDense);
  a.head_dim = to_int(d, "head_dim", kDense);
  a.dtype = dtype_code(q.scalar_type());
  a.causal = causal ? 1 : 0;
  a.scale = static_cast<float>(scale);
  a.q = ref4(q);
  a.k = ref4(k);
  a.v = ref4(v);
  a.o = ref4(o);
  a.lse = lse.data_ptr<float>();
  a.heads_k = static_cast<int>(k.size(1));
  const Mods mods = with_alibi(Mods{window_left, window_right, softcap}, alibi_slopes, q, B, kDense);
  a.mods = mods.c();
  check_status(rt().forward(&a, stream_of(q)), "flashtune forward");
  return {o, lse};
}

// dout and o in q's dtype and on its device, a layout the runtime reads; lse fp32 contiguous.
Tensor as_input(const Tensor& t, const Tensor& q) {
  if (t.scalar_type() != q.scalar_type() || t.device() != q.device()) return runtime_layout(t.to(q.options()));
  return runtime_layout(t);
}
Tensor as_lse(const Tensor& lse, const Tensor& q) {
  if (lse.scalar_type() != at::kFloat || lse.device() != q.device() || !lse.is_contiguous())
    return lse.to(q.options().dtype(at::kFloat)).contiguous();
  return lse;
}

std::tuple<Tensor, Tensor, Tensor> dense_backward(const Tensor& dout_, const Tensor& q_, const Tensor& k_,
                                                  const Tensor& v_, const Tensor& o_, const Tensor& lse_, bool causal,
                                                  double scale, const BackwardOptions& opts, const Mods& mods) {
  check_dense(q_, k_, v_);
  const c10::cuda::CUDAGuard guard(q_.device());
  Tensor dq = at::empty(q_.sizes(), q_.options());
  Tensor dk = at::empty(k_.sizes(), k_.options());
  Tensor dv = at::empty(v_.sizes(), v_.options());
  if (dq.numel() == 0 || dk.numel() == 0) return {dq.zero_(), dk.zero_(), dv.zero_()};
  TORCH_CHECK_VALUE(dout_.sizes() == q_.sizes() && o_.sizes() == q_.sizes(), kDense,
                    ": dout and o must have q's shape ", shape_str(q_), ", got ", shape_str(dout_), " and ",
                    shape_str(o_));
  TORCH_CHECK_VALUE(lse_.numel() == q_.size(0) * q_.size(1) * q_.size(2), kDense, ": lse must hold [B, H, Sq] = ",
                    n(q_.size(0) * q_.size(1) * q_.size(2)), " values, got ", n(lse_.numel()));
  const Tensor dout = as_input(dout_, q_), o = as_input(o_, q_), lse = as_lse(lse_, q_);  // a broadcast dout is copied
  const Tensor q = runtime_layout(q_), k = runtime_layout(k_), v = runtime_layout(v_);
  ft_backward_args a{};
  a.batch = to_int(q.size(0), "batch", kDense);
  a.heads = to_int(q.size(1), "heads", kDense);
  a.seq_q = to_int(q.size(2), "seq_q", kDense);
  a.seq_k = to_int(k.size(2), "seq_k", kDense);
  a.head_dim = to_int(q.size(3), "head_dim", kDense);
  a.dtype = dtype_code(q.scalar_type());
  a.causal = causal ? 1 : 0;
  a.scale = static_cast<float>(scale);
  a.q = ref4(q);
  a.k = ref4(k);
  a.v = ref4(v);
  a.o = ref4(o);
  a.dout = ref4(dout);
  a.lse = lse.data_ptr<float>();
  a.dq = ref4(dq);
  a.dk = ref4(dk);
  a.dv = ref4(dv);
  a.heads_k = static_cast<int>(k.size(1));
  apply_options(opts, a);
  a.mods = mods.c();
  check_status(rt().backward(&a, stream_of(q)), "flashtune backward");
  return {dq, dk, dv};
}

std::tuple<Tensor, Tensor, Tensor> attention_bwd_cuda(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& o, const Tensor& lse, bool causal,
                                                      double scale, bool deterministic, int64_t window_left,
                                                      int64_t window_right, double softcap,
                                                      const std::optional<Tensor>& alibi_slopes) {
  return dense_backward(dout, q, k, v, o, lse, causal, scale, BackwardOptions{deterministic},
                        with_alibi(Mods{window_left, window_right, softcap}, alibi_slopes, q, q.size(0), kDense));
}

template <class Args>
void fill_varlen_head(Args& a, const Tensor& q, const Tensor& k, const Tensor& cu_q, const Tensor& cu_k, int64_t max_q,
                      int64_t max_k, bool causal, double scale) {
  a.batch = static_cast<int>(cu_q.numel() - 1);
  a.heads = to_int(q.size(1), "heads", kVarlen);
  a.heads_k = to_int(k.size(1), "heads_k", kVarlen);
  a.head_dim = to_int(q.size(2), "head_dim", kVarlen);
  a.total_q = to_int(q.size(0), "total_q", kVarlen);
  a.total_k = to_int(k.size(0), "total_k", kVarlen);
  a.max_seqlen_q = static_cast<int>(max_q);
  a.max_seqlen_k = static_cast<int>(max_k);
  a.cu_seqlens_q = cu_q.data_ptr<int32_t>();
  a.cu_seqlens_k = cu_k.data_ptr<int32_t>();
  a.dtype = dtype_code(q.scalar_type());
  a.causal = causal ? 1 : 0;
  a.scale = static_cast<float>(scale);
}

std::tuple<Tensor, Tensor> attention_varlen_fwd_cuda(const Tensor& q_, const Tensor& k_, const Tensor& v_,
                                                     const Tensor& cu_q_, const Tensor& cu_k_, int64_t max_q,
                                                     int64_t max_k, bool causal, double scale,
                                                     bool /*deterministic: the backward's*/, int64_t window_left,
                                                     int64_t window_right, double softcap,
                                                     const std::optional<Tensor>& alibi_slopes) {
  check_varlen(q_, k_, v_, cu_q_, cu_k_, max_q, max_k);
  const c10::cuda::CUDAGuard guard(q_.device());
  const int64_t Tq = q_.size(0), H = q_.size(1), d = q_.size(2);
  Tensor o = at::empty({Tq, H, d}, q_.options());
  Tensor lse = at::empty({H, Tq}, q_.options().dtype(at::kFloat));
  if (o.numel() == 0) return {o, lse};
  if (k_.size(0) == 0) {  // no keys in any sequence: every row fully masked
    o.zero_();
    lse.fill_(std::numeric_limits<float>::infinity());
    return {o, lse};
  }
  const Tensor q = runtime_layout(q_), k = runtime_layout(k_), v = runtime_layout(v_);
  const Tensor cu_q = cu_q_.contiguous(), cu_k = cu_k_.contiguous();
  ft_varlen_forward_args a{};
  fill_varlen_head(a, q, k, cu_q, cu_k, max_q, max_k, causal, scale);
  a.q = ref3(q);
  a.k = ref3(k);
  a.v = ref3(v);
  a.o = ref3(o);
  a.lse = lse.data_ptr<float>();
  const Mods mods = with_alibi(Mods{window_left, window_right, softcap}, alibi_slopes, q, cu_q.numel() - 1, kVarlen);
  a.mods = mods.c();
  check_status(rt().varlen_forward(&a, stream_of(q)), "flashtune varlen forward");
  return {o, lse};
}

std::tuple<Tensor, Tensor, Tensor> varlen_backward(const Tensor& dout_, const Tensor& q_, const Tensor& k_,
                                                   const Tensor& v_, const Tensor& o_, const Tensor& lse_,
                                                   const Tensor& cu_q_, const Tensor& cu_k_, int64_t max_q,
                                                   int64_t max_k, bool causal, double scale,
                                                   const BackwardOptions& opts, const Mods& mods) {
  check_varlen(q_, k_, v_, cu_q_, cu_k_, max_q, max_k);
  const c10::cuda::CUDAGuard guard(q_.device());
  Tensor dq = at::empty(q_.sizes(), q_.options());
  Tensor dk = at::empty(k_.sizes(), k_.options());
  Tensor dv = at::empty(v_.sizes(), v_.options());
  if (dq.numel() == 0 || dk.numel() == 0) return {dq.zero_(), dk.zero_(), dv.zero_()};
  TORCH_CHECK_VALUE(dout_.sizes() == q_.sizes() && o_.sizes() == q_.sizes(), kVarlen,
                    ": dout and o must have q's shape ", shape_str(q_), ", got ", shape_str(dout_), " and ",
                    shape_str(o_));
  TORCH_CHECK_VALUE(lse_.numel() == q_.size(0) * q_.size(1), kVarlen, ": lse must hold [H, total_q] = ",
                    n(q_.size(0) * q_.size(1)), " values, got ", n(lse_.numel()));
  const Tensor dout = as_input(dout_, q_), o = as_input(o_, q_), lse = as_lse(lse_, q_);
  const Tensor q = runtime_layout(q_), k = runtime_layout(k_), v = runtime_layout(v_);
  const Tensor cu_q = cu_q_.contiguous(), cu_k = cu_k_.contiguous();
  ft_varlen_backward_args a{};
  fill_varlen_head(a, q, k, cu_q, cu_k, max_q, max_k, causal, scale);
  a.q = ref3(q);
  a.k = ref3(k);
  a.v = ref3(v);
  a.o = ref3(o);
  a.dout = ref3(dout);
  a.lse = lse.data_ptr<float>();
  a.dq = ref3(dq);
  a.dk = ref3(dk);
  a.dv = ref3(dv);
  apply_options(opts, a);
  a.mods = mods.c();
  check_status(rt().varlen_backward(&a, stream_of(q)), "flashtune varlen backward");
  return {dq, dk, dv};
}

std::tuple<Tensor, Tensor, Tensor> attention_varlen_bwd_cuda(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                             const Tensor& v, const Tensor& o, const Tensor& lse,
                                                             const Tensor& cu_q, const Tensor& cu_k, int64_t max_q,
                                                             int64_t max_k, bool causal, double scale,
                                                             bool deterministic, int64_t window_left,
                                                             int64_t window_right, double softcap,
                                                             const std::optional<Tensor>& alibi_slopes) {
  return varlen_backward(dout, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal, scale, BackwardOptions{deterministic},
                         with_alibi(Mods{window_left, window_right, softcap}, alibi_slopes, q, cu_q.numel() - 1,
                                    kVarlen));
}

std::tuple<Tensor, Tensor> attention_paged_fwd_cuda(const Tensor& q_, const Tensor& kp, const Tensor& vp,
                                                    const Tensor& table_, const Tensor& lens_, bool causal,
                                                    double scale, int64_t max_seqlen_k, int64_t layout) {
  check_paged(q_, kp, vp, table_, lens_, max_seqlen_k, layout);
  const PoolDims pd = pool_dims(layout);
  const c10::cuda::CUDAGuard guard(q_.device());
  const int64_t B = q_.size(0), H = q_.size(1), Sq = q_.size(2), d = q_.size(3);
  Tensor o = at::empty({B, H, Sq, d}, q_.options());
  Tensor lse = at::empty({B, H, Sq}, q_.options().dtype(at::kFloat));
  if (o.numel() == 0) return {o, lse};
  if (kp.size(0) == 0 || kp.size(pd.page_dim) == 0) {  // no pages: no sequence holds a key
    o.zero_();
    lse.fill_(std::numeric_limits<float>::infinity());
    return {o, lse};
  }
  const Tensor q = runtime_layout(q_);
  const Tensor table = table_.contiguous(), lens = lens_.contiguous();  // the kernels step rows by max_pages
  ft_paged_forward_args a{};
  a.batch = to_int(B, "batch", kPaged);
  a.heads = to_int(H, "heads", kPaged);
  a.heads_k = to_int(kp.size(pd.heads_k_dim), "heads_k", kPaged);
  a.seq_q = to_int(Sq, "seq_q", kPaged);
  a.head_dim = to_int(d, "head_dim", kPaged);
  a.num_pages = to_int(kp.size(0), "num_pages", kPaged);
  a.page_size = to_int(kp.size(pd.page_dim), "page_size", kPaged);
  a.max_pages = to_int(table.size(1), "max_pages", kPaged);
  a.max_seqlen_k = static_cast<int>(max_seqlen_k);
  a.dtype = dtype_code(q.scalar_type());
  a.causal = causal ? 1 : 0;
  a.scale = static_cast<float>(scale);
  a.block_table = table.data_ptr<int32_t>();
  a.cache_seqlens = lens.data_ptr<int32_t>();
  a.q = ref4(q);
  a.k_pages = ref4(kp);
  a.v_pages = ref4(vp);
  a.o = ref4(o);
  a.lse = lse.data_ptr<float>();
  a.layout = static_cast<int>(layout);  // the pools' strides are those of their layout's 4-D view (ref4)
  check_status(rt().paged_forward(&a, stream_of(q)), "flashtune paged forward");
  return {o, lse};
}

// ---- autograd ------------------------------------------------------------------------------------------------
// The forwards redispatch below autograd to their CUDA kernels; the backwards call the backward ops through the
// dispatcher, so that torch.compile (AOTAutograd) traces them as ops and eager mode runs their CUDA kernels.
// ..., deterministic, window_left, window_right, softcap, alibi_slopes: the ops' last five arguments.
using Slopes = std::optional<Tensor>;
using FwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, bool, double, bool, int64_t,
                                          int64_t, double, const Slopes&);
using BwdSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                  const Tensor&, const Tensor&, bool, double, bool, int64_t, int64_t,
                                                  double, const Slopes&);
using VarlenFwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                const Tensor&, int64_t, int64_t, bool, double, bool, int64_t, int64_t,
                                                double, const Slopes&);
using VarlenBwdSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                        const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                        int64_t, int64_t, bool, double, bool, int64_t, int64_t, double,
                                                        const Slopes&);

template <class Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

void save_mods(AutogradContext* ctx, int64_t window_left, int64_t window_right, double softcap, const Slopes& alibi) {
  ctx->saved_data["window_left"] = window_left;
  ctx->saved_data["window_right"] = window_right;
  ctx->saved_data["softcap"] = softcap;
  ctx->saved_data["alibi_slopes"] = alibi;  // a constant of the call (no gradient), kept as given
}
Slopes saved_alibi(AutogradContext* ctx) {
  const c10::IValue& a = ctx->saved_data["alibi_slopes"];
  return a.isNone() ? Slopes{} : Slopes{a.toTensor()};
}

class DenseAttention : public torch::autograd::Function<DenseAttention> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                               double scale, bool deterministic, int64_t window_left, int64_t window_right,
                               double softcap, const Slopes& alibi) {
    static const auto fwd = find_op<FwdSig>("flashtune::attention_fwd");
    Tensor o, lse;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      std::tie(o, lse) = fwd.call(q, k, v, causal, scale, deterministic, window_left, window_right, softcap, alibi);
    }
    ctx->save_for_backward({q, k, v, o, lse});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["deterministic"] = deterministic;
    save_mods(ctx, window_left, window_right, softcap, alibi);
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);  // lse's gradient stays undefined: no zeros_like(lse) per backward
    return {o, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd = find_op<BwdSig>("flashtune::attention_bwd");
    const variable_list s = ctx->get_saved_variables();
    const Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(s[3]);
    auto [dq, dk, dv] = bwd.call(dout, s[0], s[1], s[2], s[3], s[4], ctx->saved_data["causal"].toBool(),
                                 ctx->saved_data["scale"].toDouble(), ctx->saved_data["deterministic"].toBool(),
                                 ctx->saved_data["window_left"].toInt(), ctx->saved_data["window_right"].toInt(),
                                 ctx->saved_data["softcap"].toDouble(), saved_alibi(ctx));
    return {dq, dk, dv, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// Whether a call records a graph; without one the Function's node and saved tensors are skipped (a no_grad or
// inference call pays for the dispatch below autograd alone).
bool records_graph(std::initializer_list<const Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const Tensor* t : ts)
    if (t->requires_grad()) return true;
  return false;
}

std::tuple<Tensor, Tensor> attention_fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                  double scale, bool deterministic, int64_t window_left,
                                                  int64_t window_right, double softcap, const Slopes& alibi) {
  if (!records_graph({&q, &k, &v})) {
    static const auto fwd = find_op<FwdSig>("flashtune::attention_fwd");
    const at::AutoDispatchBelowADInplaceOrView below;
    return fwd.call(q, k, v, causal, scale, deterministic, window_left, window_right, softcap, alibi);
  }
  const variable_list out =
      DenseAttention::apply(q, k, v, causal, scale, deterministic, window_left, window_right, softcap, alibi);
  return {out[0], out[1]};
}

class VarlenAttention : public torch::autograd::Function<VarlenAttention> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& cu_q, const Tensor& cu_k, int64_t max_q, int64_t max_k, bool causal,
                               double scale, bool deterministic, int64_t window_left, int64_t window_right,
                               double softcap, const Slopes& alibi) {
    static const auto fwd = find_op<VarlenFwdSig>("flashtune::attention_varlen_fwd");
    Tensor o, lse;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      std::tie(o, lse) = fwd.call(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, deterministic, window_left,
                                  window_right, softcap, alibi);
    }
    ctx->saved_data["deterministic"] = deterministic;
    save_mods(ctx, window_left, window_right, softcap, alibi);
    ctx->save_for_backward({q, k, v, o, lse, cu_q, cu_k});
    ctx->saved_data["max_q"] = max_q;
    ctx->saved_data["max_k"] = max_k;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);  // lse's gradient stays undefined: no zeros_like(lse) per backward
    return {o, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd = find_op<VarlenBwdSig>("flashtune::attention_varlen_bwd");
    const variable_list s = ctx->get_saved_variables();
    const Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(s[3]);
    auto [dq, dk, dv] = bwd.call(dout, s[0], s[1], s[2], s[3], s[4], s[5], s[6], ctx->saved_data["max_q"].toInt(),
                                 ctx->saved_data["max_k"].toInt(), ctx->saved_data["causal"].toBool(),
                                 ctx->saved_data["scale"].toDouble(), ctx->saved_data["deterministic"].toBool(),
                                 ctx->saved_data["window_left"].toInt(), ctx->saved_data["window_right"].toInt(),
                                 ctx->saved_data["softcap"].toDouble(), saved_alibi(ctx));
    return {dq, dk, dv, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(),
            Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor> attention_varlen_fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                                         const Tensor& cu_q, const Tensor& cu_k, int64_t max_q,
                                                         int64_t max_k, bool causal, double scale, bool deterministic,
                                                         int64_t window_left, int64_t window_right, double softcap,
                                                         const Slopes& alibi) {
  if (!records_graph({&q, &k, &v})) {
    static const auto fwd = find_op<VarlenFwdSig>("flashtune::attention_varlen_fwd");
    const at::AutoDispatchBelowADInplaceOrView below;
    return fwd.call(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, deterministic, window_left, window_right,
                    softcap, alibi);
  }
  const variable_list out = VarlenAttention::apply(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, deterministic,
                                                   window_left, window_right, softcap, alibi);
  return {out[0], out[1]};
}

}  // namespace
}  // namespace flashtune::torch_ext

TORCH_LIBRARY(flashtune, m) {
  m.set_python_module("flashtune.torch");  // the fake implementations (torch.compile) are registered there
  // The last four: window_left, window_right (-1: unbounded), softcap (0: off) and alibi_slopes (None: off),
  // FlashAttention's window_size, softcap and alibi_slopes (spelled out in each schema: tests/test_python_unit.py reads
  // them as text beside the fallback's).
  m.def("attention_fwd(Tensor q, Tensor k, Tensor v, bool causal, float scale, bool deterministic=False, "
        "int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None) -> (Tensor, Tensor)");
  m.def("attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool causal, float scale, "
        "bool deterministic=False, int window_left=-1, int window_right=-1, float softcap=0.0, "
        "Tensor? alibi_slopes=None) -> (Tensor, Tensor, Tensor)");
  m.def("attention_varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "int max_seqlen_q, int max_seqlen_k, bool causal, float scale, bool deterministic=False, "
        "int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None) -> (Tensor, Tensor)");
  m.def("attention_varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor cu_seqlens_q, "
        "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, bool causal, float scale, bool deterministic=False, "
        "int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("attention_paged_fwd(Tensor q, Tensor k_pages, Tensor v_pages, Tensor block_table, Tensor cache_seqlens, "
        "bool causal, float scale, int max_seqlen_k, int layout=0) -> (Tensor, Tensor)");
}

// CPU: the same functions, whose first check says in one line that flashtune runs on CUDA tensors.
#define FLASHTUNE_KERNELS(KEY)                                                                      \
  TORCH_LIBRARY_IMPL(flashtune, KEY, m) {                                                           \
    using namespace flashtune::torch_ext;                                                           \
    m.impl("attention_fwd", &attention_fwd_cuda);                                                   \
    m.impl("attention_bwd", &attention_bwd_cuda);                                                   \
    m.impl("attention_varlen_fwd", &attention_varlen_fwd_cuda);                                     \
    m.impl("attention_varlen_bwd", &attention_varlen_bwd_cuda);                                     \
    m.impl("attention_paged_fwd", &attention_paged_fwd_cuda);                                       \
  }
FLASHTUNE_KERNELS(CUDA)
FLASHTUNE_KERNELS(CPU)

TORCH_LIBRARY_IMPL(flashtune, Autograd, m) {
  using namespace flashtune::torch_ext;
  m.impl("attention_fwd", &attention_fwd_autograd);
  m.impl("attention_varlen_fwd", &attention_varlen_fwd_autograd);
}

// Binds the runtime library at `path` (dlopen: the handle flashtune/_lib.py's ctypes holds already). Returns 0, or 1
// with one line in err.
extern "C" __attribute__((visibility("default"))) int flashtune_torch_bind(const char* path, char* err, size_t size) {
  using flashtune::torch_ext::g_runtime;
  using flashtune::torch_ext::Runtime;
  using flashtune::torch_ext::scratch_alloc;
  using flashtune::torch_ext::scratch_free;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::snprintf(err, size, "cannot load %s: %s", path, dlerror());
    return 1;
  }
  Runtime r;
  const char* missing = nullptr;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    if (!fn && !missing) missing = name;
  };
  sym(r.forward, "ft_attention_forward");
  sym(r.backward, "ft_attention_backward");
  sym(r.varlen_forward, "ft_attention_varlen_forward");
  sym(r.varlen_backward, "ft_attention_varlen_backward");
  sym(r.paged_forward, "ft_attention_paged_forward");
  sym(r.last_error, "ft_last_error");
  sym(r.set_scratch_allocator, "ft_set_scratch_allocator");
  if (missing) {
    std::snprintf(err, size, "%s has no %s (a runtime older than this extension)", path, missing);
    return 1;
  }
  if (r.set_scratch_allocator(scratch_alloc, scratch_free, nullptr) != FT_OK) {
    std::snprintf(err, size, "ft_set_scratch_allocator: %s", r.last_error());
    return 1;
  }
  g_runtime = r;  // once, at import, before any op runs (flashtune.torch)
  return 0;
}

// The torch this was built against, for flashtune.torch to compare with the running one.
extern "C" __attribute__((visibility("default"))) const char* flashtune_torch_built_with() {
  return FLASHTUNE_TORCH_VERSION;
}
