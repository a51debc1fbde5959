// NVRTC, loaded at run time (dlopen) rather than linked: a binary built on one machine finds the NVRTC of the
// machine it runs on, and no build path is kept in it. The functions the project calls go through one table, as
// SQLite's do (results/sqlite_api.hpp); nvrtc.h gives their types only.
//
// Where it looks, in order (docs/usage.md, "NVRTC at run time"), for libnvrtc.so.<major> of the CUDA major this
// build was compiled against (FLASHTUNE_NVRTC_MAJOR; the loaded library's nvrtcVersion must agree):
//   1. $FLASHTUNE_NVRTC: an absolute path to the library file; when set, the only place looked at.
//   2. an NVRTC of that major already in the process (torch's, for instance): one NVRTC per process.
//   3. $CUDA_HOME, then $CUDA_PATH: <dir>/lib64, <dir>/lib (absolute paths only; others are ignored, and said so).
//   4. NVIDIA's wheel (pip install nvidia-cuda-nvrtc; -cu12 for CUDA 12) beside this binary: <dir>/../nvidia/
//      cu<major>/lib and <dir>/../nvidia/cuda_nvrtc/lib, and one folder further up (flashtune/bin/), where <dir>
//      holds the library or executable this code is in (the wheel's site-packages/flashtune/).
//   5. the dynamic loader's own search (LD_LIBRARY_PATH, the executable's RUNPATH, ld.so.cache, /lib, /usr/lib).
//   6. /usr/local/cuda/lib64, /usr/local/cuda/lib.
//   7. the toolkit this build was made with (FLASHTUNE_NVRTC_HINT): a build tree's binaries only, never a wheel.
// None: NvrtcUnavailable, one line naming where it looked and what to install.
#pragma once
#include <nvrtc.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashtune {

#define FT_NVRTC_FUNCTIONS(X)                                                                                   \
  X(Version) X(GetErrorString) X(CreateProgram) X(DestroyProgram) X(CompileProgram) X(AddNameExpression)     \
  X(GetLoweredName) X(GetProgramLogSize) X(GetProgramLog) X(GetCUBINSize) X(GetCUBIN)

struct NvrtcApi {
#define FT_NVRTC_MEMBER(name) decltype(&::nvrtc##name) name = nullptr;
  FT_NVRTC_FUNCTIONS(FT_NVRTC_MEMBER)
#undef FT_NVRTC_MEMBER
  std::string path;   // where it was loaded from (a path, or the soname the loader resolved)
  std::string where;  // which step found it: "FLASHTUNE_NVRTC", "process", "CUDA_HOME", ...
  int major = 0, minor = 0;
};

// No NVRTC could be loaded (or $FLASHTUNE_NVRTC names one that is not usable): what() is one line.
class NvrtcUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The table, loaded once per process (thread-safe); throws NvrtcUnavailable, the same line on every call.
const NvrtcApi& nvrtc();

// The NVRTC major this build needs (its toolkit's).
int nvrtc_major_needed();

// ---- the search, apart from the process so that the tests can drive it -----------------------------------
struct NvrtcSearchEnv {
  std::string flashtune_nvrtc, cuda_home, cuda_path;  // the environment's values; "" when unset
  std::string module_dir;  // the folder of the binary this code is in; "" when unknown
  std::string hint;        // the build's toolkit library folder; "" for a wheel
  int major = 0;           // libnvrtc.so.<major>
};
// The process's: its environment, this code's folder (dladdr), the build's hint and major.
NvrtcSearchEnv nvrtc_search_env();

struct NvrtcCandidate {
  enum class Kind { file, in_process, loader };
  Kind kind = Kind::file;
  std::string path;   // file: an absolute path; in_process, loader: the soname
  std::string where;  // the step: "FLASHTUNE_NVRTC", "process", "CUDA_HOME", "CUDA_PATH", "nvidia wheel",
                      // "loader", "/usr/local/cuda", "build toolkit"
};
// The places to try, in order; `ignored` gets a note per environment value that is not used ("CUDA_HOME='x' is
// not an absolute path").
std::vector<NvrtcCandidate> nvrtc_candidates(const NvrtcSearchEnv& env, std::vector<std::string>* ignored = nullptr);

// Opens one candidate: a dlopen handle, or nullptr with why (a file that is not there: why stays empty).
using NvrtcOpen = std::function<void*(const NvrtcCandidate&, std::string* why)>;
// The real one: stat + dlopen(path, RTLD_NOW | RTLD_LOCAL), dlopen(soname, RTLD_NOLOAD) for in_process.
void* nvrtc_dlopen(const NvrtcCandidate& c, std::string* why);
// Resolves the functions from a handle (dlsym); "" when all are there, else which is missing.
using NvrtcResolve = std::function<std::string(void* handle, NvrtcApi* api)>;
std::string nvrtc_dlsym(void* handle, NvrtcApi* api);

// Closes a file candidate's handle that was not used (dlclose).
using NvrtcClose = std::function<void(void* handle)>;
void nvrtc_dlclose(void* handle);

// Tries the candidates in order with `open` and `resolve`; the first whose functions resolve and whose major
// matches wins (a file that does not is closed again). Throws NvrtcUnavailable with the one-line message otherwise.
NvrtcApi load_nvrtc(const NvrtcSearchEnv& env, const NvrtcOpen& open = nvrtc_dlopen,
                    const NvrtcResolve& resolve = nvrtc_dlsym, const NvrtcClose& close = nvrtc_dlclose);

}  // namespace flashtune
