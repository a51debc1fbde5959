// Host conversions between float and the 16-bit storage formats the kernels read and write.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/problem.hpp"

namespace flashtune {

// Round to nearest even, as the device's cvt.rn does; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
inline float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// IEEE binary16 by hand, round to nearest even, for compilers without _Float16 on x86 (clang before 15: the
// sanitizer build); test_validate checks it against _Float16 where both exist.
inline uint16_t float_to_fp16_soft(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((x >> 13) & 0x1ffu);  // NaN, quiet
  if (x >= 0x477ff000u) return sign | 0x7c00u;                                  // 65520 and up round to inf
  if (x >= 0x38800000u)                                                          // a normal half: rebias, round
    return sign | (uint16_t)((x - 0x38000000u + 0xfffu + ((x >> 13) & 1u)) >> 13);
  if (x <= 0x33000000u) return sign;  // 2^-25 and below round to zero
  const uint32_t shift = 126 - (x >> 23), mant = (x & 0x7fffffu) | 0x800000u;  // a subnormal half: mant * 2^-24
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  r += rem > half || (rem == half && (r & 1u));
  return sign | (uint16_t)r;
}
inline float fp16_to_float_soft(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float f;
  if (e == 0 && m != 0) {  // subnormal
    f = (float)m * 0x1p-24f;
    return sign ? -f : f;
  }
  const uint32_t u = sign | (e == 0x1f ? 0x7f800000u | (m << 13) : e ? ((e + 112) << 23) | (m << 13) : 0u);
  std::memcpy(&f, &u, 4);
  return f;
}
#if defined(__FLT16_MAX__)  // _Float16 (GCC; clang 15 and newer)
inline uint16_t float_to_fp16(float f) {
  _Float16 h = (_Float16)f;  // IEEE binary16, round to nearest even
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
inline float fp16_to_float(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return (float)h;
}
#else
inline uint16_t float_to_fp16(float f) { return float_to_fp16_soft(f); }
inline float fp16_to_float(uint16_t u) { return fp16_to_float_soft(u); }
#endif

// The quiet NaN of each format: the poison outputs start as.
inline uint32_t nan_bits(DType t) { return t == DType::fp32 ? 0x7fc00000u : t == DType::fp16 ? 0x7e00u : 0x7fc0u; }

// Rounds `values` in place to what `t` can hold and returns the device bytes.
inline std::vector<uint8_t> to_device_format(std::vector<float>& values, DType t) {
  std::vector<uint8_t> bytes(values.size() * dtype_bytes(t));
  if (t == DType::fp32) {
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
  }
  auto* out = reinterpret_cast<uint16_t*>(bytes.data());
  for (size_t i = 0; i < values.size(); ++i) {
    out[i] = t == DType::bf16 ? float_to_bf16(values[i]) : float_to_fp16(values[i]);
    values[i] = t == DType::bf16 ? bf16_to_float(out[i]) : fp16_to_float(out[i]);
  }
  return bytes;
}

inline std::vector<float> from_device_format(const std::vector<uint8_t>& bytes, DType t) {
  std::vector<float> out(bytes.size() / dtype_bytes(t));
  if (t == DType::fp32) {
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
  auto* in = reinterpret_cast<const uint16_t*>(bytes.data());
  for (size_t i = 0; i < out.size(); ++i) out[i] = t == DType::bf16 ? bf16_to_float(in[i]) : fp16_to_float(in[i]);
  return out;
}

}  // namespace flashtune
