// mask_mod's block summary on the host side (docs/kernels.md, "mask_mod"): the geometry of templates/mask_mod.cuh's
// launches and of the MaskBlockList an attention kernel walks, for one call; and the program that holds those
// kernels. Plain code, no CUDA: the worker and the runtime launch what this plans with their own driver calls.
#pragma once
#include <string>
#include <vector>

#include "core/mask_mod.hpp"
#include "templates/mask_mod.h"

namespace flashtune {

struct MaskSummaryPlan {
  MaskStatesArgs states{};      // mask_mod_block_states' argument (pointers left null: mask tensors, states)
  unsigned states_grid[3] = {1, 1, 1};
  MaskListsArgs lists{};        // mask_mod_block_lists' argument (pointers null: states, count, index)
  unsigned lists_grid = 1;
  MaskBlockList blocks{};       // the attention kernel's view of the lists (count and index null)
  size_t states_bytes = 0, count_bytes = 0, index_bytes = 0;
};

// Forward (backward false): a list per (batch', query head', query block of block_q rows), of key blocks of block_k
// keys. Backward: a list per (batch', kv head', key block of block_k keys), of query blocks of block_q rows, the union
// over the kv head's query heads. batch' and head' collapse to 0 where the predicate does not read b or h. Throws
// UsageError when a list row's entries would pass 2^31 in all.
MaskSummaryPlan mask_summary_plan(const MaskPredicate&, bool backward, int batch, int heads, int heads_k, int seq_q,
                                  int seq_k, bool causal, int block_q, int block_k);

// The dense mask's argument for mask_mod_dense (validation): batches' x heads' x seq_q x seq_k bytes.
MaskStatesArgs mask_dense_args(const MaskPredicate&, int batch, int heads, int seq_q, int seq_k);
long long mask_dense_elements(const MaskPredicate&, int batch, int heads, int seq_q, int seq_k);

// The summary's program (the wrapper, then mask_mod.cuh) and its kernels' name expressions: states, lists, dense.
std::string mask_summary_source(const MaskPredicate&);
std::vector<std::string> mask_summary_kernels(const MaskPredicate&);

// The program compiled by NVRTC for `arch` ("sm_90"): the cubin and the kernels' lowered names (mask_summary_kernels'
// order). Throws UsageError (mask_compile_error's line) when it does not compile.
struct MaskSummaryProgram {
  std::string cubin;
  std::vector<std::string> lowered;
};
MaskSummaryProgram compile_mask_summary(const MaskPredicate&, const std::string& arch);

}  // namespace flashtune
