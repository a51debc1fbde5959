#include "driver.hpp"

#include <dlfcn.h>

#include <mutex>

namespace flashtune::rt {

namespace {
#define FT_STR2(x) #x
#define FT_STR(x) FT_STR2(x)  // expands cuda.h's versioning macros first: "cuMemAlloc_v2"

struct Loaded {
  Driver d;
  std::string why;  // empty: usable
};

Loaded load() {
  Loaded l;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    l.why = std::string("no CUDA driver: ") + (e ? e : "libcuda.so.1 not found");
    return l;
  }
#define FT_LOAD(fn)                                                                  \
  l.d.fn = reinterpret_cast<decltype(&::fn)>(dlsym(lib, FT_STR(fn)));               \
  if (!l.d.fn) {                                                                     \
    l.why = "the CUDA driver is too old: no " FT_STR(fn) " in libcuda.so.1";         \
    return l;                                                                        \
  }
  FT_DRIVER_FUNCTIONS(FT_LOAD)
#undef FT_LOAD
  if (CUresult rc = l.d.cuInit(0); rc != CUDA_SUCCESS) {
    const char* name = nullptr;
    l.d.cuGetErrorName(rc, &name);
    l.why = std::string("cuInit failed: ") + (name ? name : "unknown error");
    return l;
  }
  int count = 0;
  if (l.d.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) l.why = "no CUDA device";
  return l;
}
}  // namespace

const Driver* driver(std::string* why) {
  static const Loaded loaded = load();  // once per process, thread-safe
  if (!loaded.why.empty()) {
    if (why) *why = loaded.why;
    return nullptr;
  }
  return &loaded.d;
}

std::string describe(CUresult r) {
  const Driver* d = driver(nullptr);
  const char* name = nullptr;
  const char* text = nullptr;
  if (d) {
    d->cuGetErrorName(r, &name);
    d->cuGetErrorString(r, &text);
  }
  return std::string(name ? name : "CUDA error " + std::to_string((int)r)) + (text ? std::string(" (") + text + ")" : "");
}

}  // namespace flashtune::rt
