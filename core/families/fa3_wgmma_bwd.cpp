// FlashAttention-3's backward design on Hopper (sm_90a), fp16 / bf16: a producer warp (TMA), a dQ writer
// warp (TMA reduce-add) and 1-3 consumer warpgroups of 64 keys each (wgmma for all five products).
#include "templates/fa3_wgmma_bwd_traits.h"
#include "core/families/common.hpp"
#include "core/families/families.hpp"

namespace flashtune {

using family_parts::bool_arg;
using family_parts::join_args;
using family_parts::make_launch;

Family make_fa3_wgmma_bwd() {
  Family f;
  f.name = "fa3_wgmma_bwd";
  f.direction = "bwd";
  f.template_file = "fa3_wgmma_bwd.cuh";
  f.kernels = {"flashtune::fa3_wgmma_bwd_preprocess", "flashtune::fa3_wgmma_bwd_dkdv", "flashtune::fa3_wgmma_bwd_convert"};
  f.params = {{"BLOCK_M", {64, 80, 96, 128}},  // query rows per step (the scores' wgmma N; 80, 96: dQ transposed)
              {"CONSUMERS", {1, 2, 3}},    // consumer warpgroups: BLOCK_N = 64 x CONSUMERS keys
              {"STAGES", {1, 2}},          // Q, dO, lse, delta slots in the TMA ring
              {"SCHED", {0, 1, 2, 3}},     // 0: key blocks of a head together; 1: heaviest first (LPT); 2: 0, rotated;
                                           // 3: 1 within groups of heads that share L2
              {"DQ_OVERLAP", {0, 1}},      // 1: dQ issued with dK and staged while dK runs
              {"DQ_TURNS", {0, 1}},        // 1: two consumers take turns at a step's whole dQ
              {"DETERMINISTIC", {0, 1, 2}},  // dQ added in key-block order (bitwise reproducible): 1 ascending,
                                             // 2 descending (causal: each query block's diagonal block first)
              {"DQ_STAGES", {0, 1, 2}}};   // dQ staging tiles, a writer warp each (0: added from the registers)
  f.head_dims = {64, 96, 128};
  f.dtypes = {DType::fp16, DType::bf16};
  f.default_config = {64, 1, 2, 0, 0, 0, 0, 1};  // fits every head dim (d 96 compiles with one consumer only)
  f.hopper_only = true;
  f.gqa = true;
  f.map_only_inputs = {"q", "k", "v"};  // TMA loads alone; the preprocess reads O and dO through the params
  // Every kernel on AttnModTraits<Traits, WINDOW, SOFTCAP, ALIBI> and ModParams<AttnBwdParams>: a window walks only
  // the query blocks that see the key block, a softcap's derivative enters dS, ALiBi's bias P^T's exponent
  // (templates/fa3_wgmma_bwd.cuh).
  f.mods = kModWindow | kModSoftcap | kModAlibi;
  // A mask_mod: a key block walks the query blocks of its list in the block summary (dense only).
  f.mods |= kModMask;
  enum Param : size_t { kBlockM, kConsumers, kStages, kSched, kDqOverlap, kDqTurns, kDeterministic, kDqStages };
  struct Named {  // the config by name (the order of f.params)
    int block_m, consumers, stages, sched, dq_overlap, dq_turns, deterministic, dq_stages;
    explicit Named(const Config& c)
        : block_m(c.at(kBlockM)), consumers(c.at(kConsumers)), stages(c.at(kStages)), sched(c.at(kSched)),
          dq_overlap(c.at(kDqOverlap)), dq_turns(c.at(kDqTurns)), deterministic(c.at(kDeterministic)),
          dq_stages(c.at(kDqStages)) {}
  };
  f.reproducible = [](const Config& c) { return c.size() == 8 && Named(c).deterministic >= 1; };
  f.mods_refused = {{kModMask, kDeterministic,
                     "DETERMINISTIC with a mask_mod: the dQ turns count each query block's key blocks as a range, and "
                     "a mask's are not one (a turn order from the block summary is not built)"},
                    {kModMask, kDqTurns,
                     "DQ_TURNS 1 with a mask_mod: dK and dQ measured wrong on the H200 (documents at S 700, causal; "
                     "DQ_TURNS 0 right), refused until found"},
                    {kModWindow | kModSoftcap | kModAlibi | kModMask, kBlockM,
                     "BLOCK_M 80 or 96 (dQ transposed) with a score modification: validated on a GPU in the plain form "
                     "only, so the runtime runs BLOCK_M 64 until the modified forms are",
                     {80, 96}, 64}};
  f.mask_blocks = [](const Config& c) { return std::pair{Named(c).block_m, fa3_bwd_block_n(Named(c).consumers)}; };
  f.causal_check = [](const Config& c, bool causal) -> const char* {
    return c.size() == 8 && Named(c).deterministic == 2 && !causal
               ? "DETERMINISTIC 2 orders the adds for the causal mask (every key block sees every query block "
                 "without it: 1's ascending order waits for nothing)"
               : nullptr;
  };
  f.traits = [](const Config& c, int d, bool causal, DType t) {
    const Named n(c);
    return "flashtune::Fa3WgmmaBwdTraits<" +
           join_args({std::to_string(d), std::to_string(n.block_m), std::to_string(n.consumers),
                      std::to_string(n.stages), std::to_string(n.sched), std::to_string(n.dq_overlap),
                      std::to_string(n.dq_turns), std::to_string(n.deterministic), std::to_string(n.dq_stages),
                      t == DType::bf16 ? "1" : "0",
                      bool_arg(causal)}) +
           ">";
  };
  f.check = [](const Config& c, int d) -> const char* {
    if (c.size() != 8) return "fa3_wgmma_bwd's config has 8 values (BLOCK_M .. DQ_STAGES)";
    const Named n(c);
    return fa3_bwd_check(d, n.block_m, n.consumers, n.stages, n.sched, n.dq_overlap, n.dq_turns, n.deterministic,
                         n.dq_stages);
  };
  f.workspace_bytes = [](const Config& c, const Problem& p) {
    return (size_t)fa3_bwd_workspace_bytes(p.batch, p.heads, p.seq_q, p.head_dim, Named(c).block_m);
  };
  f.workspace_written = true;  // the preprocess writes every padded row's lse2, delta and dq_accum
  f.launches = [](const Config& c, const Problem& p) {
    const Named n(c);
    return std::vector{
        make_launch(fa3_bwd_preprocess_grid(p.batch, p.heads, p.seq_q, n.block_m), kFa3BwdRowThreads, 0),
        make_launch(fa3_bwd_dkdv_grid(p.batch, p.kv_heads(), p.seq_k, n.consumers, n.sched,
                                      bwd_pair_group(p.batch * p.kv_heads(), p.heads / p.kv_heads(), p.seq_q,
                                                     p.head_dim)),
                    fa3_wgmma_threads(n.consumers),
                    fa3_bwd_smem_bytes(p.head_dim, n.block_m, n.consumers, n.stages, n.dq_stages)),
        make_launch(fa3_bwd_convert_grid(p.batch, p.heads, p.seq_q, n.block_m), kFa3BwdRowThreads, 0)};
  };
  f.tensor_maps = [](const Config& c, const Problem& p) {
    const Named n(c);
    const int w = fa3_wgmma_group_cols(p.head_dim), sw = fa3_wgmma_swizzle_bytes(p.head_dim);
    const int bn = fa3_bwd_block_n(n.consumers);
    return std::vector<TensorMapSpec>{{"q", n.block_m, w, sw}, {"k", bn, w, sw}, {"v", bn, w, sw}, {"do", n.block_m, w, sw}};
  };
  return f;
}

}  // namespace flashtune
