// For the tests that run the runtime on the fake driver: it is loaded by path (FT_FAKE_CUDA, from the
// build) before the runtime's first driver call, which then finds it by its SONAME, libcuda.so.1.
#pragma once
#include <dlfcn.h>

#include <stdexcept>

#include "fake_cuda.hpp"

inline void* fake_lib() {
  static void* lib = dlopen(FT_FAKE_CUDA, RTLD_NOW | RTLD_GLOBAL);
  return lib;
}

inline FakeState& fake() {
  void* lib = fake_lib();
  if (!lib) throw std::runtime_error(dlerror());
  return *reinterpret_cast<FakeState* (*)()>(dlsym(lib, "fake_cuda_state"))();
}
