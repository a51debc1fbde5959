// FlashAttention-3's forward design on Hopper (sm_90a): TMA, an mbarrier pipeline, warp
// specialization and wgmma, fp16 or bf16 in and out, fp32 accumulation and softmax, fp32 LSE.
//   fa3_wgmma_fwd<Fa3WgmmaTraits<D, BLOCK_N, CONSUMERS, STAGES, OVERLAP, PINGPONG, P_SMEM, PERSISTENT,
//                                TWO_CTAS, MULTICAST, DTYPE, CAUSAL>>
//   (const AttnFwdParams, const __grid_constant__ AttnTensorMaps: Q box [BM][W], K and V [BN / cluster][W],
//   O [64][W], W = the swizzle's columns; Family::tensor_maps declares them)
// A tile is one query block of BM rows of one head of one batch entry.
// Grid, PERSISTENT 0: one CTA per tile, x = ceil(seq_q / BM) query blocks (reversed when causal: the
// heaviest first), y = heads, z = batch (PlainScheduler). PERSISTENT 1: 1 + TWO_CTAS CTAs per SM (any grid
// works), each looping over the tiles (PersistentScheduler). 128 x (CONSUMERS + 1) threads; kSmemBytes
// dynamic shared memory.
// TWO_CTAS 1: the launch bounds ask for two CTAs per SM (the register budgets are the traits' halves), so
// one CTA's prologue and epilogue overlap the other's main loop; the code is otherwise the same.
// MULTICAST 1: launched in clusters of two CTAs along x (the host's launch attribute); the producer of
// rank r copies rows [r BN/2, (r + 1) BN/2) of each K and V block into both CTAs' slot (one multicast box
// per column group), each CTA's k_full / v_full expecting the whole block; a slot's release (k_empty,
// v_empty) counts both CTAs' consumer warps, each arriving on both CTAs' barriers. Cluster barriers after
// the mbarrier inits (no copy lands on an uninitialised barrier) and before exit (no arrival reaches a CTA
// that is gone).
//
// Warpgroup 0, the producer, keeps kProducerRegs registers; one of its threads copies a tile's Q and
// then K(n), V(n) into the ring's next slot as soon as the consumers released the slot's previous block
// (k_empty after its S GEMM, v_empty after its P V GEMM), each completing on its own mbarrier (k_full,
// v_full: S can start before V lands). The ring
// runs on from one tile into the next; Q's slot is refilled once every consumer has finished the
// previous tile, its O store included (q_empty, PERSISTENT only).
// Consumer warpgroup c owns query rows [64c, 64c + 64) of the block; per K/V block n:
//   S = Q K^T            wgmma SS (Q and K K-major, swizzled), 64 x BN, k = D
//   mask, online softmax  rows' max over the quad, P = exp2(S scale_log2 - m scale_log2), l, alpha
//   O = alpha O + P V     wgmma RS: P packed to 16 bits from the S accumulators (the mma.sync A layout
//                         is wgmma's register A layout), V MN-major, 64 x D, k = BN; P_SMEM: SS, P
//                         staged in the consumer's shared-memory tile (interleaved core matrices)
//   release the slot      one arrival per warp: k_empty after the S GEMM, v_empty after P V
// OVERLAP 1 issues S(n+1) and P(n) V(n) back to back and computes the softmax of S(n+1) while
// P(n) V(n) runs; PINGPONG 1 has the consumers take turns at issuing (named barriers kTurn + c).
// Epilogue: O / l (16-bit) staged swizzled in the warpgroup's rows of Q's slot (OInQSlot), or with
// PERSISTENT where it fits in an O tile of its own (OInOwnTile), one TMA store per column group (TmaStore:
// rows past seq_q are clipped by the copy engine); lse by the threads that hold the rows. PERSISTENT, O in
// Q's slot: the storing thread waits until the copy engine has read the staged O, then releases Q's slot
// (one q_empty arrival per consumer warpgroup).
//
// Masking as fa2_mma: keys past seq_k (zero-filled by TMA) and causal keys j > i + seq_k - seq_q
// get S = -inf, only on blocks that straddle them; a row with no visible key ends with O = 0, lse = +inf.
//
// Score modifications (issue 32), fa3_wgmma_fwd<AttnModTraits<Traits, WINDOW, SOFTCAP>[, true]> (ModParams: the
// plain argument, then AttnMods): WINDOW reads only the key blocks some row of the tile sees (kv_span: the first
// block's index goes to the producer's copies and the consumers' key offsets) and masks per element the blocks
// that straddle an edge (mask_window); SOFTCAP maps S to tanh(S scale / c) (tanh.approx) before the mask, and
// c log2(e) is then the exp2-domain scale of the softmax and the LSE; ALIBI adds -slope |i + seq_k - seq_q - j|
// (in S's units: slope / scale, or slope / c after a softcap) to every element before the mask (add_alibi), so that
// the LSE includes it as FlashAttention's does. The plain kernels' code is unchanged.
// MASK (a mask_mod, AttnModTraits' fifth argument; MaskModParams: ModParams, then MaskModArgs): a tile walks its row
// of the block summary (MaskBlockList: the key blocks holding a visible pair), the producer loading and the
// consumers computing those alone; the blocks the list calls partial are masked per element by the predicate, keys
// past seq_k and causal (mask_predicate), the full ones not at all. Dense only, no MULTICAST, no window.
//
// Packed variable-length batches, fa3_wgmma_fwd<Traits, true> (VarlenParams: cu_seqlens_q/k): a tile is a
// query block of one head of one sequence (z, or the tile index's batch, is the sequence; seq_q/seq_k the
// longest lengths). The tensor maps are (d, heads, total tokens, 1) over the token-major tensors
// (tuner/tensor_maps.cpp), so a tile's box is rows of its own tokens; rows past the sequence's end are the
// next sequence's, and are masked as keys (key >= the sequence's seq_k) and never stored as queries. O goes
// out by TMA where the warpgroup's 64 rows lie inside the sequence, else by guarded 16-byte stores (a box
// would write the next sequence's rows): VarlenStore. Tiles past a sequence's end: no CTA work (PERSISTENT 0:
// the CTA exits at entry; PERSISTENT 1: the scheduler skips them, producer and consumers alike). Causal
// blocks are reversed within the sequence (PERSISTENT 0) or taken longest first across sequences
// (PERSISTENT 1).
#pragma once
#include "attention_params.h"
#include "device_common.cuh"
#include "fa3_wgmma_traits.h"
#include "wgmma_common.cuh"

namespace flashtune {

namespace fa3_wgmma_detail {

// Named barriers (0 is __syncthreads), one of each kind per consumer warpgroup c (+ c).
template <class T>
struct NamedBarrier {
  enum : int {
    kTurn = 1,                             // consumer c's turn to issue its GEMMs (PINGPONG; 256 threads, Turns)
    kOStaging = kTurn + T::kConsumers,     // warpgroup c's O staging written, or read (128 threads)
    kPStaged = kOStaging + T::kConsumers,  // consumer c's P tile staged for its P V GEMM (P_SMEM; 128 threads)
    kEnd = kPStaged + T::kConsumers,
  };
  static_assert(kEnd <= 16, "16 named barriers");
};

// Where everything lives in shared memory (base 1024-byte aligned). Column group g of a tile of R
// rows starts g * R * kSwizzle bytes after the tile.
template <class T>
struct Smem {
  // Byte offsets from the base: Q, the K/V ring, the P tiles, the O tile (if apart), the mbarriers.
  enum Region : unsigned {
    kQ = 0,
    kKv = kQ + T::kQBytes,                        // slot s: K at kKv + 2s kKvBytes, V after it
    kP = kKv + 2 * T::kStages * T::kKvBytes,      // P_SMEM: consumer c's P tile at kP + c kPBytes
    kO = kP + T::kConsumers * T::kPBytes,         // kSeparateO: O's staging tile
    kBars = kO + T::kOBytes,
    kEnd = kBars + fa3_wgmma_barrier_bytes(T::kStages, T::kPersistent),
  };
  // The mbarriers, byte offsets from kBars: q_full; per slot s, kSlotBars bytes apart, k_full, v_full, k_empty,
  // v_empty; q_empty (PERSISTENT) after the last slot's.
  enum Mbarrier : unsigned {
    kQFull = 0,
    kKFull = 8,
    kVFull = 16,
    kKEmpty = 24,
    kVEmpty = 32,
    kSlotBars = 32,
    kQEmpty = 8 + kSlotBars * T::kStages,
  };
  static_assert(kEnd + 1024 == T::kSmemBytes, "the regions add up to the traits' shared memory");
  unsigned q, kv, p, o, bars;  // p: P_SMEM, consumer c's P tile at p + c * kPBytes; o: O's staging tile
  __device__ explicit Smem(unsigned base)
      : q(base + kQ), kv(base + kKv), p(base + kP), o(T::kSeparateO ? base + kO : base), bars(base + kBars) {}
  __device__ unsigned k(int s) const { return kv + static_cast<unsigned>(2 * s * T::kKvBytes); }
  __device__ unsigned v(int s) const { return kv + static_cast<unsigned>((2 * s + 1) * T::kKvBytes); }
  __device__ unsigned q_full() const { return bars + kQFull; }
  __device__ unsigned k_full(int s) const { return bars + kKFull + kSlotBars * s; }
  __device__ unsigned v_full(int s) const { return bars + kVFull + kSlotBars * s; }
  __device__ unsigned k_empty(int s) const { return bars + kKEmpty + kSlotBars * s; }
  __device__ unsigned v_empty(int s) const { return bars + kVEmpty + kSlotBars * s; }
  __device__ unsigned q_empty() const { return bars + kQEmpty; }  // PERSISTENT only
};

// Slot and mbarrier parity of consecutive blocks in a ring of STAGES slots (across tiles: PERSISTENT).
template <int STAGES>
struct Ring {
  int slot = 0;
  unsigned parity = 0;
  bool reused = false;  // from the second lap on: a slot's block replaces one the consumers must release
  __device__ void next() {
    if (++slot == STAGES) slot = 0, parity ^= 1u, reused = true;
  }
};

// The CTAs that share each K and V block: the CTA alone, or (MULTICAST) a cluster of two on neighbouring
// query blocks, each CTA's producer copying its share of a block's rows into both CTAs' slot.
template <class T>
struct KvCluster {
  // Arrivals that release a K or V slot: lane 0 of every consumer warp of the cluster.
  static constexpr int kSlotReleases = 4 * T::kConsumers * T::kCluster;
  // The first row of a K or V block this CTA's producer copies (its share: kKvBoxRows rows).
  __device__ __forceinline__ static int first_row() {
    return T::kMulticast ? static_cast<int>(cluster_ctarank()) * T::kKvBoxRows : 0;
  }
  // A consumer warp's release of a K or V slot (by its lane 0); MULTICAST, on the other CTA's barrier too:
  // each CTA's producer refills its share of the slot in both.
  __device__ __forceinline__ static void release(unsigned bar) {
    mbar_arrive(bar);
    if constexpr (T::kMulticast) mbar_arrive_cluster(bar, cluster_ctarank() ^ 1u);
  }
  // After the mbarrier inits: the other CTA's barriers too, before its first copy lands here.
  __device__ __forceinline__ static void sync_after_init() {
    if constexpr (T::kMulticast) cluster_sync();
    else __syncthreads();
  }
  // Before a warpgroup leaves: the other CTA's consumers release their last slots on this CTA's barriers
  // too, so a CTA stays until they have (the producers arrive on leaving).
  __device__ __forceinline__ static void sync_before_exit() {
    if constexpr (T::kMulticast) cluster_sync();
  }
};

// A tile's first query row, head and batch entry.
struct Tile {
  int m0, head, batch;
};

// The tiles of a CTA, shared by the producer and the consumers (FlashAttention-3's tile schedulers): two
// types with one interface, the traits' PERSISTENT choosing (TileScheduler):
//   for (Scheduler s; s.valid(p); s.next()) { const Tile t = s.tile(p); ... }
// and Scheduler::empty_cta(p), true where the whole CTA has no work (it exits at entry).
// VARLEN: tiles past their sequence's end have no work, in the producer and the consumers alike.

// PERSISTENT 0: the one tile the CTA's grid position names, x the query block (reversed when causal: the
// heaviest first), y the head, z the batch entry. VARLEN: causal blocks are reversed within the sequence,
// and a CTA whose block lies past its sequence's end exits at entry.
template <class T, bool VARLEN, class P>
struct PlainScheduler {
  bool done = false;
  __device__ bool valid(const P&) const { return !done; }
  __device__ void next() { done = true; }
  __device__ Tile tile(const P& p) const {
    if constexpr (VARLEN) {  // causal: reversed within the sequence (blocks past its end: m0 < 0)
      const int qb = T::kCausal ? ceil_div(VarlenSeq::of<VARLEN>(p, blockIdx.z).seq_q, T::kBlockM) - 1 -
                                      static_cast<int>(blockIdx.x)
                                : static_cast<int>(blockIdx.x);
      return {qb * T::kBlockM, static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
    } else {
      const int qb = T::kCausal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
      return {qb * T::kBlockM, static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
    }
  }
  __device__ static bool empty_cta(const P& p) {
    if constexpr (VARLEN) {
      const int m0 = PlainScheduler().tile(p).m0;
      return m0 < 0 || m0 >= VarlenSeq::of<VARLEN>(p, blockIdx.z).seq_q;
    }
    return false;
  }
};

// PERSISTENT 1: tiles b, b + B, b + 2B, ... in fa3_wgmma_tile's order (causal: longest first), b the CTA's
// linear index and B the grid's CTAs, so that any grid is correct (the plain one, where the SM count was
// unknown, too). VARLEN: valid() moves on to the next tile that has rows.
template <class T, bool VARLEN, class P>
struct PersistentScheduler {
  int t;  // the rest is recomputed from the parameters: registers are what a consumer lacks
  __device__ PersistentScheduler()
      : t(static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z))) {}
  __device__ static int qblocks(const P& p) { return ceil_div(p.seq_q, T::kBlockM); }
  __device__ bool valid(const P& p) {
    if constexpr (VARLEN) {
      for (; t < qblocks(p) * p.heads * p.batch; next()) {
        const Tile x = tile(p);
        if (x.m0 < VarlenSeq::of<VARLEN>(p, x.batch).seq_q) return true;
      }
      return false;
    }
    return t < qblocks(p) * p.heads * p.batch;
  }
  __device__ void next() { t += static_cast<int>(gridDim.x * gridDim.y * gridDim.z); }
  __device__ Tile tile(const P& p) const {
    const Fa3Tile x = fa3_wgmma_tile(t, qblocks(p), p.heads, p.batch, T::kCausal,
                                     fa3_wgmma_causal_group(p.seq_k, T::kHeadDim, p.heads * p.batch,
                                                            static_cast<int>(gridDim.x * gridDim.y * gridDim.z)));
    return {x.qblock * T::kBlockM, x.head, x.batch};
  }
  __device__ static bool empty_cta(const P&) { return false; }
};

// A if C, else B (the traits' switches choosing a piece).
template <bool C, class A, class B>
struct Pick {
  using type = A;
};
template <class A, class B>
struct Pick<false, A, B> {
  using type = B;
};

template <class T, bool VARLEN = false, class P = AttnFwdParams>
using TileScheduler =
    typename Pick<T::kPersistent, PersistentScheduler<T, VARLEN, P>, PlainScheduler<T, VARLEN, P>>::type;

// Where a tile's rows are in the tensor maps: dense (d, seq, heads, batch) maps take (column, row, head,
// batch); packed ones (d, heads, total tokens, 1) take (column, head, first token + row, 0).
template <bool VARLEN>
struct MapCoords {
  long long q_tok0 = 0, k_tok0 = 0;  // VARLEN: the sequence's first query and key tokens
  __device__ void load_q(unsigned dst, const TmaDescriptor* map, int col, int row, int head, int batch,
                         unsigned bar) const {
    if constexpr (VARLEN) tma_load_4d(dst, map, col, head, static_cast<int>(q_tok0) + row, 0, bar);
    else tma_load_4d(dst, map, col, row, head, batch, bar);
  }
  __device__ void load_kv(unsigned dst, const TmaDescriptor* map, int col, int row, int head, int batch,
                          unsigned bar) const {
    if constexpr (VARLEN) tma_load_4d(dst, map, col, head, static_cast<int>(k_tok0) + row, 0, bar);
    else tma_load_4d(dst, map, col, row, head, batch, bar);
  }
};

// K/V blocks the tile at query row m0 reads: every key, or causal, the keys up to its last row's
// diagonal (key j is visible to query i iff j <= i + seq_k - seq_q: bottom-right aligned).
template <class T>
__device__ __forceinline__ int kv_blocks(int m0, int seq_q, int seq_k) {
  const int kv_end = T::kCausal ? imin(seq_k, imin(m0 + T::kBlockM, seq_q) + seq_k - seq_q) : seq_k;
  return kv_end > 0 ? ceil_div(kv_end, T::kBlockN) : 0;
}

// A window (AttnModTraits' WINDOW): query i sees key j iff i + lo <= j <= i + hi (window_band, traits_common.h:
// the window's edges around the bottom-right diagonal, causal capping hi at it).
template <class T, class P>
__device__ __forceinline__ void window_offsets(const P& p, int seq_q, int seq_k, int& lo, int& hi) {
  const WindowBand band = window_band(p.mods.window_left, p.mods.window_right, T::kCausal, seq_q, seq_k);
  lo = band.lo, hi = band.hi;
}

// The K/V blocks a tile reads: [first, first + count). Plain: from block 0 (kv_blocks). WINDOW: only the blocks
// some row of the tile sees (rows m0 .. min(m0 + BM, seq_q) - 1: keys m0 + lo .. last row + hi), so that blocks
// wholly outside the window are never loaded nor multiplied: a tile's work scales with the window.
// MASK (a mask_mod): the tile's list of the block summary (MaskBlockList: the key blocks holding a visible pair,
// each with its partial bit), so that the empty blocks are neither loaded nor multiplied; block nb of the span is
// the list's entry nb (span_block).
struct KvSpan {
  int first, count;
  const int* list = nullptr;  // MASK: the tile's list row
};
template <class T, class P>
__device__ __forceinline__ KvSpan kv_span(const P& p, int m0, int seq_q, int seq_k, int batch = 0, int head = 0) {
  if constexpr (MaskOf<T>::on()) {
    const MaskBlockList& blocks = p.mask.blocks;
    const long long row = blocks.row(batch, head, m0 / T::kBlockM);
    return {0, blocks.count[row], blocks.index + row * blocks.cols};
  } else if constexpr (ModsOf<T>::window) {
    int lo, hi;  // WindowBand::keys_of_rows written out (that form moved ptxas's schedule of the validated kernel)
    window_offsets<T>(p, seq_q, seq_k, lo, hi);
    const int first_key = imax(0, m0 + lo), end_key = imin(seq_k, imin(m0 + T::kBlockM, seq_q) + hi);
    if (end_key <= first_key) return {0, 0};
    const int first = first_key / T::kBlockN;
    return {first, ceil_div(end_key, T::kBlockN) - first};
  } else {
    return {0, kv_blocks<T>(m0, seq_q, seq_k)};
  }
}

// The key block of the span's block nb.
template <class T>
__device__ __forceinline__ int span_block(const KvSpan& blocks, int nb) {
  if constexpr (MaskOf<T>::on()) return MaskBlockList::block(blocks.list[nb]);
  else return blocks.first + nb;
}

// One tile's copies: Q into its slot, then every K/V block into the ring.
template <class T, bool VARLEN = false>
__device__ __forceinline__ void produce_tile(const Smem<T>& sm, const AttnTensorMaps& tm, const Tile& tile,
                                             int kv_head, KvSpan blocks, Ring<T::kStages>& ring,
                                             const MapCoords<VARLEN>& at = {}) {
  const int num_kv_blocks = blocks.count;
  constexpr int W = T::kGroupCols, SW = T::kSwizzle, BN = T::kBlockN;
  // A K or V block: one box per column group; MULTICAST, this CTA's share of the rows, into both CTAs.
  const int r0 = KvCluster<T>::first_row();
  auto load_block = [&](unsigned slot, const TmaDescriptor* map, int nb, unsigned bar) {
#pragma unroll
    for (int g = 0; g < T::kGroups; ++g) {
      const unsigned dst = slot + static_cast<unsigned>((g * BN + r0) * SW);
      if constexpr (T::kMulticast)
        tma_load_4d_multicast(dst, map, g * W, nb * BN + r0, kv_head, tile.batch, bar, (1u << T::kCluster) - 1u);
      else
        at.load_kv(dst, map, g * W, nb * BN, kv_head, tile.batch, bar);
    }
  };
  mbar_arrive_expect_tx(sm.q_full(), T::kQBytes);
#pragma unroll
  for (int g = 0; g < T::kGroups; ++g)
    at.load_q(sm.q + static_cast<unsigned>(g * T::kBlockM * SW), &tm.map[0], g * W, tile.m0, tile.head, tile.batch,
              sm.q_full());
  for (int nb = 0; nb < num_kv_blocks; ++nb, ring.next()) {
    // Each of K and V once the slot's previous one was read: K by its S GEMM, V by its P V GEMM, which
    // with OVERLAP ends an iteration later (one release for both would hold K(n + STAGES) back until
    // P(n) V(n) is done, and its load would then stall the next S GEMM).
    // MULTICAST: the slot is free in both CTAs (k_empty counts both's consumers), and this CTA's full
    // barrier expects the whole block, its own share and the other CTA's.
    if (ring.reused) mbar_wait(sm.k_empty(ring.slot), ring.parity ^ 1u);
    mbar_arrive_expect_tx(sm.k_full(ring.slot), T::kKvBytes);
    load_block(sm.k(ring.slot), &tm.map[1], span_block<T>(blocks, nb), sm.k_full(ring.slot));
    if (ring.reused) mbar_wait(sm.v_empty(ring.slot), ring.parity ^ 1u);
    mbar_arrive_expect_tx(sm.v_full(ring.slot), T::kKvBytes);
    load_block(sm.v(ring.slot), &tm.map[2], span_block<T>(blocks, nb), sm.v_full(ring.slot));
  }
}

// The producer thread: its CTA's tiles in turn; PERSISTENT: a tile's Q once every consumer warpgroup
// released Q's slot (q_empty: its S GEMMs done and its O store read), the ring running on.
template <class T, bool VARLEN = false, class P = AttnFwdParams>
__device__ __forceinline__ void produce(const Smem<T>& sm, const AttnTensorMaps& tm, const P& p) {
  Ring<T::kStages> ring;
  unsigned q_parity = 0;  // the tile's q_full phase; q_empty's of the previous tile is the other one
  bool first = true;
  for (TileScheduler<T, VARLEN, P> sched; sched.valid(p); sched.next(), q_parity ^= 1u, first = false) {
    const Tile tile = sched.tile(p);
    if (T::kPersistent && !first) mbar_wait(sm.q_empty(), q_parity ^ 1u);
    if constexpr (VARLEN) {  // the tile's sequence: its lengths and first tokens
      const VarlenSeq vs = VarlenSeq::of<VARLEN>(p, tile.batch);
      produce_tile<T, VARLEN>(sm, tm, tile, tile.head / query_group(p), kv_span<T>(p, tile.m0, vs.seq_q, vs.seq_k), ring,
                              MapCoords<VARLEN>{vs.q_tok0, vs.k_tok0});
    } else {
      produce_tile<T>(sm, tm, tile, tile.head / query_group(p),
                      kv_span<T>(p, tile.m0, p.seq_q, p.seq_k, tile.batch, tile.head), ring);
    }
  }
}

// S (64 x BN, raw scores) = Q_wg K^T: both operands K-major; k16 slice kk is 32 bytes into its group.
template <class T>
__device__ __forceinline__ void issue_qk(float (&s)[T::kBlockN / 2], unsigned q_wg, unsigned k_slot) {
  constexpr int SW = T::kSwizzle, SLICES = T::kGroupCols / 16;
  // Each slice's descriptors are the first ones advanced (desc_advance: one add on the low word), not rebuilt
  // from the address (mask, shift, or) per slice.
  const unsigned long long da0 = desc_k_major_sw<SW>(q_wg), db0 = desc_k_major_sw<SW>(k_slot);
#pragma unroll
  for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
    const unsigned col = static_cast<unsigned>(32 * (kk % SLICES));
    const unsigned long long da = desc_advance(da0, static_cast<unsigned>(kk / SLICES * T::kBlockM * SW) + col);
    const unsigned long long db = desc_advance(db0, static_cast<unsigned>(kk / SLICES * T::kBlockN * SW) + col);
    wgmma_ss<T::kBlockN, T::kDtype, 0, 0>(s, da, db, kk > 0);
  }
}

// The rows this thread holds (row0 = its first, row0 + 8 the second) and what masking needs.
struct Rows {
  int row0, col0;     // first row and the thread's first column within a block (2 tig)
  int seq_k, causal_offset;
  int wg_row0;        // the warpgroup's first row: masking is needed on a block iff some row of it needs it
  // Modifications only (set by with_mods; plain kernels never read them):
  int key0 = 0;       // WINDOW: the tile's first block's first key (blocks before it are skipped)
  int lo = 0, hi = 0;  // WINDOW: row i sees keys i + lo .. i + hi (window_offsets)
  float cap_scale = 0.f;  // SOFTCAP: scale / c, the raw score's factor inside tanh
  float alibi_slope = 0.f;  // ALIBI: -slope alibi_unit, the bias per key of distance in S's units
  const int* kv_list = nullptr;  // MASK: the tile's list row (KvSpan::list)
  int batch = 0, head = 0;       // MASK: the predicate's b and h (the tile's)
};

// The first key of the tile's block nb (of those it reads).
template <class T>
__device__ __forceinline__ int block_key(const Rows& r, int nb) {
  if constexpr (MaskOf<T>::on()) return MaskBlockList::block(r.kv_list[nb]) * T::kBlockN;
  else if constexpr (ModsOf<T>::window) return r.key0 + nb * T::kBlockN;
  else return nb * T::kBlockN;
}

// Masking with a window: -inf at keys past seq_k and keys outside [i + lo, i + hi]; only blocks that straddle the
// end of the keys or an edge of the window for some row of the warpgroup have any (the blocks wholly outside
// were skipped by kv_span, and a block wholly inside for all 64 rows needs nothing).
template <class T>
__device__ __forceinline__ void mask_window(float (&s)[T::kBlockN / 2], const Rows& r, int n0) {
  const bool needed = n0 + T::kBlockN > r.seq_k || r.wg_row0 + 63 + r.lo > n0 || r.wg_row0 + r.hi < n0 + T::kBlockN - 1;
  if (!needed) return;
#pragma unroll
  for (int j = 0; j < T::kSTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = r.row0 + 8 * (e >> 1);
      const int key = n0 + r.col0 + 8 * j + (e & 1);
      if (key >= r.seq_k || key < i + r.lo || key > i + r.hi) s[4 * j + e] = neg_inf();
    }
}

// ALiBi's bias on every element of the block at key n0: S += alibi_slope |i + seq_k - seq_q - key| (alibi_slope
// negative, in S's units). The distance in float from one conversion per block: d0, row0's distance to the
// thread's first key, then constants (8 rows down, 8 j + e keys right); exact, every distance being below 2^22.
// An FADD and an FFMA (|x| is an operand modifier) per element.
template <class T>
__device__ __forceinline__ void add_alibi(float (&s)[T::kBlockN / 2], const Rows& r, int n0) {
  const float d0 = static_cast<float>(r.row0 + r.causal_offset - n0 - r.col0);
#pragma unroll
  for (int j = 0; j < T::kSTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float dist = d0 + static_cast<float>(8 * (e >> 1) - 8 * j - (e & 1));
      s[4 * j + e] = fmaf(r.alibi_slope, fabsf(dist), s[4 * j + e]);
    }
}

// MASK (a mask_mod): the predicate's answers for a block, one bit per element of the thread's BN / 2 scores (element
// (j, e), the accumulators' numbering, is bit 4 j + e: lo holds bits 0-63, hi 64-127), masked where the key is
// past seq_k, (causal) past the row's diagonal, or the predicate says no; all clear where the summary calls the block
// full. Taken before the block's S GEMM (block_bits, in consume_*), while K lands and S's registers are free: tested
// after the GEMM, the predicate's loads were held beside S and O (NVRTC 13.0, sm_90a: up to 208 bytes of spills
// with three consumers). The empty type for the other kernels.
template <class T, bool MASK = MaskOf<T>::on()>
struct BlockBits {};
template <class T>
struct BlockBits<T, true> {
  unsigned long long lo = 0, hi = 0;
  __device__ bool masked(int x) const { return ((x < 64 ? lo >> x : hi >> (x - 64)) & 1ull) != 0; }
};
template <class T, class P>
__device__ __forceinline__ BlockBits<T> block_bits(const Rows& r, int n0, int nb, const P& p) {
  BlockBits<T> b;
  if constexpr (MaskOf<T>::on()) {
    using M = typename MaskOf<T>::type;
    if (!MaskBlockList::partial(r.kv_list[nb])) return b;
#pragma unroll
    for (int j = 0; j < T::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r.row0 + 8 * (e >> 1), key = n0 + r.col0 + 8 * j + (e & 1), x = 4 * j + e;
        // Bitwise, not short-circuit: the predicate runs for every element, its loads unconditional (MaskTensor's
        // bound check reads 0 outside a tensor), so that NVRTC issues the block's loads together and keeps one per
        // distinct index; behind || each load waited in its own branch (H200, a document mask: a partial block
        // cost 3.3 full ones).
        const bool m = (key >= r.seq_k) | (T::kCausal && key > i + r.causal_offset) |
                       !M::test(p.mask, r.batch, r.head, i, key);
        if (x < 64) b.lo |= static_cast<unsigned long long>(m) << x;
        else b.hi |= static_cast<unsigned long long>(m) << (x - 64);
      }
  }
  return b;
}
// -inf where the block's bits say masked (bits clear on a full block: nothing to do).
template <class T>
__device__ __forceinline__ void mask_predicate(float (&s)[T::kBlockN / 2], const Rows& r, int nb, const BlockBits<T>& bits) {
  if (!MaskBlockList::partial(r.kv_list[nb])) return;
#pragma unroll
  for (int x = 0; x < T::kBlockN / 2; ++x)
    if (bits.masked(x)) s[x] = neg_inf();
}

// -inf at keys past seq_k and (causal) keys j > i + causal_offset, for the block at key n0; only
// blocks that straddle the end of the keys or the warpgroup's diagonal have any.
// SOFTCAP first: S becomes tanh(S scale / c) (its exp2-domain factor, c log2(e), is the kernel's scale_log2), then
// ALIBI's bias (on every block), then the mask; WINDOW: mask_window instead; MASK: mask_predicate (nb: the block's
// place in the span, for its partial bit; bits: its block_bits).
template <class T>
__device__ __forceinline__ void mask(float (&s)[T::kBlockN / 2], const Rows& r, int n0, int nb,
                                     const BlockBits<T>& bits) {
  if constexpr (ModsOf<T>::softcap) {
#pragma unroll
    for (int x = 0; x < T::kBlockN / 2; ++x) s[x] = tanh_approx(s[x] * r.cap_scale);
  }
  if constexpr (ModsOf<T>::alibi) add_alibi<T>(s, r, n0);
  if constexpr (MaskOf<T>::on()) {
    mask_predicate<T>(s, r, nb, bits);
    return;
  }
  if constexpr (ModsOf<T>::window) {
    mask_window<T>(s, r, n0);
    return;
  }
  const bool needed = n0 + T::kBlockN > r.seq_k || (T::kCausal && n0 + T::kBlockN - 1 > r.wg_row0 + r.causal_offset);
  if (!needed) return;
#pragma unroll
  for (int j = 0; j < T::kSTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = r.row0 + 8 * (e >> 1);
      const int key = n0 + r.col0 + 8 * j + (e & 1);
      if (key >= r.seq_k || (T::kCausal && key > i + r.causal_offset)) s[4 * j + e] = neg_inf();
    }
}

// Online softmax of one block for the thread's two rows: P in place of S, running max m and
// (per-thread partial) sum l, and alpha, the factor O must be scaled by before P V is added.
// A row with no visible key yet keeps m = -inf and uses base 0: P = 0, alpha = 0, no NaN.
template <class T>
__device__ __forceinline__ void softmax(float (&s)[T::kBlockN / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                        float scale_log2) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = fmaxf(s[2 * h], s[2 * h + 1]);
#pragma unroll
    for (int j = 1; j < T::kSTiles; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[h], mx);
    const float base = m_new == neg_inf() ? 0.f : m_new * scale_log2;
    alpha[h] = fast_exp2(fmaf(m[h], scale_log2, -base));
    m[h] = m_new;
    float rs = 0.f;
#pragma unroll
    for (int j = 0; j < T::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = fast_exp2(fmaf(s[4 * j + 2 * h + e], scale_log2, -base));
        s[4 * j + 2 * h + e] = pv;
        rs += pv;
      }
    l[h] = fmaf(l[h], alpha[h], rs);
  }
}

template <class T>
__device__ __forceinline__ void rescale(float (&o)[T::kHeadDim / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < T::kOTiles; ++j) {
    o[4 * j] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
}

// Waits for the P V GEMM in flight, then O *= alpha. The branch on a warp vote (O *= 1 is skipped once
// the rows' maxima settle) also ends the basic block, and that matters: ptxas hoists a warpgroup wait
// to the top of its basic block, and in a build without the branch the whole softmax of the next block
// ran after this wait (SASS: both waits back to back after the S GEMM), i.e. no overlap at all.
template <class T>
__device__ __forceinline__ void wait_then_rescale(float (&o)[T::kHeadDim / 2], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
    wgmma_wait<0>();
    wgmma_fence_regs(o);
    rescale<T>(o, alpha);
  } else {
    wgmma_wait<0>();
  }
  wgmma_fence_regs(o);
}

// P, the A operand of O += P V (64 x BN, k = BN keys), in one of two places (P_SMEM):
//   registers: P's k16 slice kk as an A fragment is the packed accumulators of S n8 tiles 2kk, 2kk + 1;
//   shared memory: the consumer's P tile, interleaved core matrices (8 rows x 16 bytes, 128 contiguous
//     bytes: a warp's 4-byte stores of one n8 tile cover one whole core matrix, conflict free), published
//     to the warpgroup's GEMM by a proxy fence and a named barrier (kPStaged + c) before the issue.
// V is MN-major: slice kk is 16 rows in, its column groups BN * kSwizzle bytes apart.
template <class T, bool SMEM = T::kPSmem>
struct POperand;

template <class T>
struct POperand<T, false> {
  unsigned pa[T::kBlockN / 16][4];
  __device__ void stage(const float (&s)[T::kBlockN / 2]) {
#pragma unroll
    for (int kk = 0; kk < T::kBlockN / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) pa[kk][e] = pack_half2<T::kDtype>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
  }
  // Registers an asynchronous GEMM reads are kept live (and unmoved) until after its wait.
  __device__ void fence() { fence_frags(pa); }
  __device__ void issue(float (&o)[T::kHeadDim / 2], unsigned v_slot) const {
    constexpr int SW = T::kSwizzle;
    const unsigned long long d0 = desc_mn_major_sw<SW>(v_slot, T::kBlockN * SW);
#pragma unroll
    for (int kk = 0; kk < T::kBlockN / 16; ++kk)
      wgmma_rs<T::kHeadDim, T::kDtype, 1>(o, pa[kk], desc_advance(d0, static_cast<unsigned>(16 * SW * kk)), 1);
  }
};

template <class T>
struct POperand<T, true> {
  unsigned tile;  // this consumer's P tile
  int bar;        // its named barrier
  int row, tig;   // the thread's first row (of 64) and thread in quad
  __device__ void stage(const float (&s)[T::kBlockN / 2]) {
    store_frags<T::kDtype, T::kBlockN, T::kBlockN>(tile, s, row, 0, tig);
    fence_proxy_async();
  }
  __device__ void fence() {}
  __device__ void issue(float (&o)[T::kHeadDim / 2], unsigned v_slot) const {
    constexpr int SW = T::kSwizzle;
    named_bar_sync(bar, 128);  // every warp's rows staged
    const unsigned long long da0 = desc_k_major<T::kBlockN>(desc_offset(tile)),
                             db0 = desc_mn_major_sw<SW>(v_slot, T::kBlockN * SW);
#pragma unroll
    for (int kk = 0; kk < T::kBlockN / 16; ++kk)
      wgmma_ss<T::kHeadDim, T::kDtype, 0, 1>(o, desc_advance(da0, static_cast<unsigned>(256 * kk)),
                                             desc_advance(db0, static_cast<unsigned>(16 * SW * kk)), 1);
  }
};

// PINGPONG: consumer c waits for its turn (barrier kTurn + c) before issuing GEMMs and hands the turn
// to the next consumer (kTurn + (c + 1) % C) after; 128 waiting + 128 arriving threads each.
// Balanced per tile: the last consumer's arrival (begin_tile) lets consumer 0 go first, and consumer 0 takes
// the turn the last consumer passes after its last GEMMs (end_tile). The arrival follows q_full: by then
// consumer 0 has taken the previous tile's last turn (before its O store, which Q's reload waited for), so
// two arrivals never meet on barrier kTurn.
template <class T>
struct Turns {
  int c;
  __device__ void wait() const {
    if constexpr (T::kPingpong) named_bar_sync(NamedBarrier<T>::kTurn + c, 256);
  }
  __device__ void pass() const {
    if constexpr (T::kPingpong) named_bar_arrive(NamedBarrier<T>::kTurn + (c + 1) % T::kConsumers, 256);
  }
  __device__ void begin_tile() const {
    if constexpr (T::kPingpong) {
      if (c == T::kConsumers - 1) named_bar_arrive(NamedBarrier<T>::kTurn, 256);
    }
  }
  __device__ void end_tile() const {
    if constexpr (T::kPingpong) {
      if (c == 0) named_bar_sync(NamedBarrier<T>::kTurn, 256);
    }
  }
};

// One consumer warpgroup's main loop over a tile's blocks, serial: S, softmax, P V per block. `ring`
// is at the tile's first block and ends past its last.
// `args`: the kernel's argument (MASK reads the predicate's tensors from it).
template <class T, class Args>
__device__ __forceinline__ void consume_serial(const Smem<T>& sm, unsigned q_wg, const Rows& r, int num_kv_blocks,
                                               float scale_log2, bool lane0, Ring<T::kStages>& ring, POperand<T>& p,
                                               float (&o)[T::kHeadDim / 2], float (&m)[2], float (&l)[2],
                                               const Args& args) {
  for (int nb = 0; nb < num_kv_blocks; ++nb, ring.next()) {
    const int n0 = block_key<T>(r, nb);
    const BlockBits<T> bits = block_bits<T>(r, n0, nb, args);  // MASK: while K lands
    float s[T::kBlockN / 2];
    mbar_wait(sm.k_full(ring.slot), ring.parity);
    wgmma_fence();
    issue_qk<T>(s, q_wg, sm.k(ring.slot));
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(s);
    if (lane0) KvCluster<T>::release(sm.k_empty(ring.slot));
    mask<T>(s, r, n0, nb, bits);
    float alpha[2];
    softmax<T>(s, m, l, alpha, scale_log2);
    rescale<T>(o, alpha);
    p.stage(s);
    mbar_wait(sm.v_full(ring.slot), ring.parity);
    wgmma_fence_regs(o);
    p.fence();
    wgmma_fence();
    p.issue(o, sm.v(ring.slot));
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(o);
    p.fence();
    if (lane0) KvCluster<T>::release(sm.v_empty(ring.slot));
  }
}

// One consumer warpgroup's main loop with intra-warpgroup overlap: S(n+1) and P(n) V(n) issued
// together, the softmax of S(n+1) computed while P(n) V(n) runs. `ring` as consume_serial's.
template <class T, class Args>
__device__ __forceinline__ void consume_overlapped(const Smem<T>& sm, unsigned q_wg, const Rows& r, int num_kv_blocks,
                                                   float scale_log2, bool lane0, const Turns<T>& turns,
                                                   Ring<T::kStages>& ring, POperand<T>& p,
                                                   float (&o)[T::kHeadDim / 2], float (&m)[2], float (&l)[2],
                                                   const Args& args) {
  if (num_kv_blocks == 0) return;
  float s[T::kBlockN / 2];
  float alpha[2];
  Ring<T::kStages> cur = ring;  // the block whose P is staged in p
  const BlockBits<T> bits0 = block_bits<T>(r, block_key<T>(r, 0), 0, args);  // MASK: while K lands
  mbar_wait(sm.k_full(cur.slot), cur.parity);
  turns.wait();
  wgmma_fence();
  issue_qk<T>(s, q_wg, sm.k(cur.slot));
  wgmma_commit();
  turns.pass();
  wgmma_wait<0>();
  wgmma_fence_regs(s);
  if (lane0) KvCluster<T>::release(sm.k_empty(cur.slot));
  mask<T>(s, r, block_key<T>(r, 0), 0, bits0);
  softmax<T>(s, m, l, alpha, scale_log2);  // alpha = 0 scales the zero O: nothing to do
  p.stage(s);
  for (int nb = 1; nb < num_kv_blocks; ++nb) {
    Ring<T::kStages> nxt = cur;
    nxt.next();
    const BlockBits<T> bits = block_bits<T>(r, block_key<T>(r, nb), nb, args);  // MASK: while K lands
    mbar_wait(sm.k_full(nxt.slot), nxt.parity);
    mbar_wait(sm.v_full(cur.slot), cur.parity);
    turns.wait();
    wgmma_fence_regs(o);
    p.fence();
    wgmma_fence();
    issue_qk<T>(s, q_wg, sm.k(nxt.slot));
    wgmma_commit();
    p.issue(o, sm.v(cur.slot));
    wgmma_commit();
    turns.pass();
    wgmma_wait<1>();  // S(nb)
    wgmma_fence_regs(s);
    if (lane0) KvCluster<T>::release(sm.k_empty(nxt.slot));  // K(nb) read: its slot may take K(nb + STAGES) now
    mask<T>(s, r, block_key<T>(r, nb), nb, bits);
    softmax<T>(s, m, l, alpha, scale_log2);
    // The softmax is plain register arithmetic the compiler may move below the wait (NVVM): these pin
    // it above; wait_then_rescale's branch keeps ptxas from hoisting the wait above it.
    wgmma_fence_regs(s);
    wgmma_fence_regs(m);
    wgmma_fence_regs(l);
    wgmma_fence_regs(alpha);
    wait_then_rescale<T>(o, alpha);  // P(nb-1) V(nb-1)
    p.fence();
    if (lane0) KvCluster<T>::release(sm.v_empty(cur.slot));
    p.stage(s);
    cur = nxt;
  }
  mbar_wait(sm.v_full(cur.slot), cur.parity);
  turns.wait();
  wgmma_fence_regs(o);
  p.fence();
  wgmma_fence();
  p.issue(o, sm.v(cur.slot));
  wgmma_commit();
  turns.pass();
  wgmma_wait<0>();
  wgmma_fence_regs(o);
  p.fence();
  if (lane0) KvCluster<T>::release(sm.v_empty(cur.slot));
  ring = cur;
  ring.next();
}

// ---- The epilogue: O / l as 16 bits staged swizzled in shared memory, then stored; lse per row by the
// threads that hold the rows. Where O is staged is the traits' choice (kSeparateO: OInOwnTile, else OInQSlot),
// how it is stored the kernel form's (VARLEN: VarlenStore, else TmaStore); Epilogue names the pair.
// A staging's tile(): the warpgroup's rows of the staging, as an opaque value: the addresses depend on the
// thread alone, and would otherwise be hoisted out of the tile loop and held through the main loop
// (PERSISTENT, BN 176, C 3: 14 registers spilled).

// O staged in the warpgroup's rows of Q's slot (its own S GEMMs, the only readers, are done). The storing
// thread waits until the copy engine has read them (shared memory stays valid until then); PERSISTENT: it
// then releases Q's slot to the next tile's Q (q_empty: one arrival per consumer warpgroup).
template <class T>
struct OInQSlot {
  static constexpr int kQEmptyArrivals = T::kConsumers;  // PERSISTENT: each warpgroup's storing thread
  __device__ __forceinline__ static unsigned tile(const Smem<T>&, unsigned q_wg, int) {
    unsigned out = q_wg;
    asm volatile("" : "+r"(out));
    return out;
  }
  __device__ __forceinline__ static void gemms_done(const Smem<T>&, int) {}
  __device__ __forceinline__ static void before_staging(int, int) {}
  // By the thread that issued the TMA store, after its commit.
  __device__ __forceinline__ static void tma_issued(const Smem<T>& sm) {
    bulk_wait_read<0>();
    if constexpr (T::kPersistent) mbar_arrive(sm.q_empty());  // then the next tile's Q may land there
  }
  // After the warpgroup's direct stores (each thread's reads of the staging).
  __device__ __forceinline__ static void direct_done(const Smem<T>& sm, int tid, int c) {
    if constexpr (T::kPersistent) {
      named_bar_sync(NamedBarrier<T>::kOStaging + c, 128);  // every thread's reads of the staging done
      if (tid == 0) mbar_arrive(sm.q_empty());
    }
  }
  __device__ __forceinline__ static void last(int) {}
};

// O staged in a tile of its own (PERSISTENT, where it fits): Q's slot is free once the warp's GEMMs are
// done (lane 0 of each warp arrives on q_empty), and the next tile's Q loads during this epilogue; the tile
// is rewritten once the previous tile's O store has read it, and the CTA leaves once the last has.
template <class T>
struct OInOwnTile {
  static constexpr int kQEmptyArrivals = 4 * T::kConsumers;  // lane 0 of every consumer warp
  __device__ __forceinline__ static unsigned tile(const Smem<T>& sm, unsigned, int c) {
    unsigned out = sm.o + static_cast<unsigned>(64 * c * T::kSwizzle);
    asm volatile("" : "+r"(out));
    return out;
  }
  __device__ __forceinline__ static void gemms_done(const Smem<T>& sm, int lane) {
    if (lane == 0) mbar_arrive(sm.q_empty());
  }
  __device__ __forceinline__ static void before_staging(int tid, int c) {
    if (tid == 0) bulk_wait_read<0>();  // the previous tile's O store has read the tile (its issuing thread knows)
    named_bar_sync(NamedBarrier<T>::kOStaging + c, 128);
  }
  __device__ __forceinline__ static void tma_issued(const Smem<T>&) {}
  __device__ __forceinline__ static void direct_done(const Smem<T>&, int, int) {}
  __device__ __forceinline__ static void last(int tid) {
    if (tid == 0) bulk_wait_read<0>();  // the last O store has read the tile before the CTA's shared memory goes
  }
};

// Dense: one TMA box per column group of the warpgroup's 64 rows (rows past seq_q are clipped by the copy
// engine), by one thread. (VarlenStore's interface; the unused sequence is taken by value: as a reference it
// moved NVVM's code elsewhere in the kernel.)
template <class T, class Staging>
struct TmaStore {
  template <class P>
  __device__ __forceinline__ static void store(const Smem<T>& sm, const P&, const AttnTensorMaps& tm, unsigned out,
                                               const Tile& tile, int c, int tid, int, VarlenSeq) {
    if (tid == 0) {
#pragma unroll
      for (int grp = 0; grp < T::kGroups; ++grp)
        tma_store_4d(&tm.map[3], out + static_cast<unsigned>(grp * T::kBlockM * T::kSwizzle), grp * T::kGroupCols,
                     tile.m0 + 64 * c, tile.head, tile.batch);
      bulk_commit();
      Staging::tma_issued(sm);
    }
  }
};

// Packed (VARLEN): by TMA where the warpgroup's 64 rows lie inside the sequence, as dense; else by guarded
// 16-byte stores of the rows inside (a box would write the next sequence's rows). PERSISTENT 0: the TMA
// store's issuing thread does not wait for its reads (Staging::tma_issued is PERSISTENT's only).
template <class T, class Staging>
struct VarlenStore {
  template <class P>
  __device__ __forceinline__ static void store(const Smem<T>& sm, const P& p, const AttnTensorMaps& tm, unsigned out,
                                               const Tile& tile, int c, int tid, int seq_q, const VarlenSeq& vs) {
    constexpr int BM = T::kBlockM, SW = T::kSwizzle, W = T::kGroupCols;
    const int row0 = tile.m0 + 64 * c;  // the warpgroup's first row in the sequence
    if (row0 + 64 <= seq_q) {  // inside the sequence: one box per column group, as dense
      if (tid == 0) {
#pragma unroll
        for (int grp = 0; grp < T::kGroups; ++grp)
          tma_store_4d(&tm.map[3], out + static_cast<unsigned>(grp * BM * SW), grp * W, tile.head,
                       static_cast<int>(vs.q_tok0) + row0, 0);
        bulk_commit();
        if constexpr (T::kPersistent) Staging::tma_issued(sm);
      }
    } else {  // straddling the end: 16-byte stores of the rows inside, never the next sequence's
      constexpr int CPR = T::kHeadDim / 8;  // 16-byte chunks per row
      unsigned short* o_seq = static_cast<unsigned short*>(p.o) + vs.q_offset(p.heads, tile.head, T::kHeadDim);
      const long long o_stride = static_cast<long long>(p.heads) * T::kHeadDim;
      for (int idx = tid; idx < 64 * CPR; idx += 128) {
        const int r = idx / CPR, ck = idx % CPR;
        if (row0 + r < seq_q) {
          const int grp = 8 * ck / W, chunk = 8 * ck % W / 8;
          const uint4 val = ld_shared_v4(out + static_cast<unsigned>(grp * BM * SW) + sw_chunk<SW>(r, chunk));
          *reinterpret_cast<uint4*>(o_seq + (row0 + r) * o_stride + 8 * ck) = val;
        }
      }
      Staging::direct_done(sm, tid, c);
    }
  }
};

// A consumer warpgroup's epilogue: the staging and the store chosen, and the step they share, stage(). Per
// tile, once the warpgroup's GEMMs are done:
//   Staging::gemms_done, out = Staging::tile, Staging::before_staging, vs = stage, Store::store;
// and Staging::last after the last tile.
template <class T, bool VARLEN, class P>
struct Epilogue {
  using Staging = typename Pick<T::kSeparateO, OInOwnTile<T>, OInQSlot<T>>::type;
  using Store = typename Pick<VARLEN, VarlenStore<T, Staging>, TmaStore<T, Staging>>::type;

  // Full row sums over the quad, O / l into the staging `out` (the warpgroup's rows), lse for rows below seq_q
  // (the tile's sequence's), published to the copy engine (a proxy fence and the warpgroup's barrier).
  // `row0` is the thread's first row of the tile, `wg_row` of the warpgroup's, `tig` its thread in quad.
  // Returns the tile's sequence (VARLEN; its offsets are read here, not held through the main loop).
  __device__ __forceinline__ static VarlenSeq stage(const P& p, unsigned out, int c, int row0, int wg_row, int tig,
                                                    const Tile& tile, int seq_q, const float (&o)[T::kHeadDim / 2],
                                                    const float (&m)[2], const float (&l)[2], float scale_log2) {
    constexpr int BM = T::kBlockM, SW = T::kSwizzle, W = T::kGroupCols;
    int batch_out = tile.batch;  // VARLEN: opaque, so that the sequence's offsets are not hoisted into the loop
    if constexpr (VARLEN) asm volatile("" : "+r"(batch_out));
    const VarlenSeq vs = VarlenSeq::of<VARLEN>(p, batch_out);
    float* lse_out = p.lse + (VARLEN ? vs.lse_offset(tile.head)
                                     : (static_cast<long long>(tile.batch) * p.heads + tile.head) * seq_q);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float lt = l[h];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const float inv = lt > 0.f ? 1.f / lt : 0.f;
      const int r = wg_row + 8 * h;
#pragma unroll
      for (int j = 0; j < T::kOTiles; ++j) {
        const int grp = 8 * j / W, chunk = 8 * j % W / 8;
        st_shared_u32(out + static_cast<unsigned>(grp * BM * SW) + sw_chunk<SW>(r, chunk) + 4 * tig,
                      pack_half2<T::kDtype>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv));
      }
      const int i = row0 + 8 * h;
      if (tig == 0 && i < seq_q) lse_out[i] = lt > 0.f ? fmaf(m[h], scale_log2, fast_log2(lt)) * kLn2 : pos_inf();
    }
    fence_proxy_async();  // the generic-proxy writes, before the copy engine reads them
    named_bar_sync(NamedBarrier<T>::kOStaging + c, 128);
    return vs;
  }
};

}  // namespace fa3_wgmma_detail

// The kernel's argument: the dense or packed params, with the modifications' values after them where the traits
// have any (ModParams). One name for it, so that the kernel's mangled name stays short (compile-check
// --save-cubins names files after it; the nested expression made it 229-258 characters).
template <class Traits, bool VARLEN>
struct Fa3FwdArg {
  using type = typename ModParamsOf<ModsOf<Traits>::any, typename ParamsOf<VARLEN, AttnFwdParams>::type,
                                    MaskOf<Traits>::on()>::type;
};

// Traits: Fa3WgmmaTraits, or AttnModTraits<Fa3WgmmaTraits, WINDOW, SOFTCAP, ALIBI[, MASK]> (then the argument is
// ModParams, or MaskModParams with a mask_mod).
template <class Traits, bool VARLEN = false>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kCtasPerSm)
    fa3_wgmma_fwd(const typename Fa3FwdArg<Traits, VARLEN>::type p, const __grid_constant__ AttnTensorMaps tm) {
  using T = Traits;
  using P = typename Fa3FwdArg<Traits, VARLEN>::type;
  namespace det = fa3_wgmma_detail;
  using Epilogue = det::Epilogue<T, VARLEN, P>;
  constexpr int SW = T::kSwizzle;
  static_assert(!(VARLEN && T::kMulticast), "MULTICAST is dense only: a packed batch's spare CTAs exit at entry");
  static_assert(!MaskOf<T>::on() || (!VARLEN && !T::kMulticast && !ModsOf<T>::window),
                "a mask_mod is dense only, without MULTICAST (neighbouring tiles' lists differ) and without a window");
  check_dynamic_smem(T::kSmemBytes);
  if (det::TileScheduler<T, VARLEN, P>::empty_cta(p)) return;  // VARLEN, PERSISTENT 0: past the sequence's end

  extern __shared__ __align__(1024) unsigned char fa3_wgmma_smem[];
  const det::Smem<T> sm((smem_u32(fa3_wgmma_smem) + 1023u) & ~1023u);

  const int seq_q = p.seq_q, seq_k = p.seq_k;

  if (threadIdx.x == 0) {
    mbar_init(sm.q_full(), 1);
    for (int s = 0; s < T::kStages; ++s) {
      mbar_init(sm.k_full(s), 1);
      mbar_init(sm.v_full(s), 1);
      mbar_init(sm.k_empty(s), det::KvCluster<T>::kSlotReleases);
      mbar_init(sm.v_empty(s), det::KvCluster<T>::kSlotReleases);
    }
    if constexpr (T::kPersistent) mbar_init(sm.q_empty(), Epilogue::Staging::kQEmptyArrivals);
    fence_mbar_init();
  }
  det::KvCluster<T>::sync_after_init();

  // Broadcast from lane 0 so that ptxas sees the warpgroup index warp-uniform: every address and descriptor derived
  // from it lives in uniform registers (as fa3_wgmma_bwd's; no R2UR per wgmma).
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (wg == 0) {
    setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) {
      for (int i = 0; i < 4; ++i) prefetch_tensormap(&tm.map[i]);
      det::produce<T, VARLEN>(sm, tm, p);
    }
    det::KvCluster<T>::sync_before_exit();
    return;
  }
  setmaxnreg_inc<T::kConsumerRegs>();

  const int c = wg - 1;  // consumer index: query rows [64c, 64c + 64) of a tile
  const int tid = static_cast<int>(threadIdx.x) - 128 * wg;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int wg_row = 16 * warp + g;  // the thread's first row within the warpgroup's 64
  const unsigned q_wg = sm.q + static_cast<unsigned>(64 * c * SW);  // column group 0 of its rows
  // SOFTCAP: the capped score's factor (S holds tanh(S scale / c) by then), for the softmax and the LSE alike.
  float scale_log2 = p.scale_log2;
  if constexpr (ModsOf<T>::softcap) scale_log2 = p.mods.softcap_log2;
  const det::Turns<T> turns{c};
  det::POperand<T> pop;
  if constexpr (T::kPSmem)
    pop = {sm.p + static_cast<unsigned>(c * T::kPBytes), det::NamedBarrier<T>::kPStaged + c, wg_row, tig};

  det::Ring<T::kStages> ring;  // K/V blocks, on from one tile into the next
  unsigned q_parity = 0;       // the tile's q_full phase
  for (det::TileScheduler<T, VARLEN, P> sched; sched.valid(p); sched.next(), q_parity ^= 1u) {
    const det::Tile tile = sched.tile(p);
    const int m0 = tile.m0, batch = tile.batch;
    // VARLEN: the tile's sequence's lengths stand for the problem's below (its token offsets are read again
    // in the epilogue, not held through the main loop).
    int tile_seq_q = seq_q, tile_seq_k = seq_k;
    if constexpr (VARLEN) {
      const VarlenSeq vs = VarlenSeq::of<VARLEN>(p, batch);
      tile_seq_q = vs.seq_q, tile_seq_k = vs.seq_k;
    }
    const det::KvSpan span = det::kv_span<T>(p, m0, tile_seq_q, tile_seq_k, batch, tile.head);
    const int num_kv_blocks = span.count;
    det::Rows rows{m0 + 64 * c + wg_row, 2 * tig, tile_seq_k, tile_seq_k - tile_seq_q, m0 + 64 * c};
    if constexpr (ModsOf<T>::window) {
      rows.key0 = span.first * T::kBlockN;
      det::window_offsets<T>(p, tile_seq_q, tile_seq_k, rows.lo, rows.hi);
    }
    if constexpr (MaskOf<T>::on()) rows.kv_list = span.list, rows.batch = batch, rows.head = tile.head;
    if constexpr (ModsOf<T>::softcap) rows.cap_scale = p.mods.softcap_scale;
    if constexpr (ModsOf<T>::alibi)  // the tile's (batch or sequence, query head) slope, in S's units
      rows.alibi_slope = -p.mods.alibi_slopes[batch * p.mods.alibi_batch_stride + tile.head] * p.mods.alibi_unit;

    float o[T::kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < T::kHeadDim / 2; ++i) o[i] = 0.f;
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};

    mbar_wait(sm.q_full(), q_parity);
    turns.begin_tile();
    if constexpr (T::kOverlap)
      det::consume_overlapped<T>(sm, q_wg, rows, num_kv_blocks, scale_log2, lane == 0, turns, ring, pop, o, m, l, p);
    else
      det::consume_serial<T>(sm, q_wg, rows, num_kv_blocks, scale_log2, lane == 0, ring, pop, o, m, l, p);
    turns.end_tile();
    // The epilogue, after the pingpong's last turn: with O staged apart, gemms_done releases Q's slot, and the
    // next tile's first arrival on barrier kTurn must follow that.
    Epilogue::Staging::gemms_done(sm, lane);
    const unsigned out = Epilogue::Staging::tile(sm, q_wg, c);
    Epilogue::Staging::before_staging(tid, c);
    const VarlenSeq vs = Epilogue::stage(p, out, c, rows.row0, wg_row, tig, tile, tile_seq_q, o, m, l, scale_log2);
    Epilogue::Store::store(sm, p, tm, out, tile, c, tid, tile_seq_q, vs);
  }
  Epilogue::Staging::last(tid);
  det::KvCluster<T>::sync_before_exit();  // every copy into this CTA was waited for here
}

}  // namespace flashtune
