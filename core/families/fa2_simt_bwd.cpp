// FlashAttention-2 backward on CUDA cores: preprocess (delta), dK/dV per K/V block, dQ.
#include "templates/fa2_simt_bwd_traits.h"
#include "core/families/common.hpp"
#include "core/families/families.hpp"

namespace flashtune {

using family_parts::bool_arg;
using family_parts::join_args;
using family_parts::make_launch;

Family make_fa2_simt_bwd() {
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
  struct Named {  // the config by name (the order of f.params)
    int block_m, block_n, tm, tn, dq_mode;
    explicit Named(const Config& c)
        : block_m(c.at(0)), block_n(c.at(1)), tm(c.at(2)), tn(c.at(3)), dq_mode(c.at(4)) {}
  };
  f.reproducible = [](const Config& c) { return Named(c).dq_mode == 1; };  // the dQ pass adds in a fixed order
  f.traits = [](const Config& c, int d, bool causal, DType) {
    const Named n(c);
    return "flashtune::Fa2SimtBwdTraits<" +
           join_args({std::to_string(d), std::to_string(n.block_m), std::to_string(n.block_n), std::to_string(n.tm),
                      std::to_string(n.tn), std::to_string(n.dq_mode), bool_arg(causal)}) +
           ">";
  };
  f.check = [](const Config& c, int d) {
    const Named n(c);
    return fa2_simt_bwd_check(d, n.block_m, n.block_n, n.tm, n.tn, n.dq_mode);
  };
  f.launches = [](const Config& c, const Problem& p) {
    const Named n(c);
    const int bm = n.block_m, bn = n.block_n, tm = n.tm, tn = n.tn, mode = n.dq_mode, d = p.head_dim;
    auto grid = [&](auto fn) { return fn(p.batch, p.heads, p.seq_q, p.seq_k, bm, bn, tm, tn, mode); };
    return std::vector{
        make_launch(grid(fa2_simt_bwd_preprocess_grid), fa2_simt_bwd_preprocess_threads(bm, bn, tm, tn, mode),
                    fa2_simt_bwd_preprocess_smem_bytes(d, bm, bn, tm, tn, mode)),
        make_launch(grid(fa2_simt_bwd_dkdv_grid), fa2_simt_bwd_dkdv_threads(bm, bn, tm, tn, mode),
                    fa2_simt_bwd_dkdv_smem_bytes(d, bm, bn, tm, tn, mode)),
        make_launch(grid(fa2_simt_bwd_dq_grid), fa2_simt_bwd_dq_threads(bm, bn, tm, tn, mode),
                    fa2_simt_bwd_dq_smem_bytes(d, bm, bn, tm, tn, mode))};
  };
  return f;
}

}  // namespace flashtune
