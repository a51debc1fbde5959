// Host conversions between float and the 16-bit storage formats the kernels read and write.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "tuner/problem.hpp"

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
