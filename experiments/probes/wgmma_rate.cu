// Probe: the rate of the building blocks of fa2_wgmma_bwd on the lent Hopper GPU, to explain where
// its d = 256 iterations go (docs/kernels.md, "Limits: d = 256").
//   1. wgmma m64nNk16 chains (16 instructions, k = 256) per SM, clocks per instruction, for
//      operands in the interleaved no-swizzle layout (ours) and in the 128-byte swizzle layout,
//      SS (A from shared memory) and RS (A from registers), K-major and MN-major B, 1-3 warpgroups.
//      Tensor-bound ideal: N/2 clocks (2*64*N*16 FLOP at 4096 FLOP/clock/SM, dense bf16).
//   2. red.global.add.v2.f32 into an fp32 accumulator in the dQ pattern of the kernel (64 rows x D
//      per CTA and step, one warp instruction = 8 rows x 32 bytes): bytes/s over the whole GPU.
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I templates experiments/probes/wgmma_rate.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "device_common.cuh"
#include "wgmma_common.cuh"
#include "probe_common.cuh"

using namespace flashtune;


enum Mode { kSsIl = 0, kSsSw = 1, kRsIl = 2, kRsSw = 3, kSsIlMn = 4 };
const char* mode_name[] = {"SS interleaved K-major", "SS swizzle-128B K-major", "RS interleaved K-major",
                           "RS swizzle-128B K-major", "SS interleaved, B MN-major"};

// 128-byte swizzle descriptor (K-major): start, LBO unused (1), SBO = 1024 (8 rows of 128 bytes), type 1.
__device__ __forceinline__ unsigned long long desc_sw128(unsigned addr) {
  return (1ull << 62) | (static_cast<unsigned long long>(1024 >> 4) << 32) | (1ull << 16) | ((addr >> 4) & 0x3fff);
}

constexpr int kK = 256;  // reduction length of one chain: 16 instructions
constexpr int kReps = 64;

template <int N, int MODE>
__global__ void __launch_bounds__(384, 1) wgmma_chain(long long* clocks, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  // A: 64 x 256, B: N x 256 (16-bit), filled with small values (not zeros).
  unsigned short* s16 = reinterpret_cast<unsigned short*>(smem);
  for (int i = threadIdx.x; i < (64 + N) * kK; i += blockDim.x) s16[i] = 0x3c00 + (i * 37 & 0xff);
  fence_proxy_async();
  __syncthreads();
  const unsigned a_base = (smem_u32(smem) + 1023) & ~1023u;
  const unsigned b_base = a_base + 64 * kK * 2;
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
  unsigned afr[4] = {0x3c003c00u, 0x3c013c01u, 0x3c023c02u, 0x3c033c03u};
  const int wg = threadIdx.x / 128;
  __syncthreads();
  const long long t0 = clock64();
  for (int rep = 0; rep < kReps; ++rep) {
    wgmma_fence_regs(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) {
      unsigned long long da, db;
      if constexpr (MODE == kSsSw || MODE == kRsSw) {  // 4 column atoms of [rows][64], 32 bytes per k16
        da = desc_sw128(a_base + (kk / 4) * 64 * 128 + 32 * (kk % 4));
        db = desc_sw128(b_base + (kk / 4) * N * 128 + 32 * (kk % 4));
      } else if constexpr (MODE == kSsIlMn) {  // B rows = k (256 rows of N columns)
        da = desc_k_major<kK>(a_base + 256 * kk);
        db = desc_mn_major<N>(b_base + 32 * N * kk);
      } else {
        da = desc_k_major<kK>(a_base + 256 * kk);
        db = desc_k_major<kK>(b_base + 256 * kk);
      }
      if constexpr (MODE == kRsIl || MODE == kRsSw)
        wgmma_rs<N, 1, 0>(acc, afr, db, 1);
      else if constexpr (MODE == kSsIlMn)
        wgmma_ss<N, 1, 0, 1>(acc, da, db, 1);
      else
        wgmma_ss<N, 1, 0, 0>(acc, da, db, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(acc);
  }
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s += acc[i];
  if (s == 1234.5f) sink[threadIdx.x] = s;  // keeps the chain alive
  if (threadIdx.x % 128 == 0) clocks[blockIdx.x * 3 + wg] = t1 - t0;
}

// dQ-pattern reductions: CTA b adds a 64 x D fp32 tile into rows of its head's accumulator, step
// after step, from a rotated start (as fa2_wgmma_bwd does); VEC 2: red.v2 in the C layout, VEC 4:
// red.v4 on 16 consecutive bytes per lane.
template <int D, int VEC>
__global__ void __launch_bounds__(256) red_pattern(float* acc, int rows_per_head, int ctas_per_head, int steps) {
  const int head = blockIdx.x / ctas_per_head;
  const int cta = blockIdx.x % ctas_per_head;
  float* base = acc + static_cast<long long>(head) * rows_per_head * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tig = lane % 4;
  const int blocks = rows_per_head / 64;
  for (int st = 0; st < steps; ++st) {
    const int m0 = ((st + cta) % blocks) * 64;
    if constexpr (VEC == 2) {
      // 8 warps: warp w covers rows 16*(w%4).. and columns half (w/4) of D, like the kernel
      const int r0 = m0 + 16 * (warp % 4) + g;
      const int c0 = (warp / 4) * (D / 2);
#pragma unroll 4
      for (int j = 0; j < D / 16; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) red_add_f32x2(base + (r0 + 8 * h) * D + c0 + 8 * j + 2 * tig, 1.f, 1.f);
    } else {
      // consecutive lanes on consecutive 16-byte pieces of a row: a warp covers 512 bytes
      for (int i = threadIdx.x; i < 64 * D / 4; i += 256) {
        float* p = base + m0 * D + 4 * i;
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(1.f), "f"(1.f), "f"(1.f),
                     "f"(1.f)
                     : "memory");
      }
    }
  }
}

// The same tiles by the copy engine: one cp.reduce.async.bulk .add.f32 of PIECE bytes per issuing lane
// (64 x D x 4 bytes per step in all), up to two steps in flight from two shared-memory buffers.
template <int D, int PIECE>
__global__ void __launch_bounds__(128) bulk_pattern(float* acc, int rows_per_head, int ctas_per_head, int steps) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const int head = blockIdx.x / ctas_per_head;
  const int cta = blockIdx.x % ctas_per_head;
  float* base = acc + static_cast<long long>(head) * rows_per_head * D;
  float* sf = reinterpret_cast<float*>(smem);
  for (int i = threadIdx.x; i < 2 * 64 * D; i += blockDim.x) sf[i] = 1.f;
  fence_proxy_async();
  __syncthreads();
  const int blocks = rows_per_head / 64;
  constexpr int kTile = 64 * D * 4;
  constexpr int kPieces = kTile / PIECE;
  if (threadIdx.x >= 32) return;
  for (int st = 0; st < steps; ++st) {
    const int m0 = ((st + cta) % blocks) * 64;
    const unsigned src = smem_u32(smem) + (st & 1) * kTile;
    for (int pc = threadIdx.x; pc < kPieces; pc += 32)
      bulk_reduce_add_f32(base + m0 * D + pc * (PIECE / 4), src + pc * PIECE, PIECE);
    bulk_commit();
    bulk_wait_read<1>();
  }
  bulk_wait<0>();
}


template <int D, int PIECE>
void run_bulk(float* d_acc, int heads, int rows) {
  const int ctas_per_head = rows / 64, steps = rows / 64;
  const int smem = 2 * 64 * D * 4;
  CK(cudaFuncSetAttribute(bulk_pattern<D, PIECE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const double ms = median_ms(
      [&] { bulk_pattern<D, PIECE><<<heads * ctas_per_head, 128, smem>>>(d_acc, rows, ctas_per_head, steps); });
  const double bytes = static_cast<double>(heads) * ctas_per_head * steps * 64.0 * D * 4;
  std::printf("bulk reduce pieces of %d B, D=%d heads=%d S=%d: %.3f ms, %.0f GB/s of fp32 reductions\n", PIECE, D, heads,
              rows, ms, bytes / (ms * 1e6));
}

template <int N, int MODE>
void run_chain(int sms, float* sink, long long* d_clocks) {
  const int smem = (64 + N) * kK * 2 + 1024;
  CK(cudaFuncSetAttribute(wgmma_chain<N, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  for (int wgs = 1; wgs <= 3; ++wgs) {
    std::vector<long long> c(sms * 3, 0);
    for (int w = 0; w < 2; ++w) {  // warm-up, then measured
      wgmma_chain<N, MODE><<<sms, 128 * wgs, smem>>>(d_clocks, sink);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
    }
    CK(cudaMemcpy(c.data(), d_clocks, sizeof(long long) * sms * 3, cudaMemcpyDeviceToHost));
    std::vector<long long> v;
    for (int b = 0; b < sms; ++b) v.push_back(*std::max_element(&c[b * 3], &c[b * 3] + wgs));
    std::sort(v.begin(), v.end());
    const double per_instr = static_cast<double>(v[v.size() / 2]) / (kReps * 16.0 * wgs);  // SM clocks per wgmma
    std::printf("%-28s N=%3d wgs=%d  clocks/wgmma/SM %6.1f  ideal %5.1f  tensor %% %5.1f\n", mode_name[MODE], N, wgs,
                per_instr, N / 2.0, 100.0 * (N / 2.0) / per_instr);
  }
}

template <int D, int VEC>
void run_red(float* d_acc, int heads, int rows) {
  const int ctas_per_head = rows / 64;  // one CTA per 64 keys, as at BN = 64
  const int steps = rows / 64;          // every query block, as non-causal
  const double ms =
      median_ms([&] { red_pattern<D, VEC><<<heads * ctas_per_head, 256>>>(d_acc, rows, ctas_per_head, steps); });
  const double bytes = static_cast<double>(heads) * ctas_per_head * steps * 64.0 * D * 4;
  std::printf("red.v%d dQ pattern D=%d heads=%d S=%d: %.3f ms, %.0f GB/s of fp32 reductions\n", VEC, D, heads, rows, ms,
              bytes / (ms * 1e6));
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs\n", prop.name, sms);
  float* sink;
  long long* d_clocks;
  CK(cudaMalloc(&sink, 4096));
  CK(cudaMalloc(&d_clocks, sizeof(long long) * sms * 3));
  run_chain<32, kSsIl>(sms, sink, d_clocks);
  run_chain<32, kSsSw>(sms, sink, d_clocks);
  run_chain<64, kSsIl>(sms, sink, d_clocks);
  run_chain<64, kSsSw>(sms, sink, d_clocks);
  run_chain<128, kSsIl>(sms, sink, d_clocks);
  run_chain<128, kSsSw>(sms, sink, d_clocks);
  run_chain<256, kSsIl>(sms, sink, d_clocks);
  run_chain<256, kSsSw>(sms, sink, d_clocks);
  run_chain<64, kRsIl>(sms, sink, d_clocks);
  run_chain<64, kRsSw>(sms, sink, d_clocks);
  run_chain<128, kRsIl>(sms, sink, d_clocks);
  run_chain<128, kRsSw>(sms, sink, d_clocks);
  run_chain<32, kSsIlMn>(sms, sink, d_clocks);
  run_chain<64, kSsIlMn>(sms, sink, d_clocks);
  run_chain<128, kSsIlMn>(sms, sink, d_clocks);
  float* d_acc;
  const int heads = 32, rows = 4096;
  CK(cudaMalloc(&d_acc, sizeof(float) * heads * rows * 256));
  CK(cudaMemset(d_acc, 0, sizeof(float) * heads * rows * 256));
  run_red<256, 2>(d_acc, heads, rows);
  run_red<256, 4>(d_acc, heads, rows);
  run_red<128, 2>(d_acc, heads, rows);
  run_red<128, 4>(d_acc, heads, rows);
  run_bulk<256, 65536>(d_acc, heads, rows);
  run_bulk<256, 1024>(d_acc, heads, rows);
  run_bulk<256, 512>(d_acc, heads, rows);
  run_bulk<256, 128>(d_acc, heads, rows);
  run_bulk<128, 512>(d_acc, heads, rows);
  std::printf("done\n");
  return 0;
}
