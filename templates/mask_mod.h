// mask_mod (issue 32, part 3): a user's mask predicate, compiled into the kernels as a fourth score modification
// (docs/kernels.md, "mask_mod"). Plain C++ shared by the host (the tuner, the runtime, the tests' emulation) and the
// device (NVRTC, nvcc): the predicate's tensors, the block summary's lists, and the kernel's argument.
//
// The predicate is `struct MaskMod_<hash> { static bool test(const MaskModArgs&, int b, int h, int q_idx, int
// kv_idx); ... }`, generated on the host around the user's text (core/mask_mod.hpp) and written before the family's
// template in the program NVRTC compiles; a kernel takes it as AttnModTraits' fifth argument (traits_common.h).
#pragma once

#include "traits_common.h"

namespace flashtune {

// The named int32 tensors a predicate may read (`doc[q_idx]`), at most this many. (An enumerator: a namespace
// constant is emitted by NVRTC as a variable of every kernel's cubin, moving the plain kernels' .nv.info.)
enum : int { kMaxMaskTensors = 4 };

// One named tensor as the predicate sees it: element i, or 0 for an index outside [0, length) (one compare and a
// predicated load; a predicate's index past its tensor reads 0, never the memory after it).
struct MaskTensor {
  const int* data;
  int length;
  FT_HD int operator[](int i) const { return static_cast<unsigned>(i) < static_cast<unsigned>(length) ? data[i] : 0; }
};

// A block state of the summary (mask_mod.cuh's mask_mod_block_states): no visible pair, some, every one.
enum MaskBlockState : unsigned char { kMaskBlockEmpty = 0, kMaskBlockPartial = 1, kMaskBlockFull = 2 };

// The block summary as a kernel walks it (FlexAttention's BlockMask): for each list row (a (batch', head', row block)
// triple), the column blocks holding some visible pair, in increasing order, entry `(block << 1) | partial`, and their
// count. Forward: rows are query blocks (BLOCK_M), columns key blocks (BLOCK_N), head' the query head; backward: rows
// key blocks, columns query blocks, head' the kv head (the union over its group's query heads). batch' = b and head'
// = h where the predicate reads them (batch_stride, head_stride non-zero), else 0: one list for all.
struct MaskBlockList {
  const int* count;  // [rows'] entries of each list row
  const int* index;  // [rows'][cols] its entries
  int cols;          // column blocks: a list row's capacity, index's row stride
  int batch_stride;  // list rows per batch entry (0: the predicate does not read b)
  int head_stride;   // list rows per head (0: it does not read h)
  FT_HD long long row(int b, int h, int r) const {
    return static_cast<long long>(b) * batch_stride + static_cast<long long>(h) * head_stride + r;
  }
  // Entry e's block and whether it is masked per element.
  FT_HD static int block(int e) { return e >> 1; }
  FT_HD static bool partial(int e) { return (e & 1) != 0; }
};
FT_HD constexpr int mask_list_entry(int block, bool partial) { return (block << 1) | (partial ? 1 : 0); }

// The combination of two states of one block (the backward's union over a kv head's query heads): the state both
// have, else partial (empty only if both are, full only if both are).
FT_HD constexpr unsigned char mask_state_union(unsigned char a, unsigned char b) {
  return a == b ? a : static_cast<unsigned char>(kMaskBlockPartial);
}

// What a kernel with a mask_mod reads besides its plain argument and AttnMods: the tensors and its summary's lists.
struct MaskModArgs {
  MaskTensor tensor[kMaxMaskTensors];  // bound to the predicate's names in sorted order
  MaskBlockList blocks;
};

// The block summary's kernels' arguments (mask_mod.cuh; core/mask_summary.hpp plans them). States:
// states[((b' heads + h') q_blocks + qb) k_blocks + kb], b' in [0, batches), h' in [0, heads) (1 where the predicate
// does not read b, h). The dense mask (validation) is out[((b' heads + h') seq_q + q) seq_k + k].
struct MaskStatesArgs {
  MaskModArgs mask;       // the predicate's tensors (blocks unused)
  unsigned char* states;  // out
  int batches, heads;
  int seq_q, seq_k, causal;
  int block_q, block_k;   // query rows, keys per block
  int q_blocks, k_blocks;
};
// List row (o, r), o in [0, outers), r in [0, rows), reads column c's state of grid g at
// states[o outer_stride + g group_stride + r row_stride + c col_stride] (forward: rows are query blocks, columns key
// blocks, one grid; backward: rows key blocks, columns query blocks, the kv head's group of query heads' grids), and
// writes count[o rows + r] and index[(o rows + r) cols ...].
struct MaskListsArgs {
  const unsigned char* states;
  int* count;
  int* index;
  int outers, rows, cols, group;
  long long outer_stride, group_stride, row_stride, col_stride;
};
enum : int { kMaskStatesThreads = 128, kMaskListsThreads = 128, kMaskDenseThreads = 256 };

// A list row's entries from its row of block states (a (row, column) grid of `cols` states, `group` such grids
// `group_stride` apart, unioned): the host's emulation and mask_mod.cuh's mask_mod_block_lists share it.
// states[g * group_stride + c * col_stride] is column c's state in grid g. Returns the count.
FT_HD inline int mask_list_row(const unsigned char* states, int cols, long long col_stride, int group,
                               long long group_stride, int* index) {
  int n = 0;
  for (int c = 0; c < cols; ++c) {
    unsigned char s = states[c * col_stride];
    for (int g = 1; g < group; ++g) s = mask_state_union(s, states[g * group_stride + c * col_stride]);
    if (s != kMaskBlockEmpty) index[n++] = mask_list_entry(c, s == kMaskBlockPartial);
  }
  return n;
}

#if !defined(__CUDACC_RTC__) && !defined(__CUDA_ARCH__)
// The block state of query rows [q0, q1) and keys [k0, k1) (q1 <= seq_q; k1 may pass seq_k, whose keys are masked)
// under `visible(q, k)` (the predicate), AND causal (bottom-right aligned), AND k < seq_k. Host code (the tests'
// emulation, a GPU-free check of the summary); the kernel reduces the same test over a CTA.
template <class Visible>
inline unsigned char mask_block_state(int q0, int q1, int k0, int k1, int seq_q, int seq_k, bool causal,
                                      const Visible& visible) {
  bool any = false, all = true;
  for (int q = q0; q < q1; ++q)
    for (int k = k0; k < k1; ++k) {
      const bool v = k < seq_k && (!causal || k <= q + seq_k - seq_q) && visible(q, k);
      any |= v;
      all &= v;
    }
  return !any ? kMaskBlockEmpty : all ? kMaskBlockFull : kMaskBlockPartial;
}
#endif

}  // namespace flashtune
