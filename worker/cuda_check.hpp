// CU_CHECK for the worker's driver-API calls (gpu_runner.cpp, library_runner.cpp): a failed call
// throws CudaError naming the call and the driver's error, sticky or not.
#pragma once
#include <cuda.h>

#include <string>

#include "worker/gpu_runner.hpp"

namespace flashtune {

inline std::string describe(CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  cuGetErrorName(r, &name);
  cuGetErrorString(r, &text);
  return std::string(name ? name : "CUDA_ERROR_?") + " (" + (text ? text : "") + ")";
}

}  // namespace flashtune

#define CU_CHECK(call)                                                                                        \
  do {                                                                                                        \
    CUresult rc_ = (call);                                                                                    \
    if (rc_ != CUDA_SUCCESS) throw ::flashtune::CudaError(rc_, std::string(#call) + ": " + ::flashtune::describe(rc_)); \
  } while (0)
