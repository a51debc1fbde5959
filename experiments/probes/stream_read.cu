// Probe: how fast each way of streaming K/V tiles into shared memory reads HBM on the lent Hopper GPU,
// in decode_splitkv's geometry at its tightest point (Llama-3 8B, B 64, Hk 8, Sk 32k, d 128, bf16: 8.6 GB
// of K and V read once; SPLITS 4 x Hk x B = 2048 CTAs of 128 threads, 64 KB tiles of 256 keys, K and V
// alternating). It answers one question (docs/kernels.md, "decode_splitkv: the bandwidth plateau"): is
// the plateau of every tuned config at ~2.98-3.0 TB/s, 1.5-2.5% under cuDNN, the cost of 16-byte cp.async,
// or of the hardware? Each loader fills a ring of R tile slots, R - 1 tiles in flight ahead of the one
// consumed (R = 2 is decode_splitkv's STAGES 1 in bytes in flight); a consumer reads a little of each
// tile (so that nothing is elided) and releases it.
//   cpasync      16-byte cp.async.cg per thread and chunk (decode_splitkv's loader)
//   cpasync_l2   the same with the .L2::256B prefetch qualifier
//   bulk1d       one cp.async.bulk of the whole 64 KB tile (contiguous in the dense layout), mbarrier
//   tma2d        two 2-D TMA boxes (64 columns x 256 rows, 128-byte swizzle), mbarrier: the form a
//                conflict-free ldmatrix layout would take
//   ldg          the read ceiling: a grid-stride sum of 16-byte loads into registers, no shared memory
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I templates experiments/probes/stream_read.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "device_common.cuh"
#include "wgmma_common.cuh"

using namespace flashtune;

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

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
                                      long long row0, const CUtensorMap* maps) {
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
      const CUtensorMap* map = &maps[t & 1];
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
  const CUtensorMap maps[2] = {mk, mv};
  const int split = blockIdx.x % kSplits, head = blockIdx.x / kSplits % kHeadsK, batch = blockIdx.x / kSplits / kHeadsK;
  const long long row0 = ((batch * kHeadsK + head) * kSeqK) + split * (kSeqK / kSplits);
  const int tiles = 2 * kBlocksPerSplit;
  if (threadIdx.x == 0)
    for (int s = 0; s < R; ++s) mbar_init(bars + 8 * s, 1);
  fence_mbar_init();
  __syncthreads();
  for (int t = 0; t < R - 1; ++t) issue<MODE>(t, base + t * kTileBytes, bars + 8 * t, k, v, row0, maps);
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
    if (nt < tiles) issue<MODE>(nt, base + (nt % R) * kTileBytes, bars + 8 * (nt % R), k, v, row0, maps);
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

template <class F>
static float median_ms(F launch, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  launch();  // warm-up
  CK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float x;
    CK(cudaEventElapsedTime(&x, a, b));
    ms.push_back(x);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <int MODE, int R>
static float run_stream(const unsigned short* k, const unsigned short* v, float* sink, const CUtensorMap& mk,
                        const CUtensorMap& mv, int reps) {
  const int smem = R * kTileBytes + 8 * R + 1024;
  CK(cudaFuncSetAttribute(stream_tiles<MODE, R>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int grid = static_cast<int>(kSplits * kHeadsK * kBatch);
  return median_ms([&] { stream_tiles<MODE, R><<<grid, kThreads, smem>>>(k, v, sink, mk, mv); }, reps);
}

int main() {
  const size_t bytes = static_cast<size_t>(kRows) * kD * 2;  // each of K and V
  unsigned short *k, *v;
  float* sink;
  CK(cudaMalloc(&k, bytes));
  CK(cudaMalloc(&v, bytes));
  CK(cudaMalloc(&sink, 1 << 16));
  CK(cudaMemset(k, 0x3c, bytes));
  CK(cudaMemset(v, 0x3c, bytes));
  const CUtensorMap mk = make_map(k), mv = make_map(v);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double gb = 2.0 * bytes / 1e9;
  std::printf("mode,ring,ms,gbps\n");
  const int reps = 9;
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
  }
  return 0;
}
