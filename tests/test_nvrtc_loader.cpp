// NVRTC found at run time (core/nvrtc_api.hpp): the search order over the environment, this binary's folder (the
// NVIDIA wheel's layout beside a wheel's library) and the usual places; environment values that are not absolute
// paths ignored and said so; the one-line error when none loads (what was looked at, what to install); an NVRTC of
// another major passed over; the real library loaded from a CUDA_HOME and from a wheel layout (links to this
// machine's libnvrtc in a temporary folder); the process's own search honouring $FLASHTUNE_NVRTC (in a child).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/nvrtc_api.hpp"
#include "core/util.hpp"
#include "test_in_child.hpp"

namespace fs = std::filesystem;
using namespace flashtune;
using K = NvrtcCandidate::Kind;

namespace {

NvrtcSearchEnv env13() {
  NvrtcSearchEnv e;
  e.major = 13;
  return e;
}

std::vector<std::string> listing(const std::vector<NvrtcCandidate>& cs) {
  std::vector<std::string> out;
  for (const auto& c : cs)
    out.push_back(c.where + " " + (c.kind == K::file ? "file " : c.kind == K::loader ? "loader " : "process ") + c.path);
  return out;
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// The file of this machine's NVRTC (the process's search, as the runtime does it); "" when there is none.
std::string real_nvrtc() {
  try {
    const NvrtcApi& nv = nvrtc();
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(nv.Version), &info) && info.dli_fname) return fs::canonical(info.dli_fname);
  } catch (const NvrtcUnavailable&) {
  }
  return "";
}

// Opens files only (the process and the loader's search skipped: this process has its NVRTC loaded already).
void* files_only(const NvrtcCandidate& c, std::string* why) {
  return c.kind == K::file ? nvrtc_dlopen(c, why) : nullptr;
}

}  // namespace

TEST(NvrtcLoader, SearchOrder) {
  NvrtcSearchEnv e = env13();
  e.cuda_home = "/opt/cuda-home";
  e.cuda_path = "/opt/cuda-path/";
  e.module_dir = "/venv/lib/python3.12/site-packages/flashtune";
  e.hint = "/build/toolkit/lib";
  std::vector<std::string> ignored;
  const std::vector<std::string> want = {
      "process process libnvrtc.so.13",
      "CUDA_HOME file /opt/cuda-home/lib64/libnvrtc.so.13",
      "CUDA_HOME file /opt/cuda-home/lib/libnvrtc.so.13",
      "CUDA_PATH file /opt/cuda-path/lib64/libnvrtc.so.13",
      "CUDA_PATH file /opt/cuda-path/lib/libnvrtc.so.13",
      "nvidia wheel file /venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
      "nvidia wheel file /venv/lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.13",
      "nvidia wheel file /venv/lib/python3.12/nvidia/cu13/lib/libnvrtc.so.13",
      "nvidia wheel file /venv/lib/python3.12/nvidia/cuda_nvrtc/lib/libnvrtc.so.13",
      "loader loader libnvrtc.so.13",
      "/usr/local/cuda file /usr/local/cuda/lib64/libnvrtc.so.13",
      "/usr/local/cuda file /usr/local/cuda/lib/libnvrtc.so.13",
      "build toolkit file /build/toolkit/lib/libnvrtc.so.13"};
  EXPECT_EQ(listing(nvrtc_candidates(e, &ignored)), want);
  EXPECT_TRUE(ignored.empty());

  // The CLI in flashtune/bin/: the wheel's site-packages one folder further up.
  e.module_dir = "/venv/site-packages/flashtune/bin";
  const auto bin = listing(nvrtc_candidates(e));
  EXPECT_NE(std::find(bin.begin(), bin.end(), "nvidia wheel file /venv/site-packages/nvidia/cu13/lib/libnvrtc.so.13"),
            bin.end());

  // Nothing set, a wheel's build (no hint), unknown folder: the process, the loader's search, /usr/local/cuda.
  EXPECT_EQ(listing(nvrtc_candidates(env13())),
            (std::vector<std::string>{"process process libnvrtc.so.13", "loader loader libnvrtc.so.13",
                                      "/usr/local/cuda file /usr/local/cuda/lib64/libnvrtc.so.13",
                                      "/usr/local/cuda file /usr/local/cuda/lib/libnvrtc.so.13"}));
  // CUDA 12's soname; a CUDA_HOME of /usr/local/cuda is tried once, at CUDA_HOME's place.
  NvrtcSearchEnv e12;
  e12.major = 12;
  e12.cuda_home = "/usr/local/cuda";
  EXPECT_EQ(listing(nvrtc_candidates(e12)),
            (std::vector<std::string>{"process process libnvrtc.so.12",
                                      "CUDA_HOME file /usr/local/cuda/lib64/libnvrtc.so.12",
                                      "CUDA_HOME file /usr/local/cuda/lib/libnvrtc.so.12", "loader loader libnvrtc.so.12"}));

  // $FLASHTUNE_NVRTC: that file alone.
  e.flashtune_nvrtc = "/somewhere/libnvrtc.so.13.0";
  EXPECT_EQ(listing(nvrtc_candidates(e)), (std::vector<std::string>{"FLASHTUNE_NVRTC file /somewhere/libnvrtc.so.13.0"}));
}

// Environment values are untrusted: a relative path, control characters or a path past PATH_MAX are not used
// (relative to what? the caller's working folder is not the install), and each is said once.
TEST(NvrtcLoader, UnusableEnvironmentIsIgnoredAndSaid) {
  NvrtcSearchEnv e = env13();
  e.cuda_home = "cuda";
  e.cuda_path = std::string("/opt/cu\nda");
  std::vector<std::string> ignored;
  const auto l = listing(nvrtc_candidates(e, &ignored));
  for (const auto& c : l) EXPECT_FALSE(has(c, "CUDA_HOME") || has(c, "CUDA_PATH")) << c;
  ASSERT_EQ(ignored.size(), 2u);
  EXPECT_EQ(ignored[0], "CUDA_HOME='cuda' is not an absolute path (ignored)");
  EXPECT_EQ(ignored[1], "CUDA_PATH='/opt/cu?da' holds control characters (ignored)");
  e = env13();
  e.cuda_home = "/" + std::string(5000, 'a');
  ignored.clear();
  nvrtc_candidates(e, &ignored);
  ASSERT_EQ(ignored.size(), 1u);
  EXPECT_TRUE(has(ignored[0], "is longer than PATH_MAX (ignored)")) << ignored[0];
  e = env13();
  e.flashtune_nvrtc = "libnvrtc.so.13";  // not a path: nothing is tried
  ignored.clear();
  EXPECT_TRUE(nvrtc_candidates(e, &ignored).empty());
  EXPECT_EQ(ignored, (std::vector<std::string>{"FLASHTUNE_NVRTC='libnvrtc.so.13' is not an absolute path (ignored)"}));
}

// None found: one line saying which NVRTC, where it looked, what was unusable, and what to install.
TEST(NvrtcLoader, OneLineErrorWhenNoneLoads) {
  auto none = [](const NvrtcCandidate&, std::string*) -> void* { return nullptr; };
  NvrtcSearchEnv e = env13();
  e.cuda_path = "relative/cuda";
  e.module_dir = "/venv/site-packages/flashtune";
  std::string msg;
  try {
    load_nvrtc(e, none);
    ADD_FAILURE() << "loaded from nowhere";
  } catch (const NvrtcUnavailable& x) {
    msg = x.what();
  }
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind("cannot load NVRTC 13 (libnvrtc.so.13): not in ", 0), 0u) << msg;
  for (const char* place : {"/venv/site-packages/nvidia/cu13/lib", "/venv/site-packages/nvidia/cuda_nvrtc/lib",
                            "the loader's path", "/usr/local/cuda/lib64", "/usr/local/cuda/lib", "(CUDA_HOME unset)",
                            "CUDA_PATH='relative/cuda' is not an absolute path (ignored)",
                            "install the CUDA 13 toolkit (and set CUDA_HOME) or `pip install nvidia-cuda-nvrtc==13.*`",
                            "or set FLASHTUNE_NVRTC to the library file"})
    EXPECT_TRUE(has(msg, place)) << place << " in: " << msg;
  // CUDA 12: its wheel's name.
  NvrtcSearchEnv e12 = env13();
  e12.major = 12;
  try {
    load_nvrtc(e12, none);
  } catch (const NvrtcUnavailable& x) {
    EXPECT_TRUE(has(x.what(), "`pip install nvidia-cuda-nvrtc-cu12`")) << x.what();
  }
  // $FLASHTUNE_NVRTC naming nothing: said so, and nothing else is tried.
  e.flashtune_nvrtc = "/nowhere/libnvrtc.so.13";
  int opened = 0;
  try {
    load_nvrtc(e, [&](const NvrtcCandidate& c, std::string* why) { ++opened; return nvrtc_dlopen(c, why); });
    ADD_FAILURE();
  } catch (const NvrtcUnavailable& x) {
    EXPECT_EQ(std::string(x.what()), "cannot load NVRTC 13 (libnvrtc.so.13): FLASHTUNE_NVRTC='/nowhere/libnvrtc.so.13' "
                                     "does not exist; unset it to search the usual places");
  }
  EXPECT_EQ(opened, 1);
  // A file that is there but is no shared library: dlopen's reason, then the search goes on.
  const std::string dir = make_private_tmpdir("ft-nvrtc-bad");
  fs::create_directories(dir + "/cuda/lib64");
  { std::ofstream(dir + "/cuda/lib64/libnvrtc.so.13") << "not an ELF file"; }
  NvrtcSearchEnv bad = env13();
  bad.cuda_home = dir + "/cuda";
  try {
    load_nvrtc(bad, files_only);
  } catch (const NvrtcUnavailable& x) {
    EXPECT_TRUE(has(x.what(), "; " + dir + "/cuda/lib64/libnvrtc.so.13: ")) << x.what();
  }
  fs::remove_all(dir);
}

// An NVRTC of another major (a CUDA 12 install first on the path of a CUDA 13 build) is passed over, said in the
// error if nothing else loads; the functions must all resolve.
TEST(NvrtcLoader, OtherMajorOrMissingFunctionIsPassedOver) {
  static int fake_handles[3];
  auto open = [](const NvrtcCandidate& c, std::string*) -> void* {
    if (c.where == "CUDA_HOME" && c.path.find("lib64") != std::string::npos) return &fake_handles[0];
    if (c.where == "CUDA_PATH" && c.path.find("lib64") != std::string::npos) return &fake_handles[1];
    if (c.where == "/usr/local/cuda" && c.path.find("lib64") != std::string::npos) return &fake_handles[2];
    return nullptr;
  };
  auto resolve = [](void* h, NvrtcApi* api) -> std::string {
    if (h == &fake_handles[1]) return "no nvrtcGetCUBIN";
    api->Version = h == &fake_handles[0] ? +[](int* a, int* b) { *a = 12, *b = 4; return NVRTC_SUCCESS; }
                                         : +[](int* a, int* b) { *a = 13, *b = 0; return NVRTC_SUCCESS; };
    return "";
  };
  NvrtcSearchEnv e = env13();
  e.cuda_home = "/c12";
  e.cuda_path = "/broken";
  auto keep = [](void*) {};  // the handles are not dlopen's
  const NvrtcApi api = load_nvrtc(e, open, resolve, keep);
  EXPECT_EQ(api.path, "/usr/local/cuda/lib64/libnvrtc.so.13");
  EXPECT_EQ(api.where, "/usr/local/cuda");
  EXPECT_EQ(api.major, 13);
  auto only_12 = [](const NvrtcCandidate& c, std::string*) -> void* {
    return c.where == "CUDA_HOME" && c.path.find("lib64") != std::string::npos ? &fake_handles[0] : nullptr;
  };
  try {
    load_nvrtc(e, only_12, resolve, keep);
    ADD_FAILURE();
  } catch (const NvrtcUnavailable& x) {
    EXPECT_TRUE(has(x.what(), "; /c12/lib64/libnvrtc.so.13: is NVRTC 12.4, this build needs 13")) << x.what();
  }
}

// The real library, through links in a temporary folder laid out as a CUDA_HOME, as NVIDIA's wheel beside a
// wheel's flashtune/ (and beside its bin/): each is found where the search says, and it compiles.
TEST(NvrtcLoader, RealLibraryFromCudaHomeAndWheelLayout) {
  const std::string real = real_nvrtc();
  if (real.empty()) GTEST_SKIP() << "no NVRTC on this machine";
  const int major = nvrtc_major_needed();
  const std::string so = "libnvrtc.so." + std::to_string(major);
  const std::string dir = make_private_tmpdir("ft-nvrtc-layout");
  fs::create_directories(dir + "/cuda/lib");
  fs::create_symlink(real, dir + "/cuda/lib/" + so);
  fs::create_directories(dir + "/site/flashtune/bin");
  fs::create_directories(dir + "/site/nvidia/cu" + std::to_string(major) + "/lib");
  fs::create_symlink(real, dir + "/site/nvidia/cu" + std::to_string(major) + "/lib/" + so);

  NvrtcSearchEnv e;
  e.major = major;
  e.cuda_home = dir + "/cuda";
  NvrtcApi api = load_nvrtc(e, files_only);
  EXPECT_EQ(api.path, dir + "/cuda/lib/" + so);
  EXPECT_EQ(api.where, "CUDA_HOME");
  EXPECT_EQ(api.major, major);
  nvrtcProgram prog;
  ASSERT_EQ(api.CreateProgram(&prog, "extern \"C\" __global__ void k() {}", "k.cu", 0, nullptr, nullptr), NVRTC_SUCCESS);
  const char* opts[] = {"--gpu-architecture=sm_80"};
  EXPECT_EQ(api.CompileProgram(prog, 1, opts), NVRTC_SUCCESS);
  size_t n = 0;
  EXPECT_EQ(api.GetCUBINSize(prog, &n), NVRTC_SUCCESS);
  EXPECT_GT(n, 0u);
  api.DestroyProgram(&prog);

  for (const char* module : {"/site/flashtune", "/site/flashtune/bin"}) {
    NvrtcSearchEnv w;
    w.major = major;
    w.module_dir = dir + module;
    api = load_nvrtc(w, files_only);
    EXPECT_EQ(api.where, "nvidia wheel") << module;
    EXPECT_EQ(api.path, dir + "/site/nvidia/cu" + std::to_string(major) + "/lib/" + so) << module;
  }
  fs::remove_all(dir);
}

// The process's own search (nvrtc()): $FLASHTUNE_NVRTC is honoured, and the failure is the same line on every call.
// In a child, so that this process's NVRTC (loaded or not) does not decide.
TEST(NvrtcLoader, ProcessHonoursFlashtuneNvrtc) {
  if (std::getenv("FT_NVRTC_CHILD")) GTEST_SKIP();
  EXPECT_EQ(run_test_in_child("NvrtcLoader.DISABLED_Child", "FT_NVRTC_CHILD", "1"), 0);
}

TEST(NvrtcLoader, DISABLED_Child) {
  ASSERT_NE(std::getenv("FT_NVRTC_CHILD"), nullptr) << "run by NvrtcLoader.ProcessHonoursFlashtuneNvrtc";
  setenv("FLASHTUNE_NVRTC", "/nonexistent/libnvrtc.so", 1);
  std::string first, second;
  try {
    nvrtc();
  } catch (const NvrtcUnavailable& e) {
    first = e.what();
  }
  try {
    nvrtc();
  } catch (const NvrtcUnavailable& e) {
    second = e.what();
  }
  EXPECT_TRUE(has(first, "FLASHTUNE_NVRTC='/nonexistent/libnvrtc.so' does not exist")) << first;
  EXPECT_EQ(first, second);
}
