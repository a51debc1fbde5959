#include "strided_copy.hpp"

#include "core/compile.hpp"
#include "core/nvrtc_api.hpp"
#include "core/util.hpp"

namespace flashtune::rt {
namespace {
constexpr const char* kCopySource = R"cuda(
// Element i of contiguous [B, H, S, D] <-> element (b, h, s, c) of a strided tensor.
template <typename T>
__device__ void strided_copy(const T* __restrict__ src, T* __restrict__ dst, long long n, long long H, long long S,
                             long long D, long long s0, long long s1, long long s2, long long s3, int unpack) {
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const long long c = i % D, r = i / D, s = r % S, r2 = r / S, h = r2 % H, b = r2 / H;
    const long long off = b * s0 + h * s1 + s * s2 + c * s3;
    if (unpack) dst[off] = src[i];
    else dst[i] = src[off];
  }
}
extern "C" __global__ void ft_strided_copy_2(const unsigned short* src, unsigned short* dst, long long n, long long H,
    long long S, long long D, long long s0, long long s1, long long s2, long long s3, int unpack) {
  strided_copy(src, dst, n, H, S, D, s0, s1, s2, s3, unpack);
}
extern "C" __global__ void ft_strided_copy_4(const unsigned int* src, unsigned int* dst, long long n, long long H,
    long long S, long long D, long long s0, long long s1, long long s2, long long s3, int unpack) {
  strided_copy(src, dst, n, H, S, D, s0, s1, s2, s3, unpack);
}
)cuda";
}  // namespace

std::string copy_kernel_hash(const std::string& arch) {
  return content_hash(std::string(kCopySource) + '|' + arch + '|' + nvrtc_version());
}

std::string compile_copy_kernel(const std::string& arch, std::string* error) {
  const NvrtcApi& nv = nvrtc();
  nvrtcProgram prog;
  if (nv.CreateProgram(&prog, kCopySource, "flashtune_strided_copy.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) {
    *error = "nvrtcCreateProgram failed for the strided copy";
    return "";
  }
  const std::string opt = "--gpu-architecture=" + arch;
  const char* opts[] = {opt.c_str()};
  const nvrtcResult rc = nv.CompileProgram(prog, 1, opts);
  if (rc != NVRTC_SUCCESS) {
    nv.DestroyProgram(&prog);
    *error = std::string("the strided copy kernel: ") + nv.GetErrorString(rc);
    return "";
  }
  size_t n = 0;
  nv.GetCUBINSize(prog, &n);
  std::string cubin(n, '\0');
  nv.GetCUBIN(prog, cubin.data());
  nv.DestroyProgram(&prog);
  return cubin;
}

}  // namespace flashtune::rt
