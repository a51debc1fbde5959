#include "aot.hpp"

#include <algorithm>
#include <set>

#include "core/util.hpp"

namespace flashtune::rt {

const AotKernel* aot_find(const AotTable& t, const std::string& hash) {
  const AotKernel* end = t.kernels + t.count;
  const AotKernel* it = std::lower_bound(t.kernels, end, hash,
                                         [](const AotKernel& k, const std::string& h) { return k.hash < h; });
  return it != end && it->hash == hash ? it : nullptr;
}

AotArch parse_aot_arch(const std::string& entry) {
  std::string s = entry.rfind("sm_", 0) == 0 ? entry.substr(3) : entry;
  AotArch a;
  if (!s.empty() && s.back() == 'a') {
    s.pop_back();
    a.hopper = true;
  }
  const bool digits = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) throw UsageError("FLASHTUNE_AOT_ARCHS entry '" + entry + "' is not an arch (80, 86, 89, 90a, ...)");
  if (a.hopper && s != "90")
    throw UsageError("FLASHTUNE_AOT_ARCHS entry '" + entry + "': only 90a has arch-specific kernels (the Hopper-only families)");
  a.arch = "sm_" + s;
  arch_limits(a.arch);  // an arch the runtime runs (it needs the shared-memory limit)
  return a;
}

namespace {
template <class T>
bool wanted(const std::vector<T>& filter, const T& x) {
  return filter.empty() || std::find(filter.begin(), filter.end(), x) != filter.end();
}
}  // namespace

AotPlan aot_variants(const TableSet& ts, const AotArch& a, const AotFilter& filter) {
  // The devices whose tables a query can reach on this arch (a device table is matched by name, and
  // every table of the arch serves other devices), and an untabled device ("").
  std::vector<std::string> devices = {""};
  std::set<int> seqs;
  // A decoding entry's batch x kv heads: the query at that value takes it (find_in: the nearest), so the values
  // the tables hold (and 0, unknown) cover every decoding entry; no other family's entry has one.
  std::set<long long> batch_heads = {0};
  // A grouped-query entry's group: a grouped-query query of that group takes it (find_in), others the multi-head
  // entries; 0 stands for every multi-head query (and for the grouped-query calls of groups no table holds).
  std::set<int> groups = {0};
  for (int i = 0; i < ts.count; ++i) {
    const tuned::Table& t = ts.tables[i];
    if (t.arch == a.arch && std::find(devices.begin(), devices.end(), t.device) == devices.end())
      devices.push_back(t.device);
    for (int j = 0; j < t.count; ++j) {
      seqs.insert(t.entries[j].seq_max);
      if (t.entries[j].batch_heads > 0) batch_heads.insert(t.entries[j].batch_heads);
      if (t.entries[j].group > 0) groups.insert(t.entries[j].group);
    }
  }
  // find_in picks the smallest bucket that holds seq: every bucket boundary, and one past the largest,
  // covers each interval of sequence lengths on which the choice is constant.
  std::vector<int> seq_points(seqs.begin(), seqs.end());
  seq_points.push_back(seqs.empty() ? 1 : *seqs.rbegin() + 1);
  std::set<int> dims, seq_q_classes = {0};  // 0: Sq past every family's query-length range
  for (const Family& f : families())
    if (!f.test_only) {
      dims.insert(f.head_dims.begin(), f.head_dims.end());
      if (f.max_seq_q > 0) seq_q_classes.insert(f.max_seq_q);
    }

  AotPlan plan;
  std::set<std::string> seen_skips;
  std::vector<Variant> hopper_skipped;  // summed up in one line per family
  // Paged calls: the config depends on the page size only through which configs' paged form reads it
  // (decode_splitkv: which BLOCK_N, powers of two up to 256, divide it), so the powers of two from 16 stand for
  // every page size; test_runtime checks the plan against other page sizes too.
  std::vector<int> page_points = {0};  // 0: contiguous K/V
  for (int page = 16; page <= 4096; page *= 2) page_points.push_back(page);
  // A paged pick serves both pool layouts (the same config): its head-major and token-major forms are built.
  auto add = [&](const Family& f, const Config& c, const Query& q) {
    std::vector<Variant>& to = f.hopper_only && !a.hopper ? hopper_skipped : plan.variants;
    for (PageLayout layout : {PageLayout::hnd, PageLayout::nhd}) {
      if (layout == PageLayout::nhd && !(q.page_size > 0 && f.paged_nhd)) continue;
      const Variant v{&f, c, q.head_dim, q.causal, q.dtype, q.varlen, q.page_size > 0, 0, layout};
      if (std::find(to.begin(), to.end(), v) == to.end()) to.push_back(v);
    }
  };
  for (const char* dir : {"fwd", "bwd"})
    for (DType t : {DType::fp32, DType::fp16, DType::bf16})
      for (int d : dims)
        for (int causal : {0, 1}) {
          if (!wanted(filter.dtypes, t) || !wanted(filter.head_dims, d) || !wanted(filter.causal, causal)) continue;
          // Batch x kv heads matters only where a decoding family (a query-length range) runs (direction, dtype, d).
          bool ranged_runs = false;
          for (const Family& f : families())
            ranged_runs = ranged_runs || (!f.test_only && f.max_seq_q > 0 && f.direction == dir &&
                                          std::find(f.dtypes.begin(), f.dtypes.end(), t) != f.dtypes.end() &&
                                          std::find(f.head_dims.begin(), f.head_dims.end(), d) != f.head_dims.end());
          for (const std::string& device : devices)
            for (int seq : seq_points)
              for (int seq_q : seq_q_classes)        // the candidates change only at a family's max_seq_q
                for (bool varlen : {false, true})      // packed calls: the families' packed forms
                  for (int page : page_points)         // paged calls: the families' paged forms
                    for (long long bh : batch_heads)  // decoding queries (a ranged seq_q class) only
                    for (int group : groups) {        // grouped-query queries of the groups the tables hold
                      if (varlen && page) continue;
                      if (bh && (seq_q == 0 || !ranged_runs)) continue;
                      if (group && (bh || page || varlen)) continue;  // (dense calls: the grouped-query entries')
                      Query q;
                      q.device = device, q.arch = a.arch, q.direction = dir, q.dtype = t;
                      q.head_dim = d, q.causal = causal != 0, q.seq = seq, q.seq_q = seq_q, q.varlen = varlen;
                      q.page_size = page, q.batch_heads = bh, q.gqa = group > 0, q.group = group;
                      const Family* f = choose_family(ts, q);
                      if (!f || !wanted(filter.families, f->name)) continue;
                      const Pick pick = choose_config(ts, *f, q);
                      if (!pick.family) continue;  // no config reads such pages
                      // A paged pick's note says where its config came from (a dense pick, the default's nearest
                      // config): what the build leaves out is only a config the family refused.
                      if (!pick.note.empty() && !page && seen_skips.insert(pick.note).second) plan.skipped.push_back(pick.note);
                      add(*f, pick.config, q);
                      add(*f, fallback_config(*f, q), q);
                    }
        }
  for (const Family& f : families()) {
    const auto n = std::count_if(hopper_skipped.begin(), hopper_skipped.end(), [&](const Variant& v) { return v.family == &f; });
    if (n)
      plan.skipped.push_back(f.name + ": " + std::to_string(n) + " variants: Hopper-only (sm_90a), built only where " +
                             a.arch.substr(3) + "a is listed");
  }
  return plan;
}

}  // namespace flashtune::rt
