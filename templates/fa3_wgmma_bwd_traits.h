// Tunables, derived constants and launch geometry of the fa3_wgmma_bwd family: FlashAttention-3's
// backward design on Hopper (sm_90a), fp16 or bf16 in and out, fp32 accumulation.
//   fa3_wgmma_bwd_preprocess<T>  delta = rowsum(dO * O) and lse in log2 units into padded rows, dq_accum = 0
//   fa3_wgmma_bwd_dkdv<T>        one CTA per (key block, kv head, batch): dK, dV; dq_accum += dS K by TMA
//   fa3_wgmma_bwd_convert<T>     dQ = 16-bit(scale dq_accum)
//   T = Fa3WgmmaBwdTraits<D, BLOCK_M, CONSUMERS, STAGES, SCHED, DQ_OVERLAP, DQ_TURNS, DETERMINISTIC, DQ_STAGES,
//                         DTYPE, CAUSAL>
// The dK/dV CTA: warpgroup 0 is the producer (warp 0: TMA copies of K and V once, then Q, dO, lse and
// delta of every query block into a ring of STAGES slots) and the dQ writer (warp 1: each query block's
// dQ tile added into dq_accum by one bulk reduce-add); CONSUMERS warpgroups of 64 keys each
// (BLOCK_N = 64 x CONSUMERS) compute the five products with wgmma.
//   SCHED 0: key blocks of one (kv head, batch) side by side in the grid (they share Q and dO in L2);
//   SCHED 1: the grid's first wave takes every head's heaviest key block (causal: longest first, LPT).
//   SCHED 2: as 0, each CTA walking its query blocks from a rotated start (dq_accum's rows spread over the CTAs).
//   SCHED 3: 1 within groups of pairs whose Q and dO fit a share of L2 (bwd_pair_group, FlashAttention-3's
//   head swizzle): a pair's key blocks a group's width apart in the grid, so that they neither start together
//   (DETERMINISTIC's turns: key block j would wait j turns at the first query block) nor miss L2 (1's spread).
//   DQ_OVERLAP 0: dV and dK issued together, then the dQ chains; 1: the one dQ chain issued with dK and
//   staged while dK runs (needs a consumer's dQ piece to be one chain).
//   DQ_TURNS 1: two consumers take turns at a step's whole dQ instead of a piece each (they drift half a
//   step apart, one's softmax under the other's GEMMs).
//   DETERMINISTIC 1: the key blocks add into a query block's dq_accum rows in key-block order (a counter
//   per query block, FlashAttention-3's semaphore): bitwise-reproducible dQ. Not with SCHED 2, whose
//   rotated walks would make each key block wait for its neighbour's whole lap.
//   DETERMINISTIC 2 (causal): the same, in descending key-block order (each query block's diagonal block
//   first, then the blocks below it, in the order their walks reach it), the grid launched from the last key
//   block down so that a block never waits for one launched after it.
//   DQ_STAGES 2: two dQ staging tiles, each with a writer warp of its own (warps 1 and 2): the consumers stage
//   step t + 1's dQ while step t's add (DETERMINISTIC: its turn, then its completion) is under way.
//   DQ_STAGES 0: no staging tile and no writer: each consumer adds its dQ chains into dq_accum straight from
//   its registers (red.global.add.v4.f32, a warp's 512 contiguous bytes per instruction, the same order as the
//   staging tile's), sparing the tile's shared-memory write and read (64 KB a step at d 64, BM 128); not
//   DETERMINISTIC.
// Host-usable: plain constexpr C++.
#pragma once
#include "fa3_wgmma_traits.h"

namespace flashtune {

// Swizzle of the shared-memory tiles of Q, dO, K, V (and their TMA boxes): fa3_wgmma's
// (fa3_wgmma_swizzle_bytes, fa3_wgmma_group_cols).
FT_HD constexpr int fa3_bwd_block_n(int CONSUMERS) { return 64 * CONSUMERS; }
// Query rows padded to whole blocks: the preprocess's lse / delta rows and dq_accum's.
FT_HD constexpr int fa3_bwd_padded_rows(int seq_q, int BM) { return ceil_div(seq_q > 0 ? seq_q : 1, BM) * BM; }

// Registers: launched at one CTA per SM with 128 (CONSUMERS + 1) threads, setmaxnreg moving them to the
// consumers: the budgets are fa3_wgmma's at one CTA per SM (fa3_wgmma_launch_regs, _producer_regs,
// _consumer_regs: producer 24, 32 beside three consumers; each consumer the rest, at most 240).
// fp32 accumulators a consumer thread holds at once: dK and dV of its 64 keys (D/2 each) and the scores
// S^T, dP^T of one query block (BM/2 each). The dQ piece is live only once S^T and dP^T are packed.
FT_HD constexpr int fa3_bwd_acc_regs(int D, int BM) { return D + BM; }

// dQ of a query block over the consumers: m64 row tiles x column pieces, one piece per warpgroup (a warpgroup
// takes several row tiles when there are fewer warpgroups than row tiles). DQ_TURNS 1: one consumer takes the whole
// tile, as if there were one.
// BLOCK_M a multiple of 64: the tile is dQ (BM x D), rows the query rows. Otherwise (80, 96: FlashAttention-3's
// dQ_swapAB, its 80 x 128 tile at d 128) it is dQ^T = K^T dS^T (D x BM): rows the head dim's columns, one chain of
// BM columns per row tile, so that the query block need not fill whole m64 tiles (fa3_bwd_dq_transposed).
FT_HD constexpr bool fa3_bwd_dq_transposed(int BM) { return BM % 64 != 0; }
FT_HD constexpr int fa3_bwd_dq_tile_rows(int D, int BM) { return fa3_bwd_dq_transposed(BM) ? D : BM; }
FT_HD constexpr int fa3_bwd_dq_tile_cols(int D, int BM) { return fa3_bwd_dq_transposed(BM) ? BM : D; }
FT_HD constexpr int fa3_bwd_dq_row_tiles(int D, int BM) { return fa3_bwd_dq_tile_rows(D, BM) / 64; }
FT_HD constexpr int fa3_bwd_dq_col_pieces(int D, int BM, int CONSUMERS, int TURNS = 0) {
  return !TURNS && CONSUMERS > fa3_bwd_dq_row_tiles(D, BM) ? CONSUMERS / fa3_bwd_dq_row_tiles(D, BM) : 1;
}
FT_HD constexpr int fa3_bwd_dq_cols(int D, int BM, int CONSUMERS, int TURNS = 0) {
  return fa3_bwd_dq_tile_cols(D, BM) / fa3_bwd_dq_col_pieces(D, BM, CONSUMERS, TURNS);
}
// Columns per dQ wgmma chain (registers: DQ_CHUNK / 2): dQ, 64 where they divide the piece, else 32 (d 96; the
// piece is whole swizzle groups, fa3_bwd_dq_ok, so either is too); dQ^T, the whole query block (one chain a row
// tile: BM / 2 registers, as one of S^T).
FT_HD constexpr int fa3_bwd_dq_chunk(int D, int BM, int CONSUMERS, int TURNS = 0) {
  return fa3_bwd_dq_transposed(BM) ? BM : fa3_bwd_dq_cols(D, BM, CONSUMERS, TURNS) % 64 == 0 ? 64 : 32;
}

// The dQ staging tile's order (and so a query block's dq_accum floats), over the tile's rows x COLS (dQ: BM x D;
// dQ^T: D x BM): chain q = row tile x (COLS / CHUNK) + column chunk at q 64 CHUNK floats, each in the wgmma
// accumulators' register order: float4 j 128 + thread (thread = 32 warp + lane of the warpgroup) holds rows
// 16 warp + lane / 4 and + 8 at columns 8 j + 2 (lane % 4), + 1. Where float4 f lands: the row and first column of
// its first pair (of the tile: dQ^T's row is the head dim's column, its column the query row).
FT_HD constexpr void fa3_bwd_dq_place(int f, int COLS, int CHUNK, int& row, int& col) {
  const int per_chain = 16 * CHUNK, chains_per_row_tile = COLS / CHUNK;  // float4s per chain
  const int q = f / per_chain, k = f % per_chain, j = k / 128, thread = k % 128, lane = thread % 32;
  row = 64 * (q / chains_per_row_tile) + 16 * (thread / 32) + lane / 4;
  col = (q % chains_per_row_tile) * CHUNK + 8 * j + 2 * (lane % 4);
}

// Shared memory, from a 1024-byte aligned base (+ 1024 bytes of slack):
//   K, V [BN][D] | STAGES x (Q, dO [BM][D]) (16-bit, swizzled) | 2 x dS^T [BN][BM] (16-bit, interleaved core
//   matrices) | DQ_STAGES x dQ [BM x D] fp32 (a piece per consumer warpgroup, the accumulators' register order) |
//   STAGES x (lse, delta [BM] fp32) |
//   mbarriers
FT_HD constexpr int fa3_bwd_barriers(int STAGES) { return 1 + 2 * STAGES; }  // kv_full, STAGES x (q_full, q_empty)
FT_HD constexpr int fa3_bwd_smem_bytes(int D, int BM, int CONSUMERS, int STAGES, int DQ_STAGES = 1) {
  return 1024 + 2 * fa3_wgmma_tile_bytes(D, fa3_bwd_block_n(CONSUMERS)) + 2 * STAGES * fa3_wgmma_tile_bytes(D, BM) +
         2 * 2 * fa3_bwd_block_n(CONSUMERS) * BM + DQ_STAGES * 4 * BM * D + 8 * STAGES * BM + 8 * fa3_bwd_barriers(STAGES);
}
// Workspace (p.workspace): lse (log2 units) and delta per padded row, then dq_accum [B][H][R][D] fp32, then
// one int32 turn counter per query block [B][H][R / BM] (DETERMINISTIC; always there, zeroed by the preprocess).
FT_HD constexpr long long fa3_bwd_workspace_bytes(int batch, int heads, int seq_q, int D, int BM) {
  const long long bh = static_cast<long long>(batch) * heads;
  return bh * fa3_bwd_padded_rows(seq_q, BM) * (8LL + 4LL * D) + bh * 4LL * (fa3_bwd_padded_rows(seq_q, BM) / BM);
}

// ---- grids ----
// Preprocess: 32 rows per CTA of 256 threads (8 lanes per row), y = heads, z = batch, over the padded rows.
constexpr int kFa3BwdRowThreads = 256;
constexpr int kFa3BwdRowsPerCta = 32;
FT_HD constexpr GridDims fa3_bwd_preprocess_grid(int batch, int heads, int seq_q, int BM) {
  return GridDims{fa3_bwd_padded_rows(seq_q, BM) / kFa3BwdRowsPerCta + (fa3_bwd_padded_rows(seq_q, BM) % kFa3BwdRowsPerCta != 0),
                  heads, batch};
}
// Convert: one CTA of 256 threads per query block (its dq_accum floats in the staging order), y = heads, z = batch.
FT_HD constexpr GridDims fa3_bwd_convert_grid(int batch, int heads, int seq_q, int BM) {
  return GridDims{ceil_div(seq_q > 0 ? seq_q : 1, BM), heads, batch};
}
// dK/dV: one CTA per (key block, kv head, batch). SCHED 0 and 2: x = key blocks, y = kv heads, z = batch.
// SCHED 1: x = kv heads x batch, y = key blocks, so that the grid's first CTAs are every pair's first key
// block (causal: the longest), then every pair's second, ...
// SCHED 3: x = pair within a group of `group` pairs (bwd_pair_group), y = key blocks, z = group: 1 group by
// group; the last group's CTAs past the pairs have no work. SCHED 1 and 3 read the pair from bwd_grouped_pair
// (SCHED 1: one group, z = 0).
FT_HD constexpr GridDims fa3_bwd_dkdv_grid(int batch, int heads_k, int seq_k, int CONSUMERS, int SCHED,
                                           int group = 1) {
  const int nb = ceil_div(seq_k > 0 ? seq_k : 1, fa3_bwd_block_n(CONSUMERS));
  const int pairs = heads_k * batch, g = group < 1 ? 1 : group;
  return SCHED == 1   ? GridDims{pairs, nb, 1}
         : SCHED == 3 ? GridDims{g, nb, ceil_div(pairs, g)}
                      : GridDims{nb, heads_k, batch};
}

// ---- validity (fa3_bwd_check and the traits' static_asserts) ----
FT_HD constexpr bool fa3_bwd_d_ok(int D) { return D == 64 || D == 96 || D == 128; }
FT_HD constexpr bool fa3_bwd_bm_ok(int BM) { return BM == 64 || BM == 80 || BM == 96 || BM == 128; }
FT_HD constexpr bool fa3_bwd_consumers_ok(int C) { return C >= 1 && C <= 3; }
FT_HD constexpr bool fa3_bwd_stages_ok(int S) { return S == 1 || S == 2; }
FT_HD constexpr bool fa3_bwd_switch_ok(int x) { return x == 0 || x == 1; }
FT_HD constexpr bool fa3_bwd_sched_ok(int x) { return x >= 0 && x <= 3; }
// 48 registers of a consumer's budget kept for addresses, loop state and the packed A fragments' overlap; 32 with
// dQ^T (FlashAttention-3's 80 x 128 tile at d 128: scores and dK, dV take 208 of 240; its dQ^T chain, 40, is live
// only once the scores are packed). What still spills is pruned by the compile stage.
FT_HD constexpr bool fa3_bwd_acc_ok(int D, int BM, int C) {
  return fa3_bwd_acc_regs(D, BM) <= fa3_wgmma_consumer_regs(C) - (fa3_bwd_dq_transposed(BM) ? 32 : 48);
}
// The dQ pieces: the warpgroups split the row tiles or each row tile's columns evenly, and a piece's columns
// are whole swizzle groups of K (an MN-major B operand starts at a group). dQ^T: a row tile is one 128-byte
// swizzle group of K (the A operand K^T, MN-major: d a multiple of 64), and no warpgroup splits a row tile (its
// chain is the whole query block).
FT_HD constexpr bool fa3_bwd_dq_ok(int D, int BM, int C, int TURNS = 0) {
  const int rt = fa3_bwd_dq_row_tiles(D, BM), cp = fa3_bwd_dq_col_pieces(D, BM, C, TURNS);
  if (fa3_bwd_dq_transposed(BM)) return D % 64 == 0 && cp == 1 && (TURNS || rt % C == 0);
  return (TURNS || C % rt == 0 || rt % C == 0) && D % cp == 0 &&
         fa3_bwd_dq_cols(D, BM, C, TURNS) % fa3_wgmma_group_cols(D) == 0;
}
// Turns between two consumers: with three, one that is not the dQ consumer twice running would refill a dS^T
// tile the step before's dQ consumer may still read.
FT_HD constexpr bool fa3_bwd_turns_ok(int C, int TURNS) { return TURNS == 0 || C == 2; }
// DQ_OVERLAP 1 holds one dQ chain's accumulators beside dK's in flight: a consumer's piece is one chain.
FT_HD constexpr int fa3_bwd_dq_steps(int D, int BM, int C, int TURNS = 0) {
  const int rt = fa3_bwd_dq_row_tiles(D, BM);
  return (!TURNS && C >= rt ? 1 : TURNS ? rt : rt / C) *
         (fa3_bwd_dq_cols(D, BM, C, TURNS) / fa3_bwd_dq_chunk(D, BM, C, TURNS));
}
FT_HD constexpr bool fa3_bwd_overlap_ok(int D, int BM, int C, int DQ_OVERLAP, int TURNS = 0) {
  return DQ_OVERLAP == 0 || fa3_bwd_dq_steps(D, BM, C, TURNS) == 1;
}
FT_HD constexpr bool fa3_bwd_smem_ok(int D, int BM, int C, int STAGES, int DQ_STAGES = 1) {
  return fa3_bwd_smem_bytes(D, BM, C, STAGES, DQ_STAGES) <= kMaxSmemBytesSm90;
}
FT_HD constexpr bool fa3_bwd_dq_stages_ok(int S) { return S >= 0 && S <= 2; }
// DQ_STAGES 0 adds dQ straight from the registers (red.global.add.v4.f32), in no fixed order.
FT_HD constexpr bool fa3_bwd_direct_ok(int DQ_STAGES, int DETERMINISTIC) { return DQ_STAGES >= 1 || DETERMINISTIC == 0; }
FT_HD constexpr bool fa3_bwd_dtype_ok(int DTYPE) { return DTYPE == 0 || DTYPE == 1; }
FT_HD constexpr bool fa3_bwd_deterministic_ok(int SCHED, int DETERMINISTIC) { return DETERMINISTIC == 0 || SCHED != 2; }
FT_HD constexpr bool fa3_bwd_deterministic_value_ok(int DETERMINISTIC) { return DETERMINISTIC >= 0 && DETERMINISTIC <= 2; }
// DETERMINISTIC's order: bwd_dq_last_key_block, bwd_dq_turn (traits_common.h).

// A window (AttnModTraits' WINDOW, WindowBand): the blocks a pair of tiles share a visible (query, key) pair in.
// Query block m (rows [m BM, min((m + 1) BM, Sq))) meets key blocks first .. last (last < first: none); key block
// at n0 (keys [n0, min(n0 + BN, Sk))) meets `blocks` query blocks from `first`. Both read the band's one pairing
// (keys_of_rows, rows_of_keys), so a key block's walk visits query block m iff m's range holds the key block:
// the dQ turns below count exactly the key blocks that add into m.
FT_HD constexpr void fa3_bwd_window_key_blocks(const WindowBand& band, int m, int BM, int BN, int seq_q, int seq_k,
                                               int& first, int& last) {
  const int r1 = (m + 1) * BM < seq_q ? (m + 1) * BM : seq_q;
  const IndexRange keys = band.keys_of_rows(m * BM, r1, seq_k);
  first = keys.empty() ? 0 : keys.first / BN;
  last = keys.empty() ? -1 : (keys.end - 1) / BN;
}
FT_HD constexpr void fa3_bwd_window_query_blocks(const WindowBand& band, int n0, int BM, int BN, int seq_q, int seq_k,
                                                 int& first, int& blocks) {
  const IndexRange rows = band.rows_of_keys(n0, n0 + BN < seq_k ? n0 + BN : seq_k, seq_q);
  first = rows.empty() ? 0 : rows.first / BM;
  blocks = rows.empty() ? 0 : (rows.end - 1) / BM + 1 - first;
}
// Key block j's turn at query block m under a window: 1 ascending from m's first key block, 2 descending from its
// last (each query block's diagonal block first when causal).
FT_HD constexpr int fa3_bwd_window_turn(int DETERMINISTIC, const WindowBand& band, int j, int m, int BM, int BN,
                                        int seq_q, int seq_k) {
  int first = 0, last = -1;
  fa3_bwd_window_key_blocks(band, m, BM, BN, seq_q, seq_k, first, last);
  return DETERMINISTIC == 2 ? last - j : j - first;
}

// nullptr if valid, else the reason.
FT_HD constexpr const char* fa3_bwd_check(int D, int BM, int CONSUMERS, int STAGES, int SCHED, int DQ_OVERLAP,
                                          int DQ_TURNS = 0, int DETERMINISTIC = 0, int DQ_STAGES = 1) {
  return !fa3_bwd_d_ok(D) ? "D must be 64, 96 or 128 (dK and dV of 64 keys at d > 128 exceed a consumer's registers)"
         : !fa3_bwd_bm_ok(BM)
             ? "BLOCK_M must be 64, 80, 96 or 128 (a wgmma N of the score products; 80, 96: dQ computed transposed)"
         : !fa3_bwd_consumers_ok(CONSUMERS)    ? "CONSUMERS must be 1, 2 or 3 warpgroups (BLOCK_N = 64 x CONSUMERS)"
         : !fa3_bwd_stages_ok(STAGES)          ? "STAGES must be 1 or 2 (Q/dO slots; 3 measured no faster)"
         : !fa3_bwd_sched_ok(SCHED)            ? "SCHED must be 0, 1, 2 or 3"
         : !fa3_bwd_switch_ok(DQ_OVERLAP)      ? "DQ_OVERLAP must be 0 or 1"
         : !fa3_bwd_switch_ok(DQ_TURNS)        ? "DQ_TURNS must be 0 or 1"
         : !fa3_bwd_deterministic_value_ok(DETERMINISTIC) ? "DETERMINISTIC must be 0, 1 or 2"
         : !fa3_bwd_dq_stages_ok(DQ_STAGES)    ? "DQ_STAGES must be 0, 1 or 2 (dQ staging tiles; 0: added from registers)"
         : !fa3_bwd_direct_ok(DQ_STAGES, DETERMINISTIC)
             ? "DETERMINISTIC needs DQ_STAGES 1 or 2 (dQ added from registers lands in no fixed order)"
         : !fa3_bwd_turns_ok(CONSUMERS, DQ_TURNS) ? "DQ_TURNS needs two consumer warpgroups"
         : !fa3_bwd_deterministic_ok(SCHED, DETERMINISTIC)
             ? "DETERMINISTIC 1 needs SCHED 0 or 1 (SCHED 2's rotated walks serialize the ordered dQ additions)"
         : !fa3_wgmma_regs_ok(CONSUMERS, 1)         ? "the register budgets exceed the launch allocation"
         : !fa3_bwd_acc_ok(D, BM, CONSUMERS)
             ? "accumulators (dK, dV D + S^T, dP^T BLOCK_M) exceed the consumer register budget - 48 (- 32 with dQ^T)"
         : !fa3_bwd_dq_ok(D, BM, CONSUMERS, DQ_TURNS)
             ? "the dQ pieces (m64 row tiles x column pieces over the consumers) must be whole swizzle groups (dQ^T, "
               "BLOCK_M 80 or 96: d a multiple of 64 and each consumer whole row tiles)"
         : !fa3_bwd_overlap_ok(D, BM, CONSUMERS, DQ_OVERLAP, DQ_TURNS)
             ? "DQ_OVERLAP 1 needs a consumer's dQ piece to be one wgmma chain (64 or 32 columns of one row tile)"
         : !fa3_bwd_smem_ok(D, BM, CONSUMERS, STAGES, DQ_STAGES) ? "shared memory exceeds sm_90's 232448 bytes per block"
                                                      : nullptr;
}

template <int D, int BLOCK_M, int CONSUMERS, int STAGES, int SCHED, int DQ_OVERLAP, int DQ_TURNS, int DETERMINISTIC,
          int DQ_STAGES, int DTYPE, bool CAUSAL>
struct Fa3WgmmaBwdTraits {
  static_assert(fa3_bwd_check(D, BLOCK_M, CONSUMERS, STAGES, SCHED, DQ_OVERLAP, DQ_TURNS, DETERMINISTIC, DQ_STAGES) ==
                    nullptr,
                "invalid Fa3WgmmaBwdTraits: see fa3_bwd_check");
  static_assert(fa3_bwd_dtype_ok(DTYPE), "DTYPE must be 0 (fp16) or 1 (bf16)");

  static constexpr int kHeadDim = D;
  static constexpr int kBlockM = BLOCK_M;
  static constexpr int kConsumers = CONSUMERS;
  static constexpr int kBlockN = fa3_bwd_block_n(CONSUMERS);
  static constexpr int kStages = STAGES;
  static constexpr bool kRotate = SCHED == 2;
  static constexpr bool kPairGroups = SCHED == 1 || SCHED == 3;  // pairs first, in groups (1: one group)
  static constexpr bool kDqOverlap = DQ_OVERLAP == 1;
  static constexpr bool kDqTurns = DQ_TURNS == 1;
  static constexpr bool kDeterministic = DETERMINISTIC >= 1;
  static constexpr int kDeterministicOrder = DETERMINISTIC;    // bwd_dq_turn
  static constexpr bool kDescending = DETERMINISTIC == 2;      // the grid from the last key block down
  static constexpr int kDqStages = DQ_STAGES;
  static constexpr bool kDqDirect = DQ_STAGES == 0;  // dQ added from registers: no staging tile, no writer warp
  static constexpr int kDtype = DTYPE;
  static constexpr bool kCausal = CAUSAL;

  static constexpr int kThreads = fa3_wgmma_threads(CONSUMERS);
  static constexpr int kConsumerThreads = 128 * CONSUMERS;
  static constexpr int kProducerRegs = fa3_wgmma_producer_regs(CONSUMERS);
  static constexpr int kConsumerRegs = fa3_wgmma_consumer_regs(CONSUMERS);
  static constexpr int kSwizzle = fa3_wgmma_swizzle_bytes(D);
  static constexpr int kGroupCols = fa3_wgmma_group_cols(D);
  static constexpr int kGroups = D / kGroupCols;
  static constexpr int kQBytes = fa3_wgmma_tile_bytes(D, BLOCK_M);       // one Q or dO slot
  static constexpr int kKvBytes = fa3_wgmma_tile_bytes(D, kBlockN);      // K or V
  static constexpr int kDsBytes = 2 * kBlockN * BLOCK_M;               // one dS^T tile
  static constexpr int kDqBytes = 4 * BLOCK_M * D;                     // the dQ staging tile
  static constexpr int kStatBytes = 4 * BLOCK_M;                       // lse or delta of one block
  static constexpr bool kDqTransposed = fa3_bwd_dq_transposed(BLOCK_M);  // the tile is dQ^T (D x BM)
  static constexpr int kDqRowTiles = fa3_bwd_dq_row_tiles(D, BLOCK_M);
  static constexpr int kDqTileCols = fa3_bwd_dq_tile_cols(D, BLOCK_M);
  static constexpr int kDqColPieces = fa3_bwd_dq_col_pieces(D, BLOCK_M, CONSUMERS, DQ_TURNS);
  static constexpr int kDqCols = fa3_bwd_dq_cols(D, BLOCK_M, CONSUMERS, DQ_TURNS);
  static constexpr int kDqChunk = fa3_bwd_dq_chunk(D, BLOCK_M, CONSUMERS, DQ_TURNS);
  // A step's lse2 and delta held in registers from before the score GEMMs' wait (fa3_bwd_detail::StepStats):
  // at BLOCK_M 64, except with one consumer at d 128, where ptxas (through NVRTC) spills 4 bytes causal and the
  // family's default config must compile everywhere; at 128 the 64 registers spill beside the scores.
  static constexpr bool kStatsHeld = BLOCK_M <= 64 && !(CONSUMERS == 1 && D == 128);
  // The staging tile's pieces: one per consumer warpgroup (FlashAttention-3's per-warpgroup dQ), one under DQ_TURNS;
  // each staged by one warpgroup, added by its own bulk reduce and freed apart.
  static constexpr int kDqPieces = DQ_TURNS ? 1 : CONSUMERS;
  static constexpr int kDqPieceBytes = kDqBytes / kDqPieces;
  static constexpr int kSmemBytes = fa3_bwd_smem_bytes(D, BLOCK_M, CONSUMERS, STAGES, DQ_STAGES);
};

}  // namespace flashtune
