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

  double softmax_scale() const;
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
             double* o, double* lse, int threads = 0);

// Forward for selected rows only. rows are flat indices into (B*H*Sq):
//   row r -> b = r / (H*Sq), h = (r / Sq) % H, i = r % Sq.
// o is rows.size() x d, lse is rows.size(). Each output equals, bit for bit, the
// matching row of forward(). Cost is rows.size() * Sk * d.
void forward_rows(const Shape& shape, const float* q, const float* k, const float* v,
                  std::span<const int64_t> rows, double* o, double* lse, int threads = 0);

// Backward: given dO (B, H, Sq, d) computes dQ (B, H, Sq, d), dK and dV (B, H, Sk, d),
// recomputing P in float64. dq, dk, dv are overwritten (not accumulated into).
void backward(const Shape& shape, const float* q, const float* k, const float* v,
              const float* dout, double* dq, double* dk, double* dv, int threads = 0);

// Rows worth validating on a problem too large to check fully.
// If B*H*Sq <= max_rows returns every row. Otherwise returns exactly max_rows rows
// (sorted, unique, deterministic in seed): first, last and last-tile (the final,
// possibly ragged, 128 rows of Sq) rows of several (b, h) pairs, topped up with
// uniformly random rows. If max_rows is smaller than that fixed set, the set is cut
// down in priority order; the very last row (B*H*Sq - 1) always comes first.
// max_rows <= 0 returns an empty vector.
std::vector<int64_t> sample_rows(const Shape& shape, int64_t max_rows, uint64_t seed);

}  // namespace flashtune::ref
