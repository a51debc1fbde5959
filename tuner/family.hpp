// Kernel family descriptors: everything the tuner knows about a template, in one place.
// A family says which template file holds it, how a configuration becomes a kernel name
// expression, which configurations are impossible (and why), how to launch it, and its
// default configuration (the fixed table a tuner has to beat).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tuner/problem.hpp"

namespace flashtune {

// One tunable: its name as written in space files and its whole legal domain. Values
// from a space file are checked against the domain before they reach a name expression.
struct ParamSpec {
  std::string name;
  std::vector<int> domain;
};

using Config = std::vector<int>;  // values in the order of Family::params

struct Launch {
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 0;
  unsigned smem_bytes = 0;        // dynamic shared memory
  size_t workspace_bytes = 0;     // p.workspace, zero-filled by the worker
};

struct Family {
  std::string name;           // "fa2_simt"
  std::string direction;      // "fwd"
  std::string template_file;  // "fa2_simt.cuh"
  std::string kernel;         // "flashtune::fa2_simt_fwd"
  std::vector<ParamSpec> params;
  std::vector<int> head_dims;
  std::vector<DType> dtypes;
  Config default_config;      // valid for every supported head dim
  bool test_only = false;     // fault-injection families: never in default listings

  // "flashtune::Fa2SimtTraits<64,128,64,8,4,2,false>"
  std::function<std::string(const Config&, int head_dim, bool causal, DType)> traits;
  // nullptr when the combination is valid, else why not (the same conditions as the
  // traits' static_asserts, so NVRTC never sees an impossible variant).
  std::function<const char*(const Config&, int head_dim)> check;
  std::function<Launch(const Config&, const Problem&)> launch;

  std::string name_expression(const Config& c, int head_dim, bool causal, DType t) const {
    return "&" + kernel + "<" + traits(c, head_dim, causal, t) + ">";
  }
  std::string config_string(const Config& c) const;  // "BLOCK_M=128,BLOCK_N=64,..."
  Config parse_config(const std::string& kv) const;   // inverse; validated; throws UsageError
};

const std::vector<Family>& families();
const Family& find_family(const std::string& name);  // throws UsageError

}  // namespace flashtune
