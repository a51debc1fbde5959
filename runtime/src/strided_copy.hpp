// The strided-copy kernels that pack arguments in other layouts into contiguous scratch and unpack
// outputs back. Their source lives here (not in templates/) so that it stays out of the families'
// compile-cache hash; the runtime NVRTCs it once per arch, and an AOT build embeds it.
#pragma once
#include <string>
#include <vector>

namespace flashtune::rt {

// The kernels' names, in the order the runtime takes them: 2-byte elements, then 4-byte ones.
inline const std::vector<std::string>& copy_kernel_names() {
  static const std::vector<std::string> names = {"ft_strided_copy_2", "ft_strided_copy_4"};
  return names;
}
// The cache key: the source, the arch and NVRTC's version.
std::string copy_kernel_hash(const std::string& arch);
// NVRTC for `arch`: the cubin, or "" with the reason in *error.
std::string compile_copy_kernel(const std::string& arch, std::string* error);

}  // namespace flashtune::rt
