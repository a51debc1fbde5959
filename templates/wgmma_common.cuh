// Hopper warpgroup MMA (wgmma, sm_90a): shared-memory matrix descriptors for the interleaved
// ("no swizzle") layout, the issue/commit/wait protocol and the proxy fence. The instruction
// wrappers themselves are generated (wgmma_ops.cuh).
//
// Tile layout used by every wgmma operand here: a tile of R rows x C 16-bit columns is stored as
// 8 x 8 "core matrices" of 128 contiguous bytes (8 rows x 16 bytes), row group major:
//   byte(r, c) = ((r/8) * (C/8) + c/8) * 128 + (r%8) * 16 + (c%8) * 2
// so one 8-row group takes 16*C bytes. The same tile serves both operand orientations:
//   rows = M/N, columns = K (K-major, trans 0): LBO = 128 (next 8 columns), SBO = 16*C (next 8 rows)
//   rows = K, columns = M/N (MN-major, trans 1): LBO = 16*C (next 8 rows),   SBO = 128 (next 8 columns)
// (LBO: between core matrices adjacent in K; SBO: adjacent in M/N; PTX ISA, matrix descriptor.)
// A 16-byte chunk (r, c8) is one cp.async; 8 consecutive threads on rows r..r+7 of one chunk fill a
// whole core matrix (conflict free), and the tensor cores read whole core matrices.
#pragma once

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma needs the sm_90a target (arch-specific Hopper features)"
#endif

#include "device_common.cuh"
#include "wgmma_ops.cuh"

namespace flashtune {

// Byte offset of 16-byte chunk c8 (columns 8*c8 .. 8*c8+7) of row r in an interleaved tile of C columns.
template <int C>
__device__ __forceinline__ unsigned il_chunk(int r, int c8) {
  return static_cast<unsigned>((((r >> 3) * (C / 8) + c8) << 7) + ((r & 7) << 4));
}

// Matrix descriptor: start address, LBO, SBO (all in 16-byte units), no swizzle (bits 62-63 = 0).
// Built from two 32-bit halves so that a descriptor at base + constant offset costs one integer add
// on the low half (the start address field cannot carry into LBO: shared memory < 256 KB; but see
// desc_offset for kernels launched in clusters).
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned smem_addr, unsigned lbo, unsigned sbo) {
  const unsigned lo = (smem_addr >> 4) | ((lbo >> 4) << 16);
  const unsigned hi = sbo >> 4;
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}
// The address a descriptor's 14-bit start field takes: its low 18 bits. In a cluster launch a CTA's
// shared-memory addresses carry its rank from bit 24 up; given whole to wgmma_desc, rank 1's landed in the
// LBO field and moved fa3_wgmma's second V column group 256 bytes (two rows) on (MULTICAST, on the H100).
// Kernels that may run in clusters build descriptors from it (the swizzled ones below always do).
__device__ __forceinline__ unsigned desc_offset(unsigned smem_addr) { return smem_addr & 0x3FFFFu; }
// A descriptor moved `bytes` (a multiple of 16) on along its tile: only the 14-bit start field changes, with
// no carry into LBO while the tile lies inside the CTA's shared memory (< 256 KB, desc_offset's 18 bits). One
// 32-bit add on the low half, where building the moved descriptor anew takes four operations.
__device__ __forceinline__ unsigned long long desc_advance(unsigned long long d, unsigned bytes) {
  const unsigned lo = static_cast<unsigned>(d) + (bytes >> 4), hi = static_cast<unsigned>(d >> 32);
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}
// Descriptor of an operand whose tile rows are M/N and columns K (C columns): trans flag 0.
template <int C>
__device__ __forceinline__ unsigned long long desc_k_major(unsigned addr) {
  return wgmma_desc(addr, 128, 16 * C);
}
// Descriptor of an operand whose tile rows are K and columns M/N (C columns): trans flag 1.
template <int C>
__device__ __forceinline__ unsigned long long desc_mn_major(unsigned addr) {
  return wgmma_desc(addr, 16 * C, 128);
}

// This thread's elements of a 64 x N accumulator tile (rows row, row + 8 of its warp's 16), packed to
// 16 bits, into columns col0.. of an interleaved tile of C columns: a warp's stores of one n8 tile
// cover one whole core matrix (128 contiguous bytes), conflict free.
template <int DTYPE, int N, int C>
__device__ __forceinline__ void store_frags(unsigned tile, const float (&x)[N / 2], int row, int col0, int tig) {
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    st_shared_u32(tile + il_chunk<C>(row, col0 / 8 + j) + 4 * tig, pack_half2<DTYPE>(x[4 * j], x[4 * j + 1]));
    st_shared_u32(tile + il_chunk<C>(row + 8, col0 / 8 + j) + 4 * tig, pack_half2<DTYPE>(x[4 * j + 2], x[4 * j + 3]));
  }
}

// The A fragment (mma.sync m16n8k16 layout, wgmma's register A layout) of k16 slice kk from accumulators in
// the wgmma C layout (n8 tile j at x[4j .. 4j+3]): tiles 2kk and 2kk+1.
template <int DTYPE, int N>
__device__ __forceinline__ void pack_a(unsigned (&a)[4], const float (&x)[N], int kk) {
  a[0] = pack_half2<DTYPE>(x[8 * kk + 0], x[8 * kk + 1]);
  a[1] = pack_half2<DTYPE>(x[8 * kk + 2], x[8 * kk + 3]);
  a[2] = pack_half2<DTYPE>(x[8 * kk + 4], x[8 * kk + 5]);
  a[3] = pack_half2<DTYPE>(x[8 * kk + 6], x[8 * kk + 7]);
}

// All k16 slices of a 64 x K accumulator tile as 16-bit A fragments.
template <int DTYPE, int K>
__device__ __forceinline__ void pack_all(unsigned (&a)[K / 16][4], const float (&x)[K / 2]) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) pack_a<DTYPE, K / 2>(a[kk], x, kk);
}

// A 64 x C tile's A fragments (pack_all) into rows r, r + 8 of an interleaved tile of C columns (the
// backward families' dS^T tile [BN][BM]).
template <int C>
__device__ __forceinline__ void store_a_frags(unsigned tile, const unsigned (&a)[C / 16][4], int r, int tig) {
#pragma unroll
  for (int kk = 0; kk < C / 16; ++kk) {
    st_shared_u32(tile + il_chunk<C>(r, 2 * kk) + 4 * tig, a[kk][0]);
    st_shared_u32(tile + il_chunk<C>(r + 8, 2 * kk) + 4 * tig, a[kk][1]);
    st_shared_u32(tile + il_chunk<C>(r, 2 * kk + 1) + 4 * tig, a[kk][2]);
    st_shared_u32(tile + il_chunk<C>(r + 8, 2 * kk + 1) + 4 * tig, a[kk][3]);
  }
}

// The same stores by stmatrix (sm_90): one m8n8.x4 per k16 slice stores the warp's four core matrices of it
// (rows row0 .. row0 + 15, chunks 2 kk and 2 kk + 1), each thread giving one row's address; a[kk][i] is
// matrix i's fragment (i: rows + 8 (i & 1), chunk + (i >> 1)), as pack_a lays them out. row0: the warp's
// first row (a multiple of 16).
template <int C>
__device__ __forceinline__ void store_a_frags_stsm(unsigned tile, const unsigned (&a)[C / 16][4], int row0, int lane) {
  const int mi = lane >> 3;
  const unsigned at = tile + il_chunk<C>(row0 + 8 * (mi & 1) + (lane & 7), mi >> 1);
#pragma unroll
  for (int kk = 0; kk < C / 16; ++kk)
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(at + 256u * kk),
                 "r"(a[kk][0]), "r"(a[kk][1]), "r"(a[kk][2]), "r"(a[kk][3])
                 : "memory");
}

// A backward's epilogue: a warp's 16 rows of an accumulator tile of NCOL columns (dK or dV, times mul, 16-bit)
// staged in shared memory by stmatrix, then stored as whole rows, 16 bytes a lane (a warp's store covers 512
// contiguous bytes where NCOL is 64 or 128 and the rows are adjacent). Stored straight from the accumulators, a
// thread's 4-byte pairs took NCOL / 4 stores that each touched 8 rows: ~4 us of a d 128 CTA's fixed cost
// (fa3_wgmma_bwd, docs/kernels.md). tile: the warp's 16 x NCOL region (16-byte aligned, no other reader), 16-byte
// chunk j of row r at j ^ (r & kSw): conflict free for the 8 rows of a matrix and for the read-back of a row.
// out: row 0 of the output, rows `stride` elements apart; row0 the warp's first row; rows >= seq not stored.
template <int DTYPE, int NCOL>
__device__ __forceinline__ void store_rows_staged(unsigned short* out, const float (&acc)[NCOL / 2], float mul,
                                                  unsigned tile, int row0, int seq, int lane, long long stride,
                                                  int col0) {
  constexpr int kChunks = NCOL / 8;
  static_assert(kChunks % 2 == 0, "stmatrix x4 stores two 16-byte chunks of 16 rows");
  constexpr int kSw = ((kChunks & -kChunks) < 8 ? (kChunks & -kChunks) : 8) - 1;  // 12 chunks (d 96): XOR by 2 bits
  const int mi = lane >> 3, r = 8 * (mi & 1) + (lane & 7);
#pragma unroll
  for (int j = 0; j < kChunks; j += 2) {
    const unsigned at0 = tile + static_cast<unsigned>(r * 2 * NCOL + 16 * ((j + (mi >> 1)) ^ (r & kSw)));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(at0),
                 "r"(pack_half2<DTYPE>(acc[4 * j] * mul, acc[4 * j + 1] * mul)),
                 "r"(pack_half2<DTYPE>(acc[4 * j + 2] * mul, acc[4 * j + 3] * mul)),
                 "r"(pack_half2<DTYPE>(acc[4 * j + 4] * mul, acc[4 * j + 5] * mul)),
                 "r"(pack_half2<DTYPE>(acc[4 * j + 6] * mul, acc[4 * j + 7] * mul))
                 : "memory");
  }
  __syncwarp();
#pragma unroll
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int row = i / kChunks, j = i % kChunks;
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(tile + static_cast<unsigned>(row * 2 * NCOL + 16 * (j ^ (row & kSw))))
                 : "memory");
    if (row0 + row < seq)  // (a uint4 assignment from these asm outputs was split into four 4-byte stores)
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(out + (row0 + row) * stride + col0 + 8 * j),
                   "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                   : "memory");
  }
}

// Registers an asynchronous GEMM reads (A fragments), kept live and unmoved until after its wait.
template <int N>
__device__ __forceinline__ void fence_frags(unsigned (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}

// x, hidden from the optimiser: tile addresses made opaque once per loop step, so that ptxas rebuilds each
// descriptor (one add) instead of hoisting dozens of loop-invariant 64-bit descriptors into registers.
__device__ __forceinline__ unsigned opaque(unsigned x) {
  asm volatile("" : "+r"(x));
  return x;
}

// Swizzled tiles (fa3_wgmma; loaded and stored by TMA with the same swizzle): a tile of R rows x W
// 16-bit columns, W*2 = SW bytes per row (SW = 128, 64 or 32), rows contiguous, the 16-byte chunk c of
// row r stored at chunk c ^ ((r * SW / 128) % (SW / 16)): bits [4, 4+b) of the byte offset XOR bits
// [7, 7+b), b = log2(SW/16) (CuTe's Swizzle<b,4,3>). Wider matrices are column groups of W columns,
// each an R x W tile. Tile bases are 1024-byte aligned (the swizzle reads absolute address bits).
// Descriptor layout types (bits 62-63): 1 = 128-byte, 2 = 64-byte, 3 = 32-byte swizzle.
template <int SW>
__device__ __forceinline__ constexpr unsigned swizzle_layout_type() {
  return SW == 128 ? 1u : SW == 64 ? 2u : 3u;
}
// Byte offset of 16-byte chunk c of row r in a swizzled R x (SW/2) tile.
template <int SW>
__device__ __forceinline__ unsigned sw_chunk(int r, int c) {
  const unsigned off = static_cast<unsigned>(r * SW + 16 * c);
  return off ^ (((off >> 7) & (SW / 16 - 1)) << 4);
}
// K-major operand (rows M/N, columns K) in SW-swizzled groups: 8-row groups SBO = 8*SW apart; the
// k16 slices inside a group are reached by adding 32 bytes per slice to the start address (LBO unused).
template <int SW>
__device__ __forceinline__ unsigned long long desc_k_major_sw(unsigned addr) {
  return wgmma_desc(desc_offset(addr), 16, 8 * SW) | (static_cast<unsigned long long>(swizzle_layout_type<SW>()) << 62);
}
// MN-major operand (rows K, columns M/N) in SW-swizzled groups of SW/2 columns that lie group_bytes
// apart (LBO); 8-row K groups SBO = 8*SW apart (CuTe's canonical MN-major layouts).
template <int SW>
__device__ __forceinline__ unsigned long long desc_mn_major_sw(unsigned addr, unsigned group_bytes) {
  return wgmma_desc(desc_offset(addr), group_bytes, 8 * SW) | (static_cast<unsigned long long>(swizzle_layout_type<SW>()) << 62);
}

// Registers written by ordinary instructions (accumulators, A fragments) before a wgmma reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most N committed groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across issue / wait points.
template <int N>
__device__ __forceinline__ void wgmma_fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Ordinary shared-memory writes (st.shared, cp.async) made visible to the async proxy (wgmma
// operands); each writing thread runs it before the barrier that publishes the data.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Named barrier over `threads` threads (a multiple of 32): bar.sync waits, bar.arrive signals only.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Bulk reduction shared -> global (the copy engine): gptr[0 .. bytes/4) += smem[...] in fp32; bytes
// a multiple of 16, both addresses 16-byte aligned. Tracked by bulk groups of the issuing thread.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gptr, unsigned smem_addr, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gptr),
               "r"(smem_addr), "r"(bytes)
               : "memory");
}
// gptr[0 .. 4) += v by one vector reduction in L2 (sm_90: red.global.add.v4.f32; relaxed, gpu scope; gptr 16-byte
// aligned). No ordering with other threads' adds: their sum is the same up to fp32 rounding order.
__device__ __forceinline__ void red_add_v4(float* gptr, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(gptr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most N bulk groups are pending: .read = their shared-memory sources may be reused.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// Turns between CTAs over a global counter (deterministic reductions): the caller waits until the counter
// reads `turn` (acquire), does its part, and passes the turn on (release). A part done by the copy engine
// is complete (bulk_wait<0>) before it is passed on; the proxy fence orders the engine's global writes with
// the generic release, and the acquire with the engine's next reads.
__device__ __forceinline__ void turn_wait(const int* counter, int turn) {
  int v;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
    if (v == turn) break;
    __nanosleep(32);
  }
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
__device__ __forceinline__ void turn_pass(int* counter) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// Bulk copy global -> shared (the copy engine): smem[0 .. bytes) = gptr[...]; bytes a multiple of 16,
// both addresses 16-byte aligned. Completion is counted in bytes on the mbarrier at `bar`.
__device__ __forceinline__ void bulk_load(unsigned smem_addr, const void* gptr, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr),
               "l"(gptr), "r"(bytes), "r"(bar)
               : "memory");
}
// mbarrier: `count` arrivals complete a phase. Initialised by one thread, then fenced and published by
// a barrier before any other thread or the copy engine uses it.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// This thread's arrival, announcing `bytes` of bulk copies that complete the phase with it.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Until the phase with this parity (0 for the first, then alternating) has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// ---- TMA (cp.async.bulk.tensor) and register reallocation ----

// A CUtensorMap encoded by the host (the worker, the runtime), passed as a __grid_constant__ kernel
// parameter; its address is the generic address the TMA instructions take.
// 4-D tile copy global -> shared of the box at coordinates (c0 innermost .. c3), completing `bytes`
// (the whole box, out-of-bounds elements zero-filled) on the mbarrier at `bar`.
__device__ __forceinline__ void tma_load_4d(unsigned dst, const void* map, int c0, int c1, int c2, int c3, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
          dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// 4-D tile copy shared -> global; elements outside the tensor are not written. Tracked by bulk groups
// of the issuing thread (bulk_commit, bulk_wait_read).
__device__ __forceinline__ void tma_store_4d(const void* map, unsigned src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void prefetch_tensormap(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
// Arrival without transaction bytes (a consumer releasing a buffer).
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// ---- thread-block clusters: TMA multicast ----

// This CTA's rank in its cluster (fixed for the CTA's life: not volatile, so read once where used in a loop).
__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned r;
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of the cluster arrives, then waits for the others: shared-memory writes and mbarrier inits
// before it are visible to the other CTAs after it, and no CTA exits while another may still signal it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// An arrival on the mbarrier at the same shared-memory offset as `bar` in the cluster's CTA `rank`
// (a consumer releasing a buffer that CTA's producer refills: default semantics, as CUTLASS's
// ClusterBarrier; .release.cluster made every release a cluster-wide fence).
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}
// tma_load_4d into the same shared-memory offset of every CTA of the cluster in `cta_mask` (bit i: rank i),
// each copy completing the box's bytes on that CTA's mbarrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_4d_multicast(unsigned dst, const void* map, int c0, int c1, int c2, int c3,
                                                      unsigned bar, unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "h"(cta_mask)
      : "memory");
}
// Warpgroup register reallocation: every thread of the warpgroup runs it with the same count.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace flashtune
