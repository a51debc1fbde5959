// The one kernel argument every attention kernel takes. Plain C++ so that the
// host (tuner worker, consumer builds) and the device (NVRTC, nvcc) share it.
#pragma once

namespace flashtune {

// Layout: every tensor is contiguous (batch, heads, seq, head_dim), the layout of
// torch.nn.functional.scaled_dot_product_attention. head_dim and the causal flag are
// template parameters of the kernel traits, not fields here.
struct AttnFwdParams {
  const void* q;     // (B, H, Sq, d), element type per the kernel's dtype
  const void* k;     // (B, H, Sk, d)
  const void* v;     // (B, H, Sk, d)
  void* o;           // (B, H, Sq, d)
  float* lse;        // (B, H, Sq) natural-log log-sum-exp; +inf for a fully masked row
  float* workspace;  // family-specific scratch (naive: the score matrix), may be null
  int batch;
  int heads;
  int seq_q;
  int seq_k;
  float scale;       // softmax scale, 1/sqrt(d) unless the caller chose another
  float scale_log2;  // scale * log2(e): scores in the exp2 domain
};

}  // namespace flashtune
