// Tunables, derived constants and launch geometry of the fa3_wgmma family: FlashAttention-3's forward
// design on Hopper (sm_90a), fp16 or bf16 in and out, fp32 accumulation and softmax, fp32 LSE.
//   fa3_wgmma_fwd<Fa3WgmmaTraits<D, BLOCK_N, CONSUMERS, STAGES, OVERLAP, PINGPONG, P_SMEM, PERSISTENT,
//                                TWO_CTAS, MULTICAST, DTYPE, CAUSAL>>
// One CTA per query block of BLOCK_M = 64 x CONSUMERS rows: a producer warpgroup (one thread issues
// TMA copies of Q once and of K, V blocks into a ring of STAGES slots, mbarrier-tracked) and CONSUMERS
// warpgroups of 64 query rows each (wgmma for S = Q K^T from shared memory and O += P V with P from
// registers or, P_SMEM 1, from shared memory). Register reallocation gives the producer kProducerRegs, each consumer kConsumerRegs.
//   OVERLAP 1: a consumer issues S(n+1) = Q K(n+1)^T and O += P(n) V(n) together and runs the softmax
//              of block n+1 while the tensor cores work (FlashAttention-3's intra-warpgroup overlap).
//   PINGPONG 1: consumers take turns issuing their GEMMs (named barriers), so that one warpgroup's
//              softmax runs during the other's GEMMs (needs OVERLAP 1 and 2 or 3 consumers).
//   P_SMEM 1:   P is staged in shared memory (a 64 x BLOCK_N tile per consumer) and P V is an SS wgmma:
//              no registers of the softmax are read by a GEMM in flight (FlashAttention-3's SS configs).
//   PERSISTENT 1: one CTA per SM loops over the (query block, head, batch) tiles, its K/V ring running on
//              from one tile into the next (FlashAttention-3's persistent tile scheduler); causal: the
//              tiles with the most visible keys first.
//   TWO_CTAS 1: two CTAs share an SM (half the register file each: budgets 24 / 232 at one consumer),
//              so one CTA's prologue (Q load, first S), diagonal tile and epilogue (O store) run while the
//              other computes: what short (causal, S 1k) tiles lose at one CTA per SM. (A switch, 0 the
//              default, so that tables emitted before it, zero-filled, keep meaning one CTA per SM.)
//   MULTICAST 1: clusters of two CTAs on neighbouring query blocks of one (head, batch) share each K and V
//              block: each CTA's producer copies half of the block's rows into both CTAs' shared memory
//              (TMA multicast), halving the L2 reads of K and V; a slot is refilled once both CTAs' consumers
//              released it. Non-causal (the two blocks read the same keys), plain grid (PERSISTENT 0),
//              dense batches; the grid's query blocks rounded up to even (the spare one stores nothing).
// Host-usable: plain constexpr C++.
#pragma once
#include "traits_common.h"

namespace flashtune {

// Swizzle of the shared-memory tiles (and the TMA boxes): 128-byte rows (64 columns) when the head
// dim is a multiple of 64, else 64-byte rows (32 columns: d = 32, 96).
FT_HD constexpr int fa3_wgmma_swizzle_bytes(int D) { return D % 64 == 0 ? 128 : 64; }
FT_HD constexpr int fa3_wgmma_group_cols(int D) { return fa3_wgmma_swizzle_bytes(D) / 2; }
FT_HD constexpr int fa3_wgmma_block_m(int CONSUMERS) { return 64 * CONSUMERS; }
FT_HD constexpr int fa3_wgmma_threads(int CONSUMERS) { return 128 * (CONSUMERS + 1); }
// CTAs per cluster, and the rows of a K or V block each CTA copies (the TMA box of the K and V maps).
FT_HD constexpr int fa3_wgmma_cluster(int MULTICAST) { return 1 + MULTICAST; }
FT_HD constexpr int fa3_wgmma_kv_box_rows(int BN, int MULTICAST) { return BN / fa3_wgmma_cluster(MULTICAST); }
// Below, `ctas` is the CTAs an SM holds: 1 + TWO_CTAS.
// Registers per thread at launch with `ctas` CTAs on an SM (__launch_bounds__(threads, ctas)):
// the register file (65536) split among the CTAs' threads, a multiple of 8, at most 248 (ptxas' limit 255).
FT_HD constexpr int fa3_wgmma_launch_regs(int CONSUMERS, int ctas) {
  const int r = 65536 / (ctas * fa3_wgmma_threads(CONSUMERS)) / 8 * 8;
  return r < 248 ? r : 248;
}
// setmaxnreg budgets, multiples of 8. setmaxnreg only moves registers between a CTA's warpgroups, and
// setmaxnreg.inc waits for free ones, so the budgets must add up to at most the launch allocation (more: the
// consumers wait forever). Producer 24, or 32 beside three consumers and with MULTICAST (its multicast copies
// spilled at 24); each consumer what is left, at most 240: FlashAttention-3's 24/240 at one and two
// consumers, 32/160 at three; MULTICAST at two consumers 32/232. Two CTAs per SM: 232 at one consumer, 104 at
// two.
FT_HD constexpr int fa3_wgmma_producer_regs(int CONSUMERS, int ctas = 1, int MULTICAST = 0) {
  return ctas == 1 && (CONSUMERS == 3 || MULTICAST) ? 32 : 24;
}
FT_HD constexpr int fa3_wgmma_consumer_regs(int CONSUMERS, int ctas = 1, int MULTICAST = 0) {
  const int left = (fa3_wgmma_launch_regs(CONSUMERS, ctas) * (CONSUMERS + 1) -
                    fa3_wgmma_producer_regs(CONSUMERS, ctas, MULTICAST)) /
                   CONSUMERS / 8 * 8;
  return left < 240 ? left : 240;
}
// fp32 accumulators a consumer thread holds at once: O (D/2), S (BN/2), and with OVERLAP the packed P
// of the previous block (BN/4, in registers unless P_SMEM) while the next S is computed.
FT_HD constexpr int fa3_wgmma_acc_regs(int D, int BN, int OVERLAP, int P_SMEM) {
  return D / 2 + BN / 2 + (OVERLAP && !P_SMEM ? BN / 4 : 0);
}

// Shared memory: Q [BM][D], STAGES x (K [BN][D], V [BN][D]), all 16-bit and swizzled, 1024-byte
// aligned (the base is aligned at run time: + 1024 bytes of slack); P_SMEM: CONSUMERS x P [64][BN]
// (16-bit, interleaved core matrices); then the mbarriers: q_full, STAGES x (k_full, v_full,
// k_empty, v_empty), and with PERSISTENT q_empty (Q's slot free for the next tile). The epilogue stages O
// in Q's slot, or (fa3_wgmma_separate_o) in an O tile [BM][D] between P and the mbarriers.
FT_HD constexpr int fa3_wgmma_tile_bytes(int D, int rows) { return 2 * rows * D; }
FT_HD constexpr int fa3_wgmma_barrier_bytes(int STAGES, int PERSISTENT) { return 8 * (1 + 4 * STAGES + PERSISTENT); }
FT_HD constexpr int fa3_wgmma_p_bytes(int BN, int CONSUMERS, int P_SMEM) { return P_SMEM ? CONSUMERS * 2 * 64 * BN : 0; }
// Dynamic shared memory one of `ctas` co-resident CTAs may take: the SM's 233472 bytes (228 KB, H100
// and H200) less 1024 reserved per CTA, split evenly; one CTA: 232448, sm_90's per-block limit.
FT_HD constexpr int fa3_wgmma_smem_per_cta(int ctas) { return 233472 / ctas - 1024; }
FT_HD constexpr int fa3_wgmma_smem_shared_o(int D, int BN, int CONSUMERS, int STAGES, int P_SMEM, int PERSISTENT) {
  return 1024 + fa3_wgmma_tile_bytes(D, fa3_wgmma_block_m(CONSUMERS)) + 2 * STAGES * fa3_wgmma_tile_bytes(D, BN) +
         fa3_wgmma_p_bytes(BN, CONSUMERS, P_SMEM) + fa3_wgmma_barrier_bytes(STAGES, PERSISTENT);
}
// PERSISTENT: O is staged in a tile of its own where that fits (`ctas` CTAs per SM), so that the next
// tile's Q loads while this tile's last P V GEMM, its epilogue and its O store run; else, and always with
// the plain grid (one tile per CTA), in Q's slot.
FT_HD constexpr bool fa3_wgmma_separate_o(int D, int BN, int CONSUMERS, int STAGES, int P_SMEM, int PERSISTENT,
                                          int ctas = 1) {
  return PERSISTENT && fa3_wgmma_smem_shared_o(D, BN, CONSUMERS, STAGES, P_SMEM, PERSISTENT) +
                               fa3_wgmma_tile_bytes(D, fa3_wgmma_block_m(CONSUMERS)) <=
                           fa3_wgmma_smem_per_cta(ctas);
}
FT_HD constexpr int fa3_wgmma_smem_bytes(int D, int BN, int CONSUMERS, int STAGES, int P_SMEM, int PERSISTENT,
                                         int ctas = 1) {
  return fa3_wgmma_smem_shared_o(D, BN, CONSUMERS, STAGES, P_SMEM, PERSISTENT) +
         (fa3_wgmma_separate_o(D, BN, CONSUMERS, STAGES, P_SMEM, PERSISTENT, ctas)
              ? fa3_wgmma_tile_bytes(D, fa3_wgmma_block_m(CONSUMERS))
              : 0);
}
// Tiles: (query block, head, batch), BLOCK_M query rows each.
FT_HD constexpr int fa3_wgmma_tiles(int batch, int heads, int seq_q, int CONSUMERS) {
  return ceil_div(seq_q, fa3_wgmma_block_m(CONSUMERS)) * heads * batch;
}
// Registers a CTA's budgets add up to (the launch allocation must cover them: fa3_wgmma_regs_ok): 128 x
// (producer + CONSUMERS x consumer budget) = 33792, 64512, 65536 for 1, 2, 3 consumers at one CTA per SM
// (more than half of an SM's registers: one CTA per SM); 32768, 29696 at two (half or less).
FT_HD constexpr int fa3_wgmma_cta_regs(int CONSUMERS, int ctas = 1, int MULTICAST = 0) {
  return 128 * (fa3_wgmma_producer_regs(CONSUMERS, ctas, MULTICAST) +
                CONSUMERS * fa3_wgmma_consumer_regs(CONSUMERS, ctas, MULTICAST));
}
// CTAs an SM holds at once by registers: what the persistent grid is sized by (fa3_wgmma_grid).
FT_HD constexpr int fa3_wgmma_ctas_by_regs(int CONSUMERS, int ctas, int MULTICAST = 0) {
  return 65536 / fa3_wgmma_cta_regs(CONSUMERS, ctas, MULTICAST);
}
// PERSISTENT's tile order: linear tile t of qblocks x heads x batch -> its coordinates. Causal: the (head,
// batch) pairs in sections of `group` (0: all of them), the last section possibly narrower; within a section
// the query block is the slowest index and reversed, so the tiles with the most visible keys go first
// (longest first: a section's last wave holds its short tiles). fa3_wgmma_causal_group sizes the sections
// so that their K and V stay in L2: with one section over every pair, a pair's 8 query blocks (S 1k) ran
// 8 sections of 132 other pairs apart, and its K and V came from HBM each time (the persistent causal
// kernel ran at 0.82x the plain grid's speed, d 64 S 1k). Otherwise the query block is the fastest, as the
// plain grid is rasterised: the tiles in flight together share K and V.
struct Fa3Tile {
  int qblock, head, batch;
};
FT_HD constexpr Fa3Tile fa3_wgmma_tile(int t, int qblocks, int heads, int batch, bool causal, int group = 0) {
  if (causal) {
    const int pairs = heads * batch, g = group > 0 && group < pairs ? group : pairs;
    const int first = t / (g * qblocks) * g;  // the section's first pair
    const int width = pairs - first < g ? pairs - first : g;
    const int r = t - first * qblocks;  // the tile within its section
    const int bh = first + r % width;
    return Fa3Tile{qblocks - 1 - r / width, bh % heads, bh / heads};
  }
  const int bh = t / qblocks;
  return Fa3Tile{t % qblocks, bh % heads, bh / heads};
}
// (head, batch) pairs per causal section: as many as have their K and V (16-bit, seq_k x D each) within
// 16 MiB, a third of the H100's and H200's 50 MB L2 (the rest holds Q and O in flight), but no fewer than
// the grid's `ctas` (narrower sections left the CTAs of a wave on a few pairs' tiles of every length: d 256
// S 16k, one pair per section, ran at 0.72x one section), at most `pairs`.
FT_HD constexpr int fa3_wgmma_causal_group(int seq_k, int D, int pairs, int ctas) {
  const long long per_pair = 4LL * (seq_k > 0 ? seq_k : 1) * D;
  const long long fit = (16LL << 20) / per_pair, g = fit > ctas ? fit : ctas;
  return g < 1 ? 1 : g > pairs ? pairs : static_cast<int>(g);
}
// PERSISTENT 0, or the SM count unknown (sm_count 0): one CTA per tile, x = query blocks (MULTICAST: rounded
// up to whole clusters), y = heads, z = batch. PERSISTENT 1: min(tiles, (1 + TWO_CTAS) x sm_count) CTAs along
// x, CTA x computing tiles x, x + gridDim.x, ...
FT_HD constexpr GridDims fa3_wgmma_grid(int batch, int heads, int seq_q, int CONSUMERS, int PERSISTENT, int sm_count,
                                        int TWO_CTAS = 0, int MULTICAST = 0) {
  const int tiles = fa3_wgmma_tiles(batch, heads, seq_q, CONSUMERS), ctas = (1 + TWO_CTAS) * sm_count;
  const int cluster = fa3_wgmma_cluster(MULTICAST);
  return PERSISTENT && sm_count > 0
             ? GridDims{tiles < ctas ? tiles : ctas, 1, 1}
             : GridDims{ceil_div(ceil_div(seq_q, fa3_wgmma_block_m(CONSUMERS)), cluster) * cluster, heads, batch};
}

// ---- validity (shared by fa3_wgmma_check and the traits' static_asserts) ----
FT_HD constexpr bool fa3_wgmma_d_ok(int D) { return D == 32 || D == 64 || D == 96 || D == 128 || D == 192 || D == 256; }
FT_HD constexpr bool fa3_wgmma_bn_ok(int BN) { return BN >= 64 && BN <= 256 && BN % 16 == 0; }
FT_HD constexpr bool fa3_wgmma_consumers_ok(int CONSUMERS) { return CONSUMERS >= 1 && CONSUMERS <= 3; }
FT_HD constexpr bool fa3_wgmma_stages_ok(int STAGES) { return STAGES == 2 || STAGES == 3; }
FT_HD constexpr bool fa3_wgmma_switch_ok(int x) { return x == 0 || x == 1; }
// The budgets within the launch allocation, and `ctas` CTAs on an SM by registers.
FT_HD constexpr bool fa3_wgmma_regs_ok(int CONSUMERS, int ctas, int MULTICAST = 0) {
  return fa3_wgmma_cta_regs(CONSUMERS, ctas, MULTICAST) <=
             fa3_wgmma_launch_regs(CONSUMERS, ctas) * fa3_wgmma_threads(CONSUMERS) &&
         fa3_wgmma_ctas_by_regs(CONSUMERS, ctas, MULTICAST) == ctas;
}
FT_HD constexpr bool fa3_wgmma_smem_ok(int D, int BN, int CONSUMERS, int STAGES, int P_SMEM, int PERSISTENT, int ctas) {
  return ctas == 1 ||
         fa3_wgmma_smem_bytes(D, BN, CONSUMERS, STAGES, P_SMEM, PERSISTENT, ctas) <= fa3_wgmma_smem_per_cta(ctas);
}
FT_HD constexpr bool fa3_wgmma_pingpong_ok(int CONSUMERS, int OVERLAP, int PINGPONG) {
  return PINGPONG == 0 || (OVERLAP == 1 && CONSUMERS >= 2);
}
// 32 registers of a consumer's budget kept for addresses, loop state, row statistics.
FT_HD constexpr bool fa3_wgmma_acc_ok(int D, int BN, int CONSUMERS, int OVERLAP, int P_SMEM, int ctas = 1,
                                      int MULTICAST = 0) {
  return fa3_wgmma_acc_regs(D, BN, OVERLAP, P_SMEM) <= fa3_wgmma_consumer_regs(CONSUMERS, ctas, MULTICAST) - 32;
}
FT_HD constexpr bool fa3_wgmma_dtype_ok(int DTYPE) { return DTYPE == 0 || DTYPE == 1; }

// MULTICAST's clusters tile the plain grid (a persistent CTA's tiles are not its neighbour's).
FT_HD constexpr bool fa3_wgmma_multicast_ok(int MULTICAST, int PERSISTENT) { return MULTICAST == 0 || PERSISTENT == 0; }

// nullptr if valid, else the reason. The per-block shared-memory limit is the compile stage's to apply;
// two CTAs per SM need each to fit half of the SM's. MULTICAST's further condition on the mask is
// fa3_wgmma_causal_check's.
FT_HD constexpr const char* fa3_wgmma_check(int D, int BN, int CONSUMERS, int STAGES, int OVERLAP, int PINGPONG,
                                            int P_SMEM, int PERSISTENT, int TWO_CTAS = 0, int MULTICAST = 0) {
  return !fa3_wgmma_d_ok(D)                 ? "D must be 32, 64, 96, 128, 192 or 256"
         : !fa3_wgmma_bn_ok(BN)             ? "BLOCK_N must be a multiple of 16 in 64..256 (a wgmma N)"
         : !fa3_wgmma_consumers_ok(CONSUMERS) ? "CONSUMERS must be 1, 2 or 3 warpgroups (BLOCK_M = 64 x CONSUMERS)"
         : !fa3_wgmma_stages_ok(STAGES)     ? "STAGES must be 2 or 3 (K/V slots)"
         : !fa3_wgmma_switch_ok(OVERLAP)    ? "OVERLAP must be 0 or 1"
         : !fa3_wgmma_switch_ok(PINGPONG)   ? "PINGPONG must be 0 or 1"
         : !fa3_wgmma_switch_ok(P_SMEM)     ? "P_SMEM must be 0 or 1"
         : !fa3_wgmma_switch_ok(PERSISTENT) ? "PERSISTENT must be 0 or 1"
         : !fa3_wgmma_switch_ok(TWO_CTAS)   ? "TWO_CTAS must be 0 or 1"
         : !fa3_wgmma_switch_ok(MULTICAST)  ? "MULTICAST must be 0 or 1"
         : !fa3_wgmma_multicast_ok(MULTICAST, PERSISTENT)
             ? "MULTICAST needs the plain grid (PERSISTENT 0): a cluster's two CTAs take neighbouring query blocks"
         : !fa3_wgmma_regs_ok(CONSUMERS, 1 + TWO_CTAS, MULTICAST)
             ? "the register budgets do not fit 1 + TWO_CTAS CTAs on an SM"
         : !fa3_wgmma_pingpong_ok(CONSUMERS, OVERLAP, PINGPONG)
             ? "PINGPONG needs OVERLAP 1 and 2 or 3 consumer warpgroups"
         : !fa3_wgmma_acc_ok(D, BN, CONSUMERS, OVERLAP, P_SMEM, 1 + TWO_CTAS, MULTICAST)
             ? "accumulators (O D/2 + S BN/2 + P BN/4 with OVERLAP in registers) exceed the consumer register budget - 32"
         : !fa3_wgmma_smem_ok(D, BN, CONSUMERS, STAGES, P_SMEM, PERSISTENT, 1 + TWO_CTAS)
             ? "shared memory exceeds half the SM's 233472 bytes less 1024 per CTA (TWO_CTAS)"
             : nullptr;
}
// Causal query blocks read different numbers of keys, so the two CTAs of a cluster would not share every block.
FT_HD constexpr const char* fa3_wgmma_causal_check(int MULTICAST, bool causal) {
  return MULTICAST && causal ? "MULTICAST is non-causal only (a cluster's two query blocks read different keys)"
                             : nullptr;
}

template <int D, int BLOCK_N, int CONSUMERS, int STAGES, int OVERLAP, int PINGPONG, int P_SMEM, int PERSISTENT,
          int TWO_CTAS, int MULTICAST, int DTYPE, bool CAUSAL>
struct Fa3WgmmaTraits {
  static_assert(fa3_wgmma_check(D, BLOCK_N, CONSUMERS, STAGES, OVERLAP, PINGPONG, P_SMEM, PERSISTENT, TWO_CTAS,
                                MULTICAST) == nullptr,
                "invalid Fa3WgmmaTraits: see fa3_wgmma_check");
  static_assert(fa3_wgmma_causal_check(MULTICAST, CAUSAL) == nullptr, "MULTICAST is non-causal only");
  static_assert(fa3_wgmma_dtype_ok(DTYPE), "DTYPE must be 0 (fp16) or 1 (bf16)");
  static_assert(fa3_wgmma_ctas_by_regs(CONSUMERS, 1 + TWO_CTAS, MULTICAST) == 1 + TWO_CTAS,
                "the persistent grid is sized (1 + TWO_CTAS) x SMs (fa3_wgmma_grid): the registers must hold that many");

  static constexpr int kHeadDim = D;
  static constexpr int kBlockN = BLOCK_N;
  static constexpr int kConsumers = CONSUMERS;
  static constexpr int kBlockM = fa3_wgmma_block_m(CONSUMERS);
  static constexpr int kStages = STAGES;
  static constexpr bool kOverlap = OVERLAP == 1;
  static constexpr bool kPingpong = PINGPONG == 1;
  static constexpr bool kPSmem = P_SMEM == 1;
  static constexpr bool kPersistent = PERSISTENT == 1;
  static constexpr int kCtasPerSm = 1 + TWO_CTAS;
  static constexpr bool kMulticast = MULTICAST == 1;
  static constexpr int kCluster = fa3_wgmma_cluster(MULTICAST);        // CTAs sharing each K/V block
  static constexpr int kKvBoxRows = fa3_wgmma_kv_box_rows(BLOCK_N, MULTICAST);  // rows of a block one CTA copies
  static constexpr int kDtype = DTYPE;
  static constexpr bool kCausal = CAUSAL;

  static constexpr int kThreads = fa3_wgmma_threads(CONSUMERS);
  static constexpr int kProducerRegs = fa3_wgmma_producer_regs(CONSUMERS, kCtasPerSm, MULTICAST);
  static constexpr int kConsumerRegs = fa3_wgmma_consumer_regs(CONSUMERS, kCtasPerSm, MULTICAST);
  static constexpr int kSwizzle = fa3_wgmma_swizzle_bytes(D);  // bytes per tile row
  static constexpr int kGroupCols = fa3_wgmma_group_cols(D);   // columns per swizzled column group
  static constexpr int kGroups = D / kGroupCols;
  static constexpr int kQBytes = fa3_wgmma_tile_bytes(D, kBlockM);
  static constexpr int kKvBytes = fa3_wgmma_tile_bytes(D, BLOCK_N);  // one K or V slot
  static constexpr int kPBytes = fa3_wgmma_p_bytes(BLOCK_N, 1, P_SMEM);  // one consumer's P tile
  static constexpr bool kSeparateO = fa3_wgmma_separate_o(D, BLOCK_N, CONSUMERS, STAGES, P_SMEM, PERSISTENT, kCtasPerSm);
  static constexpr int kOBytes = kSeparateO ? kQBytes : 0;
  static constexpr int kSmemBytes = fa3_wgmma_smem_bytes(D, BLOCK_N, CONSUMERS, STAGES, P_SMEM, PERSISTENT, kCtasPerSm);
  static constexpr int kSTiles = BLOCK_N / 8;  // n8 tiles of S per thread row pair
  static constexpr int kOTiles = D / 8;
};

}  // namespace flashtune
