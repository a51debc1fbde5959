// Types and lookup for generated best-config tables (configs/generated/*.hpp).
// Plain constexpr C++17: usable by nvcc and host compilers, so that a build can turn a
// looked-up entry straight into template arguments:
//   constexpr auto e = flashtune::tuned::lookup("NVIDIA H100 80GB HBM3", "sm_90", "fa2_simt", "fwd", "fp32", 64, false, 4096);
//   using Traits = flashtune::Fa2SimtTraits<64, e.params[0], e.params[1], e.params[2], e.params[3], e.params[4], false>;
#pragma once

namespace flashtune {
namespace tuned {

inline constexpr int kMaxParams = 9;  // fa3_wgmma's

// One tuned choice: parameters positional, in the order the family's kParams lists them.
struct Entry {
  const char* family;
  const char* direction;
  const char* dtype;
  int head_dim;
  bool causal;
  int seq_max;  // the entry covers sequence lengths up to this bucket
  int params[kMaxParams];
  float tflops;  // what it measured (mean over the bucket's problems)
  // Measured on a paged K/V cache (the family's paged form): only a paged lookup takes it, and only where
  // the family's paged check accepts the call's page size. Last, so that every dense entry's initializer
  // leaves it out.
  bool paged = false;
  // The bucket's best bitwise-reproducible config (a backward whose gradients are equal bit for bit from run
  // to run): only a deterministic lookup takes it, and a deterministic lookup takes nothing else.
  bool deterministic = false;
};

struct Table {
  const char* device;  // "NVIDIA H100 80GB HBM3"
  const char* arch;    // "sm_90"
  const Entry* entries;
  int count;
};

enum class Source { device, arch, fallback };

struct Choice {
  Entry entry;
  Source source;
};

constexpr bool str_eq(const char* a, const char* b) {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}

// The entry for (family, direction, dtype, d, causal) whose bucket is the smallest that
// holds seq; past the largest bucket, the largest. nullptr when none matches. Dense entries unless
// `paged` (then the paged K/V cache entries only); the deterministic entries only when `deterministic`, else none.
constexpr const Entry* find_in(const Table& t, const char* family, const char* direction, const char* dtype,
                               int head_dim, bool causal, int seq, bool paged = false, bool deterministic = false) {
  const Entry* best = nullptr;
  const Entry* largest = nullptr;
  for (int i = 0; i < t.count; ++i) {
    const Entry& e = t.entries[i];
    if (!str_eq(e.family, family) || !str_eq(e.direction, direction) || !str_eq(e.dtype, dtype) ||
        e.head_dim != head_dim || e.causal != causal || e.paged != paged || e.deterministic != deterministic)
      continue;
    if (!largest || e.seq_max > largest->seq_max) largest = &e;
    if (e.seq_max >= seq && (!best || e.seq_max < best->seq_max)) best = &e;
  }
  return best ? best : largest;
}

}  // namespace tuned
}  // namespace flashtune
