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

// Score modifications (issue 32) as compile-time switches: a family that has them (Family::mods) is instantiated
// on AttnModTraits<Traits, WINDOW, SOFTCAP> for a problem with a window or a softcap, its plain kernels on Traits
// itself, whose code and names stay what they were. ModsOf<T> reads the switches of either (false for a plain
// traits struct, which does not declare them). The kernel's argument is then ModParams (attention_params.h).
template <class Base, bool WINDOW, bool SOFTCAP>
struct AttnModTraits : Base {
  static constexpr bool kModWindow = WINDOW;    // sliding window: key blocks outside skipped, edges masked
  static constexpr bool kModSoftcap = SOFTCAP;  // logit softcap: s -> c tanh(s / c) before the softmax
};
template <class T, class = void>
struct ModsOf {
  static constexpr bool window = false, softcap = false, any = false;
};
template <class T>
struct ModsOf<T, decltype(void(T::kModWindow))> {
  static constexpr bool window = T::kModWindow, softcap = T::kModSoftcap, any = T::kModWindow || T::kModSoftcap;
};

}  // namespace flashtune
