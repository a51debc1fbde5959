#include "core/nvrtc_api.hpp"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "core/util.hpp"

#ifndef FLASHTUNE_NVRTC_MAJOR
#error "FLASHTUNE_NVRTC_MAJOR (the CUDA toolkit's major version) must be defined by the build"
#endif
#ifndef FLASHTUNE_NVRTC_HINT
#define FLASHTUNE_NVRTC_HINT ""
#endif

namespace fs = std::filesystem;

namespace flashtune {

int nvrtc_major_needed() { return FLASHTUNE_NVRTC_MAJOR; }

namespace {

std::string soname(int major) { return "libnvrtc.so." + std::to_string(major); }

std::string env_value(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// A folder or file named by the environment: an absolute path of at most PATH_MAX bytes without control
// characters; "" (and a note) otherwise.
std::string usable_path(const std::string& name, const std::string& value, std::vector<std::string>* ignored) {
  if (value.empty()) return "";
  bool control = false;
  for (unsigned char c : value) control = control || c < 0x20 || c == 0x7f;
  const char* why = value.size() > PATH_MAX ? "is longer than PATH_MAX"
                    : control                ? "holds control characters"
                    : value[0] != '/'        ? "is not an absolute path"
                                             : nullptr;
  if (!why) return value;
  if (ignored) ignored->push_back(name + "='" + brief(value, 60) + "' " + why + " (ignored)");
  return "";
}

// The folder of the binary (shared library or executable) this function is in.
std::string this_module_dir() {
  Dl_info info{};
  std::string file;
  if (dladdr(reinterpret_cast<void*>(&this_module_dir), &info) && info.dli_fname && info.dli_fname[0] == '/')
    file = info.dli_fname;
  if (file.empty()) {  // the main program (dli_fname as invoked): the kernel's link
    char buf[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0) file.assign(buf, (size_t)n);
  }
  if (file.empty()) return "";
  char real[PATH_MAX];
  if (realpath(file.c_str(), real)) file = real;  // the installed file, not a link to it
  return fs::path(file).parent_path().string();
}

std::string pip_package(int major) {
  return major >= 13 ? "nvidia-cuda-nvrtc==" + std::to_string(major) + ".*"
                     : "nvidia-cuda-nvrtc-cu" + std::to_string(major);
}

}  // namespace

NvrtcSearchEnv nvrtc_search_env() {
  NvrtcSearchEnv e;
  e.flashtune_nvrtc = env_value("FLASHTUNE_NVRTC");
  e.cuda_home = env_value("CUDA_HOME");
  e.cuda_path = env_value("CUDA_PATH");
  e.module_dir = this_module_dir();
  e.hint = FLASHTUNE_NVRTC_HINT;
  e.major = FLASHTUNE_NVRTC_MAJOR;
  return e;
}

std::vector<NvrtcCandidate> nvrtc_candidates(const NvrtcSearchEnv& env, std::vector<std::string>* ignored) {
  using K = NvrtcCandidate::Kind;
  const std::string so = soname(env.major);
  std::vector<NvrtcCandidate> out;
  std::set<std::string> seen;
  auto file = [&](const fs::path& p, const char* where) {
    const std::string s = p.lexically_normal().string();
    if (seen.insert(s).second) out.push_back({K::file, s, where});
  };
  if (!env.flashtune_nvrtc.empty()) {
    // An explicit choice: that file or nothing (a wrong path must not silently load another NVRTC).
    const std::string p = usable_path("FLASHTUNE_NVRTC", env.flashtune_nvrtc, ignored);
    if (!p.empty()) file(p, "FLASHTUNE_NVRTC");
    return out;
  }
  out.push_back({K::in_process, so, "process"});
  for (const auto& [name, value] : {std::pair<const char*, const std::string&>{"CUDA_HOME", env.cuda_home},
                                    std::pair<const char*, const std::string&>{"CUDA_PATH", env.cuda_path}})
    if (const std::string dir = usable_path(name, value, ignored); !dir.empty()) {
      file(fs::path(dir) / "lib64" / so, name);
      file(fs::path(dir) / "lib" / so, name);
    }
  if (!env.module_dir.empty() && env.module_dir[0] == '/') {
    const fs::path up1 = fs::path(env.module_dir) / "..", up2 = up1 / "..";  // flashtune/, flashtune/bin/
    for (const fs::path& site : {up1, up2}) {
      file(site / "nvidia" / ("cu" + std::to_string(env.major)) / "lib" / so, "nvidia wheel");
      file(site / "nvidia" / "cuda_nvrtc" / "lib" / so, "nvidia wheel");
    }
  }
  out.push_back({K::loader, so, "loader"});
  file(fs::path("/usr/local/cuda/lib64") / so, "/usr/local/cuda");
  file(fs::path("/usr/local/cuda/lib") / so, "/usr/local/cuda");
  if (!env.hint.empty() && env.hint[0] == '/') file(fs::path(env.hint) / so, "build toolkit");
  return out;
}

void* nvrtc_dlopen(const NvrtcCandidate& c, std::string* why) {
  using K = NvrtcCandidate::Kind;
  if (c.kind == K::file) {
    struct stat st {};
    if (stat(c.path.c_str(), &st) != 0) return nullptr;  // not there: nothing to say
    if (!S_ISREG(st.st_mode)) {
      *why = "not a regular file";
      return nullptr;
    }
  }
  dlerror();
  void* h = dlopen(c.path.c_str(), RTLD_NOW | RTLD_LOCAL | (c.kind == K::in_process ? RTLD_NOLOAD : 0));
  if (!h && c.kind == K::file) {
    const char* e = dlerror();
    *why = e ? e : "dlopen failed";
  }
  return h;
}

std::string nvrtc_dlsym(void* handle, NvrtcApi* api) {
#define FT_NVRTC_LOAD(name)                                                                     \
  api->name = reinterpret_cast<decltype(&::nvrtc##name)>(dlsym(handle, "nvrtc" #name));         \
  if (!api->name) return "no nvrtc" #name;
  FT_NVRTC_FUNCTIONS(FT_NVRTC_LOAD)
#undef FT_NVRTC_LOAD
  return "";
}

void nvrtc_dlclose(void* handle) { dlclose(handle); }

NvrtcApi load_nvrtc(const NvrtcSearchEnv& env, const NvrtcOpen& open, const NvrtcResolve& resolve,
                    const NvrtcClose& close) {
  using K = NvrtcCandidate::Kind;
  std::vector<std::string> notes;
  const std::vector<NvrtcCandidate> cands = nvrtc_candidates(env, &notes);
  std::vector<std::string> problems;  // candidates that were there and could not be used
  for (const NvrtcCandidate& c : cands) {
    std::string why;
    void* h = open(c, &why);
    if (!h) {
      if (!why.empty()) problems.push_back(c.path + ": " + why);
      continue;
    }
    NvrtcApi api;
    why = resolve(h, &api);
    if (why.empty()) {
      if (api.Version(&api.major, &api.minor) != NVRTC_SUCCESS) why = "nvrtcVersion failed";
      else if (api.major != env.major)
        why = "is NVRTC " + std::to_string(api.major) + "." + std::to_string(api.minor) + ", this build needs " +
              std::to_string(env.major);
    }
    if (!why.empty()) {
      problems.push_back((c.kind == K::file ? c.path : c.where + " " + c.path) + ": " + why);
      if (c.kind == K::file) close(h);  // a loaded-by-name handle may be someone else's: leave it
      continue;
    }
    api.path = c.path;
    api.where = c.where;
    return api;
  }
  // One line: what was wanted, where it looked, what was found unusable, what to do.
  const std::string so = soname(env.major);
  std::string msg = "cannot load NVRTC " + std::to_string(env.major) + " (" + so + "): ";
  if (!env.flashtune_nvrtc.empty()) {
    msg += "FLASHTUNE_NVRTC='" + brief(env.flashtune_nvrtc, 120) + "' " +
           (problems.empty() ? (notes.empty() ? std::string("does not exist") : notes[0]) : brief(problems[0], 200)) +
           "; unset it to search the usual places";
    throw NvrtcUnavailable(brief(msg, 1500));
  }
  std::string looked;
  std::set<std::string> dirs;
  for (const NvrtcCandidate& c : cands) {
    std::string place = c.kind == K::in_process ? "" : c.kind == K::loader ? "the loader's path" : fs::path(c.path).parent_path().string();
    if (place.empty() || !dirs.insert(place).second) continue;
    looked += (looked.empty() ? "" : ", ") + place;
  }
  msg += "not in " + looked;
  if (env.cuda_home.empty()) msg += " (CUDA_HOME unset)";
  for (const std::string& p : problems) msg += "; " + brief(p, 200);
  for (const std::string& n : notes) msg += "; " + n;
  msg += "; install the CUDA " + std::to_string(env.major) + " toolkit (and set CUDA_HOME) or `pip install " +
         pip_package(env.major) + "`, or set FLASHTUNE_NVRTC to the library file";
  throw NvrtcUnavailable(brief(msg, 1500));
}

const NvrtcApi& nvrtc() {
  struct Loaded {
    NvrtcApi api;
    std::string error;
  };
  static const Loaded loaded = [] {
    Loaded l;
    try {
      l.api = load_nvrtc(nvrtc_search_env());
    } catch (const NvrtcUnavailable& e) {
      l.error = e.what();
    }
    return l;
  }();
  if (!loaded.error.empty()) throw NvrtcUnavailable(loaded.error);
  return loaded.api;
}

}  // namespace flashtune
