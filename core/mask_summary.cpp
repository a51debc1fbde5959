#include "core/mask_summary.hpp"

#include "core/embedded.hpp"
#include "core/nvrtc_api.hpp"
#include "core/util.hpp"
#include "templates/traits_common.h"

namespace flashtune {

MaskSummaryPlan mask_summary_plan(const MaskPredicate& m, bool backward, int batch, int heads, int heads_k, int seq_q,
                                  int seq_k, bool causal, int block_q, int block_k) {
  const int hk = heads_k > 0 ? heads_k : heads, group = heads / hk;
  MaskSummaryPlan plan;
  MaskStatesArgs& s = plan.states;
  s.batches = m.reads_batch ? batch : 1;
  s.heads = m.reads_head ? heads : 1;
  s.seq_q = seq_q, s.seq_k = seq_k, s.causal = causal ? 1 : 0;
  s.block_q = block_q, s.block_k = block_k;
  s.q_blocks = ceil_div(seq_q, block_q), s.k_blocks = ceil_div(seq_k, block_k);
  plan.states_grid[0] = (unsigned)s.k_blocks, plan.states_grid[1] = (unsigned)s.q_blocks;
  plan.states_grid[2] = (unsigned)(s.batches * s.heads);
  const long long grid = (long long)s.q_blocks * s.k_blocks;
  plan.states_bytes = (size_t)(grid * s.batches * s.heads);
  MaskListsArgs& l = plan.lists;
  // The list's heads: query heads (forward), kv heads (backward: each the union of its group's query heads' grids).
  const int list_heads = !m.reads_head ? 1 : backward ? hk : heads;
  l.outers = s.batches * list_heads;
  if (!backward) {
    l.rows = s.q_blocks, l.cols = s.k_blocks, l.group = 1;
    l.outer_stride = grid, l.group_stride = 0, l.row_stride = s.k_blocks, l.col_stride = 1;
  } else {
    l.rows = s.k_blocks, l.cols = s.q_blocks, l.group = m.reads_head ? group : 1;
    l.outer_stride = grid * l.group, l.group_stride = grid, l.row_stride = 1, l.col_stride = s.k_blocks;
  }
  const long long rows = (long long)l.outers * l.rows, entries = rows * l.cols;
  if (entries >= (1ll << 31))
    throw UsageError("mask_mod: the block summary would hold " + std::to_string(entries) +
                     " list entries, past 2^31 (larger blocks, or a predicate that does not read b or h)");
  plan.lists_grid = (unsigned)ceil_div((int)rows, kMaskListsThreads);
  plan.count_bytes = (size_t)rows * 4;
  plan.index_bytes = (size_t)entries * 4;
  MaskBlockList& b = plan.blocks;
  b.cols = l.cols;
  b.head_stride = m.reads_head ? l.rows : 0;
  b.batch_stride = m.reads_batch ? list_heads * l.rows : 0;
  return plan;
}

long long mask_dense_elements(const MaskPredicate& m, int batch, int heads, int seq_q, int seq_k) {
  return (long long)(m.reads_batch ? batch : 1) * (m.reads_head ? heads : 1) * seq_q * seq_k;
}

MaskStatesArgs mask_dense_args(const MaskPredicate& m, int batch, int heads, int seq_q, int seq_k) {
  MaskStatesArgs a{};
  a.batches = m.reads_batch ? batch : 1;
  a.heads = m.reads_head ? heads : 1;
  a.seq_q = seq_q, a.seq_k = seq_k;
  return a;
}

std::string mask_summary_source(const MaskPredicate& m) { return mask_program_source(m, "mask_mod.cuh"); }

std::vector<std::string> mask_summary_kernels(const MaskPredicate& m) {
  return {"&flashtune::mask_mod_block_states<" + m.type_name() + ">", "&flashtune::mask_mod_block_lists",
          "&flashtune::mask_mod_dense<" + m.type_name() + ">"};
}

MaskSummaryProgram compile_mask_summary(const MaskPredicate& m, const std::string& arch) {
  const NvrtcApi& nv = nvrtc();
  const EmbeddedHeaders headers = embedded_headers();
  const std::string source = mask_summary_source(m);
  nvrtcProgram prog;
  if (nv.CreateProgram(&prog, source.c_str(), "mask_summary.cu", headers.count(), headers.sources.data(),
                       headers.names.data()) != NVRTC_SUCCESS)
    throw UsageError("mask_mod: NVRTC could not create a program");
  const std::vector<std::string> names = mask_summary_kernels(m);
  for (const auto& n : names) nv.AddNameExpression(prog, n.c_str());
  const std::string target = "--gpu-architecture=" + arch;
  const char* opts[] = {target.c_str(), "--std=c++17", "-DFLASHTUNE_NVRTC=1", "--frandom-seed=flashtune"};
  const nvrtcResult rc = nv.CompileProgram(prog, 4, opts);
  MaskSummaryProgram out;
  if (rc != NVRTC_SUCCESS) {
    size_t n = 0;
    nv.GetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    if (n) nv.GetProgramLog(prog, log.data());
    nv.DestroyProgram(&prog);
    throw UsageError("mask_mod does not compile: " + mask_compile_error(log, m));
  }
  for (const auto& n : names) {
    const char* lowered = nullptr;
    nv.GetLoweredName(prog, n.c_str(), &lowered);
    out.lowered.push_back(lowered ? lowered : "");
  }
  size_t size = 0;
  nv.GetCUBINSize(prog, &size);
  out.cubin.resize(size);
  nv.GetCUBIN(prog, out.cubin.data());
  nv.DestroyProgram(&prog);
  return out;
}

}  // namespace flashtune
