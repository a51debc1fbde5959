// mask_mod's block summary (issue 32, part 3; docs/kernels.md, "mask_mod"): the kernels that turn a predicate into
// the lists the attention kernels walk (MaskBlockList, mask_mod.h), and the dense mask the validation's float64
// reference takes. Compiled per predicate, in a program of their own: the wrapper (core/mask_mod.hpp) then this file.
//   mask_mod_block_states<M>  one CTA per (column block, row block, (batch', head')): the predicate AND causal AND
//                             key < seq_k over the block's elements whose query row is below seq_q, reduced to one
//                             state byte (empty, partial, full)
//   mask_mod_block_lists      one thread per list row: the row's non-empty blocks, in order, with their partial bit
//                             (mask_list_row), the union over a group of state grids (the backward's query heads)
//   mask_mod_dense<M>         one thread per element: the predicate alone (no causal, no bounds), 1 or 0
#pragma once
#include "mask_mod.h"

namespace flashtune {

template <class M>
__global__ void __launch_bounds__(kMaskStatesThreads) mask_mod_block_states(const MaskStatesArgs a) {
  const int kb = static_cast<int>(blockIdx.x), qb = static_cast<int>(blockIdx.y), bh = static_cast<int>(blockIdx.z);
  const int b = bh / a.heads, h = bh % a.heads;
  const int q0 = qb * a.block_q, k0 = kb * a.block_k;
  const int rows = min(a.block_q, a.seq_q - q0), n = rows * a.block_k;
  int any = 0, all = 1;
  for (int x = static_cast<int>(threadIdx.x); x < n; x += kMaskStatesThreads) {
    const int q = q0 + x / a.block_k, k = k0 + x % a.block_k;
    const bool v = k < a.seq_k && (!a.causal || k <= q + a.seq_k - a.seq_q) && M::test(a.mask, b, h, q, k);
    any |= v;
    all &= v;
  }
  any = __syncthreads_or(any);
  all = __syncthreads_and(all);
  if (threadIdx.x == 0)
    a.states[(static_cast<long long>(bh) * a.q_blocks + qb) * a.k_blocks + kb] =
        !any ? kMaskBlockEmpty : all ? kMaskBlockFull : kMaskBlockPartial;
}

// The lists from the states (MaskListsArgs, mask_mod.h): one thread per list row.
__global__ void __launch_bounds__(kMaskListsThreads) mask_mod_block_lists(const MaskListsArgs a) {
  const long long x = static_cast<long long>(blockIdx.x) * kMaskListsThreads + threadIdx.x;
  if (x >= static_cast<long long>(a.outers) * a.rows) return;
  const long long o = x / a.rows, r = x % a.rows;
  a.count[x] = mask_list_row(a.states + o * a.outer_stride + r * a.row_stride, a.cols, a.col_stride, a.group,
                             a.group_stride, a.index + x * a.cols);
}

// The predicate alone, materialised for the reference: out[((b' heads' + h') seq_q + q) seq_k + k] = 1 or 0.
template <class M>
__global__ void __launch_bounds__(kMaskDenseThreads) mask_mod_dense(const MaskStatesArgs a) {
  const long long x = static_cast<long long>(blockIdx.x) * kMaskDenseThreads + threadIdx.x;
  const long long per_head = static_cast<long long>(a.seq_q) * a.seq_k;
  if (x >= per_head * a.batches * a.heads) return;
  const int bh = static_cast<int>(x / per_head), q = static_cast<int>(x % per_head / a.seq_k),
            k = static_cast<int>(x % a.seq_k);
  a.states[x] = M::test(a.mask, bh / a.heads, bh % a.heads, q, k) ? 1 : 0;
}

}  // namespace flashtune
