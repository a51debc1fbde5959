// FlashAttention-1 forward on CUDA cores: K/V blocks outer, O, m, l round-trip through global memory.
#include "templates/fa1_simt_traits.h"
#include "core/families/common.hpp"
#include "core/families/families.hpp"

namespace flashtune {

using family_parts::bool_arg;
using family_parts::join_args;
using family_parts::make_launch;

Family make_fa1_simt() {
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
  struct Named {  // the config by name (the order of f.params)
    int block_m, block_n, tm, tn, q_stages, q_split;
    explicit Named(const Config& c)
        : block_m(c.at(0)), block_n(c.at(1)), tm(c.at(2)), tn(c.at(3)), q_stages(c.at(4)), q_split(c.at(5)) {}
  };
  f.traits = [](const Config& c, int d, bool causal, DType) {
    const Named n(c);
    return "flashtune::Fa1SimtTraits<" +
           join_args({std::to_string(d), std::to_string(n.block_m), std::to_string(n.block_n), std::to_string(n.tm),
                      std::to_string(n.tn), std::to_string(n.q_stages), std::to_string(n.q_split), bool_arg(causal)}) +
           ">";
  };
  // The target's shared-memory limit is the compile stage's to apply, per arch.
  f.check = [](const Config& c, int d) {
    const Named n(c);
    return fa1_simt_check(d, n.block_m, n.block_n, n.tm, n.tn, n.q_stages, n.q_split, 1 << 30);
  };
  f.launches = [](const Config& c, const Problem& p) {
    const Named n(c);
    return std::vector{make_launch(fa1_simt_grid(p.batch, p.heads, p.seq_q, n.block_m, n.q_split),
                                   fa1_simt_threads(n.block_m, n.block_n, n.tm, n.tn),
                                   fa1_simt_smem_bytes(p.head_dim, n.block_m, n.block_n, n.q_stages))};
  };
  f.workspace_bytes = [](const Config&, const Problem& p) {  // running m and l
    return 4 * (size_t)fa1_simt_workspace_floats(p.batch, p.heads, p.seq_q);
  };
  return f;
}

}  // namespace flashtune
