// Thread-block clusters for the launches of the worker and the runtime (Launch::cluster_x > 1, fa3_wgmma's
// MULTICAST): cuLaunchKernelEx's configuration with a cluster-dimension attribute; the kernels declare none.
#pragma once
#include <cuda.h>

namespace flashtune {

// The grid, block and dynamic shared memory of one launch, in clusters of `cluster_x` CTAs along x (grid[0]
// a multiple of it), on `stream`. `attr` holds the attribute the configuration points at: it must outlive
// the cuLaunchKernelEx call.
inline CUlaunchConfig cluster_launch_config(const unsigned (&grid)[3], unsigned threads, unsigned smem_bytes,
                                            unsigned cluster_x, CUstream stream, CUlaunchAttribute& attr) {
  attr = CUlaunchAttribute{};
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim.x = cluster_x;
  attr.value.clusterDim.y = 1;
  attr.value.clusterDim.z = 1;
  CUlaunchConfig cfg{};
  cfg.gridDimX = grid[0], cfg.gridDimY = grid[1], cfg.gridDimZ = grid[2];
  cfg.blockDimX = threads, cfg.blockDimY = 1, cfg.blockDimZ = 1;
  cfg.sharedMemBytes = smem_bytes;
  cfg.hStream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cfg;
}

}  // namespace flashtune
