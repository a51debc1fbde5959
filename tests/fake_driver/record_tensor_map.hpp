// A stand-in for cuTensorMapEncodeTiled that records its arguments in the map's 16 words (address, dims,
// byte strides, box, swizzle, dtype), so that tests can check the maps a family's kernels receive: the
// fake driver exports it, and the tensor-map unit tests pass it to encode_tensor_maps.
#pragma once
#include <cuda.h>

inline CUresult record_tensor_map(CUtensorMap* m, CUtensorMapDataType type, cuuint32_t rank, void* addr,
                                  const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                  const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle swizzle,
                                  CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  if (rank != 4) return CUDA_ERROR_INVALID_VALUE;
  cuuint64_t* w = m->opaque;
  w[0] = reinterpret_cast<cuuint64_t>(addr);
  for (int i = 0; i < 4; ++i) w[1 + i] = dims[i], w[8 + i] = box[i];
  for (int i = 0; i < 3; ++i) w[5 + i] = strides[i];
  w[12] = (cuuint64_t)swizzle;
  w[13] = (cuuint64_t)type;
  return CUDA_SUCCESS;
}
