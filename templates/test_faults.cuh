// Test-only kernels that fail on purpose, so the tests can prove that a faulting, hanging or slightly
// wrong candidate becomes a stored status while the sweep goes on. MODE 0 is a correct (slow)
// attention so that the same sweep also has candidates that must pass; MODE 3 and 4 are MODE 0 with
// one small mistake each, which validation (tuner/validate.hpp) must catch in every dtype:
//   MODE 3 skips the first K/V block (keys 0..63): every row sees it (causal masks the other end),
//          and with Sk <= 64 it is all the keys;
//   MODE 4 moves the last query row of the last (batch, head) (a row ref::sample_rows always checks)
//          by 5% of its magnitude scale, mean_c sum_j P_j |V_jc|.
// Inputs and outputs in the dtype (DTYPE 0 fp32, 1 fp16, 2 bf16), arithmetic in fp32.
#pragma once
#include "attention_params.h"
#include "test_faults_traits.h"

namespace flashtune {

namespace fault_detail {

template <int DTYPE>
__device__ __forceinline__ float load(const void* base, long long i) {
  if constexpr (DTYPE == 0) {
    return static_cast<const float*>(base)[i];
  } else {
    const unsigned short h = static_cast<const unsigned short*>(base)[i];
    if constexpr (DTYPE == 1) {
      float f;
      asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
      return f;
    } else {
      return __uint_as_float(static_cast<unsigned>(h) << 16);
    }
  }
}

template <int DTYPE>
__device__ __forceinline__ void store(void* base, long long i, float x) {
  if constexpr (DTYPE == 0) {
    static_cast<float*>(base)[i] = x;
  } else {
    unsigned short h;
    if constexpr (DTYPE == 1) asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(x));
    else asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(x));
    static_cast<unsigned short*>(base)[i] = h;
  }
}

}  // namespace fault_detail

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
  // MODE 0 (and 3, 4): one thread per query row, online softmax in the exp2 domain.
  constexpr int D = Traits::kHeadDim, DT = Traits::kDtype;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.seq_q) return;
  const long long bh = (long long)blockIdx.z * p.heads + blockIdx.y;
  const long long q0 = (bh * p.seq_q + i) * D, kv0 = bh * p.seq_k * D;
  float acc[D];
#pragma unroll
  for (int c = 0; c < D; ++c) acc[c] = 0.f;
  float m = -__int_as_float(0x7f800000), l = 0.f, mag = 0.f;  // mag: sum_j e_j mean_c |v_jc| (MODE 4)
  const int last = Traits::kCausal ? min(p.seq_k - 1, i + p.seq_k - p.seq_q) : p.seq_k - 1;
  const int first = Traits::kMode == 3 ? kFaultSkippedKeys : 0;
  for (int j = first; j <= last; ++j) {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < D; ++c) s += fault_detail::load<DT>(p.q, q0 + c) * fault_detail::load<DT>(p.k, kv0 + (long long)j * D + c);
    s *= p.scale_log2;
    const float m_new = fmaxf(m, s);
    const float alpha = exp2f(m - m_new), e = exp2f(s - m_new);
    l = l * alpha + e;
    float vabs = 0.f;
#pragma unroll
    for (int c = 0; c < D; ++c) {
      const float vc = fault_detail::load<DT>(p.v, kv0 + (long long)j * D + c);
      acc[c] = acc[c] * alpha + e * vc;
      vabs += fabsf(vc);
    }
    if (Traits::kMode == 4) mag = mag * alpha + e * (vabs / D);
    m = m_new;
  }
  const bool perturbed = Traits::kMode == 4 && i == p.seq_q - 1 && bh == (long long)p.batch * p.heads - 1;
  const float shift = perturbed && l > 0.f ? kFaultRowShift * mag / l : 0.f;
#pragma unroll
  for (int c = 0; c < D; ++c) fault_detail::store<DT>(p.o, q0 + c, (l > 0.f ? acc[c] / l : 0.f) + shift);
  p.lse[bh * p.seq_q + i] = l > 0.f ? (m + log2f(l)) * 0.69314718055994531f : __int_as_float(0x7f800000);
}

}  // namespace flashtune
