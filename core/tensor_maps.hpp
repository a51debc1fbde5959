// TMA tensor maps (Family::tensor_maps) encoded over a problem's tensors: the worker and the runtime
// library share this, each passing its own cuTensorMapEncodeTiled (linked, or loaded with dlopen).
#pragma once
#include <cuda.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/family.hpp"
#include "templates/attention_params.h"

namespace flashtune {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// Device addresses of the tensors a map may describe, (batch, heads, seq, head_dim): the forward's and the
// backward's incoming gradient dO (a backward passes O's address as o). Contiguous, unless strides names a
// dense tensor's element strides ([B, H, S, d] order, d's 1): a view read in place (Family::map_only_inputs).
struct FwdTensors {
  CUdeviceptr q = 0, k = 0, v = 0, o = 0, dout = 0;
  std::array<const int64_t*, 5> strides{};  // q, k, v, o, dout; nullptr: contiguous
};

// Whether a dense tensor of `elem`-byte elements with these extents and element strides ([B, H, S, d]) at
// `address` can be described by a tensor map as it lies: d unit-stride, the other strides positive multiples
// of 16 bytes under 2^40 (extent-1 dimensions excepted), the address 16-byte aligned.
bool map_can_read(const int64_t ext[4], const int64_t stride[4], int elem, uintptr_t address);

// maps[i] for specs[i]. Throws std::invalid_argument with tensor_map_error's reason for a spec the
// problem cannot have, std::runtime_error naming the CUresult when the driver refuses.
AttnTensorMaps encode_tensor_maps(EncodeTiledFn encode, const std::vector<TensorMapSpec>& specs, const Problem& p,
                                  const FwdTensors& t);

}  // namespace flashtune
