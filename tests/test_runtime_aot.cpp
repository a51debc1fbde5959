// Ahead-of-time kernels without a GPU. The build generates a small table (tests/CMakeLists.txt: sm_80,
// fa2_simt and fa2_simt_bwd at d = 32, fp32, no mask) with flashtune-aot-gen, compiles it into this
// test and into a runtime library of its own (flashtune_attention_aot_test). Checks: the table holds
// exactly the planned hashes (the variants and the copy kernel), each cubin byte for byte what the
// Compiler (the JIT path's NVRTC) makes, and an absent hash falls through; then, on the fake driver
// (tests/fake_driver/), the library runs forward, a packed forward and backward from the table:
// explain() says "aot", the launches are the table's lowered names, and the disk cache stays empty
// (nothing compiled); a variant outside the table still says "jit".
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "aot.hpp"
#include "core/util.hpp"
#include "fake_driver/load.hpp"
#include "flashtune/attention.h"
#include "strided_copy.hpp"

namespace fs = std::filesystem;
using namespace flashtune;
using namespace flashtune::rt;

namespace {

// The generator's arguments in tests/CMakeLists.txt.
AotPlan test_plan() {
  AotFilter filter;
  filter.families = {"fa2_simt", "fa2_simt_bwd"};
  filter.head_dims = {32};
  filter.dtypes = {DType::fp32};
  filter.causal = {0};
  return aot_variants(generated_tables(), parse_aot_arch("80"), filter);
}

std::string cubin_of(const AotTable& t, const AotKernel& k) {
  return std::string(reinterpret_cast<const char*>(t.blob) + k.offset, k.size);
}

// The names an ELF file holds (section and symbol names: its kernels, globals and sections): every
// NUL-terminated run of at least 6 identifier characters that starts as they do ('.', '_' or '$'), which
// the bytes of machine code practically never are.
std::set<std::string> elf_names(const std::string& elf) {
  std::set<std::string> names;
  std::string cur;
  for (char c : elf) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '$') {
      cur += c;
      continue;
    }
    if (c == 0 && cur.size() >= 6 && (cur[0] == '.' || cur[0] == '_' || cur[0] == '$')) names.insert(cur);
    cur.clear();
  }
  return names;
}

}  // namespace

TEST(AotTable, HoldsThePlannedKernelsByteForByte) {
  const AotTable t = aot_table();  // this test's copy of the generated table
  const AotPlan plan = test_plan();
  ASSERT_EQ(plan.variants.size(), 2u);  // each family's default: sm_80 has no tables
  const Compiler compiler("sm_80");
  std::set<std::string> want = {copy_kernel_hash("sm_80")};
  for (const Variant& v : plan.variants) want.insert(compiler.variant_hash(v));
  std::set<std::string> have;
  for (size_t i = 0; i < t.count; ++i) {
    have.insert(t.kernels[i].hash);
    if (i) EXPECT_LT(std::strcmp(t.kernels[i - 1].hash, t.kernels[i].hash), 0) << "not sorted";
  }
  EXPECT_EQ(have, want);

  for (const Variant& v : plan.variants) {
    const AotKernel* k = aot_find(t, compiler.variant_hash(v));
    ASSERT_NE(k, nullptr) << v.family->name;
    // What the runtime's JIT path would make. NVRTC's cubin for the same source and options is not
    // always the same bytes: ptxas's instruction schedule varies with the process's memory layout (seen:
    // fa2_simt_bwd, 2 of ~30 compiles under two parallel NVRTC test runs, same size, another order;
    // fa2_simt in a clean-clone CI run, one instruction longer in all of 4 compiles; identical with
    // address randomisation off). So the embedded cubin must be one of a few fresh compiles byte for
    // byte, or else the same ELF names (sections, kernels, globals) within 2% of the size: the same
    // variant, scheduled otherwise. Another variant or other options change the names or the size.
    KernelRecord jit = compiler.compile(v);
    ASSERT_EQ(jit.status, "compiled") << jit.reason;
    const std::string embedded = cubin_of(t, *k);
    for (int retry = 0; retry < 3 && embedded != jit.cubin; ++retry) jit = compiler.compile(v);
    if (embedded != jit.cubin) {
      EXPECT_EQ(elf_names(embedded), elf_names(jit.cubin)) << v.family->name << ": the embedded cubin is another kernel";
      EXPECT_NEAR((double)embedded.size(), (double)jit.cubin.size(), 0.02 * (double)jit.cubin.size())
          << v.family->name << ": the embedded cubin's size is not NVRTC's";
    }
    EXPECT_EQ(k->names, jit.lowered_name);
  }
  const AotKernel* copy = aot_find(t, copy_kernel_hash("sm_80"));
  ASSERT_NE(copy, nullptr);
  std::string error;
  EXPECT_EQ(cubin_of(t, *copy), compile_copy_kernel("sm_80", &error)) << error;
  EXPECT_STREQ(copy->names, "ft_strided_copy_2\nft_strided_copy_4");

  // Absent: another arch's hash of the same variant, another head dim, a made-up key.
  const Variant& v = plan.variants[0];
  EXPECT_EQ(aot_find(t, Compiler("sm_90").variant_hash(v)), nullptr);
  EXPECT_EQ(aot_find(t, compiler.variant_hash(Variant{v.family, v.config, 64, v.causal, v.dtype})), nullptr);
  EXPECT_EQ(aot_find(t, std::string(32, '0')), nullptr);
  EXPECT_EQ(aot_find(t, std::string(32, 'f')), nullptr);
}

// ---- the library on the fake driver ----------------------------------------------------------------
namespace {

constexpr int B = 1, H = 2, Sq = 70, Sk = 50;

struct Host {
  std::vector<float> mem;
  explicit Host(size_t n) : mem(n + 4) {}
  float* ptr() { return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(mem.data()) + 15) / 16 * 16); }
};
ft_tensor bhsd(float* p, int s, int d) { return ft_tensor{p, {(int64_t)H * s * d, (int64_t)s * d, d, 1}}; }
ft_tensor bshd(float* p, int s, int d) { return ft_tensor{p, {(int64_t)s * H * d, d, (int64_t)H * d, 1}}; }

int entries(const std::string& dir) {
  int n = 0;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".ftk";
  return n;
}
}  // namespace

TEST(AotRuntime, FakeDriverRunsEmbeddedKernelsWithoutCompiling) {
  const std::string cache = make_private_tmpdir("ft-aot-cache");
  setenv("FLASHTUNE_CACHE_DIR", cache.c_str(), 1);
  unsetenv("FLASHTUNE_DB");
  FakeState& st = fake();
  ASSERT_EQ(ft_device_available(), FT_OK) << ft_last_error();
  const AotTable t = aot_table();
  const Compiler compiler("sm_80");

  const int D = 32;
  Host q(B * H * Sq * D), k(B * H * Sk * D), v(B * H * Sk * D), o(B * H * Sq * D);
  ft_forward_args a{};
  a.batch = B, a.heads = H, a.seq_q = Sq, a.seq_k = Sk, a.head_dim = D, a.dtype = FT_FP32;
  a.q = bhsd(q.ptr(), Sq, D), a.k = bhsd(k.ptr(), Sk, D), a.v = bhsd(v.ptr(), Sk, D), a.o = bhsd(o.ptr(), Sq, D);
  ft_explanation e;
  ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.family, "fa2_simt");
  EXPECT_STREQ(e.source, "default");
  EXPECT_STREQ(e.cache, "aot");
  EXPECT_STREQ(e.arch, "sm_80");

  const Family& f = find_family("fa2_simt");
  const AotKernel* fk = aot_find(t, compiler.variant_hash(Variant{&f, f.default_config, D, false, DType::fp32}));
  ASSERT_NE(fk, nullptr);
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  ASSERT_EQ(st.launches.size(), 1u);
  EXPECT_EQ(st.launches[0].name, fk->names);
  EXPECT_EQ(st.module_loads, 1);
  ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK);
  EXPECT_STREQ(e.cache, "aot");  // still: it never came from NVRTC or the disk

  // Transposed q and o: the strided-copy kernels come from the table too.
  a.q = bshd(q.ptr(), Sq, D), a.o = bshd(o.ptr(), Sq, D);
  st.launches.clear();
  ASSERT_EQ(ft_attention_forward(&a, nullptr), FT_OK) << ft_last_error();
  ASSERT_EQ(st.launches.size(), 3u);
  EXPECT_EQ(st.launches[0].name, "ft_strided_copy_4");

  // Backward: the family's three kernels, from the table.
  Host lse(B * H * Sq), dout(B * H * Sq * D), dq(B * H * Sq * D), dk(B * H * Sk * D), dv(B * H * Sk * D);
  ft_backward_args b{};
  b.batch = B, b.heads = H, b.seq_q = Sq, b.seq_k = Sk, b.head_dim = D, b.dtype = FT_FP32;
  b.q = bhsd(q.ptr(), Sq, D), b.k = bhsd(k.ptr(), Sk, D), b.v = bhsd(v.ptr(), Sk, D), b.o = bhsd(o.ptr(), Sq, D);
  b.dout = bhsd(dout.ptr(), Sq, D), b.lse = lse.ptr();
  b.dq = bhsd(dq.ptr(), Sq, D), b.dk = bhsd(dk.ptr(), Sk, D), b.dv = bhsd(dv.ptr(), Sk, D);
  ASSERT_EQ(ft_explain_backward(&b, &e), FT_OK) << ft_last_error();
  EXPECT_STREQ(e.family, "fa2_simt_bwd");
  EXPECT_STREQ(e.cache, "aot");
  st.launches.clear();
  ASSERT_EQ(ft_attention_backward(&b, nullptr), FT_OK) << ft_last_error();
  const Family& fb = find_family("fa2_simt_bwd");
  const AotKernel* bk = aot_find(t, compiler.variant_hash(Variant{&fb, fb.default_config, D, false, DType::fp32}));
  ASSERT_NE(bk, nullptr);
  ASSERT_EQ(st.launches.size(), fb.kernels.size());
  EXPECT_EQ(split(bk->names, '\n'), (std::vector<std::string>{st.launches[0].name, st.launches[1].name,
                                                               st.launches[2].name}));

  // Nothing went through NVRTC: the JIT path writes every kernel it compiles to the disk cache.
  EXPECT_EQ(entries(cache), 0);

  // A variant outside the table (the mask) falls through to the JIT path.
  a.causal = 1;
  ASSERT_EQ(ft_explain_forward(&a, &e), FT_OK);
  EXPECT_STREQ(e.cache, "jit");
  fs::remove_all(cache);
}
