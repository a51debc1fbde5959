// Small device helpers shared by the kernel families: constants, PTX wrappers
// (cp.async, ex2/lg2, ldmatrix, mma.sync, f16/bf16 packing) and the dynamic-shared-memory
// launch check.
// Must compile under NVRTC (no standard headers) and nvcc.
#pragma once

namespace flashtune {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// 2^x with MUFU.EX2; ex2(-inf) = +0, which the online softmax relies on.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// tanh by the SFU (MUFU.TANH): relative error at most 2^-10.987 (PTX ISA), one instruction, as FlashAttention-3's
// softcap (fa3_wgmma, fa3_wgmma_bwd). The reference's bounds count it (ref::kTanhUnits).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

// A launch with less dynamic shared memory than the kernel needs must crash, not corrupt.
__device__ __forceinline__ void check_dynamic_smem(unsigned required_bytes) {
  unsigned have;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));
  if (have < required_bytes) __trap();
}

__device__ __forceinline__ unsigned smem_u32(const void* ptr) {
  return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

// 16-byte async copy global -> shared; src_bytes = 0 zero-fills the 16 bytes
// without reading (src must still be a valid address expression).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem_dst)), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 16-byte async copy to a shared-memory address (smem_u32 form); src_bytes = 0 zero-fills.
__device__ __forceinline__ void cp_async_16_s(unsigned smem_addr, const void* gmem_src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem_src), "r"(src_bytes)
               : "memory");
}

// ---- 16-bit tensor-core helpers (sm_80+): no cuda_fp16.h, data as packed 32-bit words ----
// DTYPE: 0 = fp16, 1 = bf16.

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i
// receives it in the MMA fragment layout (lane holds row lane/4, columns 2*(lane%4), +1).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}
// Same, each matrix transposed (lane holds column lane/4, rows 2*(lane%4), +1).
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// c += a * b, m16n8k16, A row-major (4 regs), B column-major (2 regs), fp32 accumulators.
template <int DTYPE>
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (DTYPE == 0) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> one 32-bit word of two 16-bit values, round to nearest; lo in the low half.
template <int DTYPE>
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
  unsigned r;
  if constexpr (DTYPE == 0) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

__device__ __forceinline__ void st_shared_u32(unsigned smem_addr, unsigned v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_v4(unsigned smem_addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_addr)
               : "memory");
  return v;
}

__device__ __forceinline__ float4 lds128(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void sts128(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

}  // namespace flashtune

// ---- appended for fa2_simt_bwd (generic fp32 helpers) ----
namespace flashtune {

// Copy rows [row0, row0+ROWS) of a (seq, D) fp32 matrix into dst[ROWS][STRIDE] with 16-byte
// cp.async; rows >= seq are zero-filled (never garbage: 0 * NaN = NaN).
template <int ROWS, int D, int STRIDE, int NT>
__device__ __forceinline__ void cp_async_rows_f32(float* dst, const float* src, int row0, int seq, int tid) {
  constexpr int kChunksPerRow = D / 4;
  constexpr int kChunks = ROWS * kChunksPerRow;
#pragma unroll
  for (int idx = tid; idx < kChunks; idx += NT) {
    const int r = idx / kChunksPerRow;
    const int c4 = idx % kChunksPerRow;
    const int grow = row0 + r;
    const bool ok = grow < seq;
    const float* g = ok ? src + static_cast<long long>(grow) * D + 4 * c4 : src;
    cp_async_16(dst + r * STRIDE + 4 * c4, g, ok ? 16 : 0);
  }
}

// Sum over the WIDTH adjacent lanes of a group (WIDTH a power of two dividing 32).
template <int WIDTH>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}
// Max over the WIDTH adjacent lanes of a group.
template <int WIDTH>
__device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

// *gptr += v (4 floats, global memory, relaxed, no return value). sm_90: one vector
// reduction (red.global.add.v4.f32); older targets: four scalar reductions.
__device__ __forceinline__ void red_add_f32x4(float* gptr, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(gptr), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w)
               : "memory");
#else
  atomicAdd(gptr + 0, v.x);
  atomicAdd(gptr + 1, v.y);
  atomicAdd(gptr + 2, v.z);
  atomicAdd(gptr + 3, v.w);
#endif
}

__device__ __forceinline__ void ffma4(float4& acc, float s, const float4& v) {
  acc.x = fmaf(s, v.x, acc.x);
  acc.y = fmaf(s, v.y, acc.y);
  acc.z = fmaf(s, v.z, acc.z);
  acc.w = fmaf(s, v.w, acc.w);
}
__device__ __forceinline__ float dot4_acc(const float4& a, const float4& b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  acc = fmaf(a.w, b.w, acc);
  return acc;
}

// c[a][b] = sum_{k < K} A[ty + TR*a][k] * B[tx + TC*b][k]: the register-tiled A * B^T of two
// shared-memory row tiles (row strides A_STRIDE, B_STRIDE), 16-byte reads along k. The CUDA-core
// families' S = Q K^T and dP^T = V dO^T.
template <int ROWS, int COLS, int K, int TR, int TC, int A_STRIDE, int B_STRIDE>
__device__ __forceinline__ void tile_a_bt(float (&c)[ROWS][COLS], const float* A, const float* B, int ty, int tx) {
#pragma unroll
  for (int a = 0; a < ROWS; ++a)
#pragma unroll
    for (int b = 0; b < COLS; ++b) c[a][b] = 0.f;
  const float* arow = A + ty * A_STRIDE;
  const float* brow = B + tx * B_STRIDE;
#pragma unroll 4
  for (int k = 0; k < K; k += 4) {
    float4 af[ROWS], bf[COLS];
#pragma unroll
    for (int a = 0; a < ROWS; ++a) af[a] = lds128(arow + a * TR * A_STRIDE + k);
#pragma unroll
    for (int b = 0; b < COLS; ++b) bf[b] = lds128(brow + b * TC * B_STRIDE + k);
#pragma unroll
    for (int a = 0; a < ROWS; ++a)
#pragma unroll
      for (int b = 0; b < COLS; ++b) c[a][b] = dot4_acc(af[a], bf[b], c[a][b]);
  }
}

// acc[a][e] += sum_k P[ty + TR*a][k] * X[k][4*tx + 4*TC*e .. +3] for k < K: the register-tiled
// product of a shared-memory tile P (probabilities or dS, row stride P_STRIDE) with K rows of X
// (row stride X_STRIDE), four k per 16-byte read of P. The CUDA-core families' P*V, P^T*dO, dS^T*Q.
template <int ROWS, int CHUNKS, int K, int TR, int TC, int P_STRIDE, int X_STRIDE>
__device__ __forceinline__ void accumulate_p_x(float4 (&acc)[ROWS][CHUNKS], const float* P, const float* X, int ty,
                                               int tx) {
  const float* prow = P + ty * P_STRIDE;
  const float* xcol = X + 4 * tx;
#pragma unroll 2
  for (int k = 0; k < K; k += 4) {
    float4 pf[ROWS];
#pragma unroll
    for (int a = 0; a < ROWS; ++a) pf[a] = lds128(prow + a * TR * P_STRIDE + k);
    float4 xf[4][CHUNKS];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int e = 0; e < CHUNKS; ++e) xf[kk][e] = lds128(xcol + (k + kk) * X_STRIDE + 4 * TC * e);
#pragma unroll
    for (int a = 0; a < ROWS; ++a)
#pragma unroll
      for (int e = 0; e < CHUNKS; ++e) {
        ffma4(acc[a][e], pf[a].x, xf[0][e]);
        ffma4(acc[a][e], pf[a].y, xf[1][e]);
        ffma4(acc[a][e], pf[a].z, xf[2][e]);
        ffma4(acc[a][e], pf[a].w, xf[3][e]);
      }
  }
}

}  // namespace flashtune

// ---- appended for fa2_mma_bwd (16-bit tensor-core backward) ----
namespace flashtune {

// 4-byte async copy to a shared-memory address (smem_u32 form); src_bytes = 0 zero-fills.
__device__ __forceinline__ void cp_async_4_s(unsigned smem_addr, const void* gmem_src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(gmem_src), "r"(src_bytes)
               : "memory");
}

// One 32-bit word of two 16-bit values (lo in the low half) -> two floats, exact.
template <int DTYPE>
__device__ __forceinline__ void unpack_half2(unsigned w, float& lo, float& hi) {
  if constexpr (DTYPE == 0) {
    unsigned short a = static_cast<unsigned short>(w & 0xffffu), b = static_cast<unsigned short>(w >> 16);
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(lo) : "h"(a));
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(hi) : "h"(b));
  } else {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  }
}

// *gptr += (x, y) (two consecutive floats, 8-byte aligned, global memory, relaxed, no return value).
// sm_90: one vector reduction; older targets: two scalar reductions.
__device__ __forceinline__ void red_add_f32x2(float* gptr, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(gptr), "f"(x), "f"(y) : "memory");
#else
  atomicAdd(gptr + 0, x);
  atomicAdd(gptr + 1, y);
#endif
}

}  // namespace flashtune
