// The CUDA driver API, loaded with dlopen("libcuda.so.1") at first use: the runtime library loads on
// machines without a driver (it answers FT_NO_GPU there) and never links libcuda. Each entry point is
// looked up by the name cuda.h maps it to (cuMemAlloc -> cuMemAlloc_v2), so the types are cuda.h's own.
#pragma once
#include <cuda.h>

#include <string>

namespace flashtune::rt {

#define FT_DRIVER_FUNCTIONS(X)                                                                         \
  X(cuInit) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) \
  X(cuDeviceGetAttribute) X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxPushCurrent) X(cuCtxPopCurrent)   \
  X(cuDevicePrimaryCtxRetain) X(cuPointerGetAttribute) X(cuModuleLoadData) X(cuModuleGetFunction)       \
  X(cuFuncSetAttribute) X(cuLaunchKernel) X(cuLaunchKernelEx) X(cuMemFreeAsync) X(cuMemsetD8Async)    \
  X(cuMemPoolCreate) X(cuMemPoolSetAttribute) X(cuMemAllocFromPoolAsync) X(cuTensorMapEncodeTiled)       \
  X(cuMemPoolTrimTo) X(cuMemPoolGetAttribute)

#define FT_DRIVER_MEMBER(fn) decltype(&::fn) fn = nullptr;
struct Driver {
  FT_DRIVER_FUNCTIONS(FT_DRIVER_MEMBER)
};
#undef FT_DRIVER_MEMBER

// The loaded and initialised driver (cuInit done), or nullptr with the reason in *why (one line):
// no libcuda.so.1, a missing entry point, cuInit failing (no device, driver too old...).
const Driver* driver(std::string* why);
// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
std::string describe(CUresult);

}  // namespace flashtune::rt
