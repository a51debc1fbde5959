// Tunables, derived constants and launch geometry of the fa2_wgmma_bwd family: FlashAttention-2's
// backward on Hopper's warpgroup MMA (wgmma, sm_90a), fp16 or bf16 in and out, fp32 accumulation.
// Three kernels, launched in this order; the last is fa2_mma_bwd's (DQ_MODE 0):
//   fa2_wgmma_bwd_preprocess  delta = rowsum(dO * O) (fp32), dq_accum = 0; LOAD 1: tile images (below)
//   fa2_wgmma_bwd_dkdv      one CTA per K/V block of BLOCK_N keys of a kv head: dK, dV, and
//                           dq_accum += scale dS K (fp32 reductions)
//   fa2_mma_bwd_dq          dQ = 16-bit(dq_accum)
// Grouped-query attention (AttnBwdParams::heads_k): the preprocess and the dQ conversion run per query
// head (grid y = heads), the dK/dV kernel per kv head (grid y = heads_k), looping over the query blocks
// of every query head of its group, so that dK, dV are summed over the group in registers.
// Host-usable: plain constexpr C++. Host functions take the tunables they depend on (BM, BN, SPLIT,
// STAGES; DQ_RED and LOAD only change the dK/dV kernel's shared memory, LOAD the workspace); DTYPE and
// CAUSAL change no geometry.
//
// How Q_i, dO_i, lse_i, delta_i reach shared memory (LOAD):
//   0: every thread issues 16-byte cp.async from the inputs (rows past seq_q zero-filled);
//   1: the preprocess writes each BM-row block of Q and dO as the interleaved tile image that shared
//      memory holds, and lse, delta padded to whole blocks (zeros past seq_q), into p.workspace; one
//      thread then loads a block with four bulk copies (the copy engine) completing on an mbarrier.
//      Nsight Compute on the d = 256 kernel with LOAD 0 put a third of all warp stall samples on the
//      cp.async issue sequence (long scoreboard: each LDGSTS holds its address registers until the
//      memory system accepts it, with the L2 73% busy).
//
// dK/dV kernel, warpgroups (4 warps, 128 threads) and their work per query block of BM rows:
//   SPLIT 0 (keys): BN/64 warpgroups, each owns 64 keys and computes S^T, dP^T, dV, dK for them;
//   SPLIT 1 (roles): two warpgroups share the CTA's 64 keys (BN = 64): warpgroup 0 computes S^T,
//     P^T (handed to warpgroup 1 through shared memory) and dV; warpgroup 1 computes dP^T, dS^T and
//     dK. Meant for d >= 192, where one warpgroup cannot hold both dK and dV (2 x D/2 registers).
//   SPLIT 2 (columns): two warpgroups share the CTA's 64 keys (BN = 64) and halve every product
//     along N: S^T and dP^T over half of the query columns each, P^T and dS^T (16-bit) exchanged
//     through shared memory, then dV and dK over half of the D columns each (both operands from
//     shared memory). No role waits on the other; both hold D/4 + D/4 gradient registers.
//   All: dQ_i = dS K_j is split over all warpgroups: BM/64 m64 tiles x NQ column pieces of D/NQ,
//   added into dq_accum by fp32 reductions from registers (DQ_RED 0: red.global.add.v2.f32 per pair),
//   or (DQ_RED 1) staged as a BM x D fp32 tile in shared memory and added by one bulk reduction
//   (cp.reduce.async.bulk .add.f32) per row, issued by warp 0 and left running while the next query
//   block is computed (waited for only before the next staging), or
//   (DQ_RED 2) staged per warp (its 16 rows x 32 columns at a time, swizzled), read back row-contiguous,
//   so that each red.global.add.v4.f32 of a warp covers whole 128-byte lines: on an H100 such
//   reductions sustain 2.4 TB/s against 1.7 TB/s for the 32-byte pieces of the C layout
//   (experiments/probes/wgmma_rate.cu), or
//   (DQ_RED 3) staged as the whole BM x D fp32 tile in the Q/dO slot of the block just used (dead
//   once dV, dK are done: 4 BM D bytes either way) and added by ONE bulk reduction per query block
//   (the rows are contiguous in dq_accum), issued after the next block's first barrier and waited
//   for only before that slot is refilled, after the next block's scores (STAGES 2 only: the
//   prefetch of block i+1 moves from the top of block i to its middle). No reduction instruction
//   is left to the warps. dq_accum is then stored swizzled (16-byte piece c of row r at c ^ (r % 8)
//   within its 128-byte line: conflict-free C-layout stores, and the bulk copy is a plain memcpy);
//   the dQ conversion kernel reads it back through the same swizzle.
//
// Bitwise-reproducible dQ (DETERMINISTIC): dK, dV are summed in registers in a fixed order, so only the order in
// which the key blocks' dQ tiles reach a query block's dq_accum rows varies from run to run. DETERMINISTIC 1
// fixes it (FlashAttention-3's semaphore, as fa3_wgmma_bwd's): a turn counter per (batch, query head, query
// block) in p.workspace, zeroed by the preprocess; before its bulk reduction into query block m, key block j's
// issuing thread waits until m's counter reads j's turn, and passes the turn on once the reduction is complete
// (not just read). 1: ascending key-block order; 2 (causal only): descending, each query block's diagonal block
// first, the grid launched from the last key block down. Needs DQ_RED 3 (one bulk reduction per query block) and
// walks the query blocks in order, from the first visible one (no rotation: a rotated walk would make a key
// block wait for its neighbour's whole lap).
//
// The dK/dV grid's order (SCHED; fa2_wgmma_bwd_dkdv_grid, fa2_wgmma_bwd_work):
//   0: x = key block, y = kv head, z = batch: a (kv head, batch) pair's key blocks side by side (they share Q and
//      dO in L2). Under DETERMINISTIC they start together, in the first wave and in every later one, so key block j
//      waits j turns at its first query block (a ramp, each wave).
//   3: fa3_wgmma_bwd's SCHED 3 (FlashAttention-3's head swizzle): pairs in groups whose Q and dO fit a share of L2
//      (bwd_pair_group), x = pair within the group, y = key block, z = group: every pair's key block j of a group
//      is launched before any pair's j + 1, so a block's predecessors in the turns ran rows earlier, and a pair's
//      blocks stay a group's width apart, close enough to share Q and dO in L2. The last group's CTAs past the
//      pairs exit. Predicted, not yet measured: DETERMINISTIC non-causal d 256 +5-13% (what fa3_wgmma_bwd's SCHED 3
//      gave at d 64 and 128 on the H200), non-deterministic within +-3%.
//   1: 3 with one group of every pair (the family passes group = pairs): a wave holds (its CTAs / pairs) key blocks
//      of each pair, so the turns' ramp is that long, not a wave's. At d 256 the L2 rule leaves 3 little room (one
//      pair a group at S 16k: 0's order), while the key blocks of a wave still read a pair's Q and dO together, in
//      step: what 1 gives up is only the reuse across waves. Predicted: DETERMINISTIC d 256 at S 4k and 16k near
//      the non-deterministic picks (the ramp 4 and 16 steps of 64 and 256, from 33 and 132).
#pragma once
#include "traits_common.h"

namespace flashtune {

FT_HD constexpr int fa2_wgmma_bwd_warpgroups(int BN, int SPLIT) { return SPLIT == 0 ? BN / 64 : 2; }
FT_HD constexpr int fa2_wgmma_bwd_dq_m_tiles(int BM) { return BM / 64; }
FT_HD constexpr int fa2_wgmma_bwd_dq_col_pieces(int BM, int BN, int SPLIT) {
  return fa2_wgmma_bwd_dq_m_tiles(BM) > 0 ? fa2_wgmma_bwd_warpgroups(BN, SPLIT) / fa2_wgmma_bwd_dq_m_tiles(BM) : 0;
}
FT_HD constexpr int fa2_wgmma_bwd_dq_cols(int D, int BM, int BN, int SPLIT) {
  return fa2_wgmma_bwd_dq_col_pieces(BM, BN, SPLIT) > 0 ? D / fa2_wgmma_bwd_dq_col_pieces(BM, BN, SPLIT) : 0;
}
// The N of every wgmma issued (BM for S^T / dP^T, D or D/NQ for the others) must be one of these.
FT_HD constexpr bool fa2_wgmma_bwd_n_ok(int n) {
  return n == 16 || n == 32 || n == 48 || n == 64 || n == 96 || n == 128 || n == 192 || n == 256;
}
// dQ columns per wgmma chain (the piece is done in chunks to bound registers): at most 64, 32 beside
// 128 or more kept gradient registers (SPLIT 0 at d >= 128, SPLIT 1 at d = 256), equal chunks (96 -> 2 x 48).
FT_HD constexpr int fa2_wgmma_bwd_dq_chunk(int D, int BM, int BN, int SPLIT) {
  const int cols = fa2_wgmma_bwd_dq_cols(D, BM, BN, SPLIT);
  const int cap = (SPLIT == 0 ? D : SPLIT == 1 ? D / 2 : 0) >= 128 ? 32 : 64;
  return cols <= cap ? cols : cols % cap == 0 ? cap : cols / 2;
}
// Peak fp32 accumulators per thread: SPLIT 0 holds dK + dV (D) and S^T + dP^T (BM), later dK + dV
// and a dQ chunk; SPLIT 1 holds one of dK, dV (D/2) and one of S^T, dP^T (BM/2), later a dQ chunk;
// SPLIT 2 half of dK and of dV (D/2) and half of S^T and of dP^T (BM/2), later a dQ chunk.
FT_HD constexpr int fa2_wgmma_bwd_acc_regs(int D, int BM, int BN, int SPLIT) {
  const int keep = SPLIT == 0 ? D : D / 2;
  const int scores = SPLIT == 0 ? BM : BM / 2;
  const int dq = fa2_wgmma_bwd_dq_chunk(D, BM, BN, SPLIT) / 2;
  return keep + (scores > dq ? scores : dq);
}
// What the register file leaves for accumulators at one CTA per SM (65536 registers; ~48 per thread
// for addresses, loop state and fragments), capped at 192 like the other tensor-core families.
FT_HD constexpr int fa2_wgmma_bwd_acc_budget(int threads) {
  return threads > 0 ? (65536 / threads - 48 < 192 ? 65536 / threads - 48 : 192) : 0;
}

// Elementwise kernels shared with fa2_mma_bwd: 256 threads, 8 lanes per row, 32 rows per CTA.
constexpr int kFa2WgmmaBwdRowThreads = 256;
constexpr int kFa2WgmmaBwdRowLanes = 8;
constexpr int kFa2WgmmaBwdRowsPerCta = kFa2WgmmaBwdRowThreads / kFa2WgmmaBwdRowLanes;

FT_HD constexpr int fa2_wgmma_bwd_preprocess_threads(int, int, int, int) { return kFa2WgmmaBwdRowThreads; }
FT_HD constexpr int fa2_wgmma_bwd_preprocess_smem_bytes(int, int, int, int, int) { return 0; }
// Rows up to seq_q rounded up to BM (LOAD 1 writes the padding of the images; with LOAD 0 those CTAs
// have nothing to do).
FT_HD constexpr GridDims fa2_wgmma_bwd_preprocess_grid(int batch, int heads, int seq_q, int, int BM, int, int, int) {
  return GridDims{ceil_div(ceil_div(seq_q, BM) * BM, kFa2WgmmaBwdRowsPerCta), heads, batch};
}

FT_HD constexpr int fa2_wgmma_bwd_dkdv_threads(int, int BN, int SPLIT, int) {
  return 128 * fa2_wgmma_bwd_warpgroups(BN, SPLIT);
}
// K, V [BN][D]; STAGES x (Q, dO [BM][D]); dS^T [BN][BM] (16-bit, interleaved); P^T [64][BM] (SPLIT 1
// fp32, SPLIT 2 16-bit); STAGES x (lse, delta [BM]) fp32.
FT_HD constexpr int fa2_wgmma_bwd_p_bytes(int BM, int SPLIT) { return SPLIT == 1 ? 4 * 64 * BM : SPLIT == 2 ? 2 * 64 * BM : 0; }
// DQ_RED 1: + the dQ staging tile [BM][D + 8] fp32 (rows padded); DQ_RED 2: + a [16][32] fp32 tile per warp;
// DQ_RED 3: nothing (the Q/dO slot).
FT_HD constexpr int fa2_wgmma_bwd_dq_stage_bytes(int D, int BM, int BN, int SPLIT, int DQ_RED) {
  return DQ_RED == 1   ? 4 * BM * (D + 8)
         : DQ_RED == 2 ? fa2_wgmma_bwd_warpgroups(BN, SPLIT) * 4 * 16 * 32 * 4
                       : 0;
}
// LOAD 1: + one 8-byte mbarrier per stage, last.
FT_HD constexpr int fa2_wgmma_bwd_dkdv_smem_bytes(int D, int BM, int BN, int SPLIT, int STAGES, int DQ_RED, int LOAD) {
  return 2 * (2 * BN * D + STAGES * 2 * BM * D + BN * BM) + fa2_wgmma_bwd_p_bytes(BM, SPLIT) + 8 * STAGES * BM +
         fa2_wgmma_bwd_dq_stage_bytes(D, BM, BN, SPLIT, DQ_RED) + (LOAD == 1 ? 8 * STAGES : 0);
}
// LOAD 1's images in p.workspace: Q, dO (16-bit) and lse, delta (fp32) for seq_q rounded up to BM rows,
// per query head (heads: the query heads, also under grouped-query attention).
FT_HD constexpr long long fa2_wgmma_bwd_padded_rows(int seq_q, int BM) { return static_cast<long long>(ceil_div(seq_q, BM)) * BM; }
// The rows of a (sequence's) images the preprocess writes: its padded blocks, no more. Dense, the grid is
// exactly those rows; packed, it covers the longest sequence's blocks, and a shorter sequence's rows past its
// own padding are the next sequence's images (or the next head's, or past the workspace).
FT_HD constexpr bool fa2_wgmma_bwd_image_row(int row, int seq_q, int BM) { return row < fa2_wgmma_bwd_padded_rows(seq_q, BM); }
FT_HD constexpr long long fa2_wgmma_bwd_images_bytes(int batch, int heads, int seq_q, int D, int BM, int LOAD) {
  return LOAD == 1 ? static_cast<long long>(batch) * heads * fa2_wgmma_bwd_padded_rows(seq_q, BM) * (4LL * D + 8) : 0;
}
// DETERMINISTIC's turn counters (int32) follow the images, laid out as lse and delta are ([B H][seq_q], packed
// [H][total_q]): query block m's counter is the one of its first row, m BM (a row per counter: simple to address
// packed, and 4 bytes a query row against dq_accum's 4 D).
FT_HD constexpr long long fa2_wgmma_bwd_turns_bytes(int batch, int heads, int seq_q, int DETERMINISTIC) {
  return DETERMINISTIC >= 1 ? 4LL * batch * heads * seq_q : 0;
}
FT_HD constexpr long long fa2_wgmma_bwd_workspace_bytes(int batch, int heads, int seq_q, int D, int BM, int LOAD,
                                                       int DETERMINISTIC = 0) {
  return fa2_wgmma_bwd_images_bytes(batch, heads, seq_q, D, BM, LOAD) +
         fa2_wgmma_bwd_turns_bytes(batch, heads, seq_q, DETERMINISTIC);
}
// Packed (varlen) images: per query head, sequence b's padded blocks from row
// round_up(cu_q[b], 16) + b (BM + 16): 16-row aligned for the bulk copies of lse and delta, and the 16 rows
// per sequence cover the rounding, so that no two sequences' blocks overlap (padded length <= len + BM - 1);
// a head's images are round_up(total_q, 16) + batch (BM + 16) rows (a multiple of 16).
FT_HD constexpr long long fa2_wgmma_bwd_round16(long long x) { return (x + 15) / 16 * 16; }
FT_HD constexpr long long fa2_wgmma_bwd_varlen_seq_row(long long q_tok0, int b, int BM) {
  return fa2_wgmma_bwd_round16(q_tok0) + static_cast<long long>(b) * (BM + 16);
}
FT_HD constexpr long long fa2_wgmma_bwd_varlen_head_rows(long long total_q, int batch, int BM) {
  return fa2_wgmma_bwd_round16(total_q) + static_cast<long long>(batch) * (BM + 16);
}
FT_HD constexpr long long fa2_wgmma_bwd_varlen_images_bytes(int batch, int heads, long long total_q, int D, int BM,
                                                           int LOAD) {
  return LOAD == 1 ? static_cast<long long>(heads) * fa2_wgmma_bwd_varlen_head_rows(total_q, batch, BM) * (4LL * D + 8) : 0;
}
FT_HD constexpr long long fa2_wgmma_bwd_varlen_workspace_bytes(int batch, int heads, long long total_q, int D, int BM,
                                                              int LOAD, int DETERMINISTIC = 0) {
  return fa2_wgmma_bwd_varlen_images_bytes(batch, heads, total_q, D, BM, LOAD) +
         (DETERMINISTIC >= 1 ? 4LL * heads * total_q : 0);
}
// kv_heads: heads_k, or heads when multi-head. SCHED 0: x = key blocks, y = kv heads, z = batch (packed: sequences);
// SCHED 1 and 3: x = pair within a group of `group` (kv head, batch) pairs (3: bwd_pair_group; 1: every pair), y = key
// blocks, z = group.
FT_HD constexpr GridDims fa2_wgmma_bwd_dkdv_grid(int batch, int kv_heads, int seq_k, int BN, int SCHED, int group) {
  const int nb = ceil_div(seq_k, BN), pairs = kv_heads * batch, g = group < 1 ? 1 : group;
  return SCHED != 0 ? GridDims{g, nb, ceil_div(pairs, g)} : GridDims{nb, kv_heads, batch};
}

// DETERMINISTIC's order: bwd_dq_last_key_block, bwd_dq_turn (traits_common.h, shared with fa3_wgmma_bwd).
// The key block of the dK/dV CTA at index x of the grid's `blocks` key blocks (SCHED 0: x, 3: y): DETERMINISTIC 2
// counts them from the last down, so that the blocks a key block waits for (the higher ones) were launched before it
// (packed: the grid covers the longest sequence; a shorter one's CTAs past its keys, now launched first, exit at once).
// (Unsigned as blockIdx: DETERMINISTIC 0's n0 = x BN computed as it was.)
FT_HD constexpr unsigned fa2_wgmma_bwd_key_block(int DETERMINISTIC, unsigned x, unsigned blocks) {
  return DETERMINISTIC == 2 ? blocks - 1 - x : x;
}
// What a dK/dV CTA works on: its key block, kv head and batch (packed: sequence). The kernel reads these, never its
// block index (unsigned as blockIdx: SCHED 0 computes every offset as before).
struct Fa2WgmmaBwdWork {
  unsigned key_block, kv_head, batch;
};
// The work of the CTA at block index idx of a grid of dims dim (fa2_wgmma_bwd_dkdv_grid; the kernel's blockIdx and
// gridDim, read here only where a field needs them, or any x, y, z). SCHED 1, 3: the pair from bwd_grouped_pair, kv head
// fastest; the last group's CTAs past the pairs get batch >= the batch (no work).
template <class Idx, class Dim>
FT_HD constexpr Fa2WgmmaBwdWork fa2_wgmma_bwd_work(int SCHED, int DETERMINISTIC, int kv_heads, const Idx& idx,
                                                   const Dim& dim) {
  if (SCHED != 0) {
    const unsigned pair = static_cast<unsigned>(
        bwd_grouped_pair(static_cast<int>(idx.x), static_cast<int>(idx.z), static_cast<int>(dim.x)));
    return Fa2WgmmaBwdWork{fa2_wgmma_bwd_key_block(DETERMINISTIC, static_cast<unsigned>(idx.y),
                                                   static_cast<unsigned>(dim.y)),
                           pair % static_cast<unsigned>(kv_heads), pair / static_cast<unsigned>(kv_heads)};
  }
  return Fa2WgmmaBwdWork{fa2_wgmma_bwd_key_block(DETERMINISTIC, static_cast<unsigned>(idx.x), static_cast<unsigned>(dim.x)),
                         static_cast<unsigned>(idx.y), static_cast<unsigned>(idx.z)};
}

// The dK/dV CTA's steps (grouped-query attention walks every query head of the kv head's group; one head
// when multi-head): a step is query block mb of query head hq of the group. The sequence is the query
// blocks first .. blocks-1 that can see the CTA's keys, for head 0, 1, .. group-1; a CTA starts at a rotated
// step (DETERMINISTIC: at step 0) and takes count() of them, wrapping from the last head's last block to head
// 0's first.
struct Fa2WgmmaBwdQueryStep {
  int hq, mb;
};
struct Fa2WgmmaBwdQuerySteps {
  int first, blocks, group;
  FT_HD constexpr int count() const { return group * (blocks - first); }
  // Step u of the sequence, 0 <= u < count() (where a CTA starts: one division, outside the loop); the
  // first block of head 0 when there is no step.
  FT_HD constexpr Fa2WgmmaBwdQueryStep at(int u) const {
    return Fa2WgmmaBwdQueryStep{blocks > first ? u / (blocks - first) : 0, first + (blocks > first ? u % (blocks - first) : 0)};
  }
  // The step after st, without a division (the loop's).
  FT_HD constexpr Fa2WgmmaBwdQueryStep next(const Fa2WgmmaBwdQueryStep& st) const {
    return st.mb + 1 < blocks ? Fa2WgmmaBwdQueryStep{st.hq, st.mb + 1}
                              : Fa2WgmmaBwdQueryStep{st.hq + 1 < group ? st.hq + 1 : 0, first};
  }
};

FT_HD constexpr int fa2_wgmma_bwd_dq_threads(int, int, int, int) { return kFa2WgmmaBwdRowThreads; }
FT_HD constexpr int fa2_wgmma_bwd_dq_smem_bytes(int, int, int, int, int) { return 0; }
FT_HD constexpr GridDims fa2_wgmma_bwd_dq_grid(int batch, int heads, int seq_q, int, int, int, int, int) {
  return GridDims{ceil_div(seq_q, kFa2WgmmaBwdRowsPerCta), heads, batch};
}

// ---- validity (shared by fa2_wgmma_bwd_check and the traits' static_asserts) ----
FT_HD constexpr bool fa2_wgmma_bwd_d_ok(int D) {
  return D == 32 || D == 64 || D == 96 || D == 128 || D == 192 || D == 256;
}
FT_HD constexpr bool fa2_wgmma_bwd_bm_ok(int BM) { return BM == 64 || BM == 128; }
FT_HD constexpr bool fa2_wgmma_bwd_split_ok(int BN, int SPLIT) {
  return (SPLIT == 0 && BN >= 64 && BN <= 256 && BN % 64 == 0) || ((SPLIT == 1 || SPLIT == 2) && BN == 64);
}
FT_HD constexpr bool fa2_wgmma_bwd_stages_ok(int STAGES) { return STAGES == 1 || STAGES == 2; }
FT_HD constexpr bool fa2_wgmma_bwd_red_ok(int DQ_RED) { return DQ_RED >= 0 && DQ_RED <= 3; }
// DQ_RED 3 stages dQ in the slot the next-but-one block is loaded into: needs the second slot.
FT_HD constexpr bool fa2_wgmma_bwd_red_stages_ok(int STAGES, int DQ_RED) { return DQ_RED != 3 || STAGES == 2; }
// DQ_RED 2 stages dQ chunks 32 columns at a time; DQ_RED 3 swizzles within 128-byte (32-column) lines.
FT_HD constexpr bool fa2_wgmma_bwd_red_chunk_ok(int D, int BM, int BN, int SPLIT, int DQ_RED) {
  return DQ_RED < 2 || fa2_wgmma_bwd_dq_chunk(D, BM, BN, SPLIT) % 32 == 0;
}
FT_HD constexpr bool fa2_wgmma_bwd_dq_ok(int D, int BM, int BN, int SPLIT) {
  return (SPLIT != 2 || (fa2_wgmma_bwd_n_ok(BM / 2) && fa2_wgmma_bwd_n_ok(D / 2))) && fa2_wgmma_bwd_dq_m_tiles(BM) > 0 && fa2_wgmma_bwd_warpgroups(BN, SPLIT) % fa2_wgmma_bwd_dq_m_tiles(BM) == 0 &&
         fa2_wgmma_bwd_dq_col_pieces(BM, BN, SPLIT) > 0 && D % fa2_wgmma_bwd_dq_col_pieces(BM, BN, SPLIT) == 0 &&
         fa2_wgmma_bwd_n_ok(fa2_wgmma_bwd_dq_cols(D, BM, BN, SPLIT)) &&
         fa2_wgmma_bwd_n_ok(fa2_wgmma_bwd_dq_chunk(D, BM, BN, SPLIT)) &&
         fa2_wgmma_bwd_dq_cols(D, BM, BN, SPLIT) % fa2_wgmma_bwd_dq_chunk(D, BM, BN, SPLIT) == 0;
}
FT_HD constexpr bool fa2_wgmma_bwd_acc_ok(int D, int BM, int BN, int SPLIT) {
  return fa2_wgmma_bwd_acc_regs(D, BM, BN, SPLIT) <=
         fa2_wgmma_bwd_acc_budget(fa2_wgmma_bwd_dkdv_threads(BM, BN, SPLIT, 1));
}
FT_HD constexpr bool fa2_wgmma_bwd_dtype_ok(int DTYPE) { return DTYPE == 0 || DTYPE == 1; }
FT_HD constexpr bool fa2_wgmma_bwd_load_ok(int LOAD) { return LOAD == 0 || LOAD == 1; }
FT_HD constexpr bool fa2_wgmma_bwd_det_ok(int DETERMINISTIC) { return DETERMINISTIC >= 0 && DETERMINISTIC <= 2; }
// The turns order one add per (key block, query block): DQ_RED 3's bulk reduction of the whole tile (DQ_RED 0
// and 2 add from every warp, 1 a row at a time from a staging tile the next block reuses).
FT_HD constexpr bool fa2_wgmma_bwd_det_red_ok(int DQ_RED, int DETERMINISTIC) { return DETERMINISTIC == 0 || DQ_RED == 3; }
// DETERMINISTIC 2 orders the adds for the causal mask: without it every key block sees every query block, and
// 1's ascending order waits for nothing (the family's causal check; the traits assert it).
FT_HD constexpr bool fa2_wgmma_bwd_det_causal_ok(int DETERMINISTIC, bool CAUSAL) { return DETERMINISTIC != 2 || CAUSAL; }
FT_HD constexpr bool fa2_wgmma_bwd_sched_ok(int SCHED) { return SCHED == 0 || SCHED == 1 || SCHED == 3; }

// nullptr if valid, else the reason. The shared-memory limit is the host's to compare.
FT_HD constexpr const char* fa2_wgmma_bwd_check(int D, int BM, int BN, int SPLIT, int STAGES, int DQ_RED, int LOAD,
                                                int DETERMINISTIC = 0, int SCHED = 0) {
  return !fa2_wgmma_bwd_d_ok(D)                ? "D must be 32, 64, 96, 128, 192 or 256"
         : !fa2_wgmma_bwd_bm_ok(BM)            ? "BLOCK_M must be 64 or 128 (m64 tiles of the dQ product)"
         : !fa2_wgmma_bwd_split_ok(BN, SPLIT)  ? "SPLIT 0 needs BLOCK_N a multiple of 64 in 64..256, SPLIT 1 and 2 BLOCK_N = 64"
         : !fa2_wgmma_bwd_stages_ok(STAGES)    ? "STAGES must be 1 or 2"
         : !fa2_wgmma_bwd_red_ok(DQ_RED)
             ? "DQ_RED must be 0 (reductions from registers), 1 (bulk per row), 2 (staged per warp, v4) or 3 (bulk per block)"
         : !fa2_wgmma_bwd_dq_ok(D, BM, BN, SPLIT)
             ? "wgmma shapes: warpgroups must tile dQ in BM/64 m64 tiles x column pieces of a wgmma N (SPLIT 2: BM/2, D/2 too)"
         : !fa2_wgmma_bwd_acc_ok(D, BM, BN, SPLIT)
             ? "accumulators per thread exceed the register budget (kept dK/dV + max(S^T/dP^T, dQ chunk))"
         : !fa2_wgmma_bwd_red_chunk_ok(D, BM, BN, SPLIT, DQ_RED) ? "DQ_RED 2 and 3 need dQ chunks of a multiple of 32 columns"
         : !fa2_wgmma_bwd_red_stages_ok(STAGES, DQ_RED)
             ? "DQ_RED 3 stages dQ in the Q/dO slot of the block just used: needs STAGES 2"
         : !fa2_wgmma_bwd_load_ok(LOAD) ? "LOAD must be 0 (cp.async from the inputs) or 1 (bulk copies of tile images)"
         : !fa2_wgmma_bwd_det_ok(DETERMINISTIC) ? "DETERMINISTIC must be 0, 1 (ascending key-block order) or 2 (descending)"
         : !fa2_wgmma_bwd_det_red_ok(DQ_RED, DETERMINISTIC)
             ? "DETERMINISTIC needs DQ_RED 3 (one bulk reduction per query block: the turns order whole tiles)"
         : !fa2_wgmma_bwd_sched_ok(SCHED)
             ? "SCHED must be 0 (a kv head's key blocks side by side), 1 (key blocks across every pair) or 3 (across pairs in "
               "L2-sized groups)"
                                        : nullptr;
}

// DETERMINISTIC and SCHED last, defaulted: the variants of 0 keep the names they had (the family writes them only
// when set).
template <int D, int BLOCK_M, int BLOCK_N, int SPLIT, int STAGES, int DQ_RED, int LOAD, int DTYPE, bool CAUSAL,
          int DETERMINISTIC = 0, int SCHED = 0>
struct Fa2WgmmaBwdTraits {
  static_assert(fa2_wgmma_bwd_check(D, BLOCK_M, BLOCK_N, SPLIT, STAGES, DQ_RED, LOAD, DETERMINISTIC, SCHED) == nullptr,
                "invalid Fa2WgmmaBwdTraits: see fa2_wgmma_bwd_check");
  static_assert(fa2_wgmma_bwd_dtype_ok(DTYPE), "DTYPE must be 0 (fp16) or 1 (bf16)");
  static_assert(fa2_wgmma_bwd_det_causal_ok(DETERMINISTIC, CAUSAL), "DETERMINISTIC 2 is causal only");

  static constexpr int kHeadDim = D;
  static constexpr int kBlockM = BLOCK_M;
  static constexpr int kBlockN = BLOCK_N;
  static constexpr int kSplit = SPLIT;
  static constexpr int kStages = STAGES;
  static constexpr int kDqRed = DQ_RED;
  static constexpr int kLoad = LOAD;
  static constexpr int kDtype = DTYPE;
  static constexpr bool kCausal = CAUSAL;
  static constexpr bool kDeterministic = DETERMINISTIC >= 1;
  static constexpr int kDeterministicOrder = DETERMINISTIC;  // bwd_dq_turn, fa2_wgmma_bwd_key_block
  static constexpr int kSched = SCHED;                       // fa2_wgmma_bwd_work
  static constexpr bool kPairGroups = SCHED != 0;            // CTAs past the last pair: no work
  static constexpr int kDqMode = 0;  // dQ by fp32 reductions (the shared preprocess / dq kernels read this)
  static constexpr bool kDqAccumSwizzled = DQ_RED == 3;  // dq_accum's layout, for the dQ conversion kernel

  static constexpr int kWarpgroups = fa2_wgmma_bwd_warpgroups(BLOCK_N, SPLIT);
  static constexpr int kDqMTiles = fa2_wgmma_bwd_dq_m_tiles(BLOCK_M);
  static constexpr int kDqColPieces = fa2_wgmma_bwd_dq_col_pieces(BLOCK_M, BLOCK_N, SPLIT);
  static constexpr int kDqCols = fa2_wgmma_bwd_dq_cols(D, BLOCK_M, BLOCK_N, SPLIT);
  static constexpr int kDqChunk = fa2_wgmma_bwd_dq_chunk(D, BLOCK_M, BLOCK_N, SPLIT);

  static constexpr int kPreThreads = fa2_wgmma_bwd_preprocess_threads(BLOCK_M, BLOCK_N, SPLIT, STAGES);
  static constexpr int kDkdvThreads = fa2_wgmma_bwd_dkdv_threads(BLOCK_M, BLOCK_N, SPLIT, STAGES);
  static constexpr int kDqThreads = fa2_wgmma_bwd_dq_threads(BLOCK_M, BLOCK_N, SPLIT, STAGES);
  static constexpr int kPreSmemBytes = fa2_wgmma_bwd_preprocess_smem_bytes(D, BLOCK_M, BLOCK_N, SPLIT, STAGES);
  static constexpr int kDkdvSmemBytes = fa2_wgmma_bwd_dkdv_smem_bytes(D, BLOCK_M, BLOCK_N, SPLIT, STAGES, DQ_RED, LOAD);
  static constexpr int kDqSmemBytes = fa2_wgmma_bwd_dq_smem_bytes(D, BLOCK_M, BLOCK_N, SPLIT, STAGES);
  static constexpr int kRowLanes = kFa2WgmmaBwdRowLanes;
  static constexpr int kRowsPerCta = kFa2WgmmaBwdRowsPerCta;
};

}  // namespace flashtune
