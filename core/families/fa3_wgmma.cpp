// FlashAttention-3's forward design on Hopper (sm_90a), fp16 / bf16: TMA, mbarriers, a producer
// warpgroup and 1-3 consumer warpgroups with register reallocation, wgmma for both GEMMs.
#include "templates/fa3_wgmma_traits.h"
#include "core/families/common.hpp"
#include "core/families/families.hpp"

namespace flashtune {

using family_parts::bool_arg;
using family_parts::join_args;
using family_parts::make_launch;

Family make_fa3_wgmma() {
  Family f;
  f.name = "fa3_wgmma";
  f.direction = "fwd";
  f.template_file = "fa3_wgmma.cuh";
  f.kernels = {"flashtune::fa3_wgmma_fwd"};
  std::vector<int> bns;
  for (int bn = 64; bn <= 256; bn += 16) bns.push_back(bn);
  f.params = {{"BLOCK_N", bns},
              {"CONSUMERS", {1, 2, 3}},  // consumer warpgroups: BLOCK_M = 64 x CONSUMERS
              {"STAGES", {2, 3}},        // K/V slots in the TMA ring
              {"OVERLAP", {0, 1}},       // softmax of block n+1 during P(n) V(n)
              {"PINGPONG", {0, 1}},      // consumers take turns issuing GEMMs
              {"P_SMEM", {0, 1}},        // P V with P from shared memory (SS) instead of registers (RS)
              {"PERSISTENT", {0, 1}},    // one CTA per SM looping over the tiles (Problem::sm_count)
              {"TWO_CTAS", {0, 1}},      // two CTAs per SM (half the registers and shared memory each)
              {"MULTICAST", {0, 1}}};    // clusters of two CTAs sharing K/V copies (TMA multicast)
  f.head_dims = {32, 64, 96, 128, 192, 256};
  f.dtypes = {DType::fp16, DType::bf16};
  f.default_config = {64, 2, 2, 1, 1, 0, 0, 0, 0};  // fits every head dim (d = 256: 128 + 32 + 16 accumulators)
  f.hopper_only = true;
  f.gqa = true;
  f.map_only_inputs = {"q", "k", "v"};  // TMA loads alone; O is stored through the params (and its map)
  f.varlen = true;  // fa3_wgmma_fwd<Traits, true>: packed tensor maps, guarded O stores at a sequence's end
  f.mods = kModWindow | kModSoftcap | kModAlibi;  // fa3_wgmma_fwd<AttnModTraits<Traits, W, S, A>[, true]> on ModParams
  // A mask_mod: fa3_wgmma_fwd<AttnModTraits<Traits, W, S, A, MaskMod_<hash>>> on MaskModParams, dense only.
  f.mods |= kModMask;
  enum Param : size_t { kBlockN, kConsumers, kStages, kOverlap, kPingpong, kPSmem, kPersistent, kTwoCtas, kMulticast };
  struct Named {  // the config by name (the order of f.params)
    int block_n, consumers, stages, overlap, pingpong, p_smem, persistent, two_ctas, multicast;
    explicit Named(const Config& c)
        : block_n(c.at(kBlockN)), consumers(c.at(kConsumers)), stages(c.at(kStages)), overlap(c.at(kOverlap)),
          pingpong(c.at(kPingpong)), p_smem(c.at(kPSmem)), persistent(c.at(kPersistent)), two_ctas(c.at(kTwoCtas)),
          multicast(c.at(kMulticast)) {}
  };
  f.traits = [](const Config& c, int d, bool causal, DType t) {
    const Named n(c);
    return "flashtune::Fa3WgmmaTraits<" +
           join_args({std::to_string(d), std::to_string(n.block_n), std::to_string(n.consumers),
                      std::to_string(n.stages), std::to_string(n.overlap), std::to_string(n.pingpong),
                      std::to_string(n.p_smem), std::to_string(n.persistent), std::to_string(n.two_ctas),
                      std::to_string(n.multicast), t == DType::bf16 ? "1" : "0", bool_arg(causal)}) +
           ">";
  };
  f.check = [](const Config& c, int d) -> const char* {
    // tests/test_space.cpp asks about an 8-value config (from before MULTICAST): a reason, not a read past the end.
    if (c.size() != 9) return "fa3_wgmma's config has 9 values (BLOCK_N .. MULTICAST)";
    const Named n(c);
    return fa3_wgmma_check(d, n.block_n, n.consumers, n.stages, n.overlap, n.pingpong, n.p_smem, n.persistent,
                           n.two_ctas, n.multicast);
  };
  f.causal_check = [](const Config& c, bool causal) { return fa3_wgmma_causal_check(Named(c).multicast, causal); };
  f.mods_refused = {{kModMask, kMulticast,
                     "MULTICAST with a mask_mod: the two CTAs of a cluster share K/V blocks, and neighbouring query "
                     "blocks' lists of the block summary differ"}};
  f.mask_blocks = [](const Config& c) { return std::pair{fa3_wgmma_block_m(Named(c).consumers), Named(c).block_n}; };
  f.varlen_check = [](const Config& c) -> const char* {
    return Named(c).multicast
               ? "MULTICAST is dense only (a packed batch's query blocks past a sequence's end leave their cluster)"
               : nullptr;
  };
  f.launches = [](const Config& c, const Problem& p) {
    const Named n(c);
    return std::vector{
        make_launch(fa3_wgmma_grid(p.batch, p.heads, p.seq_q, n.consumers, n.persistent, p.sm_count, n.two_ctas,
                                   n.multicast),
                    fa3_wgmma_threads(n.consumers),
                    fa3_wgmma_smem_bytes(p.head_dim, n.block_n, n.consumers, n.stages, n.p_smem, n.persistent,
                                         1 + n.two_ctas),
                    fa3_wgmma_cluster(n.multicast))};
  };
  f.tensor_maps = [](const Config& c, const Problem& p) {
    const Named n(c);
    const int w = fa3_wgmma_group_cols(p.head_dim), sw = fa3_wgmma_swizzle_bytes(p.head_dim);
    return std::vector<TensorMapSpec>{{"q", fa3_wgmma_block_m(n.consumers), w, sw},
                                      {"k", fa3_wgmma_kv_box_rows(n.block_n, n.multicast), w, sw},
                                      {"v", fa3_wgmma_kv_box_rows(n.block_n, n.multicast), w, sw},
                                      {"o", 64, w, sw}};
  };
  return f;
}

}  // namespace flashtune
