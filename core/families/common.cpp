#include "core/families/common.hpp"

namespace flashtune::family_parts {

const char* bool_arg(bool b) { return b ? "true" : "false"; }

std::string join_args(std::initializer_list<std::string> args) {
  std::string s;
  for (const auto& a : args) s += (s.empty() ? "" : ",") + a;
  return s;
}

Launch make_launch(GridDims g, int threads, int smem, int cluster_x) {
  Launch l;
  l.grid[0] = (unsigned)g.x;
  l.grid[1] = (unsigned)g.y;
  l.grid[2] = (unsigned)g.z;
  l.threads = (unsigned)threads;
  l.smem_bytes = (unsigned)smem;
  l.cluster_x = (unsigned)cluster_x;
  return l;
}

}  // namespace flashtune::family_parts
