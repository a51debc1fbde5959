// FlashAttention-2 forward on CUDA cores.
#include "templates/fa2_simt_traits.h"
#include "core/families/common.hpp"
#include "core/families/families.hpp"

namespace flashtune {

using family_parts::bool_arg;
using family_parts::join_args;
using family_parts::make_launch;

Family make_fa2_simt() {
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
  struct Named {  // the config by name (the order of f.params)
    int block_m, block_n, tm, tn, kv_stages;
    explicit Named(const Config& c)
        : block_m(c.at(0)), block_n(c.at(1)), tm(c.at(2)), tn(c.at(3)), kv_stages(c.at(4)) {}
  };
  f.traits = [](const Config& c, int d, bool causal, DType) {
    const Named n(c);
    return "flashtune::Fa2SimtTraits<" +
           join_args({std::to_string(d), std::to_string(n.block_m), std::to_string(n.block_n), std::to_string(n.tm),
                      std::to_string(n.tn), std::to_string(n.kv_stages), bool_arg(causal)}) +
           ">";
  };
  // The target's shared-memory limit is the compile stage's to apply, per arch.
  f.check = [](const Config& c, int d) {
    const Named n(c);
    return fa2_simt_check(d, n.block_m, n.block_n, n.tm, n.tn, n.kv_stages, 1 << 30);
  };
  f.launches = [](const Config& c, const Problem& p) {
    const Named n(c);
    return std::vector{make_launch(fa2_simt_grid(p.batch, p.heads, p.seq_q, n.block_m),
                                   fa2_simt_threads(n.block_m, n.block_n, n.tm, n.tn),
                                   fa2_simt_smem_bytes(p.head_dim, n.block_m, n.block_n, n.kv_stages))};
  };
  return f;
}

}  // namespace flashtune
