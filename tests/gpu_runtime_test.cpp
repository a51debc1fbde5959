// The runtime library on a GPU, through its public interface only: forward and backward for every
// dtype and every head dim the registry's families run in both directions, ragged shapes, causal and
// not, Sq > Sk (fully masked rows) and Sq = 1, transposed [B, S, H, d] strides, a custom scale, a
// caller-given backward workspace; each checked against the float64 reference with tuner/validate's
// bounds (examples/cmake_consumer/attention_check.hpp). Pass 1 runs the cases on several threads (JIT
// into a fresh FLASHTUNE_CACHE_DIR), pass 2 again in this process (every kernel from memory), pass 3
// in a child process (kernels from disk, none compiled). Also: a call from a thread with no current
// context (the primary context of q's device), and unsupported head dims. Prints explain() lines.
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
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "attention_check.hpp"
#include "tuner/family.hpp"
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
  return out;
}

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

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

// Runs every case; `want_cache` checks each explain line's kernel source ("" = any).
int run_pass(const char* name, const std::vector<Case>& cs, unsigned threads, const std::vector<const char*>& allowed) {
  std::atomic<size_t> next{0};
  std::atomic<int> failed{0};
  std::mutex print;
  auto worker = [&] {
    for (size_t i; (i = next++) < cs.size();) {
      const attention_check::Result r = attention_check::run_case(cs[i], (unsigned)i + 1);
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
  if (disk_pass) return run_pass("disk", cs, 1, {"kernel: disk", "kernel: memory", aot ? "kernel: aot" : "kernel: disk"}) ? 1 : 0;

  std::string dir = flashtune::make_private_tmpdir("ft-runtime-cache");
  setenv("FLASHTUNE_CACHE_DIR", dir.c_str(), 1);
  std::printf("FLASHTUNE_CACHE_DIR=%s, %zu cases\n", dir.c_str(), cs.size());
  const unsigned threads = std::max(1u, std::min(12u, std::thread::hardware_concurrency()));
  int failed = 0;
  if (const std::string arch = aot_arch(); !arch.empty()) {
    failed += run_pass("aot", cs, threads, {"kernel: aot"});
    const int n = cache_entries(dir);
    std::printf("%s aot: %d kernel(s) compiled by NVRTC on %s (want 0)\n", n ? "FAIL" : "PASS", n, arch.c_str());
    failed += n != 0;
  } else if (aot) {
    std::printf("note: FLASHTUNE_AOT_ARCHS=%s does not cover this GPU; no aot pass\n", FLASHTUNE_AOT_ARCHS);
  }
  failed += run_pass("jit", cs, threads, {});
  failed += run_pass("memory", cs, 1, {"kernel: memory", aot ? "kernel: aot" : "kernel: memory"});
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
