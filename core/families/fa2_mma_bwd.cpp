// FlashAttention-2 backward on tensor cores, fp16 / bf16: preprocess, dK/dV, dQ; sliding window, softcap and ALiBi
// as compile-time variants (issue 32).
#include "templates/fa2_mma_bwd_traits.h"
#include "core/families/common.hpp"
#include "core/families/families.hpp"

namespace flashtune {

using family_parts::bool_arg;
using family_parts::join_args;
using family_parts::make_launch;

Family make_fa2_mma_bwd() {
  Family f;
  f.name = "fa2_mma_bwd";
  f.direction = "bwd";
  f.template_file = "fa2_mma_bwd.cuh";
  f.kernels = {"flashtune::fa2_mma_bwd_preprocess", "flashtune::fa2_mma_bwd_dkdv", "flashtune::fa2_mma_bwd_dq"};
  f.params = {{"BLOCK_M", {16, 32, 64, 128}},
              {"BLOCK_N", {16, 32, 64, 128, 256}},
              {"WARPS", {1, 2, 4, 8}},
              {"DSPLIT", {1, 2, 4}},   // warps splitting each key tile's dK/dV columns
              {"STAGES", {1, 2}},      // Q, dO, lse, delta double-buffered or not
              {"DQ_MODE", {0, 1}}};    // 0: fp32 atomics into a workspace, 1: separate deterministic pass
  f.head_dims = {32, 64, 96, 128, 192, 256};
  f.dtypes = {DType::fp16, DType::bf16};
  f.default_config = {32, 64, 8, 2, 2, 1};
  f.gqa = true;
  f.varlen = true;  // each kernel <Traits, true>
  // Every kernel on AttnModTraits<Traits, WINDOW, SOFTCAP, ALIBI> and ModParams (Fa2BwdArg): a window walks only the
  // query blocks that see a key block (and the dQ pass only the key steps a query block sees); softcap and ALiBi
  // in P and dS (issue 32: the backward that runs them on sm_80 and every GPU that is not Hopper).
  f.mods = kModWindow | kModSoftcap | kModAlibi;
  // Up to d 128: at d 192 and 256 the default tile with all three spills (12-28 bytes, sm_80 and sm_90); the dQ pass
  // of a modified variant takes a shorter key step (fa2_mma_bwd_dq_key_step's budget less kFa2MmaBwdDqModRegs).
  f.mods_max_head_dim = 128;
  struct Named {  // the config by name (the order of f.params)
    int block_m, block_n, warps, dsplit, stages, dq_mode;
    explicit Named(const Config& c)
        : block_m(c.at(0)), block_n(c.at(1)), warps(c.at(2)), dsplit(c.at(3)), stages(c.at(4)), dq_mode(c.at(5)) {}
  };
  f.reproducible = [](const Config& c) { return Named(c).dq_mode == 1; };  // the dQ pass adds in a fixed order
  f.traits = [](const Config& c, int d, bool causal, DType t) {
    const Named n(c);
    return "flashtune::Fa2MmaBwdTraits<" +
           join_args({std::to_string(d), std::to_string(n.block_m), std::to_string(n.block_n),
                      std::to_string(n.warps), std::to_string(n.dsplit), std::to_string(n.stages),
                      std::to_string(n.dq_mode), t == DType::bf16 ? "1" : "0", bool_arg(causal)}) +
           ">";
  };
  f.check = [](const Config& c, int d) {
    const Named n(c);
    return fa2_mma_bwd_check(d, n.block_m, n.block_n, n.warps, n.dsplit, n.stages, n.dq_mode);
  };
  f.launches = [](const Config& c, const Problem& p) {
    const Named n(c);
    const int bm = n.block_m, bn = n.block_n, w = n.warps, ds = n.dsplit, st = n.stages, mode = n.dq_mode,
              d = p.head_dim;
    // Per query head, but dK/dV per kv head (grouped-query attention sums over the group in the CTA).
    auto grid = [&](auto fn, int heads) { return fn(p.batch, heads, p.seq_q, p.seq_k, bm, bn, w, ds, st, mode); };
    return std::vector{
        make_launch(grid(fa2_mma_bwd_preprocess_grid, p.heads), fa2_mma_bwd_preprocess_threads(bm, bn, w, ds, st, mode),
                    fa2_mma_bwd_preprocess_smem_bytes(d, bm, bn, w, ds, st, mode)),
        make_launch(grid(fa2_mma_bwd_dkdv_grid, p.kv_heads()), fa2_mma_bwd_dkdv_threads(bm, bn, w, ds, st, mode),
                    fa2_mma_bwd_dkdv_smem_bytes(d, bm, bn, w, ds, st, mode)),
        make_launch(grid(fa2_mma_bwd_dq_grid, p.heads), fa2_mma_bwd_dq_threads(bm, bn, w, ds, st, mode),
                    fa2_mma_bwd_dq_smem_bytes(d, bm, bn, w, ds, st, mode))};
  };
  return f;
}

}  // namespace flashtune
