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
  // Batch x kv heads (heads_k, or heads for multi-head) of the problem the entry was tuned on: a decoding
  // family's second key (its split of the keys depends on how many (sequence, kv head) pairs fill the GPU).
  // 0: the entry serves every batch and head count (every other family's entries, and tables emitted before
  // this key). Last, so that older initializers leave it out.
  int batch_heads = 0;
  // Query heads per kv head of the grouped-query problems the entry was tuned on (> 1), or 0: tuned on multi-head
  // problems, serving every call (every entry of tables emitted before this key). A grouped-query call takes the
  // entries of its own group where the table has any, else the multi-head ones. Last, as batch_heads.
  int group = 0;
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

// Whether batch x kv heads `a` is nearer `want` than `b` is: by ratio (|log2(a / want)| against |log2(b / want)|,
// compared in integers), a tie to the smaller. All three positive and below 2^31.
constexpr bool nearer_batch_heads(long long want, long long a, long long b) {
  const long long ra_num = a > want ? a : want, ra_den = a > want ? want : a;  // ratio a/want >= 1
  const long long rb_num = b > want ? b : want, rb_den = b > want ? want : b;
  const long long lhs = ra_num * rb_den, rhs = rb_num * ra_den;
  return lhs < rhs || (lhs == rhs && a < b);
}

// find_in among the entries of one group class (Entry::group == group).
constexpr const Entry* find_in_group(const Table& t, const char* family, const char* direction, const char* dtype,
                                     int head_dim, bool causal, int seq, bool paged, bool deterministic,
                                     long long batch_heads, int group) {
  const long long want = batch_heads > 0 ? (batch_heads < 2147483647LL ? batch_heads : 2147483647LL) : 1;
  int keyed = 0;  // the nearest batch x kv heads seen so far; 0: no entry keyed by it yet
  const Entry* best = nullptr;      // of the entries of `keyed`: the smallest bucket that holds seq
  const Entry* largest = nullptr;   //                            and the largest bucket
  const Entry* best0 = nullptr;     // the same of the entries that serve every batch
  const Entry* largest0 = nullptr;
  for (int i = 0; i < t.count; ++i) {  // one pass: the class changes only to a nearer one
    const Entry& e = t.entries[i];
    if (!str_eq(e.family, family) || !str_eq(e.direction, direction) || !str_eq(e.dtype, dtype) ||
        e.head_dim != head_dim || e.causal != causal || e.paged != paged || e.deterministic != deterministic ||
        e.group != group)
      continue;
    const Entry** b = &best0;
    const Entry** l = &largest0;
    if (e.batch_heads > 0) {
      if (keyed == 0 || (e.batch_heads != keyed && nearer_batch_heads(want, e.batch_heads, keyed))) {
        keyed = e.batch_heads;
        best = largest = nullptr;
      }
      if (e.batch_heads != keyed) continue;
      b = &best, l = &largest;
    }
    if (!*l || e.seq_max > (*l)->seq_max) *l = &e;
    if (e.seq_max >= seq && (!*b || e.seq_max < (*b)->seq_max)) *b = &e;
  }
  if (keyed) return best ? best : largest;
  return best0 ? best0 : largest0;
}

// The entry for (family, direction, dtype, d, causal): a grouped-query call's (`group` query heads per kv head, > 1)
// among the entries tuned on that group where there are any, else among the multi-head ones (Entry::group 0); of
// those, the entries keyed by batch x kv heads (a decoding family's, Entry::batch_heads > 0) of the value nearest
// `batch_heads` by ratio (a tie to the smaller; 0 or less: unknown, taken as 1), else those that serve every batch;
// of them, the one whose bucket is the smallest that holds seq, past the largest bucket the largest. nullptr when
// none matches. Dense entries unless `paged` (then the paged K/V cache entries only); the deterministic entries
// only when `deterministic`, else none.
constexpr const Entry* find_in(const Table& t, const char* family, const char* direction, const char* dtype,
                               int head_dim, bool causal, int seq, bool paged = false, bool deterministic = false,
                               long long batch_heads = 0, int group = 0) {
  if (group > 1)
    if (const Entry* e = find_in_group(t, family, direction, dtype, head_dim, causal, seq, paged, deterministic,
                                       batch_heads, group))
      return e;
  return find_in_group(t, family, direction, dtype, head_dim, causal, seq, paged, deterministic, batch_heads, 0);
}

}  // namespace tuned
}  // namespace flashtune
