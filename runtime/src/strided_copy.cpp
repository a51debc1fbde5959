#include "strided_copy.hpp"

#include "core/compile.hpp"
#include "core/nvrtc_api.hpp"
#include "core/util.hpp"

namespace flashtune::rt {
namespace {
constexpr const char* kCopySource = R"cuda(
// Element i of contiguous [B, H, S, D] <-> element (b, h, s, c) of a strided tensor (strides in elements).
// Where d is unit-stride and every row of both sides starts on 16 bytes, a thread moves 16 bytes (uint4) and
// splits its index in 32-bit arithmetic when the count allows: the element-wise form with four 64-bit
// divisions per 2-byte element ran at about an eighth of the copy bandwidth (73 us for 16.8 MB on an H200).
template <typename T, typename I>
__device__ void copy_elements(const T* __restrict__ src, T* __restrict__ dst, I n, I H, I S, I D, long long s0,
                              long long s1, long long s2, long long s3, int unpack) {
  const I step = (I)gridDim.x * blockDim.x;
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const I c = i % D, r = i / D, s = r % S, r2 = r / S, h = r2 % H, b = r2 / H;
    const long long off = (long long)b * s0 + (long long)h * s1 + (long long)s * s2 + (long long)c * s3;
    if (unpack) dst[off] = src[i];
    else dst[i] = src[off];
  }
}

template <typename T>
__device__ void strided_copy(const T* __restrict__ src, T* __restrict__ dst, long long n, long long H, long long S,
                             long long D, long long s0, long long s1, long long s2, long long s3, int unpack) {
  constexpr long long V = 16 / sizeof(T);  // elements per 16-byte access
  const bool vec = s3 == 1 && D % V == 0 && s0 % V == 0 && s1 % V == 0 && s2 % V == 0 &&
                   ((unsigned long long)src | (unsigned long long)dst) % 16 == 0;
  if (vec) {  // the same walk over 16-byte pieces: D / V pieces a row, strides in pieces
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    if (n / V < (1ll << 31))
      copy_elements<uint4, unsigned>(s, d, n / V, H, S, D / V, s0 / V, s1 / V, s2 / V, 1, unpack);
    else
      copy_elements<uint4, unsigned long long>(s, d, n / V, H, S, D / V, s0 / V, s1 / V, s2 / V, 1, unpack);
  } else if (n < (1ll << 31)) {
    copy_elements<T, unsigned>(src, dst, n, H, S, D, s0, s1, s2, s3, unpack);
  } else {
    copy_elements<T, unsigned long long>(src, dst, n, H, S, D, s0, s1, s2, s3, unpack);
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
