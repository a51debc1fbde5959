// The runtime library on a GPU, through its public interface only: forward and backward for every
// dtype and every head dim the registry's families run in both directions, ragged shapes, causal and
// not, Sq > Sk (fully masked rows) and Sq = 1, transposed [B, S, H, d] strides, a custom scale, a
// caller-given backward workspace; each checked against the float64 reference with tuner/validate's
// bounds (examples/cmake_consumer/attention_check.hpp). Pass 1 runs the cases on several threads (JIT
// into a fresh FLASHTUNE_CACHE_DIR), pass 2 again in this process (every kernel from memory), pass 3
// in a child process (kernels from disk, none compiled). Also: a call from a thread with no current
// context (the primary context of q's device), and unsupported head dims. Prints explain() lines.
// Packed variable-length batches through ft_attention_varlen_forward/_backward (ragged lengths, empty
// sequences, cross-attention lengths, GQA, a strided q, a loose max_seqlen, a caller workspace), checked
// against the float64 reference of each sequence alone (tuner/validate's varlen references: the dense
// forward and backward per (sequence, head)) with the same bounds, in every pass. Decoding (Sq <= 16,
// GQA, K/V caches up to 40k keys): in every pass through whatever the tables pick, then in a pass of its
// own with $FLASHTUNE_DB naming a store that holds a decode_splitkv row for this GPU, where explain()
// must say decode_splitkv for the calls in its bucket (and not for the one past Sq 16), each checked
// against the float64 reference as the dense path is.
// In a build with FLASHTUNE_AOT_ARCHS that covers this GPU's arch (90a for sm_90), pass 0 runs every
// case first: each kernel must come from the library ("kernel: aot") and the fresh cache folder must
// stay empty (nothing compiled by NVRTC).
// Exit 0 pass, 1 fail, 77 no GPU.
#include <spawn.h>
#include <sys/wait.h>
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
#include "tests/fixture.hpp"
#include "tuner/family.hpp"
#include "tuner/store.hpp"
#include "tuner/util.hpp"

extern char** environ;
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
// (sequence, head) alone, with tuner/validate's bounds (the backward from the reference's O and LSE).
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

attention_check::Result run_one(const Case& c, unsigned seed) { return attention_check::run_case(c, seed); }
attention_check::Result run_one(const VarlenCase& c, unsigned seed) { return run_varlen_case(c, seed); }

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

// Decoding through $FLASHTUNE_DB: a store holding one decode_splitkv row for this GPU (bf16, d 128,
// non-causal, 32 query heads over 8, its default config) makes it the pick for every bf16 d 128 call of
// Sq <= 16 that is non-causal or has one row (which sees every key), whatever the tables say; Sq 17 and
// causal Sq 5 keep the dense path. Each call is checked against the float64 reference as in the passes.
int decode_pass(const std::vector<Case>& all) {
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, dev);
  const std::string arch = "sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
  const std::string dir = flashtune::make_private_tmpdir("ft-runtime-decode-db");
  const std::string db = dir + "/decode.db";
  const flashtune::Family& f = flashtune::find_family("decode_splitkv");
  {
    flashtune::Store store(db);
    flashtune::Problem p{8, 32, 1, 4096, 128, flashtune::DType::bf16, false};
    p.heads_k = 8;
    flashtune::ResultRecord r = flashtune::fixture::fixture_result(f.config_string(f.default_config), p, "ok", 0.05);
    r.family = f.name;
    store.put_result(r, flashtune::fixture::fixture_device(prop.name, arch));
  }
  std::vector<Case> cs;
  for (const Case& c : all)
    if (c.heads_k > 0 && c.seq_q <= 16) cs.push_back(c);
  Case past = cs.front();
  past.seq_q = 17, past.seq_k = 300, past.batch = 1;
  cs.push_back(past);
  setenv("FLASHTUNE_DB", db.c_str(), 1);
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
  if (disk_pass) {
    const std::vector<const char*> from_disk = {"kernel: disk", "kernel: memory", aot ? "kernel: aot" : "kernel: disk"};
    return run_pass("disk", cs, 1, from_disk) + run_pass("disk", vs, 1, from_disk) ? 1 : 0;
  }

  std::string dir = flashtune::make_private_tmpdir("ft-runtime-cache");
  setenv("FLASHTUNE_CACHE_DIR", dir.c_str(), 1);
  std::printf("FLASHTUNE_CACHE_DIR=%s, %zu cases, %zu packed\n", dir.c_str(), cs.size(), vs.size());
  const unsigned threads = std::max(1u, std::min(12u, std::thread::hardware_concurrency()));
  int failed = 0;
  if (const std::string arch = aot_arch(); !arch.empty()) {
    failed += run_pass("aot", cs, threads, {"kernel: aot"});
    failed += run_pass("aot", vs, threads, {"kernel: aot"});
    const int n = cache_entries(dir);
    std::printf("%s aot: %d kernel(s) compiled by NVRTC on %s (want 0)\n", n ? "FAIL" : "PASS", n, arch.c_str());
    failed += n != 0;
  } else if (aot) {
    std::printf("note: FLASHTUNE_AOT_ARCHS=%s does not cover this GPU; no aot pass\n", FLASHTUNE_AOT_ARCHS);
  }
  failed += run_pass("jit", cs, threads, {});
  failed += run_pass("jit", vs, threads, {});
  failed += run_pass("memory", cs, 1, {"kernel: memory", aot ? "kernel: aot" : "kernel: memory"});
  failed += run_pass("memory", vs, 1, {"kernel: memory", aot ? "kernel: aot" : "kernel: memory"});
  failed += decode_pass(cs);
  failed += contextless_thread();
  failed += unsupported();

  // Pass 3: a new process, the same cache folder: nothing compiled.
  pid_t pid;
  char* child_argv[] = {argv[0], (char*)"--disk-pass", nullptr};
  std::fflush(stdout);
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, child_argv, environ) != 0) {
    std::printf("FAIL could not start the disk pass\n");
    ++failed;
  } else {
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::printf("FAIL disk pass (exit %d)\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
      ++failed;
    }
  }
  std::string rm = dir;
  std::filesystem::remove_all(rm);
  std::printf("%s: %d failure(s)\n", failed ? "FAIL" : "PASS", failed);
  return failed ? 1 : 0;
}
