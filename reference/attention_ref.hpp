// CPU float64 reference for scaled-dot-product attention (FlashAttention semantics).
//
// Used to validate GPU kernels: inputs are the same float buffers the kernel saw,
// every sum and exp is done in double, so the reference error is negligible next
// to the kernel's (bf16/fp16 inputs, fp32 accumulation).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace flashtune::ref {

struct Shape {
  int batch, heads, seq_q, seq_k, head_dim;
  bool causal = false;
  double scale = 0;  // <= 0 means 1/sqrt(head_dim)
  // K/V heads, for grouped-query attention (GQA; 1 is multi-query, MQA). 0 means heads (plain
  // multi-head); otherwise heads must be a multiple of it. Query head h reads kv head kv_head_of(h).
  int heads_k = 0;
  // Sliding window (FlashAttention's window_size, bottom-right aligned like causal): query i sees key j iff
  // j >= i + (Sk - Sq) - window_left and j <= i + (Sk - Sq) + window_right; -1 is unbounded. With causal
  // both apply (causal is the right edge 0).
  int window_left = -1, window_right = -1;
  // Logit softcapping: the scaled score s becomes softcap * tanh(s / softcap) before the softmax; 0 is off.
  double softcap = 0;
  // ALiBi (FlashAttention's alibi_slopes): the (capped) scaled score of query i and key j of query head h in batch b
  // gets the bias -slope |i + Sk - Sq - j|, slope = alibi_slopes[b * alibi_batch_stride + h] (the caller's floats,
  // which must outlive the call; stride 0: one slope per head, H: per batch and head); nullptr is none.
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0;
  // An explicit mask (a mask_mod's, materialised: the reference cannot run the predicate's C++ text): query i of
  // query head h in batch b sees key j only where mask[b * mask_batch_stride + h * mask_head_stride + i * Sk + j] != 0,
  // ANDed with causal and the window (the caller's bytes, which must outlive the call; a stride 0 broadcasts: one
  // [Sq, Sk] mask for every batch entry or head). nullptr: none. Masked pairs are in no sum (P = 0, no Lambda term);
  // a row it leaves without keys gives O = 0, lse = +inf as causal's.
  const uint8_t* mask = nullptr;
  int64_t mask_batch_stride = 0, mask_head_stride = 0;

  double softmax_scale() const;
  // Whether the explicit mask lets (flat (b, h) pair bh, query i) see key j: true without one.
  bool allowed(int64_t bh, int64_t i, int64_t j) const {
    return !mask || mask[(bh / heads) * mask_batch_stride + (bh % heads) * mask_head_stride + i * seq_k + j] != 0;
  }
  // ALiBi's bias of (flat (b, h) pair bh, query i, key j): 0 without slopes.
  double alibi_bias(int64_t bh, int64_t i, int64_t j) const;
  int kv_heads() const;          // heads_k, or heads when it is 0
  int group_size() const;        // query heads per kv head: heads / kv_heads()
  int kv_head_of(int h) const;   // h / group_size()
  int64_t q_rows() const;        // B*H*Sq: rows of Q and O, entries of lse
  int64_t q_elements() const;    // B*H*Sq*d: Q, O, dO, dQ
  int64_t kv_elements() const;   // B*Hk*Sk*d: K, V, dK, dV
};

// Error magnitudes: beside each output, what it sums, so that a tolerance can scale with the problem
// (worker/validate.hpp states the rule they feed). P_ij are the float64 probabilities, s_ij the scaled
// scores (before any softcap), and
//   Lambda_ij = 3 (|s_ij| + |lse_i|) + sqrt(d) * scale * ||q_i||_2 ||k_j||_2  [+ kTanhUnits |c_ij|]
//               [+ kAlibiRoundings |b_ij|]
// bounds, in units of fp32's unit roundoff, how far a kernel's fp32 exponent of P_ij can be from
// s_ij - lse_i (fp32 dot product of length d; up to three fp32 roundings of s and of lse: the
// scale * log2(e) constant, its product, lse rounded to fp32 and times log2(e)). Cauchy-Schwarz (sum_c |q_c k_c| <= ||q|| ||k||) keeps it O(1) per (i, j).
// With a softcap c the kernel's exponent is c tanh(s / c): the terms above still bound what the dot product and
// the roundings contribute (tanh' <= 1, |c tanh(s / c)| <= |s|), and the bracketed term adds the error of a fast
// tanh (tanh.approx.f32: relative error at most 2^-10.987, PTX ISA) on the capped score c_ij = c tanh(s_ij / c),
// in units of fp32's roundoff: kTanhUnits = 2^-10.9 / 2^-24.
// With ALiBi the exponent is s_ij (or c_ij) + b_ij, b_ij = -slope |i + Sk - Sq - j|: a kernel forms b_ij in fp32 from
// the slope times 1/scale (or 1/c: two roundings, the host's constant and the product), times the distance (one;
// the distance itself is exact), adds it to the score (one, relative to |s + b| <= |s| + |b|) and multiplies the sum
// by the exp2-domain constant (one more on |b|, whose rounding the |s| term counts for s alone): kAlibiRoundings
// (6, two to spare) |b_ij|. lse_i includes b, and so does its term. A large |b_ij| has P_ij = e^{-|b_ij|}-small unless
// every key of the row is as far (Sq > Sk, or a window away from the diagonal), when the row's error is honestly
// that of fp32 logits of that size.
// Forward, per output row i (nullptr members are not computed):
//   o_mag[i,c]   = sum_j P_ij |V_jc|                           what O_ic sums
//   o_logit[i,c] = sum_j P_ij Lambda_ij |V_jc - O_ic|         O's sensitivity to relative errors of P
//   lse_mag[i]   = sum_j P_ij Lambda_ij                        LSE's sensitivity to them
// A fully masked row has all three 0.
inline constexpr double kTanhUnits = 8780.0;  // 2^13.1: tanh.approx.f32's relative error over fp32's unit roundoff
inline constexpr double kAlibiRoundings = 6;   // fp32 roundings of ALiBi's bias in a kernel's exponent, with margin

struct FwdMagnitudes {
  double* o_mag = nullptr;    // like o
  double* o_logit = nullptr;  // like o
  double* lse_mag = nullptr;  // like lse
};

// Backward, with w_ij = ||dO_i|| ||V_j|| + ||dO_i|| ||O_i||  (>= |dP_ij| + |delta_i|, and >= what the
// products dO.V and dO.O sum) and dS_ij = P_ij (dP_ij - delta_i) (times t'_ij with a softcap, below):
//   dv_mag[j,c] = sum_i P_ij |dO_ic|             dv_logit[j,c] = sum_i P_ij Lambda_ij |dO_ic|
//   dk_mag[j,c] = scale sum_i P_ij w_ij |Q_ic|   dk_logit[j,c] = scale sum_i (Lambda_ij |dS_ij| + T_ij) |Q_ic|
//   dq_mag[i,c] = scale sum_j P_ij w_ij |K_jc|   dq_logit[i,c] = scale sum_j (Lambda_ij |dS_ij| + T_ij) |K_jc|
// Masked pairs (causal, the window) have P_ij = 0 and are in no sum. With a softcap c the gradient passes through
// c tanh(s / c): dS_ij = P_ij (dP_ij - delta_i) t'_ij with t'_ij = 1 - tanh^2(s_ij / c), in [0, 1], so that
// |dS_ij| <= P_ij w_ij still and the *_mag sums still bound what dK and dQ sum (and their 16-bit roundings);
// P_ij's exponent is the capped score, whose fast tanh Lambda_ij counts. A kernel's t'_ij comes from the same
// fast tanh t (1 + e), |e| <= kTanhUnits u32: 1 - t^2 (1 + e)^2 is off by 2 t^2 |e| + t^2 e^2, a relative error of
// dS that 1 - t^2 does not bound (near saturation t' -> 0), so it enters as its own term in units of u32:
//   T_ij = kTanhUnits 2 tanh^2(s_ij / c) |P_ij (dP_ij - delta_i)|   (0 without a softcap; the e^2 term is below
//                                                                      u32 g M).
// Every array is shaped like its gradient; a nullptr member is not computed (all or none per gradient).
// Under GQA a kv head's dk_* and dv_* are the sums of the per-query-head quantities over its group,
// as its dK and dV are.
struct BwdMagnitudes {
  double *dq_mag = nullptr, *dq_logit = nullptr;
  double *dk_mag = nullptr, *dk_logit = nullptr;
  double *dv_mag = nullptr, *dv_logit = nullptr;
};

// All tensors contiguous row-major; inputs float, outputs double. Q, O, dO, dQ are (B, H, Sq, d);
// K, V, dK, dV are (B, Hk, Sk, d) with Hk = shape.kv_heads(). lse is (B, H, Sq), natural log.
// Query head h of batch b attends kv head shape.kv_head_of(h) of batch b.
// Causal mask is bottom-right aligned (FlashAttention >= 2.1):
//   query i may attend key j iff j <= i + (seq_k - seq_q).
// A window (Shape::window_left/right) cuts each row's keys to a range around the same diagonal, a softcap
// maps the scaled scores through c tanh(s / c) before the softmax, and ALiBi's bias is added after it (the LSE
// includes it; the backward's P too, its dS formula unchanged: the bias does not depend on Q or K).
// A fully masked row (possible when Sq > Sk, or under a window) gives O row = 0 and lse = +infinity,
// so that a backward's exp(s - lse) is 0 for it.
// threads = 0 means std::thread::hardware_concurrency(). Results are bit-identical
// for any thread count.
void forward(const Shape& shape, const float* q, const float* k, const float* v,
             double* o, double* lse, int threads = 0, const FwdMagnitudes& mag = {});

// Forward for selected rows only. rows are flat indices into (B*H*Sq):
//   row r -> b = r / (H*Sq), h = (r / Sq) % H, i = r % Sq.
// o is rows.size() x d, lse is rows.size(). Each output equals, bit for bit, the
// matching row of forward(). Cost is rows.size() * Sk * d.
void forward_rows(const Shape& shape, const float* q, const float* k, const float* v,
                  std::span<const int64_t> rows, double* o, double* lse, int threads = 0,
                  const FwdMagnitudes& mag = {});

// Backward: given dO (B, H, Sq, d) computes dQ (B, H, Sq, d), dK and dV (B, Hk, Sk, d),
// recomputing P in float64. dq, dk, dv are overwritten (not accumulated into).
// The window and the softcap as in forward(): masked pairs contribute nothing (a fully masked row gets dQ = 0
// and adds nothing to dK, dV; a key no query sees gets dK = dV = 0), and the softcap's derivative
// 1 - tanh^2(s / c) multiplies dS = P (dP - delta) before the scale (dQ = scale sum_j dS_ij k_j).
// Under GQA a kv head's dK and dV are the sums of its group's per-query-head gradients, added in
// group order (0 + head 0 + head 1 + ...): bit for bit the group sums, in that order, of MHA's dK
// and dV on K and V repeated over the group. dQ equals MHA's bit for bit.
void backward(const Shape& shape, const float* q, const float* k, const float* v,
              const float* dout, double* dq, double* dk, double* dv, int threads = 0,
              const BwdMagnitudes& mag = {});

// Number of keys query i may attend (keys [0, n) are visible): Sk, or under the causal mask
// clamp(i + Sk - Sq + 1, 0, Sk). The window's edges are not in it: visible_range.
int64_t visible_keys(const Shape& shape, int64_t i);
// The keys query i attends, [first, end) (first == end: none), causal and the window together.
struct KeySpan {
  int64_t first, end;
};
KeySpan visible_range(const Shape& shape, int64_t i);
// The queries that see key j, [first, end) (first == end: none): the transpose of visible_range.
KeySpan visible_queries(const Shape& shape, int64_t j);

// ---------------------------------------------------------------------------------------------
// Packed variable-length batches (FlashAttention's varlen layout).
//
// Heads and softmax settings of a packed batch; the number of sequences and their lengths come
// from the offsets. Members mean what Shape's do.
struct VarlenShape {
  int heads, head_dim;
  bool causal = false;
  double scale = 0;
  int heads_k = 0;
  int window_left = -1, window_right = -1;  // as Shape's, aligned to each sequence's own lengths
  double softcap = 0;
  // As Shape's, sequence b's slopes at alibi_slopes + b * alibi_batch_stride (FlashAttention's varlen convention).
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0;

  int kv_heads() const;  // heads_k, or heads when it is 0
};

// Sequence b owns the query tokens [cu_seqlens_q[b], cu_seqlens_q[b+1]) and the key tokens
// [cu_seqlens_k[b], cu_seqlens_k[b+1]). Both offset arrays have batch + 1 entries, start at 0
// and never decrease (else std::invalid_argument); a sequence may have no queries or no keys.
// Tensors are token-major with heads inside: Q, O, dO, dQ are (total_q, H, d), K, V, dK, dV are
// (total_k, Hk, d), lse is (H, total_q), where total_q = cu_seqlens_q[batch], total_k likewise.
// Each sequence is attended on its own, exactly as forward()/backward() on that sequence alone
// (bit for bit): causal is bottom-right aligned to its own lengths, query i of sequence b may
// attend key j iff j <= i + (len_k_b - len_q_b); a query row with no visible key (len_k_b = 0
// included) gives O = 0 and lse = +inf; keys of a sequence without queries get dK = dV = 0.
// Magnitudes are optional as for the dense calls, each array laid out like its tensor
// (o_*, dq_*: (total_q, H, d); lse_mag: (H, total_q); dk_*, dv_*: (total_k, Hk, d)).
void forward_varlen(const VarlenShape& shape, std::span<const int32_t> cu_seqlens_q,
                    std::span<const int32_t> cu_seqlens_k, const float* q, const float* k,
                    const float* v, double* o, double* lse, int threads = 0,
                    const FwdMagnitudes& mag = {});

void backward_varlen(const VarlenShape& shape, std::span<const int32_t> cu_seqlens_q,
                     std::span<const int32_t> cu_seqlens_k, const float* q, const float* k,
                     const float* v, const float* dout, double* dq, double* dk, double* dv,
                     int threads = 0, const BwdMagnitudes& mag = {});

// ---------------------------------------------------------------------------------------------
// Split-KV (FlashAttention's decoding path): each split attends a range of the keys, and a
// combine merges the splits' outputs.
//
// Forward over the keys [key_begin, key_end) only, 0 <= key_begin <= key_end <= Sk (else
// std::invalid_argument); the causal mask is still that of the whole (Sq, Sk) problem. o and lse
// are shaped as in forward() and hold the split's normalised O_s and its LSE_s (softmax over the
// split's visible keys). A row that sees no key of the range (an empty split) gets O_s = 0 and
// LSE_s = -inf, FlashAttention's split convention: log of an empty sum, weight exp(-inf) = 0.
void forward_split(const Shape& shape, const float* q, const float* k, const float* v,
                   int64_t key_begin, int64_t key_end, double* o, double* lse, int threads = 0);

// Merges n_splits splits' outputs into forward()'s O and lse: per row
//   LSE = log(sum_s exp(LSE_s)),  O = sum_s exp(LSE_s - LSE) O_s,
// summed in split order, over the splits that are not empty (LSE_s = -inf; +inf, the dense rule
// for a fully masked row, is read as empty too). A row with every split empty gets O = 0 and
// lse = +inf, as forward() gives a fully masked row.
// o_splits is (n_splits, B, H, Sq, d) and lse_splits (n_splits, B, H, Sq), FlashAttention's
// out_accum and lse_accum; o is (B, H, Sq, d), lse (B, H, Sq). n_splits >= 1.
void combine_splits(const Shape& shape, int n_splits, const double* o_splits,
                    const double* lse_splits, double* o, double* lse, int threads = 0);

// ---------------------------------------------------------------------------------------------
// Rows worth validating on a problem too large to check fully.
// If B*H*Sq <= max_rows returns every row. Otherwise returns exactly max_rows rows
// (sorted, unique, deterministic in seed): first, last and last-tile (the final,
// possibly ragged, 128 rows of Sq) rows of several (b, h) pairs, topped up with
// uniformly random rows. If max_rows is smaller than that fixed set, the set is cut
// down in priority order; the very last row (B*H*Sq - 1) always comes first.
// max_rows <= 0 returns an empty vector.
std::vector<int64_t> sample_rows(const Shape& shape, int64_t max_rows, uint64_t seed);

}  // namespace flashtune::ref
