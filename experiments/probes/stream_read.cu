// Probe: how fast each way of streaming K/V tiles into shared memory reads HBM on the lent Hopper GPU,
// in decode_splitkv's geometry at its tightest point (Llama-3 8B, B 64, Hk 8, Sk 32k, d 128, bf16: 8.6 GB
// of K and V read once; SPLITS 4 x Hk x B = 2048 CTAs of 128 threads, 64 KB tiles of 256 keys, K and V
// alternating), beside decode_splitkv itself on the same bytes. Each loader fills a ring of R tile slots,
// R - 1 tiles in flight ahead of the one consumed (R = 2 is decode_splitkv's STAGES 1 in bytes in flight);
// a consumer reads a little of each tile (so that nothing is elided) and releases it.
//   cpasync      16-byte cp.async.cg per thread and chunk, into unpadded tiles
//   cpasync_l2   the same with the .L2::256B prefetch qualifier
//   bulk1d       one cp.async.bulk of the whole 64 KB tile (contiguous in the dense layout), mbarrier
//   tma2d        two 2-D TMA boxes (64 columns x 256 rows, 128-byte swizzle), mbarrier
//   ldg          a grid-stride sum of 16-byte loads into registers, no shared memory
//   decode S/BN/W/ST  decode_splitkv (partial + combine, Sq 1, Hq 32) in a few tuned configs
// K and V hold seeded random bf16 values in [-1, 1) (a constant fill toggles no DRAM bits).
// What it found (H100, docs/kernels.md "decode_splitkv: the padded rows"): every loader streams 3.12-3.14
// TB/s, the decode kernel with fa2_mma's padded rows 2.97 (Nsight Compute: 1.5x the L2 read sectors, the
// padded rows' 16-byte misalignment splitting each cp.async), with swizzled rows 3.11-3.16.
// --profile: only cpasync R 2 and decode S4/BN256/W4/ST1, twice each (warm-up and one timed launch), for
// Nsight Compute.
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I templates experiments/probes/stream_read.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "decode_splitkv.cuh"
#include "device_common.cuh"
#include "wgmma_common.cuh"
#include "probe_common.cuh"

using namespace flashtune;


constexpr int kD = 128, kBlockN = 256, kThreads = 128;
constexpr int kTileBytes = kBlockN * kD * 2;  // 64 KB
constexpr long long kBatch = 64, kHeadsK = 8, kSeqK = 32768, kSplits = 4;
constexpr long long kRows = kBatch * kHeadsK * kSeqK;  // of K (and of V)
constexpr int kBlocksPerSplit = static_cast<int>(kSeqK / kSplits / kBlockN);
enum Mode { kCpAsync = 0, kCpAsyncL2 = 1, kBulk1d = 2, kTma2d = 3 };
const char* mode_name[] = {"cpasync", "cpasync_l2", "bulk1d", "tma2d"};

template <bool L2>
__device__ __forceinline__ void cp16(unsigned s, const void* g) {
  if constexpr (L2) asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
  else asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
}

// Tile t of the CTA's stream (K block t/2 or V block t/2) into slot `dst`.
template <int MODE>
__device__ __forceinline__ void issue(int t, unsigned dst, unsigned bar, const unsigned short* k, const unsigned short* v,
                                      long long row0, const CUtensorMap* mk, const CUtensorMap* mv) {
  const unsigned short* src = (t & 1 ? v : k) + (row0 + static_cast<long long>(t >> 1) * kBlockN) * kD;
  if constexpr (MODE == kCpAsync || MODE == kCpAsyncL2) {
    const int tid = threadIdx.x;
#pragma unroll 8
    for (int c = tid; c < kTileBytes / 16; c += kThreads) cp16<MODE == kCpAsyncL2>(dst + 16 * c, src + 8 * c);
    cp_async_commit();
  } else if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(bar, kTileBytes);
    if constexpr (MODE == kBulk1d) {
      bulk_load(dst, src, kTileBytes, bar);
    } else {
      const int row = static_cast<int>(row0 + static_cast<long long>(t >> 1) * kBlockN);
      const CUtensorMap* map = t & 1 ? mv : mk;  // the kernel parameters' own addresses (param space)
      for (int g = 0; g < 2; ++g)
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
                "r"(dst + g * kTileBytes / 2),
            "l"(map), "r"(64 * g), "r"(row), "r"(bar)
            : "memory");
    }
  }
}

template <int MODE, int R>
__global__ void __launch_bounds__(kThreads, 1)
    stream_tiles(const unsigned short* k, const unsigned short* v, float* sink, const __grid_constant__ CUtensorMap mk,
                 const __grid_constant__ CUtensorMap mv) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned base = (smem_u32(smem) + 1023u) & ~1023u;
  const unsigned bars = base + R * kTileBytes;
  const int split = blockIdx.x % kSplits, head = blockIdx.x / kSplits % kHeadsK, batch = blockIdx.x / kSplits / kHeadsK;
  const long long row0 = ((batch * kHeadsK + head) * kSeqK) + split * (kSeqK / kSplits);
  const int tiles = 2 * kBlocksPerSplit;
  if (threadIdx.x == 0)
    for (int s = 0; s < R; ++s) mbar_init(bars + 8 * s, 1);
  fence_mbar_init();
  __syncthreads();
  for (int t = 0; t < R - 1; ++t) issue<MODE>(t, base + t * kTileBytes, bars + 8 * t, k, v, row0, &mk, &mv);
  float acc = 0.f;
  for (int t = 0; t < tiles; ++t) {
    const int slot = t % R;
    if constexpr (MODE == kCpAsync || MODE == kCpAsyncL2) {
      cp_async_wait<R - 2>();
    } else {
      mbar_wait(bars + 8 * slot, static_cast<unsigned>((t / R) & 1));
    }
    __syncthreads();  // the tile visible to all; everyone done with slot (t - 1) % R, refilled next
    const int nt = t + R - 1;
    if (nt < tiles) issue<MODE>(nt, base + (nt % R) * kTileBytes, bars + 8 * (nt % R), k, v, row0, &mk, &mv);
    else if (MODE == kCpAsync || MODE == kCpAsyncL2) cp_async_commit();  // keep one group per tile
    const uint4 x = ld_shared_v4(base + slot * kTileBytes + 16 * threadIdx.x);
    acc += __uint_as_float(x.x & 0x007fffffu);
  }
  if (acc == 1.2345f) sink[blockIdx.x] = acc;  // never true: keeps the reads
}

__global__ void ldg_sum(const uint4* p, long long n, float* sink) {
  unsigned acc = 0;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const uint4 x = __ldcs(p + i);
    acc ^= x.x ^ x.y ^ x.z ^ x.w;
  }
  if (acc == 0x12345678u) sink[0] = 1.f;
}

static CUtensorMap make_map(const void* ptr) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {kD, static_cast<cuuint64_t>(kRows)};
  const cuuint64_t strides[1] = {kD * 2};
  const cuuint32_t box[2] = {64, kBlockN}, elem[2] = {1, 1};
  const CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides,
                                            box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", static_cast<int>(r));
    std::exit(1);
  }
  return m;
}


__global__ void fill_random(unsigned short* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    unsigned x = static_cast<unsigned>(i) * 2654435761u ^ seed ^ static_cast<unsigned>(i >> 32) * 40503u;
    x ^= x >> 15, x *= 2246822519u, x ^= x >> 13;
    const float f = (x >> 8) * (2.f / 16777216.f) - 1.f;
    p[i] = static_cast<unsigned short>(__float_as_uint(f) >> 16);  // bf16 by truncation
  }
}

// decode_splitkv at this point (Hq 32, Hk 8, Sq 1, d 128, bf16, not causal): partial, then combine.
template <int SPLITS, int BN, int WARPS, int STAGES>
static float run_decode(const unsigned short* k, const unsigned short* v, const unsigned short* q, unsigned short* o,
                        float* lse, float* ws, int reps) {
  using T = DecodeSplitkvTraits<kD, SPLITS, BN, WARPS, STAGES, 1, false>;
  AttnFwdParams p{};
  p.q = q, p.k = k, p.v = v, p.o = o, p.lse = lse, p.workspace = ws;
  p.batch = static_cast<int>(kBatch), p.heads = 32, p.heads_k = static_cast<int>(kHeadsK), p.seq_q = 1,
  p.seq_k = static_cast<int>(kSeqK);
  p.scale = 1.f / sqrtf(static_cast<float>(kD)), p.scale_log2 = p.scale * 1.4426950408889634f;
  CK(cudaFuncSetAttribute(decode_splitkv_partial<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
  const GridDims g = decode_splitkv_partial_grid(p.batch, p.heads, p.heads_k, 1, SPLITS);
  const GridDims gc = decode_splitkv_combine_grid(p.batch, p.heads, 1);
  return median_ms(
      [&] {
        decode_splitkv_partial<T><<<dim3(g.x, g.y, g.z), T::kThreads, T::kSmemBytes>>>(p);
        if (SPLITS > 1) decode_splitkv_combine<T><<<dim3(gc.x, gc.y, gc.z), decode_splitkv_combine_threads()>>>(p);
      },
      reps);
}

template <int MODE, int R>
static float run_stream(const unsigned short* k, const unsigned short* v, float* sink, const CUtensorMap& mk,
                        const CUtensorMap& mv, int reps) {
  const int smem = R * kTileBytes + 8 * R + 1024;
  CK(cudaFuncSetAttribute(stream_tiles<MODE, R>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int grid = static_cast<int>(kSplits * kHeadsK * kBatch);
  return median_ms([&] { stream_tiles<MODE, R><<<grid, kThreads, smem>>>(k, v, sink, mk, mv); }, reps);
}

int main(int argc, char** argv) {
  const bool profile = argc > 1 && std::strcmp(argv[1], "--profile") == 0;  // one launch each (for ncu)
  const size_t bytes = static_cast<size_t>(kRows) * kD * 2;  // each of K and V
  unsigned short *k, *v;
  float* sink;
  CK(cudaMalloc(&k, bytes));
  CK(cudaMalloc(&v, bytes));
  CK(cudaMalloc(&sink, 1 << 16));
  fill_random<<<1024, 256>>>(k, static_cast<long long>(bytes / 2), 1u);
  fill_random<<<1024, 256>>>(v, static_cast<long long>(bytes / 2), 2u);
  CK(cudaGetLastError());
  const size_t qbytes = static_cast<size_t>(kBatch) * 32 * kD * 2;
  unsigned short *q, *o;
  float *lse, *ws;
  CK(cudaMalloc(&q, qbytes));
  CK(cudaMalloc(&o, qbytes));
  CK(cudaMalloc(&lse, kBatch * 32 * 4));
  CK(cudaMalloc(&ws, static_cast<size_t>(kBatch) * 32 * 16 * (kD + 1) * 4));  // up to SPLITS 16
  fill_random<<<64, 256>>>(q, static_cast<long long>(qbytes / 2), 3u);
  const CUtensorMap mk = make_map(k), mv = make_map(v);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double gb = 2.0 * bytes / 1e9;
  std::printf("mode,ring,ms,gbps\n");
  const int reps = 9;
  if (profile) {
    run_stream<kCpAsync, 2>(k, v, sink, mk, mv, 1);
    run_decode<4, 256, 4, 1>(k, v, q, o, lse, ws, 1);
    return 0;
  }
  for (int round = 0; round < 3; ++round) {  // interleaved rounds: drift hits every mode alike
    auto row = [&](const char* name, int ring, float ms) { std::printf("%s,%d,%.4f,%.1f\n", name, ring, ms, gb / ms * 1e3); };
    row(mode_name[kCpAsync], 2, run_stream<kCpAsync, 2>(k, v, sink, mk, mv, reps));
    row(mode_name[kCpAsync], 3, run_stream<kCpAsync, 3>(k, v, sink, mk, mv, reps));
    row(mode_name[kCpAsyncL2], 2, run_stream<kCpAsyncL2, 2>(k, v, sink, mk, mv, reps));
    row(mode_name[kCpAsyncL2], 3, run_stream<kCpAsyncL2, 3>(k, v, sink, mk, mv, reps));
    row(mode_name[kBulk1d], 2, run_stream<kBulk1d, 2>(k, v, sink, mk, mv, reps));
    row(mode_name[kBulk1d], 3, run_stream<kBulk1d, 3>(k, v, sink, mk, mv, reps));
    row(mode_name[kTma2d], 2, run_stream<kTma2d, 2>(k, v, sink, mk, mv, reps));
    row(mode_name[kTma2d], 3, run_stream<kTma2d, 3>(k, v, sink, mk, mv, reps));
    const long long n = 2LL * bytes / 16;
    // K and V are two allocations: read each with half the grid's time (two launches).
    const float ms = median_ms(
        [&] {
          ldg_sum<<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(k), n / 2, sink);
          ldg_sum<<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(v), n / 2, sink);
        },
        reps);
    row("ldg", 0, ms);
    // The tuned configs at B 64 Sk 32k / 128k and their neighbours (gbps: K and V bytes only, as above).
    row("decode S4/BN256/W4/ST1", 0, run_decode<4, 256, 4, 1>(k, v, q, o, lse, ws, reps));
    row("decode S1/BN256/W4/ST1", 0, run_decode<1, 256, 4, 1>(k, v, q, o, lse, ws, reps));
    row("decode S16/BN256/W8/ST1", 0, run_decode<16, 256, 8, 1>(k, v, q, o, lse, ws, reps));
    row("decode S4/BN128/W8/ST2", 0, run_decode<4, 128, 8, 2>(k, v, q, o, lse, ws, reps));
    row("decode S4/BN64/W4/ST2", 0, run_decode<4, 64, 4, 2>(k, v, q, o, lse, ws, reps));
    // The H200's picks (B 64 Sk 32k: S1/BN32/W2/ST1; 128k: S4/BN128/W4/ST1) and deeper rings (STAGES 3, 4).
    row("decode S1/BN32/W2/ST1", 0, run_decode<1, 32, 2, 1>(k, v, q, o, lse, ws, reps));
    row("decode S4/BN128/W4/ST1", 0, run_decode<4, 128, 4, 1>(k, v, q, o, lse, ws, reps));
    row("decode S1/BN64/W4/ST3", 0, run_decode<1, 64, 4, 3>(k, v, q, o, lse, ws, reps));
    row("decode S1/BN64/W4/ST4", 0, run_decode<1, 64, 4, 4>(k, v, q, o, lse, ws, reps));
    row("decode S1/BN128/W4/ST3", 0, run_decode<1, 128, 4, 3>(k, v, q, o, lse, ws, reps));
    row("decode S4/BN64/W4/ST4", 0, run_decode<4, 64, 4, 4>(k, v, q, o, lse, ws, reps));
    row("decode S1/BN32/W2/ST4", 0, run_decode<1, 32, 2, 4>(k, v, q, o, lse, ws, reps));
    row("decode S4/BN128/W8/ST3", 0, run_decode<4, 128, 8, 3>(k, v, q, o, lse, ws, reps));
  }
  return 0;
}
