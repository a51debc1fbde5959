// Device code for the library baselines (tuner/library_runner.cpp): the row softmax of the
// unfused cuBLAS attention (S = scale * Q K^T by cuBLAS -> this kernel -> O = P V by cuBLAS),
// and a random fill for the peak-throughput probes.
//
// Lives in templates/library/, outside the templates/*.cuh glob that the families' compile-cache
// key hashes, so editing it does not invalidate every cached kernel. Self-contained (no headers,
// no standard library): NVRTC compiles it alone, by the worker at first use.
//
// Kernels are extern "C" so the worker finds them by plain name in the cubin.

namespace ft_lib {

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Output element types by the worker's dtype code: 0 fp32, 1 fp16, 2 bf16 (round to nearest even,
// as the host's to_device_format and the families' kernels round).
template <int DT> struct Out;
template <> struct Out<0> {
  typedef float T;
  static __device__ __forceinline__ T cvt(float x) { return x; }
};
template <> struct Out<1> {
  typedef unsigned short T;
  static __device__ __forceinline__ T cvt(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
  }
};
template <> struct Out<2> {
  typedef unsigned short T;
  static __device__ __forceinline__ T cvt(float x) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
  }
};

// Merges two partial (max, sum of exp(x - max)) pairs. An empty part has max = -inf, sum = 0.
__device__ __forceinline__ void combine(float& m, float& l, float m2, float l2) {
  const float mn = fmaxf(m, m2);
  if (mn == neg_inf()) {  // both empty: exp(-inf - -inf) would be NaN
    l = 0.f;
    return;
  }
  l = l * expf(m - mn) + l2 * expf(m2 - mn);
  m = mn;
}

// One block per row of S (rows are b*H*Sq + h*Sq + i; Sk scores each, already scaled).
// Bottom-right causal mask, as reference/attention_ref.hpp: query i sees key j iff
// j <= i + (Sk - Sq). P = exp(s - max) / sum on visible keys and 0 elsewhere; LSE = max + log(sum)
// (natural log). A row that sees no key gets P = 0 and LSE = +inf, like the reference.
// Accurate expf/logf (no fast math): the fp32 baseline must meet fp32's tolerance.
// blockDim.x: a multiple of 32, at most 1024.
template <int DT>
__device__ __forceinline__ void softmax_rows(const float* __restrict__ s, typename Out<DT>::T* __restrict__ p,
                                             float* __restrict__ lse, int seq_q, int seq_k, int causal) {
  const long long row = blockIdx.x;
  const int i = (int)(row % seq_q);
  int visible = seq_k;
  if (causal) {
    const long long last = (long long)i + seq_k - seq_q;  // the last key query i sees
    visible = last < 0 ? 0 : (last + 1 < seq_k ? (int)(last + 1) : seq_k);
  }
  const float* srow = s + row * (long long)seq_k;
  typename Out<DT>::T* prow = p + row * (long long)seq_k;

  // Pass 1: an online (max, sum) per thread over its strided share of the visible keys.
  float m = neg_inf(), l = 0.f;
  for (int j = threadIdx.x; j < visible; j += blockDim.x) {
    const float x = srow[j];
    if (x > m) {
      l = l * expf(m - x) + 1.f;  // expf(-inf) = 0 on the first key
      m = x;
    } else {
      l += expf(x - m);
    }
  }
  // Block reduction: within warps by shuffles, then warp 0 over the warps' partials.
  for (int o = 16; o; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
    combine(m, l, m2, l2);
  }
  __shared__ float part_m[32], part_l[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  if (lane == 0) {
    part_m[warp] = m;
    part_l[warp] = l;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < warps ? part_m[lane] : neg_inf();
    l = lane < warps ? part_l[lane] : 0.f;
    for (int o = 16; o; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
      combine(m, l, m2, l2);
    }
    if (lane == 0) {
      part_m[0] = m;
      part_l[0] = l;
    }
  }
  __syncthreads();
  m = part_m[0];
  l = part_l[0];

  // Pass 2: P over the whole row (zeros past the mask), and the row's LSE.
  if (threadIdx.x == 0) lse[row] = visible == 0 ? pos_inf() : m + logf(l);
  const float inv = visible == 0 ? 0.f : 1.f / l;
  for (int j = threadIdx.x; j < seq_k; j += blockDim.x)
    prow[j] = Out<DT>::cvt(j < visible ? expf(srow[j] - m) * inv : 0.f);
}

}  // namespace ft_lib

extern "C" __global__ void ft_unfused_softmax_fp32(const float* s, float* p, float* lse, int seq_q, int seq_k,
                                                   int causal) {
  ft_lib::softmax_rows<0>(s, p, lse, seq_q, seq_k, causal);
}
extern "C" __global__ void ft_unfused_softmax_fp16(const float* s, unsigned short* p, float* lse, int seq_q,
                                                   int seq_k, int causal) {
  ft_lib::softmax_rows<1>(s, p, lse, seq_q, seq_k, causal);
}
extern "C" __global__ void ft_unfused_softmax_bf16(const float* s, unsigned short* p, float* lse, int seq_q,
                                                   int seq_k, int causal) {
  ft_lib::softmax_rows<2>(s, p, lse, seq_q, seq_k, causal);
}

// Uniform values in [-1, 1) from a counter hash of (seed, i), for the GEMM probes' inputs
// (not zeros: a tensor core's power, and so its clock, depends on the data). dtype as above.
extern "C" __global__ void ft_fill_uniform(void* out, unsigned long long n, int dtype, unsigned long long seed) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    unsigned long long x = seed + (i + 1) * 0x9e3779b97f4a7c15ull;  // splitmix64
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    const float v = (float)(x >> 40) * (1.0f / 8388608.0f) - 1.0f;  // 24 bits -> [-1, 1)
    if (dtype == 0) ((float*)out)[i] = v;
    else if (dtype == 1) ((unsigned short*)out)[i] = ft_lib::Out<1>::cvt(v);
    else ((unsigned short*)out)[i] = ft_lib::Out<2>::cvt(v);
  }
}
