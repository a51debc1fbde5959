// Tunables, derived constants and launch geometry of decode_splitkv (split-KV forward for decoding:
// a few query rows per head against a long K/V cache, fp16 or bf16, grouped-query attention native).
// Host-usable: plain constexpr C++, no device code. The kernels derive everything from these functions.
//
// Two kernels (decode_splitkv.cuh):
//   decode_splitkv_partial   grid {SPLITS * row tiles, Hk, B}: one CTA per (key split, 16-row tile of the
//                            kv head's group rows, kv head, batch); writes the split's normalised O and LSE
//                            (fp32) into the workspace, or, when SPLITS = 1, the final O and LSE.
//   decode_splitkv_combine   grid {ceil(H*Sq / 4), 1, B}, 4 warps: a warp per (batch, query head, query row)
//                            merges the splits. Not launched when SPLITS = 1.
#pragma once
#include "fa2_mma_traits.h"
#include "traits_common.h"

namespace flashtune {

// Query rows per partial CTA: one m16n8k16 row tile. The rows of a kv head's group are its g query heads'
// Sq rows each, contiguous in Q, O and LSE (heads h*g .. h*g+g-1 are adjacent): group row r is query head
// kv_head*g + r / Sq, query row r % Sq. A group of more than 16 rows takes several row tiles (CTAs).
constexpr int kDecodeRows = 16;
FT_HD constexpr int decode_splitkv_row_tiles(int group_rows) { return ceil_div(group_rows, kDecodeRows); }

FT_HD constexpr int decode_splitkv_threads(int WARPS) { return 32 * WARPS; }
// Warp w computes keys [w*KW, (w+1)*KW) of every BLOCK_N-key block for all 16 rows (a split-K inside the CTA,
// merged once at the end): the rows are too few to split among warps.
FT_HD constexpr int decode_splitkv_keys_per_warp(int BN, int WARPS) { return BN / WARPS; }

// Split s owns keys [decode_splitkv_key_begin(s), min(Sk, decode_splitkv_key_begin(s + 1))): blocks
// [s*nb/SPLITS, (s+1)*nb/SPLITS) of the nb = ceil(Sk/BN) blocks, so splits differ by one block at most and
// only the last block of the last split can be ragged (SPLITS > nb: some splits own none). Even splits are
// what lets a SPLITS that does not divide nb fill the SMs' last wave (docs/kernels.md, decode_splitkv).
FT_HD constexpr int decode_splitkv_key_begin(int seq_k, int SPLITS, int BN, int split) {
  return static_cast<int>(static_cast<long long>(split) * ceil_div(seq_k, BN) / SPLITS) * BN;
}

// Shared memory (dynamic), fa2_mma's 16-bit tile layout in its XOR-swizzled form at every D (rows of 2*D bytes):
//   Qs[16] rows | STAGES x { Ks[BN], Vs[BN] } rows, reused after the loop as the warps'
//   fp32 O tiles Obuf[WARPS][16][D+8] (the 8-float pad makes the fragment stores conflict-free) | m, l [WARPS][16].
// Swizzled, not padded as fa2_mma keeps D <= 128: a padded row (2*D + 16 bytes) starts 16 bytes off a 32-byte
// boundary every other row, and a 16-byte cp.async whose shared-memory side does not keep the global side's
// 32-byte alignment is split by the L1 so that the sector it straddles is fetched from L2 twice. Measured on the
// H100 (Nsight Compute, B 64, Hk 8, Sk 32k, d 128, SPLITS 4, BLOCK_N 256): 1.5x the L2 read sectors of the
// bytes read (182M hits besides the 269M that went to DRAM), 2.6x the requests, and 2.97 TB/s where the same
// copies into unpadded tiles streamed 3.13 (experiments/probes/stream_read.cu).
FT_HD constexpr bool decode_splitkv_swizzled(int) { return true; }
FT_HD constexpr int decode_splitkv_row_bytes(int D) { return 2 * D; }
FT_HD constexpr int decode_splitkv_q_bytes(int D) { return decode_splitkv_row_bytes(D) * kDecodeRows; }
FT_HD constexpr int decode_splitkv_kv_bytes(int D, int BN, int STAGES) { return decode_splitkv_row_bytes(D) * 2 * STAGES * BN; }
FT_HD constexpr int decode_splitkv_merge_stride(int D) { return D + 8; }  // floats per Obuf row
FT_HD constexpr int decode_splitkv_merge_bytes(int D, int WARPS) {
  return 4 * WARPS * kDecodeRows * decode_splitkv_merge_stride(D);
}
FT_HD constexpr int decode_splitkv_stats_bytes(int WARPS) { return 2 * 4 * WARPS * kDecodeRows; }
FT_HD constexpr int decode_splitkv_smem_bytes(int D, int BN, int WARPS, int STAGES) {
  return decode_splitkv_q_bytes(D) +
         (decode_splitkv_kv_bytes(D, BN, STAGES) > decode_splitkv_merge_bytes(D, WARPS)
              ? decode_splitkv_kv_bytes(D, BN, STAGES)
              : decode_splitkv_merge_bytes(D, WARPS)) +
         decode_splitkv_stats_bytes(WARPS);
}

// Grids. heads_k as in AttnFwdParams (0: heads).
FT_HD constexpr GridDims decode_splitkv_partial_grid(int batch, int heads, int heads_k, int seq_q, int SPLITS) {
  return GridDims{SPLITS * decode_splitkv_row_tiles((heads_k > 0 ? heads / heads_k : 1) * seq_q),
                  heads_k > 0 ? heads_k : heads, batch};
}
constexpr int kDecodeCombineWarps = 4;  // one (batch, head, row) per warp
FT_HD constexpr int decode_splitkv_combine_threads() { return 32 * kDecodeCombineWarps; }
FT_HD constexpr GridDims decode_splitkv_combine_grid(int batch, int heads, int seq_q) {
  return GridDims{ceil_div(heads * seq_q, kDecodeCombineWarps), 1, batch};
}
// Workspace, fp32: O_s as [SPLITS][B*H*Sq][D], then LSE_s as [B*H*Sq][SPLITS] (a row's splits adjacent for
// the combine). None when SPLITS = 1 (the partial kernel writes O and LSE itself). The host computes the
// byte count in 64 bits from the same terms (tuner/family.cpp).

// fp32 accumulator registers per thread: O (D/8 n8 tiles x 4) + S (KW/8 x 4), at most fa2_mma's 192 (no
// variant of the domain exceeds it: d = 256 with 128 keys per warp is 192; the guard is for the domain's
// future). Q is not kept in registers
// (its D/4 fragment registers would cost a CTA per SM at d = 128; decoding leaves shared-memory bandwidth
// idle, so every block re-reads Q's fragments by ldmatrix).
FT_HD constexpr int decode_splitkv_acc_regs(int D, int BN, int WARPS) {
  return (D + decode_splitkv_keys_per_warp(BN, WARPS)) / 2;
}

// Individual validity conditions (shared by decode_splitkv_check and the traits' static_asserts).
FT_HD constexpr bool decode_splitkv_d_ok(int D) { return D == 64 || D == 128 || D == 256; }
FT_HD constexpr bool decode_splitkv_splits_ok(int SPLITS) { return SPLITS >= 1 && SPLITS <= 128; }
FT_HD constexpr bool decode_splitkv_warps_ok(int WARPS) { return WARPS == 2 || WARPS == 4 || WARPS == 8; }
FT_HD constexpr bool decode_splitkv_bn_ok(int BN, int WARPS) {
  return BN >= 16 && BN <= 256 && BN % (16 * WARPS) == 0;
}
// STAGES 3, 4: a ring of that many slots, STAGES - 1 blocks in flight (the H200 reads HBM at 4.8 TB/s: more bytes in
// flight per SM than the H100 needed at 3.35).
FT_HD constexpr bool decode_splitkv_stages_ok(int STAGES) { return STAGES >= 1 && STAGES <= 4; }
FT_HD constexpr bool decode_splitkv_acc_ok(int D, int BN, int WARPS) {
  return decode_splitkv_acc_regs(D, BN, WARPS) <= kFa2MmaMaxAccRegs;
}
FT_HD constexpr bool decode_splitkv_dtype_ok(int DTYPE) { return DTYPE == 0 || DTYPE == 1; }

// nullptr if the combination is valid, else the reason. The device's shared-memory limit is not applied
// here (the host prunes per arch with decode_splitkv_smem_bytes). No condition on the problem: any Sq, any
// group size (more row tiles), any Sk (empty splits write empty results).
FT_HD constexpr const char* decode_splitkv_check(int D, int SPLITS, int BN, int WARPS, int STAGES) {
  return !decode_splitkv_d_ok(D)                 ? "D must be 64, 128 or 256"
         : !decode_splitkv_splits_ok(SPLITS)     ? "SPLITS must be in 1..128"
         : !decode_splitkv_warps_ok(WARPS)       ? "WARPS must be 2, 4 or 8"
         : !decode_splitkv_bn_ok(BN, WARPS)      ? "BLOCK_N must be a multiple of 16*WARPS in 16..256 (16 keys per warp and block at least)"
         : !decode_splitkv_stages_ok(STAGES)     ? "STAGES must be 1, 2, 3 or 4"
         : !decode_splitkv_acc_ok(D, BN, WARPS)  ? "(D + BLOCK_N/WARPS)/2 fp32 accumulators too many (> 192)"
                                                 : nullptr;
}

// The paged form (decode_splitkv_partial<Traits, true>): a block of BLOCK_N keys is read from one page, so
// BLOCK_N must divide the page size (the kernel traps otherwise). Why not any page size: inside one page a
// block's rows are d elements apart, which is what lets the loader's per-chunk offsets be immediates of its
// cp.async instructions (one base register a tile: the property that kept the dense loop from spilling);
// a block across pages would need a base per page-run of rows. Pages are multiples of 16 keys
// (Problem's check), so BLOCK_N 32 serves any page of 32 or more; a 16-key page (vLLM's default) has no
// BLOCK_N here. nullptr when the config can read this page size, else the reason.
FT_HD constexpr const char* decode_splitkv_paged_check(int BN, int page_size) {
  return page_size % BN == 0 ? nullptr : "BLOCK_N must divide the page size (a block of keys is read from one page)";
}

// DTYPE: 0 = fp16, 1 = bf16 (q, k, v, o); lse and the workspace fp32; fp32 accumulation.
// The member names the per-warp tile helpers of fa2_mma.cuh read (kMTiles, kSTiles, ...) are those of a
// fa2_mma warp with 16 rows (one m-tile) and KW keys per block.
template <int D, int SPLITS, int BLOCK_N, int WARPS, int STAGES, int DTYPE, bool CAUSAL>
struct DecodeSplitkvTraits {
  static_assert(decode_splitkv_d_ok(D), "D must be 64, 128 or 256");
  static_assert(decode_splitkv_splits_ok(SPLITS), "SPLITS must be in 1..128");
  static_assert(decode_splitkv_warps_ok(WARPS), "WARPS must be 2, 4 or 8");
  static_assert(decode_splitkv_bn_ok(BLOCK_N, WARPS),
                "BLOCK_N must be a multiple of 16*WARPS in 16..256 (16 keys per warp and block at least)");
  static_assert(decode_splitkv_stages_ok(STAGES), "STAGES must be 1, 2, 3 or 4");
  static_assert(decode_splitkv_acc_ok(D, BLOCK_N, WARPS), "(D + BLOCK_N/WARPS)/2 fp32 accumulators too many (> 192)");
  static_assert(decode_splitkv_dtype_ok(DTYPE), "DTYPE must be 0 (fp16) or 1 (bf16)");
  static_assert(decode_splitkv_check(D, SPLITS, BLOCK_N, WARPS, STAGES) == nullptr, "invalid DecodeSplitkvTraits");

  static constexpr int kHeadDim = D;
  static constexpr int kSplits = SPLITS;
  static constexpr int kBlockN = BLOCK_N;
  static constexpr int kWarps = WARPS;
  static constexpr int kStages = STAGES;
  static constexpr int kDtype = DTYPE;
  static constexpr bool kCausal = CAUSAL;

  static constexpr int kRows = kDecodeRows;
  static constexpr int kThreads = decode_splitkv_threads(WARPS);
  static constexpr int kKeysPerWarp = decode_splitkv_keys_per_warp(BLOCK_N, WARPS);
  // For fa2_mma_detail::gemm_qk / online_softmax / gemm_pv (one warp's tiles):
  static constexpr int kMTiles = 1;                   // 16 rows
  static constexpr int kSTiles = kKeysPerWarp / 8;    // n8 tiles of S
  static constexpr int kOTiles = D / 8;               // n8 tiles of O
  static constexpr int kQkSlices = D / 16;            // k16 steps of S = Q K^T
  static constexpr int kPvSlices = kKeysPerWarp / 16; // k16 steps of O += P V
  static constexpr bool kQInRegs = false;  // Q's fragments by ldmatrix from Qs every block
  static constexpr bool kSwizzled = decode_splitkv_swizzled(D);
  static constexpr int kRowBytes = decode_splitkv_row_bytes(D);  // smem row stride of the 16-bit tiles
  static constexpr int kQBytes = decode_splitkv_q_bytes(D);
  static constexpr int kTileBytes = kRowBytes * BLOCK_N;  // one K or V tile
  static constexpr int kKvBytes = decode_splitkv_kv_bytes(D, BLOCK_N, STAGES);
  static constexpr int kMergeStride = decode_splitkv_merge_stride(D);
  static constexpr int kMergeBytes = decode_splitkv_merge_bytes(D, WARPS);
  static constexpr int kStatsOffset = kQBytes + (kKvBytes > kMergeBytes ? kKvBytes : kMergeBytes);
  static constexpr int kSmemBytes = decode_splitkv_smem_bytes(D, BLOCK_N, WARPS, STAGES);
  static_assert(kStatsOffset + decode_splitkv_stats_bytes(WARPS) == kSmemBytes, "shared-memory layout");
};

}  // namespace flashtune
