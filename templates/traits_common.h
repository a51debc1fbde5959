// Shared by every *_traits.h: plain C++ usable from the host tuner (g++ -std=c++20,
// no CUDA headers) and from device code (NVRTC, nvcc). No device code in here.
#pragma once

#ifndef FT_HD
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FT_HD __host__ __device__
#else
#define FT_HD
#endif
#endif

namespace flashtune {

// Launch grid in plain ints (dim3 is a CUDA type; the host converts).
struct GridDims {
  int x;
  int y;
  int z;
};

FT_HD constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Largest dynamic shared memory one block may opt into (cudaFuncAttributeMaxDynamicSharedMemorySize).
constexpr int kMaxSmemBytesSm90 = 227 * 1024;  // 232448
constexpr int kMaxSmemBytesSm80 = 163 * 1024;  // 166912

// Score modifications (issue 32) as compile-time switches: a family that has them (Family::mods) is instantiated
// on AttnModTraits<Traits, WINDOW, SOFTCAP, ALIBI[, MASK]> for a problem with a window, a softcap, ALiBi or a
// mask_mod, its plain kernels on Traits itself, whose code and names stay what they were. ModsOf<T> reads the
// switches of either (false for a plain traits struct, which does not declare them). The kernel's argument is then
// ModParams, or MaskModParams with a mask_mod (attention_params.h).
// MASK is a type: void, or the user's predicate wrapped as `struct MaskMod_<hash>` (mask_mod.h; the generated
// source defines it before the family's template), whose test(args, b, h, q_idx, kv_idx) says whether query q_idx
// sees key kv_idx.
template <class Base, bool WINDOW, bool SOFTCAP, bool ALIBI = false, class MASK = void>
struct AttnModTraits : Base {
  static constexpr bool kModWindow = WINDOW;    // sliding window: key blocks outside skipped, edges masked
  static constexpr bool kModSoftcap = SOFTCAP;  // logit softcap: s -> c tanh(s / c) before the softmax
  static constexpr bool kModAlibi = ALIBI;      // ALiBi: s -> s - slope |i + Sk - Sq - j| (after any softcap)
  using MaskMod = MASK;                         // mask_mod: the predicate (void: none)
};
// A traits struct's mask_mod: MaskOf<T>::type the predicate (void: none), MaskOf<T>::on() whether there is one.
// Functions, not static data members (PagesOf's reason): NVRTC emitted such a member of ModsOf as a variable of the
// cubin, and the plain kernels' .nv.info moved with it.
template <class M>
struct MaskModOn {
  FT_HD static constexpr bool on() { return true; }
};
template <>
struct MaskModOn<void> {
  FT_HD static constexpr bool on() { return false; }
};
template <class T, class = void>
struct MaskOf {
  using type = void;
  FT_HD static constexpr bool on() { return false; }
};
template <class T>
struct MaskOf<T, decltype(void(static_cast<typename T::MaskMod*>(nullptr)))> {
  using type = typename T::MaskMod;
  FT_HD static constexpr bool on() { return MaskModOn<type>::on(); }
};
template <class T, class = void>
struct ModsOf {
  static constexpr bool window = false, softcap = false, alibi = false, any = false;
};
template <class T>
struct ModsOf<T, decltype(void(T::kModWindow))> {
  static constexpr bool window = T::kModWindow, softcap = T::kModSoftcap, alibi = T::kModAlibi,
                        any = T::kModWindow || T::kModSoftcap || T::kModAlibi || MaskOf<T>::on();
};

// A sliding window as a band around the bottom-right diagonal (issue 32; attention_params.h's AttnMods): query i
// sees key j iff i + lo <= j <= i + hi, lo = seq_k - seq_q - window_left, hi = seq_k - seq_q + window_right, an
// unbounded edge (-1) kWindowFar away, causal capping hi at the diagonal. No int overflow: edges are at most 2^30
// (check_window_edge), rows and keys below 2^20, so every sum below stays within +-(2^30 + 2^22).
// The one place a window's rows and keys are paired: fa3_wgmma's key-block span, fa3_wgmma_bwd's query-block walk
// and its dQ turns all read it, so that they agree on which blocks meet.
constexpr int kWindowFar = (1 << 30) + (1 << 21);
struct IndexRange {
  int first, end;  // [first, end); empty when end <= first
  FT_HD constexpr bool empty() const { return end <= first; }
};
struct WindowBand {
  int lo, hi;
  // The keys that rows [r0, r1) see together (r1 > r0, r1 <= seq_q), within [0, seq_k).
  FT_HD constexpr IndexRange keys_of_rows(int r0, int r1, int seq_k) const {
    return IndexRange{0 > r0 + lo ? 0 : r0 + lo, seq_k < r1 + hi ? seq_k : r1 + hi};
  }
  // The rows that see some key of [k0, k1) (k1 > k0, k1 <= seq_k), within [0, seq_q).
  FT_HD constexpr IndexRange rows_of_keys(int k0, int k1, int seq_q) const {
    return IndexRange{0 > k0 - hi ? 0 : k0 - hi, seq_q < k1 - lo ? seq_q : k1 - lo};
  }
};
FT_HD constexpr WindowBand window_band(int window_left, int window_right, bool causal, int seq_q, int seq_k) {
  const int diag = seq_k - seq_q;
  const int lo = window_left >= 0 ? diag - window_left : -kWindowFar;
  const int hi = window_right >= 0 ? diag + window_right : kWindowFar;
  return WindowBand{lo, causal && !(hi < diag) ? diag : hi};
}

// The deterministic backward's dQ order (fa3_wgmma_bwd and fa2_wgmma_bwd, DETERMINISTIC 1 and 2). Key block j sees
// query block m iff its first visible block, max(0, j BN - (Sk - Sq)) / BM, is at most m: x = (m + 1) BM + Sk - Sq
// > j BN. That grows with j, so m's contributors are the key blocks 0 .. J(m) (bottom-right causal mask or none,
// Sq <= Sk or not, each query head of a group apart): J(m), or -1 when none does. (32-bit: x is below Sk + BM,
// and the runtime caps a sequence far below 2^31; fa3_wgmma_bwd's dQ writer that computes it has 24 registers.)
FT_HD constexpr int bwd_dq_last_key_block(int m, int BM, int BN, int seq_q, int seq_k) {
  const int x = (m + 1) * BM + (seq_k - seq_q);
  if (x <= 0) return -1;
  const int j = (x - 1) / BN, last = (seq_k > 0 ? seq_k - 1 : 0) / BN;
  return j < last ? j : last;
}
// Key block j's turn at query block m: order 1 ascending (j), 2 descending (J(m) - j: the diagonal block first).
FT_HD constexpr int bwd_dq_turn(int order, int j, int m, int BM, int BN, int seq_q, int seq_k) {
  return order == 2 ? bwd_dq_last_key_block(m, BM, BN, seq_q, seq_k) - j : j;
}

// The backward dK/dV grids' SCHED 3 (fa3_wgmma_bwd and fa2_wgmma_bwd): (kv head, batch) pairs in groups, every
// pair's key block j of a group before any pair's j + 1. The L2 share: the Q and dO bytes of the pairs whose CTAs
// run side by side. A third of the H100's 50 MB (the H200 has 60): dq_accum's rows of the same pairs, as many fp32
// bytes again, pass through L2 by the dQ reduce-adds beside them.
constexpr long long kBwdPairGroupL2Bytes = 16LL << 20;
// The group: how many pairs (a kv head of a sequence: q_per_kv query heads of seq_q rows of Q and dO) fit
// kBwdPairGroupL2Bytes, at least 1 and at most every pair.
FT_HD constexpr int bwd_pair_group(int pairs, int q_per_kv, int seq_q, int D) {
  const long long per_pair = 4LL * (q_per_kv > 0 ? q_per_kv : 1) * (seq_q > 0 ? seq_q : 1) * D;
  const long long g = kBwdPairGroupL2Bytes / per_pair;
  return pairs < 1 ? 1 : g < 1 ? 1 : g > pairs ? pairs : static_cast<int>(g);
}
// The pair (kv head fastest: kv head = pair % kv heads, batch = pair / kv heads) of the CTA at grid x, z, in groups
// of gx pairs (gridDim.x). The kernels and the tests read this one mapping.
FT_HD constexpr int bwd_grouped_pair(int x, int z, int gx) { return z * gx + x; }

}  // namespace flashtune
