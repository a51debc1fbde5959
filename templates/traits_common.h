// Shared by every *_traits.h: plain C++ usable from the host tuner (g++ -std=c++20,
// no CUDA headers) and from device code (NVRTC, nvcc). No device code in here.
#pragma once

#ifndef FT_HD
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FT_HD __host__ __device__
#else
#define FT_HD
#endif
#endif

namespace flashtune {

// Launch grid in plain ints (dim3 is a CUDA type; the host converts).
struct GridDims {
  int x;
  int y;
  int z;
};

FT_HD constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Largest dynamic shared memory one block may opt into (cudaFuncAttributeMaxDynamicSharedMemorySize).
constexpr int kMaxSmemBytesSm90 = 227 * 1024;  // 232448
constexpr int kMaxSmemBytesSm80 = 163 * 1024;  // 166912

}  // namespace flashtune
