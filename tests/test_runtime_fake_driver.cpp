// The runtime library's GPU path without a GPU: a fake libcuda.so.1 (tests/fake_driver/) stands in for
// the driver (host memory as device memory, launches recorded and played on the host by a hook), while
// NVRTC, the disk cache and the plan are real. Checks: the family and default config on an untabled
// sm_80 device, the launch sequence and geometry against the family's descriptor, the primary context
// retained once and push/pop balanced (none when a context is current), stream scratch freed, packing
// and unpacking of transposed strides (the hook's kernel is o = q, so o must come back in o's layout),
// the backward's three kernels and its workspace (size, caller-given, too small, misaligned), a caller's scratch
// allocator (ft_set_scratch_allocator: every kind of call's scratch from it, once per call, on the call's stream;
// a misaligned or NULL answer refused in one line), the library's pool trimmed by ft_release_scratch,
// kernels from memory, then from disk in a child process, and a truncated entry recompiled there.
// Grouped-query heads on sm_80 and a fake sm_90; packed variable-length batches (the packed kernel forms, their parameters and
// scratch, strided packed tensors packed and unpacked, fa3_wgmma's token-major tensor maps); paged K/V caches
// (decode_splitkv's paged form, its parameters, the pools in place, the nearest config for small pages);
// decoding on a fake H100 through the committed table's decode_splitkv entry (and the default with
// $FLASHTUNE_TABLES=off); a second user's planted cache
// entries and -wal, and a store of packed rows the lookup does not read, through FLASHTUNE_CACHE_DIR and FLASHTUNE_DB;
// the user's store ($XDG_CACHE_HOME/flashtune/<gpu-slug>.db) read with no variable, and passed over when unsafe.
// (A test that sets $FLASHTUNE_DB or $XDG_CACHE_HOME calls ft_reload_settings: the runtime reads them at most once
// a second otherwise; PlanCache checks that window and the plan cache itself.)
#include <cuda.h>
#include <dlfcn.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/family.hpp"
#include "core/nvrtc_api.hpp"
#include "core/util.hpp"
#include "disk_cache.hpp"
#include "fake_driver/load.hpp"
#include "fixture.hpp"
#include "flashtune/attention.h"
#include "lookup.hpp"
#include "templates/attention_params.h"
#include "test_in_child.hpp"

namespace fs = std::filesystem;
using namespace flashtune;

namespace {
template <class F>
F* fake_fn(const char* name) {
  return reinterpret_cast<F*>(dlsym(fake_lib(), name));
}

constexpr int B = 1, H = 2, Sq = 70, Sk = 50, D = 32;
int g_head_dim = D;

// Plays the strided copy as written in runtime/src/attention.cpp, and the forward as o = q.
void play(const char* name, void** params) {
  const std::string n = name;
  if (n.rfind("ft_strided_copy_", 0) == 0) {
    const size_t elem = n.back() == '2' ? 2 : 4;
    char* src = *static_cast<char**>(params[0]);
    char* dst = *static_cast<char**>(params[1]);
    long long v[8];
    for (int i = 0; i < 8; ++i) v[i] = *static_cast<long long*>(params[2 + i]);
    const long long cnt = v[0], h_ = v[1], s_ = v[2], d_ = v[3];
    const int unpack = *static_cast<int*>(params[10]);
    for (long long i = 0; i < cnt; ++i) {
      const long long c = i % d_, r = i / d_, s = r % s_, r2 = r / s_, h = r2 % h_, b = r2 / h_;
      const long long off = b * v[4] + h * v[5] + s * v[6] + c * v[7];
      if (unpack) std::memcpy(dst + off * elem, src + i * elem, elem);
      else std::memcpy(dst + i * elem, src + off * elem, elem);
    }
  } else if (n.find("fa2_simt_fwd") != std::string::npos) {
    const AttnFwdParams& p = **reinterpret_cast<AttnFwdParams**>(params);
    std::memcpy(p.o, p.q, sizeof(float) * p.batch * p.heads * p.seq_q * g_head_dim);
  }
}

struct Host {
  std::vector<float> mem;
  explicit Host(size_t n) : mem(n + 4) {}
  float* ptr() { return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(mem.data()) + 15) / 16 * 16); }
};

ft_tensor bhsd(float* p, int s) { return ft_tensor{p, {(int64_t)H * s * D, (int64_t)s * D, D, 1}}; }
ft_tensor bshd(float* p, int s) { return ft_tensor{p, {(int64_t)s * H * D, D, (int64_t)H * D, 1}}; }

std::string explain_fwd(const ft_forward_args& a) {
  char buf[512];
  EXPECT_EQ(ft_explain_forward_text(&a, buf, sizeof buf), FT_OK) << ft_last_error();
  return buf;
}

int entries(const std::string& dir) {
  int n = 0;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".ftk";
  return n;
}

// Runs test FakeDriver.<test> (a disabled one) in a child process with FT_FAKE_CHILD = mode; its exit status.
int spawn_child(const char* mode, const std::string& test = "DISABLED_Child") {
  return run_test_in_child("FakeDriver." + test, "FT_FAKE_CHILD", mode);
}

struct Buffers {
  Host q{B * H * Sq * D}, k{B * H * Sk * D}, v{B * H * Sk * D}, o{B * H * Sq * D};
  ft_forward_args fwd() {
    for (size_t i = 0; i < (size_t)B * H * Sq * D; ++i) q.ptr()[i] = (float)i;
    ft_forward_args a{};
    a.batch = B, a.heads = H, a.seq_q = Sq, a.seq_k = Sk, a.head_dim = D, a.dtype = FT_FP32;
    a.q = bhsd(q.ptr(), Sq), a.k = bhsd(k.ptr(), Sk), a.v = bhsd(v.ptr(), Sk), a.o = bhsd(o.ptr(), Sq);
    return a;
  }
};
// A caller's scratch allocator (ft_set_scratch_allocator) on the fake: host memory, each call logged; `offset`
// shifts what it returns (misaligned), `refuse` makes it return NULL.
struct CallerScratch {
  std::vector<size_t> allocs;  // bytes asked, call by call
  int frees = 0, live = 0, device = -1, offset = 0;
  void* stream = nullptr;
  bool refuse = false;
  size_t freed_bytes = 0;

  static void* alloc(size_t bytes, int device, void* stream, void* user) {
    auto& self = *static_cast<CallerScratch*>(user);
    self.allocs.push_back(bytes);
    self.device = device, self.stream = stream;
    if (self.refuse) return nullptr;
    ++self.live;
    return static_cast<char*>(std::aligned_alloc(256, (bytes + 511) / 256 * 256)) + self.offset;
  }
  static void free(void* p, size_t bytes, int, void*, void* user) {
    auto& self = *static_cast<CallerScratch*>(user);
    ++self.frees, --self.live, self.freed_bytes += bytes;
    std::free(static_cast<char*>(p) - self.offset);
  }
  // Installed for the scope of a test block; the library's pool again after.
  struct Installed {
    explicit Installed(CallerScratch& s) { EXPECT_EQ(ft_set_scratch_allocator(alloc, free, &s), FT_OK); }
    ~Installed() { EXPECT_EQ(ft_set_scratch_allocator(nullptr, nullptr, nullptr), FT_OK); }
  };
};
void* const kStream = reinterpret_cast<void*>(0x5f00);  // a stream handle the fake never reads

// The sm_80 tests follow the JIT path; a library with sm_80 kernels embedded takes those (test_runtime_aot).
bool embeds_sm80() {
  for (const std::string& e : split(FT_AOT_ARCHS, ','))
    if (e == "80" || e == "sm_80") return true;
  return false;
}
}  // namespace

TEST(FakeDriver, ForwardBackwardCachesAndPacking) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  if (embeds_sm80()) GTEST_SKIP() << "the library embeds sm_80 kernels (FLASHTUNE_AOT_ARCHS)";
  const std::string cache = make_private_tmpdir("ft-fake-cache");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  FakeState& st = fake();
  st.hook = play;
  ASSERT_EQ(ft_device_available(), FT_OK) << ft_last_error();

  Buffers buf;
  ft_forward_args a = buf.fwd();
  std::string line = explain_fwd(a);
  EXPECT_NE(line.find("fa2_simt " + find_family("fa2_simt").config_string(find_family("fa2_simt").default_config) +
                      " (config: default, kernel: jit) on Fake GPU (sm_80)"),
            std::string::npos)
      << line;
  ft_explanation e;
  ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK);
  EXPECT_STREQ(e.family, "fa2_simt");
  EXPECT_STREQ(e.source, "default");
  EXPECT_STREQ(e.cache, "jit");
  EXPECT_STREQ(e.arch, "sm_80");

  // Contiguous: one launch, the family's geometry; the primary context retained once, push/pop balanced.
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  ASSERT_EQ(st.launches.size(), 1u);
  Problem p;
  p.batch = B, p.heads = H, p.seq_q = Sq, p.seq_k = Sk, p.head_dim = D;
  const Family& f = find_family("fa2_simt");
  const Launch want = f.launches(f.default_config, p)[0];
  const FakeLaunch& got = st.launches[0];
  EXPECT_NE(got.name.find("fa2_simt_fwd"), std::string::npos) << got.name;
  EXPECT_EQ(std::vector<unsigned>(got.grid, got.grid + 3), std::vector<unsigned>(want.grid, want.grid + 3));
  EXPECT_EQ(got.threads, want.threads);
  EXPECT_EQ(got.smem, want.smem_bytes);
  EXPECT_EQ(st.primary_retains, 1);
  EXPECT_EQ(st.pushes, st.pops);
  EXPECT_EQ(st.live_allocations, 0);
  ASSERT_EQ(st.allocated.size(), 1u);  // the LSE nobody asked for
  EXPECT_GE(st.allocated[0], (size_t)B * H * Sq * 4);
  EXPECT_EQ(std::memcmp(buf.o.ptr(), buf.q.ptr(), sizeof(float) * B * H * Sq * D), 0);
  EXPECT_EQ(entries(cache), 1);
  EXPECT_NE(explain_fwd(a).find("kernel: memory"), std::string::npos);

  // Transposed q and o: packed, run, unpacked; o (o = q by the hook) must hold q's values in o's layout.
  Host qt(B * H * Sq * D), ot(B * H * Sq * D);
  for (int i = 0; i < B * H * Sq * D; ++i) qt.ptr()[i] = (float)(7 * i % 1000);
  a.q = bshd(qt.ptr(), Sq), a.o = bshd(ot.ptr(), Sq);
  st.launches.clear();
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  ASSERT_EQ(st.launches.size(), 3u);
  EXPECT_EQ(st.launches[0].name, "ft_strided_copy_4");
  EXPECT_EQ(st.launches[2].name, "ft_strided_copy_4");
  EXPECT_EQ(std::memcmp(ot.ptr(), qt.ptr(), sizeof(float) * B * H * Sq * D), 0);
  EXPECT_EQ(entries(cache), 2);  // + the copy kernel
  EXPECT_EQ(st.live_allocations, 0);
  EXPECT_EQ(st.primary_retains, 1);

  // A context already current: used as it is (no push of ours).
  CUcontext mine = reinterpret_cast<CUcontext>(0x2000);
  fake_fn<CUresult(CUcontext)>("cuCtxPushCurrent_v2")(mine);
  const int pushes = st.pushes;
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  EXPECT_EQ(st.pushes, pushes);
  CUcontext popped;
  fake_fn<CUresult(CUcontext*)>("cuCtxPopCurrent_v2")(&popped);
  EXPECT_EQ(popped, mine);

  // Backward: three kernels; workspace size, allocated on the stream, or the caller's.
  Host lse(B * H * Sq), dout(B * H * Sq * D), dq(B * H * Sq * D), dk(B * H * Sk * D), dv(B * H * Sk * D);
  ft_backward_args b{};
  b.batch = B, b.heads = H, b.seq_q = Sq, b.seq_k = Sk, b.head_dim = D, b.dtype = FT_FP32, b.causal = 1;
  b.q = bhsd(buf.q.ptr(), Sq), b.k = bhsd(buf.k.ptr(), Sk), b.v = bhsd(buf.v.ptr(), Sk), b.o = bhsd(buf.o.ptr(), Sq);
  b.dout = bhsd(dout.ptr(), Sq), b.lse = lse.ptr();
  b.dq = bhsd(dq.ptr(), Sq), b.dk = bhsd(dk.ptr(), Sk), b.dv = bhsd(dv.ptr(), Sk);
  size_t ws = 0;
  ASSERT_EQ(ft_backward_workspace_bytes(&b, &ws), FT_OK) << ft_last_error();
  EXPECT_GE(ws, (size_t)B * H * Sq * (D + 1) * 4);  // delta and dq_accum at least
  st.launches.clear();
  st.allocated.clear();
  ASSERT_EQ(ft_attention_backward(&b, nullptr), FT_OK) << ft_last_error();
  const Family& fb = find_family("fa2_simt_bwd");
  ASSERT_EQ(st.launches.size(), fb.kernels.size());
  for (size_t i = 0; i < fb.kernels.size(); ++i) {
    const std::string k = fb.kernels[i].substr(fb.kernels[i].rfind(':') + 1);
    EXPECT_NE(st.launches[i].name.find(k), std::string::npos) << st.launches[i].name << " vs " << k;
  }
  ASSERT_EQ(st.allocated.size(), 1u);
  EXPECT_EQ(st.allocated[0], ws);
  std::vector<char> mem(ws + 256);
  void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(mem.data()) + 255) / 256 * 256);
  b.workspace = aligned, b.workspace_bytes = ws - 1;
  EXPECT_EQ(ft_attention_backward(&b, nullptr), FT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ft_last_error()).find("workspace_bytes"), std::string::npos);
  b.workspace_bytes = ws;
  st.allocated.clear();
  EXPECT_EQ(ft_attention_backward(&b, nullptr), FT_OK) << ft_last_error();
  EXPECT_TRUE(st.allocated.empty());
  EXPECT_EQ(st.live_allocations, 0);
  EXPECT_EQ(st.pushes, st.pops);
  b.workspace = reinterpret_cast<char*>(aligned) + 16;  // misaligned
  EXPECT_EQ(ft_attention_backward(&b, nullptr), FT_INVALID_ARGUMENT);
  EXPECT_STREQ(ft_last_error(), "workspace is not 256-byte aligned (cudaMalloc's alignment)");

  // A caller's allocator: every call's scratch from it, once per call, on the call's stream and device, exactly
  // the bytes the call needs (the backward's: ws); the library's pool untouched. A given workspace still wins.
  {
    CallerScratch mine;
    CallerScratch::Installed installed(mine);
    b.workspace = nullptr, b.workspace_bytes = 0;
    st.allocated.clear();
    ASSERT_EQ(ft_attention_backward(&b, kStream), FT_OK) << ft_last_error();
    ASSERT_EQ(mine.allocs, std::vector<size_t>{ws});
    EXPECT_EQ(mine.stream, kStream);
    EXPECT_EQ(mine.device, 0);
    ASSERT_EQ(ft_attention_forward(&a, kStream), FT_OK) << ft_last_error();  // transposed q, o; no lse
    ASSERT_EQ(mine.allocs.size(), 2u);
    EXPECT_GE(mine.allocs[1], 2ull * B * H * Sq * D * 4 + 4ull * B * H * Sq);  // q and o packed, the LSE
    EXPECT_EQ(std::memcmp(ot.ptr(), qt.ptr(), sizeof(float) * B * H * Sq * D), 0);
    EXPECT_EQ(mine.frees, 2);
    EXPECT_EQ(mine.live, 0);
    EXPECT_EQ(mine.freed_bytes, ws + mine.allocs[1]);
    EXPECT_TRUE(st.allocated.empty());
    b.workspace = aligned, b.workspace_bytes = ws;
    ASSERT_EQ(ft_attention_backward(&b, kStream), FT_OK) << ft_last_error();
    EXPECT_EQ(mine.allocs.size(), 2u);
    b.workspace = nullptr, b.workspace_bytes = 0;
    // A misaligned pointer is handed back and refused; NULL (no memory) is a CUDA error naming the bytes.
    mine.offset = 16;
    EXPECT_EQ(ft_attention_backward(&b, kStream), FT_INVALID_ARGUMENT);
    EXPECT_STREQ(ft_last_error(), "the scratch allocator (ft_set_scratch_allocator) returned a pointer that is not "
                                  "256-byte aligned (cudaMalloc's alignment)");
    EXPECT_EQ(mine.live, 0);
    mine.offset = 0, mine.refuse = true;
    EXPECT_EQ(ft_attention_backward(&b, kStream), FT_CUDA_ERROR);
    EXPECT_EQ(std::string(ft_last_error()), "the scratch allocator (ft_set_scratch_allocator) gave no memory for " +
                                                 std::to_string(ws) + " bytes on device 0");
    EXPECT_EQ(mine.live, 0);
    EXPECT_TRUE(st.allocated.empty());
    EXPECT_EQ(st.live_allocations, 0);
  }
  // The library's pool kept what the calls without an allocator freed; ft_release_scratch trims it to nothing.
  size_t pool = 0;
  ASSERT_EQ(ft_scratch_pool_bytes(&pool), FT_OK) << ft_last_error();
  EXPECT_GE(pool, ws);
  const int trims = st.pool_trims;
  ASSERT_EQ(ft_release_scratch(), FT_OK) << ft_last_error();
  EXPECT_EQ(st.pool_trims, trims + 1);
  ASSERT_EQ(ft_scratch_pool_bytes(&pool), FT_OK) << ft_last_error();
  EXPECT_EQ(pool, 0u);
  ASSERT_EQ(ft_attention_backward(&b, nullptr), FT_OK) << ft_last_error();  // the pool still serves
  ASSERT_EQ(ft_scratch_pool_bytes(&pool), FT_OK) << ft_last_error();
  EXPECT_EQ(pool, ws);

  // $FLASHTUNE_DB: the store's best valid row for this device first (explain only: nothing compiled);
  // a store that cannot be read is a one-line error.
  {
    const std::string db = cache + "/results.db";
    // The first config of the domains (not the default) that the family accepts at this head dim.
    Config c(f.params.size());
    std::vector<size_t> idx(f.params.size(), 0);
    for (;;) {
      for (size_t i = 0; i < c.size(); ++i) c[i] = f.params[i].domain[idx[i]];
      if (c != f.default_config && !f.check(c, D)) break;
      size_t i = 0;
      while (i < idx.size() && ++idx[i] == f.params[i].domain.size()) idx[i++] = 0;
      ASSERT_LT(i, idx.size()) << "no valid non-default config";
    }
    const std::string tuned = f.config_string(c);
    {
      Store s(db);
      ResultRecord r = fixture::fixture_result(tuned, Problem{B, H, Sq, Sk, D, DType::fp32, false}, "ok", 1.0);
      s.put_result(r, fixture::fixture_device("Fake GPU", "sm_80"));
    }
    setenv("FLASHTUNE_DB", db.c_str(), 1);
    ft_reload_settings();
    a = buf.fwd();
    ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK) << ft_last_error();
    EXPECT_STREQ(e.source, "db");
    EXPECT_EQ(std::string(e.config), tuned);
    setenv("FLASHTUNE_DB", (cache + "/missing.db").c_str(), 1);
    ft_reload_settings();
    EXPECT_EQ(ft_explain_forward(&a, &e), FT_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(ft_last_error()).rfind("FLASHTUNE_DB: ", 0), 0u) << ft_last_error();
    unsetenv("FLASHTUNE_DB");
    ft_reload_settings();

    // The user's store, with no variable: $XDG_CACHE_HOME/flashtune/<gpu-slug>.db first (source "user");
    // made group-writable, it is passed over (checked again within a second) and explain's text says why.
    const std::string xdg = cache + "/xdg", user = xdg + "/flashtune/fake-gpu.db";
    fs::create_directories(xdg + "/flashtune");
    chmod((xdg + "/flashtune").c_str(), 0700);
    fs::copy_file(db, user);
    chmod(user.c_str(), 0600);
    const char* saved_xdg = std::getenv("XDG_CACHE_HOME");
    const std::string keep_xdg = saved_xdg ? saved_xdg : "";
    setenv("XDG_CACHE_HOME", xdg.c_str(), 1);
    ft_reload_settings();
    ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK) << ft_last_error();
    EXPECT_STREQ(e.source, "user");
    EXPECT_EQ(std::string(e.config), tuned);
    chmod(user.c_str(), 0664);
    usleep(1100 * 1000);
    char text[1024];
    ASSERT_EQ(ft_explain_forward_text(&a, text, sizeof text), FT_OK) << ft_last_error();
    EXPECT_NE(std::string(text).find("(config: default,"), std::string::npos) << text;
    EXPECT_NE(std::string(text).find("fake-gpu.db' is writable by group or others: not read"), std::string::npos) << text;
    saved_xdg ? (void)setenv("XDG_CACHE_HOME", keep_xdg.c_str(), 1) : (void)unsetenv("XDG_CACHE_HOME");
    ft_reload_settings();
    fs::remove_all(xdg);
    fs::remove(db);
  }

  // A new process: every kernel from disk; then a truncated entry is detected and recompiled.
  EXPECT_EQ(spawn_child("disk"), 0);
  int truncated = 0;
  for (const auto& x : fs::directory_iterator(cache))
    if (x.path().extension() == ".ftk") fs::resize_file(x.path(), fs::file_size(x.path()) / 2), ++truncated;
  EXPECT_EQ(truncated, 3);
  EXPECT_EQ(spawn_child("truncated"), 0);
  rt::DiskCache dc(cache);
  int valid = 0;
  for (const auto& x : fs::directory_iterator(cache))
    if (x.path().extension() == ".ftk") valid += dc.load(x.path().stem().string()).has_value();
  EXPECT_GE(valid, 1);  // the forward's kernel, rebuilt by the child
  fs::remove_all(cache);
}

// Grouped-query attention through the C ABI (bf16, 8 query heads over 2 kv heads): fa2_mma and
// fa2_mma_bwd chosen (the families that read kv head h / group), heads_k reaches the kernels'
// parameters, the dK/dV kernel runs one CTA row per kv head, a transposed k is packed with its own
// 2 heads; fp32 and a heads_k that does not divide heads are refused in one line.
int g_heads_k_seen = -1;
void record_heads_k(const char* name, void** params) {
  const std::string n = name;
  if (n.find("fa2_mma_fwd") != std::string::npos) g_heads_k_seen = (*reinterpret_cast<AttnFwdParams**>(params))->heads_k;
  if (n.find("fa2_mma_bwd_dkdv") != std::string::npos)
    g_heads_k_seen = (*reinterpret_cast<AttnBwdParams**>(params))->heads_k;
}

// A dense call past the kernels' 32-bit indexing runs as batch chunks that each fit, one launch set each:
// fp32 d 32, k of B 17 x Sk 2^22 keys (one batch 2^27 elements: 15 fit, so chunks of the power of two below, 8),
// so chunks of 8, 8 and 1 batches, each launched with its own grid; a shape whose one batch does not fit is refused in one line. (Device
// pointers the fake never reads: no hook plays these launches.)
TEST(FakeDriver, PastTwoToTheThirtyOneInBatchChunks) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  if (embeds_sm80()) GTEST_SKIP() << "the library embeds sm_80 kernels (FLASHTUNE_AOT_ARCHS)";
  const std::string cache = make_private_tmpdir("ft-fake-chunks");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  FakeState& st = fake();
  st.hook = nullptr;
  constexpr int b = 17, sk = 1 << 22, d = 32;
  char* base = reinterpret_cast<char*>(uintptr_t{1} << 40);  // never dereferenced
  auto at = [](char* p, int64_t s) { return ft_tensor{p, {s * d, s * d, d, 1}}; };
  ft_forward_args a{};
  a.batch = b, a.heads = 1, a.seq_q = 1, a.seq_k = sk, a.head_dim = d, a.dtype = FT_FP32;
  a.q = at(base, 1), a.o = at(base + (1 << 20), 1), a.k = at(base + (1LL << 32), sk), a.v = at(base + (1LL << 36), sk);
  st.launches.clear();
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  ft_explanation e;
  ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK) << ft_last_error();
  const Family& f = find_family(e.family);
  const Config c = f.parse_config(e.config);
  std::vector<std::vector<unsigned>> want;
  for (int n : {8, 8, 1}) {
    Problem p;
    p.batch = n, p.heads = 1, p.seq_q = 1, p.seq_k = sk, p.head_dim = d, p.dtype = DType::fp32;
    for (const Launch& l : f.launches(c, p)) want.push_back({l.grid[0], l.grid[1], l.grid[2]});
  }
  ASSERT_EQ(st.launches.size(), want.size()) << e.family;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(std::vector<unsigned>(st.launches[i].grid, st.launches[i].grid + 3), want[i]) << i;
  EXPECT_EQ(st.live_allocations, 0);

  a.batch = 1, a.seq_k = 1 << 26;  // one batch of k: 2^31 elements
  a.k = at(base + (1LL << 32), 1 << 26), a.v = at(base + (1LL << 36), 1 << 26);
  EXPECT_EQ(ft_attention_forward(&a, nullptr), FT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ft_last_error()).find("over 2^31"), std::string::npos) << ft_last_error();
}

TEST(FakeDriver, GroupedQueryHeads) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  if (embeds_sm80()) GTEST_SKIP() << "the library embeds sm_80 kernels (FLASHTUNE_AOT_ARCHS)";
  const std::string cache = make_private_tmpdir("ft-fake-gqa");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  FakeState& st = fake();
  st.hook = record_heads_k;
  constexpr int Hq = 8, Hk = 2, S = 64, d = 64;
  std::vector<uint16_t> q(Hq * S * d + 8), kv(Hk * S * d + 8), o(Hq * S * d + 8), lse(Hq * S * 2 + 8);
  auto al = [](std::vector<uint16_t>& v) { return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(v.data()) + 15) / 16 * 16); };
  auto t = [](void* p, int h, int s) { return ft_tensor{p, {(int64_t)h * s * d, (int64_t)s * d, d, 1}}; };
  ft_forward_args a{};
  a.batch = 1, a.heads = Hq, a.heads_k = Hk, a.seq_q = S, a.seq_k = S, a.head_dim = d, a.dtype = FT_BF16;
  a.q = t(al(q), Hq, S), a.k = t(al(kv), Hk, S), a.v = t(al(kv), Hk, S), a.o = t(al(o), Hq, S);
  a.lse = reinterpret_cast<float*>(al(lse));
  ft_explanation e;
  ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.family, "fa2_mma");
  st.launches.clear();
  g_heads_k_seen = -1;
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  ASSERT_EQ(st.launches.size(), 1u);
  EXPECT_EQ(g_heads_k_seen, Hk);
  EXPECT_EQ(st.launches[0].grid[1], (unsigned)Hq);  // one CTA row per query head

  // k as [B, S, Hk, d] (transposed): packed with Hk heads (the copy's second size argument).
  std::vector<uint16_t> kt(Hk * S * d + 8);
  a.k = ft_tensor{al(kt), {(int64_t)S * Hk * d, d, (int64_t)Hk * d, 1}};
  st.launches.clear();
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  ASSERT_EQ(st.launches.size(), 2u);
  EXPECT_EQ(st.launches[0].name, "ft_strided_copy_2");
  a.k = a.v;

  // Backward: fa2_mma_bwd, dK/dV per kv head.
  std::vector<uint16_t> dout(Hq * S * d + 8), dq(Hq * S * d + 8), dk(Hk * S * d + 8), dv(Hk * S * d + 8);
  ft_backward_args b{};
  b.batch = 1, b.heads = Hq, b.heads_k = Hk, b.seq_q = S, b.seq_k = S, b.head_dim = d, b.dtype = FT_BF16;
  b.q = a.q, b.k = a.k, b.v = a.v, b.o = a.o, b.dout = t(al(dout), Hq, S), b.lse = a.lse;
  b.dq = t(al(dq), Hq, S), b.dk = t(al(dk), Hk, S), b.dv = t(al(dv), Hk, S);
  ASSERT_EQ(ft_explain_backward(&b, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.family, "fa2_mma_bwd");
  st.launches.clear();
  g_heads_k_seen = -1;
  ASSERT_EQ(ft_attention_backward(&b, nullptr), FT_OK) << ft_last_error();
  const Family& f = find_family("fa2_mma_bwd");
  Problem p;
  p.batch = 1, p.heads = Hq, p.heads_k = Hk, p.seq_q = p.seq_k = S, p.head_dim = d, p.dtype = DType::bf16, p.direction = "bwd";
  const std::vector<Launch> want = f.launches(f.parse_config(e.config), p);
  ASSERT_EQ(st.launches.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(std::vector<unsigned>(st.launches[i].grid, st.launches[i].grid + 3),
              std::vector<unsigned>(want[i].grid, want[i].grid + 3)) << st.launches[i].name;
  EXPECT_EQ(want[1].grid[1], (unsigned)Hk);  // the dK/dV kernel: one CTA row per kv head
  EXPECT_EQ(g_heads_k_seen, Hk);

  // Refused in one line: a heads_k that does not divide heads; fp32 (no grouped-query family).
  b.heads_k = 3;
  EXPECT_EQ(ft_attention_backward(&b, nullptr), FT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ft_last_error()).find("heads_k 3 must be 0 or divide heads 8"), std::string::npos) << ft_last_error();
  a.dtype = FT_FP32;
  EXPECT_EQ(ft_attention_forward(&a, nullptr), FT_UNSUPPORTED);
  EXPECT_NE(std::string(ft_last_error()).find("grouped-query"), std::string::npos) << ft_last_error();
  st.hook = nullptr;
  fs::remove_all(cache);
}

// Run by ForwardBackwardCachesAndPacking in a child process (FT_FAKE_CHILD = disk | truncated); disabled,
// so that it is not a test of its own.
TEST(FakeDriver, DISABLED_Child) {
  const char* mode = std::getenv("FT_FAKE_CHILD");
  ASSERT_NE(mode, nullptr) << "run by FakeDriver.ForwardBackwardCachesAndPacking";
  fake().hook = play;
  Buffers buf;
  ft_forward_args a = buf.fwd();
  const std::string want = std::string(mode) == "disk" ? "kernel: disk" : "kernel: jit";
  EXPECT_NE(explain_fwd(a).find(want), std::string::npos) << explain_fwd(a);
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  EXPECT_EQ(std::memcmp(buf.o.ptr(), buf.q.ptr(), sizeof(float) * B * H * Sq * D), 0);
  EXPECT_NE(explain_fwd(a).find("kernel: memory"), std::string::npos);
}

// Grouped-query backward on Hopper: the fake device says compute capability 9.0, in a child process (the
// runtime keeps the first device description it reads). fp16, 8 query heads over 2 kv heads, d 128:
// no committed table rates an fp16 backward, so the fixed preference picks fa2_wgmma_bwd (a grouped-query
// family since it sums dK, dV over the group in its dK/dV CTA); its three kernels launch with the
// descriptor's grids (preprocess and dQ conversion per query head, dK/dV per kv head) and heads_k in the
// parameters. Then a stored LOAD 1 config ($FLASHTUNE_DB): the runtime's workspace holds the tile images
// of every query head (the dK/dV kernel's p.workspace and its bytes lie inside a caller's workspace of
// ft_backward_workspace_bytes).
// No NVRTC on the machine ($FLASHTUNE_NVRTC naming a file that is not there stands for it): a call and its explain
// fail with FT_COMPILE_ERROR and one line saying what was looked for, not an "internal error".
TEST(FakeDriver, NoNvrtcIsOneLine) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  EXPECT_EQ(spawn_child("no-nvrtc", "DISABLED_NoNvrtcChild"), 0);
}

TEST(FakeDriver, DISABLED_NoNvrtcChild) {
  ASSERT_STREQ(std::getenv("FT_FAKE_CHILD"), "no-nvrtc") << "run by FakeDriver.NoNvrtcIsOneLine";
  fake().hook = play;
  const std::string cache = make_private_tmpdir("ft-fake-nonvrtc");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  setenv("FLASHTUNE_NVRTC", "/nonexistent/libnvrtc.so", 1);
  Buffers buf;
  ft_forward_args a = buf.fwd();
  EXPECT_EQ(ft_attention_forward(&a, nullptr), FT_COMPILE_ERROR);
  const std::string err = ft_last_error();
  EXPECT_EQ(err, "cannot load NVRTC " + std::to_string(nvrtc_major_needed()) + " (libnvrtc.so." +
                     std::to_string(nvrtc_major_needed()) +
                     "): FLASHTUNE_NVRTC='/nonexistent/libnvrtc.so' does not exist; unset it to search the usual places");
  char text[512];
  EXPECT_EQ(ft_explain_forward_text(&a, text, sizeof text), FT_COMPILE_ERROR);
  EXPECT_EQ(std::string(ft_last_error()), err);
  fake().hook = nullptr;
  fs::remove_all(cache);
}

TEST(FakeDriver, GroupedQueryHeadsHopperBackward) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  EXPECT_EQ(spawn_child("gqa-hopper", "DISABLED_HopperGqaChild"), 0);
}

namespace {
const AttnBwdParams* g_dkdv_seen = nullptr;
AttnBwdParams g_dkdv_params;
void record_wgmma_dkdv(const char* name, void** params) {
  if (std::string(name).find("fa2_wgmma_bwd_dkdv") == std::string::npos) return;
  g_dkdv_params = **reinterpret_cast<AttnBwdParams**>(params);
  g_dkdv_seen = &g_dkdv_params;
}
}  // namespace

TEST(FakeDriver, DISABLED_HopperGqaChild) {
  ASSERT_STREQ(std::getenv("FT_FAKE_CHILD"), "gqa-hopper") << "run by FakeDriver.GroupedQueryHeadsHopperBackward";
  FakeState& st = fake();
  st.cc_major = 9, st.cc_minor = 0;
  st.hook = record_wgmma_dkdv;
  const std::string cache = make_private_tmpdir("ft-fake-gqa90");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  constexpr int Hq = 8, Hk = 2, S_q = 70, S_k = 100, d = 128;
  std::vector<uint16_t> q(Hq * S_q * d + 8), kv(Hk * S_k * d + 8), o(Hq * S_q * d + 8), dout(Hq * S_q * d + 8),
      dq(Hq * S_q * d + 8), dk(Hk * S_k * d + 8), dv(Hk * S_k * d + 8);
  std::vector<float> lse(Hq * S_q + 4);
  auto al = [](auto& v) { return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(v.data()) + 15) / 16 * 16); };
  auto t = [](void* p, int h, int s) { return ft_tensor{p, {(int64_t)h * s * d, (int64_t)s * d, d, 1}}; };
  ft_backward_args b{};
  b.batch = 1, b.heads = Hq, b.heads_k = Hk, b.seq_q = S_q, b.seq_k = S_k, b.head_dim = d, b.dtype = FT_FP16;
  b.q = t(al(q), Hq, S_q), b.k = t(al(kv), Hk, S_k), b.v = t(al(kv), Hk, S_k), b.o = t(al(o), Hq, S_q);
  b.dout = t(al(dout), Hq, S_q), b.lse = static_cast<float*>(al(lse));
  b.dq = t(al(dq), Hq, S_q), b.dk = t(al(dk), Hk, S_k), b.dv = t(al(dv), Hk, S_k);
  Problem p;
  p.batch = 1, p.heads = Hq, p.heads_k = Hk, p.seq_q = S_q, p.seq_k = S_k, p.head_dim = d, p.dtype = DType::fp16;
  p.direction = "bwd";
  const Family& f = find_family("fa2_wgmma_bwd");

  // Launches of the picked config against the descriptor; heads_k reaches the dK/dV kernel.
  auto run_and_check = [&](const Config& c, void* workspace, size_t workspace_bytes) {
    st.launches.clear();
    g_dkdv_seen = nullptr;
    b.workspace = workspace, b.workspace_bytes = workspace_bytes;
    ASSERT_EQ(ft_attention_backward(&b, nullptr), FT_OK) << ft_last_error();
    const std::vector<Launch> want = f.launches(c, p);
    ASSERT_EQ(st.launches.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const std::string k = f.kernels[i].substr(f.kernels[i].rfind(':') + 1);
      EXPECT_NE(st.launches[i].name.find(k), std::string::npos) << st.launches[i].name << " vs " << k;
      EXPECT_EQ(std::vector<unsigned>(st.launches[i].grid, st.launches[i].grid + 3),
                std::vector<unsigned>(want[i].grid, want[i].grid + 3)) << st.launches[i].name;
      EXPECT_EQ(st.launches[i].smem, want[i].smem_bytes) << st.launches[i].name;
    }
    EXPECT_EQ(want[0].grid[1], (unsigned)Hq);  // preprocess: per query head
    EXPECT_EQ(want[1].grid[1], (unsigned)Hk);  // dK/dV: per kv head
    EXPECT_EQ(want[2].grid[1], (unsigned)Hq);  // dQ conversion: per query head
    ASSERT_NE(g_dkdv_seen, nullptr);
    EXPECT_EQ(g_dkdv_seen->heads, Hq);
    EXPECT_EQ(g_dkdv_seen->heads_k, Hk);
  };

  ft_explanation e;
  ASSERT_EQ(ft_explain_backward(&b, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.family, "fa2_wgmma_bwd");
  EXPECT_STREQ(e.arch, "sm_90");
  run_and_check(f.parse_config(e.config), nullptr, 0);

  // A stored LOAD 1 config for this device: the images of all 8 query heads in the workspace.
  const Config load1 = f.parse_config("BLOCK_M=64,BLOCK_N=64,SPLIT=2,STAGES=2,DQ_RED=3,LOAD=1");
  ASSERT_EQ(f.check(load1, d), nullptr);
  const std::string db = cache + "/results.db";
  {
    Store s(db);
    ResultRecord r = fixture::fixture_result(f.config_string(load1), Problem{1, Hq, S_q, S_k, d, DType::fp16, false},
                                             "ok", 1.0);
    r.family = f.name;
    r.direction = "bwd";
    r.problem.direction = "bwd";
    s.put_result(r, fixture::fixture_device("Fake GPU", "sm_90"));
  }
  setenv("FLASHTUNE_DB", db.c_str(), 1);
  ft_reload_settings();
  ASSERT_EQ(ft_explain_backward(&b, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.source, "db");
  ASSERT_EQ(std::string(e.config), f.config_string(load1));
  const size_t images = f.workspace_bytes(load1, p);
  EXPECT_EQ(images, (size_t)Hq * 128 * (4 * d + 8));  // 70 query rows padded to 128, per query head
  size_t ws = 0;
  ASSERT_EQ(ft_backward_workspace_bytes(&b, &ws), FT_OK) << ft_last_error();
  EXPECT_GE(ws, images + (size_t)Hq * S_q * (d + 1) * 4);  // + delta and dq_accum per query head
  std::vector<char> mem(ws + 256);
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(mem.data()) + 255) / 256 * 256);
  run_and_check(load1, base, ws);
  ASSERT_NE(g_dkdv_seen, nullptr);
  const char* w = static_cast<const char*>(g_dkdv_seen->workspace);
  ASSERT_NE(w, nullptr);
  EXPECT_GE(w, base);
  EXPECT_LE(w + images, base + ws);
  EXPECT_EQ(st.live_allocations, 0);
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  st.hook = nullptr;
  fs::remove_all(cache);
}

// ---- packed variable-length batches and decoding -------------------------------------------------
namespace {
// Host buffers of 16-bit elements (the fake's device memory), 16-byte aligned.
struct U16 {
  std::vector<uint16_t> v;
  explicit U16(size_t n) : v(n + 8) {}
  uint16_t* ptr() { return reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(v.data()) + 15) / 16 * 16); }
};
// The packed form: the kernel template's last argument, VARLEN, is true. Itanium mangling ends it there
// ("Lb1E", "E" closing the template arguments, "E" the nested name) before the return type "v"
// (_ZN9flashtune11fa2_mma_fwdINS_12Fa2MmaTraitsI...ELb1EEELb1EEEvNS_8ParamsOf...); a causal traits
// argument's "Lb1EEE" is followed by the kernel's VARLEN argument instead.
bool packed_form(const std::string& lowered) { return lowered.find("Lb1EEEv") != std::string::npos; }

VarlenParams<AttnFwdParams> g_vfwd;
VarlenParams<AttnBwdParams> g_vbwd;
AttnFwdParams g_dfwd;
AttnTensorMaps g_maps;
int g_packed_launches = 0;
// Plays a packed forward as o = q over every token (o's rows from q's, both token-major), and records the
// parameters the kernels received; the strided copies as ForwardBackwardCachesAndPacking's hook does.
void play_packed(const char* name, void** params) {
  const std::string n = name;
  if (n.rfind("ft_strided_copy_", 0) == 0) return play(name, params);
  if (n.find("fa2_mma_fwd") != std::string::npos || n.find("fa3_wgmma_fwd") != std::string::npos) {
    g_vfwd = **reinterpret_cast<VarlenParams<AttnFwdParams>**>(params);
    if (n.find("fa3_wgmma_fwd") != std::string::npos) g_maps = *static_cast<AttnTensorMaps*>(params[1]);
    const long long total_q = g_vfwd.cu_seqlens_q[g_vfwd.batch];  // read where the kernel reads it
    std::memcpy(g_vfwd.o, g_vfwd.q, sizeof(uint16_t) * total_q * g_vfwd.heads * g_head_dim);
  } else if (n.find("_bwd_dkdv") != std::string::npos) {
    g_vbwd = **reinterpret_cast<VarlenParams<AttnBwdParams>**>(params);
  } else if (n.find("decode_splitkv_partial") != std::string::npos) {
    g_dfwd = **reinterpret_cast<AttnFwdParams**>(params);
  }
  g_packed_launches += packed_form(n);
}

// A packed batch of three sequences (one with no queries), H query heads over Hk kv heads, head dim d.
struct PackedBatch {
  static constexpr int B = 3;
  const int H, Hk, d;
  std::vector<int32_t> cu_q = {0, 5, 5, 16}, cu_k = {0, 7, 10, 21};  // lengths q 5, 0, 11; k 7, 3, 11
  int total_q = 16, total_k = 21, max_q = 11, max_k = 11;
  U16 q, k, v, o, dout, dq, dk, dv;
  std::vector<float> lse;
  PackedBatch(int h, int hk, int dim)
      : H(h), Hk(hk), d(dim), q(16 * h * dim), k(21 * hk * dim), v(21 * hk * dim), o(16 * h * dim),
        dout(16 * h * dim), dq(16 * h * dim), dk(21 * hk * dim), dv(21 * hk * dim), lse(h * 16 + 4) {
    for (int i = 0; i < total_q * H * d; ++i) q.ptr()[i] = (uint16_t)(i * 7 + 3);
  }
  ft_packed_tensor t(U16& x, int heads) { return ft_packed_tensor{x.ptr(), {(int64_t)heads * d, d, 1}}; }
  template <class Args>
  void head(Args& a) {
    a.batch = B, a.heads = H, a.heads_k = Hk, a.head_dim = d, a.dtype = FT_BF16, a.causal = 1;
    a.total_q = total_q, a.total_k = total_k, a.max_seqlen_q = max_q, a.max_seqlen_k = max_k;
    a.cu_seqlens_q = cu_q.data(), a.cu_seqlens_k = cu_k.data();
  }
  ft_varlen_forward_args fwd() {
    ft_varlen_forward_args a{};
    head(a);
    a.q = t(q, H), a.k = t(k, Hk), a.v = t(v, Hk), a.o = t(o, H);
    a.lse = lse.data();
    return a;
  }
  ft_varlen_backward_args bwd() {
    ft_varlen_backward_args a{};
    head(a);
    a.q = t(q, H), a.k = t(k, Hk), a.v = t(v, Hk), a.o = t(o, H), a.dout = t(dout, H), a.lse = lse.data();
    a.dq = t(dq, H), a.dk = t(dk, Hk), a.dv = t(dv, Hk);
    return a;
  }
  // The runtime's problem for the launch geometry: the longest lengths, the totals.
  Problem problem(const char* direction) const {
    Problem p;
    p.batch = B, p.heads = H, p.heads_k = Hk, p.seq_q = max_q, p.seq_k = max_k, p.head_dim = d;
    p.dtype = DType::bf16, p.causal = true, p.direction = direction;
    p.varlen.lengths = "list", p.varlen.seq_lens_q = {5, 0, 11}, p.varlen.seq_lens_k = {7, 3, 11};
    return p;
  }
};

void expect_launches(const FakeState& st, const Family& f, const Config& c, Problem p) {
  p.sm_count = 1;  // the fake's multiprocessor count (every attribute but the compute capability is 1)
  const std::vector<Launch> want = f.launches(c, p);
  ASSERT_EQ(st.launches.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string k = f.kernels[i].substr(f.kernels[i].rfind(':') + 1);
    EXPECT_NE(st.launches[i].name.find(k), std::string::npos) << st.launches[i].name << " vs " << k;
    EXPECT_EQ(std::vector<unsigned>(st.launches[i].grid, st.launches[i].grid + 3),
              std::vector<unsigned>(want[i].grid, want[i].grid + 3)) << st.launches[i].name;
    EXPECT_EQ(st.launches[i].threads, want[i].threads) << st.launches[i].name;
    EXPECT_EQ(st.launches[i].smem, want[i].smem_bytes) << st.launches[i].name;
    EXPECT_EQ(st.launches[i].cluster, want[i].cluster_x) << st.launches[i].name;
  }
}
}  // namespace

// A packed batch through ft_attention_varlen_forward/_backward on the untabled sm_80 fake (bf16, 4 query
// heads over 2 kv heads, d 64; sequences of 5, 0 and 11 queries): fa2_mma's and fa2_mma_bwd's packed forms
// (the kernels' VARLEN argument true), the descriptor's grids from the longest lengths, the offsets and
// sizes in the parameters; q taken from a packed qkv projection (tokens (H + 2 Hk) d apart) is packed to
// token-major scratch and o written head-major is unpacked (the hook's o = q must come back in o's layout);
// the backward's scratch (delta and dq_accum per token) sized by ft_varlen_backward_workspace_bytes.
TEST(FakeDriver, PackedBatches) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  if (embeds_sm80()) GTEST_SKIP() << "the library embeds sm_80 kernels (FLASHTUNE_AOT_ARCHS)";
  const std::string cache = make_private_tmpdir("ft-fake-varlen");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  FakeState& st = fake();
  st.hook = play_packed;
  g_head_dim = 64;
  PackedBatch pb(4, 2, 64);
  const int H = pb.H, Hk = pb.Hk, d = pb.d, Tq = pb.total_q;
  ft_varlen_forward_args a = pb.fwd();
  ft_explanation e;
  ASSERT_EQ(ft_explain_varlen_forward(&a, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.family, "fa2_mma");
  EXPECT_STREQ(e.source, "default");
  const Family& f = find_family("fa2_mma");
  st.launches.clear(), st.allocated.clear();
  g_packed_launches = 0;
  ASSERT_EQ(ft_attention_varlen_forward(&a, nullptr), FT_OK) << ft_last_error();
  expect_launches(st, f, f.parse_config(e.config), pb.problem("fwd"));
  EXPECT_EQ(g_packed_launches, 1) << st.launches[0].name;
  EXPECT_EQ(g_vfwd.cu_seqlens_q, pb.cu_q.data());
  EXPECT_EQ(g_vfwd.cu_seqlens_k, pb.cu_k.data());
  EXPECT_EQ(g_vfwd.batch, 3);
  EXPECT_EQ(g_vfwd.seq_q, pb.max_q);
  EXPECT_EQ(g_vfwd.seq_k, pb.max_k);
  EXPECT_EQ(g_vfwd.heads_k, Hk);
  EXPECT_EQ(g_vfwd.lse, pb.lse.data());
  EXPECT_EQ(g_vfwd.q, pb.q.ptr());  // contiguous and aligned: straight in
  EXPECT_TRUE(st.allocated.empty());
  EXPECT_EQ(std::memcmp(pb.o.ptr(), pb.q.ptr(), 2ull * Tq * H * d), 0);

  // No lse: scratch of (H, total_q) fp32. q out of a packed qkv projection, o head-major: packed, unpacked.
  U16 qkv((size_t)Tq * (H + 2 * Hk) * d), o_hm((size_t)Tq * H * d);
  for (int t = 0; t < Tq; ++t)
    for (int i = 0; i < H * d; ++i) qkv.ptr()[(size_t)t * (H + 2 * Hk) * d + i] = (uint16_t)(t * 1000 + i);
  a.lse = nullptr;
  a.q = ft_packed_tensor{qkv.ptr(), {(int64_t)(H + 2 * Hk) * d, d, 1}};
  a.o = ft_packed_tensor{o_hm.ptr(), {d, (int64_t)Tq * d, 1}};  // [H, total_q, d] memory
  st.launches.clear(), st.allocated.clear();
  ASSERT_EQ(ft_attention_varlen_forward(&a, nullptr), FT_OK) << ft_last_error();
  ASSERT_EQ(st.launches.size(), 3u);
  EXPECT_EQ(st.launches[0].name, "ft_strided_copy_2");
  EXPECT_EQ(st.launches[2].name, "ft_strided_copy_2");
  ASSERT_EQ(st.allocated.size(), 1u);
  EXPECT_GE(st.allocated[0], 2ull * Tq * H * d * 2 + 4ull * H * Tq);  // q and o packed, the LSE
  for (int t = 0; t < Tq; ++t)
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < d; ++c)
        ASSERT_EQ(o_hm.ptr()[((size_t)h * Tq + t) * d + c], qkv.ptr()[(size_t)t * (H + 2 * Hk) * d + h * d + c])
            << "token " << t << " head " << h << " column " << c;
  EXPECT_EQ(st.live_allocations, 0);

  // Backward: fa2_mma_bwd's packed form, per-token scratch.
  ft_varlen_backward_args b = pb.bwd();
  ASSERT_EQ(ft_explain_varlen_backward(&b, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.family, "fa2_mma_bwd");
  size_t ws = 0;
  ASSERT_EQ(ft_varlen_backward_workspace_bytes(&b, &ws), FT_OK) << ft_last_error();
  EXPECT_GE(ws, 4ull * H * Tq + 4ull * Tq * H * d);  // delta (H, total_q) and dq_accum (total_q, H, d)
  st.launches.clear(), st.allocated.clear();
  g_packed_launches = 0;
  ASSERT_EQ(ft_attention_varlen_backward(&b, nullptr), FT_OK) << ft_last_error();
  const Family& fb = find_family("fa2_mma_bwd");
  expect_launches(st, fb, fb.parse_config(e.config), pb.problem("bwd"));
  EXPECT_EQ(g_packed_launches, 3);
  ASSERT_EQ(st.allocated.size(), 1u);
  EXPECT_EQ(st.allocated[0], ws);
  EXPECT_EQ(g_vbwd.cu_seqlens_q, pb.cu_q.data());
  EXPECT_EQ(g_vbwd.cu_seqlens_k, pb.cu_k.data());
  EXPECT_EQ(g_vbwd.heads_k, Hk);
  EXPECT_EQ(g_vbwd.seq_q, pb.max_q);
  EXPECT_EQ(g_vbwd.lse, pb.lse.data());
  // A caller's workspace one byte short: refused, naming the function that sizes it.
  std::vector<char> mem(ws + 256);
  b.workspace = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(mem.data()) + 255) / 256 * 256);
  b.workspace_bytes = ws - 1;
  EXPECT_EQ(ft_attention_varlen_backward(&b, nullptr), FT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ft_last_error()).find("ft_varlen_backward_workspace_bytes"), std::string::npos)
      << ft_last_error();
  b.workspace_bytes = ws;
  st.allocated.clear();
  EXPECT_EQ(ft_attention_varlen_backward(&b, nullptr), FT_OK) << ft_last_error();
  EXPECT_TRUE(st.allocated.empty());
  EXPECT_GE((const char*)g_vbwd.dq_accum, (const char*)b.workspace);
  EXPECT_LE((const char*)(g_vbwd.dq_accum + (size_t)Tq * H * d), (const char*)b.workspace + ws);
  EXPECT_EQ(st.live_allocations, 0);
  EXPECT_EQ(st.pushes, st.pops);
  // A caller's allocator: the packed forward's (q, o packed, the LSE) and backward's (ws) scratch from it.
  {
    CallerScratch mine;
    CallerScratch::Installed installed(mine);
    b.workspace = nullptr, b.workspace_bytes = 0;
    st.allocated.clear();
    ASSERT_EQ(ft_attention_varlen_forward(&a, kStream), FT_OK) << ft_last_error();
    ASSERT_EQ(ft_attention_varlen_backward(&b, kStream), FT_OK) << ft_last_error();
    ASSERT_EQ(mine.allocs.size(), 2u);
    EXPECT_GE(mine.allocs[0], 2ull * Tq * H * d * 2 + 4ull * H * Tq);
    EXPECT_EQ(mine.allocs[1], ws);
    EXPECT_EQ(mine.stream, kStream);
    EXPECT_EQ(mine.live, 0);
    EXPECT_TRUE(st.allocated.empty());
  }
  st.hook = nullptr;
  g_head_dim = D;
  fs::remove_all(cache);
}

// ---- paged K/V caches ----------------------------------------------------------------------------------
namespace {
PagedParams<AttnFwdParams> g_pfwd;
int g_paged_partials = 0, g_paged_combines = 0;
// Records the paged partial kernel's parameters and plays it as o = q (so that a packed q and an unpacked o
// show); counts the launches of each kernel in its paged form; the strided copies as the other hooks do.
void play_paged(const char* name, void** params) {
  const std::string n = name;
  if (n.rfind("ft_strided_copy_", 0) == 0) return play(name, params);
  if (n.find("decode_splitkv_partial") != std::string::npos) {
    g_pfwd = **reinterpret_cast<PagedParams<AttnFwdParams>**>(params);
    g_paged_partials += packed_form(n);
    std::memcpy(g_pfwd.o, g_pfwd.q, sizeof(uint16_t) * g_pfwd.batch * g_pfwd.heads * g_pfwd.seq_q * g_head_dim);
  } else if (n.find("decode_splitkv_combine") != std::string::npos) {
    g_paged_combines += packed_form(n);
  }
}
}  // namespace

// A paged K/V cache through ft_attention_paged_forward on the untabled sm_80 fake (bf16, 8 query heads over 2
// kv heads, d 64; three sequences, pools of 64-key pages): decode_splitkv's paged form (partial and combine,
// the kernels' PAGED argument true) with its default, the descriptor's grids, PagedParams carrying the
// block table, cache lengths, page size and row stride, the pools straight in, Sq from the capacity when
// max_seqlen_k is 0, the split workspace in the stream scratch; a q out of a packed qkv projection packed and a
// transposed o unpacked; pages of 32 keys run the default's nearest config (BLOCK_N 32), said in explain;
// one query row with the mask runs the non-causal kernel.
TEST(FakeDriver, PagedCache) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  if (embeds_sm80()) GTEST_SKIP() << "the library embeds sm_80 kernels (FLASHTUNE_AOT_ARCHS)";
  const std::string cache = make_private_tmpdir("ft-fake-paged");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  FakeState& st = fake();
  st.hook = play_paged;
  constexpr int Bp = 3, Hq = 8, Hk = 2, d = 64, page = 64, num_pages = 11, max_pages = 5;
  g_head_dim = d;
  U16 q(Bp * Hq * d), o(Bp * Hq * d), kp((size_t)num_pages * Hk * page * d), vp((size_t)num_pages * Hk * page * d);
  for (int i = 0; i < Bp * Hq * d; ++i) q.ptr()[i] = (uint16_t)(i * 5 + 1);
  alignas(16) int32_t table[Bp * max_pages] = {7, 2, 9, -1, -1, 0, 10, 4, 1, 3, 5, -1, -1, -1, -1};
  alignas(16) int32_t lens[Bp] = {150, 300, 70};
  std::vector<float> lse(Bp * Hq);
  auto t = [](void* p, int h, int s) { return ft_tensor{p, {(int64_t)h * s * d, (int64_t)s * d, d, 1}}; };
  ft_paged_forward_args a{};
  a.batch = Bp, a.heads = Hq, a.heads_k = Hk, a.seq_q = 1, a.head_dim = d, a.dtype = FT_BF16, a.causal = 1;
  a.num_pages = num_pages, a.page_size = page, a.max_pages = max_pages;
  a.block_table = table, a.cache_seqlens = lens;
  a.q = t(q.ptr(), Hq, 1), a.o = t(o.ptr(), Hq, 1), a.lse = lse.data();
  a.k_pages = t(kp.ptr(), Hk, page), a.v_pages = t(vp.ptr(), Hk, page);
  ft_explanation e;
  ASSERT_EQ(ft_explain_paged_forward(&a, &e), FT_OK) << ft_last_error();
  const Family& dec = find_family("decode_splitkv");
  EXPECT_STREQ(e.family, "decode_splitkv");
  EXPECT_STREQ(e.source, "default");
  EXPECT_EQ(std::string(e.config), dec.config_string(dec.default_config));
  EXPECT_STREQ(e.cache, "jit");
  st.launches.clear(), st.allocated.clear();
  g_paged_partials = g_paged_combines = 0;
  ASSERT_EQ(ft_attention_paged_forward(&a, nullptr), FT_OK) << ft_last_error();
  Problem p;
  p.batch = Bp, p.heads = Hq, p.heads_k = Hk, p.seq_q = 1, p.seq_k = max_pages * page, p.head_dim = d;
  p.dtype = DType::bf16, p.paged.page_size = page;
  expect_launches(st, dec, dec.default_config, p);
  EXPECT_EQ(g_paged_partials, 1) << st.launches[0].name;  // the paged form, not the dense kernel
  EXPECT_EQ(g_paged_combines, 1) << "SPLITS 16: the combine, in its paged form";
  EXPECT_EQ(g_pfwd.block_table, table);
  EXPECT_EQ(g_pfwd.cache_seqlens, lens);
  EXPECT_EQ(g_pfwd.page_size, page);
  EXPECT_EQ(g_pfwd.max_pages, max_pages);
  EXPECT_EQ(g_pfwd.k, kp.ptr());  // the pools are read in place
  EXPECT_EQ(g_pfwd.v, vp.ptr());
  EXPECT_EQ(g_pfwd.q, q.ptr());
  EXPECT_EQ(g_pfwd.lse, lse.data());
  EXPECT_EQ(g_pfwd.batch, Bp);
  EXPECT_EQ(g_pfwd.heads_k, Hk);
  EXPECT_EQ(g_pfwd.seq_q, 1);
  EXPECT_EQ(g_pfwd.seq_k, max_pages * page) << "max_seqlen_k 0: the capacity";
  EXPECT_FLOAT_EQ(g_pfwd.scale, 0.125f);
  const size_t split_bytes = dec.workspace_bytes(dec.default_config, p);
  ASSERT_GT(split_bytes, 0u);
  ASSERT_EQ(st.allocated.size(), 1u);  // the splits' O and LSE only: lse was given, q and o go straight in
  EXPECT_GE(st.allocated[0], split_bytes);
  ASSERT_NE(g_pfwd.workspace, nullptr);
  EXPECT_EQ(std::memcmp(o.ptr(), q.ptr(), 2ull * Bp * Hq * d), 0);
  EXPECT_EQ(st.live_allocations, 0);
  EXPECT_EQ(st.pushes, st.pops);
  // A caller's allocator: the split workspace from it, the same bytes.
  {
    CallerScratch mine;
    CallerScratch::Installed installed(mine);
    const size_t pool_bytes = st.allocated[0];
    st.allocated.clear();
    ASSERT_EQ(ft_attention_paged_forward(&a, kStream), FT_OK) << ft_last_error();
    EXPECT_EQ(mine.allocs, std::vector<size_t>{pool_bytes});
    EXPECT_EQ(mine.live, 0);
    EXPECT_TRUE(st.allocated.empty());
    EXPECT_EQ(std::memcmp(o.ptr(), q.ptr(), 2ull * Bp * Hq * d), 0);
  }
  // Non-causal at Sq 1: the same kernel (from memory), max_seqlen_k passed through.
  a.causal = 0, a.max_seqlen_k = 300;
  char line[512];
  ASSERT_EQ(ft_explain_paged_forward_text(&a, line, sizeof line), FT_OK) << ft_last_error();
  EXPECT_NE(std::string(line).find("(config: default, kernel: memory)"), std::string::npos) << line;
  st.launches.clear();
  ASSERT_EQ(ft_attention_paged_forward(&a, nullptr), FT_OK) << ft_last_error();
  EXPECT_EQ(g_pfwd.seq_k, 300);

  // q a row of a packed qkv projection ([B, 1, (Hq + 2 Hk) d] memory), o transposed ([B, 1, Hq, d] as [B, Hq, 1, d]
  // is contiguous, so o with heads 2d apart): packed and unpacked around the launches.
  U16 qkv((size_t)Bp * (Hq + 2 * Hk) * d), o_wide((size_t)Bp * Hq * 2 * d);
  for (int b = 0; b < Bp; ++b)
    for (int i = 0; i < Hq * d; ++i) qkv.ptr()[(size_t)b * (Hq + 2 * Hk) * d + i] = (uint16_t)(b * 3000 + i);
  a.q = ft_tensor{qkv.ptr(), {(int64_t)(Hq + 2 * Hk) * d, d, 0, 1}};
  a.o = ft_tensor{o_wide.ptr(), {(int64_t)Hq * 2 * d, 2 * d, 0, 1}};
  st.launches.clear(), st.allocated.clear();
  ASSERT_EQ(ft_attention_paged_forward(&a, nullptr), FT_OK) << ft_last_error();
  ASSERT_EQ(st.launches.size(), 4u);  // copy in, partial, combine, copy out
  EXPECT_EQ(st.launches[0].name, "ft_strided_copy_2");
  EXPECT_EQ(st.launches[3].name, "ft_strided_copy_2");
  for (int b = 0; b < Bp; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int c = 0; c < d; ++c)
        ASSERT_EQ(o_wide.ptr()[((size_t)b * Hq + h) * 2 * d + c], qkv.ptr()[(size_t)b * (Hq + 2 * Hk) * d + h * d + c])
            << "sequence " << b << " head " << h << " column " << c;
  EXPECT_EQ(st.live_allocations, 0);

  // Pages of 32 keys: the default's BLOCK_N 64 cannot read them; its nearest config (BLOCK_N 32, WARPS 2) runs.
  U16 kp32((size_t)num_pages * Hk * 32 * d);
  a.q = t(q.ptr(), Hq, 1), a.o = t(o.ptr(), Hq, 1);
  a.page_size = 32, a.max_seqlen_k = 0, a.k_pages = a.v_pages = t(kp32.ptr(), Hk, 32);
  ASSERT_EQ(ft_explain_paged_forward_text(&a, line, sizeof line), FT_OK) << ft_last_error();
  const Config c32 = rt::nearest_paged_config(dec, dec.default_config, d, 32);
  EXPECT_NE(std::string(line).find("decode_splitkv " + dec.config_string(c32) + " (config: default"), std::string::npos)
      << line;
  EXPECT_NE(std::string(line).find("the default's nearest config that reads pages of 32 keys used"), std::string::npos)
      << line;
  st.launches.clear();
  g_paged_partials = 0;
  ASSERT_EQ(ft_attention_paged_forward(&a, nullptr), FT_OK) << ft_last_error();
  p.seq_k = max_pages * 32, p.paged.page_size = 32;
  expect_launches(st, dec, c32, p);
  EXPECT_EQ(g_paged_partials, 1);
  EXPECT_EQ(g_pfwd.page_size, 32);
  EXPECT_EQ(st.live_allocations, 0);
  EXPECT_EQ(st.pushes, st.pops);
  st.hook = nullptr;
  g_head_dim = D;
  fs::remove_all(cache);
}

// On a fake H100 (compute capability 9.0, the committed H100 table's device name), in a child process:
// decoding (Sq 1, causal or not: one row sees every key) runs the table's decode_splitkv entry, its partial
// and combine kernels with the descriptor's grids and its split workspace, while Sq 17 does not; from a paged
// cache of 256-key pages the table's paged entry in the paged form, of 64-key pages the default; a packed
// forward runs fa3_wgmma's packed form (the table rates it first for bf16 d 128) with token-major tensor
// maps over the totals; a packed backward runs fa2_wgmma_bwd's packed form with its default, since the
// table's LOAD 1 config is refused for the packed form (said in the explain line).
TEST(FakeDriver, HopperDecodeAndPacked) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  EXPECT_EQ(spawn_child("hopper-decode-varlen", "DISABLED_HopperDecodeAndPackedChild"), 0);
}

TEST(FakeDriver, DISABLED_HopperDecodeAndPackedChild) {
  ASSERT_STREQ(std::getenv("FT_FAKE_CHILD"), "hopper-decode-varlen") << "run by FakeDriver.HopperDecodeAndPacked";
  FakeState& st = fake();
  st.cc_major = 9, st.cc_minor = 0;
  st.device_name = "NVIDIA H100 80GB HBM3";
  st.hook = play_packed;
  const std::string cache = make_private_tmpdir("ft-fake-h100");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  constexpr int d = 128;
  g_head_dim = d;

  // ---- decoding: Llama-3-like heads, two sequences of one query against 300 keys.
  constexpr int Hq = 32, Hk = 8, Sk = 300, Bd = 2;
  U16 q(Bd * Hq * d), kv(Bd * Hk * Sk * d), o(Bd * Hq * d);
  auto t = [](void* p, int h, int s) { return ft_tensor{p, {(int64_t)h * s * d, (int64_t)s * d, d, 1}}; };
  ft_forward_args a{};
  a.batch = Bd, a.heads = Hq, a.heads_k = Hk, a.seq_q = 1, a.seq_k = Sk, a.head_dim = d, a.dtype = FT_BF16, a.causal = 1;
  a.q = t(q.ptr(), Hq, 1), a.k = a.v = t(kv.ptr(), Hk, Sk), a.o = t(o.ptr(), Hq, 1);
  ft_explanation e;
  ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.family, "decode_splitkv");
  EXPECT_STREQ(e.source, "device");
  EXPECT_STREQ(e.device, "NVIDIA H100 80GB HBM3");
  // $FLASHTUNE_TABLES=off: the H100 as an untabled GPU (the default, said in explain's text); any other value than
  // on or off fails the call in one line; "on" reads the table again.
  {
    ft_explanation off;
    setenv("FLASHTUNE_TABLES", "off", 1);
    ft_reload_settings();
    ASSERT_EQ(ft_explain_forward(&a, &off), FT_OK) << ft_last_error();
    EXPECT_STREQ(off.source, "default");
    EXPECT_NE(explain_fwd(a).find("the committed tables are off (FLASHTUNE_TABLES=off)"), std::string::npos)
        << explain_fwd(a);
    setenv("FLASHTUNE_TABLES", "offf", 1);
    ft_reload_settings();
    EXPECT_EQ(ft_explain_forward(&a, &off), FT_INVALID_ARGUMENT);
    EXPECT_STREQ(ft_last_error(), "FLASHTUNE_TABLES must be on or off, not 'offf'");
    setenv("FLASHTUNE_TABLES", "on", 1);
    ft_reload_settings();
    ASSERT_EQ(ft_explain_forward(&a, &off), FT_OK) << ft_last_error();
    EXPECT_STREQ(off.source, "device");
    EXPECT_EQ(std::string(off.config), e.config);
    unsetenv("FLASHTUNE_TABLES");
    ft_reload_settings();
  }
  a.causal = 0;
  ft_explanation e2;
  ASSERT_EQ(ft_explain_forward(&a, &e2), FT_OK) << ft_last_error();
  EXPECT_EQ(std::string(e2.config), e.config);
  // The decode bucket by (batch x kv heads, Sk): 2 x 8 = 16 takes the tuned 8's (B 1), nearer by ratio than 64;
  // 64 sequences (512) their own tuned pick, one split of the keys (issue 31). explain() names the bucket.
  EXPECT_NE(explain_fwd(a).find("(config: device, bucket: batch x kv heads 8 (of 8, 64, 512), Sk <= 4096, kernel: "),
            std::string::npos) << explain_fwd(a);
  a.batch = 64;  // explain only: nothing is read
  const std::string b64 = explain_fwd(a);
  EXPECT_NE(b64.find("decode_splitkv SPLITS=1,"), std::string::npos) << b64;
  EXPECT_NE(b64.find("bucket: batch x kv heads 512 (of 8, 64, 512), Sk <= 4096"), std::string::npos) << b64;
  a.batch = Bd;
  const Family& dec = find_family("decode_splitkv");
  const Config c = dec.parse_config(e.config);
  Problem p;
  p.batch = Bd, p.heads = Hq, p.heads_k = Hk, p.seq_q = 1, p.seq_k = Sk, p.head_dim = d, p.dtype = DType::bf16;
  st.launches.clear(), st.allocated.clear();
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  expect_launches(st, dec, c, p);
  const size_t split_bytes = dec.workspace_bytes(c, p);
  ASSERT_GT(split_bytes, 0u) << "the table's config splits the keys";
  ASSERT_EQ(st.allocated.size(), 1u);
  EXPECT_GE(st.allocated[0], split_bytes);  // the splits' O and LSE (and the LSE nobody asked for)
  EXPECT_NE(g_dfwd.workspace, nullptr);
  EXPECT_EQ(g_dfwd.heads_k, Hk);
  EXPECT_EQ(st.live_allocations, 0);
  U16 q17(Bd * Hq * 17 * d), o17(Bd * Hq * 17 * d);
  a.seq_q = 17, a.q = t(q17.ptr(), Hq, 17), a.o = t(o17.ptr(), Hq, 17);
  ASSERT_EQ(ft_explain_forward(&a, &e2), FT_OK) << ft_last_error();
  EXPECT_STRNE(e2.family, "decode_splitkv");

  // ---- the same decoding from a paged cache (256-key pages): the table's paged entry, in the paged form; pages
  // of 64 keys, which its BLOCK_N does not divide, the default (noted).
  constexpr int page = 256, pages_per_seq = 2;
  U16 pool((size_t)Bd * pages_per_seq * Hk * page * d);
  alignas(16) int32_t table[Bd * pages_per_seq] = {3, 0, 1, 2};
  alignas(16) int32_t lens[Bd] = {300, 257};
  ft_paged_forward_args pa{};
  pa.batch = Bd, pa.heads = Hq, pa.heads_k = Hk, pa.seq_q = 1, pa.head_dim = d, pa.dtype = FT_BF16;
  pa.num_pages = Bd * pages_per_seq, pa.page_size = page, pa.max_pages = pages_per_seq, pa.max_seqlen_k = 300;
  pa.block_table = table, pa.cache_seqlens = lens;
  pa.q = t(q.ptr(), Hq, 1), pa.o = t(o.ptr(), Hq, 1), pa.k_pages = pa.v_pages = t(pool.ptr(), Hk, page);
  ASSERT_EQ(ft_explain_paged_forward(&pa, &e2), FT_OK) << ft_last_error();
  EXPECT_STREQ(e2.family, "decode_splitkv");
  EXPECT_STREQ(e2.source, "device");
  const Config cp = dec.parse_config(e2.config);
  EXPECT_EQ(dec.paged_check(cp, page), nullptr);
  st.launches.clear(), st.allocated.clear();
  g_dfwd = AttnFwdParams{};
  const int packed_before = g_packed_launches;
  ASSERT_EQ(ft_attention_paged_forward(&pa, nullptr), FT_OK) << ft_last_error();
  Problem pp = p;
  pp.paged.page_size = page;
  expect_launches(st, dec, cp, pp);
  EXPECT_EQ(g_packed_launches - packed_before, (int)st.launches.size()) << "every kernel in its paged form";
  EXPECT_EQ(g_dfwd.k, pool.ptr());
  EXPECT_EQ(st.live_allocations, 0);
  pa.page_size = 64, pa.max_pages = 5, pa.num_pages *= 4, pa.k_pages = pa.v_pages = t(pool.ptr(), Hk, 64);
  char pline[512];
  ASSERT_EQ(ft_explain_paged_forward_text(&pa, pline, sizeof pline), FT_OK) << ft_last_error();
  EXPECT_NE(std::string(pline).find("decode_splitkv " + dec.config_string(dec.default_config) + " (config: default"),
            std::string::npos) << pline;
  EXPECT_NE(std::string(pline).find("rejected for pages of 64 keys"), std::string::npos) << pline;

  // ---- a packed forward: fa3_wgmma's packed form, tensor maps over the totals.
  PackedBatch pb(4, 2, d);
  ft_varlen_forward_args v = pb.fwd();
  ASSERT_EQ(ft_explain_varlen_forward(&v, &e), FT_OK) << ft_last_error();
  ASSERT_STREQ(e.family, "fa3_wgmma") << "the H100 table rates fa3_wgmma first for bf16 d 128 forward";
  const Family& fa3 = find_family("fa3_wgmma");
  const Config c3 = fa3.parse_config(e.config);
  st.launches.clear(), st.allocated.clear();
  g_packed_launches = 0;
  ASSERT_EQ(ft_attention_varlen_forward(&v, nullptr), FT_OK) << ft_last_error();
  expect_launches(st, fa3, c3, pb.problem("fwd"));
  EXPECT_EQ(g_packed_launches, 1);
  EXPECT_EQ(g_vfwd.cu_seqlens_q, pb.cu_q.data());
  EXPECT_EQ(std::memcmp(pb.o.ptr(), pb.q.ptr(), 2ull * pb.total_q * pb.H * d), 0);
  const std::vector<TensorMapSpec> specs = fa3.tensor_maps(c3, pb.problem("fwd"));
  ASSERT_EQ(specs.size(), 4u);
  for (size_t i = 0; i < specs.size(); ++i) {
    const unsigned long long* w = g_maps.map[i].bits;  // record_tensor_map's words: address, dims, strides, box
    const bool queries = specs[i].tensor == "q" || specs[i].tensor == "o";
    const void* base = specs[i].tensor == "q" ? (void*)pb.q.ptr() : specs[i].tensor == "k" ? (void*)pb.k.ptr()
                       : specs[i].tensor == "v" ? (void*)pb.v.ptr() : (void*)pb.o.ptr();
    SCOPED_TRACE(specs[i].tensor);
    EXPECT_EQ(w[0], reinterpret_cast<uintptr_t>(base));
    EXPECT_EQ(w[1], (unsigned long long)d);
    EXPECT_EQ(w[2], (unsigned long long)(queries ? pb.H : pb.Hk));               // heads
    EXPECT_EQ(w[3], (unsigned long long)(queries ? pb.total_q : pb.total_k));  // tokens
    EXPECT_EQ(w[4], 1u);
    EXPECT_EQ(w[6], 2ull * d * (queries ? pb.H : pb.Hk));                   // a token's row, bytes
    EXPECT_EQ(w[9], 1u);                                                      // one head per box
    EXPECT_EQ(w[10], (unsigned long long)specs[i].box_rows);                     // rows of tokens
  }

  // ---- a packed backward: fa2_wgmma_bwd, the table's config (LOAD 1) in its packed form.
  ft_varlen_backward_args b = pb.bwd();
  char line[512];
  ASSERT_EQ(ft_explain_varlen_backward_text(&b, line, sizeof line), FT_OK) << ft_last_error();
  EXPECT_NE(std::string(line).find("fa2_wgmma_bwd"), std::string::npos) << line;
  EXPECT_EQ(std::string(line).find("; "), std::string::npos) << line;  // no note: the tabled config runs
  ASSERT_EQ(ft_explain_varlen_backward(&b, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.source, "device");
  const Family& w = find_family("fa2_wgmma_bwd");
  st.launches.clear();
  g_packed_launches = 0;
  ASSERT_EQ(ft_attention_varlen_backward(&b, nullptr), FT_OK) << ft_last_error();
  expect_launches(st, w, w.parse_config(e.config), pb.problem("bwd"));
  EXPECT_EQ(g_packed_launches, 3);
  EXPECT_EQ(g_vbwd.cu_seqlens_k, pb.cu_k.data());
  EXPECT_EQ(g_vbwd.heads_k, pb.Hk);
  EXPECT_EQ(st.live_allocations, 0);
  st.hook = nullptr;
  fs::remove_all(cache);
}

// fa3_wgmma's MULTICAST from the store ($FLASHTUNE_DB) on the sm_90 fake: launched through cuLaunchKernelEx
// with clusters of two CTAs along x and the query blocks rounded up to whole clusters; a stored causal row
// with MULTICAST (no such variant exists) is rejected with the reason and the default runs.
TEST(FakeDriver, Fa3MulticastLaunchesClusters) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  EXPECT_EQ(spawn_child("multicast", "DISABLED_Fa3MulticastChild"), 0);
}

TEST(FakeDriver, DISABLED_Fa3MulticastChild) {
  ASSERT_STREQ(std::getenv("FT_FAKE_CHILD"), "multicast") << "run by FakeDriver.Fa3MulticastLaunchesClusters";
  FakeState& st = fake();
  st.cc_major = 9, st.cc_minor = 0;
  const std::string cache = make_private_tmpdir("ft-fake-multicast");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  constexpr int Hq = 2, S_q = 333, S_k = 517, d = 128;
  std::vector<uint16_t> q(Hq * S_q * d + 8), kv(Hq * S_k * d + 8), o(Hq * S_q * d + 8);
  std::vector<float> lse(Hq * S_q + 4);
  auto al = [](auto& v) { return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(v.data()) + 15) / 16 * 16); };
  auto t = [](void* p, int h, int s) { return ft_tensor{p, {(int64_t)h * s * d, (int64_t)s * d, d, 1}}; };
  ft_forward_args a{};
  a.batch = 1, a.heads = Hq, a.seq_q = S_q, a.seq_k = S_k, a.head_dim = d, a.dtype = FT_BF16;
  a.q = t(al(q), Hq, S_q), a.k = t(al(kv), Hq, S_k), a.v = t(al(kv), Hq, S_k), a.o = t(al(o), Hq, S_q);
  a.lse = static_cast<float*>(al(lse));
  const Family& f = find_family("fa3_wgmma");
  const Config mc = f.parse_config("BLOCK_N=176,CONSUMERS=2,STAGES=2,OVERLAP=1,PINGPONG=1,MULTICAST=1");
  const std::string db = cache + "/results.db";
  {
    Store s(db);
    for (bool causal : {false, true}) {
      ResultRecord r = fixture::fixture_result(f.config_string(mc), Problem{1, Hq, S_q, S_k, d, DType::bf16, causal},
                                               "ok", 1.0);
      r.family = f.name;
      s.put_result(r, fixture::fixture_device("Fake GPU", "sm_90"));
    }
  }
  setenv("FLASHTUNE_DB", db.c_str(), 1);
  ft_reload_settings();
  ft_explanation e;
  ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK) << ft_last_error();
  ASSERT_STREQ(e.family, "fa3_wgmma");
  EXPECT_STREQ(e.source, "db");
  EXPECT_EQ(std::string(e.config), f.config_string(mc));
  st.launches.clear();
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  ASSERT_EQ(st.launches.size(), 1u);
  EXPECT_EQ(st.launches[0].cluster, 2u);
  EXPECT_EQ(std::vector<unsigned>(st.launches[0].grid, st.launches[0].grid + 3), (std::vector<unsigned>{4, Hq, 1}));
  EXPECT_NE(st.launches[0].name.find("Li1ELi1ELb0E"), std::string::npos) << st.launches[0].name;  // MULTICAST, bf16

  a.causal = 1;
  char line[512];
  ASSERT_EQ(ft_explain_forward_text(&a, line, sizeof line), FT_OK) << ft_last_error();
  EXPECT_NE(std::string(line).find("rejected causal (MULTICAST is non-causal only"), std::string::npos) << line;
  ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK) << ft_last_error();
  EXPECT_STRNE(e.source, "db");  // the committed tables' causal pick (arch), else the default
  const Config causal_pick = f.parse_config(e.config);
  EXPECT_EQ(causal_pick.back(), 0);
  st.launches.clear();
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  Problem p{1, Hq, S_q, S_k, d, DType::bf16, true};
  expect_launches(st, f, causal_pick, p);
  EXPECT_EQ(st.launches.at(0).cluster, 1u);
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  fs::remove_all(cache);
}

// Score modifications (ft_mods, issue 32): a windowed, softcapped forward on sm_90 runs fa3_wgmma's modified
// kernel (AttnModTraits in its name) with ModParams (the plain argument, then AttnMods with the host's softcap
// constants); the same call without them runs the plain kernel; (L, 0) is causal with a left edge.
namespace {
ModParams<AttnFwdParams> g_mod_fwd;
bool g_mod_kernel = false;
void record_mods(const char* name, void** params) {
  const std::string n = name;
  if (n.find("fa3_wgmma_fwd") == std::string::npos) return;
  g_mod_kernel = n.find("AttnModTraits") != std::string::npos;
  if (g_mod_kernel) g_mod_fwd = **reinterpret_cast<ModParams<AttnFwdParams>**>(params);
}
}  // namespace

TEST(FakeDriver, WindowAndSoftcap) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  EXPECT_EQ(spawn_child("mods", "DISABLED_WindowAndSoftcapChild"), 0);
}

TEST(FakeDriver, DISABLED_WindowAndSoftcapChild) {
  ASSERT_STREQ(std::getenv("FT_FAKE_CHILD"), "mods") << "run by FakeDriver.WindowAndSoftcap";
  FakeState& st = fake();
  st.cc_major = 9, st.cc_minor = 0;
  st.hook = record_mods;
  const std::string cache = make_private_tmpdir("ft-fake-mods");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  constexpr int Hq = 2, S_q = 300, S_k = 900, d = 128;
  std::vector<uint16_t> q(Hq * S_q * d + 8), kv(Hq * S_k * d + 8), o(Hq * S_q * d + 8);
  std::vector<float> lse(Hq * S_q + 4);
  auto al = [](auto& v) { return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(v.data()) + 15) / 16 * 16); };
  auto t = [](void* p, int h, int s) { return ft_tensor{p, {(int64_t)h * s * d, (int64_t)s * d, d, 1}}; };
  ft_forward_args a{};
  a.batch = 1, a.heads = Hq, a.seq_q = S_q, a.seq_k = S_k, a.head_dim = d, a.dtype = FT_BF16, a.scale = 0.125f;
  a.q = t(al(q), Hq, S_q), a.k = t(al(kv), Hq, S_k), a.v = t(al(kv), Hq, S_k), a.o = t(al(o), Hq, S_q);
  a.lse = static_cast<float*>(al(lse));
  a.mods = ft_mods{1, 256, 64, 30.0f};
  ft_explanation e;
  ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.family, "fa3_wgmma");  // the sm_90 tables' pick among the forward families with them
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  EXPECT_TRUE(g_mod_kernel);
  const AttnMods want = make_attn_mods(256, 64, 30.0, 0.125f);
  EXPECT_EQ(g_mod_fwd.mods.window_left, 256);
  EXPECT_EQ(g_mod_fwd.mods.window_right, 64);
  EXPECT_EQ(g_mod_fwd.mods.softcap, 30.0f);
  EXPECT_EQ(g_mod_fwd.mods.softcap_scale, want.softcap_scale);
  EXPECT_EQ(g_mod_fwd.mods.softcap_log2, want.softcap_log2);
  EXPECT_EQ(g_mod_fwd.seq_q, S_q);
  EXPECT_EQ(g_mod_fwd.scale, 0.125f);

  a.mods = ft_mods{1, 128, 0, 0};  // (128, 0): causal with a left edge, no softcap
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  EXPECT_TRUE(g_mod_kernel);
  EXPECT_EQ(g_mod_fwd.mods.window_left, 128);
  EXPECT_EQ(g_mod_fwd.mods.window_right, -1);  // the causal kernel's right edge is the diagonal
  EXPECT_EQ(g_mod_fwd.mods.softcap, 0.0f);

  // ALiBi: the slopes' pointer and batch stride reach AttnMods as given, with 1 / scale (1 / c with a softcap) as the
  // bias's unit; a window or softcap beside it is kept.
  std::vector<float> slopes(Hq + 4, 0.5f);
  a.mods = ft_mods{};
  a.mods.alibi_slopes = slopes.data(), a.mods.alibi_batch_stride = Hq;
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  EXPECT_TRUE(g_mod_kernel);
  EXPECT_EQ(g_mod_fwd.mods.alibi_slopes, slopes.data());
  EXPECT_EQ(g_mod_fwd.mods.alibi_batch_stride, Hq);
  EXPECT_EQ(g_mod_fwd.mods.alibi_unit, 8.0f);  // 1 / 0.125
  EXPECT_EQ(g_mod_fwd.mods.window_left, -1);
  a.mods.softcap = 20;
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  EXPECT_EQ(g_mod_fwd.mods.alibi_unit, 1.0f / 20);
  EXPECT_EQ(g_mod_fwd.mods.softcap, 20.0f);

  a.mods = ft_mods{};  // none: the plain kernel
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  EXPECT_FALSE(g_mod_kernel);
  st.hook = nullptr;
  fs::remove_all(cache);
}

// The same on sm_80 (the untabled fake, issue 32 for sm_80): a windowed, softcapped or ALiBi forward runs fa2_mma's
// modified kernel (AttnModTraits in its name) with ModParams as on Hopper, dense and packed (VarlenParams, then
// AttnMods; the slopes [B, H] per sequence); the call without them its plain kernel. A modified backward runs
// fa2_mma_bwd's three modified kernels on ModParams.
namespace {
std::string g_mma_name;
ModParams<AttnFwdParams> g_mma_fwd;
ModParams<VarlenParams<AttnFwdParams>> g_mma_varlen;
std::vector<std::string> g_mma_bwd_names;
ModParams<AttnBwdParams> g_mma_bwd;
void record_mma_mods(const char* name, void** params) {
  const std::string n = name;
  if (n.find("fa2_mma_bwd") != std::string::npos) {
    g_mma_bwd_names.push_back(n);
    if (n.find("AttnModTraits") != std::string::npos && !packed_form(n))
      g_mma_bwd = **reinterpret_cast<ModParams<AttnBwdParams>**>(params);
    return;
  }
  if (n.find("fa2_mma_fwd") == std::string::npos) return;
  g_mma_name = n;
  if (n.find("AttnModTraits") == std::string::npos) return;
  if (packed_form(n)) g_mma_varlen = **reinterpret_cast<ModParams<VarlenParams<AttnFwdParams>>**>(params);
  else g_mma_fwd = **reinterpret_cast<ModParams<AttnFwdParams>**>(params);
}
}  // namespace

TEST(FakeDriver, ModsOnSm80RunFa2Mma) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  if (embeds_sm80()) GTEST_SKIP() << "the library embeds sm_80 kernels (FLASHTUNE_AOT_ARCHS)";
  const std::string cache = make_private_tmpdir("ft-fake-mods80");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  FakeState& st = fake();
  ASSERT_EQ(st.cc_major, 8);
  st.hook = record_mma_mods;
  constexpr int Hq = 2, S_q = 300, S_k = 900, d = 128;
  U16 q(Hq * S_q * d), kv(Hq * S_k * d), o(Hq * S_q * d);
  std::vector<float> lse(Hq * S_q + 4);
  auto t = [](void* p, int h, int s) { return ft_tensor{p, {(int64_t)h * s * d, (int64_t)s * d, d, 1}}; };
  ft_forward_args a{};
  a.batch = 1, a.heads = Hq, a.seq_q = S_q, a.seq_k = S_k, a.head_dim = d, a.dtype = FT_BF16, a.scale = 0.125f;
  a.q = t(q.ptr(), Hq, S_q), a.k = t(kv.ptr(), Hq, S_k), a.v = t(kv.ptr(), Hq, S_k), a.o = t(o.ptr(), Hq, S_q);
  a.lse = lse.data();
  a.mods = ft_mods{1, 256, 64, 30.0f};
  ft_explanation e;
  ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.family, "fa2_mma");  // sm_80's one forward family with them
  const Family& f = find_family("fa2_mma");
  st.launches.clear();
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  Problem p{1, Hq, S_q, S_k, d, DType::bf16, false};
  expect_launches(st, f, f.parse_config(e.config), p);  // the plain kernel's grid, block and shared memory
  EXPECT_NE(g_mma_name.find("AttnModTraits"), std::string::npos) << g_mma_name;
  const AttnMods want = make_attn_mods(256, 64, 30.0, 0.125f);
  EXPECT_EQ(g_mma_fwd.mods.window_left, 256);
  EXPECT_EQ(g_mma_fwd.mods.window_right, 64);
  EXPECT_EQ(g_mma_fwd.mods.softcap, 30.0f);
  EXPECT_EQ(g_mma_fwd.mods.softcap_scale, want.softcap_scale);
  EXPECT_EQ(g_mma_fwd.mods.softcap_log2, want.softcap_log2);
  EXPECT_EQ(g_mma_fwd.seq_q, S_q);
  EXPECT_EQ(g_mma_fwd.scale, 0.125f);

  std::vector<float> slopes(Hq + 4, 0.5f);  // ALiBi alone: the slopes as given, 1 / scale its unit
  a.mods = ft_mods{};
  a.mods.alibi_slopes = slopes.data();
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  EXPECT_NE(g_mma_name.find("AttnModTraits"), std::string::npos) << g_mma_name;
  EXPECT_EQ(g_mma_fwd.mods.alibi_slopes, slopes.data());
  EXPECT_EQ(g_mma_fwd.mods.alibi_batch_stride, 0);
  EXPECT_EQ(g_mma_fwd.mods.alibi_unit, 8.0f);  // 1 / 0.125
  EXPECT_EQ(g_mma_fwd.mods.window_left, -1);

  a.mods = ft_mods{};  // none: the plain kernel
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  EXPECT_EQ(g_mma_name.find("AttnModTraits"), std::string::npos) << g_mma_name;

  // Packed, grouped-query: the packed form of the modified kernel, its offsets and then the window and slopes.
  PackedBatch pb(4, 2, 64);
  ft_varlen_forward_args va = pb.fwd();
  std::vector<float> batch_slopes(PackedBatch::B * pb.H, 0.25f);
  va.mods = ft_mods{1, 3, -1, 0};
  va.mods.alibi_slopes = batch_slopes.data(), va.mods.alibi_batch_stride = pb.H;
  ASSERT_EQ(ft_explain_varlen_forward(&va, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.family, "fa2_mma");
  ASSERT_EQ(ft_attention_varlen_forward(&va, nullptr), FT_OK) << ft_last_error();
  EXPECT_TRUE(packed_form(g_mma_name)) << g_mma_name;
  EXPECT_NE(g_mma_name.find("AttnModTraits"), std::string::npos) << g_mma_name;
  EXPECT_EQ(g_mma_varlen.cu_seqlens_q, pb.cu_q.data());
  EXPECT_EQ(g_mma_varlen.heads_k, 2);
  EXPECT_EQ(g_mma_varlen.mods.window_left, 3);
  EXPECT_EQ(g_mma_varlen.mods.alibi_slopes, batch_slopes.data());
  EXPECT_EQ(g_mma_varlen.mods.alibi_batch_stride, pb.H);

  // The backward with a window: fa2_mma_bwd's modified kernels, every one of the three on ModParams.
  ft_backward_args b{};
  b.batch = 1, b.heads = Hq, b.seq_q = S_q, b.seq_k = S_k, b.head_dim = d, b.dtype = FT_BF16, b.scale = 0.125f;
  b.q = a.q, b.k = a.k, b.v = a.v, b.o = a.o, b.dout = a.o, b.lse = lse.data();
  U16 dq(Hq * S_q * d), dk(Hq * S_k * d), dv(Hq * S_k * d);
  b.dq = t(dq.ptr(), Hq, S_q), b.dk = t(dk.ptr(), Hq, S_k), b.dv = t(dv.ptr(), Hq, S_k);
  b.mods = ft_mods{1, 256, 64, 30.0f};
  b.mods.alibi_slopes = slopes.data();
  ASSERT_EQ(ft_explain_backward(&b, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.family, "fa2_mma_bwd");
  g_mma_bwd_names.clear();
  ASSERT_EQ(ft_attention_backward(&b, nullptr), FT_OK) << ft_last_error();
  ASSERT_EQ(g_mma_bwd_names.size(), 3u);
  for (const auto& n : g_mma_bwd_names) EXPECT_NE(n.find("AttnModTraits"), std::string::npos) << n;
  EXPECT_EQ(g_mma_bwd.mods.window_left, 256);
  EXPECT_EQ(g_mma_bwd.mods.window_right, 64);
  EXPECT_EQ(g_mma_bwd.mods.softcap_log2, want.softcap_log2);
  EXPECT_EQ(g_mma_bwd.mods.alibi_slopes, slopes.data());
  EXPECT_EQ(g_mma_bwd.seq_k, S_k);
  st.hook = nullptr;
  fs::remove_all(cache);
}

// A second user (uid and gid 65534, switched to in a forked child: the test needs root, else it is reported
// skipped) plants kernel cache entries, and a -wal beside a store, where the runtime would read them. The
// entries are the real ones of this very call (compiled by a first child in a private folder), so a runtime
// that trusted them would answer "kernel: disk": a control child in a folder of the caller's own does.
// Planted in a shared mode-1777 FLASHTUNE_CACHE_DIR, or in a folder of the second user's: not loaded (the
// child compiles, "kernel: jit", into its XDG_CACHE_HOME fallback), and left as they were. A -wal the second
// user puts beside the caller's FLASHTUNE_DB store: refused in one line, never read. And a store of small
// packed rows whose lengths would take gigabytes: never read by the lookup, in bounded memory (a store with
// too many rows of one query: hostile_inputs.sh, through tests/lookup_probe).
namespace {
constexpr uid_t kSecondUser = 65534;

// fn in a forked child running as the second user; its exit status (77: the switch was refused).
template <class Fn>
int as_second_user(Fn&& fn) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(0, nullptr) != 0 || setgid(kSecondUser) != 0 || setuid(kSecondUser) != 0 || getuid() != kSecondUser)
      _exit(77);
    _exit(fn() ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  return static_cast<bool>(out.write(bytes.data(), (std::streamsize)bytes.size()));
}

std::map<std::string, std::string> folder_state(const std::string& dir) {  // name -> owner and bytes
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    struct stat st {};
    lstat(e.path().c_str(), &st);
    std::ifstream in(e.path(), std::ios::binary);
    out[e.path().filename()] = std::to_string(st.st_uid) + ":" +
                               std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return out;
}
}  // namespace

TEST(FakeDriver, SecondUserPlantsCacheEntriesAndWal) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  if (embeds_sm80()) GTEST_SKIP() << "the library embeds sm_80 kernels (FLASHTUNE_AOT_ARCHS)";
  if (geteuid() != 0) GTEST_SKIP() << "SKIP: needs root to switch to a second user (uid " << kSecondUser << ")";
  if (as_second_user([] { return true; }) == 77) GTEST_SKIP() << "SKIP: setuid(" << kSecondUser << ") refused here";
  const std::string base = make_private_tmpdir("ft-second-user");
  chmod(base.c_str(), 0755);  // the second user reaches the folders below
  const std::string warm = base + "/warm", shared = base + "/shared", foreign = base + "/foreign",
                    own = base + "/own", home = base + "/home";
  for (const auto& d : {warm, shared, foreign, own, home}) fs::create_directory(d);
  for (const auto& d : {warm, own, home}) chmod(d.c_str(), 0700);
  chmod(shared.c_str(), 01777);
  ASSERT_EQ(chown(foreign.c_str(), kSecondUser, kSecondUser), 0);
  setenv("XDG_CACHE_HOME", home.c_str(), 1);
  ft_reload_settings();
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();

  // This call's entries, compiled by a first child into a private folder.
  setenv("FLASHTUNE_CACHE_DIR", warm.c_str(), 1);
  ASSERT_EQ(spawn_child("jit"), 0);
  std::map<std::string, std::string> compiled;
  for (const auto& e : fs::directory_iterator(warm)) {
    std::ifstream in(e.path(), std::ios::binary);
    compiled[e.path().filename()] = std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  ASSERT_FALSE(compiled.empty());
  auto plant = [&](const std::string& dir) {
    for (const auto& [name, bytes] : compiled)
      if (!write_bytes(dir + "/" + name, bytes)) return false;
    return true;
  };

  // Control: the same entries in the caller's own folder are loaded.
  ASSERT_TRUE(plant(own));
  setenv("FLASHTUNE_CACHE_DIR", own.c_str(), 1);
  EXPECT_EQ(spawn_child("disk"), 0) << "the entries of a folder of the caller's own are not loaded";

  for (const std::string& dir : {shared, foreign}) {
    SCOPED_TRACE(dir);
    ASSERT_EQ(as_second_user([&] { return plant(dir); }), 0) << "the second user could not plant in " << dir;
    const auto planted = folder_state(dir);
    fs::remove_all(home + "/flashtune");
    setenv("FLASHTUNE_CACHE_DIR", dir.c_str(), 1);
    EXPECT_EQ(spawn_child("jit"), 0) << "a planted entry was loaded";
    EXPECT_EQ(folder_state(dir), planted) << "the planted folder changed";
    EXPECT_EQ(entries(home + "/flashtune"), entries(warm)) << "the fallback cache did not get the kernels";
  }

  // FLASHTUNE_DB: a -wal the second user puts beside the caller's store in a shared folder.
  FakeState& st = fake();
  st.hook = play;
  setenv("FLASHTUNE_CACHE_DIR", own.c_str(), 1);
  ASSERT_EQ(ft_device_available(), FT_OK) << ft_last_error();
  Buffers buf;
  ft_forward_args a = buf.fwd();
  ft_explanation e;
  const std::string db = shared + "/results.db";
  {
    Store s(db);
    s.put_result(fixture::fixture_result("BLOCK_M=64,BLOCK_N=32,TM=4,TN=4,KV_STAGES=2", Problem{B, H, Sq, Sk, D}, "ok", 1.0),
                 fixture::fixture_device("Fake GPU", "sm_80"));
  }
  ASSERT_EQ(as_second_user([&] { return write_bytes(db + "-wal", std::string(4096, 'w')); }), 0);
  setenv("FLASHTUNE_DB", db.c_str(), 1);
  ft_reload_settings();
  EXPECT_EQ(ft_explain_forward(&a, &e), FT_INVALID_ARGUMENT);
  const std::string why = ft_last_error();
  EXPECT_EQ(why.rfind("FLASHTUNE_DB: ", 0), 0u) << why;
  EXPECT_NE(why.find("-wal file beside it that is not its own"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  EXPECT_EQ(fs::file_size(db + "-wal"), 4096u);

  // FLASHTUNE_DB: 3,000 rows of the largest packed batch (131,070 lengths each, 1.5 GB if all were read).
  const std::string packed = own + "/packed.db";
  {
    Store s(packed);
    const Problem p = problem_from_json(nlohmann::json{
        {"heads", H}, {"head_dim", D}, {"dtype", "fp32"}, {"varlen", {{"lengths", "fixed"}, {"length", 1}, {"total_tokens", 65535}}}});
    s.transaction([&] {
      for (int i = 0; i < 3000; ++i) {
        ResultRecord r = fixture::fixture_result("BLOCK_M=64,BLOCK_N=32,TM=4,TN=4,KV_STAGES=2", p, "ok", 1.0);
        r.kernel_hash += std::to_string(i);
        s.put_result(r, fixture::fixture_device("Fake GPU", "sm_80"));
      }
    });
  }
  // The lookup never reads packed rows (no bucket's pick: the SQL leaves them out), so the call goes on, with the
  // tables' or the default config, in bounded memory.
  setenv("FLASHTUNE_DB", packed.c_str(), 1);
  ft_reload_settings();
  struct rusage before {}, after {};
  getrusage(RUSAGE_SELF, &before);
  EXPECT_EQ(ft_explain_forward(&a, &e), FT_OK) << ft_last_error();
  getrusage(RUSAGE_SELF, &after);
  EXPECT_STRNE(e.source, "db");
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 64l << 10) << "KiB more at the peak";  // 64 MiB
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  unsetenv("XDG_CACHE_HOME");
  ft_reload_settings();
  fs::remove_all(base);
}

// Strided views of q, k, v read in place: fa3_wgmma and fa3_wgmma_bwd read them through their tensor maps
// alone (Family::map_only_inputs), so a [B, S, H, d] tensor seen as [B, H, S, d] (PyTorch's transpose, a
// q of a fused qkv projection) goes to the kernels as it lies, its map carrying the view's strides, with no
// strided copy launched; a view a map cannot describe (a row stride that is no multiple of 16 bytes) is still
// packed into scratch first. On the sm_90 fake with the H100's table (fa3_wgmma and fa3_wgmma_bwd at bf16 d 128).
TEST(FakeDriver, StridedViewsReadInPlace) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  EXPECT_EQ(spawn_child("views", "DISABLED_StridedViewsChild"), 0);
}

namespace {
int g_copies = 0;
void play_views(const char* name, void** params) {
  const std::string n = name;
  if (n.rfind("ft_strided_copy_", 0) == 0) {
    ++g_copies;
    return play(name, params);
  }
  if (n.find("fa3_wgmma_fwd") != std::string::npos || n.find("fa3_wgmma_bwd_dkdv") != std::string::npos)
    g_maps = *static_cast<AttnTensorMaps*>(params[1]);
}
}  // namespace

TEST(FakeDriver, DISABLED_StridedViewsChild) {
  ASSERT_STREQ(std::getenv("FT_FAKE_CHILD"), "views") << "run by FakeDriver.StridedViewsReadInPlace";
  FakeState& st = fake();
  st.cc_major = 9, st.cc_minor = 0;
  st.device_name = "NVIDIA H100 80GB HBM3";
  st.hook = play_views;
  const std::string cache = make_private_tmpdir("ft-fake-views");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  unsetenv("FLASHTUNE_DB");
  ft_reload_settings();
  constexpr int B = 2, H = 4, Sq = 333, Sk = 517, d = 128;
  // q, k, v as [B, S, H, d] memory seen as [B, H, S, d]; o, dout and the gradients contiguous.
  U16 q((size_t)B * Sq * H * d), k((size_t)B * Sk * H * d), v((size_t)B * Sk * H * d), o((size_t)B * H * Sq * d),
      dout((size_t)B * H * Sq * d), dq((size_t)B * H * Sq * d), dk((size_t)B * H * Sk * d), dv((size_t)B * H * Sk * d);
  std::vector<float> lse(B * H * Sq + 4);
  auto bshd = [](void* p, int s, int64_t row) { return ft_tensor{p, {(int64_t)s * row, d, row, 1}}; };
  auto bhsd = [](void* p, int s) { return ft_tensor{p, {(int64_t)H * s * d, (int64_t)s * d, d, 1}}; };
  ft_forward_args a{};
  a.batch = B, a.heads = H, a.seq_q = Sq, a.seq_k = Sk, a.head_dim = d, a.dtype = FT_BF16;
  a.q = bshd(q.ptr(), Sq, H * d), a.k = bshd(k.ptr(), Sk, H * d), a.v = bshd(v.ptr(), Sk, H * d);
  a.o = bhsd(o.ptr(), Sq);
  a.lse = lse.data();
  ft_explanation e;
  ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK) << ft_last_error();
  ASSERT_STREQ(e.family, "fa3_wgmma") << "the H100 table rates fa3_wgmma first for bf16 d 128 forward";
  // The map of a view: its address, (d, seq, heads, batch), byte strides of seq, heads, batch from the view.
  auto expect_view_map = [&](int i, const void* base, int s) {
    const unsigned long long* w = g_maps.map[i].bits;
    SCOPED_TRACE(i);
    EXPECT_EQ(w[0], reinterpret_cast<uintptr_t>(base));
    EXPECT_EQ(w[1], (unsigned long long)d);
    EXPECT_EQ(w[2], (unsigned long long)s);
    EXPECT_EQ(w[3], (unsigned long long)H);
    EXPECT_EQ(w[4], (unsigned long long)B);
    EXPECT_EQ(w[5], 2ull * H * d);      // a token's row
    EXPECT_EQ(w[6], 2ull * d);          // the next head: d elements on
    EXPECT_EQ(w[7], 2ull * s * H * d);  // the next batch
  };
  g_copies = 0;
  st.launches.clear();
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  EXPECT_EQ(g_copies, 0) << "a view a map can read was copied";
  ASSERT_EQ(st.launches.size(), 1u);
  expect_view_map(0, q.ptr(), Sq);
  expect_view_map(1, k.ptr(), Sk);
  expect_view_map(2, v.ptr(), Sk);

  // The backward: q, k, v read in place by the dK/dV kernel's maps; dO (read through the params by the
  // preprocess too) and O contiguous here, so nothing is copied.
  ft_backward_args b{};
  b.batch = B, b.heads = H, b.seq_q = Sq, b.seq_k = Sk, b.head_dim = d, b.dtype = FT_BF16;
  b.q = a.q, b.k = a.k, b.v = a.v, b.o = a.o, b.lse = lse.data(), b.dout = bhsd(dout.ptr(), Sq);
  b.dq = bhsd(dq.ptr(), Sq), b.dk = bhsd(dk.ptr(), Sk), b.dv = bhsd(dv.ptr(), Sk);
  ASSERT_EQ(ft_explain_backward(&b, &e), FT_OK) << ft_last_error();
  ASSERT_STREQ(e.family, "fa3_wgmma_bwd") << "the H100 table rates fa3_wgmma_bwd first for bf16 d 128 backward";
  g_copies = 0;
  ASSERT_EQ(ft_attention_backward(&b, nullptr), FT_OK) << ft_last_error();
  EXPECT_EQ(g_copies, 0);
  expect_view_map(0, q.ptr(), Sq);
  expect_view_map(1, k.ptr(), Sk);
  expect_view_map(2, v.ptr(), Sk);
  // A strided dO is packed (the preprocess reads it through the params): one copy.
  U16 dout_t((size_t)B * Sq * H * d);
  b.dout = bshd(dout_t.ptr(), Sq, H * d);
  g_copies = 0;
  ASSERT_EQ(ft_attention_backward(&b, nullptr), FT_OK) << ft_last_error();
  EXPECT_EQ(g_copies, 1);

  // A row stride of H d + 4 elements (8 bytes past a multiple of 16): no map can read it, so q is packed.
  U16 q_odd((size_t)B * Sq * (H * d + 4));
  a.q = bshd(q_odd.ptr(), Sq, H * d + 4);
  g_copies = 0;
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  EXPECT_EQ(g_copies, 1);
  EXPECT_NE(g_maps.map[0].bits[0], reinterpret_cast<uintptr_t>(q_odd.ptr())) << "the map reads the packed copy";
  EXPECT_EQ(g_maps.map[0].bits[5], 2ull * d);  // contiguous scratch: a row of d
  fs::remove_all(cache);
}

// The plan cache (runtime/src/attention.cpp: each thread's table keyed by a POD of the call, the process's map):
// a cached plan is the plan made anew (ft_reload_settings before each call) for many shapes, called in another
// order, past the thread table's size (collisions), from several threads while another forgets every plan; a
// store re-tuned and $FLASHTUNE_DB changed reach the calls within a second with no reload; a reload, at once.
namespace {
struct PlanShape {
  int batch, heads, heads_k, seq_q, seq_k, head_dim;
  ft_dtype dtype;
  int causal, bwd, deterministic;
};
// Host buffers large enough for every shape below (explain reads no data).
struct PlanBuffers {
  static constexpr size_t kElems = 3u * 4 * 1024 * 128;
  Host q{kElems}, k{kElems}, v{kElems}, o{kElems}, dout{kElems}, dq{kElems}, dk{kElems}, dv{kElems}, lse{3 * 4 * 1024};
};
ft_tensor contiguous(float* p, int h, int s, int d) { return ft_tensor{p, {(int64_t)h * s * d, (int64_t)s * d, d, 1}}; }
// (status, explain's line or the error) of one shape.
std::string explain_shape(PlanBuffers& m, const PlanShape& s) {
  char text[1024] = {};
  ft_status st;
  const int hk = s.heads_k;
  if (!s.bwd) {
    ft_forward_args a{};
    a.batch = s.batch, a.heads = s.heads, a.heads_k = hk, a.seq_q = s.seq_q, a.seq_k = s.seq_k,
    a.head_dim = s.head_dim, a.dtype = s.dtype, a.causal = s.causal;
    a.q = contiguous(m.q.ptr(), s.heads, s.seq_q, s.head_dim), a.o = contiguous(m.o.ptr(), s.heads, s.seq_q, s.head_dim);
    a.k = contiguous(m.k.ptr(), hk, s.seq_k, s.head_dim), a.v = contiguous(m.v.ptr(), hk, s.seq_k, s.head_dim);
    st = ft_explain_forward_text(&a, text, sizeof text);
  } else {
    ft_backward_args a{};
    a.batch = s.batch, a.heads = s.heads, a.heads_k = hk, a.seq_q = s.seq_q, a.seq_k = s.seq_k,
    a.head_dim = s.head_dim, a.dtype = s.dtype, a.causal = s.causal, a.deterministic = s.deterministic;
    a.q = contiguous(m.q.ptr(), s.heads, s.seq_q, s.head_dim), a.o = contiguous(m.o.ptr(), s.heads, s.seq_q, s.head_dim);
    a.dout = contiguous(m.dout.ptr(), s.heads, s.seq_q, s.head_dim);
    a.dq = contiguous(m.dq.ptr(), s.heads, s.seq_q, s.head_dim);
    a.k = contiguous(m.k.ptr(), hk, s.seq_k, s.head_dim), a.v = contiguous(m.v.ptr(), hk, s.seq_k, s.head_dim);
    a.dk = contiguous(m.dk.ptr(), hk, s.seq_k, s.head_dim), a.dv = contiguous(m.dv.ptr(), hk, s.seq_k, s.head_dim);
    a.lse = m.lse.ptr();
    st = ft_explain_backward_text(&a, text, sizeof text);
  }
  return std::to_string((int)st) + ": " + (st == FT_OK ? std::string(text) : std::string(ft_last_error()));
}
// The first `n` configs of fa2_simt's domains its check accepts at head dim d, in domain order.
std::vector<std::string> valid_configs(const Family& f, int d, size_t n) {
  std::vector<std::string> out;
  Config c(f.params.size());
  std::vector<size_t> idx(f.params.size(), 0);
  for (;;) {
    for (size_t i = 0; i < c.size(); ++i) c[i] = f.params[i].domain[idx[i]];
    if (!f.check(c, d)) out.push_back(f.config_string(c));
    if (out.size() == n) return out;
    size_t i = 0;
    while (i < idx.size() && ++idx[i] == f.params[i].domain.size()) idx[i++] = 0;
    if (i == idx.size()) return out;
  }
}
// Calls explain until it names `config` (the settings are looked at again once a second); whether it did in 5 s.
bool names_within(PlanBuffers& m, const PlanShape& s, const std::string& config) {
  for (int i = 0; i < 100; ++i) {
    if (explain_shape(m, s).find(config) != std::string::npos) return true;
    usleep(50 * 1000);
  }
  return false;
}
}  // namespace

TEST(FakeDriver, PlanCache) {
  if (std::getenv("FT_FAKE_CHILD")) GTEST_SKIP();
  const std::string dir = make_private_tmpdir("ft-plan-cache");
  setenv("FLASHTUNE_CACHE_DIR", dir.c_str(), 1);
  fake();  // loaded before the runtime's first driver call
  ASSERT_EQ(ft_device_available(), FT_OK) << ft_last_error();
  // A store whose picks differ by sequence bucket and mask (fa2_simt fp32 d 32 on the fake sm_80), so that a plan
  // cached under a wrong key shows.
  const Family& f = find_family("fa2_simt");
  const std::vector<std::string> cfg = valid_configs(f, 32, 4);
  ASSERT_EQ(cfg.size(), 4u);
  const std::string db = dir + "/results.db", db2 = dir + "/other.db";
  {
    Store s(db);
    const DeviceInfo dev = fixture::fixture_device("Fake GPU", "sm_80");
    s.put_result(fixture::fixture_result(cfg[0], Problem{1, 2, 64, 64, 32, DType::fp32, false}, "ok", 1.0), dev);
    s.put_result(fixture::fixture_result(cfg[1], Problem{1, 2, 256, 256, 32, DType::fp32, false}, "ok", 1.0), dev);
    s.put_result(fixture::fixture_result(cfg[2], Problem{1, 2, 64, 64, 32, DType::fp32, true}, "ok", 1.0), dev);
    Store s2(db2);
    s2.put_result(fixture::fixture_result(cfg[3], Problem{1, 2, 64, 64, 32, DType::fp32, false}, "ok", 1.0), dev);
  }
  setenv("FLASHTUNE_DB", db.c_str(), 1);
  ft_reload_settings();

  std::vector<PlanShape> shapes;
  for (ft_dtype dt : {FT_FP32, FT_BF16})
    for (int d : {32, 128})
      for (int sq : {1, 17, 64, 200})
        for (int sk : {33, 64, 1000})
          for (int causal : {0, 1})
            for (int bwd : {0, 1}) {
              const int heads_k = dt == FT_FP32 ? 4 : (sq + sk) % 2 ? 2 : 4;  // grouped-query only where supported
              shapes.push_back({1 + (sq + sk + d) % 3, 4, heads_k, sq, sk, d, dt, causal, bwd, bwd && (sq % 2)});
            }
  ASSERT_GT(shapes.size(), 2 * 64u);  // past the thread table's 64 slots
  PlanBuffers m;
  std::vector<std::string> fresh;
  for (const PlanShape& s : shapes) {
    ft_reload_settings();  // every plan forgotten: made anew
    fresh.push_back(explain_shape(m, s));
  }
  EXPECT_NE(fresh[0].find("(config: db"), std::string::npos) << fresh[0];
  int answered = 0;
  for (const std::string& x : fresh) answered += x.rfind("0: ", 0) == 0;
  EXPECT_GT(answered, (int)shapes.size() / 2);
  for (int round = 0; round < 3; ++round)  // cached: in order, backwards, strided
    for (size_t j = 0; j < shapes.size(); ++j) {
      const size_t i = round == 0 ? j : round == 1 ? shapes.size() - 1 - j : (j * 7) % shapes.size();
      ASSERT_EQ(explain_shape(m, shapes[i]), fresh[i]) << "shape " << i << ", round " << round;
    }

  // Several threads, each over the shapes in its own order, while this one forgets every plan again and again.
  {
    std::atomic<bool> done{false};
    std::atomic<int> mismatches{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int rep = 0; rep < 2; ++rep)
          for (size_t j = 0; j < shapes.size(); ++j) {
            const size_t i = (j * (2 * t + 1) + t) % shapes.size();
            if (explain_shape(m, shapes[i]) != fresh[i]) ++mismatches;  // explain reads no data
          }
      });
    std::thread reloader([&] {
      while (!done) {
        ft_reload_settings();
        usleep(500);
      }
    });
    for (std::thread& th : threads) th.join();
    done = true;
    reloader.join();
    EXPECT_EQ(mismatches.load(), 0);
  }

  // Invalidation with no reload: $FLASHTUNE_DB naming another store is read within a second; so is the user's store
  // re-tuned (its inode, size and mtime are its identity; $FLASHTUNE_DB's is its path, as before the cache).
  const PlanShape s64{1, 2, 2, 64, 64, 32, FT_FP32, 0, 0, 0};
  ft_reload_settings();
  ASSERT_NE(explain_shape(m, s64).find(cfg[0] + " (config: db"), std::string::npos) << explain_shape(m, s64);
  setenv("FLASHTUNE_DB", db2.c_str(), 1);
  EXPECT_TRUE(names_within(m, s64, cfg[3] + " (config: db")) << explain_shape(m, s64);
  const std::string xdg = dir + "/xdg", user = xdg + "/flashtune/fake-gpu.db";
  fs::create_directories(xdg + "/flashtune");
  chmod((xdg + "/flashtune").c_str(), 0700);
  fs::copy_file(db, user);
  chmod(user.c_str(), 0600);
  const char* saved_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string keep_xdg = saved_xdg ? saved_xdg : "";
  setenv("XDG_CACHE_HOME", xdg.c_str(), 1);
  unsetenv("FLASHTUNE_DB");
  EXPECT_TRUE(names_within(m, s64, cfg[0] + " (config: user")) << explain_shape(m, s64);
  {
    Store s(user);  // re-tuned: a faster row for the S 64 bucket
    s.put_result(fixture::fixture_result(cfg[1], Problem{1, 2, 64, 64, 32, DType::fp32, false}, "ok", 0.5),
                 fixture::fixture_device("Fake GPU", "sm_80"));
  }
  EXPECT_TRUE(names_within(m, s64, cfg[1] + " (config: user")) << explain_shape(m, s64);
  // A reload: at once.
  setenv("FLASHTUNE_DB", db.c_str(), 1);
  ft_reload_settings();
  EXPECT_NE(explain_shape(m, s64).find(cfg[0] + " (config: db"), std::string::npos) << explain_shape(m, s64);
  unsetenv("FLASHTUNE_DB");
  saved_xdg ? (void)setenv("XDG_CACHE_HOME", keep_xdg.c_str(), 1) : (void)unsetenv("XDG_CACHE_HOME");
  ft_reload_settings();
  fs::remove_all(dir);
}
