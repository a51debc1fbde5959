// The runtime library on a GPU, through its public interface only: forward and backward for every
// dtype and every head dim the registry's families run in both directions, ragged shapes, causal and
// not, Sq > Sk (fully masked rows) and Sq = 1, transposed [B, S, H, d] strides, a custom scale, a
// caller-given backward workspace; each checked against the float64 reference with worker/validate's
// bounds (examples/cmake_consumer/attention_check.hpp). Pass 1 runs the cases on several threads (JIT
// into a fresh FLASHTUNE_CACHE_DIR), pass 2 again in this process (every kernel from memory), pass 3
// in a child process (kernels from disk, none compiled). Also: a call from a thread with no current
// context (the primary context of q's device), and unsupported head dims. Prints explain() lines.
// Packed variable-length batches through ft_attention_varlen_forward/_backward (ragged lengths, empty
// sequences, cross-attention lengths, GQA, a strided q, a loose max_seqlen, a caller workspace), checked
// against the float64 reference of each sequence alone (worker/validate's varlen references: the dense
// forward and backward per (sequence, head)) with the same bounds, in every pass. Decoding (Sq <= 16,
// GQA, K/V caches up to 40k keys): in every pass through whatever the tables pick, then in a pass of its
// own with $FLASHTUNE_DB naming a store that holds a decode_splitkv row for this GPU, where explain()
// must say decode_splitkv for the calls in its bucket (and not for the one past Sq 16), each checked
// against the float64 reference as the dense path is.
// Paged K/V caches through ft_attention_paged_forward (pools scattered through the tuner's seeded block
// table, never the identity order; rows past each cache length and spare pages NaN; ragged lengths with an
// empty sequence, a single key and exact pages; GQA, MQA, MHA; Sq 1/3/4/16, causal and not; pages of 32 to 256
// keys; a transposed q, a custom scale, a loose block-table stride, no lse): each sequence's O and LSE against
// the float64 reference of that sequence alone on its logical K/V with the same bounds, the config's BLOCK_N
// dividing the page, in every pass; then a pass with $FLASHTUNE_DB holding a paged and a dense decode_splitkv
// row for this GPU, where explain must name the paged row for 256-key pages, the dense row for 128-key pages
// (whose output must equal ft_attention_forward's on the same K/V, run with that row, bit for bit) and the
// default for 64-key pages. Then (Hopper) a pass with $FLASHTUNE_DB holding fa3_wgmma MULTICAST rows: the
// library launches them in clusters of two CTAs, checked against the reference like the rest.
// In a build with FLASHTUNE_AOT_ARCHS that covers this GPU's arch (90a for sm_90), pass 0 runs every
// case first: each kernel must come from the library ("kernel: aot") and the fresh cache folder must
// stay empty (nothing compiled by NVRTC).
// Exit 0 pass, 1 fail, 77 no GPU.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "attention_check.hpp"
#include "core/family.hpp"
#include "core/util.hpp"
#include "process/subprocess.hpp"
#include "results/store.hpp"
#include "templates/attention_params.h"
#include "tests/fixture.hpp"

using attention_check::Case;
namespace rt = flashtune::runtime;

namespace {

std::vector<Case> cases() {
  std::vector<Case> out;
  for (ft_dtype t : {FT_FP32, FT_FP16, FT_BF16}) {
    const flashtune::DType dt = t == FT_FP32 ? flashtune::DType::fp32 : t == FT_FP16 ? flashtune::DType::fp16
                                                                                    : flashtune::DType::bf16;
    std::set<int> fwd, bwd;
    for (const auto& f : flashtune::families())
      if (!f.test_only && std::find(f.dtypes.begin(), f.dtypes.end(), dt) != f.dtypes.end())
        (f.direction == "fwd" ? fwd : bwd).insert(f.head_dims.begin(), f.head_dims.end());
    bool causal = false;
    for (int d : fwd) {
      if (!bwd.count(d)) {
        std::printf("note: d=%d runs only forward in %s; not covered\n", d, to_string(dt));
        continue;
      }
      Case c;
      c.dtype = t, c.head_dim = d, c.causal = causal = !causal;  // alternate: both masks per dtype
      out.push_back(c);
    }
    Case c;
    c.dtype = t;
    c.seq_q = 200, c.seq_k = 77, c.causal = true, c.bshd = true;  // Sq > Sk: the first rows see no key
    out.push_back(c);
    c = Case{};
    c.dtype = t, c.batch = 1, c.heads = 4, c.seq_q = 1, c.seq_k = 333, c.causal = false, c.scale = 0.3f;
    out.push_back(c);
    c = Case{};
    c.dtype = t, c.batch = 1, c.heads = 2, c.seq_q = 64, c.seq_k = 64, c.head_dim = 128, c.caller_workspace = true,
    c.bshd = true;
    out.push_back(c);
  }
  // Decoding shapes (bf16 d 128, the H100 table's decode entries; Llama-3-like groups): one token against
  // a cache, causal (one row sees every key), a long cache, speculative decoding's 16 rows, and 5 causal
  // rows (no causal decode entry: the dense path).
  for (auto [b, h, hk, sq, sk, causal] : {std::tuple{2, 32, 8, 1, 4096, true}, std::tuple{1, 8, 8, 1, 40000, false},
                                          std::tuple{3, 16, 2, 16, 700, false}, std::tuple{2, 16, 4, 5, 300, true}}) {
    Case c;
    c.dtype = FT_BF16, c.head_dim = 128, c.batch = b, c.heads = h, c.heads_k = hk, c.seq_q = sq, c.seq_k = sk;
    c.causal = causal;
    out.push_back(c);
  }
  return out;
}

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// ---- packed variable-length batches --------------------------------------------------------------
struct VarlenCase {
  std::vector<int> lq, lk;  // per sequence; lk empty: lq (self-attention)
  int heads = 8, heads_k = 2, head_dim = 128;
  ft_dtype dtype = FT_BF16;
  bool causal = true;
  bool strided_q = false;         // q rows (heads + 1) * d apart: packed by the library
  int loose_max = 0;              // added to max_seqlen_q/k (an upper bound, not the exact longest)
  bool caller_workspace = false;  // backward workspace from ft_varlen_backward_workspace_bytes
  std::string str() const {
    auto list = [](const std::vector<int>& v) {
      std::string s;
      for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
      return "[" + s + "]";
    };
    return std::string("varlen ") + (dtype == FT_FP16 ? "fp16" : "bf16") + " H" + std::to_string(heads) + "/" +
           std::to_string(heads_k) + " d" + std::to_string(head_dim) + " q" + list(lq) +
           (lk.empty() ? "" : " k" + list(lk)) + (causal ? " causal" : "") + (strided_q ? " strided-q" : "") +
           (loose_max ? " loose-max" : "") + (caller_workspace ? " workspace" : "");
  }
};

std::vector<VarlenCase> varlen_cases() {
  std::vector<VarlenCase> out;
  VarlenCase c;
  c.lq = {1, 130, 0, 257, 64};  // a single token, an empty sequence, lengths off the block sizes
  out.push_back(c);
  c = VarlenCase{};
  c.lq = {100, 17, 300}, c.lk = {50, 200, 300}, c.dtype = FT_FP16, c.heads = 4, c.heads_k = 4, c.head_dim = 64;
  c.causal = false, c.strided_q = true;
  out.push_back(c);
  c = VarlenCase{};
  c.lq = {33, 190}, c.lk = {120, 7}, c.heads = 4, c.heads_k = 1, c.head_dim = 256, c.loose_max = 100;  // MQA, Sq > Sk
  c.caller_workspace = true;
  out.push_back(c);
  c = VarlenCase{};
  c.lq = {513, 1000, 31}, c.dtype = FT_FP16, c.heads = 6, c.heads_k = 3, c.head_dim = 64, c.causal = true;
  out.push_back(c);
  return out;
}

// A packed batch forward then backward through the runtime, each against the float64 reference of every
// (sequence, head) alone, with worker/validate's bounds (the backward from the reference's O and LSE).
attention_check::Result run_varlen_case(const VarlenCase& c, unsigned seed) {
  namespace rt = flashtune::runtime;
  using attention_check::detail::Tensor;
  using attention_check::detail::cuda_error;
  attention_check::Result r;
  const flashtune::DType t = c.dtype == FT_FP16 ? flashtune::DType::fp16 : flashtune::DType::bf16;
  const std::vector<int> lk = c.lk.empty() ? c.lq : c.lk;
  flashtune::Problem p;
  p.batch = (int)c.lq.size(), p.heads = c.heads, p.heads_k = c.heads_k == c.heads ? 0 : c.heads_k;
  p.seq_q = *std::max_element(c.lq.begin(), c.lq.end()), p.seq_k = *std::max_element(lk.begin(), lk.end());
  p.head_dim = c.head_dim, p.dtype = t, p.causal = c.causal;
  p.varlen.lengths = "list", p.varlen.seq_lens_q = c.lq, p.varlen.seq_lens_k = lk;
  const int H = c.heads, Hk = c.heads_k, d = c.head_dim, Tq = (int)p.varlen.total_q(), Tk = (int)p.varlen.total_k();
  const size_t nq = (size_t)Tq * H * d, nk = (size_t)Tk * Hk * d;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = normal(rng);
    flashtune::to_device_format(v, t);  // rounded: the reference sees what the kernel sees
    return v;
  };
  const std::vector<float> q = random(nq), k = random(nk), v = random(nk), dout = random(nq);
  cudaStream_t stream;
  if (cudaError_t e = cudaStreamCreate(&stream)) return r.error = cuda_error(e, "cudaStreamCreate"), r;
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{stream};
  // Host token-major floats -> a device tensor whose token rows are row_elems apart (>= heads * d).
  auto upload = [&](Tensor& dst, const std::vector<float>& src, int tokens, int heads, int row_elems) -> std::string {
    std::vector<float> mem((size_t)tokens * row_elems, 0.f);
    for (int tk = 0; tk < tokens; ++tk)
      std::copy_n(src.begin() + (size_t)tk * heads * d, (size_t)heads * d, mem.begin() + (size_t)tk * row_elems);
    const auto bytes = flashtune::to_device_format(mem, t);
    dst.bytes = bytes.size();
    if (cudaError_t e = cudaMalloc(&dst.ptr, dst.bytes)) return cuda_error(e, "cudaMalloc");
    if (cudaError_t e = cudaMemcpy(dst.ptr, bytes.data(), dst.bytes, cudaMemcpyHostToDevice)) return cuda_error(e, "cudaMemcpy");
    return "";
  };
  auto download = [&](const Tensor& src, std::vector<float>& out) -> std::string {
    std::vector<uint8_t> bytes(src.bytes);
    if (cudaError_t e = cudaMemcpy(bytes.data(), src.ptr, src.bytes, cudaMemcpyDeviceToHost)) return cuda_error(e, "cudaMemcpy");
    out = flashtune::from_device_format(bytes, t);
    return "";
  };
  auto alloc = [&](Tensor& x, size_t bytes) -> std::string {
    x.bytes = bytes;
    if (cudaError_t e = cudaMalloc(&x.ptr, bytes)) return cuda_error(e, "cudaMalloc");
    return "";
  };
  const std::vector<int> cq = p.varlen.cu_seqlens_q(), ck = p.varlen.cu_seqlens_k();
  Tensor dQ, dK, dV, dO, dOut, dLse, dCuQ, dCuK, dq, dk, dv, o_in, ws;
  const int q_row = c.strided_q ? (H + 1) * d : H * d;
  std::string err;
  if (!(err = upload(dQ, q, Tq, H, q_row)).empty() || !(err = upload(dK, k, Tk, Hk, Hk * d)).empty() ||
      !(err = upload(dV, v, Tk, Hk, Hk * d)).empty() || !(err = upload(dOut, dout, Tq, H, H * d)).empty() ||
      !(err = upload(dO, std::vector<float>(nq, NAN), Tq, H, H * d)).empty() ||
      !(err = alloc(dLse, (size_t)H * Tq * 4)).empty() || !(err = alloc(dCuQ, cq.size() * 4)).empty() ||
      !(err = alloc(dCuK, ck.size() * 4)).empty())
    return r.error = err, r;
  cudaMemcpy(dCuQ.ptr, cq.data(), cq.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dCuK.ptr, ck.data(), ck.size() * 4, cudaMemcpyHostToDevice);
  auto packed = [&](const Tensor& x, int row_elems) { return rt::PackedTensor{x.ptr, {row_elems, d, 1}}; };

  // ---- forward ----
  rt::VarlenForwardArgs f;
  f.batch = p.batch, f.heads = H, f.heads_k = Hk, f.head_dim = d, f.dtype = c.dtype, f.causal = c.causal;
  f.total_q = Tq, f.total_k = Tk, f.max_seqlen_q = p.seq_q + c.loose_max, f.max_seqlen_k = p.seq_k + c.loose_max;
  f.cu_seqlens_q = (const int32_t*)dCuQ.ptr, f.cu_seqlens_k = (const int32_t*)dCuK.ptr;
  f.q = packed(dQ, q_row), f.k = packed(dK, Hk * d), f.v = packed(dV, Hk * d), f.o = packed(dO, H * d);
  f.lse = (float*)dLse.ptr;
  r.fwd_explain = rt::explain(f);
  if (rt::Status st = rt::varlen_forward(f, stream); !st) return r.error = "forward: " + st.message, r;
  if (cudaError_t e = cudaStreamSynchronize(stream)) return r.error = cuda_error(e, "forward"), r;
  std::vector<float> o, lse((size_t)H * Tq);
  if (!(err = download(dO, o)).empty()) return r.error = err, r;
  cudaMemcpy(lse.data(), dLse.ptr, lse.size() * 4, cudaMemcpyDeviceToHost);
  const flashtune::FwdReference fref = flashtune::varlen_forward_reference(
      p, q.data(), k.data(), v.data(), flashtune::varlen_sample_rows(p, p.rows_q(), seed));
  const flashtune::Verdict fv = flashtune::validate_forward(p, fref, o, lse);
  if (!fv.ok) return r.error = "forward: " + fv.error, r;

  // ---- backward: the reference's O (rounded) and LSE as inputs ----
  p.direction = "bwd";
  const flashtune::BwdReference bref = flashtune::varlen_backward_reference(p, H, Hk, q.data(), k.data(), v.data(), dout.data());
  std::vector<float> o_ref(bref.o.begin(), bref.o.end()), lse_ref(bref.lse.begin(), bref.lse.end());
  flashtune::to_device_format(o_ref, t);
  if (!(err = upload(o_in, o_ref, Tq, H, H * d)).empty() ||
      !(err = upload(dq, std::vector<float>(nq, NAN), Tq, H, H * d)).empty() ||
      !(err = upload(dk, std::vector<float>(nk, NAN), Tk, Hk, Hk * d)).empty() ||
      !(err = upload(dv, std::vector<float>(nk, NAN), Tk, Hk, Hk * d)).empty())
    return r.error = err, r;
  cudaMemcpy(dLse.ptr, lse_ref.data(), lse_ref.size() * 4, cudaMemcpyHostToDevice);
  rt::VarlenBackwardArgs b;
  b.batch = f.batch, b.heads = H, b.heads_k = Hk, b.head_dim = d, b.dtype = c.dtype, b.causal = c.causal;
  b.total_q = Tq, b.total_k = Tk, b.max_seqlen_q = f.max_seqlen_q, b.max_seqlen_k = f.max_seqlen_k;
  b.cu_seqlens_q = f.cu_seqlens_q, b.cu_seqlens_k = f.cu_seqlens_k;
  b.q = f.q, b.k = f.k, b.v = f.v, b.o = packed(o_in, H * d), b.dout = packed(dOut, H * d);
  b.lse = (const float*)dLse.ptr;
  b.dq = packed(dq, H * d), b.dk = packed(dk, Hk * d), b.dv = packed(dv, Hk * d);
  if (c.caller_workspace) {
    size_t bytes = 0;
    if (rt::Status st = rt::varlen_backward_workspace_bytes(b, &bytes); !st) return r.error = "workspace: " + st.message, r;
    if (bytes && !(err = alloc(ws, bytes)).empty()) return r.error = err, r;
    b.workspace = ws.ptr, b.workspace_bytes = bytes;
  }
  r.bwd_explain = rt::explain(b);
  if (rt::Status st = rt::varlen_backward(b, stream); !st) return r.error = "backward: " + st.message, r;
  if (cudaError_t e = cudaStreamSynchronize(stream)) return r.error = cuda_error(e, "backward"), r;
  std::vector<float> gq, gk, gv;
  if (!(err = download(dq, gq)).empty() || !(err = download(dk, gk)).empty() || !(err = download(dv, gv)).empty())
    return r.error = err, r;
  const flashtune::Verdict bv = flashtune::validate_backward(p, bref, gq, gk, gv);
  if (!bv.ok) return r.error = "backward: " + bv.error, r;
  r.ok = true;
  return r;
}

// ---- paged K/V caches ------------------------------------------------------------------------------------
struct PagedCase {
  std::vector<int> lens;  // cache length of each sequence (0: no key)
  int heads = 8, heads_k = 2, seq_q = 1, head_dim = 128, page_size = 64;
  ft_dtype dtype = FT_BF16;
  bool causal = false;
  float scale = 0;             // <= 0: 1/sqrt(d)
  bool bshd_q = false;         // q in [B, Sq, H, d] memory: packed by the library
  int extra_columns = 0;       // block table columns past the longest sequence's pages (a larger row stride)
  int spare_pages = 3;         // NaN pages no sequence uses
  bool want_lse = true;        // false: lse NULL (the library's scratch; only O is checked)
  int max_seqlen_k = 0;        // the lookup hint (0: the capacity)
  bool dense_twin = false;     // also ft_attention_forward on the logical K/V (every sequence full): bit for bit
  std::string str() const {
    std::string l;
    for (int x : lens) l += (l.empty() ? "" : ",") + std::to_string(x);
    return std::string("paged ") + (dtype == FT_FP16 ? "fp16" : "bf16") + " H" + std::to_string(heads) + "/" +
           std::to_string(heads_k) + " Sq" + std::to_string(seq_q) + " d" + std::to_string(head_dim) + " page " +
           std::to_string(page_size) + " lens [" + l + "]" + (causal ? " causal" : "") + (bshd_q ? " bshd-q" : "") +
           (scale > 0 ? " scale" : "") + (extra_columns ? " wide-table" : "") + (want_lse ? "" : " no-lse") +
           (max_seqlen_k ? " max_seqlen_k " + std::to_string(max_seqlen_k) : "") + (dense_twin ? " vs-dense" : "");
  }
};

std::vector<PagedCase> paged_cases() {
  std::vector<PagedCase> out;
  PagedCase c;
  c.lens = {300, 1, 0, 1000, 256}, c.heads = 32, c.heads_k = 8, c.page_size = 256;  // an empty sequence, one key, a page
  out.push_back(c);
  c = PagedCase{};
  c.lens = {64, 65, 200}, c.dtype = FT_FP16, c.heads = 8, c.heads_k = 1, c.seq_q = 4, c.head_dim = 64, c.causal = true;
  c.bshd_q = true;  // MQA, 4 draft tokens
  out.push_back(c);
  c = PagedCase{};
  c.lens = {5, 100, 33}, c.heads = c.heads_k = 4, c.seq_q = 16, c.head_dim = 256, c.page_size = 32, c.causal = true;
  c.scale = 0.3f, c.extra_columns = 2;  // MHA; rows of sequence 0 that see no key; BLOCK_N 32 for 32-key pages
  out.push_back(c);
  c = PagedCase{};
  c.lens = {700, 129, 2048, 1}, c.heads = 16, c.heads_k = 2, c.page_size = 128, c.causal = true, c.want_lse = false;
  c.max_seqlen_k = 2048;
  out.push_back(c);
  c = PagedCase{};
  c.lens = {96, 191}, c.dtype = FT_FP16, c.heads = 8, c.heads_k = 4, c.seq_q = 3, c.page_size = 96;
  out.push_back(c);
  c = PagedCase{};
  c.lens = {4096, 4096}, c.heads = 32, c.heads_k = 8, c.page_size = 256;  // the H100 table's paged bucket
  out.push_back(c);
  return out;
}

// One paged call against each sequence's float64 reference (worker/validate's bounds), and with dense_twin the
// dense forward on the same logical K/V. r.bwd_explain holds the dense call's explain line (dense_twin only).
attention_check::Result run_paged_case(const PagedCase& c, unsigned seed) {
  using attention_check::detail::Tensor;
  using attention_check::detail::cuda_error;
  attention_check::Result r;
  const flashtune::DType t = c.dtype == FT_FP16 ? flashtune::DType::fp16 : flashtune::DType::bf16;
  const size_t elem = 2;
  const int B = (int)c.lens.size(), H = c.heads, Hk = c.heads_k, Sq = c.seq_q, d = c.head_dim, P = c.page_size;
  const int Smax = *std::max_element(c.lens.begin(), c.lens.end());
  // The tuner's block table: the pages the batch uses in a seeded order that is never the logical one.
  flashtune::Paged pg;
  pg.page_size = P, pg.seed = seed, pg.seq_lens_k = c.lens;
  const flashtune::PageTable pt = flashtune::page_table(pg, B, Smax);
  const int max_pages = pt.max_pages + c.extra_columns, num_pages = pt.num_pages + c.spare_pages;
  std::vector<int32_t> table((size_t)B * max_pages, -1);
  for (int b = 0; b < B; ++b)
    std::copy_n(pt.table.begin() + (size_t)b * pt.max_pages, pt.max_pages, table.begin() + (size_t)b * max_pages);

  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = normal(rng);
    flashtune::to_device_format(v, t);  // rounded: the reference sees what the kernel sees
    return v;
  };
  // q [B, H, Sq, d]; the logical K, V [B, Hk, Smax, d] (sequence b's first lens[b] rows are its cache).
  const size_t nq = (size_t)B * H * Sq * d, nkv = (size_t)B * Hk * Smax * d;
  const std::vector<float> q = random(nq), k = random(nkv), v = random(nkv);
  // The pools [num_pages, Hk, P, d]: NaN except the rows the sequences hold, scattered page by page.
  const size_t npool = (size_t)num_pages * Hk * P * d;
  std::vector<float> kpool(npool, NAN), vpool(npool, NAN);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hk; ++h)
      for (int j = 0; j < c.lens[b]; ++j) {
        const int page = table[(size_t)b * max_pages + j / P];
        const long long off = flashtune::paged_key_offset(page, Hk, P, h, j % P, d);
        const size_t src = (((size_t)b * Hk + h) * Smax + j) * d;
        std::copy_n(k.begin() + src, d, kpool.begin() + off);
        std::copy_n(v.begin() + src, d, vpool.begin() + off);
      }

  cudaStream_t stream;
  if (cudaError_t e = cudaStreamCreate(&stream)) return r.error = cuda_error(e, "cudaStreamCreate"), r;
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{stream};
  auto upload_bytes = [&](Tensor& dst, const void* src, size_t bytes) -> std::string {
    dst.bytes = bytes;
    if (cudaError_t e = cudaMalloc(&dst.ptr, bytes)) return cuda_error(e, "cudaMalloc");
    if (cudaError_t e = cudaMemcpy(dst.ptr, src, bytes, cudaMemcpyHostToDevice)) return cuda_error(e, "cudaMemcpy");
    return "";
  };
  auto upload = [&](Tensor& dst, std::vector<float> src) {
    const std::vector<uint8_t> bytes = flashtune::to_device_format(src, t);
    return upload_bytes(dst, bytes.data(), bytes.size());
  };
  // q in [B, Sq, H, d] memory when bshd_q.
  std::vector<float> q_mem(q);
  if (c.bshd_q)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < Sq; ++i)
          std::copy_n(q.begin() + (((size_t)b * H + h) * Sq + i) * d, d, q_mem.begin() + (((size_t)b * Sq + i) * H + h) * d);
  Tensor dQ, dK, dV, dO, dLse, dTable, dLens;
  const std::vector<float> lse_poison((size_t)B * H * Sq, NAN);
  std::string err;
  if (!(err = upload(dQ, q_mem)).empty() || !(err = upload(dK, kpool)).empty() || !(err = upload(dV, vpool)).empty() ||
      !(err = upload(dO, std::vector<float>(nq, NAN))).empty() ||
      !(err = upload_bytes(dLse, lse_poison.data(), lse_poison.size() * 4)).empty() ||
      !(err = upload_bytes(dTable, table.data(), table.size() * 4)).empty() ||
      !(err = upload_bytes(dLens, c.lens.data(), c.lens.size() * 4)).empty())
    return r.error = err, r;

  rt::PagedForwardArgs f;
  f.batch = B, f.heads = H, f.heads_k = Hk, f.seq_q = Sq, f.head_dim = d, f.dtype = c.dtype, f.causal = c.causal;
  f.scale = c.scale, f.num_pages = num_pages, f.page_size = P, f.max_pages = max_pages, f.max_seqlen_k = c.max_seqlen_k;
  f.block_table = (const int32_t*)dTable.ptr, f.cache_seqlens = (const int32_t*)dLens.ptr;
  f.q = c.bshd_q ? rt::Tensor::bshd(dQ.ptr, B, H, Sq, d) : rt::Tensor::bhsd(dQ.ptr, B, H, Sq, d);
  f.k_pages = rt::Tensor::bhsd(dK.ptr, num_pages, Hk, P, d);
  f.v_pages = rt::Tensor::bhsd(dV.ptr, num_pages, Hk, P, d);
  f.o = rt::Tensor::bhsd(dO.ptr, B, H, Sq, d);
  f.lse = c.want_lse ? (float*)dLse.ptr : nullptr;
  r.fwd_explain = rt::explain(f);
  // The config must read these pages: its BLOCK_N divides the page size.
  const size_t at = r.fwd_explain.find("BLOCK_N=");
  if (!contains(r.fwd_explain, "decode_splitkv ") || at == std::string::npos)
    return r.error = "explain does not name decode_splitkv's BLOCK_N", r;
  if (const int bn = std::atoi(r.fwd_explain.c_str() + at + 8); bn <= 0 || P % bn)
    return r.error = "BLOCK_N " + std::to_string(bn) + " does not divide the page size " + std::to_string(P), r;
  if (rt::Status st = rt::paged_forward(f, stream); !st) return r.error = "paged forward: " + st.message, r;
  if (cudaError_t e = cudaStreamSynchronize(stream)) return r.error = cuda_error(e, "paged forward"), r;
  std::vector<uint8_t> o_bytes(nq * elem);
  std::vector<float> lse((size_t)B * H * Sq);
  if (cudaError_t e = cudaMemcpy(o_bytes.data(), dO.ptr, o_bytes.size(), cudaMemcpyDeviceToHost))
    return r.error = cuda_error(e, "cudaMemcpy"), r;
  if (cudaError_t e = cudaMemcpy(lse.data(), dLse.ptr, lse.size() * 4, cudaMemcpyDeviceToHost))
    return r.error = cuda_error(e, "cudaMemcpy"), r;
  const std::vector<float> o = flashtune::from_device_format(o_bytes, t);

  // Each sequence alone: the dense float64 reference on its first lens[b] keys, the dense bounds.
  const size_t rows_b = (size_t)H * Sq;
  for (int b = 0; b < B; ++b) {
    const std::string seq = "sequence " + std::to_string(b) + " (" + std::to_string(c.lens[b]) + " keys): ";
    const std::vector<float> ob(o.begin() + b * rows_b * d, o.begin() + (b + 1) * rows_b * d);
    std::vector<float> lb(lse.begin() + b * rows_b, lse.begin() + (b + 1) * rows_b);
    if (c.lens[b] == 0) {  // no key: O = 0, LSE = +inf
      for (size_t i = 0; i < ob.size(); ++i)
        if (ob[i] != 0.f) return r.error = seq + "O[" + std::to_string(i) + "] = " + std::to_string(ob[i]) + ", want 0", r;
      for (size_t i = 0; c.want_lse && i < lb.size(); ++i)
        if (!(std::isinf(lb[i]) && lb[i] > 0)) return r.error = seq + "LSE[" + std::to_string(i) + "] is not +inf", r;
      continue;
    }
    const int L = c.lens[b];
    std::vector<float> kb((size_t)Hk * L * d), vb((size_t)Hk * L * d);
    for (int h = 0; h < Hk; ++h) {
      const size_t src = (((size_t)b * Hk + h) * Smax) * d;
      std::copy_n(k.begin() + src, (size_t)L * d, kb.begin() + (size_t)h * L * d);
      std::copy_n(v.begin() + src, (size_t)L * d, vb.begin() + (size_t)h * L * d);
    }
    flashtune::Problem pb;
    pb.batch = 1, pb.heads = H, pb.heads_k = Hk == H ? 0 : Hk, pb.seq_q = Sq, pb.seq_k = L, pb.head_dim = d;
    pb.dtype = t, pb.causal = c.causal;
    const flashtune::ref::Shape shape{1, H, Sq, L, d, c.causal, (double)c.scale, pb.heads_k};
    std::vector<int64_t> rows(rows_b);
    for (size_t i = 0; i < rows_b; ++i) rows[i] = (int64_t)i;
    const flashtune::FwdReference ref =
        flashtune::forward_reference(shape, q.data() + b * rows_b * d, kb.data(), vb.data(), rows);
    if (!c.want_lse)  // the LSE went to the library's scratch: O alone is checked
      for (size_t i = 0; i < rows_b; ++i) lb[i] = (float)ref.lse[i];
    const flashtune::Verdict fv = flashtune::validate_forward(pb, ref, ob, lb);
    if (!fv.ok) return r.error = seq + fv.error, r;
  }

  if (c.dense_twin) {  // the dense forward on the logical K/V: every sequence is Smax long
    for (int x : c.lens)
      if (x != Smax) return r.error = "dense_twin needs every sequence full", r;
    Tensor dKd, dVd, dOd, dLd;
    if (!(err = upload(dKd, k)).empty() || !(err = upload(dVd, v)).empty() ||
        !(err = upload(dOd, std::vector<float>(nq, NAN))).empty() ||
        !(err = upload_bytes(dLd, lse_poison.data(), lse_poison.size() * 4)).empty())
      return r.error = err, r;
    rt::ForwardArgs g;
    g.batch = B, g.heads = H, g.heads_k = Hk, g.seq_q = Sq, g.seq_k = Smax, g.head_dim = d, g.dtype = c.dtype;
    g.causal = c.causal, g.scale = c.scale, g.q = f.q;
    g.k = rt::Tensor::bhsd(dKd.ptr, B, Hk, Smax, d), g.v = rt::Tensor::bhsd(dVd.ptr, B, Hk, Smax, d);
    g.o = rt::Tensor::bhsd(dOd.ptr, B, H, Sq, d), g.lse = (float*)dLd.ptr;
    r.bwd_explain = "dense twin: " + rt::explain(g);
    if (rt::Status st = rt::forward(g, stream); !st) return r.error = "dense forward: " + st.message, r;
    if (cudaError_t e = cudaStreamSynchronize(stream)) return r.error = cuda_error(e, "dense forward"), r;
    std::vector<uint8_t> od(nq * elem);
    std::vector<float> ld(lse.size());
    cudaMemcpy(od.data(), dOd.ptr, od.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(ld.data(), dLd.ptr, ld.size() * 4, cudaMemcpyDeviceToHost);
    // Compared only where both ran one config (the caller's pass arranges it): then the kernels' arithmetic is the same.
    auto config_of = [](const std::string& line) {
      const size_t a = line.find("decode_splitkv "), z = line.find(" (config:");
      return a == std::string::npos || z == std::string::npos ? std::string() : line.substr(a + 15, z - a - 15);
    };
    if (config_of(r.fwd_explain).empty() || config_of(r.fwd_explain) != config_of(r.bwd_explain))
      return r.error = "the dense twin does not run the paged call's decode_splitkv config", r;
    if (od != o_bytes) {
      const std::vector<float> dense = flashtune::from_device_format(od, t);
      size_t n = 0, first = 0;
      double worst = 0;
      for (size_t i = 0; i < dense.size(); ++i)
        if (std::memcmp(&od[i * elem], &o_bytes[i * elem], elem)) {
          if (!n++) first = i;
          worst = std::max(worst, (double)std::fabs(dense[i] - o[i]));
        }
      return r.error = "paged and dense forms of one config differ in O on the same K/V: " + std::to_string(n) +
                       " elements, the first [" + std::to_string(first) + "] " + std::to_string(o[first]) + " vs " +
                       std::to_string(dense[first]) + ", max |diff| " + std::to_string(worst),
             r;
    }
    if (c.want_lse && std::memcmp(ld.data(), lse.data(), ld.size() * 4))
      return r.error = "paged and dense forms of one config differ in LSE on the same K/V", r;
  }
  r.ok = true;
  return r;
}

attention_check::Result run_one(const Case& c, unsigned seed) { return attention_check::run_case(c, seed); }
attention_check::Result run_one(const VarlenCase& c, unsigned seed) { return run_varlen_case(c, seed); }
attention_check::Result run_one(const PagedCase& c, unsigned seed) { return run_paged_case(c, seed); }

#ifndef FLASHTUNE_AOT_ARCHS
#define FLASHTUNE_AOT_ARCHS ""
#endif
// This GPU's arch ("sm_90") when the build embeds kernels for it: the entry of FLASHTUNE_AOT_ARCHS
// (comma-separated here) that names it (90a on sm_90, where the Hopper-only families are picked); "" otherwise.
std::string aot_arch() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  const std::string arch = std::to_string(major) + std::to_string(minor);
  for (std::string e : flashtune::split(FLASHTUNE_AOT_ARCHS, ',')) {
    if (e.rfind("sm_", 0) == 0) e = e.substr(3);
    if (e == (arch == "90" ? "90a" : arch)) return "sm_" + arch;
  }
  return "";
}

int cache_entries(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.path().extension() == ".ftk";
  return n;
}

// Runs every case; `allowed` checks each explain line's kernel source (empty: any).
template <class C>
int run_pass(const char* name, const std::vector<C>& cs, unsigned threads, const std::vector<const char*>& allowed) {
  std::atomic<size_t> next{0};
  std::atomic<int> failed{0};
  std::mutex print;
  auto worker = [&] {
    for (size_t i; (i = next++) < cs.size();) {
      const attention_check::Result r = run_one(cs[i], (unsigned)i + 1);
      bool ok = r.ok;
      std::string why = r.error;
      for (const std::string* line : {&r.fwd_explain, &r.bwd_explain}) {
        if (line->empty() && line == &r.bwd_explain) continue;  // a forward-only case (paged)
        bool seen = allowed.empty();
        for (const char* a : allowed) seen = seen || contains(*line, a);
        if (!seen) ok = false, why = "unexpected kernel source: " + *line;
      }
      std::lock_guard<std::mutex> lock(print);
      std::printf("%s %s %s%s%s\n  fwd: %s\n  bwd: %s\n", name, ok ? "PASS" : "FAIL", cs[i].str().c_str(),
                  ok ? "" : ": ", why.c_str(), r.fwd_explain.c_str(), r.bwd_explain.c_str());
      std::fflush(stdout);
      failed += !ok;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  return failed;
}

// A forward from a thread that has no current context (nothing of the CUDA runtime called there):
// the library retains q's device's primary context; the output must equal the main thread's.
int contextless_thread() {
  Case c;
  const size_t n = (size_t)c.batch * c.heads * c.seq_q * c.head_dim, nk = (size_t)c.batch * c.heads * c.seq_k * c.head_dim;
  void *q, *k, *v, *o1, *o2;
  cudaMalloc(&q, n * 2), cudaMalloc(&k, nk * 2), cudaMalloc(&v, nk * 2), cudaMalloc(&o1, n * 2), cudaMalloc(&o2, n * 2);
  cudaMemset(q, 0x3c, n * 2), cudaMemset(k, 0x3b, nk * 2), cudaMemset(v, 0x3a, nk * 2);  // small bf16 values
  cudaDeviceSynchronize();
  rt::ForwardArgs f;
  f.batch = c.batch, f.heads = c.heads, f.seq_q = c.seq_q, f.seq_k = c.seq_k, f.head_dim = c.head_dim;
  f.dtype = FT_BF16, f.causal = true;
  f.q = rt::Tensor::bhsd(q, c.batch, c.heads, c.seq_q, c.head_dim);
  f.k = rt::Tensor::bhsd(k, c.batch, c.heads, c.seq_k, c.head_dim);
  f.v = rt::Tensor::bhsd(v, c.batch, c.heads, c.seq_k, c.head_dim);
  f.o = rt::Tensor::bhsd(o1, c.batch, c.heads, c.seq_q, c.head_dim);
  rt::Status s1 = rt::forward(f);
  rt::Status s2;
  std::thread([&] {
    rt::ForwardArgs g = f;
    g.o = rt::Tensor::bhsd(o2, c.batch, c.heads, c.seq_q, c.head_dim);
    s2 = rt::forward(g);
  }).join();
  cudaDeviceSynchronize();
  std::vector<char> h1(n * 2), h2(n * 2);
  cudaMemcpy(h1.data(), o1, n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(h2.data(), o2, n * 2, cudaMemcpyDeviceToHost);
  for (void* p : {q, k, v, o1, o2}) cudaFree(p);
  const bool ok = s1 && s2 && h1 == h2;
  std::printf("%s forward from a thread without a current context%s%s\n", ok ? "PASS" : "FAIL",
              s2 ? "" : ": ", s2.message.c_str());
  return !ok;
}

// A results store at `db` holding one ok row of `family` per (config, problem), recorded for this GPU (its
// name and arch, as a tune on it would store them).
void put_rows(const std::string& db, const std::vector<std::pair<std::string, flashtune::Problem>>& rows,
              const char* family = "decode_splitkv") {
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, dev);
  const std::string arch = "sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
  flashtune::Store store(db);
  for (const auto& [config, p] : rows) {
    flashtune::ResultRecord r = flashtune::fixture::fixture_result(config, p, "ok", 0.05);
    r.family = family;
    store.put_result(r, flashtune::fixture::fixture_device(prop.name, arch));
  }
}

// Decoding through $FLASHTUNE_DB: a store holding one decode_splitkv row for this GPU (bf16, d 128,
// non-causal, 32 query heads over 8, its default config) makes it the pick for every bf16 d 128 call of
// Sq <= 16 that is non-causal or has one row (which sees every key), whatever the tables say; Sq 17 and
// causal Sq 5 keep the dense path. Each call is checked against the float64 reference as in the passes.
int decode_pass(const std::vector<Case>& all) {
  const std::string dir = flashtune::make_private_tmpdir("ft-runtime-decode-db");
  const std::string db = dir + "/decode.db";
  const flashtune::Family& f = flashtune::find_family("decode_splitkv");
  flashtune::Problem p{8, 32, 1, 4096, 128, flashtune::DType::bf16, false};
  p.heads_k = 8;
  put_rows(db, {{f.config_string(f.default_config), p}});
  std::vector<Case> cs;
  for (const Case& c : all)
    if (c.heads_k > 0 && c.seq_q <= 16) cs.push_back(c);
  Case past = cs.front();
  past.seq_q = 17, past.seq_k = 300, past.batch = 1;
  cs.push_back(past);
  setenv("FLASHTUNE_DB", db.c_str(), 1);
  ft_reload_settings();
  int failed = 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    const Case& c = cs[i];
    const attention_check::Result r = attention_check::run_case(c, 100 + (unsigned)i);
    const bool want = c.dtype == FT_BF16 && c.head_dim == 128 && c.seq_q <= f.max_seq_q && (!c.causal || c.seq_q == 1);
    const bool ran = contains(r.fwd_explain, "decode_splitkv ") && contains(r.fwd_explain, "config: db");
    const bool ok = r.ok && ran == want;
    std::printf("decode %s %s (%s decode_splitkv)%s%s\n  fwd: %s\n  bwd: %s\n", ok ? "PASS" : "FAIL", c.str().c_str(),
                want ? "wants" : "not", r.ok ? "" : ": ", r.error.c_str(), r.fwd_explain.c_str(), r.bwd_explain.c_str());
    failed += !ok;
  }
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  std::filesystem::remove_all(dir);
  return failed;
}

// Paged calls through $FLASHTUNE_DB: a store holding, for this GPU (bf16, d 128, non-causal, 32 query heads over 8,
// Sk 4096), a paged decode_splitkv row (256-key pages) and a dense one whose configs differ in BLOCK_N (256, 128).
// 256-key pages run the paged row; 128-key pages, which BLOCK_N 256 cannot read, the dense row (noted), whose
// output must be ft_attention_forward's with that row on the same K/V bit for bit (one config: the same blocks,
// splits and sums, only the addresses differ); 64-key pages, which neither reads, the default. Each checked
// against the float64 reference.
int paged_db_pass() {
  const std::string dir = flashtune::make_private_tmpdir("ft-runtime-paged-db");
  const std::string db = dir + "/paged.db";
  const flashtune::Family& f = flashtune::find_family("decode_splitkv");
  const std::string paged_cfg = "SPLITS=8,BLOCK_N=256,WARPS=8,STAGES=1", dense_cfg = "SPLITS=4,BLOCK_N=128,WARPS=4,STAGES=1";
  flashtune::Problem dense{8, 32, 1, 4096, 128, flashtune::DType::bf16, false};
  dense.heads_k = 8;
  flashtune::Problem paged = dense;
  paged.paged.page_size = 256;
  put_rows(db, {{dense_cfg, dense}, {paged_cfg, paged}});
  PagedCase c;
  c.lens = {4096, 4096}, c.heads = 32, c.heads_k = 8, c.page_size = 256;
  struct Want {
    int page;
    std::string config, source, note;
    bool twin;
  } wants[] = {{256, paged_cfg, "config: db", "", false},
               {128, dense_cfg, "config: db", "the dense decoding pick used", true},
               {64, f.config_string(f.default_config), "config: default", "rejected for pages of 64 keys", false}};
  setenv("FLASHTUNE_DB", db.c_str(), 1);
  ft_reload_settings();
  int failed = 0;
  for (const Want& w : wants) {
    c.page_size = w.page, c.dense_twin = w.twin;
    const attention_check::Result r = run_paged_case(c, 200 + (unsigned)w.page);
    const bool ran = contains(r.fwd_explain, ("decode_splitkv " + w.config + " (" + w.source).c_str()) &&
                     (w.note.empty() ? !contains(r.fwd_explain, "; ") : contains(r.fwd_explain, w.note.c_str()));
    const bool ok = r.ok && ran;
    std::printf("paged-db %s %s (wants %s, %s%s%s)%s%s\n  fwd: %s\n  %s\n", ok ? "PASS" : "FAIL", c.str().c_str(),
                w.config.c_str(), w.source.c_str(), w.note.empty() ? "" : "; ", w.note.c_str(), r.ok ? "" : ": ",
                r.error.c_str(), r.fwd_explain.c_str(), r.bwd_explain.c_str());
    failed += !ok;
  }
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  std::filesystem::remove_all(dir);
  return failed;
}

// fa3_wgmma's MULTICAST through $FLASHTUNE_DB (Hopper): a store holding MULTICAST 1 rows for this GPU (bf16
// non-causal, d 128 and d 256) makes them the picks for those shapes, so that the library launches the
// kernel in clusters of two CTAs (cuLaunchKernelEx); each call checked against the float64 reference. The
// shapes' query blocks are odd in number (a spare CTA) and each cluster's second CTA owns real rows.
int multicast_pass() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major != 9) {
    std::printf("note: fa3_wgmma's MULTICAST runs on Hopper only; no multicast pass\n");
    return 0;
  }
  const std::string dir = flashtune::make_private_tmpdir("ft-runtime-multicast-db");
  const std::string db = dir + "/multicast.db";
  struct Want {
    int head_dim;
    std::string config;
  } wants[] = {{128, "BLOCK_N=128,CONSUMERS=2,STAGES=2,OVERLAP=1,PINGPONG=1,P_SMEM=1,PERSISTENT=0,TWO_CTAS=0,MULTICAST=1"},
               {256, "BLOCK_N=80,CONSUMERS=2,STAGES=2,OVERLAP=1,PINGPONG=0,P_SMEM=0,PERSISTENT=0,TWO_CTAS=0,MULTICAST=1"}};
  std::vector<std::pair<std::string, flashtune::Problem>> rows;
  for (const Want& w : wants) rows.push_back({w.config, flashtune::Problem{2, 4, 333, 517, w.head_dim, flashtune::DType::bf16, false}});
  put_rows(db, rows, "fa3_wgmma");
  setenv("FLASHTUNE_DB", db.c_str(), 1);
  ft_reload_settings();
  int failed = 0;
  for (const Want& w : wants) {
    Case c;
    c.batch = 2, c.heads = 4, c.seq_q = 333, c.seq_k = 517, c.head_dim = w.head_dim, c.causal = false;
    const attention_check::Result r = attention_check::run_case(c, 300 + (unsigned)w.head_dim);
    const bool ran = contains(r.fwd_explain, ("fa3_wgmma " + w.config + " (config: db").c_str());
    const bool ok = r.ok && ran;
    std::printf("multicast %s %s (wants %s from the store)%s%s\n  fwd: %s\n", ok ? "PASS" : "FAIL", c.str().c_str(),
                w.config.c_str(), r.ok ? "" : ": ", r.error.c_str(), r.fwd_explain.c_str());
    failed += !ok;
  }
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  std::filesystem::remove_all(dir);
  return failed;
}

int unsupported() {
  int failed = 0;
  for (auto [t, d] : {std::pair{FT_FP32, 256}, std::pair{FT_BF16, 80}}) {
    rt::ForwardArgs f;
    f.batch = f.heads = f.seq_q = f.seq_k = 1, f.head_dim = d, f.dtype = t;
    static char dummy[64];
    f.q = f.k = f.v = f.o = rt::Tensor::bhsd(dummy, 1, 1, 1, d);
    const rt::Status s = rt::forward(f);
    const bool ok = s.code == FT_UNSUPPORTED && s.message.find('\n') == std::string::npos;
    std::printf("%s unsupported d=%d: %s\n", ok ? "PASS" : "FAIL", d, s.message.c_str());
    failed += !ok;
  }
  return failed;
}

// This binary again with --disk-pass: a fresh process (nothing in memory) on the same FLASHTUNE_CACHE_DIR, which
// it inherits with the rest of the environment. 1 when it could not start or did not exit 0.
int disk_pass_in_child() {
  std::fflush(stdout);  // our lines before the child's on a shared stdout
  try {
    const flashtune::ExitStatus end = flashtune::Subprocess::spawn({"/proc/self/exe", "--disk-pass"}).wait();
    if (end.ok()) return 0;
    std::printf("FAIL disk pass (%s)\n", end.describe().c_str());
  } catch (const flashtune::SpawnError& e) {
    std::printf("FAIL could not start the disk pass: %s\n", e.what());
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool disk_pass = argc > 1 && std::strcmp(argv[1], "--disk-pass") == 0;
  if (rt::Status s = rt::device_available(); !s) {
    std::printf("no GPU: %s\n", s.message.c_str());
    return 77;
  }
  const std::vector<Case> cs = cases();
  // With AOT kernels in the library, explain() says "aot" for them wherever they are loaded from.
  const bool aot = !std::string(FLASHTUNE_AOT_ARCHS).empty();
  const std::vector<VarlenCase> vs = varlen_cases();
  const std::vector<PagedCase> ps = paged_cases();
  if (disk_pass) {
    const std::vector<const char*> from_disk = {"kernel: disk", "kernel: memory", aot ? "kernel: aot" : "kernel: disk"};
    return run_pass("disk", cs, 1, from_disk) + run_pass("disk", vs, 1, from_disk) + run_pass("disk", ps, 1, from_disk)
               ? 1
               : 0;
  }

  std::string dir = flashtune::make_private_tmpdir("ft-runtime-cache");
  setenv("FLASHTUNE_CACHE_DIR", dir.c_str(), 1);
  std::printf("FLASHTUNE_CACHE_DIR=%s, %zu cases, %zu packed, %zu paged\n", dir.c_str(), cs.size(), vs.size(), ps.size());
  const unsigned threads = std::max(1u, std::min(12u, std::thread::hardware_concurrency()));
  int failed = 0;
  if (const std::string arch = aot_arch(); !arch.empty()) {
    failed += run_pass("aot", cs, threads, {"kernel: aot"});
    failed += run_pass("aot", vs, threads, {"kernel: aot"});
    failed += run_pass("aot", ps, threads, {"kernel: aot"});
    const int n = cache_entries(dir);
    std::printf("%s aot: %d kernel(s) compiled by NVRTC on %s (want 0)\n", n ? "FAIL" : "PASS", n, arch.c_str());
    failed += n != 0;
  } else if (aot) {
    std::printf("note: FLASHTUNE_AOT_ARCHS=%s does not cover this GPU; no aot pass\n", FLASHTUNE_AOT_ARCHS);
  }
  failed += run_pass("jit", cs, threads, {});
  failed += run_pass("jit", vs, threads, {});
  failed += run_pass("jit", ps, threads, {});
  failed += run_pass("memory", cs, 1, {"kernel: memory", aot ? "kernel: aot" : "kernel: memory"});
  failed += run_pass("memory", vs, 1, {"kernel: memory", aot ? "kernel: aot" : "kernel: memory"});
  failed += run_pass("memory", ps, 1, {"kernel: memory", aot ? "kernel: aot" : "kernel: memory"});
  failed += decode_pass(cs);
  failed += paged_db_pass();
  failed += multicast_pass();
  failed += contextless_thread();
  failed += unsupported();

  // Pass 3: a new process, the same cache folder: nothing compiled.
  failed += disk_pass_in_child();
  std::string rm = dir;
  std::filesystem::remove_all(rm);
  std::printf("%s: %d failure(s)\n", failed ? "FAIL" : "PASS", failed);
  return failed ? 1 : 0;
}
