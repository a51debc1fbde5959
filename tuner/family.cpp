#include "tuner/family.hpp"

#include <algorithm>
#include <cerrno>

#include "templates/decode_splitkv_traits.h"
#include "templates/fa1_simt_traits.h"
#include "templates/fa2_mma_bwd_traits.h"
#include "templates/fa2_mma_traits.h"
#include "templates/fa2_simt_bwd_traits.h"
#include "templates/fa2_simt_traits.h"
#include "templates/fa2_wgmma_bwd_traits.h"
#include "templates/fa3_wgmma_bwd_traits.h"
#include "templates/fa3_wgmma_traits.h"
#include "templates/naive_traits.h"
#include "templates/test_faults_traits.h"
#include "tuner/util.hpp"

namespace flashtune {

namespace {

const char* bool_arg(bool b) { return b ? "true" : "false"; }

std::string join_args(std::initializer_list<std::string> args) {
  std::string s;
  for (const auto& a : args) s += (s.empty() ? "" : ",") + a;
  return s;
}

Launch make_launch(GridDims g, int threads, int smem, int cluster_x = 1) {
  Launch l;
  l.grid[0] = (unsigned)g.x;
  l.grid[1] = (unsigned)g.y;
  l.grid[2] = (unsigned)g.z;
  l.threads = (unsigned)threads;
  l.smem_bytes = (unsigned)smem;
  l.cluster_x = (unsigned)cluster_x;
  return l;
}

std::vector<Family> make_families() {
  std::vector<Family> fs;
  using S = std::string;

  {  // The unfused baseline: scores materialised in global memory.
    Family f;
    f.name = "naive";
    f.direction = "fwd";
    f.template_file = "naive.cuh";
    f.kernels = {"flashtune::naive_fwd"};
    f.params = {{"THREADS", {64, 128, 256, 512, 1024}}};
    f.head_dims = {32, 64, 96, 128};
    f.dtypes = {DType::fp32};
    f.default_config = {256};
    f.traits = [](const Config& c, int d, bool causal, DType) {
      return "flashtune::NaiveTraits<" + join_args({std::to_string(d), std::to_string(c[0]), bool_arg(causal)}) + ">";
    };
    f.check = [](const Config& c, int d) { return naive_check(d, c[0]); };
    f.launches = [](const Config& c, const Problem& p) {
      return std::vector{
          make_launch(naive_grid(p.batch, p.heads, p.seq_q), naive_threads(c[0]), naive_smem_bytes(p.head_dim, c[0]))};
    };
    f.workspace_bytes = [](const Config&, const Problem& p) {
      return 4 * (size_t)naive_workspace_floats(p.batch, p.heads, p.seq_q, p.seq_k);
    };
    fs.push_back(std::move(f));
  }
  {  // FlashAttention-1 forward on CUDA cores: K/V blocks outer, O, m, l round-trip through global memory.
    Family f;
    f.name = "fa1_simt";
    f.direction = "fwd";
    f.template_file = "fa1_simt.cuh";
    f.kernels = {"flashtune::fa1_simt_fwd"};
    f.params = {{"BLOCK_M", {16, 32, 64, 128, 256}},
                {"BLOCK_N", {16, 32, 64, 128, 256}},
                {"TM", {1, 2, 4, 8, 16}},
                {"TN", {1, 2, 4, 8, 16}},
                {"Q_STAGES", {1, 2}},            // Q_i prefetched during the P V of the previous step, or double-buffered
                {"Q_SPLIT", {1, 2, 4, 8, 16}}};  // CTAs per (batch, head), each a strided share of the query blocks
    f.head_dims = {32, 64, 96, 128};
    f.dtypes = {DType::fp32};
    f.default_config = {64, 32, 4, 4, 2, 1};  // 128 threads, TC = 8 fits every d; one CTA per (batch, head) as FA1
    f.traits = [](const Config& c, int d, bool causal, DType) {
      return "flashtune::Fa1SimtTraits<" +
             join_args({std::to_string(d), std::to_string(c[0]), std::to_string(c[1]), std::to_string(c[2]),
                        std::to_string(c[3]), std::to_string(c[4]), std::to_string(c[5]), bool_arg(causal)}) +
             ">";
    };
    // The target's shared-memory limit is the compile stage's to apply, per arch.
    f.check = [](const Config& c, int d) { return fa1_simt_check(d, c[0], c[1], c[2], c[3], c[4], c[5], 1 << 30); };
    f.launches = [](const Config& c, const Problem& p) {
      return std::vector{make_launch(fa1_simt_grid(p.batch, p.heads, p.seq_q, c[0], c[5]),
                                     fa1_simt_threads(c[0], c[1], c[2], c[3]),
                                     fa1_simt_smem_bytes(p.head_dim, c[0], c[1], c[4]))};
    };
    f.workspace_bytes = [](const Config&, const Problem& p) {  // running m and l
      return 4 * (size_t)fa1_simt_workspace_floats(p.batch, p.heads, p.seq_q);
    };
    fs.push_back(std::move(f));
  }
  {  // FlashAttention-2 forward on CUDA cores.
    Family f;
    f.name = "fa2_simt";
    f.direction = "fwd";
    f.template_file = "fa2_simt.cuh";
    f.kernels = {"flashtune::fa2_simt_fwd"};
    f.params = {{"BLOCK_M", {16, 32, 64, 128, 256}},
                {"BLOCK_N", {16, 32, 64, 128, 256}},
                {"TM", {1, 2, 4, 8, 16}},
                {"TN", {1, 2, 4, 8, 16}},
                {"KV_STAGES", {1, 2}}};
    f.head_dims = {32, 64, 96, 128};
    f.dtypes = {DType::fp32};
    f.default_config = {64, 32, 4, 4, 2};  // 128 threads; TC = 8 divides every supported d / 4
    f.traits = [](const Config& c, int d, bool causal, DType) {
      return "flashtune::Fa2SimtTraits<" +
             join_args({std::to_string(d), std::to_string(c[0]), std::to_string(c[1]), std::to_string(c[2]),
                        std::to_string(c[3]), std::to_string(c[4]), bool_arg(causal)}) +
             ">";
    };
    // The target's shared-memory limit is the compile stage's to apply, per arch.
    f.check = [](const Config& c, int d) { return fa2_simt_check(d, c[0], c[1], c[2], c[3], c[4], 1 << 30); };
    f.launches = [](const Config& c, const Problem& p) {
      return std::vector{make_launch(fa2_simt_grid(p.batch, p.heads, p.seq_q, c[0]),
                                     fa2_simt_threads(c[0], c[1], c[2], c[3]),
                                     fa2_simt_smem_bytes(p.head_dim, c[0], c[1], c[4]))};
    };
    fs.push_back(std::move(f));
  }
  {  // FlashAttention-2 backward on CUDA cores: preprocess (delta), dK/dV per K/V block, dQ.
    Family f;
    f.name = "fa2_simt_bwd";
    f.direction = "bwd";
    f.template_file = "fa2_simt_bwd.cuh";
    f.kernels = {"flashtune::fa2_simt_bwd_preprocess", "flashtune::fa2_simt_bwd_dkdv", "flashtune::fa2_simt_bwd_dq"};
    f.params = {{"BLOCK_M", {16, 32, 64, 128}},
                {"BLOCK_N", {16, 32, 64, 128}},
                {"TM", {1, 2, 4, 8}},
                {"TN", {1, 2, 4, 8}},
                {"DQ_MODE", {0, 1}}};  // 0: fp32 atomics into a workspace, 1: separate deterministic pass
    f.head_dims = {32, 64, 96, 128};
    f.dtypes = {DType::fp32};
    f.default_config = {32, 64, 4, 2, 1};  // deterministic; TC = 8 fits every head dim
    f.traits = [](const Config& c, int d, bool causal, DType) {
      return "flashtune::Fa2SimtBwdTraits<" +
             join_args({std::to_string(d), std::to_string(c[0]), std::to_string(c[1]), std::to_string(c[2]),
                        std::to_string(c[3]), std::to_string(c[4]), bool_arg(causal)}) +
             ">";
    };
    f.check = [](const Config& c, int d) { return fa2_simt_bwd_check(d, c[0], c[1], c[2], c[3], c[4]); };
    f.launches = [](const Config& c, const Problem& p) {
      const int bm = c[0], bn = c[1], tm = c[2], tn = c[3], mode = c[4], d = p.head_dim;
      auto grid = [&](auto fn) { return fn(p.batch, p.heads, p.seq_q, p.seq_k, bm, bn, tm, tn, mode); };
      return std::vector{
          make_launch(grid(fa2_simt_bwd_preprocess_grid), fa2_simt_bwd_preprocess_threads(bm, bn, tm, tn, mode),
                      fa2_simt_bwd_preprocess_smem_bytes(d, bm, bn, tm, tn, mode)),
          make_launch(grid(fa2_simt_bwd_dkdv_grid), fa2_simt_bwd_dkdv_threads(bm, bn, tm, tn, mode),
                      fa2_simt_bwd_dkdv_smem_bytes(d, bm, bn, tm, tn, mode)),
          make_launch(grid(fa2_simt_bwd_dq_grid), fa2_simt_bwd_dq_threads(bm, bn, tm, tn, mode),
                      fa2_simt_bwd_dq_smem_bytes(d, bm, bn, tm, tn, mode))};
    };
    fs.push_back(std::move(f));
  }
  {  // FlashAttention-2 forward on tensor cores (mma.sync m16n8k16), fp16 / bf16.
    Family f;
    f.name = "fa2_mma";
    f.direction = "fwd";
    f.template_file = "fa2_mma.cuh";
    f.kernels = {"flashtune::fa2_mma_fwd"};
    f.params = {{"BLOCK_M", {16, 32, 64, 128, 256}},
                {"BLOCK_N", {16, 32, 64, 128, 256}},
                {"WARPS", {1, 2, 4, 8}},
                {"STAGES", {1, 2, 3}}};
    f.head_dims = {32, 64, 96, 128, 192, 256};
    f.dtypes = {DType::fp16, DType::bf16};
    f.default_config = {64, 64, 4, 2};  // FlashAttention-2's d=256 tile: fits every head dim
    f.gqa = true;
    f.varlen = true;  // fa2_mma_fwd<Traits, true>
    f.traits = [](const Config& c, int d, bool causal, DType t) {
      return "flashtune::Fa2MmaTraits<" +
             join_args({std::to_string(d), std::to_string(c[0]), std::to_string(c[1]), std::to_string(c[2]),
                        std::to_string(c[3]), t == DType::bf16 ? "1" : "0", bool_arg(causal)}) +
             ">";
    };
    f.check = [](const Config& c, int d) { return fa2_mma_check(d, c[0], c[1], c[2], c[3]); };
    f.launches = [](const Config& c, const Problem& p) {
      return std::vector{make_launch(fa2_mma_grid(p.batch, p.heads, p.seq_q, c[0]), fa2_mma_threads(c[2]),
                                     fa2_mma_smem_bytes(p.head_dim, c[0], c[1], c[3]))};
    };
    fs.push_back(std::move(f));
  }
  {  // FlashAttention-2 backward on tensor cores, fp16 / bf16: preprocess, dK/dV, dQ.
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
    f.traits = [](const Config& c, int d, bool causal, DType t) {
      return "flashtune::Fa2MmaBwdTraits<" +
             join_args({std::to_string(d), std::to_string(c[0]), std::to_string(c[1]), std::to_string(c[2]),
                        std::to_string(c[3]), std::to_string(c[4]), std::to_string(c[5]),
                        t == DType::bf16 ? "1" : "0", bool_arg(causal)}) +
             ">";
    };
    f.check = [](const Config& c, int d) { return fa2_mma_bwd_check(d, c[0], c[1], c[2], c[3], c[4], c[5]); };
    f.launches = [](const Config& c, const Problem& p) {
      const int bm = c[0], bn = c[1], w = c[2], ds = c[3], st = c[4], mode = c[5], d = p.head_dim;
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
    fs.push_back(std::move(f));
  }
  {  // FlashAttention-2 backward on Hopper's wgmma (sm_90a), fp16 / bf16: fa2_mma_bwd's preprocess and
     // dQ conversion around a warpgroup dK/dV kernel (dQ by fp32 reductions).
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
                {"LOAD", {0, 1}}};
    f.head_dims = {32, 64, 96, 128, 192, 256};
    f.dtypes = {DType::fp16, DType::bf16};
    f.default_config = {64, 64, 2, 1, 0, 0};  // compiles spill-free for every head dim (SPLIT 1 is at 255 registers at d = 256)
    f.hopper_only = true;
    f.gqa = true;
    f.varlen = true;  // each kernel <Traits, true>
    f.traits = [](const Config& c, int d, bool causal, DType t) {
      return "flashtune::Fa2WgmmaBwdTraits<" +
             join_args({std::to_string(d), std::to_string(c[0]), std::to_string(c[1]), std::to_string(c[2]),
                        std::to_string(c[3]), std::to_string(c[4]), std::to_string(c[5]), t == DType::bf16 ? "1" : "0",
                        bool_arg(causal)}) +
             ">";
    };
    f.check = [](const Config& c, int d) { return fa2_wgmma_bwd_check(d, c[0], c[1], c[2], c[3], c[4], c[5]); };
    // The packed LOAD 1 (per-sequence tile images) once failed on the H100 (201 of 222 ragged runs): the
    // preprocess's Q/dO image stores ran past a short sequence's padding; fa2_wgmma_bwd_image_row guards them
    // (docs/kernels.md), and the GPU re-validated it (varlen_bwd_wgmma_validate.db).
    f.workspace_bytes = [](const Config& c, const Problem& p) {  // LOAD 1's images: per query head (packed: per sequence)
      if (p.varlen.enabled())
        return (size_t)fa2_wgmma_bwd_varlen_workspace_bytes(p.batch, p.heads, p.varlen.total_q(), p.head_dim, c[0], c[5]);
      return (size_t)fa2_wgmma_bwd_workspace_bytes(p.batch, p.heads, p.seq_q, p.head_dim, c[0], c[5]);
    };
    f.workspace_written = true;  // LOAD 1's images: the preprocess writes every padded row (zeros past seq_q)
    f.launches = [](const Config& c, const Problem& p) {
      const int bm = c[0], bn = c[1], sp = c[2], st = c[3], red = c[4], load = c[5], d = p.head_dim;
      // Per query head, but dK/dV per kv head (grouped-query attention sums over the group in the CTA).
      auto grid = [&](auto fn, int heads) { return fn(p.batch, heads, p.seq_q, p.seq_k, bm, bn, sp, st); };
      return std::vector{
          make_launch(grid(fa2_wgmma_bwd_preprocess_grid, p.heads), fa2_wgmma_bwd_preprocess_threads(bm, bn, sp, st),
                      fa2_wgmma_bwd_preprocess_smem_bytes(d, bm, bn, sp, st)),
          make_launch(grid(fa2_wgmma_bwd_dkdv_grid, p.kv_heads()), fa2_wgmma_bwd_dkdv_threads(bm, bn, sp, st),
                      fa2_wgmma_bwd_dkdv_smem_bytes(d, bm, bn, sp, st, red, load)),
          make_launch(grid(fa2_wgmma_bwd_dq_grid, p.heads), fa2_wgmma_bwd_dq_threads(bm, bn, sp, st),
                      fa2_wgmma_bwd_dq_smem_bytes(d, bm, bn, sp, st))};
    };
    fs.push_back(std::move(f));
  }
  {  // FlashAttention-3's forward design on Hopper (sm_90a), fp16 / bf16: TMA, mbarriers, a producer
     // warpgroup and 1-3 consumer warpgroups with register reallocation, wgmma for both GEMMs.
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
    f.varlen = true;  // fa3_wgmma_fwd<Traits, true>: packed tensor maps, guarded O stores at a sequence's end
    f.traits = [](const Config& c, int d, bool causal, DType t) {
      return "flashtune::Fa3WgmmaTraits<" +
             join_args({std::to_string(d), std::to_string(c[0]), std::to_string(c[1]), std::to_string(c[2]),
                        std::to_string(c[3]), std::to_string(c[4]), std::to_string(c[5]), std::to_string(c[6]),
                        std::to_string(c[7]), std::to_string(c[8]), t == DType::bf16 ? "1" : "0", bool_arg(causal)}) +
             ">";
    };
    f.check = [](const Config& c, int d) {
      return fa3_wgmma_check(d, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]);
    };
    f.causal_check = [](const Config& c, bool causal) { return fa3_wgmma_causal_check(c[8], causal); };
    f.varlen_check = [](const Config& c) -> const char* {
      return c[8] ? "MULTICAST is dense only (a packed batch's query blocks past a sequence's end leave their cluster)"
                  : nullptr;
    };
    f.launches = [](const Config& c, const Problem& p) {
      return std::vector{make_launch(fa3_wgmma_grid(p.batch, p.heads, p.seq_q, c[1], c[6], p.sm_count, c[7], c[8]),
                                     fa3_wgmma_threads(c[1]),
                                     fa3_wgmma_smem_bytes(p.head_dim, c[0], c[1], c[2], c[5], c[6], 1 + c[7]),
                                     fa3_wgmma_cluster(c[8]))};
    };
    f.tensor_maps = [](const Config& c, const Problem& p) {
      const int w = fa3_wgmma_group_cols(p.head_dim), sw = fa3_wgmma_swizzle_bytes(p.head_dim);
      return std::vector<TensorMapSpec>{{"q", fa3_wgmma_block_m(c[1]), w, sw},
                                        {"k", fa3_wgmma_kv_box_rows(c[0], c[8]), w, sw},
                                        {"v", fa3_wgmma_kv_box_rows(c[0], c[8]), w, sw},
                                        {"o", 64, w, sw}};
    };
    fs.push_back(std::move(f));
  }
  {  // FlashAttention-3's backward design on Hopper (sm_90a), fp16 / bf16: a producer warp (TMA), a dQ writer
     // warp (TMA reduce-add) and 1-3 consumer warpgroups of 64 keys each (wgmma for all five products).
    Family f;
    f.name = "fa3_wgmma_bwd";
    f.direction = "bwd";
    f.template_file = "fa3_wgmma_bwd.cuh";
    f.kernels = {"flashtune::fa3_wgmma_bwd_preprocess", "flashtune::fa3_wgmma_bwd_dkdv", "flashtune::fa3_wgmma_bwd_convert"};
    f.params = {{"BLOCK_M", {64, 128}},      // query rows per step (the scores' wgmma N)
                {"CONSUMERS", {1, 2, 3}},    // consumer warpgroups: BLOCK_N = 64 x CONSUMERS keys
                {"STAGES", {1, 2}},          // Q, dO, lse, delta slots in the TMA ring
                {"SCHED", {0, 1, 2}},        // 0: key blocks of a head together; 1: heaviest first (LPT); 2: 0, rotated
                {"DQ_OVERLAP", {0, 1}},      // 1: dQ issued with dK and staged while dK runs
                {"DQ_TURNS", {0, 1}}};       // 1: two consumers take turns at a step's whole dQ
    f.head_dims = {64, 96, 128};
    f.dtypes = {DType::fp16, DType::bf16};
    f.default_config = {64, 1, 2, 0, 0, 0};  // fits every head dim (d 96 compiles with one consumer only)
    f.hopper_only = true;
    f.gqa = true;
    struct Named {  // the config by name (the order of f.params)
      int block_m, consumers, stages, sched, dq_overlap, dq_turns;
      explicit Named(const Config& c)
          : block_m(c.at(0)), consumers(c.at(1)), stages(c.at(2)), sched(c.at(3)), dq_overlap(c.at(4)),
            dq_turns(c.at(5)) {}
    };
    f.traits = [](const Config& c, int d, bool causal, DType t) {
      const Named n(c);
      return "flashtune::Fa3WgmmaBwdTraits<" +
             join_args({std::to_string(d), std::to_string(n.block_m), std::to_string(n.consumers),
                        std::to_string(n.stages), std::to_string(n.sched), std::to_string(n.dq_overlap),
                        std::to_string(n.dq_turns), t == DType::bf16 ? "1" : "0",
                        bool_arg(causal)}) +
             ">";
    };
    f.check = [](const Config& c, int d) {
      const Named n(c);
      return fa3_bwd_check(d, n.block_m, n.consumers, n.stages, n.sched, n.dq_overlap, n.dq_turns);
    };
    f.workspace_bytes = [](const Config& c, const Problem& p) {
      return (size_t)fa3_bwd_workspace_bytes(p.batch, p.heads, p.seq_q, p.head_dim, Named(c).block_m);
    };
    f.workspace_written = true;  // the preprocess writes every padded row's lse2, delta and dq_accum
    f.launches = [](const Config& c, const Problem& p) {
      const Named n(c);
      return std::vector{
          make_launch(fa3_bwd_preprocess_grid(p.batch, p.heads, p.seq_q, n.block_m), kFa3BwdRowThreads, 0),
          make_launch(fa3_bwd_dkdv_grid(p.batch, p.kv_heads(), p.seq_k, n.consumers, n.sched),
                      fa3_bwd_threads(n.consumers), fa3_bwd_smem_bytes(p.head_dim, n.block_m, n.consumers, n.stages)),
          make_launch(fa3_bwd_convert_grid(p.batch, p.heads, p.seq_q), kFa3BwdRowThreads, 0)};
    };
    f.tensor_maps = [](const Config& c, const Problem& p) {
      const Named n(c);
      const int w = fa3_bwd_group_cols(p.head_dim), sw = fa3_bwd_swizzle_bytes(p.head_dim);
      const int bn = fa3_bwd_block_n(n.consumers);
      return std::vector<TensorMapSpec>{{"q", n.block_m, w, sw}, {"k", bn, w, sw}, {"v", bn, w, sw}, {"do", n.block_m, w, sw}};
    };
    fs.push_back(std::move(f));
  }
  {  // Split-KV forward for decoding (FlashDecoding), fp16 / bf16: per (split, row tile, kv head, batch) a
     // partial O and LSE, then a combine over the splits (not launched when SPLITS = 1).
    Family f;
    f.name = "decode_splitkv";
    f.direction = "fwd";
    f.template_file = "decode_splitkv.cuh";
    f.kernels = {"flashtune::decode_splitkv_partial", "flashtune::decode_splitkv_combine"};
    // SPLITS: key splits, CTAs per (row tile, kv head, batch); 9, 17, 33, 66 fill 132 SMs' last wave.
    f.params = {{"SPLITS", {1, 2, 4, 8, 9, 16, 17, 32, 33, 64, 66, 128}},
                {"BLOCK_N", {32, 64, 128, 256}},            // keys per step, BLOCK_N / WARPS per warp
                {"WARPS", {2, 4, 8}},
                {"STAGES", {1, 2}}};                        // K/V buffers: one K and one V, or a ring of two
    f.head_dims = {64, 128, 256};
    f.dtypes = {DType::fp16, DType::bf16};
    // 16 splits: 128 CTAs for one sequence of a Llama-3-like model (8 kv heads), about one per SM.
    f.default_config = {16, 64, 4, 2};
    f.gqa = true;
    f.paged = true;  // decode_splitkv_partial / _combine<Traits, true> on PagedParams
    f.paged_check = [](const Config& c, int page_size) { return decode_splitkv_paged_check(c[1], page_size); };
    // Decoding (Sq 1) and speculative decoding (a few draft tokens): up to 16 query rows per sequence,
    // the largest Sq of ragged_decode.json. Longer queries are prefill: fa2_mma's (BLOCK_M rows of a
    // head per CTA), not split K/V's, whose CTAs would each re-read K/V for 16 group rows.
    f.max_seq_q = 16;
    f.traits = [](const Config& c, int d, bool causal, DType t) {
      return "flashtune::DecodeSplitkvTraits<" +
             join_args({std::to_string(d), std::to_string(c[0]), std::to_string(c[1]), std::to_string(c[2]),
                        std::to_string(c[3]), t == DType::bf16 ? "1" : "0", bool_arg(causal)}) +
             ">";
    };
    f.check = [](const Config& c, int d) { return decode_splitkv_check(d, c[0], c[1], c[2], c[3]); };
    f.launches = [](const Config& c, const Problem& p) {
      const int splits = c[0], bn = c[1], warps = c[2], stages = c[3];
      std::vector<Launch> ls{make_launch(decode_splitkv_partial_grid(p.batch, p.heads, p.heads_k, p.seq_q, splits),
                                         decode_splitkv_threads(warps),
                                         decode_splitkv_smem_bytes(p.head_dim, bn, warps, stages))};
      if (splits > 1)  // one split writes O and LSE itself
        ls.push_back(make_launch(decode_splitkv_combine_grid(p.batch, p.heads, p.seq_q),
                                 decode_splitkv_combine_threads(), 0));
      return ls;
    };
    f.workspace_bytes = [](const Config& c, const Problem& p) {  // O_s and LSE_s per split, fp32
      const size_t splits = (size_t)c[0];
      return splits == 1 ? size_t{0}
                         : splits * (size_t)p.batch * (size_t)p.heads * (size_t)p.seq_q * ((size_t)p.head_dim + 1) * 4;
    };
    f.workspace_written = true;  // the partial kernel writes every split's O and LSE, empty splits included
    fs.push_back(std::move(f));
  }
  {  // Test only: MODE 0 computes attention correctly, 1 writes out of bounds, 2 never ends,
     // 3 skips a K/V block, 4 perturbs one output row (3 and 4: slightly wrong, must be invalid).
    Family f;
    f.name = "fault";
    f.direction = "fwd";
    f.template_file = "test_faults.cuh";
    f.kernels = {"flashtune::fault_fwd"};
    f.params = {{"MODE", {0, 1, 2, 3, 4}}};
    f.head_dims = {32, 64, 96, 128};
    f.dtypes = {DType::fp32, DType::fp16, DType::bf16};
    f.default_config = {0};
    f.test_only = true;
    f.traits = [](const Config& c, int d, bool causal, DType t) {
      const char* dt = t == DType::fp32 ? "0" : t == DType::fp16 ? "1" : "2";
      return "flashtune::FaultTraits<" + join_args({std::to_string(c[0]), std::to_string(d), bool_arg(causal), dt}) + ">";
    };
    f.check = [](const Config&, int) -> const char* { return nullptr; };
    f.launches = [](const Config&, const Problem& p) {
      return std::vector{make_launch(fault_grid(p.batch, p.heads, p.seq_q), kFaultThreads, 0)};
    };
    f.workspace_bytes = [](const Config&, const Problem&) { return size_t{4}; };  // the hang's flag
    fs.push_back(std::move(f));
  }
  return fs;
}

}  // namespace

std::string tensor_map_error(const TensorMapSpec& m, const Problem& p) {
  if (m.tensor != "q" && m.tensor != "k" && m.tensor != "v" && m.tensor != "o" && m.tensor != "do")
    return "tensor map of unknown tensor '" + brief(m.tensor) + "' (q, k, v, o or do)";
  if (dtype_bytes(p.dtype) != 2) return "tensor maps need a 16-bit dtype";
  if (m.swizzle_bytes != 32 && m.swizzle_bytes != 64 && m.swizzle_bytes != 128)
    return "tensor map swizzle must be 32, 64 or 128 bytes";
  if (m.box_rows < 1 || m.box_rows > 256) return "tensor map box rows must be in 1..256";
  if (m.box_cols < 8 || m.box_cols * 2 % 16 != 0 || m.box_cols * 2 > m.swizzle_bytes)
    return "tensor map box columns must be a multiple of 8 whose bytes fit the swizzle";
  // Rows are then whole boxes: a multiple of 16 bytes, as TMA's strides must be.
  if (p.head_dim % m.box_cols != 0) return "tensor map box columns must divide the head dim";
  return "";
}

const std::vector<Family>& families() {
  static const std::vector<Family> fs = make_families();
  return fs;
}

const Family* family_named(const std::string& name) {
  for (const auto& f : families())
    if (f.name == name) return &f;
  return nullptr;
}

const Family& find_family(const std::string& name) {
  if (const Family* f = family_named(name)) return *f;
  std::string known;
  for (const auto& f : families())
    if (!f.test_only) known += (known.empty() ? "" : ", ") + f.name;
  throw UsageError("unknown family '" + brief(name) + "' (known: " + known + ")");
}

std::string Family::shape_reason(const Problem& p) const {
  if (p.heads_k > 0 && !gqa) return "does not support grouped-query attention (heads_k)";
  if (p.varlen.enabled() && !varlen) return "does not support packed variable-length batches";
  if (p.paged.enabled() && !paged) return "does not read paged K/V caches";
  if (max_seq_q > 0 && p.seq_q > max_seq_q)
    return "serves Sq <= " + std::to_string(max_seq_q) + " (decoding), not Sq " + std::to_string(p.seq_q);
  return "";
}

std::string Family::config_string(const Config& c) const {
  std::string s;
  for (size_t i = 0; i < params.size() && i < c.size(); ++i)
    s += (i ? "," : "") + params[i].name + "=" + std::to_string(c[i]);
  return s;
}

Config Family::parse_config(const std::string& kv) const {
  Config c = default_config;
  std::vector<bool> seen(params.size(), false);
  for (const auto& item : split(kv, ',')) {
    auto parts = split(item, '=');
    if (parts.size() != 2) throw UsageError("parameter '" + brief(item) + "' is not K=V");
    const std::string key = trim(parts[0]), val = trim(parts[1]);
    auto it = std::find_if(params.begin(), params.end(), [&](const ParamSpec& p) { return p.name == key; });
    if (it == params.end()) throw UsageError("family " + name + " has no parameter '" + brief(key) + "'");
    size_t i = (size_t)(it - params.begin());
    if (seen[i]) throw UsageError("parameter " + key + " is given twice");
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(val.c_str(), &end, 10);
    if (val.empty() || *end || errno == ERANGE)
      throw UsageError("parameter " + key + " must be an integer, got '" + brief(val) + "'");
    // The whole value is compared, before any narrowing: 4294967360 is not 64.
    if (std::find(it->domain.begin(), it->domain.end(), v) == it->domain.end())
      throw UsageError("parameter " + key + " = " + brief(val) + " is outside its domain");
    c[i] = (int)v;
    seen[i] = true;
  }
  return c;
}

}  // namespace flashtune
