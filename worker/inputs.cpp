#include "worker/inputs.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/dtype_convert.hpp"

namespace flashtune {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double normal_at(uint64_t seed, uint64_t i) {
  const uint64_t a = splitmix64(seed ^ (2 * i)), b = splitmix64(seed ^ (2 * i + 1));
  const double u1 = ((a >> 11) + 0.5) * 0x1.0p-53, u2 = (b >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double heavy_at(uint64_t seed, uint64_t i) {
  const uint64_t chi_stream = splitmix64(seed ^ 0x6865617679ull);  // "heavy"
  double chi2 = 0;
  for (uint64_t n = 0; n < 3; ++n) {
    const double z = normal_at(chi_stream, 3 * i + n);
    chi2 += z * z;
  }
  const double t = normal_at(seed, i) / std::sqrt(std::max(chi2, 1e-300) / 3.0);
  return std::clamp(t, -kHeavyClamp, kHeavyClamp);
}

HostTensor generated_input(size_t n, uint64_t stream, DType t, const InputDist& dist, int threads) {
  HostTensor h;
  h.values.resize(n);
  h.bytes.resize(n * (size_t)dtype_bytes(t));
  // Element i, as to_device_format rounds it: the bytes, and the float they hold. Captured by value: with
  // the tensor and the distribution read through references into this frame, 2 threads took longer than 1
  // (1.25 s against 1.0 s for 33.5 M elements on a 2-core VM; by value 0.55 s).
  float* values = h.values.data();
  uint16_t* half = reinterpret_cast<uint16_t*>(h.bytes.data());
  const bool heavy = dist.kind == InputDist::Kind::heavy;
  const double scale = dist.scale;
  auto fill = [=](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float x = (float)(scale * (heavy ? heavy_at(stream, i) : normal_at(stream, i)));
      if (t == DType::fp32) {
        values[i] = x;
      } else {
        half[i] = t == DType::bf16 ? float_to_bf16(x) : float_to_fp16(x);
        values[i] = t == DType::bf16 ? bf16_to_float(half[i]) : fp16_to_float(half[i]);
      }
    }
  };
  // Contiguous chunks, each thread taking the next: no two threads write one cache line (a stride of the
  // thread count did, on every element).
  constexpr size_t kChunk = size_t{1} << 16;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  const size_t workers =
      std::min(chunks, threads > 0 ? (size_t)threads : (size_t)std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t c = next++; c < chunks; c = next++) fill(c * kChunk, std::min(n, (c + 1) * kChunk));
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (t == DType::fp32) std::memcpy(h.bytes.data(), h.values.data(), h.bytes.size());
  return h;
}

HostTensor loaded_input(const std::string& dir, const InputFile& f, DType t) {
  HostTensor h;
  h.bytes = read_input_file(dir, f);
  h.values = from_device_format(h.bytes, t);
  return h;
}

}  // namespace flashtune
