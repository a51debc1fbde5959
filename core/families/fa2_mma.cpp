// FlashAttention-2 forward on tensor cores (mma.sync m16n8k16), fp16 / bf16; sliding window, softcap and ALiBi as
// compile-time variants (issue 32: the forward that runs them on sm_80 and every GPU that is not Hopper).
#include "templates/fa2_mma_traits.h"
#include "core/families/common.hpp"
#include "core/families/families.hpp"

namespace flashtune {

using family_parts::bool_arg;
using family_parts::join_args;
using family_parts::make_launch;

Family make_fa2_mma() {
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
  f.mods = kModWindow | kModSoftcap | kModAlibi;  // fa2_mma_fwd<AttnModTraits<Traits, W, S, A>[, true]> on ModParams
  struct Named {  // the config by name (the order of f.params)
    int block_m, block_n, warps, stages;
    explicit Named(const Config& c) : block_m(c.at(0)), block_n(c.at(1)), warps(c.at(2)), stages(c.at(3)) {}
  };
  f.traits = [](const Config& c, int d, bool causal, DType t) {
    const Named n(c);
    return "flashtune::Fa2MmaTraits<" +
           join_args({std::to_string(d), std::to_string(n.block_m), std::to_string(n.block_n),
                      std::to_string(n.warps), std::to_string(n.stages), t == DType::bf16 ? "1" : "0",
                      bool_arg(causal)}) +
           ">";
  };
  f.check = [](const Config& c, int d) {
    const Named n(c);
    return fa2_mma_check(d, n.block_m, n.block_n, n.warps, n.stages);
  };
  f.launches = [](const Config& c, const Problem& p) {
    const Named n(c);
    return std::vector{make_launch(fa2_mma_grid(p.batch, p.heads, p.seq_q, n.block_m), fa2_mma_threads(n.warps),
                                   fa2_mma_smem_bytes(p.head_dim, n.block_m, n.block_n, n.stages))};
  };
  return f;
}

}  // namespace flashtune
