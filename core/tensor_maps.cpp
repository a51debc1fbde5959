#include "core/tensor_maps.hpp"

#include <stdexcept>

namespace flashtune {

bool map_can_read(const int64_t ext[4], const int64_t stride[4], int elem, uintptr_t address) {
  if (address % 16 || (ext[3] > 1 && stride[3] != 1)) return false;
  for (int i = 0; i < 3; ++i) {
    if (ext[i] <= 1) continue;
    const int64_t bytes = stride[i] * elem;
    if (stride[i] <= 0 || bytes % 16 || bytes >= (int64_t{1} << 40)) return false;
  }
  return true;
}

AttnTensorMaps encode_tensor_maps(EncodeTiledFn encode, const std::vector<TensorMapSpec>& specs, const Problem& p,
                                  const FwdTensors& t) {
  static_assert(sizeof(TmaDescriptor) == sizeof(CUtensorMap) && alignof(TmaDescriptor) == alignof(CUtensorMap),
                "TmaDescriptor holds a CUtensorMap");
  if (specs.size() > (size_t)kMaxTensorMaps)
    throw std::invalid_argument("a family declares " + std::to_string(specs.size()) + " tensor maps, at most " +
                                std::to_string(kMaxTensorMaps));
  AttnTensorMaps maps{};
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorMapSpec& m = specs[i];
    if (const std::string why = tensor_map_error(m, p); !why.empty()) throw std::invalid_argument(why);
    const bool queries = m.tensor == "q" || m.tensor == "o" || m.tensor == "do";
    const CUdeviceptr base = m.tensor == "q"   ? t.q
                             : m.tensor == "k" ? t.k
                             : m.tensor == "v" ? t.v
                             : m.tensor == "o" ? t.o
                                               : t.dout;
    const cuuint64_t seq = (cuuint64_t)(queries ? p.seq_q : p.seq_k);
    const cuuint64_t heads = (cuuint64_t)(queries ? p.heads : p.kv_heads());
    const cuuint64_t row = 2ull * (cuuint64_t)p.head_dim;  // bytes (16-bit elements)
    // Dense (B, H, S, d): (d, seq, heads, batch), a box of rows of one head. Packed variable-length
    // (total, H, d), token-major: (d, heads, total tokens, 1), a box of 1 head x rows of tokens (the same
    // shared-memory image); the kernel addresses a sequence's rows from its first token.
    const cuuint64_t tokens = (cuuint64_t)(queries ? p.varlen.total_q() : p.varlen.total_k());
    const bool packed = p.varlen.enabled();
    const cuuint64_t dims[4] = {(cuuint64_t)p.head_dim, packed ? heads : seq, packed ? tokens : heads,
                                packed ? 1 : (cuuint64_t)p.batch};
    cuuint64_t strides[3] = {row, packed ? row * heads : row * seq,
                             packed ? row * heads * tokens : row * seq * heads};  // of dims 1..3, in bytes
    const int which = m.tensor == "q" ? 0 : m.tensor == "k" ? 1 : m.tensor == "v" ? 2 : m.tensor == "o" ? 3 : 4;
    if (const int64_t* st = t.strides[(size_t)which]; st && !packed) {  // a dense view read in place: (seq, heads, batch)
      const int64_t ext[4] = {p.batch, (int64_t)heads, (int64_t)seq, p.head_dim};
      if (!map_can_read(ext, st, 2, (uintptr_t)base))
        throw std::invalid_argument("the " + m.tensor + " view's strides cannot be read by a tensor map");
      for (int i = 0; i < 3; ++i)  // an extent-1 dimension keeps the contiguous stride (any would do)
        if (ext[2 - i] > 1) strides[i] = 2ull * (cuuint64_t)st[2 - i];
    }
    const cuuint32_t box[4] = {(cuuint32_t)m.box_cols, packed ? 1u : (cuuint32_t)m.box_rows,
                               packed ? (cuuint32_t)m.box_rows : 1u, 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    const CUtensorMapSwizzle swizzle = m.swizzle_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                       : m.swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                               : CU_TENSOR_MAP_SWIZZLE_32B;
    const CUresult r =
        encode(reinterpret_cast<CUtensorMap*>(&maps.map[i]),
               p.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
               reinterpret_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
      throw std::runtime_error("cuTensorMapEncodeTiled refused the " + m.tensor + " map (CUresult " +
                               std::to_string((int)r) + ")");
  }
  return maps;
}

}  // namespace flashtune
