// FlashAttention-3's backward design on Hopper (sm_90a): TMA, an mbarrier ring, warp specialization,
// wgmma, and dQ by TMA reduce-add from a warp of its own. fp16 or bf16 in and out, fp32 accumulation.
// Kernels, launched in order (T = Fa3WgmmaBwdTraits<D, BLOCK_M, CONSUMERS, STAGES, SCHED, DQ_OVERLAP, DQ_TURNS,
//                                                  DETERMINISTIC, DQ_STAGES, DTYPE, CAUSAL>):
//   fa3_wgmma_bwd_preprocess<T>  per query row (padded to whole blocks): lse2 = lse log2(e), delta =
//                                rowsum(dO * O) (zeros past seq_q), dq_accum = 0, turn counters = 0
//   fa3_wgmma_bwd_dkdv<T>        per (key block, kv head, batch): dK, dV; dq_accum += dS K
//   fa3_wgmma_bwd_convert<T>     dQ = 16-bit(scale dq_accum)
// Workspace (p.workspace, fa3_bwd_workspace_bytes): lse2 [B H][R], delta [B H][R], dq_accum [B H][R][D]
// fp32, turns [B H][R / BLOCK_M] int32, R = seq_q rounded up to BLOCK_M. A query block's BM x D floats of dq_accum
// are the image of the dQ staging tile: its wgmma chains (64 rows x DQ_CHUNK columns each, row tiles first) one
// after the other, each in the accumulators' register order (DqLayout); the convert maps them back to rows.
//
// The dK/dV CTA (tensor maps: Q box [BM][W], K and V [BN][W], dO [BM][W]; W = the swizzle's columns):
//   warp 0 (producer)   one thread: K and V of the block once (kv_full), then per step Q, dO (TMA) and lse2,
//                       delta (bulk copies) into ring slot t % STAGES (q_full), once the consumers released
//                       the slot's previous step (q_empty)
//   warps 1 .. DQ_STAGES (dQ writers) writer b owns staging tile b and the steps t = b mod DQ_STAGES. The tile
//                       holds one piece per consumer warpgroup (FlashAttention-3's per-warpgroup dQ; one piece
//                       under DQ_TURNS): for each piece in turn the writer waits for its consumer (named barrier
//                       dq_full(b, piece)) and adds it into dq_accum with one cp.reduce.async.bulk, then frees
//                       each piece once read (dq_empty(b, piece)), so a consumer waits for its own piece only;
//                       with two tiles the consumers stage step t + 1 while step t's adds are under way.
//                       DQ_STAGES 0: no writer; each consumer adds its chains into dq_accum itself (add_dq).
//                       DETERMINISTIC: waits for the query block's turn counter to read its key block's
//                       turn, adds, waits for the add to complete and passes the turn on; key block j
//                       adds to every query block it sees iff blocks 0 .. j - 1 do (the first visible query
//                       block grows with j), so the additions run in key-block order: 1 from block 0 up,
//                       2 from the query block's last block J down (bwd_dq_turn)
//   consumers           warpgroup c owns keys [64c, 64c + 64) of the block; per step (a query block of one
//                       query head of the group):
//     S^T  = K_c Q^T        SS, K-major both, m64 x BM, k = D
//     dP^T = V_c dO^T       SS, m64 x BM, k = D (issued with S^T; P^T computed while it runs)
//     P^T  = exp2(S^T scale log2(e) - lse2), dS^T = P^T (dP^T - delta)    registers
//     dV  += P^T dO         RS, dO MN-major, m64 x D, k = BM
//     dK  += dS^T Q         RS, Q MN-major
//     dS^T -> shared memory (its own tile of two, by step parity); named barrier kDsReady
//     dQ_piece = dS K       SS, dS M-major (interleaved tile), K MN-major; staged in fp32 (register order)
//                           in the warpgroup's own piece of the staging tile for the writer
//                           (BLOCK_M 80, 96: dQ^T_piece = K^T dS^T, K's 64-column group MN-major, dS^T N-major,
//                           N = BLOCK_M: FlashAttention-3's dQ_swapAB; the convert transposes it back)
//   DQ_OVERLAP 0 issues dV and dK together and the dQ chains once both are done; 1 issues dV, then (after
//   the barrier) the one dQ chain and dK together, and stages dQ while dK runs.
//   DQ_TURNS 1 (two consumers): step t's whole dQ is consumer t % 2's, which alone waits for the other's dS^T;
//   the other goes on to step t + 1, so that one consumer's softmax runs during the other's dQ GEMMs.
// dK and dV stay in registers over every step and are stored once (times scale for dK): summed over a
// query group's heads in a fixed order, no atomics.
//
// Masking: rows past seq_q arrive zero-filled (Q, dO) with lse2 = delta = 0: P^T = 1 but dO = 0 and
// dS^T = 0, so they add nothing; their dQ lands in dq_accum's padding. Keys past seq_k (zero-filled K, V)
// and causal keys n > m + seq_k - seq_q get P^T = 0 on the tiles that straddle them. A fully masked row has
// lse = +inf: P^T = 0.
//
// Score modifications (issue 32), every kernel on AttnModTraits<T, WINDOW, SOFTCAP> (ModParams: the plain argument,
// then AttnMods); the plain kernels' code is unchanged. WINDOW: query m sees key n iff m + lo <= n <= m + hi
// (WindowBand, traits_common.h); a key block walks only the query blocks whose rows see one of its keys
// (fa3_bwd_window_query_blocks: rows n0 - hi .. n0 + BN - 1 - lo), so that a CTA's steps, like the forward's key
// blocks, scale with the window; the tiles that straddle an edge of the band mask per element (StepMask), and
// DETERMINISTIC's turns count the key blocks that meet each query block (fa3_bwd_window_turn). SOFTCAP: the
// forward's LSE is of the capped scores c tanh(s / c), so P^T = exp2(t c log2(e) - lse2) with t = tanh(S^T scale
// / c) (tanh.approx), and dS^T = P^T (dP^T - delta) (1 - t^2): the gradient through the cap, scaled by `scale`
// in dK and dQ as before. t is computed while dP^T's GEMM runs and held in S^T's registers, P^T and dS^T together
// once dP^T is done (ModScores); the preprocess and the convert are the plain ones. ALIBI: the forward's LSE
// includes the bias b = -slope |m + seq_k - seq_q - n|, so P^T = exp2((S^T + b / scale) scale log2(e) - lse2) (b / c
// on t with a softcap; AlibiBias, per step: the slope is the step's query head's); b does not depend on Q or K, so
// dS^T = P^T (dP^T - delta) (times the cap's 1 - t^2) as without it.
// MASK (a mask_mod, AttnModTraits' fifth argument; MaskModParams): a key block walks, for each query head of its
// group, the query blocks of its row of the block summary (Steps: MaskBlockList per kv head, the union over the
// group); the steps the list calls partial mask per element by the predicate, keys past seq_k and causal
// (PredicateMask, in StepMask's place), the full ones not at all. No DETERMINISTIC (the turns count a range of key
// blocks), no window.
#pragma once
#include "attention_params.h"
#include "device_common.cuh"
#include "fa3_wgmma_bwd_traits.h"
#include "wgmma_common.cuh"

namespace flashtune {

namespace fa3_bwd_detail {

// Named barriers (0 is __syncthreads).
// The dQ barriers are per staging tile b and piece (one per consumer warpgroup; one under DQ_TURNS), each
// between the piece's warpgroup and the tile's writer warp (kDqBarThreads).
enum NamedBarrier : int {
  kDsReady = 1,  // every consumer's dS^T rows are in shared memory (consumers)
  kDqEmpty = 2,  // + b pieces + piece: the piece was read by the copy engine (its writer arrives, its consumer waits)
  kDqFull = 8,   // + b pieces + piece: the piece is staged (its consumer arrives, the writer waits)
  kKvFree = 14,  // every consumer's steps are done: K (read by every consumer's dQ chains) may be overwritten
  kBarrierEnd = 15,
};
constexpr int kDqBarThreads = 128 + 32;
template <class T>
__device__ __forceinline__ int dq_empty(int b, int piece) {
  static_assert(2 * 3 <= kDqFull - kDqEmpty && kDqFull + 2 * 3 <= kBarrierEnd && kBarrierEnd <= 16, "16 named barriers");
  return kDqEmpty + b * T::kDqPieces + piece;
}
template <class T>
__device__ __forceinline__ int dq_full(int b, int piece) {
  return kDqFull + b * T::kDqPieces + piece;
}

// Shared memory regions, byte offsets from the 1024-byte aligned base.
template <class T>
struct Smem {
  enum Region : unsigned {
    kK = 0,
    kV = kK + T::kKvBytes,
    kQ = kV + T::kKvBytes,
    kDo = kQ + T::kStages * T::kQBytes,
    kDs = kDo + T::kStages * T::kQBytes,
    kDq = kDs + 2 * T::kDsBytes,
    kLse = kDq + T::kDqStages * T::kDqBytes,
    kDelta = kLse + T::kStages * T::kStatBytes,
    kBars = kDelta + T::kStages * T::kStatBytes,
    kEnd = kBars + 8 * fa3_bwd_barriers(T::kStages),
  };
  static_assert(kEnd + 1024 == T::kSmemBytes, "the regions add up to the traits' shared memory");
  static_assert(T::kKvBytes % 1024 == 0 && T::kQBytes % 1024 == 0, "swizzled tiles stay 1024-byte aligned");
  unsigned base;        // shared-space address
  unsigned char* ptr;   // generic address of the same byte
  __device__ unsigned k() const { return base + kK; }
  __device__ unsigned v() const { return base + kV; }
  __device__ unsigned q(int s) const { return base + kQ + static_cast<unsigned>(s * T::kQBytes); }
  __device__ unsigned dout(int s) const { return base + kDo + static_cast<unsigned>(s * T::kQBytes); }
  __device__ unsigned ds(int i) const { return base + kDs + static_cast<unsigned>(i * T::kDsBytes); }
  __device__ unsigned dq(int b, int piece) const {
    return base + kDq + static_cast<unsigned>(b * T::kDqBytes + piece * T::kDqPieceBytes);
  }
  __device__ float* dq_ptr(int b) const { return reinterpret_cast<float*>(ptr + kDq + b * T::kDqBytes); }
  __device__ unsigned lse(int s) const { return base + kLse + static_cast<unsigned>(s * T::kStatBytes); }
  __device__ unsigned delta(int s) const { return base + kDelta + static_cast<unsigned>(s * T::kStatBytes); }
  __device__ const float* lse_ptr(int s) const { return reinterpret_cast<const float*>(ptr + kLse + s * T::kStatBytes); }
  __device__ const float* delta_ptr(int s) const {
    return reinterpret_cast<const float*>(ptr + kDelta + s * T::kStatBytes);
  }
  __device__ unsigned kv_full() const { return base + kBars; }
  __device__ unsigned q_full(int s) const { return base + kBars + 8u + 16u * static_cast<unsigned>(s); }
  __device__ unsigned q_empty(int s) const { return base + kBars + 16u + 16u * static_cast<unsigned>(s); }
};

// The workspace's three arrays (fa3_bwd_workspace_bytes).
struct Workspace {
  float *lse2, *delta, *dq_accum;
  int* turns;  // per query block: how many key blocks have added into its dq_accum rows (DETERMINISTIC)
  int rows;    // R: padded rows per (batch, head)
  template <class T>
  __device__ static Workspace of(const AttnBwdParams& p) {
    const int r = fa3_bwd_padded_rows(p.seq_q, T::kBlockM);
    const long long n = static_cast<long long>(p.batch) * p.heads * r;
    float* base = static_cast<float*>(p.workspace);
    return Workspace{base, base + n, base + 2 * n, reinterpret_cast<int*>(base + 2 * n + n * T::kHeadDim), r};
  }
  template <class T>
  __device__ int* turn(int batch, int heads, int hq, int mb) const {
    return turns + (static_cast<long long>(batch) * heads + hq) * (rows / T::kBlockM) + mb;
  }
};

// The CTA's key block and heads. SCHED 0 and 2: x = key block, y = kv head, z = batch; SCHED 1 (LPT): x = the
// (kv head, batch) pair, y = key block, so the grid's first wave holds every pair's first (causal: heaviest)
// key blocks; SCHED 3: as 1 within groups of gridDim.x pairs (z = group; a CTA past the last pair has no
// work: batch >= p.batch). 1 is 3 with one group, in one piece of code. DETERMINISTIC 2 counts the key blocks from the last down (its turns run that way).
struct Work {
  int n0, kv_head, batch;
  template <class T>
  __device__ static int key_block(unsigned index, unsigned count) {
    return static_cast<int>(T::kDescending ? count - 1 - index : index);
  }
  template <class T>
  __device__ static Work of(const AttnBwdParams& p) {
    const int hk = p.heads_k > 0 ? p.heads_k : p.heads;
    if constexpr (T::kPairGroups) {  // SCHED 1: one group of every pair (z = 0)
      const int pair = bwd_grouped_pair(static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.z),
                                        static_cast<int>(gridDim.x));
      return Work{key_block<T>(blockIdx.y, gridDim.y) * T::kBlockN, pair % hk, pair / hk};
    } else
      return Work{key_block<T>(blockIdx.x, gridDim.x) * T::kBlockN, static_cast<int>(blockIdx.y),
                  static_cast<int>(blockIdx.z)};
  }
};

// The steps of a CTA: each query head of the kv head's group, and within it the query blocks that see the
// key block (causal: key n is visible to query m iff n <= m + seq_k - seq_q), in order.
// SCHED 2: each CTA starts at step (its key block mod count) and wraps around, so that the CTAs of one head
// add into different rows of dq_accum at a time instead of all into the same ones.
// WINDOW: the query blocks whose rows see some key of the block (fa3_bwd_window_query_blocks), the band kept for
// the masks and the dQ turns.
// MASK (a mask_mod): the query blocks of the key block's list in the block summary (MaskBlockList, per kv head: the
// union over its group's query heads), first 0 and each step's position in the list mapped to its query block
// (query_block; Cursor::mb is then the position).
struct Steps {
  int first, blocks, count, hq0, rot, group;  // first visible query block, blocks per head, steps, the group's
                                              // first head, the first step (SCHED 2), query heads per kv head
  WindowBand band;                            // WINDOW: the mask's band (unused otherwise)
  int list_off = 0;                           // MASK: the key block's list row, in entries from the lists' start
  template <class T, class P>
  __device__ static Steps of(const P& p, const Work& w) {
    const int group = query_group(p);
    int first = 0, blocks = 0;
    WindowBand band{0, 0};
    if constexpr (MaskOf<T>::on()) {
      const MaskBlockList& L = p.mask.blocks;
      const long long row = L.row(w.batch, w.kv_head, w.n0 / T::kBlockN);
      const int count = group * L.count[row];
      const int rot = T::kRotate && count > 0 ? (w.n0 / T::kBlockN) % count : 0;
      Steps s{0, L.count[row], count, w.kv_head * group, rot, group, band};
      s.list_off = static_cast<int>(row * L.cols);  // (below 2^31: mask_summary_plan)
      return s;
    } else if constexpr (ModsOf<T>::window) {
      band = window_band(p.mods.window_left, p.mods.window_right, T::kCausal, p.seq_q, p.seq_k);
      fa3_bwd_window_query_blocks(band, w.n0, T::kBlockM, T::kBlockN, p.seq_q, p.seq_k, first, blocks);
    } else {
      const int num_m = ceil_div(p.seq_q, T::kBlockM);
      first = T::kCausal ? imax(0, w.n0 - (p.seq_k - p.seq_q)) / T::kBlockM : 0;
      blocks = imax(0, num_m - first);
    }
    const int count = group * blocks;
    const int rot = T::kRotate && count > 0 ? (w.n0 / T::kBlockN) % count : 0;
    return Steps{first, blocks, count, w.kv_head * group, rot, group, band};
  }
  // The query block at a position of the walk (MASK: the list's entry there; else the position itself).
  // (MASK: an int offset into the lists, the pointer read from the argument where used: a pointer held in Steps cost
  // the dQ writer warps, whose budget is 24 registers, 16 bytes of spills with one consumer.)
  template <class T, class P>
  __device__ int query_block(const P& p, int mb) const {
    if constexpr (MaskOf<T>::on()) return MaskBlockList::block(p.mask.blocks.index[list_off + mb]);
    else return mb;
  }
  // Step t's query head and position in the walk (the query block itself but for MASK).
  __device__ void position(int t, int& hq, int& mb) const {
    t += rot;
    if (t >= count) t -= count;
    const int i = t / blocks;
    hq = hq0 + i;
    mb = first + t - i * blocks;
  }
  // Step t's query head and query block. (position's lines again, and the plain walk's spelled apart: at() calling
  // position(), or query_block() around the plain one, changed the code of the plain dK/dV kernels.)
  template <class T, class P>
  __device__ void at(const P& p, int t, int& hq, int& mb) const {
    t += rot;
    if (t >= count) t -= count;
    const int i = t / blocks;
    hq = hq0 + i;
    if constexpr (MaskOf<T>::on()) mb = query_block<T>(p, first + t - i * blocks);
    else mb = first + t - i * blocks;
  }
  // The steps in order without a division each: start() is step 0, next() moves to the following one.
  struct Cursor {
    int hq, mb;
  };
  __device__ Cursor start() const {  // (a position: query_block maps it)
    Cursor c{hq0, first};
    if (rot) position(0, c.hq, c.mb);
    return c;
  }
  __device__ void next(Cursor& c) const {
    if (++c.mb == first + blocks) {
      c.mb = first;
      if (++c.hq == hq0 + group) c.hq = hq0;
    }
  }
};

// Ring slot and mbarrier phase of step t.
template <int STAGES>
__device__ __forceinline__ int slot_of(int t) {
  return STAGES == 1 ? 0 : t % STAGES;
}
template <int STAGES>
__device__ __forceinline__ unsigned phase_of(int t) {
  return static_cast<unsigned>(t / STAGES) & 1u;
}

// The producer thread: K and V once, then every step's Q, dO, lse2 and delta.
template <class T, class P>
__device__ __forceinline__ void produce(const Smem<T>& sm, const AttnTensorMaps& tm, const P& p,
                                        const Work& w, const Steps& st, const Workspace& ws) {
  constexpr int W = T::kGroupCols, SW = T::kSwizzle, BN = T::kBlockN, BM = T::kBlockM;
  if (st.count == 0) return;  // no step: K and V unused (and no copy may outlive the CTA)
  mbar_arrive_expect_tx(sm.kv_full(), 2 * T::kKvBytes);
#pragma unroll
  for (int g = 0; g < T::kGroups; ++g) {
    const unsigned off = static_cast<unsigned>(g * BN * SW);
    tma_load_4d(sm.k() + off, &tm.map[1], g * W, w.n0, w.kv_head, w.batch, sm.kv_full());
    tma_load_4d(sm.v() + off, &tm.map[2], g * W, w.n0, w.kv_head, w.batch, sm.kv_full());
  }
  for (int t = 0; t < st.count; ++t) {
    const int s = slot_of<T::kStages>(t);
    if (t >= T::kStages) mbar_wait(sm.q_empty(s), phase_of<T::kStages>(t) ^ 1u);
    int hq, mb;
    st.at<T>(p, t, hq, mb);
    const unsigned bar = sm.q_full(s);
    mbar_arrive_expect_tx(bar, 2 * T::kQBytes + 2 * T::kStatBytes);
#pragma unroll
    for (int g = 0; g < T::kGroups; ++g) {
      const unsigned off = static_cast<unsigned>(g * BM * SW);
      tma_load_4d(sm.q(s) + off, &tm.map[0], g * W, mb * BM, hq, w.batch, bar);
      tma_load_4d(sm.dout(s) + off, &tm.map[3], g * W, mb * BM, hq, w.batch, bar);
    }
    const long long row = (static_cast<long long>(w.batch) * p.heads + hq) * ws.rows + mb * BM;
    bulk_load(sm.lse(s), ws.lse2 + row, T::kStatBytes, bar);
    bulk_load(sm.delta(s), ws.delta + row, T::kStatBytes, bar);
  }
}

// Until at most `pending` of the writer's bulk groups are outstanding (.read: their sources reusable).
__device__ __forceinline__ void bulk_wait_read_upto(int pending) {
  if (pending >= 2) bulk_wait_read<2>();
  else if (pending == 1) bulk_wait_read<1>();
  else bulk_wait_read<0>();
}

// dQ writer b: each step t = b mod DQ_STAGES, every piece of staging tile b added into the query block's
// dq_accum by one bulk reduce-add as soon as its warpgroup staged it (the piece's floats are contiguous in
// both, DqLayout), then each piece freed once read (DETERMINISTIC: the adds in the block's turn and complete
// before it is passed on, see the file's head).
template <class T, class Params>
__device__ __forceinline__ void write_dq(const Smem<T>& sm, const Params& p, const Work& w, const Steps& st,
                                         const Workspace& ws, int b, int lane) {
  constexpr int BM = T::kBlockM, D = T::kHeadDim, S = T::kDqStages, P = T::kDqPieces;
  const int key_block = w.n0 / T::kBlockN;
  for (int t = b; t < st.count; t += S) {
    long long row = 0;
    int* turn = nullptr;
    if (lane == 0) {
      int hq, mb;
      st.at<T>(p, t, hq, mb);
      row = (static_cast<long long>(w.batch) * p.heads + hq) * ws.rows + mb * BM;
      turn = ws.turn<T>(w.batch, p.heads, hq, mb);
      if constexpr (T::kDeterministic && ModsOf<T>::window)
        turn_wait(turn, fa3_bwd_window_turn(T::kDeterministicOrder, st.band, key_block, mb, BM, T::kBlockN, p.seq_q, p.seq_k));
      else if constexpr (T::kDeterministic)
        turn_wait(turn, bwd_dq_turn(T::kDeterministicOrder, key_block, mb, BM, T::kBlockN, p.seq_q, p.seq_k));
    }
#pragma unroll
    for (int piece = 0; piece < P; ++piece) {
      named_bar_sync(dq_full<T>(b, piece), kDqBarThreads);
      if (lane == 0) {
        bulk_reduce_add_f32(ws.dq_accum + row * D + piece * (T::kDqPieceBytes / 4), sm.dq(b, piece), T::kDqPieceBytes);
        bulk_commit();
      }
    }
    if constexpr (T::kDeterministic) {
      if (lane == 0) {
        bulk_wait<0>();  // the adds are complete (and so the tile read) before the next key block's
        turn_pass(turn);
      }
    }
#pragma unroll
    for (int piece = 0; piece < P; ++piece) {
      if (!T::kDeterministic && lane == 0) bulk_wait_read_upto(P - 1 - piece);  // this piece's add has read it
      __syncwarp();
      if (t + S < st.count) named_bar_arrive(dq_empty<T>(b, piece), kDqBarThreads);
    }
  }
  if (lane == 0) bulk_wait<0>();
}

// S^T (or dP^T) = X_c Y^T: X the warpgroup's 64 rows of K (V), Y the BM rows of Q (dO); K-major, swizzled.
// Each slice's descriptors are the tile's first ones advanced (desc_advance).
template <class T>
__device__ __forceinline__ void gemm_scores(float (&acc)[T::kBlockM / 2], unsigned x_rows, unsigned y) {
  constexpr int SW = T::kSwizzle, SLICES = T::kGroupCols / 16;
  const unsigned long long da0 = desc_k_major_sw<SW>(x_rows), db0 = desc_k_major_sw<SW>(y);
#pragma unroll
  for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
    const unsigned col = static_cast<unsigned>(32 * (kk % SLICES));
    const unsigned long long da = desc_advance(da0, static_cast<unsigned>(kk / SLICES * T::kBlockN * SW) + col);
    const unsigned long long db = desc_advance(db0, static_cast<unsigned>(kk / SLICES * T::kBlockM * SW) + col);
    wgmma_ss<T::kBlockM, T::kDtype, 0, 0>(acc, da, db, kk > 0);
  }
}

// acc (64 x D) += A Y: A (64 x BM) as 16-bit fragments, Y the BM x D tile of Q (dO), MN-major, swizzled.
template <class T>
__device__ __forceinline__ void gemm_grad(float (&acc)[T::kHeadDim / 2], const unsigned (&a)[T::kBlockM / 16][4],
                                          unsigned y) {
  constexpr int SW = T::kSwizzle;
  const unsigned long long d0 = desc_mn_major_sw<SW>(y, T::kBlockM * SW);
#pragma unroll
  for (int kk = 0; kk < T::kBlockM / 16; ++kk)
    wgmma_rs<T::kHeadDim, T::kDtype, 1>(acc, a[kk], desc_advance(d0, static_cast<unsigned>(16 * SW * kk)), 1);
}

// Which of a consumer thread's score elements a step masks. Element (j, e) is key row key0 + 8 (e >> 1) and
// query m0 + 8 j + 2 tig + (e & 1); it is masked iff its key row is past seq_k or (causal) the key lies past
// the query's diagonal, key > query + seq_k - seq_q. Per key half h = e >> 1 that is one comparison with a
// constant: masked iff -(8 j + (e & 1)) > lim[h], lim[h] = m0 + 2 tig + causal_offset - key0 - 8 h
// (the least int where the key row is past seq_k; the greatest when nothing but seq_k masks).
struct ScoreRows {
  int key0, seq_k, causal_offset, tig;
  template <class T>
  __device__ void limits(int m0, int (&lim)[2]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = key0 + 8 * h;
      lim[h] = key >= seq_k ? -0x7fffffff - 1 : T::kCausal ? m0 + 2 * tig + causal_offset - key : 0x7fffffff;
    }
  }
};

// A step's lse2 or delta at this thread's query columns 8 j + 2 tig, + 1 (j < BM / 8). Where registers allow
// (T::kStatsHeld) they are read before the score GEMMs are waited for, so that the shared-memory latency runs
// under them (read after the wait, the first exponential waited for it: the largest short-scoreboard stall at
// d 128, Nsight Compute); else each pair is read where used. SOFTCAP reads lse2 where used (consume): its
// exponentials wait for dP^T, and lse2 held beside delta and dP^T spilled at d 128 (BLOCK_M / 4 registers).
template <class T, bool HELD = T::kStatsHeld>
struct StepStats {
  static constexpr bool kHeld = HELD;
  float2 held[kHeld ? T::kBlockM / 8 : 1];
  const float* at_tig;
  __device__ void load(const float* stats, int tig) {
    at_tig = stats + 2 * tig;
    if constexpr (kHeld) {
#pragma unroll
      for (int j = 0; j < T::kBlockM / 8; ++j) held[j] = *reinterpret_cast<const float2*>(at_tig + 8 * j);
    }
  }
  __device__ float2 operator[](int j) const {
    if constexpr (kHeld) return held[j];
    else return *reinterpret_cast<const float2*>(at_tig + 8 * j);
  }
};

// P^T in place of S^T for the query block at m0: exp2(S scale_log2 - lse2); MASKED (a step whose tile straddles
// the diagonal or seq_k): 0 where masked. Unmasked steps carry no per-element test.
template <class T, bool MASKED>
__device__ __forceinline__ void probs(float (&st)[T::kBlockM / 2], const StepStats<T>& lse2, float scale_log2,
                                      const ScoreRows& r, int m0) {
  int lim[2];
  if constexpr (MASKED) r.limits<T>(m0, lim);
#pragma unroll
  for (int j = 0; j < T::kBlockM / 8; ++j) {
    const float2 l2 = lse2[j];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float pv = fast_exp2(fmaf(st[4 * j + e], scale_log2, -((e & 1) ? l2.y : l2.x)));
      if constexpr (MASKED) {
        if (-(8 * j + (e & 1)) > lim[e >> 1]) pv = 0.f;
      }
      st[4 * j + e] = pv;
    }
  }
}

// dS^T = P^T (dP^T - delta) in place of dP^T.
template <class T>
__device__ __forceinline__ void dscores(float (&dpt)[T::kBlockM / 2], const float (&pt)[T::kBlockM / 2],
                                        const StepStats<T>& delta) {
#pragma unroll
  for (int j = 0; j < T::kBlockM / 8; ++j) {
    const float2 d2 = delta[j];
#pragma unroll
    for (int e = 0; e < 4; ++e) dpt[4 * j + e] = pt[4 * j + e] * (dpt[4 * j + e] - ((e & 1) ? d2.y : d2.x));
  }
}

// Which of a consumer thread's score elements a modified step masks (ModScores): element (j, e) is key row
// key0 + 8 h (h = e >> 1) and query m0 + 2 tig + off, off = 8 j + (e & 1); it is masked iff off < below[h] or
// off > above[h] (below[h] the greatest int when the key row is past seq_k: every element).
struct StepMask {
  int below[2], above[2];
  __device__ bool operator()(int off, int h) const { return off < below[h] || off > above[h]; }
};

// ALiBi's bias of a step's elements (ModScores, the traits' ALIBI): element (j, e) is key row key0 + 8 h and query
// m0 + 2 tig + off (StepMask's numbering), at distance |d0 - 8 h + off| from the diagonal, d0 = m0 + 2 tig + seq_k
// - seq_q - key0 (one conversion per step: exact, every distance being below 2^22); score + neg_slope |...|, in
// the units the exponent's factor multiplies (S^T, or t with a softcap). NoBias: the score itself.
template <bool C, class A, class B>
struct Conditional {
  using type = A;
};
template <class A, class B>
struct Conditional<false, A, B> {
  using type = B;
};
struct NoBias {
  __device__ float operator()(float x, int, int) const { return x; }
};
struct AlibiBias {
  float neg_slope, d0;
  __device__ float operator()(float x, int off, int h) const {
    return fmaf(neg_slope, fabsf(d0 + static_cast<float>(off - 8 * h)), x);
  }
};

// MASK (a mask_mod): StepMask's interface over the predicate, for a step the summary calls partial. Element (off, h)
// is key key0 + 8 h and query qbase + off (qbase = m0 + 2 tig); masked iff the key is past seq_k, (causal) past the
// query's diagonal, or the predicate says no. The step's BM / 2 answers are taken first, one bit each (at(), by
// consume before the step's Q lands), so that the predicate's loads end in two registers before the score GEMMs
// (tested where used, its tensors' loads held beside S^T, dP^T, dK and dV spilled 8 bytes at d 128, BLOCK_M 64, two
// consumers, a document mask; taken under the GEMMs, 12 to 36). Element (j, e), the accumulators' numbering, is
// bit 4 j + e.
template <class M, bool CAUSAL, int BM>
struct PredicateMask {
  static_assert(BM <= 128, "one bit per element of a thread's BM / 2 scores, in 64 bits");
  using Word = unsigned long long;
  Word bits;
  __device__ static PredicateMask at(const MaskModArgs& args, int key0, int seq_k, int qbase, int causal_offset,
                                     int batch, int hq) {
    Word bits = 0;
    // Not unrolled: NVRTC 13.0, sm_90a, one consumer at d 128 with softcap and ALiBi too, 16 bytes of spills against
    // 32-48 unrolled (the loads of every query's entries issued together); two consumers, none either way.
#pragma unroll 1
    for (int j = 0; j < BM / 8; ++j) {
      unsigned nibble = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + 8 * (e >> 1), q = qbase + 8 * j + (e & 1);
        // Bitwise, not short-circuit (as fa3_wgmma's block_bits): every element's loads unconditional.
        const bool masked = (key >= seq_k) | (CAUSAL && key > q + causal_offset) | !M::test(args, batch, hq, q, key);
        nibble |= static_cast<unsigned>(masked) << e;
      }
      bits |= static_cast<Word>(nibble) << (4 * j);
    }
    return PredicateMask{bits};
  }
  __device__ bool operator()(int off, int h) const {
    const int x = 4 * (off >> 3) + 2 * h + (off & 1);
    return ((bits >> x) & 1u) != 0;
  }
};

// P^T in place of S^T under a StepMask (a window without a softcap): exp2(S scale_log2 - lse2), 0 where masked;
// ALIBI: of S plus its bias.
template <class T, bool MASKED, class Bias = NoBias, class Mask = StepMask>
__device__ __forceinline__ void masked_probs(float (&st)[T::kBlockM / 2], const StepStats<T>& lse2, float scale_log2,
                                             const Mask& mask, const Bias& bias = {}) {
#pragma unroll
  for (int j = 0; j < T::kBlockM / 8; ++j) {
    const float2 l2 = lse2[j];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = bias(st[4 * j + e], 8 * j + (e & 1), e >> 1);
      float pv = fast_exp2(fmaf(x, scale_log2, -((e & 1) ? l2.y : l2.x)));
      if constexpr (MASKED) {
        if (mask(8 * j + (e & 1), e >> 1)) pv = 0.f;
      }
      st[4 * j + e] = pv;
    }
  }
}

// SOFTCAP: from t = tanh(S^T scale / c) in st, P^T = exp2(t c log2(e) - lse2) (0 where masked) in place of t, and
// dS^T = P^T (dP^T - delta) (1 - t^2) in place of dP^T: the gradient through the cap c tanh(s / c), whose
// derivative is 1 - t^2. Two passes, each reading one of the step's stats: (dP^T - delta) (1 - t^2) first, then
// P^T and its product. (NVRTC 13.0, sm_90a: one pass, with both stats' loads and the exponentials beside t and
// dP^T, spilled 4-20 bytes at d 128 BLOCK_M 64 with one consumer; two passes none.)
// ALIBI: the exponent is t plus its bias (t' is the cap's alone: the bias does not depend on S).
template <class T, bool MASKED, class Lse2, class Bias = NoBias, class Mask = StepMask>
__device__ __forceinline__ void capped_grads(float (&st)[T::kBlockM / 2], float (&dpt)[T::kBlockM / 2], const Lse2& lse2,
                                             const StepStats<T>& delta, float softcap_log2, const Mask& mask,
                                             const Bias& bias = {}) {
#pragma unroll
  for (int j = 0; j < T::kBlockM / 8; ++j) {
    const float2 d2 = delta[j];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float t = st[4 * j + e];
      dpt[4 * j + e] = (dpt[4 * j + e] - ((e & 1) ? d2.y : d2.x)) * fmaf(-t, t, 1.f);
    }
  }
#pragma unroll
  for (int j = 0; j < T::kBlockM / 8; ++j) {
    const float2 l2 = lse2[j];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = bias(st[4 * j + e], 8 * j + (e & 1), e >> 1);
      float pv = fast_exp2(fmaf(x, softcap_log2, -((e & 1) ? l2.y : l2.x)));
      if constexpr (MASKED) {
        if (mask(8 * j + (e & 1), e >> 1)) pv = 0.f;
      }
      st[4 * j + e] = pv;
      dpt[4 * j + e] *= pv;
    }
  }
}

// MASK: a step's PredicateMask; else nothing (an empty type). Apart from ModScores, which plain kernels must not
// instantiate (its static member became a variable of their cubins).
template <class T>
using StepPredicate = typename Conditional<MaskOf<T>::on(), PredicateMask<typename MaskOf<T>::type, T::kCausal,
                                                                          T::kBlockM>, NoBias>::type;

// A modified step's P^T and dS^T (the traits' WINDOW and/or SOFTCAP): under_dp while dP^T's GEMM runs, after_dp
// once it is done; masked(m0): the tile straddles an edge of the band or seq_k for some element of the warpgroup.
// The band is the window's (Steps::band), or without one the causal diagonal's (or none) as a band. SOFTCAP puts
// t under dP^T and P^T and dS^T after it (capped_grads: t' needs t, which P^T would overwrite; a copy would cost
// BLOCK_M / 2 registers beside dK and dV). Tried and dropped: P^T under dP^T, packed for dV at once, with
// P^T (1 - t^2) kept for dS^T (4 bytes of spills at d 128 BLOCK_M 64 with two consumers, 96 at d 64 BLOCK_M 128).
// The plain kernels keep their own lines (consume), so that their code is what it was: an equivalent plain piece
// of this shape moved ptxas's register allocation in every plain dK/dV kernel.
// ALIBI: the step's query head's slope (per batch with [B, H] slopes) and the distances' base, read per step
// (a step's head changes within a kv head's group), added to the exponent in both forms (AlibiBias).
template <class T>
struct ModScores {
  static constexpr bool kSoftcap = ModsOf<T>::softcap;
  using Bias = typename Conditional<ModsOf<T>::alibi, AlibiBias, NoBias>::type;
  int key0, seq_k, tig;  // the thread's first key row, the keys' end
  int wg_key0;           // the warpgroup's first key
  WindowBand band;       // WINDOW: the window's (Steps::band); else the causal diagonal's (or none) as a band
  float scale_log2;      // the exponent's factor: SOFTCAP c log2(e) on t, else scale log2(e) on S
  float cap_scale;       // SOFTCAP: scale / c, S's factor inside tanh
  Bias bias{};           // ALIBI: the step's slope and distances
  // MASK: the step's predicate answers (PredicateMask::at, taken by consume before the step's Q lands); else empty.
  StepPredicate<T> pred{};
  template <class P>
  __device__ static ModScores at(const P& p, const Steps& st, int key0_block, int krow, int c, int tig, int batch,
                                 int hq, int m0) {
    ModScores s{key0_block + krow, p.seq_k, tig, key0_block + 64 * c, st.band, p.scale_log2, 0.f};
    if constexpr (!ModsOf<T>::window) s.band = window_band(-1, -1, T::kCausal, p.seq_q, p.seq_k);
    if constexpr (kSoftcap) s.scale_log2 = p.mods.softcap_log2, s.cap_scale = p.mods.softcap_scale;
    if constexpr (ModsOf<T>::alibi) {
      s.bias.neg_slope = -p.mods.alibi_slopes[batch * p.mods.alibi_batch_stride + hq] * p.mods.alibi_unit;
      s.bias.d0 = static_cast<float>(m0 + 2 * tig + p.seq_k - p.seq_q - s.key0);
    }
    return s;
  }
  // Some (row, key) of rows m0 .. m0 + BM - 1 and the warpgroup's 64 keys lies past seq_k or outside the band.
  __device__ bool masked(int m0) const {
    return wg_key0 + 63 >= seq_k || wg_key0 < m0 + T::kBlockM - 1 + band.lo || wg_key0 + 63 > m0 + band.hi;
  }
  // Key row key0 + 8 h is seen by query m0 + 2 tig + off iff key - hi <= m0 + 2 tig + off <= key - lo.
  // MASK: the predicate's (PredicateMask).
  __device__ auto step_mask(int m0) const {
    if constexpr (MaskOf<T>::on())
      return pred;
    else
      return band_mask(m0);
  }
  __device__ StepMask band_mask(int m0) const {
    StepMask k;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = key0 + 8 * h, base = m0 + 2 * tig;
      k.below[h] = key >= seq_k ? 0x7fffffff : key - band.hi - base;
      k.above[h] = key - band.lo - base;
    }
    return k;
  }
  template <class Lse2>
  __device__ void under_dp(float (&sc)[T::kBlockM / 2], const Lse2& lse2, int m0, bool masked) const {
    if constexpr (kSoftcap) {  // t: the SFU's share of the step, while dP^T's GEMM runs
#pragma unroll
      for (int x = 0; x < T::kBlockM / 2; ++x) sc[x] = tanh_approx(sc[x] * cap_scale);
    } else {
      if (masked) masked_probs<T, true>(sc, lse2, scale_log2, step_mask(m0), bias);
      else masked_probs<T, false>(sc, lse2, scale_log2, StepMask{}, bias);
    }
  }
  template <class Lse2>
  __device__ void after_dp(float (&sc)[T::kBlockM / 2], float (&dp)[T::kBlockM / 2], const Lse2& lse2,
                           const StepStats<T>& delta, int m0, bool masked) const {
    if constexpr (kSoftcap) {
      if (masked) capped_grads<T, true>(sc, dp, lse2, delta, scale_log2, step_mask(m0), bias);
      else capped_grads<T, false>(sc, dp, lse2, delta, scale_log2, StepMask{}, bias);
    } else {
      dscores<T>(dp, sc, delta);
    }
  }
};

// A consumer's piece of the step's dQ: row tiles and columns (T::kDqCols wide) it computes.
struct DqPiece {
  int row_tile0, row_tiles, col0;
};
template <class T>
__device__ __forceinline__ DqPiece dq_piece(int c) {
  if constexpr (T::kDqTurns)  // the whole tile, by the consumer whose turn it is
    return DqPiece{0, T::kDqRowTiles, 0};
  else if constexpr (T::kConsumers >= T::kDqRowTiles)
    return DqPiece{c / T::kDqColPieces, 1, (c % T::kDqColPieces) * T::kDqCols};
  else
    return DqPiece{c * (T::kDqRowTiles / T::kConsumers), T::kDqRowTiles / T::kConsumers, 0};
}

// dQ (rows 64 rt.., columns c0.. of DQ_CHUNK) = dS K over the block's keys; A = dS, the M-major view of the
// interleaved dS^T tile; B = K, MN-major, swizzled groups BN * SW bytes apart.
// dQ^T (T::kDqTransposed; rows 64 rt.. of the head dim, all BM query columns) = K^T dS^T: A = K^T, the MN-major
// view of K's swizzle group rt (64 columns: M = 64 of the head dim), B = dS^T, the N-major view of the same
// interleaved tile (N = BM query columns, core matrices 128 bytes apart; k16 slices of keys 32 BM bytes apart).
template <class T>
__device__ __forceinline__ void gemm_dq(float (&acc)[T::kDqChunk / 2], unsigned ds, unsigned k, int rt, int c0) {
  constexpr int SW = T::kSwizzle, W = T::kGroupCols, BM = T::kBlockM, BN = T::kBlockN;
  constexpr bool TR = T::kDqTransposed;
  static_assert(!TR || (W == 64 && T::kDqChunk == BM), "dQ^T: a row tile is one 128-byte swizzle group, a chain the block");
  // The two operands and their k16 steps (dS: 2 key rows of core matrices, 32 BM bytes; K: 16 swizzled rows); dQ^T
  // swaps them.
  const unsigned long long ds0 = desc_mn_major<BM>(ds + static_cast<unsigned>(TR ? 0 : 16 * 64 * rt));
  const unsigned long long k0 = desc_mn_major_sw<SW>(k + static_cast<unsigned>((TR ? rt : c0 / W) * BN * SW), BN * SW);
  constexpr unsigned kDsStep = 32 * BM, kKStep = 16 * SW;
#pragma unroll
  for (int ks = 0; ks < BN / 16; ++ks) {
    const unsigned long long dsd = desc_advance(ds0, kDsStep * ks), kd = desc_advance(k0, kKStep * ks);
    wgmma_ss<T::kDqChunk, T::kDtype, 1, 1>(acc, TR ? kd : dsd, TR ? dsd : kd, ks > 0);
  }
}

// The dQ staging tile (and a query block's dq_accum floats), fa3_bwd_dq_place: chain q = row tile x (COLS / DQ_CHUNK)
// + column chunk at q 64 DQ_CHUNK floats, each in the accumulators' register order: float4 j 128 + thread holds
// the thread's acc[4 j .. 4 j + 3], rows 16 warp + g and + 8 at columns 8 j + 2 tig, + 1. A warp stores 512 contiguous bytes
// per float4 (conflict free, one instruction per 8 columns), a piece (its warpgroup's chains, in order) is one
// contiguous run for the bulk add, and the convert reads float4s in order. The tile is dQ (BM x D) or dQ^T (D x BM,
// T::kDqTransposed: a row is a head-dim column, a column a query row; the convert transposes it back).
template <class T>
struct DqLayout {
  static constexpr int kChainFloats = 64 * T::kDqChunk;
  static constexpr int kChainsPerRowTile = T::kDqTileCols / T::kDqChunk;
  __device__ static int chain(int row_tile, int col0) { return row_tile * kChainsPerRowTile + col0 / T::kDqChunk; }
  // Where float4 f of a query block's floats lands in the tile: row and first column of its two pairs
  // (the second pair is row + 8, the same columns).
  __device__ static void place(int f, int& row, int& col) { fa3_bwd_dq_place(f, T::kDqTileCols, T::kDqChunk, row, col); }
};

// A dQ chain's accumulators into the staging tile (tid: the thread's index in its warpgroup).
template <class T>
__device__ __forceinline__ void stage_dq(float* tile, const float (&acc)[T::kDqChunk / 2], int chain, int tid) {
  float4* dst = reinterpret_cast<float4*>(tile + chain * DqLayout<T>::kChainFloats) + tid;
#pragma unroll
  for (int j = 0; j < T::kDqChunk / 8; ++j) dst[128 * j] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
}

// DQ_STAGES 0: a dQ chain's accumulators added into the query block's dq_accum floats straight from the
// registers, at the places the staging tile would give them (block: the block's first float).
template <class T>
__device__ __forceinline__ void add_dq(float* block, const float (&acc)[T::kDqChunk / 2], int chain, int tid) {
  float* dst = block + chain * DqLayout<T>::kChainFloats + 4 * tid;
#pragma unroll
  for (int j = 0; j < T::kDqChunk / 8; ++j) red_add_v4(dst + 512 * j, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
}

// The dQ reducer (DQ_STAGES) as a consumer sees it for one step: where its chains go and the handshake around
// them. Staged (1, 2): its piece of staging tile t % DQ_STAGES, freed by the tile's writer warp (wait_free: the
// piece's step t - DQ_STAGES was read) and handed back to it (publish); direct (0): added into the query block's
// dq_accum floats from the registers, no handshake.
template <class T>
struct DqSink {
  float* dst;  // the staging tile (staged) or the query block's first dq_accum float (direct)
  int tile, piece;
  bool reuse;  // staged: the tile held step t - DQ_STAGES's dQ
  template <class P>
  __device__ static DqSink at(const Smem<T>& sm, const Workspace& ws, const P& p, const Work& w,
                              const Steps& st, const Steps::Cursor& step, int t, int piece) {
    if constexpr (T::kDqDirect) {
      const long long row = (static_cast<long long>(w.batch) * p.heads + step.hq) * ws.rows +
                            st.query_block<T>(p, step.mb) * T::kBlockM;
      return DqSink{ws.dq_accum + row * T::kHeadDim, 0, piece, false};
    } else {
      const int b = t % T::kDqStages;
      return DqSink{sm.dq_ptr(b), b, piece, t >= T::kDqStages};
    }
  }
  __device__ void wait_free() const {
    if constexpr (!T::kDqDirect)
      if (reuse) named_bar_sync(dq_empty<T>(tile, piece), kDqBarThreads);
  }
  __device__ void put(const float (&acc)[T::kDqChunk / 2], int chain, int tid) const {
    if constexpr (T::kDqDirect) add_dq<T>(dst, acc, chain, tid);
    else stage_dq<T>(dst, acc, chain, tid);
  }
  __device__ void publish() const {
    if constexpr (!T::kDqDirect) {
      fence_proxy_async();  // the staged dQ, before the copy engine reads it
      named_bar_arrive(dq_full<T>(tile, piece), kDqBarThreads);
    }
  }
};

// DQ_OVERLAP 0: this warpgroup's dQ chains (its piece: row tiles x DQ_CHUNK columns), two at a time in two
// accumulator sets: both issued, then the first stored while the second
// runs. One at a time, the tensor pipe idled under each chain's stores and the next chain's issue waited for
// the stores to read its registers (Nsight Compute's largest wgmma-wait and short-scoreboard stalls at d 128
// DQ_TURNS 1). Chain i: row tile i / (columns / DQ_CHUNK), column chunk i % that.
template <class T>
__device__ __forceinline__ void dq_chains(const DqSink<T>& sink, const DqPiece& piece, unsigned ds, unsigned k,
                                          int tid) {
  constexpr int kPerRowTile = T::kDqCols / T::kDqChunk;
  const int chains = piece.row_tiles * kPerRowTile;
  auto rt = [&](int i) { return piece.row_tile0 + i / kPerRowTile; };
  auto c0 = [&](int i) { return piece.col0 + (i % kPerRowTile) * T::kDqChunk; };
#pragma unroll
  for (int i = 0; i < chains; i += 2) {
    float dq0[T::kDqChunk / 2], dq1[T::kDqChunk / 2];
    const bool pair = i + 1 < chains;
    wgmma_fence();
    gemm_dq<T>(dq0, ds, k, rt(i), c0(i));
    wgmma_commit();
    if (pair) {
      gemm_dq<T>(dq1, ds, k, rt(i + 1), c0(i + 1));
      wgmma_commit();
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
    }
    wgmma_fence_regs(dq0);
    sink.put(dq0, DqLayout<T>::chain(rt(i), c0(i)), tid);
    if (pair) {
      wgmma_wait<0>();
      wgmma_fence_regs(dq1);
      sink.put(dq1, DqLayout<T>::chain(rt(i + 1), c0(i + 1)), tid);
    }
  }
}

// One consumer warpgroup: every step's five products; dK, dV kept in registers, stored at the end.
template <class T, class P>
__device__ __forceinline__ void consume(const Smem<T>& sm, const P& p, const Work& w, const Steps& st, int c, int tid) {
  constexpr int D = T::kHeadDim, BM = T::kBlockM, SW = T::kSwizzle, DT = T::kDtype;
  constexpr int NQ = T::kConsumerThreads;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int wrow = 16 * warp;  // the warp's rows within the warpgroup's 64 keys
  const int krow = 64 * c + wrow + g;  // the thread's first key row within the block
  const ScoreRows rows{w.n0 + krow, p.seq_k, p.seq_k - p.seq_q, tig};
  const int wg_key_last = w.n0 + 64 * c + 63;
  const unsigned k_rows = sm.k() + static_cast<unsigned>(64 * c * SW), v_rows = sm.v() + static_cast<unsigned>(64 * c * SW);
  const DqPiece piece = dq_piece<T>(c);
  const float scale_log2 = p.scale_log2;
  const Workspace ws = Workspace::of<T>(p);  // DQ_STAGES 0: the consumers add into dq_accum themselves (DqSink)

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

  if (st.count > 0) mbar_wait(sm.kv_full(), 0);
  Steps::Cursor at = st.start();
  for (int t = 0; t < st.count; ++t, st.next(at)) {
    const int s = slot_of<T::kStages>(t);
    int m0 = at.mb * BM;  // (MASK: the list's query block; spelled apart, as in Steps::at, for the plain kernels' code)
    if constexpr (MaskOf<T>::on()) m0 = st.query_block<T>(p, at.mb) * BM;
    // MASK: whether the summary calls the step partial, and if so the predicate's answers for the thread's
    // elements, taken here, while Q lands: under the score GEMMs they were held beside S^T, dP^T, dK and dV and
    // spilled (12 bytes at d 128, BLOCK_M 64, two consumers, a document mask).
    bool partial = false;
    StepPredicate<T> pred{};
    if constexpr (MaskOf<T>::on()) {
      partial = MaskBlockList::partial(p.mask.blocks.index[st.list_off + at.mb]);
      if (partial)
        pred = StepPredicate<T>::at(p.mask, w.n0 + krow, p.seq_k, m0 + 2 * tig, p.seq_k - p.seq_q, w.batch, at.hq);
    }
    mbar_wait(sm.q_full(s), phase_of<T::kStages>(t));
    const unsigned q = opaque(sm.q(s)), dout = opaque(sm.dout(s)), k = opaque(sm.k());

    float sc[BM / 2], dp[BM / 2];
    wgmma_fence();
    gemm_scores<T>(sc, opaque(k_rows), q);
    wgmma_commit();
    gemm_scores<T>(dp, opaque(v_rows), dout);
    wgmma_commit();
    StepStats<T, T::kStatsHeld && !ModsOf<T>::softcap> lse2;  // (the plain kernels': StepStats<T>)
    StepStats<T> delta;
    lse2.load(sm.lse_ptr(s), tig);
    wgmma_wait<1>();  // S^T; dP^T still running
    wgmma_fence_regs(sc);
    delta.load(sm.delta_ptr(s), tig);  // under the exponentials
    if constexpr (ModsOf<T>::any) {  // WINDOW, SOFTCAP: ModScores (the band's mask; t, then P^T and dS^T together)
      ModScores<T> mod = ModScores<T>::at(p, st, w.n0, krow, c, tig, w.batch, at.hq, m0);
      bool masked;  // MASK: the summary's partial bit; else the band's straddling test
      if constexpr (MaskOf<T>::on()) masked = partial, mod.pred = pred;
      else masked = mod.masked(m0);
      mod.under_dp(sc, lse2, m0, masked);
      wgmma_wait<0>();  // dP^T
      wgmma_fence_regs(dp);
      mod.after_dp(sc, dp, lse2, delta, m0, masked);
    } else {
      const bool masked = wg_key_last >= p.seq_k || (T::kCausal && wg_key_last > m0 + rows.causal_offset);
      if (masked) probs<T, true>(sc, lse2, scale_log2, rows, m0);
      else probs<T, false>(sc, lse2, scale_log2, rows, m0);
      wgmma_wait<0>();  // dP^T
      wgmma_fence_regs(dp);
      dscores<T>(dp, sc, delta);
    }
    unsigned pa[BM / 16][4], dsa[BM / 16][4];
    pack_all<DT, BM>(pa, sc);
    pack_all<DT, BM>(dsa, dp);
    wgmma_fence_regs(dv);
    wgmma_fence_regs(dk);
    wgmma_fence();
    gemm_grad<T>(dv, pa, dout);                      // dV += P^T dO, running while dS^T is stored and shared
    if constexpr (!T::kDqOverlap) gemm_grad<T>(dk, dsa, q);  // dK += dS^T Q with it (DQ_OVERLAP 0)
    wgmma_commit();
    const unsigned ds = opaque(sm.ds(t & 1));
    store_a_frags_stsm<BM>(ds, dsa, krow - g, lane);
    fence_proxy_async();
    // Step t's dQ: a piece from every consumer, or (DQ_TURNS) all of it from consumer t % 2, which alone waits for
    // the other's dS^T rows; the other goes on to step t + 1.
    const bool mine = !T::kDqTurns || t % T::kConsumers == c;
    if (mine) named_bar_sync(kDsReady, NQ);  // every warpgroup's dS^T rows
    else named_bar_arrive(kDsReady, NQ);
    // This warpgroup's piece of the step's dQ (the whole of it under DQ_TURNS), chains placed by DqLayout.
    const DqSink<T> sink = DqSink<T>::at(sm, ws, p, w, st, at, t, T::kDqTurns ? 0 : c);
    if constexpr (T::kDqOverlap) {
      // DQ_OVERLAP 1, one dQ chain: issued before dK += dS^T Q, so that it is staged while dK runs.
      float dq[T::kDqChunk / 2];
      wgmma_fence();
      if (mine) {
        gemm_dq<T>(dq, ds, k, piece.row_tile0, piece.col0);
        wgmma_commit();
      }
      gemm_grad<T>(dk, dsa, q);
      wgmma_commit();
      if (mine) {
        wgmma_wait<1>();  // dV and dQ
        wgmma_fence_regs(dq);
        wgmma_fence_regs(dv);
        fence_frags(pa);
        sink.wait_free();
        sink.put(dq, DqLayout<T>::chain(piece.row_tile0, piece.col0), tid);
      }
      wgmma_wait<0>();  // dK
      wgmma_fence_regs(dk);
      wgmma_fence_regs(dv);
      fence_frags(pa);
      fence_frags(dsa);
    } else {  // DQ_OVERLAP 0: dV and dK done first, then the dQ chains one by one
      if (mine) sink.wait_free();
      wgmma_wait<0>();  // dV, dK: the fragments are free
      fence_frags(pa);
      fence_frags(dsa);
      wgmma_fence_regs(dv);
      wgmma_fence_regs(dk);
      if (mine) dq_chains<T>(sink, piece, ds, k, tid);
    }
    if (lane == 0) mbar_arrive(sm.q_empty(s));  // Q, dO, lse2, delta of this slot read
    if (mine) sink.publish();
  }

  const long long bh_kv = static_cast<long long>(w.batch) * (p.heads_k > 0 ? p.heads_k : p.heads) + w.kv_head;
  const long long off = bh_kv * p.seq_k * D;
  // dV in this warpgroup's rows of V (read by its own dP^T products alone, all done); dK, once every consumer is
  // past its last step, in its rows of K (every consumer's dQ chains read all of K).
  const int row0 = w.n0 + 64 * c + wrow;
  const unsigned rows_bytes = static_cast<unsigned>((64 * c + wrow) * 2 * D);
  store_rows_staged<DT, D>(static_cast<unsigned short*>(p.dv) + off, dv, 1.f, sm.v() + rows_bytes, row0, p.seq_k,
                           lane, D, 0);
  named_bar_sync(kKvFree, NQ);
  store_rows_staged<DT, D>(static_cast<unsigned short*>(p.dk) + off, dk, p.scale, sm.k() + rows_bytes, row0, p.seq_k,
                           lane, D, 0);
}

}  // namespace fa3_bwd_detail

// The kernels' argument: AttnBwdParams, with the modifications' values after it where the traits have any
// (ModParams; the preprocess and the convert read only the plain part). One name for it, as fa3_wgmma's Fa3FwdArg,
// so that the mangled names stay short. Traits: Fa3WgmmaBwdTraits, or AttnModTraits<Fa3WgmmaBwdTraits, WINDOW,
// SOFTCAP>.
template <class Traits>
struct Fa3BwdArg {
  using type = typename ModParamsOf<ModsOf<Traits>::any, AttnBwdParams, MaskOf<Traits>::on()>::type;
};

// lse2 = lse log2(e) and delta = rowsum(dO * O) per padded row (zeros past seq_q), dq_accum = 0, and each
// query block's turn counter = 0.
// 8 lanes per row, 32 rows per CTA; y = query head, z = batch.
template <class Traits>
__global__ void __launch_bounds__(kFa3BwdRowThreads)
    fa3_wgmma_bwd_preprocess(const typename Fa3BwdArg<Traits>::type p) {
  using T = Traits;
  constexpr int D = T::kHeadDim;
  const fa3_bwd_detail::Workspace ws = fa3_bwd_detail::Workspace::of<T>(p);
  const int lane = threadIdx.x % 8;
  const int row = blockIdx.x * kFa3BwdRowsPerCta + threadIdx.x / 8;
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const bool live = row < p.seq_q;
  float acc = 0.f;
  if (live) {
    const long long off = (bh * p.seq_q + row) * D;
    for (int c = lane; c < D / 8; c += 8) {
      const uint4 ov = *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p.o) + off + 8 * c);
      const uint4 dv = *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p.dout) + off + 8 * c);
      const unsigned ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float o0, o1, d0, d1;
        unpack_half2<T::kDtype>(ow[e], o0, o1);
        unpack_half2<T::kDtype>(dw[e], d0, d1);
        acc = fmaf(o0, d0, fmaf(o1, d1, acc));
      }
    }
  }
  acc = group_sum<8>(acc);
  if (row < ws.rows) {
    const long long r = bh * ws.rows + row;
    if (lane == 0) {
      ws.lse2[r] = live ? p.lse[bh * p.seq_q + row] * kLog2e : 0.f;
      ws.delta[r] = acc;
    }
    for (int c = lane; c < D / 4; c += 8)
      *reinterpret_cast<float4*>(ws.dq_accum + r * D + 4 * c) = make_float4(0.f, 0.f, 0.f, 0.f);
    if (lane == 0 && row % T::kBlockM == 0) *ws.turn<T>(blockIdx.z, p.heads, blockIdx.y, row / T::kBlockM) = 0;
  }
}

// One CTA per (key block, kv head, batch) (fa3_bwd_dkdv_grid): see the file's head.
template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    fa3_wgmma_bwd_dkdv(const typename Fa3BwdArg<Traits>::type p,
                       const __grid_constant__ AttnTensorMaps tm) {
  using T = Traits;
  namespace det = fa3_bwd_detail;
  check_dynamic_smem(T::kSmemBytes);
  extern __shared__ __align__(1024) unsigned char fa3_bwd_smem[];
  const unsigned raw = smem_u32(fa3_bwd_smem), base = (raw + 1023u) & ~1023u;
  const det::Smem<T> sm{base, fa3_bwd_smem + (base - raw)};
  static_assert(!MaskOf<T>::on() || (!T::kDeterministic && !ModsOf<T>::window),
                "a mask_mod has no deterministic dQ order (its key blocks are not a range) and no window");
  const det::Work w = det::Work::of<T>(p);
  if constexpr (T::kPairGroups)
    if (w.batch >= p.batch) return;  // the last group's CTAs past the pairs (before any barrier: all threads)
  const det::Steps st = det::Steps::of<T>(p, w);

  if (threadIdx.x == 0) {
    mbar_init(sm.kv_full(), 1);
    for (int s = 0; s < T::kStages; ++s) {
      mbar_init(sm.q_full(s), 1);
      mbar_init(sm.q_empty(s), 4 * T::kConsumers);  // lane 0 of every consumer warp
    }
    fence_mbar_init();
  }
  __syncthreads();

  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);  // warp-uniform, as ptxas can see
  if (wg == 0) {
    setmaxnreg_dec<T::kProducerRegs>();
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const det::Workspace ws = det::Workspace::of<T>(p);
    if (warp == 0 && lane == 0) {
      for (int i = 0; i < 4; ++i) prefetch_tensormap(&tm.map[i]);
      det::produce<T>(sm, tm, p, w, st, ws);
    } else if (T::kDqStages >= 1 && warp == 1) {  // the writers' tiles as constants: a register each would not
      det::write_dq<T>(sm, p, w, st, ws, 0, lane);   // fit the warpgroup's 24
    } else if (T::kDqStages == 2 && warp == 2) {
      det::write_dq<T>(sm, p, w, st, ws, 1, lane);
    }
    return;
  }
  setmaxnreg_inc<T::kConsumerRegs>();
  det::consume<T>(sm, p, w, st, wg - 1, static_cast<int>(threadIdx.x) - 128 * wg);
}

// dQ = 16-bit(scale dq_accum) for rows < seq_q: one CTA per query block (x), head (y) and batch (z). The
// block's float4s are read in order (coalesced; DqLayout places them) into a 16-bit row-major tile in shared
// memory (rows padded by 16 bytes: a warp's pairs land on 32 banks), which is then written out 16 bytes a thread.
// (Written straight from the staging order, the 4-byte pairs left half of each 32-byte sector per store: the
// kernel took twice as long, 130 us against 66 at d 64, S 1k.)
template <class Traits>
__global__ void __launch_bounds__(kFa3BwdRowThreads)
    fa3_wgmma_bwd_convert(const typename Fa3BwdArg<Traits>::type p) {
  using T = Traits;
  using L = fa3_bwd_detail::DqLayout<T>;
  constexpr int D = T::kHeadDim, BM = T::kBlockM, PITCH = D + 8;  // 16-bit elements per shared row
  __shared__ __align__(16) unsigned short tile[BM * PITCH];
  const fa3_bwd_detail::Workspace ws = fa3_bwd_detail::Workspace::of<T>(p);
  const long long bh = static_cast<long long>(blockIdx.z) * p.heads + blockIdx.y;
  const int m0 = static_cast<int>(blockIdx.x) * BM;
  const float4* src = reinterpret_cast<const float4*>(ws.dq_accum + (bh * ws.rows + m0) * D);
  const float scale = p.scale;
#pragma unroll 4
  for (int f = threadIdx.x; f < BM * D / 4; f += kFa3BwdRowThreads) {
    int row, col;
    L::place(f, row, col);
    const float4 a = src[f];
    if constexpr (T::kDqTransposed) {  // the tile's (row, col) is dQ's (col, row): four 16-bit stores
      const unsigned xy = pack_half2<T::kDtype>(a.x * scale, a.y * scale), zw = pack_half2<T::kDtype>(a.z * scale, a.w * scale);
      tile[col * PITCH + row] = static_cast<unsigned short>(xy);
      tile[(col + 1) * PITCH + row] = static_cast<unsigned short>(xy >> 16);
      tile[col * PITCH + row + 8] = static_cast<unsigned short>(zw);
      tile[(col + 1) * PITCH + row + 8] = static_cast<unsigned short>(zw >> 16);
    } else {
      *reinterpret_cast<unsigned*>(tile + row * PITCH + col) = pack_half2<T::kDtype>(a.x * scale, a.y * scale);
      *reinterpret_cast<unsigned*>(tile + (row + 8) * PITCH + col) = pack_half2<T::kDtype>(a.z * scale, a.w * scale);
    }
  }
  __syncthreads();
  const int rows = p.seq_q - m0;  // rows of this block that exist
  unsigned short* dst = static_cast<unsigned short*>(p.dq) + (bh * p.seq_q + m0) * D;
#pragma unroll 4
  for (int i = threadIdx.x; i < BM * D / 8; i += kFa3BwdRowThreads) {
    const int row = i / (D / 8), c8 = 8 * (i % (D / 8));
    if (row < rows) *reinterpret_cast<uint4*>(dst + row * D + c8) = *reinterpret_cast<const uint4*>(tile + row * PITCH + c8);
  }
}

}  // namespace flashtune
