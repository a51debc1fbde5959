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
  int heads_k = 0;   // grouped-query attention: K, V have heads_k heads; 0 means heads

  double softmax_scale() const;
};

// Error magnitudes: beside each output, what it sums, so that a tolerance can scale with the problem
// (tuner/validate.hpp states the rule they feed). P_ij are the float64 probabilities, s_ij the scaled
// scores, and
//   Lambda_ij = 3 (|s_ij| + |lse_i|) + sqrt(d) * scale * ||q_i||_2 ||k_j||_2
// bounds, in units of fp32's unit roundoff, how far a kernel's fp32 exponent of P_ij can be from
// s_ij - lse_i (fp32 dot product of length d; up to three fp32 roundings of s and of lse: the
// scale * log2(e) constant, its product, lse rounded to fp32 and times log2(e)). Cauchy-Schwarz (sum_c |q_c k_c| <= ||q|| ||k||) keeps it O(1) per (i, j).
// Forward, per output row i (nullptr members are not computed):
//   o_mag[i,c]   = sum_j P_ij |V_jc|                           what O_ic sums
//   o_logit[i,c] = sum_j P_ij Lambda_ij |V_jc - O_ic|         O's sensitivity to relative errors of P
//   lse_mag[i]   = sum_j P_ij Lambda_ij                        LSE's sensitivity to them
// A fully masked row has all three 0.
struct FwdMagnitudes {
  double* o_mag = nullptr;    // like o
  double* o_logit = nullptr;  // like o
  double* lse_mag = nullptr;  // like lse
};

// Backward, with w_ij = ||dO_i|| ||V_j|| + ||dO_i|| ||O_i||  (>= |dP_ij| + |delta_i|, and >= what the
// products dO.V and dO.O sum) and dS_ij = P_ij (dP_ij - delta_i):
//   dv_mag[j,c] = sum_i P_ij |dO_ic|             dv_logit[j,c] = sum_i P_ij Lambda_ij |dO_ic|
//   dk_mag[j,c] = scale sum_i P_ij w_ij |Q_ic|   dk_logit[j,c] = scale sum_i Lambda_ij |dS_ij| |Q_ic|
//   dq_mag[i,c] = scale sum_j P_ij w_ij |K_jc|   dq_logit[i,c] = scale sum_j Lambda_ij |dS_ij| |K_jc|
// Every array is shaped like its gradient; a nullptr member is not computed (all or none per gradient).
struct BwdMagnitudes {
  double *dq_mag = nullptr, *dq_logit = nullptr;
  double *dk_mag = nullptr, *dk_logit = nullptr;
  double *dv_mag = nullptr, *dv_logit = nullptr;
};

// All tensors contiguous (B, H, S, d) row-major; inputs float, outputs double.
// lse is (B, H, Sq), natural log.
// Causal mask is bottom-right aligned (FlashAttention >= 2.1):
//   query i may attend key j iff j <= i + (seq_k - seq_q).
// A fully masked row (possible when Sq > Sk) gives O row = 0 and lse = +infinity,
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

// Backward: given dO (B, H, Sq, d) computes dQ (B, H, Sq, d), dK and dV (B, H, Sk, d),
// recomputing P in float64. dq, dk, dv are overwritten (not accumulated into).
void backward(const Shape& shape, const float* q, const float* k, const float* v,
              const float* dout, double* dq, double* dk, double* dv, int threads = 0,
              const BwdMagnitudes& mag = {});

// Number of keys query i may attend (keys [0, n) are visible): Sk, or under the causal mask
// clamp(i + Sk - Sq + 1, 0, Sk).
int64_t visible_keys(const Shape& shape, int64_t i);

// Rows worth validating on a problem too large to check fully.
// If B*H*Sq <= max_rows returns every row. Otherwise returns exactly max_rows rows
// (sorted, unique, deterministic in seed): first, last and last-tile (the final,
// possibly ragged, 128 rows of Sq) rows of several (b, h) pairs, topped up with
// uniformly random rows. If max_rows is smaller than that fixed set, the set is cut
// down in priority order; the very last row (B*H*Sq - 1) always comes first.
// max_rows <= 0 returns an empty vector.
std::vector<int64_t> sample_rows(const Shape& shape, int64_t max_rows, uint64_t seed);

}  // namespace flashtune::ref
