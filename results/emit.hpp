// Emission: per-GPU best-config headers plus one dispatch header (device -> arch -> default),
// regenerated from the store; a do-not-edit banner names the command that made them.
#pragma once
#include <string>
#include <vector>

#include "results/select.hpp"

namespace flashtune {

struct EmitResult {
  std::vector<std::string> written;  // paths
  int entries = 0;
};

// Writes <out>/<arch>_<device-slug>.hpp for every device in `choices`, then <out>/dispatch.hpp
// over every per-GPU header present in <out> (so headers of other GPUs stay reachable).
// `inputs` (the store) are never written over. Refused (UsageError) before anything is written: a
// target that is not a regular file or is a per-GPU header of another device with the same name.
EmitResult emit_headers(const std::vector<BucketChoice>& choices, const std::string& out_dir,
                        const std::string& command_line, const std::vector<std::string>& inputs = {});

std::string header_name(const std::string& arch, const std::string& device);  // "sm90_nvidia_h100.hpp"

}  // namespace flashtune
