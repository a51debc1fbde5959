// Test-only kernels that fail on purpose, so the tests can prove that a faulting or hanging
// candidate becomes a stored status while the sweep goes on. MODE 0 is a correct (slow)
// attention so that the same sweep also has candidates that must pass.
#pragma once
#include "attention_params.h"
#include "test_faults_traits.h"

namespace flashtune {

template <class Traits>
__global__ void fault_fwd(const AttnFwdParams p) {
  if (Traits::kMode == 1) {
    // ~4 TiB past the output: an illegal address on any GPU.
    volatile float* o = static_cast<float*>(p.o);
    o[(1ll << 40) + threadIdx.x] = 1.0f;
    return;
  }
  if (Traits::kMode == 2) {
    // The worker zero-fills the workspace, so this never ends.
    volatile float* w = p.workspace;
    while (w[0] != 12345.0f) __nanosleep(1000);
    return;
  }
  // MODE 0: one thread per query row, online softmax in the exp2 domain.
  constexpr int D = Traits::kHeadDim;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.seq_q) return;
  const long long bh = (long long)blockIdx.z * p.heads + blockIdx.y;
  const float* q = static_cast<const float*>(p.q) + (bh * p.seq_q + i) * D;
  const float* k = static_cast<const float*>(p.k) + bh * p.seq_k * D;
  const float* v = static_cast<const float*>(p.v) + bh * p.seq_k * D;
  float acc[D];
#pragma unroll
  for (int c = 0; c < D; ++c) acc[c] = 0.f;
  float m = -__int_as_float(0x7f800000), l = 0.f;
  const int last = Traits::kCausal ? min(p.seq_k - 1, i + p.seq_k - p.seq_q) : p.seq_k - 1;
  for (int j = 0; j <= last; ++j) {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < D; ++c) s += q[c] * k[(long long)j * D + c];
    s *= p.scale_log2;
    const float m_new = fmaxf(m, s);
    const float alpha = exp2f(m - m_new), e = exp2f(s - m_new);
    l = l * alpha + e;
#pragma unroll
    for (int c = 0; c < D; ++c) acc[c] = acc[c] * alpha + e * v[(long long)j * D + c];
    m = m_new;
  }
  float* o = static_cast<float*>(p.o) + (bh * p.seq_q + i) * D;
#pragma unroll
  for (int c = 0; c < D; ++c) o[c] = l > 0.f ? acc[c] / l : 0.f;
  p.lse[bh * p.seq_q + i] = l > 0.f ? (m + log2f(l)) * 0.69314718055994531f : __int_as_float(0x7f800000);
}

}  // namespace flashtune
