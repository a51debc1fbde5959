// Split-KV forward for decoding (FlashDecoding), fp16 / bf16: per (split, row tile, kv head, batch) a
// partial O and LSE, then a combine over the splits (not launched when SPLITS = 1).
#include "templates/decode_splitkv_traits.h"
#include "core/families/common.hpp"
#include "core/families/families.hpp"

namespace flashtune {

using family_parts::bool_arg;
using family_parts::join_args;
using family_parts::make_launch;

Family make_decode_splitkv() {
  Family f;
  f.name = "decode_splitkv";
  f.direction = "fwd";
  f.template_file = "decode_splitkv.cuh";
  f.kernels = {"flashtune::decode_splitkv_partial", "flashtune::decode_splitkv_combine"};
  // SPLITS: key splits, CTAs per (row tile, kv head, batch); 9, 17, 33, 66 fill 132 SMs' last wave.
  f.params = {{"SPLITS", {1, 2, 4, 8, 9, 16, 17, 32, 33, 64, 66, 128}},
              {"BLOCK_N", {32, 64, 128, 256}},            // keys per step, BLOCK_N / WARPS per warp
              {"WARPS", {2, 4, 8}},
              {"STAGES", {1, 2, 3, 4}}};                  // K/V buffers: one K and one V, or a ring of 2-4
  f.head_dims = {64, 128, 256};
  f.dtypes = {DType::fp16, DType::bf16};
  // 16 splits: 128 CTAs for one sequence of a Llama-3-like model (8 kv heads), about one per SM.
  f.default_config = {16, 64, 4, 2};
  f.gqa = true;
  f.paged = true;  // decode_splitkv_partial / _combine<Traits, true> on PagedParams
  f.paged_nhd = true;  // and <PagedNhdTraits<Traits>, true>: token-major pages
  struct Named {  // the config by name (the order of f.params)
    int splits, block_n, warps, stages;
    explicit Named(const Config& c) : splits(c.at(0)), block_n(c.at(1)), warps(c.at(2)), stages(c.at(3)) {}
  };
  f.paged_check = [](const Config& c, int page_size) { return decode_splitkv_paged_check(Named(c).block_n, page_size); };
  // Decoding (Sq 1) and speculative decoding (a few draft tokens): up to 16 query rows per sequence,
  // the largest Sq of ragged_decode.json. Longer queries are prefill: fa2_mma's (BLOCK_M rows of a
  // head per CTA), not split K/V's, whose CTAs would each re-read K/V for 16 group rows.
  f.max_seq_q = 16;
  f.traits = [](const Config& c, int d, bool causal, DType t) {
    const Named n(c);
    return "flashtune::DecodeSplitkvTraits<" +
           join_args({std::to_string(d), std::to_string(n.splits), std::to_string(n.block_n),
                      std::to_string(n.warps), std::to_string(n.stages), t == DType::bf16 ? "1" : "0",
                      bool_arg(causal)}) +
           ">";
  };
  f.check = [](const Config& c, int d) {
    const Named n(c);
    return decode_splitkv_check(d, n.splits, n.block_n, n.warps, n.stages);
  };
  f.launches = [](const Config& c, const Problem& p) {
    const Named n(c);
    const int splits = n.splits, bn = n.block_n, warps = n.warps, stages = n.stages;
    std::vector<Launch> ls{make_launch(decode_splitkv_partial_grid(p.batch, p.heads, p.heads_k, p.seq_q, splits),
                                       decode_splitkv_threads(warps),
                                       decode_splitkv_smem_bytes(p.head_dim, bn, warps, stages))};
    if (splits > 1)  // one split writes O and LSE itself
      ls.push_back(make_launch(decode_splitkv_combine_grid(p.batch, p.heads, p.seq_q),
                               decode_splitkv_combine_threads(), 0));
    return ls;
  };
  f.workspace_bytes = [](const Config& c, const Problem& p) {  // O_s and LSE_s per split, fp32
    const size_t splits = (size_t)Named(c).splits;
    return splits == 1 ? size_t{0}
                       : splits * (size_t)p.batch * (size_t)p.heads * (size_t)p.seq_q * ((size_t)p.head_dim + 1) * 4;
  };
  f.workspace_written = true;  // the partial kernel writes every split's O and LSE, empty splits included
  return f;
}

}  // namespace flashtune
