// The unfused baseline: scores materialised in global memory.
#include "templates/naive_traits.h"
#include "core/families/common.hpp"
#include "core/families/families.hpp"

namespace flashtune {

using family_parts::bool_arg;
using family_parts::join_args;
using family_parts::make_launch;

Family make_naive() {
  Family f;
  f.name = "naive";
  f.direction = "fwd";
  f.template_file = "naive.cuh";
  f.kernels = {"flashtune::naive_fwd"};
  f.params = {{"THREADS", {64, 128, 256, 512, 1024}}};
  f.head_dims = {32, 64, 96, 128};
  f.dtypes = {DType::fp32};
  f.default_config = {256};
  struct Named {  // the config by name (the order of f.params)
    int threads;
    explicit Named(const Config& c) : threads(c.at(0)) {}
  };
  f.traits = [](const Config& c, int d, bool causal, DType) {
    const Named n(c);
    return "flashtune::NaiveTraits<" + join_args({std::to_string(d), std::to_string(n.threads), bool_arg(causal)}) + ">";
  };
  f.check = [](const Config& c, int d) { return naive_check(d, Named(c).threads); };
  f.launches = [](const Config& c, const Problem& p) {
    const Named n(c);
    return std::vector{make_launch(naive_grid(p.batch, p.heads, p.seq_q), naive_threads(n.threads),
                                   naive_smem_bytes(p.head_dim, n.threads))};
  };
  f.workspace_bytes = [](const Config&, const Problem& p) {
    return 4 * (size_t)naive_workspace_floats(p.batch, p.heads, p.seq_q, p.seq_k);
  };
  return f;
}

}  // namespace flashtune
