// FlashAttention-2 backward on Hopper's wgmma (sm_90a), fp16 / bf16: fa2_mma_bwd's preprocess and
// dQ conversion around a warpgroup dK/dV kernel (dQ by fp32 reductions).
#include "templates/fa2_wgmma_bwd_traits.h"
#include "core/families/common.hpp"
#include "core/families/families.hpp"

namespace flashtune {

using family_parts::bool_arg;
using family_parts::join_args;
using family_parts::make_launch;

Family make_fa2_wgmma_bwd() {
  Family f;
  f.name = "fa2_wgmma_bwd";
  f.direction = "bwd";
  f.template_file = "fa2_wgmma_bwd.cuh";
  f.kernels = {"flashtune::fa2_wgmma_bwd_preprocess", "flashtune::fa2_wgmma_bwd_dkdv", "flashtune::fa2_mma_bwd_dq"};
  f.params = {{"BLOCK_M", {64, 128}},
              {"BLOCK_N", {64, 128, 192, 256}},
              {"SPLIT", {0, 1, 2}},  // 0: a warpgroup per 64 keys; 1: two split dV | dK roles, 2: two halve every product
              {"STAGES", {1, 2}},    // Q, dO, lse, delta double-buffered or not
              // dQ into dq_accum: 0 reductions from registers, 1 bulk reductions per row, 2 whole-line v4
              // reductions, 3 one bulk reduction per query block from its dead Q/dO slot
              {"DQ_RED", {0, 1, 2, 3}},
              // Q, dO, lse, delta: 0 cp.async by every thread, 1 bulk copies of tile images the preprocess writes
              {"LOAD", {0, 1}},
              // dQ added in key-block order (bitwise reproducible; DQ_RED 3): 1 ascending, 2 descending (causal:
              // each query block's diagonal block first). A config stored or tabled before it reads 0.
              {"DETERMINISTIC", {0, 1, 2}},
              // The dK/dV grid: 0 a kv head's key blocks side by side; 3 pairs in L2-sized groups, each group's key
              // block j before its j + 1 (fa3_wgmma_bwd's); 1 the same in one group of every pair. Last: a config
              // stored or tabled before it reads 0.
              {"SCHED", {0, 1, 3}}};
  f.head_dims = {32, 64, 96, 128, 192, 256};
  f.dtypes = {DType::fp16, DType::bf16};
  f.default_config = {64, 64, 2, 1, 0, 0, 0, 0};  // compiles spill-free for every head dim (SPLIT 1 is at 255 registers at d = 256)
  f.hopper_only = true;
  f.gqa = true;
  f.varlen = true;  // each kernel <Traits, true>
  struct Named {  // the config by name (the order of f.params); one stored before DETERMINISTIC or SCHED has 0
    int block_m, block_n, split, stages, dq_red, load, deterministic, sched;
    explicit Named(const Config& c)
        : block_m(c.at(0)), block_n(c.at(1)), split(c.at(2)), stages(c.at(3)), dq_red(c.at(4)), load(c.at(5)),
          deterministic(c.size() > 6 ? c.at(6) : 0), sched(c.size() > 7 ? c.at(7) : 0) {}
  };
  f.reproducible = [](const Config& c) { return Named(c).deterministic >= 1; };
  f.causal_check = [](const Config& c, bool causal) -> const char* {
    return fa2_wgmma_bwd_det_causal_ok(Named(c).deterministic, causal)
               ? nullptr
               : "DETERMINISTIC 2 orders the adds for the causal mask (every key block sees every query block "
                 "without it: 1's ascending order waits for nothing)";
  };
  f.traits = [](const Config& c, int d, bool causal, DType t) {
    const Named n(c);
    return "flashtune::Fa2WgmmaBwdTraits<" +
           join_args({std::to_string(d), std::to_string(n.block_m), std::to_string(n.block_n),
                      std::to_string(n.split), std::to_string(n.stages), std::to_string(n.dq_red),
                      std::to_string(n.load), t == DType::bf16 ? "1" : "0", bool_arg(causal)}) +
           // DETERMINISTIC and SCHED 0: the template's defaults, so that those variants keep their names
           (n.deterministic || n.sched ? "," + std::to_string(n.deterministic) : "") +
           (n.sched ? "," + std::to_string(n.sched) : "") + ">";
  };
  f.check = [](const Config& c, int d) {
    const Named n(c);
    return fa2_wgmma_bwd_check(d, n.block_m, n.block_n, n.split, n.stages, n.dq_red, n.load, n.deterministic,
                               n.sched);
  };
  // The packed LOAD 1 (per-sequence tile images) once failed on the H100 (201 of 222 ragged runs): the
  // preprocess's Q/dO image stores ran past a short sequence's padding; fa2_wgmma_bwd_image_row guards them
  // (docs/kernels.md), and the GPU re-validated it (varlen_bwd_wgmma_validate.db).
  // LOAD 1's images: per query head (packed: per sequence); then DETERMINISTIC's turn counters (one per query row,
  // laid out as lse).
  f.workspace_bytes = [](const Config& c, const Problem& p) {
    const Named n(c);
    if (p.varlen.enabled())
      return (size_t)fa2_wgmma_bwd_varlen_workspace_bytes(p.batch, p.heads, p.varlen.total_q(), p.head_dim, n.block_m,
                                                          n.load, n.deterministic);
    return (size_t)fa2_wgmma_bwd_workspace_bytes(p.batch, p.heads, p.seq_q, p.head_dim, n.block_m, n.load,
                                                 n.deterministic);
  };
  // LOAD 1's images: the preprocess writes every padded row (zeros past seq_q); DETERMINISTIC's counters: it zeroes
  // each query block's (its first row's), the only ones read.
  f.workspace_written = true;
  f.launches = [](const Config& c, const Problem& p) {
    const Named n(c);
    const int bm = n.block_m, bn = n.block_n, sp = n.split, st = n.stages, red = n.dq_red, load = n.load,
              d = p.head_dim;
    // Per query head, but dK/dV per kv head (grouped-query attention sums over the group in the CTA); SCHED 3's
    // group of (kv head, batch) pairs by the Q and dO bytes of each (packed: of the longest sequence), 1's every pair.
    auto grid = [&](auto fn) { return fn(p.batch, p.heads, p.seq_q, p.seq_k, bm, bn, sp, st); };
    const int pairs = p.batch * p.kv_heads();
    const int pair_group = n.sched == 1 ? pairs : bwd_pair_group(pairs, p.group(), p.seq_q, d);
    return std::vector{
        make_launch(grid(fa2_wgmma_bwd_preprocess_grid), fa2_wgmma_bwd_preprocess_threads(bm, bn, sp, st),
                    fa2_wgmma_bwd_preprocess_smem_bytes(d, bm, bn, sp, st)),
        make_launch(fa2_wgmma_bwd_dkdv_grid(p.batch, p.kv_heads(), p.seq_k, bn, n.sched, pair_group),
                    fa2_wgmma_bwd_dkdv_threads(bm, bn, sp, st),
                    fa2_wgmma_bwd_dkdv_smem_bytes(d, bm, bn, sp, st, red, load)),
        make_launch(grid(fa2_wgmma_bwd_dq_grid), fa2_wgmma_bwd_dq_threads(bm, bn, sp, st),
                    fa2_wgmma_bwd_dq_smem_bytes(d, bm, bn, sp, st))};
  };
  return f;
}

}  // namespace flashtune
