// Validation: a kernel's outputs against the float64 reference, with bounds that scale with what each
// output sums. Pure host code (no CUDA): the worker gathers outputs and calls it; tests call it on CPU
// emulations of kernels (tests/test_validate.cpp).
//
// THE RULE. u = the unit roundoff of the kernel's dtype (fp32 2^-24, fp16 2^-11, bf16 2^-8), u32 = 2^-24.
// For each output element x with float64 reference r (reference/attention_ref.hpp computes M and L
// beside r):
//   |x - r| <= C * (u * M + u32 * g * M + u32 * L) + floor
//   forward O_ic:  M = sum_j P_ij |V_jc|,  L = sum_j P_ij Lambda_ij |V_jc - O_ic|,  g = sqrt(Sk) + sqrt(d)
//   forward LSE_i: u32 only (LSE is fp32 in every kernel): C u32 (g + L) + floor, L = sum_j P_ij Lambda_ij
//   backward dV, dK, dQ: M and L as in BwdMagnitudes (dV: sum_i P_ij |dO_ic|; dQ: scale sum_j P_ij
//     (||dO_i|| ||V_j|| + ||dO_i|| ||O_i||) |K_jc|; dK likewise with Q), g = sqrt(max(Sq, Sk)) + sqrt(d)
//   with Lambda_ij = 3 (|s_ij| + |LSE_i|) + sqrt(d) scale ||q_i|| ||k_j||, C = 4 forward, 8 backward, and
//   floor = C * eta * n * max|x|: eta is the absolute error of a P or dS that falls below the normal
//   range -- fp32's smallest normal 2^-126 for fp32 and bf16 (the kernels' fp32 exp and products
//   flush to zero: measured on an H100, x30 inputs put dK entries of 1e-37 to 1e-35 at 0 or a few
//   percent off), half of fp16's subnormal spacing 2^-25 for fp16 -- n the number of such terms an
//   output sums and x what they multiply (O: Sk, V; dV: Sq, dO; dK: Sq, scale Q (1 + 2^-126 / eta
//   2 d max|dO| max|V|); dQ: Sk, scale K (likewise): a P flushed in fp32 takes dP - delta with it). It matters in
//   fp16 (P < 6e-5 is subnormal there); in fp32/bf16 it is < 1e-30, so a zero reference with zero
//   magnitude (a fully masked row) must still be met exactly.
// A non-finite reference (+inf LSE of a fully masked row) must be matched exactly; a non-finite output
// fails; O (and dQ, dK, dV) must be written everywhere (the NaN poison, checked over every element).
// Backward is checked element by element over every element of every head, like the forward.
//
// WHY A CORRECT KERNEL PASSES. Each output is a sum of terms a_j b_j (O = sum_j P_ij V_jc, dV, and the
// dS-weighted sums of dQ, dK); M bounds sum_j |a_j b_j|, L their sensitivity to a relative error of P.
//  - P rounded to 16 bits before P V (and dS before dS K, dS^T Q; P before P^T dO): a relative error
//    <= u per term, so <= u * M in total; the output's own rounding to the dtype adds <= u |r| <= u M;
//    delta = rowsum(dO * O) from O rounded to the dtype adds u ||dO|| ||O|| inside dQ's and dK's M.
//    At most 2u M forward and 4u M backward from the format: C = 4 / 8 leave a factor 2 beyond the
//    worst case (not the typical one: the errors are random, a sqrt(n) walk and not n).
//  - fp32 accumulation (blocks of keys with online-softmax rescaling, split dQ atomics in any order,
//    fp32 dot products of length d): u32 times the partial sums, a random walk of length <= n + d
//    whose partial sums stay <= M: u32 * g * M with g = sqrt(n) + sqrt(d).
//  - the exponent: the kernel's fp32 s_ij * scale * log2(e) - m (or - lse) is off from the exact one
//    by u32 * (3 (|s| + |lse|) + the dot's sum_c |q_c k_c| sqrt(d) scale) = u32 * Lambda_ij (three
//    fp32 roundings of s and of lse in the log2 domain: constant, product, lse itself), a relative
//    error of P_ij; through the normalisation it cancels except for the spread, hence |V_jc - O_ic| in
//    L: a near one-hot softmax (inputs x30, scores in the thousands) has L ~ 0 on its winning key.
//    ex2.approx / lg2.approx add 2 ulp (2^-22): inside u32 * g * M (g >= 2).
//  - a softcap c (issue 32): the kernels' tanh.approx (relative error <= 2^-10.987) moves P's exponent by up to
//    kTanhUnits u32 |c tanh(s / c)|, a term of Lambda, and the backward's derivative 1 - t^2 by up to
//    2 t^2 kTanhUnits u32 relative to P (dP - delta), the T term of dk_logit and dq_logit (attention_ref.hpp);
//    the derivative is <= 1, so M (P w |K|, P w |Q|) still bounds what dK and dQ sum. A window only removes terms.
//  - Sk = 1: dQ = dK = 0 exactly, but a kernel computes dP - delta = dO.V - dO.O with O = V in fp32 and
//    gets rounding noise; M (||dO|| (||V|| + ||O||) |K|) is not 0 there, so the noise passes, where a
//    relative L2 error divided by ||dQ|| = 0. Zero references with M = 0 (fully masked rows, zero V)
//    are exact in a correct kernel; the floor only absorbs subnormal rounding of P and dS (fp16).
// Assumed: outputs within the format's range (fp16: |x| < 65504).
//
// WHY A BUG FAILS. A bug that drops or double-counts a key block, masks wrongly or mis-indexes moves an
// output by a sizeable fraction of its M (a K/V block of 64 keys out of Sk <= a few thousand carries
// ~64/Sk of the mass, and with a near one-hot softmax all of it on the rows whose winner it holds); the
// bound is C u M: 1.6% of M in bf16, 0.2% in fp16, ~1e-5 in fp32 (g M u32 C). tests/test_validate.cpp
// emulates a correct kernel (P rounded before P V, fp32 accumulation in 64-key blocks with online
// rescaling, output rounded) and checks that it passes with margin on unit, x30 and heavy-tailed
// inputs and Sk = 1, and that the same emulation with one K/V block skipped, or one row moved by 5% of
// its magnitude, fails in every dtype; the `fault` family's MODE 3 and 4 do the same on a GPU.
//
// MEASURED. experiments/tolerance_probe.py measures torch's flash and cuDNN kernels against float64
// (reports/nvidia-h200/tolerance_probe.csv, under the previous fixed atol + rtol |ref| rule, of which
// their worst error used <= 20% in bf16 and 11% in fp16); on x30 inputs torch flash's bf16 max-abs was
// 0.255 (and ours 0.27) on outputs of magnitude ~100, i.e. ~0.7 u M, against a bound of 4 u M. The
// ratio err / bound is stored per result (detail.worst_err_over_bound) so that the margin is measured
// on every run.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/problem.hpp"
#include "reference/attention_ref.hpp"

namespace flashtune {

constexpr double kFp32Roundoff = 0x1p-24;
constexpr double kFwdSafety = 4;  // C forward: twice the worst case of the format's two roundings
constexpr double kBwdSafety = 8;  // C backward: twice the worst case of its four

double unit_roundoff(DType);  // fp32 2^-24, fp16 2^-11, bf16 2^-8

// The bound of one element: C * (u * mag + u32 * growth * mag + u32 * logit) + floor.
struct ToleranceModel {
  double c, u, growth, floor;
  double bound(double mag, double logit) const {
    return c * (u * mag + kFp32Roundoff * (growth * mag + logit)) + floor;
  }
};
// The absolute error of a P or dS that underflows: fp32's smallest normal 2^-126 (the kernels' fp32
// math flushes to zero; bf16 shares fp32's exponent range), fp16 half its subnormal spacing 2^-25.
double subnormal_rounding(DType);
// floor_scale: n * max|x| of the floor above (0 gives the bare subnormal rounding eta).
ToleranceModel forward_tolerance(DType, int seq_k, int head_dim, double floor_scale = 0);
ToleranceModel backward_tolerance(DType, int seq_q, int seq_k, int head_dim, double floor_scale = 0);
// Reporting only: max_rel = |err| / max(|ref|, report_floor) (the former atol: 1e-5, 2e-3, 1e-2),
// so that stored max_rel values stay comparable with earlier ones and with experiments/baselines.py.
double report_floor(DType);

// Error statistics over checked elements, with the first five mismatches.
struct ErrorStats {
  double max_abs = 0, max_rel = 0, sum_sq = 0, sum_abs = 0, worst_ratio = 0;  // worst |err| / bound
  size_t count = 0, bad = 0;
  std::string first_bad;  // "[i] got .. want .. (bound ..)", up to 5
  double mse() const { return count ? sum_sq / count : 0; }
  double mean_abs() const { return count ? sum_abs / count : 0; }
  // One element against its bound; rel_floor only for max_rel.
  void add(size_t index, double got, double want, double bound, double rel_floor);
  // Folds in the stats of the elements after this one's (a later chunk of the same output).
  void merge(const ErrorStats& later);
};

// `shape` with the problem's window and softcap (ref::Shape's window_left/right, softcap): every reference the
// worker builds from a problem goes through it, so that no modification is left out of one.
ref::Shape with_modifications(ref::Shape shape, const Problem&);
ref::VarlenShape with_modifications(ref::VarlenShape shape, const Problem&);

// ALiBi's slopes for generated inputs (Problem::alibi): `count` floats, entry x the slope of distinct query head
// x % period of a problem with `heads` query heads, u = x % period: FlashAttention's geometric slope of head u % heads,
// 2^(-8 (u % heads + 1) / heads), doubled when u / heads is odd (so that per-batch slopes, [B, H] with stride H, are
// exercised). The kernel reads them as [B, H] (count B*H, stride H); where the worker tiles `period` distinct heads
// over the B*H (dense forward and backward) the reference's distinct heads read the first `period` of them, the same
// numbers.
std::vector<float> seeded_alibi_slopes(long long count, int heads, long long period);
// A packed backward's slopes (Problem::alibi, Problem::varlen) as the kernel reads them, [B, H] with stride H like the
// packed forward's, for generated inputs that repeat `distinct_heads` query heads inside every token: sequence b's
// head h has the packed forward's slope (seeded_alibi_slopes(B*H, H, B*H)) of sequence b's head h % distinct_heads,
// so every sequence has its own (doubled in odd sequences) and a head the slope of the distinct head whose data it
// holds. varlen_backward_reference reads the same buffer with stride H: the first distinct_heads of each sequence's.
std::vector<float> varlen_backward_alibi_slopes(const Problem& p, int distinct_heads);

// Forward reference on sampled rows, with the magnitudes the bound needs.
struct FwdReference {
  ref::Shape shape{1, 1, 1, 1, 1};
  std::vector<int64_t> rows;  // flat (b*H + h)*Sq + i; varlen: t*H + h (token t, query head h)
  std::vector<int64_t> lse_index;  // varlen: each row's LSE entry h*total_q + t (empty: the row itself)
  std::vector<double> o, o_mag, o_logit;  // rows x d
  std::vector<double> lse, lse_mag;       // rows
  double max_abs_v = 0;                   // the floor's max|x|
};
FwdReference forward_reference(const ref::Shape&, const float* q, const float* k, const float* v,
                               std::vector<int64_t> rows, int threads = 0);

// Generated forward inputs at scale (the worker's prepare_fwd): a unit is a kv head with its group of g
// query heads (one query head when multi-head), and the inputs hold `units` distinct ones, tiled over the
// problem's B*Hk: kv head i (flat b*Hk + h) holds distinct unit i % units, query head j (flat b*H + h)
// distinct query head j % (units*g), as the backward tiles its heads. All B*Hk units while a tensor of
// them stays within max_elements per tensor (2^30: 6 GiB of floats and 16-bit bytes), so every shape up
// to Llama-3 decoding at B = 8, Sk = 128k keeps distinct heads throughout; past it, as many as fit (B = 64,
// Sk = 128k: 64 of 512, instead of 103 GB of host inputs), at least one. Up to Sk*d = 2^27 at Hk = 8
// (Sk = 1M at d = 128) that is Hk or more, so the kv heads of a sequence all differ: a kernel reading the
// wrong head of its batch, or the wrong query head of a group, fails.
inline constexpr int64_t kMaxFwdDistinctElements = int64_t{1} << 30;
int forward_distinct_units(const Problem& p, int64_t max_elements = kMaxFwdDistinctElements);
// The reference of the full problem (`full`) on its flat rows `rows`, from inputs holding `units`
// distinct units as above: each row is computed once from its distinct row (the same numbers
// forward_reference gives on the tiled tensors, which are never built).
FwdReference tiled_forward_reference(const ref::Shape& full, int units, const float* q, const float* k, const float* v,
                                     std::vector<int64_t> rows, int threads = 0);

// A paged K/V cache (Problem::paged): the reference reads the logical K/V, laid out as a dense problem's
// generated inputs (units distinct units tiled over the B*Hk kv heads, as above, each (Sk, d) with Sk the
// longest cache length), and sequence b attends its first len_b keys only (causal: bottom-right aligned to
// len_b). Each row is the dense reference of its sequence alone with Sk = len_b, bit for bit; when every
// sequence is Sk long, tiled_forward_reference's, bit for bit. A sequence without keys: O = 0, LSE = +inf.
FwdReference paged_forward_reference(const Problem&, int units, const float* q, const float* k, const float* v,
                                     std::vector<int64_t> rows, int threads = 0);

// Backward reference of `heads` distinct heads (shape.batch * shape.heads of them), every element,
// with the forward's O and LSE (the backward kernel's inputs) and the magnitudes.
struct BwdReference {
  ref::Shape shape{1, 1, 1, 1, 1};
  // Varlen: elements per token in the kernel's tensors (H*d for dQ, Hk*d for dK, dV) and in the
  // reference's (its distinct heads' H'*d, Hk'*d): element (t, h, c) is reference element (t, h % H', c).
  // 0 (dense): element i is reference element i % size.
  size_t q_row = 0, q_row_ref = 0, k_row = 0, k_row_ref = 0;
  std::vector<double> o, lse;  // (heads, Sq, d), (heads, Sq); varlen (total_q, H', d), (H', total_q)
  std::vector<double> dq, dk, dv, dq_mag, dq_logit, dk_mag, dk_logit, dv_mag, dv_logit;
  double max_abs_q = 0, max_abs_k = 0, max_abs_do = 0, max_abs_v = 0;  // the floors' max|x|
};
BwdReference backward_reference(const ref::Shape&, const float* q, const float* k, const float* v,
                                const float* dout, int threads = 0);

// Packed variable-length batches (Problem::varlen). The kernel's tensors are token-major: O row r = t*H + h
// (token t, query head h) holds elements r*d .. r*d + d - 1, its LSE entry is h*total_q + t.
// varlen_sample_rows: every row when total_q*H <= max_rows; else max_rows of them, sorted and unique,
// deterministic in seed: per sequence (in order, while the fixed set fits), its first, middle and last
// token of heads 0, H - 1 and one that moves with the sequence -- the rows next to another sequence's,
// where a wrong offset shows first -- then seeded random rows.
std::vector<int64_t> varlen_sample_rows(const Problem&, int64_t max_rows, uint64_t seed);
// The reference on those rows, from the packed q, k, v: each (sequence, head)'s rows by the dense
// forward_rows on that sequence alone, which is what ref::forward_varlen computes, bit for bit.
// alibi_slopes (Problem::alibi): [B, H] with stride H, sequence b's head h at b * H + h.
FwdReference varlen_forward_reference(const Problem&, const float* q, const float* k, const float* v,
                                      std::vector<int64_t> rows, int threads = 0, const float* alibi_slopes = nullptr);
// Every element of a packed batch's backward for `heads` query heads and `kv_heads` kv heads per token
// (the distinct heads of the generated inputs; the problem's heads repeat them, query head h holding
// distinct head h % heads), with the forward's O (total_q, heads, d) and LSE (heads, total_q).
// alibi_slopes (Problem::alibi): sequence b's distinct head h at alibi_slopes[b * alibi_batch_stride + h]; stride 0
// is [heads] for every sequence, the runner's is varlen_backward_alibi_slopes' [B, H] with stride H.
BwdReference varlen_backward_reference(const Problem&, int heads, int kv_heads, const float* q, const float* k,
                                       const float* v, const float* dout, int threads = 0,
                                       const float* alibi_slopes = nullptr, int64_t alibi_batch_stride = 0);

// An output as read back from the device: `size` elements of `dtype` at `data` (fp32, or the 16-bit
// formats' bytes), compared without a float copy. A std::vector<float> converts to an fp32 view of itself.
struct OutputTensor {
  const void* data = nullptr;
  size_t size = 0;
  DType dtype = DType::fp32;
  OutputTensor() = default;
  OutputTensor(const void* data_, size_t size_, DType dtype_) : data(data_), size(size_), dtype(dtype_) {}
  OutputTensor(const std::vector<float>& v) : data(v.data()), size(v.size()), dtype(DType::fp32) {}  // NOLINT: implicit
  float at(size_t i) const;  // element i as a float (exact: every 16-bit value is one)
};

// The bound of every reference element of a backward's dQ, dK and dV (ToleranceModel::bound of its
// magnitudes), computed once per problem: every evaluation's outputs are compared against the same ones.
struct BwdBounds {
  std::vector<double> dq, dk, dv;
};
BwdBounds backward_bounds(const Problem&, const BwdReference&);

// The backward compares its outputs in chunks of this many elements (on up to `threads` threads, 0: every
// core); each chunk's sums (mse, mean_abs, the relative L2 errors) are added in element order, and the
// chunks' in chunk order: the same bits whatever the thread count. (Until issue 33 a tensor was cut into one
// chunk per core: rows stored then may differ from a rerun's in those sums' last bits; verdicts, maxima,
// counts and messages do not.)
inline constexpr size_t kCompareChunk = size_t{1} << 20;

struct Verdict {
  bool ok = true;
  std::string error;  // one line when !ok
  double max_abs = 0, max_rel = 0, mse = 0, mean_abs = 0, worst_ratio = 0;
  nlohmann::json detail = nlohmann::json::object();
};

// o: every output row (B*H*Sq*d, as read back), lse: B*H*Sq (fp32); checked on ref.rows; every O and LSE
// element is scanned for the NaN poison (and O for any non-finite value), on up to `threads` threads.
Verdict validate_forward(const Problem&, const FwdReference&, OutputTensor o, OutputTensor lse, int threads = 0);
// dq, dk, dv of all B*H heads; head h holds the data of reference head h % (ref heads). Every element is
// compared: one that is finite and within its bound is counted inline with ErrorStats::add's arithmetic, any
// other goes through add itself, so the verdict, statistics and messages are add's.
Verdict validate_backward(const Problem&, const BwdReference&, const BwdBounds&, OutputTensor dq, OutputTensor dk,
                          OutputTensor dv, int threads = 0);
// The same with the bounds computed for this call.
Verdict validate_backward(const Problem&, const BwdReference&, OutputTensor dq, OutputTensor dk, OutputTensor dv,
                          int threads = 0);

// The verdict into a worker result: status ("invalid" when not ok), error, max_abs, max_rel, mse,
// mean_abs (non-finite values as 1e30) and detail (merged into out["detail"]).
void write_verdict(const Verdict&, nlohmann::json& out);

}  // namespace flashtune
