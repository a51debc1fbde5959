// A build that consumes generated headers: looks up the tuned fa2_simt config for a device at
// compile time and instantiates that kernel. On a machine with a GPU it also runs it once.
#include <cstdio>

#include "dispatch.hpp"
#include "fa2_simt.cuh"

#ifndef FT_DEVICE
#define FT_DEVICE "NVIDIA H100 80GB HBM3"
#endif
#ifndef FT_ARCH
#define FT_ARCH "sm_90"
#endif

constexpr int kHeadDim = 64;
constexpr auto kChoice = flashtune::tuned::lookup(FT_DEVICE, FT_ARCH, "fa2_simt", "fwd", "fp32", kHeadDim, false, 4096);
static_assert(kChoice.entry.family[0] != '\0', "no fa2_simt entry, not even a default");
constexpr auto& P = kChoice.entry.params;
using Traits = flashtune::Fa2SimtTraits<kHeadDim, P[0], P[1], P[2], P[3], P[4], false>;

int main() {
  const char* source[] = {"device", "arch", "default"};
  std::printf("fa2_simt d%d for %s: BLOCK_M=%d BLOCK_N=%d TM=%d TN=%d KV_STAGES=%d (from %s table, %.1f TFLOP/s)\n",
              kHeadDim, FT_DEVICE, P[0], P[1], P[2], P[3], P[4], source[(int)kChoice.source], kChoice.entry.tflops);
  auto kernel = &flashtune::fa2_simt_fwd<Traits>;
  cudaFuncAttributes attr{};
  cudaError_t rc = cudaFuncGetAttributes(&attr, kernel);
  if (rc != cudaSuccess) {
    std::printf("no usable GPU (%s): compiled only\n", cudaGetErrorString(rc));
    return 0;
  }
  std::printf("kernel instantiated: %d registers, %d threads max\n", attr.numRegs, attr.maxThreadsPerBlock);
  return 0;
}
