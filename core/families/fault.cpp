// Test only: MODE 0 computes attention correctly, 1 writes out of bounds, 2 never ends,
// 3 skips a K/V block, 4 perturbs one output row (3 and 4: slightly wrong, must be invalid).
#include "templates/test_faults_traits.h"
#include "core/families/common.hpp"
#include "core/families/families.hpp"

namespace flashtune {

using family_parts::bool_arg;
using family_parts::join_args;
using family_parts::make_launch;

Family make_fault() {
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
  struct Named {  // the config by name (the order of f.params)
    int mode;
    explicit Named(const Config& c) : mode(c.at(0)) {}
  };
  f.traits = [](const Config& c, int d, bool causal, DType t) {
    const char* dt = t == DType::fp32 ? "0" : t == DType::fp16 ? "1" : "2";
    return "flashtune::FaultTraits<" +
           join_args({std::to_string(Named(c).mode), std::to_string(d), bool_arg(causal), dt}) + ">";
  };
  f.check = [](const Config&, int) -> const char* { return nullptr; };
  f.launches = [](const Config&, const Problem& p) {
    return std::vector{make_launch(fault_grid(p.batch, p.heads, p.seq_q), kFaultThreads, 0)};
  };
  f.workspace_bytes = [](const Config&, const Problem&) { return size_t{4}; };  // the hang's flag
  return f;
}

}  // namespace flashtune
