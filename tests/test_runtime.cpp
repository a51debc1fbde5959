// The runtime library without a GPU: config lookup (device -> arch -> default, the results store, the
// family choice, a tabled config the family rejects; the user's store: its path, the order, an unsafe one), the JIT disk cache (atomic fill by concurrent
// processes, truncated and corrupted entries), the C ABI's argument checks and its no-GPU answer.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <set>
#include <string>

#include "aot.hpp"
#include "args.hpp"
#include "core/tensor_maps.hpp"
#include "core/util.hpp"
#include "disk_cache.hpp"
#include "fake_driver/record_tensor_map.hpp"
#include "fixture.hpp"
#include "flashtune/attention.hpp"
#include "lookup.hpp"
#include "results/emit.hpp"
#include "user_store.hpp"

namespace fs = std::filesystem;
using namespace flashtune;
using namespace flashtune::rt;

namespace {

Query query(const std::string& device, const std::string& arch, const std::string& dir, DType t, int d, bool causal,
            int seq) {
  Query q;
  q.device = device;
  q.arch = arch;
  q.direction = dir;
  q.dtype = t;
  q.head_dim = d;
  q.causal = causal;
  q.seq = seq;
  return q;
}

// The one committed table of a device (nullptr when there is none, or more than one).
const tuned::Table* committed_table(const TableSet& ts, const char* device) {
  const tuned::Table* found = nullptr;
  for (int i = 0; i < ts.count; ++i)
    if (std::string(ts.tables[i].device) == device) {
      if (found) return nullptr;
      found = &ts.tables[i];
    }
  return found;
}

// A config of `f` that its check rejects at head dim d (searched over the domains: tests enumerate
// what exists), or empty when every config is valid there.
Config rejected_config(const Family& f, int d) {
  Config c(f.params.size());
  std::vector<size_t> idx(f.params.size(), 0);
  for (;;) {
    for (size_t i = 0; i < c.size(); ++i) c[i] = f.params[i].domain[idx[i]];
    if (f.check(c, d)) return c;
    size_t i = 0;
    while (i < idx.size() && ++idx[i] == f.params[i].domain.size()) idx[i++] = 0;
    if (i == idx.size()) return {};
  }
}

tuned::Entry entry(const char* family, const char* dir, const char* dtype, int d, const Config& c, float tflops) {
  tuned::Entry e{family, dir, dtype, d, false, 4096, {}, tflops};
  for (size_t i = 0; i < c.size(); ++i) e.params[i] = c[i];
  return e;
}

std::string temp_dir(const std::string& tag) { return make_private_tmpdir("ft-" + tag); }

}  // namespace

// ---- lookup --------------------------------------------------------------------------------------

TEST(RuntimeLookup, DeviceThenArchThenDefault) {
  const Family& f = find_family("fa2_simt");
  const Config tuned_dev = f.parse_config("BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2");
  const Config tuned_arch = f.parse_config("BLOCK_M=128,BLOCK_N=64,TM=8,TN=4,KV_STAGES=2");
  const tuned::Entry dev_entries[] = {entry("fa2_simt", "fwd", "fp32", 64, tuned_dev, 10)};
  const tuned::Entry arch_entries[] = {entry("fa2_simt", "fwd", "fp32", 64, tuned_arch, 9)};
  const tuned::Table tables[] = {{"GPU A", "sm_90", dev_entries, 1}, {"GPU B", "sm_90", arch_entries, 1}};
  const TableSet ts{tables, 2};

  Pick p = choose_config(ts, f, query("GPU A", "sm_90", "fwd", DType::fp32, 64, false, 1000));
  EXPECT_EQ(p.source, "device");
  EXPECT_EQ(p.config, tuned_dev);
  p = choose_config(ts, f, query("GPU C", "sm_90", "fwd", DType::fp32, 64, false, 1000));
  EXPECT_EQ(p.source, "arch");  // the first table of the arch
  EXPECT_EQ(p.config, tuned_dev);
  p = choose_config(ts, f, query("GPU C", "sm_80", "fwd", DType::fp32, 64, false, 1000));
  EXPECT_EQ(p.source, "default");
  EXPECT_EQ(p.config, f.default_config);
  p = choose_config(ts, f, query("GPU A", "sm_90", "fwd", DType::fp32, 128, false, 1000));  // no entry for d128
  EXPECT_EQ(p.source, "default");
  EXPECT_TRUE(p.note.empty());
}

TEST(RuntimeLookup, GeneratedTablesAreCompiledIn) {
  const TableSet ts = generated_tables();
  ASSERT_GT(ts.count, 0);
  const std::string device = ts.tables[0].device, arch = ts.tables[0].arch;
  const tuned::Entry& e = ts.tables[0].entries[0];
  const DType t = parse_dtype(e.dtype);
  Query q = query(device, arch, e.direction, t, e.head_dim, e.causal, e.seq_max);
  Pick p = choose_config(ts, find_family(e.family), q);
  EXPECT_EQ(p.source, "device");
  q.device = "Some Other GPU";
  EXPECT_EQ(choose_config(ts, find_family(e.family), q).source, "arch");
  q.arch = "sm_1234";
  EXPECT_EQ(choose_config(ts, find_family(e.family), q).source, "default");
}

// Every committed table entry is a config its family runs: the family exists, the config (the family's
// parameter count of the positional values) passes its check at the entry's head dim, the values past it are
// zero, a paged entry's family reads pages, a deterministic entry's config is reproducible. A tunable added to a
// family without re-emitting the tables reads as 0 here (DQ_STAGES = 0 fails fa3_wgmma_bwd's check).
TEST(CommittedTables, EveryEntryIsAConfigItsFamilyRuns) {
  const TableSet ts = generated_tables();
  for (int i = 0; i < ts.count; ++i)
    for (int k = 0; k < ts.tables[i].count; ++k) {
      const tuned::Entry& e = ts.tables[i].entries[k];
      const std::string where = std::string(ts.tables[i].device) + " entry " + std::to_string(k) + " (" + e.family + ")";
      const Family* f = family_named(e.family);
      ASSERT_NE(f, nullptr) << where;
      const Config c(e.params, e.params + f->params.size());
      EXPECT_EQ(f->check(c, e.head_dim), nullptr) << where << ": " << f->config_string(c);
      for (size_t j = f->params.size(); j < (size_t)tuned::kMaxParams; ++j) EXPECT_EQ(e.params[j], 0) << where;
      if (e.paged) EXPECT_TRUE(f->paged) << where;
      if (e.deterministic) EXPECT_TRUE(f->reproducible(c)) << where << ": " << f->config_string(c);
    }
}

// No committed device table goes stale silently: for each (direction, dtype, head dim) a device table covers, it
// holds entries of every family another table of its arch holds there (a family measured on one GPU of the arch
// and never on this one: the table predates it, as the runtime's lookup sees it) - else it must be re-tuned and
// emitted. configs/generated/STALE.txt names the tables known to be stale; this test fails for a stale table it
// does not name, and for a named one that is current (then its line goes).
TEST(CommittedTables, NoneIsStaleUnlessListed) {
  std::map<std::string, std::string> listed;  // header stem -> the line
  {
    std::ifstream in(std::string(FLASHTUNE_SOURCE_DIR) + "/configs/generated/STALE.txt");
    for (std::string line; std::getline(in, line);)
      if (!line.empty() && line[0] != '#') listed[line.substr(0, line.find(':'))] = line;
  }
  using Key = std::tuple<std::string, std::string, int>;  // direction, dtype, head dim
  const TableSet ts = generated_tables();
  auto families_of = [&](const tuned::Table& t) {
    std::map<Key, std::set<std::string>> out;
    for (int k = 0; k < t.count; ++k)
      out[{t.entries[k].direction, t.entries[k].dtype, t.entries[k].head_dim}].insert(t.entries[k].family);
    return out;
  };
  for (int i = 0; i < ts.count; ++i) {
    const tuned::Table& t = ts.tables[i];
    const auto mine = families_of(t);
    std::set<std::string> missing;
    for (int j = 0; j < ts.count; ++j)
      if (j != i && std::string(ts.tables[j].arch) == t.arch)
        for (const auto& [key, fams] : families_of(ts.tables[j]))
          if (auto it = mine.find(key); it != mine.end())
            for (const auto& f : fams)
              if (!it->second.count(f)) missing.insert(f);
    const std::string file = header_name(t.arch, t.device), stem = file.substr(0, file.size() - 4);
    std::string lacks;
    for (const auto& m : missing) lacks += (lacks.empty() ? "" : ", ") + m;
    if (missing.empty())
      EXPECT_FALSE(listed.count(stem)) << stem << " is current: remove its line from configs/generated/STALE.txt";
    else
      EXPECT_TRUE(listed.count(stem)) << stem << ".hpp is stale: no entries of " << lacks << ", which another "
                                      << t.arch << " table holds where this one covers the direction, dtype and head "
                                      << "dim; re-tune this GPU and emit, or name it in configs/generated/STALE.txt";
  }
}

TEST(RuntimeLookup, FamilyChoiceByTableThenPreference) {
  // No table: the fixed preference.
  const TableSet none{nullptr, 0};
  auto name = [&](const TableSet& ts, const Query& q) {
    const Family* f = choose_family(ts, q);
    return f ? f->name : std::string("none");
  };
  EXPECT_EQ(name(none, query("X", "sm_80", "fwd", DType::fp32, 64, false, 512)), "fa2_simt");
  EXPECT_EQ(name(none, query("X", "sm_80", "fwd", DType::bf16, 256, true, 512)), "fa2_mma");
  EXPECT_EQ(name(none, query("X", "sm_80", "bwd", DType::fp32, 64, false, 512)), "fa2_simt_bwd");
  EXPECT_EQ(name(none, query("X", "sm_90", "bwd", DType::fp16, 128, false, 512)), "fa2_wgmma_bwd");
  EXPECT_EQ(name(none, query("X", "sm_80", "bwd", DType::fp16, 128, false, 512)), "fa2_mma_bwd");  // Hopper-only out
  EXPECT_EQ(name(none, query("X", "sm_90", "fwd", DType::fp32, 256, false, 512)), "none");
  // Hopper-only families are never candidates off sm_90; test-only families never.
  for (const Family* f : candidate_families(query("X", "sm_80", "bwd", DType::bf16, 64, false, 1)))
    EXPECT_FALSE(f->hopper_only || f->test_only) << f->name;
  for (const Family* f : candidate_families(query("X", "sm_90", "fwd", DType::fp32, 64, false, 1)))
    EXPECT_FALSE(f->test_only) << f->name;

  // Score modifications (issue 32): only families that have them are candidates; on sm_80 the forward fa2_mma and the
  // backward fa2_mma_bwd (dense and packed; fp32 none); on sm_90 fa2_mma beside fa3_wgmma, the tables choosing as for the plain call.
  auto modded = [](Query q, unsigned mods) {
    q.mods = mods;
    return q;
  };
  for (unsigned m : {kModWindow, kModSoftcap, kModAlibi, kModWindow | kModSoftcap | kModAlibi}) {
    EXPECT_EQ(name(none, modded(query("X", "sm_80", "fwd", DType::bf16, 128, true, 512), m)), "fa2_mma") << m;
    EXPECT_EQ(name(none, modded(query("X", "sm_80", "fwd", DType::fp16, 32, false, 512), m)), "fa2_mma") << m;
    EXPECT_EQ(name(none, modded(query("X", "sm_80", "bwd", DType::bf16, 128, true, 512), m)), "fa2_mma_bwd") << m;
    EXPECT_EQ(name(none, modded(query("X", "sm_80", "bwd", DType::fp16, 64, false, 512), m)), "fa2_mma_bwd") << m;
    Query packed_bwd = modded(query("X", "sm_80", "bwd", DType::bf16, 128, true, 512), m);
    packed_bwd.varlen = true, packed_bwd.gqa = true;
    EXPECT_EQ(name(none, packed_bwd), "fa2_mma_bwd") << m;
    EXPECT_EQ(name(none, modded(query("X", "sm_80", "bwd", DType::fp32, 64, false, 512), m)), "none") << m;
    EXPECT_EQ(name(none, modded(query("X", "sm_80", "fwd", DType::fp32, 64, false, 512), m)), "none") << m;
    Query packed = modded(query("X", "sm_80", "fwd", DType::bf16, 64, true, 512), m);
    packed.varlen = true, packed.gqa = true;
    EXPECT_EQ(name(none, packed), "fa2_mma") << m;
    std::set<std::string> hopper;
    for (const Family* f : candidate_families(modded(query("X", "sm_90", "fwd", DType::bf16, 128, true, 512), m)))
      hopper.insert(f->name);
    EXPECT_EQ(hopper, (std::set<std::string>{"fa2_mma", "fa3_wgmma"})) << m;
  }

  // Grouped-query attention: only families that support it are candidates; untabled, the same preference
  // as multi-head (both 16-bit backward families sum dK, dV over the group), none for fp32; a table that
  // rates one of them faster for the bucket sends a grouped-query call there.
  auto gqa = [](Query q) {
    q.gqa = true;
    return q;
  };
  const Query gqa_bwd90 = gqa(query("X", "sm_90", "bwd", DType::bf16, 128, true, 512));
  for (const Family* f : candidate_families(gqa_bwd90)) EXPECT_TRUE(f->gqa) << f->name;
  EXPECT_EQ(candidate_families(gqa_bwd90).size(), 3u);  // fa2_mma_bwd, fa2_wgmma_bwd, fa3_wgmma_bwd
  EXPECT_EQ(name(none, gqa_bwd90), "fa2_wgmma_bwd");
  EXPECT_EQ(name(none, gqa(query("X", "sm_80", "bwd", DType::fp16, 64, false, 512))), "fa2_mma_bwd");
  EXPECT_EQ(name(none, gqa(query("X", "sm_90", "fwd", DType::bf16, 128, false, 512))), "fa2_mma");
  EXPECT_EQ(name(none, gqa(query("X", "sm_90", "bwd", DType::fp32, 64, false, 512))), "none");
  for (float mma_tflops : {290.f, 310.f}) {
    const tuned::Entry bwd[] = {entry("fa2_wgmma_bwd", "bwd", "bf16", 128, find_family("fa2_wgmma_bwd").default_config, 300),
                                entry("fa2_mma_bwd", "bwd", "bf16", 128, find_family("fa2_mma_bwd").default_config, mma_tflops)};
    const tuned::Table t[] = {{"GPU A", "sm_90", bwd, 2}};
    Query q = gqa_bwd90;
    q.causal = false;
    EXPECT_EQ(name(TableSet{t, 1}, q), mma_tflops > 300 ? "fa2_mma_bwd" : "fa2_wgmma_bwd");
  }

  // A table's grouped-query entries (Entry::group): a call of that group takes them, a call of another group or a
  // multi-head call the multi-head entry of the bucket; the pick names the group's bucket.
  {
    const Family& f3 = find_family("fa3_wgmma_bwd");
    Config mha_cfg = f3.default_config, gqa_cfg = f3.default_config;
    gqa_cfg[3] = 1;  // SCHED 1
    tuned::Entry grouped = entry("fa3_wgmma_bwd", "bwd", "bf16", 128, gqa_cfg, 520);
    grouped.group = 4;
    const tuned::Entry es[] = {entry("fa3_wgmma_bwd", "bwd", "bf16", 128, mha_cfg, 500), grouped};
    const tuned::Table t[] = {{"GPU A", "sm_90", es, 2}};
    const TableSet ts{t, 1};
    Query q = gqa(query("GPU A", "sm_90", "bwd", DType::bf16, 128, false, 4096));
    q.group = 4;
    Pick p = choose(ts, q);
    ASSERT_EQ(p.family, &f3);
    EXPECT_EQ(p.config, gqa_cfg);
    EXPECT_EQ(p.bucket, "group 4 (query heads per kv head), S <= 4096");
    q.group = 8;
    p = choose(ts, q);
    EXPECT_EQ(p.config, mha_cfg);
    EXPECT_EQ(p.bucket, "");
    q.group = 0, q.gqa = false;
    EXPECT_EQ(choose(ts, q).config, mha_cfg);
  }

  // A device table emitted before a family landed (no entry of it for the query's direction, dtype and head
  // dim) is stale for it: another device of the arch that measured the family wins, and the pick says why.
  // A device that measured the family keeps its own order, even where the new family rated lower there.
  {
    const Family& f3 = find_family("fa3_wgmma_bwd");
    const Family& f2 = find_family("fa2_wgmma_bwd");
    const tuned::Entry old_gpu[] = {entry("fa2_wgmma_bwd", "bwd", "bf16", 128, f2.default_config, 300)};
    const tuned::Entry new_gpu[] = {entry("fa2_wgmma_bwd", "bwd", "bf16", 128, f2.default_config, 400),
                                    entry("fa3_wgmma_bwd", "bwd", "bf16", 128, f3.default_config, 500)};
    const tuned::Entry both[] = {entry("fa2_wgmma_bwd", "bwd", "bf16", 128, f2.default_config, 320),
                                 entry("fa3_wgmma_bwd", "bwd", "bf16", 64, f3.default_config, 310),
                                 entry("fa3_wgmma_bwd", "bwd", "bf16", 128, f3.default_config, 310)};
    const tuned::Table t[] = {{"GPU Old", "sm_90", old_gpu, 1}, {"GPU New", "sm_90", new_gpu, 2},
                              {"GPU Both", "sm_90", both, 3}};
    const TableSet ts3{t, 3};
    const Query stale = query("GPU Old", "sm_90", "bwd", DType::bf16, 128, false, 4096);
    EXPECT_EQ(name(ts3, stale), "fa3_wgmma_bwd");
    const Pick p = choose(ts3, stale);
    EXPECT_EQ(p.source, "arch");
    EXPECT_NE(p.note.find("GPU Old table predates fa3_wgmma_bwd"), std::string::npos) << p.note;
    EXPECT_EQ(name(ts3, query("GPU Both", "sm_90", "bwd", DType::bf16, 128, false, 4096)), "fa2_wgmma_bwd");
    EXPECT_EQ(choose(ts3, query("GPU Both", "sm_90", "bwd", DType::bf16, 128, false, 4096)).note, "");
    // A head dim the stale device never measured at all: the arch's pick, no staleness to report.
    EXPECT_EQ(name(ts3, query("GPU Old", "sm_90", "bwd", DType::bf16, 64, false, 4096)), "fa3_wgmma_bwd");
    EXPECT_EQ(choose(ts3, query("GPU Old", "sm_90", "bwd", DType::bf16, 64, false, 4096)).note, "");
  }

  // A deterministic backward: only families with a reproducible config (fa2_wgmma_bwd's DETERMINISTIC 1 and 2),
  // only the tables' deterministic entries (fa2_wgmma_bwd's here is not one, however fast), and a
  // non-reproducible config refused for the default's nearest reproducible one.
  {
    const Family& f3 = find_family("fa3_wgmma_bwd");
    const Config fast = f3.parse_config("BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1,DQ_TURNS=0,DETERMINISTIC=0");
    const Config det = f3.parse_config("BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1,DQ_TURNS=0,DETERMINISTIC=1");
    tuned::Entry d = entry("fa3_wgmma_bwd", "bwd", "bf16", 128, det, 350);
    d.deterministic = true;
    tuned::Entry lie = entry("fa3_wgmma_bwd", "bwd", "bf16", 64,
                             f3.parse_config("BLOCK_M=128,CONSUMERS=2,DQ_TURNS=1,DETERMINISTIC=0"), 350);
    lie.deterministic = true;
    const tuned::Entry es[] = {entry("fa2_wgmma_bwd", "bwd", "bf16", 128, find_family("fa2_wgmma_bwd").default_config, 600),
                               entry("fa3_wgmma_bwd", "bwd", "bf16", 128, fast, 400), d, lie};
    const tuned::Table t[] = {{"GPU D", "sm_90", es, 4}};
    const TableSet ts{t, 1};
    Query q = query("GPU D", "sm_90", "bwd", DType::bf16, 128, false, 4096);
    EXPECT_EQ(name(ts, q), "fa2_wgmma_bwd");
    EXPECT_EQ(choose(ts, q).config, find_family("fa2_wgmma_bwd").default_config);
    q.deterministic = true;
    const std::vector<const Family*> det_families = candidate_families(q);
    EXPECT_TRUE(std::any_of(det_families.begin(), det_families.end(),
                            [](const Family* f) { return f->name == "fa2_wgmma_bwd"; }));
    const Family& f2 = find_family("fa2_wgmma_bwd");
    EXPECT_EQ(fallback_config(f2, q), f2.parse_config("STAGES=2,DQ_RED=3,DETERMINISTIC=1"));  // the default's nearest
    const Pick p = choose(ts, q);
    ASSERT_NE(p.family, nullptr);
    EXPECT_EQ(p.family->name, "fa3_wgmma_bwd");
    EXPECT_EQ(p.config, det);
    EXPECT_EQ(p.source, "device");
    q.head_dim = 64;  // the tabled entry claims to be deterministic but is not: refused, the nearest one runs
    const Pick r = choose_config(ts, f3, q);
    EXPECT_TRUE(f3.reproducible(r.config));
    EXPECT_EQ(r.source, "default");
    EXPECT_NE(r.note.find("rejected for a deterministic backward"), std::string::npos) << r.note;
    EXPECT_EQ(fallback_config(f3, q), nearest_reproducible_config(f3, f3.default_config, 64, false));
    EXPECT_EQ(fallback_config(f3, q), f3.parse_config("DETERMINISTIC=1"));  // the default with DETERMINISTIC 1
    q.causal = true;  // DETERMINISTIC 2 would do too: the smaller value first
    EXPECT_EQ(fallback_config(f3, q), f3.parse_config("DETERMINISTIC=1"));
    // A forward ignores it.
    Query fq = query("GPU D", "sm_90", "fwd", DType::bf16, 128, false, 4096);
    fq.deterministic = true;
    EXPECT_FALSE(candidate_families(fq).empty());
  }

  // A table that rates fa1_simt faster than fa2_simt for this query: fa1_simt; another device of the
  // arch gets the same through the arch fallback.
  const tuned::Entry entries[] = {entry("fa2_simt", "fwd", "fp32", 64, find_family("fa2_simt").default_config, 5),
                                  entry("fa1_simt", "fwd", "fp32", 64, find_family("fa1_simt").default_config, 7)};
  const tuned::Table tables[] = {{"GPU A", "sm_90", entries, 2}};
  const TableSet ts{tables, 1};
  EXPECT_EQ(name(ts, query("GPU A", "sm_90", "fwd", DType::fp32, 64, false, 512)), "fa1_simt");
  EXPECT_EQ(name(ts, query("GPU B", "sm_90", "fwd", DType::fp32, 64, false, 512)), "fa1_simt");
  EXPECT_EQ(name(ts, query("GPU C", "sm_80", "fwd", DType::fp32, 64, false, 512)), "fa2_simt");
  EXPECT_EQ(name(ts, query("GPU A", "sm_90", "fwd", DType::fp32, 32, false, 512)), "fa2_simt");
}

// A family with a query-length range (Family::max_seq_q: decode_splitkv) is a candidate only for
// 0 < Sq <= its range; inside it, a table entry of its own comes before a general family's (whatever
// TFLOP/s each measured: decoding and prefill numbers do not compare); past it, no table sends a call
// there however fast it rated the bucket; without an entry, the fixed preference (never a ranged family).
TEST(RuntimeLookup, QueryLengthRange) {
  int ranged = 0;
  for (const Family& rf : families()) {
    if (rf.test_only || rf.max_seq_q == 0) continue;
    ++ranged;
    for (DType t : rf.dtypes)
      for (int d : rf.head_dims) {
        SCOPED_TRACE(rf.name + " " + to_string(t) + " d" + std::to_string(d));
        auto q = [&](int seq_q) {
          Query x = query("GPU A", "sm_90", rf.direction, t, d, false, 4096);
          x.seq_q = seq_q;
          return x;
        };
        auto is_candidate = [&](int seq_q) {
          const auto cands = candidate_families(q(seq_q));
          return std::find(cands.begin(), cands.end(), &rf) != cands.end();
        };
        EXPECT_TRUE(is_candidate(1));
        EXPECT_TRUE(is_candidate(rf.max_seq_q));
        EXPECT_FALSE(is_candidate(rf.max_seq_q + 1));
        EXPECT_FALSE(is_candidate(4096));
        EXPECT_FALSE(is_candidate(0));  // unknown Sq
        EXPECT_EQ(seq_q_class(1), rf.max_seq_q);  // the only ranged family today
        EXPECT_EQ(seq_q_class(rf.max_seq_q + 1), 0);

        const TableSet none{nullptr, 0};
        EXPECT_NE(choose_family(none, q(1)), &rf);  // untabled: the general preference
        // The ranged family's entry rated far above the general family's in the same bucket.
        const char* general = preferred_family(q(4096));
        const Family& gf = find_family(general);
        ASSERT_EQ(gf.max_seq_q, 0);
        const tuned::Entry fast[] = {entry(rf.name.c_str(), rf.direction.c_str(), to_string(t), d, rf.default_config, 1e4f),
                                     entry(general, gf.direction.c_str(), to_string(t), d, gf.default_config, 1)};
        const tuned::Table tables[] = {{"GPU A", "sm_90", fast, 2}};
        const TableSet ts{tables, 1};
        EXPECT_EQ(choose_family(ts, q(1)), &rf);
        EXPECT_EQ(choose(ts, q(rf.max_seq_q)).family, &rf);
        EXPECT_EQ(choose_family(ts, q(rf.max_seq_q + 1)), &gf);  // prefill: never the decoding family
        EXPECT_EQ(choose_family(ts, q(4096)), &gf);
        // Rated below the general family's bucket: still the pick inside its range.
        const tuned::Entry slow[] = {entry(rf.name.c_str(), rf.direction.c_str(), to_string(t), d, rf.default_config, 1),
                                     entry(general, gf.direction.c_str(), to_string(t), d, gf.default_config, 500)};
        const tuned::Table slow_tables[] = {{"GPU A", "sm_90", slow, 2}};
        EXPECT_EQ(choose_family(TableSet{slow_tables, 1}, q(1)), &rf);
        EXPECT_EQ(choose_family(TableSet{slow_tables, 1}, q(4096)), &gf);
      }
  }
  EXPECT_GT(ranged, 0);
}

// Decoding through the committed tables: every entry of a family with a query-length range (the H100's
// decode_splitkv rows) is picked, with its config, for a call inside the range with that entry's key (sequence
// bucket and batch x kv heads), grouped-query or multi-head, and never past the range; a call the tables hold no
// such entry for gets the family a longer query would (the dense choice).
TEST(RuntimeLookup, DecodeFromTheCommittedTables) {
  const TableSet ts = generated_tables();
  int seen = 0;
  for (int i = 0; i < ts.count; ++i)
    for (int j = 0; j < ts.tables[i].count; ++j) {
      const tuned::Table& t = ts.tables[i];
      const tuned::Entry& e = t.entries[j];
      const Family& f = find_family(e.family);
      if (f.max_seq_q == 0 || e.paged) continue;  // paged entries: PagedFromTheCommittedTables
      ++seen;
      SCOPED_TRACE(std::string(t.device) + " " + e.family + " d" + std::to_string(e.head_dim) + " seq " +
                   std::to_string(e.seq_max));
      for (bool gqa : {true, false})
        for (int seq_q : {1, f.max_seq_q}) {
          Query q = query(t.device, t.arch, e.direction, parse_dtype(e.dtype), e.head_dim, e.causal, e.seq_max);
          q.gqa = gqa, q.seq_q = seq_q, q.batch_heads = e.batch_heads;
          const Pick p = choose(ts, q);
          ASSERT_EQ(p.family, &f);
          EXPECT_EQ(p.source, "device");
          EXPECT_EQ(p.config, Config(e.params, e.params + f.params.size()));
          EXPECT_EQ(p.bucket.empty(), e.batch_heads == 0) << p.bucket;
          q.seq_q = f.max_seq_q + 1;
          EXPECT_NE(choose(ts, q).family, &f);
        }
    }
  EXPECT_GT(seen, 0) << "no decoding entry in the committed tables (configs/generated)";
  // fp16 decoding was not tuned anywhere: the dense choice, as for Sq past the range.
  Query q = query(ts.tables[0].device, ts.tables[0].arch, "fwd", DType::fp16, 128, false, 4096);
  q.gqa = true, q.seq_q = 1;
  const Family* dense = choose_family(ts, [&] { Query x = q; x.seq_q = 17; return x; }());
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->max_seq_q, 0);
  EXPECT_EQ(choose(ts, q).family, dense);
}

// Issue 32: a forward's sliding window is looked up at the sequence whose plain call walks as far (lookup_seq):
// the keys a row sees, W = min(Sk, left + right + 1) (causal: left + 1), doubled when causal, capped at max(Sq, Sk).
// A backward, a call without a window, and a window past the sequence keep max(Sq, Sk).
TEST(RuntimeLookup, WindowLooksUpItsWalk) {
  Problem p;
  p.batch = 1, p.heads = 16, p.seq_q = p.seq_k = 16384, p.head_dim = 128, p.dtype = DType::bf16;
  p.direction = "fwd", p.causal = true;
  EXPECT_EQ(lookup_seq(p), 16384);  // no window
  p.window_left = 1024;
  EXPECT_EQ(lookup_seq(p), 2 * 1025);
  p.window_left = 8192;
  EXPECT_EQ(lookup_seq(p), 16384);  // 2 x 8193 capped
  p.window_left = 0;
  EXPECT_EQ(lookup_seq(p), 2);  // the diagonal alone
  p.causal = false, p.window_left = 100, p.window_right = 50;
  EXPECT_EQ(lookup_seq(p), 151);
  p.window_left = -1;  // unbounded on the left: every key
  EXPECT_EQ(lookup_seq(p), 16384);
  p.window_left = 100, p.seq_q = 20000;  // Sq > Sk: capped at max(Sq, Sk) from above, W from the keys
  EXPECT_EQ(lookup_seq(p), 151);
  p.direction = "bwd";
  EXPECT_EQ(lookup_seq(p), 20000);
  // The committed tables, through choose: the H200's causal d 128 forward at S 16k with a window of 1024 keys takes
  // the 4096 bucket's config (2050 <= 4096), the same call without one the 16384 bucket's.
  const TableSet ts = generated_tables();
  const tuned::Table* t = committed_table(ts, "NVIDIA H200");
  ASSERT_NE(t, nullptr) << "no single H200 table in the committed tables (configs/generated)";
  Problem w;
  w.batch = 1, w.heads = 16, w.seq_q = w.seq_k = 16384, w.head_dim = 128, w.dtype = DType::bf16;
  w.direction = "fwd", w.causal = true, w.window_left = 1024;
  Query windowed = query(t->device, t->arch, "fwd", DType::bf16, 128, true, lookup_seq(w));
  windowed.mods = kModWindow;
  Query at_4096 = query(t->device, t->arch, "fwd", DType::bf16, 128, true, 4096);
  Query plain = query(t->device, t->arch, "fwd", DType::bf16, 128, true, 16384);
  const Pick a = choose(ts, windowed), b = choose(ts, at_4096), c = choose(ts, plain);
  ASSERT_NE(a.family, nullptr);
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.config, b.config);
  EXPECT_NE(a.config, c.config) << "the H200 table's 4096 and 16384 causal d 128 picks differ (BLOCK_N 128, 176)";
}

// The H200 table's d 128 backward picks take fa3_wgmma_bwd's 80-row tile (dQ transposed), validated on a GPU in the
// plain form only: a call with a score modification runs the same pick at BLOCK_M 64 (Family::mods_refused), the
// plain call the 80-row tile.
TEST(RuntimeLookup, ModifiedBackwardRunsTheSixtyFourRowTile) {
  const TableSet ts = generated_tables();
  const tuned::Table* t = committed_table(ts, "NVIDIA H200");
  ASSERT_NE(t, nullptr) << "no single H200 table in the committed tables (configs/generated)";
  const Query plain = query(t->device, t->arch, "bwd", DType::bf16, 128, false, 16384);
  Query windowed = plain;
  windowed.mods = kModWindow;
  const Pick a = choose(ts, plain), b = choose(ts, windowed);
  ASSERT_NE(a.family, nullptr);
  ASSERT_EQ(a.family->name, "fa3_wgmma_bwd");
  EXPECT_EQ(a.config[0], 80) << a.family->config_string(a.config);
  ASSERT_EQ(b.family, a.family);
  Config expect = a.config;
  expect[0] = 64;
  EXPECT_EQ(b.config, expect) << b.family->config_string(b.config);
}

// Issue 31: the decode buckets are keyed by (batch x kv heads, Sk). On the committed H100 table (decode_bf16.json:
// Hq 32, Hk 8, d 128, B 1/8/64 x Sk 4k/32k/128k) B 64 at 4k keys runs its own tuned pick (SPLITS 1), not B 1's;
// other batches take the nearest tuned batch x kv heads by ratio, and explain()'s bucket text says which.
TEST(RuntimeLookup, DecodeBucketsByBatchTimesKvHeads) {
  const TableSet ts = generated_tables();
  const tuned::Table* h100 = committed_table(ts, "NVIDIA H100 80GB HBM3");
  ASSERT_NE(h100, nullptr);
  const Family& f = find_family("decode_splitkv");
  auto decode = [&](int batch, int seq_k, int heads_k = 8) {
    Query q = query(h100->device, h100->arch, "fwd", DType::bf16, 128, false, seq_k);
    q.gqa = heads_k != 32, q.seq_q = 1, q.batch_heads = (long long)batch * heads_k;
    const Pick p = choose(ts, q);
    EXPECT_EQ(p.family, &f) << batch << " x " << heads_k << " at " << seq_k;
    return p;
  };
  std::set<long long> tuned_bh;
  for (int k = 0; k < h100->count; ++k)
    if (std::string(h100->entries[k].family) == "decode_splitkv") tuned_bh.insert(h100->entries[k].batch_heads);
  EXPECT_EQ(tuned_bh, (std::set<long long>{8, 64, 512})) << "B 1, 8, 64 with 8 kv heads";
  const Pick b64 = decode(64, 4096);
  EXPECT_EQ(b64.config[0], 1) << "B 64 at 4k: the tuned B 64 pick (SPLITS 1)";
  EXPECT_EQ(b64.bucket, "batch x kv heads 512 (of 8, 64, 512), Sk <= 4096");
  const Pick b1 = decode(1, 4096);
  EXPECT_GT(b1.config[0], 1) << "B 1 at 4k: its own pick splits the keys";
  EXPECT_EQ(b1.bucket, "batch x kv heads 8 (of 8, 64, 512), Sk <= 4096");
  EXPECT_NE(b1.config, b64.config);
  // Between tuned values: the nearest by ratio, a tie to the smaller; past them, the outermost.
  EXPECT_EQ(decode(2, 4096).config, b1.config);      // 16: 2x from 8, 4x from 64
  EXPECT_EQ(decode(16, 4096).config, decode(8, 4096).config);   // 128: 2x from 64, 4x from 512
  EXPECT_EQ(decode(32, 4096).config, b64.config);    // 256: 2x from 512
  EXPECT_EQ(decode(1000, 4096).config, b64.config);
  EXPECT_EQ(decode(8, 4096, 1).config, b1.config);   // 8 sequences of one kv head: 8
  EXPECT_EQ(decode(16, 4096, 32).config, b64.config); // multi-head: batch x heads = 512
  EXPECT_EQ(decode(64, 131072).bucket, "batch x kv heads 512 (of 8, 64, 512), Sk <= 131072");
  // Unknown batch x kv heads (0): the smallest, the single-sequence pick.
  Query q = query(h100->device, h100->arch, "fwd", DType::bf16, 128, false, 4096);
  q.gqa = true, q.seq_q = 1;
  EXPECT_EQ(choose(ts, q).config, b1.config);
  // The committed tables' decoding entries are all keyed (re-emitted since), and only theirs are.
  for (int i = 0; i < ts.count; ++i)
    for (int k = 0; k < ts.tables[i].count; ++k) {
      const tuned::Entry& e = ts.tables[i].entries[k];
      EXPECT_EQ(e.batch_heads > 0, find_family(e.family).max_seq_q > 0) << ts.tables[i].device << " " << e.family;
    }
  // A general family's pick has no bucket text.
  Query prefill = query(h100->device, h100->arch, "fwd", DType::bf16, 128, false, 4096);
  prefill.seq_q = 4096, prefill.batch_heads = 64;
  const Pick g = choose(ts, prefill);
  ASSERT_NE(g.family, nullptr);
  EXPECT_EQ(g.family->max_seq_q, 0);
  EXPECT_EQ(g.bucket, "");
}

// A results store that holds rows of the decoding family for this device makes it the pick inside its range
// (as a device table entry would), with the stored config; past the range, or without the store, it is not.
TEST(RuntimeLookup, DecodeFromAResultsStore) {
  const Family& f = find_family("decode_splitkv");
  const std::string dir = temp_dir("db-decode");
  const std::string db = dir + "/results.db";
  const Config tuned = f.parse_config("SPLITS=4,BLOCK_N=128,WARPS=4,STAGES=1");
  const Config tuned64 = f.parse_config("SPLITS=1,BLOCK_N=256,WARPS=4,STAGES=1");  // B 64's: a bucket of its own
  ASSERT_NE(tuned, f.default_config);
  {
    Store s(db);
    Problem p{8, 32, 1, 4096, 128, DType::bf16, false};
    p.heads_k = 8;
    ResultRecord r = fixture::fixture_result(f.config_string(tuned), p, "ok", 0.05);
    r.family = f.name;
    s.put_result(r, fixture::fixture_device("GPU S", "sm_90"));
    p.batch = 64;
    r = fixture::fixture_result(f.config_string(tuned64), p, "ok", 0.05);
    r.family = f.name;
    s.put_result(r, fixture::fixture_device("GPU S", "sm_90"));
  }
  const TableSet none{nullptr, 0};
  Query q = query("GPU S", "sm_90", "fwd", DType::bf16, 128, false, 4096);
  q.gqa = true, q.seq_q = 1, q.batch_heads = 64;
  Pick p = choose(none, q, db);
  ASSERT_EQ(p.family, &f);
  EXPECT_EQ(p.source, "db");
  EXPECT_EQ(p.config, tuned);
  EXPECT_EQ(p.bucket, "batch x kv heads 64 (of 64, 512), Sk <= 4096");
  q.batch_heads = 512;
  EXPECT_EQ(choose(none, q, db).config, tuned64);
  q.batch_heads = 300;  // nearer 512 than 64 by ratio
  EXPECT_EQ(choose(none, q, db).config, tuned64);
  q.batch_heads = 0;  // unknown: the smallest
  EXPECT_EQ(choose(none, q, db).config, tuned);
  q.batch_heads = 64;
  EXPECT_NE(choose(none, q).family, &f);  // untabled, no store: never the ranged family
  q.gqa = false;                          // a multi-head call takes the GQA-tuned bucket too
  EXPECT_EQ(choose(none, q, db).family, &f);
  q.seq_q = f.max_seq_q + 1;
  EXPECT_NE(choose(none, q, db).family, &f);
  q.seq_q = 1, q.device = "GPU T";  // another device: nothing stored for it
  EXPECT_NE(choose(none, q, db).family, &f);
  fs::remove_all(dir);
}

// ---- paged K/V caches --------------------------------------------------------------------------------

namespace {
Query paged_query(const std::string& device, int page_size, int seq = 4096) {
  Query q = query(device, "sm_90", "fwd", DType::bf16, 128, false, seq);
  q.gqa = true, q.seq_q = 1, q.page_size = page_size;
  return q;
}
bool has_text(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }
}  // namespace

// Which families read paged caches, the longest query they take, the page sizes they read, and the config
// nearest the default for a page the default's BLOCK_N does not divide.
TEST(RuntimeLookup, PagedCandidatesPagesAndNearestConfig) {
  const Family& f = find_family("decode_splitkv");
  ASSERT_TRUE(f.paged);
  for (const char* arch : {"sm_80", "sm_90"}) {
    Query q = paged_query("X", 256);
    q.arch = arch;
    const auto cands = candidate_families(q);
    ASSERT_FALSE(cands.empty()) << arch;
    for (const Family* c : cands) EXPECT_TRUE(c->paged) << c->name;
    q.seq_q = f.max_seq_q + 1;
    EXPECT_TRUE(candidate_families(q).empty()) << "prefill never reads a paged cache";
    q.seq_q = 1, q.dtype = DType::fp32;
    EXPECT_TRUE(candidate_families(q).empty());
  }
  EXPECT_EQ(paged_max_seq_q(), f.max_seq_q);
  EXPECT_EQ(unsupported_reason("fwd", DType::fp32, 128, false, false, true), "no family runs fp32 paged K/V cache forward");
  EXPECT_EQ(unsupported_reason("fwd", DType::bf16, 96, true, false, true),
            "head_dim 96 is not supported for bf16 paged K/V cache forward with grouped-query heads (heads_k) "
            "(supported: 64, 128, 256)");
  EXPECT_EQ(unsupported_reason("fwd", DType::fp16, 64, true, false, true), "");
  // The modified backward up to d 128 (fa2_mma_bwd's mods_max_head_dim; fa3_wgmma_bwd's head dims): d 192 and 256
  // refused naming the head dims that have it; the forward's modified forms at every head dim.
  EXPECT_EQ(unsupported_reason("bwd", DType::bf16, 256, false, false, false, kModWindow),
            "head_dim 256 is not supported for bf16 backward with a sliding window (supported: 32, 64, 96, 128)");
  EXPECT_EQ(unsupported_reason("bwd", DType::bf16, 128, false, false, false, kModWindow | kModSoftcap | kModAlibi), "");
  EXPECT_EQ(unsupported_reason("fwd", DType::bf16, 256, false, false, false, kModWindow | kModSoftcap | kModAlibi), "");
  EXPECT_EQ(unsupported_reason("bwd", DType::bf16, 256, false, false, false, 0), "");
  EXPECT_FALSE(find_family("fa2_mma_bwd").has_mods(kModAlibi, 192));
  EXPECT_TRUE(find_family("fa2_mma_bwd").has_mods(0, 192));

  // The default (BLOCK_N 64) reads pages of 64 and its multiples; 32-key pages need BLOCK_N 32, which takes
  // WARPS 2 (16 keys per warp); pages of 16 or 48 keys no config reads.
  EXPECT_EQ(nearest_paged_config(f, f.default_config, 128, 64), f.default_config);
  EXPECT_EQ(nearest_paged_config(f, f.default_config, 128, 4096), f.default_config);
  const Config c32 = nearest_paged_config(f, f.default_config, 128, 32);
  EXPECT_EQ(f.config_string(c32), "SPLITS=16,BLOCK_N=32,WARPS=2,STAGES=2");
  EXPECT_EQ(nearest_paged_config(f, f.default_config, 256, 96), c32);
  EXPECT_TRUE(nearest_paged_config(f, f.default_config, 128, 16).empty());
  EXPECT_TRUE(nearest_paged_config(f, f.default_config, 128, 48).empty());
  for (int page : {32, 64, 96, 128, 160, 256, 768, 4096}) EXPECT_EQ(paged_page_reason(DType::fp16, 64, page), "") << page;
  for (int page : {1, 16, 48, 100, 4097}) {
    const std::string why = paged_page_reason(DType::bf16, 128, page);
    EXPECT_TRUE(has_text(why, "page_size " + std::to_string(page) + " is not one decode_splitkv reads (BLOCK_N must "
                                                                    "divide the page size"))
        << why;
    EXPECT_TRUE(has_text(why, "the smallest page it reads holds 32 keys")) << why;
  }
  // What runs when a config does not compile: the default, or for a paged call one that reads its pages.
  EXPECT_EQ(fallback_config(f, paged_query("X", 32)), c32);
  EXPECT_EQ(fallback_config(f, paged_query("X", 512)), f.default_config);
  EXPECT_EQ(fallback_config(f, paged_query("X", 0)), f.default_config);
}

// The config chain of a paged call, on synthetic tables: the paged entry; the dense entry when the paged one's
// BLOCK_N does not divide the page (noted); the default; the default's nearest config (noted). A paged entry
// never reaches a dense call, and never makes the decoding family a dense call's pick.
TEST(RuntimeLookup, PagedConfigChain) {
  const Family& f = find_family("decode_splitkv");
  const Config paged_cfg = f.parse_config("SPLITS=16,BLOCK_N=256,WARPS=4,STAGES=1");
  const Config dense_cfg = f.parse_config("SPLITS=8,BLOCK_N=128,WARPS=4,STAGES=1");
  tuned::Entry paged_entry = entry("decode_splitkv", "fwd", "bf16", 128, paged_cfg, 10);
  paged_entry.paged = true;
  const tuned::Entry both[] = {entry("decode_splitkv", "fwd", "bf16", 128, dense_cfg, 11), paged_entry};
  const tuned::Table tables[] = {{"GPU A", "sm_90", both, 2}};
  const TableSet ts{tables, 1};

  Pick p = choose(ts, paged_query("GPU A", 256));
  ASSERT_EQ(p.family, &f);
  EXPECT_EQ(p.config, paged_cfg);
  EXPECT_EQ(p.source, "device");
  EXPECT_EQ(p.note, "");
  p = choose(ts, paged_query("GPU B", 512));  // another device of the arch: the arch's table
  EXPECT_EQ(p.config, paged_cfg);
  EXPECT_EQ(p.source, "arch");

  p = choose(ts, paged_query("GPU A", 128));  // BLOCK_N 256 does not divide 128: the dense pick (128) does
  EXPECT_EQ(p.config, dense_cfg);
  EXPECT_EQ(p.source, "device");
  EXPECT_EQ(p.note, "tabled paged config SPLITS=16,BLOCK_N=256,WARPS=4,STAGES=1 rejected for pages of 128 keys "
                    "(BLOCK_N must divide the page size (a block of keys is read from one page)): the dense decoding "
                    "pick used");
  p = choose(ts, paged_query("GPU A", 64));  // neither divides 64: the default (BLOCK_N 64)
  EXPECT_EQ(p.config, f.default_config);
  EXPECT_EQ(p.source, "default");
  EXPECT_TRUE(has_text(p.note, "rejected for pages of 64 keys")) << p.note;
  EXPECT_TRUE(has_text(p.note, ": the default used")) << p.note;
  p = choose(ts, paged_query("GPU A", 32));  // nor the default: its nearest config that reads 32-key pages
  EXPECT_EQ(f.config_string(p.config), "SPLITS=16,BLOCK_N=32,WARPS=2,STAGES=2");
  EXPECT_EQ(p.source, "default");
  EXPECT_TRUE(has_text(p.note, ": the default's nearest config that reads pages of 32 keys used")) << p.note;

  // Without a paged entry: the dense pick, said so; untabled: the default, no note.
  const tuned::Table dense_only[] = {{"GPU A", "sm_90", both, 1}};
  p = choose(TableSet{dense_only, 1}, paged_query("GPU A", 256));
  EXPECT_EQ(p.config, dense_cfg);
  EXPECT_EQ(p.note, "no paged entry for this bucket: the dense decoding pick used");
  p = choose(TableSet{nullptr, 0}, paged_query("GPU A", 256));
  ASSERT_EQ(p.family, &f) << "the only family that reads paged caches, tabled or not";
  EXPECT_EQ(p.config, f.default_config);
  EXPECT_EQ(p.source, "default");
  EXPECT_EQ(p.note, "");

  // Dense calls: the dense entry; a table holding only the paged entry leaves decoding to the dense families.
  Query dense = paged_query("GPU A", 0);
  p = choose(ts, dense);
  EXPECT_EQ(p.family, &f);
  EXPECT_EQ(p.config, dense_cfg);
  const tuned::Table paged_only[] = {{"GPU A", "sm_90", both + 1, 1}};
  EXPECT_NE(choose(TableSet{paged_only, 1}, dense).family, &f);
  EXPECT_EQ(choose(TableSet{paged_only, 1}, paged_query("GPU A", 512)).config, paged_cfg);
}

// The committed tables' paged entries (the H100's decode_splitkv rows from decode_paged_bf16.json) are a
// paged call's pick for their bucket where their BLOCK_N divides the page, with the family's dense entry or
// default after them; a dense call of the same bucket keeps the dense entry.
TEST(RuntimeLookup, PagedFromTheCommittedTables) {
  const TableSet ts = generated_tables();
  int seen = 0;
  for (int i = 0; i < ts.count; ++i)
    for (int j = 0; j < ts.tables[i].count; ++j) {
      const tuned::Table& t = ts.tables[i];
      const tuned::Entry& e = t.entries[j];
      if (!e.paged) continue;
      ++seen;
      const Family& f = find_family(e.family);
      ASSERT_TRUE(f.paged) << e.family;
      const Config c(e.params, e.params + f.params.size());
      SCOPED_TRACE(std::string(t.device) + " " + f.config_string(c) + " seq " + std::to_string(e.seq_max));
      Query q = query(t.device, t.arch, e.direction, parse_dtype(e.dtype), e.head_dim, e.causal, e.seq_max);
      q.gqa = true, q.seq_q = 1, q.batch_heads = e.batch_heads;
      for (int page : {16, 32, 64, 128, 256, 512, 4096}) {
        q.page_size = page;
        const Pick p = choose(ts, q);
        if (!paged_page_reason(q.dtype, q.head_dim, page).empty()) continue;
        ASSERT_EQ(p.family, &f) << page;
        EXPECT_EQ(f.check(p.config, q.head_dim), nullptr) << page;
        EXPECT_EQ(f.paged_check(p.config, page), nullptr) << page;
        if (!f.paged_check(c, page)) {
          EXPECT_EQ(p.config, c) << page;
          EXPECT_EQ(p.source, "device") << page;
          EXPECT_EQ(p.note, "") << page;
        } else {
          EXPECT_TRUE(has_text(p.note, "tabled paged config " + f.config_string(c) + " rejected for pages of " +
                                           std::to_string(page) + " keys"))
              << p.note;
        }
      }
      q.page_size = 0;  // the dense call of the bucket: never the paged entry's row
      const tuned::Entry* dense =
          tuned::find_in(t, e.family, e.direction, e.dtype, e.head_dim, e.causal, e.seq_max, false, false, e.batch_heads,
                         e.group);
      if (dense) EXPECT_EQ(choose(ts, q).config, Config(dense->params, dense->params + f.params.size()));
    }
  EXPECT_GT(seen, 0) << "no paged entry in the committed tables (configs/generated)";
}

// A results store's paged rows are a paged call's first choice on that device, its dense rows the next (noted),
// and a dense call never takes a paged row.
TEST(RuntimeLookup, PagedFromAResultsStore) {
  const Family& f = find_family("decode_splitkv");
  const std::string dir = temp_dir("db-paged");
  const std::string db = dir + "/results.db";
  const Config paged_cfg = f.parse_config("SPLITS=4,BLOCK_N=256,WARPS=8,STAGES=1");
  const Config dense_cfg = f.parse_config("SPLITS=2,BLOCK_N=128,WARPS=4,STAGES=2");
  {
    Store s(db);
    Problem p{8, 32, 1, 4096, 128, DType::bf16, false};
    p.heads_k = 8;
    ResultRecord r = fixture::fixture_result(f.config_string(dense_cfg), p, "ok", 0.05);
    r.family = f.name;
    s.put_result(r, fixture::fixture_device("GPU S", "sm_90"));
    p.paged.page_size = 256;
    r = fixture::fixture_result(f.config_string(paged_cfg), p, "ok", 0.05);
    r.family = f.name;
    s.put_result(r, fixture::fixture_device("GPU S", "sm_90"));
  }
  const TableSet none{nullptr, 0};
  Pick p = choose(none, paged_query("GPU S", 256), db);
  ASSERT_EQ(p.family, &f);
  EXPECT_EQ(p.config, paged_cfg);
  EXPECT_EQ(p.source, "db");
  p = choose(none, paged_query("GPU S", 128), db);  // BLOCK_N 256 does not divide 128: the stored dense row
  EXPECT_EQ(p.config, dense_cfg);
  EXPECT_EQ(p.source, "db");
  EXPECT_TRUE(has_text(p.note, "stored paged config " + f.config_string(paged_cfg) + " rejected for pages of 128 keys"))
      << p.note;
  EXPECT_TRUE(has_text(p.note, ": the dense decoding pick used")) << p.note;
  {  // this device's stored dense pick before another device's tabled paged entry (the arch's)
    const Config other_cfg = f.parse_config("SPLITS=33,BLOCK_N=128,WARPS=4,STAGES=1");
    tuned::Entry other = entry("decode_splitkv", "fwd", "bf16", 128, other_cfg, 10);
    other.paged = true;
    const tuned::Table arch_only[] = {{"GPU X", "sm_90", &other, 1}};
    p = choose(TableSet{arch_only, 1}, paged_query("GPU S", 128), db);
    EXPECT_EQ(p.config, dense_cfg);
    EXPECT_EQ(p.source, "db");
    p = choose(TableSet{arch_only, 1}, paged_query("GPU T", 128), db);  // nothing stored for T: the arch's entry
    EXPECT_EQ(p.config, other_cfg);
    EXPECT_EQ(p.source, "arch");
  }
  p = choose(none, paged_query("GPU S", 0), db);  // dense: the dense row
  EXPECT_EQ(p.family, &f);
  EXPECT_EQ(p.config, dense_cfg);
  p = choose(none, paged_query("GPU T", 256), db);  // another device: nothing stored for it
  EXPECT_EQ(p.config, f.default_config);
  EXPECT_EQ(p.source, "default");
  fs::remove_all(dir);
}

// Packed variable-length calls: only families with a packed form, the same preference as dense, never the
// decoding family; the dense bucket's config (fa2_wgmma_bwd's LOAD 1 included: its packed form was re-validated
// on the H100), and every packed family's form takes its default.
TEST(RuntimeLookup, PackedBatches) {
  const TableSet none{nullptr, 0};
  auto packed = [](Query q) {
    q.varlen = true;
    return q;
  };
  auto name = [&](const TableSet& ts, const Query& q) {
    const Family* f = choose_family(ts, q);
    return f ? f->name : std::string("none");
  };
  for (const char* arch : {"sm_80", "sm_90"})
    for (const char* dir : {"fwd", "bwd"}) {
      Query q = packed(query("X", arch, dir, DType::bf16, 128, true, 4096));
      q.seq_q = 1;  // in the decoding range: still not a candidate (no packed form)
      const auto cands = candidate_families(q);
      EXPECT_FALSE(cands.empty()) << arch << " " << dir;
      for (const Family* f : cands) EXPECT_TRUE(f->varlen) << f->name;
    }
  EXPECT_EQ(name(none, packed(query("X", "sm_80", "fwd", DType::bf16, 128, true, 4096))), "fa2_mma");
  EXPECT_EQ(name(none, packed(query("X", "sm_90", "fwd", DType::fp16, 64, false, 512))), "fa2_mma");
  EXPECT_EQ(name(none, packed(query("X", "sm_80", "bwd", DType::bf16, 128, true, 4096))), "fa2_mma_bwd");
  EXPECT_EQ(name(none, packed(query("X", "sm_90", "bwd", DType::bf16, 128, true, 4096))), "fa2_wgmma_bwd");
  EXPECT_EQ(name(none, packed(query("X", "sm_90", "fwd", DType::fp32, 64, false, 512))), "none");
  EXPECT_NE(unsupported_reason("fwd", DType::fp32, 64, false, true).find("no family runs fp32 packed variable-length forward"),
            std::string::npos);
  EXPECT_EQ(unsupported_reason("fwd", DType::bf16, 128, true, true), "");
  // A table rating fa3_wgmma first sends a packed call there too.
  const tuned::Entry fwd[] = {entry("fa3_wgmma", "fwd", "bf16", 128, find_family("fa3_wgmma").default_config, 500),
                              entry("fa2_mma", "fwd", "bf16", 128, find_family("fa2_mma").default_config, 300)};
  const tuned::Table ft[] = {{"GPU A", "sm_90", fwd, 2}};
  EXPECT_EQ(name(TableSet{ft, 1}, packed(query("GPU A", "sm_90", "fwd", DType::bf16, 128, false, 4096))), "fa3_wgmma");

  const Family& w = find_family("fa2_wgmma_bwd");
  const Config load1 = w.parse_config("BLOCK_M=64,BLOCK_N=64,SPLIT=2,STAGES=2,DQ_RED=3,LOAD=1");
  ASSERT_EQ(w.check(load1, 128), nullptr);
  ASSERT_EQ(w.varlen_check(load1), nullptr);
  const tuned::Entry bwd[] = {entry("fa2_wgmma_bwd", "bwd", "bf16", 128, load1, 300)};
  const tuned::Table bt[] = {{"GPU A", "sm_90", bwd, 1}};
  const Query dense = query("GPU A", "sm_90", "bwd", DType::bf16, 128, false, 4096);
  Pick p = choose(TableSet{bt, 1}, dense);
  EXPECT_EQ(p.config, load1);
  EXPECT_EQ(p.source, "device");
  p = choose(TableSet{bt, 1}, packed(dense));
  EXPECT_EQ(p.family, &w);
  EXPECT_EQ(p.config, load1);
  EXPECT_EQ(p.source, "device");
  EXPECT_EQ(p.note, "");
  for (const Family& f : families())
    if (f.varlen) EXPECT_EQ(f.varlen_check(f.default_config), nullptr) << f.name;
}

TEST(RuntimeLookup, RejectedTabledConfigFallsBackToDefault) {
  // For every non-test family and head dim where some config is invalid: a table holding it.
  int cases = 0;
  for (const Family& f : families()) {
    if (f.test_only) continue;
    for (int d : f.head_dims) {
      const Config bad = rejected_config(f, d);
      if (bad.empty()) continue;
      const tuned::Entry e[] = {entry(f.name.c_str(), f.direction.c_str(), to_string(f.dtypes[0]), d, bad, 1)};
      const tuned::Table t[] = {{"GPU A", "sm_90", e, 1}};
      const Pick p = choose_config(TableSet{t, 1}, f, query("GPU A", "sm_90", f.direction, f.dtypes[0], d, false, 64));
      EXPECT_EQ(p.source, "default") << f.name << " d" << d;
      EXPECT_EQ(p.config, f.default_config);
      EXPECT_NE(p.note.find("rejected for d=" + std::to_string(d)), std::string::npos) << p.note;
      EXPECT_EQ(p.note.find('\n'), std::string::npos);
      ++cases;
    }
  }
  EXPECT_GT(cases, 0);
}

TEST(RuntimeLookup, ResultsStoreFirst) {
  const std::string dir = temp_dir("db");
  const std::string db = dir + "/results.db";
  {
    Store s(db);
    fixture::fill_fixture(s);
  }
  const Family& f = find_family("fa2_simt");
  const Query q = query("NVIDIA H100 80GB HBM3", "sm_90", "fwd", DType::fp32, 64, false, 4096);
  Pick p = choose_config(TableSet{nullptr, 0}, f, q, db);
  EXPECT_EQ(p.source, "db");
  EXPECT_EQ(f.config_string(p.config), "BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2");  // valid on both problems
  // Another device: nothing stored, the tables (none here) then the default.
  p = choose_config(TableSet{nullptr, 0}, f, query("GPU Z", "sm_90", "fwd", DType::fp32, 64, false, 4096), db);
  EXPECT_EQ(p.source, "default");
  EXPECT_THROW(choose_config(TableSet{nullptr, 0}, f, q, dir + "/missing.db"), std::exception);
  fs::remove_all(dir);
}

// ---- the user's store (user_store.hpp): its path, the lookup order, an unsafe store refused -------

namespace {
// Sets the variables for the scope, then puts back what was there.
struct EnvScope {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  void set(const std::string& name, const std::optional<std::string>& value) {
    const char* v = std::getenv(name.c_str());
    saved.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
    value ? (void)setenv(name.c_str(), value->c_str(), 1) : (void)unsetenv(name.c_str());
  }
  ~EnvScope() {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it)
      it->second ? (void)setenv(it->first.c_str(), it->second->c_str(), 1) : (void)unsetenv(it->first.c_str());
  }
};
const char kH100[] = "NVIDIA H100 80GB HBM3";
}  // namespace

TEST(RuntimeUserStore, PathFromEnvironment) {
  EXPECT_EQ(device_slug(kH100), "nvidia-h100-80gb-hbm3");  // `flashtune devices --slug`, the reports/ folders
  EXPECT_EQ(device_slug("NVIDIA H200"), "nvidia-h200");
  EXPECT_EQ(device_slug("../../etc/passwd"), "etc-passwd");  // one safe component, whatever the driver says
  EXPECT_EQ(device_slug(" !? "), "");
  const std::string long_a(300, 'a'), long_b = std::string(299, 'a') + "b";
  EXPECT_LE(device_slug(long_a).size(), 200u);
  EXPECT_NE(device_slug(long_a), device_slug(long_b));  // cut names stay apart (a hash of the whole name)
  EnvScope env;
  env.set("XDG_CACHE_HOME", "/xdg");
  env.set("HOME", "/home/u");
  EXPECT_EQ(user_store_dir(), "/xdg/flashtune");
  EXPECT_EQ(user_store_path(kH100), "/xdg/flashtune/nvidia-h100-80gb-hbm3.db");
  EXPECT_EQ(user_store_path(" !? "), "");  // no slug: no store
  setenv("XDG_CACHE_HOME", "relative/cache", 1);  // not absolute: ignored, as the XDG spec says
  EXPECT_EQ(user_store_path(kH100), "/home/u/.cache/flashtune/nvidia-h100-80gb-hbm3.db");
  setenv("XDG_CACHE_HOME", "", 1);
  EXPECT_EQ(user_store_path(kH100), "/home/u/.cache/flashtune/nvidia-h100-80gb-hbm3.db");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "relative", 1);
  EXPECT_EQ(user_store_path(kH100), "");
  unsetenv("HOME");
  EXPECT_EQ(user_store_dir(), "");
  EXPECT_EQ(store_for(kH100).path, "");  // no folder at all: no store, no note
  EXPECT_EQ(store_for(kH100).note, "");
}

// The user's store first (its family and config, source "user"), then the tables, then the default;
// $FLASHTUNE_DB, when set, instead of the user's store.
TEST(RuntimeUserStore, LookupOrder) {
  const std::string dir = temp_dir("user-store");
  EnvScope env;
  env.set("XDG_CACHE_HOME", dir);
  env.set("FLASHTUNE_DB", std::nullopt);
  const Family& simt = find_family("fa2_simt");
  const Family& fa1 = find_family("fa1_simt");
  // The tables rate fa1_simt on this H100; the user's store holds fa2_simt rows (fixture).
  const tuned::Entry dev_entries[] = {entry("fa1_simt", "fwd", "fp32", 64, fa1.default_config, 10),
                                      entry("fa1_simt", "fwd", "fp32", 32, fa1.default_config, 10)};
  const tuned::Table tables[] = {{kH100, "sm_90", dev_entries, 2}};
  const TableSet ts{tables, 1};
  const Query q = query(kH100, "sm_90", "fwd", DType::fp32, 64, false, 4096);

  StoreChoice s = store_for(kH100);  // no folder yet
  EXPECT_EQ(s.path, "");
  Pick p = choose_with_store(ts, q, s);
  EXPECT_EQ(p.family, &fa1);
  EXPECT_EQ(p.source, "device");
  EXPECT_TRUE(p.note.empty()) << p.note;

  const std::string path = user_store_path(kH100);
  EXPECT_EQ(path, dir + "/flashtune/nvidia-h100-80gb-hbm3.db");
  fs::create_directory(dir + "/flashtune");
  chmod((dir + "/flashtune").c_str(), 0700);
  EXPECT_EQ(store_for(kH100).path, "");  // the folder, no store in it
  {
    Store st(path);
    fixture::fill_fixture(st);
  }
  chmod(path.c_str(), 0600);
  s = store_for(kH100);
  EXPECT_EQ(s.path, path);
  EXPECT_TRUE(s.user);
  EXPECT_TRUE(s.note.empty()) << s.note;
  p = choose_with_store(ts, q, s);
  EXPECT_EQ(p.family, &simt) << "the store's family before the table's";
  EXPECT_EQ(p.source, "user");
  EXPECT_EQ(simt.config_string(p.config), "BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2");
  // A query the store holds nothing for (d 32): the tables; nothing tabled either (d 128): the default.
  p = choose_with_store(ts, query(kH100, "sm_90", "fwd", DType::fp32, 32, false, 4096), s);
  EXPECT_EQ(p.family, &fa1);
  EXPECT_EQ(p.source, "device");
  p = choose_with_store(ts, query(kH100, "sm_90", "fwd", DType::fp32, 128, false, 4096), s);
  EXPECT_EQ(p.source, "default");
  // Re-tuned: the identity (the plan cache's key) changes.
  const std::string before = s.identity;
  {
    Store st(path);
    st.put_result(fixture::fixture_result("BLOCK_M=64,BLOCK_N=32,TM=4,TN=4,KV_STAGES=2",
                                          Problem{1, 1, 512, 512, 64, DType::fp32, false}, "ok", 1.0),
                  fixture::fixture_device());
  }
  EXPECT_NE(store_for(kH100).identity, before);

  // $FLASHTUNE_DB instead: its store ("db"), the user's unread; one it cannot read fails the lookup.
  const std::string other = dir + "/other.db";
  { Store st(other); }
  setenv("FLASHTUNE_DB", other.c_str(), 1);
  s = store_for(kH100);
  EXPECT_EQ(s.path, other);
  EXPECT_FALSE(s.user);
  p = choose_with_store(ts, q, s);
  EXPECT_EQ(p.source, "device");  // an empty store: the tables
  setenv("FLASHTUNE_DB", path.c_str(), 1);
  EXPECT_EQ(choose_with_store(ts, q, store_for(kH100)).source, "db");
  setenv("FLASHTUNE_DB", (dir + "/missing.db").c_str(), 1);
  EXPECT_THROW(choose_with_store(ts, q, store_for(kH100)), std::exception);
  unsetenv("FLASHTUNE_DB");
  fs::remove_all(dir);
}

// $FLASHTUNE_TABLES: unset, "" or "on" reads the committed tables, "off" does not (an untabled GPU on a tabled
// one); any other value is refused in one line naming the variable. (The runtime honouring it: FakeDriver's
// HopperDecodeAndPacked, through explain().)
TEST(RuntimeUserStore, TablesSwitch) {
  EnvScope env;
  env.set("FLASHTUNE_TABLES", std::nullopt);
  EXPECT_TRUE(committed_tables_on());
  for (const char* on : {"", "on"}) {
    setenv("FLASHTUNE_TABLES", on, 1);
    EXPECT_TRUE(committed_tables_on()) << on;
  }
  setenv("FLASHTUNE_TABLES", "off", 1);
  EXPECT_FALSE(committed_tables_on());
  for (const char* bad : {"0", "OFF", "no", " off", "off\nx", "1"}) {
    setenv("FLASHTUNE_TABLES", bad, 1);
    try {
      committed_tables_on();
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("FLASHTUNE_TABLES must be on or off, not '", 0), 0u) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

// A store the runtime must not read: a link, a FIFO, a folder, a group- or world-writable file, one in a
// folder others can write, another user's: passed over for the tables with a one-line note that says
// why (and nothing is read: a FIFO does not block). A damaged store of ours: the tables, with a note.
TEST(RuntimeUserStore, UnsafeStoreIsRefused) {
  const std::string dir = temp_dir("user-store-unsafe");
  EnvScope env;
  env.set("XDG_CACHE_HOME", dir);
  env.set("FLASHTUNE_DB", std::nullopt);
  const std::string folder = dir + "/flashtune", path = user_store_path(kH100), real = dir + "/real.db";
  fs::create_directory(folder);
  chmod(folder.c_str(), 0700);
  {
    Store st(real);
    fixture::fill_fixture(st);
  }
  chmod(real.c_str(), 0600);
  const tuned::Entry dev_entries[] = {entry("fa2_simt", "fwd", "fp32", 64, find_family("fa2_simt").default_config, 1)};
  const tuned::Table tables[] = {{kH100, "sm_90", dev_entries, 1}};
  const TableSet ts{tables, 1};
  const Query q = query(kH100, "sm_90", "fwd", DType::fp32, 64, false, 4096);
  auto expect_refused = [&](const std::string& why) {
    SCOPED_TRACE(why);
    const UserStoreCheck c = check_user_store(path);
    EXPECT_TRUE(c.exists);
    EXPECT_EQ(c.why, why);
    const auto t0 = std::chrono::steady_clock::now();
    const StoreChoice s = store_for(kH100);
    EXPECT_EQ(s.path, "");
    EXPECT_NE(s.note.find(why), std::string::npos) << s.note;
    EXPECT_NE(s.note.find(path), std::string::npos) << s.note;
    EXPECT_EQ(s.note.find('\n'), std::string::npos) << s.note;
    const Pick p = choose_with_store(ts, q, s);
    EXPECT_EQ(p.source, "device");
    EXPECT_NE(p.note.find("not read"), std::string::npos) << p.note;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  };
  fs::create_symlink(real, path);
  expect_refused("is a symbolic link");
  fs::remove(path);
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  expect_refused("is not a regular file");
  fs::remove(path);
  fs::create_directory(path);
  expect_refused("is not a regular file");
  fs::remove(path);
  fs::copy_file(real, path);
  for (mode_t mode : {0620, 0602, 0666}) {
    chmod(path.c_str(), mode);
    expect_refused("is writable by group or others");
  }
  chmod(path.c_str(), 0644);  // readable by others is fine: only writers matter
  EXPECT_EQ(choose_with_store(ts, q, store_for(kH100)).source, "user");
  chmod(folder.c_str(), 01777);  // a shared folder: the file could be swapped between check and open
  expect_refused("is in a folder that is writable by others");
  chmod(folder.c_str(), 0775);
  expect_refused("is in a folder that is writable by others");
  chmod(folder.c_str(), 0700);
  if (geteuid() == 0) {  // root hands the file, then the folder, to another uid, as a second user's would be
    ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
    expect_refused("belongs to another user");
    ASSERT_EQ(chown(path.c_str(), 0, 0), 0);
    ASSERT_EQ(chown(folder.c_str(), 65534, 65534), 0);
    expect_refused("is in a folder that belongs to another user");
    ASSERT_EQ(chown(folder.c_str(), 0, 0), 0);
  }
  // Safe but damaged, empty or not a flashtune store: read fails, the tables answer, the note says so.
  for (const std::string& bytes : {std::string("not a database at all, not even close"), std::string()}) {
    fs::remove(path);
    { std::ofstream(path, std::ios::binary) << bytes; }
    chmod(path.c_str(), 0600);
    const StoreChoice s = store_for(kH100);
    EXPECT_TRUE(s.user);
    Pick p;
    EXPECT_NO_THROW(p = choose_with_store(ts, q, s));
    EXPECT_EQ(p.source, "device");
    EXPECT_NE(p.note.find("not read ("), std::string::npos) << p.note;
    EXPECT_EQ(p.note.find('\n'), std::string::npos) << p.note;
  }
  fs::remove_all(dir);
}

// ---- ahead-of-time kernels: the plan and the table's lookup (no NVRTC) ---------------------------

TEST(RuntimeAot, ArchEntries) {
  EXPECT_EQ(parse_aot_arch("80").arch, "sm_80");
  EXPECT_FALSE(parse_aot_arch("80").hopper);
  EXPECT_EQ(parse_aot_arch("90").arch, "sm_90");
  EXPECT_FALSE(parse_aot_arch("90").hopper);
  EXPECT_EQ(parse_aot_arch("90a").arch, "sm_90");  // the device's arch: the runtime's key
  EXPECT_TRUE(parse_aot_arch("90a").hopper);
  EXPECT_EQ(parse_aot_arch("sm_86").arch, "sm_86");
  for (const char* bad : {"", "a", "75", "100a", "sm_", "9x", "90aa", "../90"})
    EXPECT_THROW(parse_aot_arch(bad), UsageError) << bad;
}

TEST(RuntimeAot, FindIsExactAndAbsentFallsThrough) {
  const AotKernel kernels[] = {{"0a", "k0", 0, 4}, {"1b", "k1", 4, 0}, {"2c", "k2\nk3", 4, 3}};
  const unsigned char blob[] = "ELF!abc";
  const AotTable t{kernels, 3, blob};
  for (const AotKernel& k : kernels) EXPECT_EQ(aot_find(t, k.hash), &k);
  for (const char* absent : {"", "0", "0a0", "1a", "2d", "ff"}) EXPECT_EQ(aot_find(t, absent), nullptr) << absent;
  EXPECT_EQ(aot_find(AotTable{}, "0a"), nullptr);  // a build without AOT kernels
}

// Every config choose() can return on the arch (no $FLASHTUNE_DB), dense or packed, and its family's
// default, is in the plan; the plan has nothing else; Hopper-only families only where 90a is listed.
TEST(RuntimeAot, PlanHoldsEveryPickAndDefault) {
  const TableSet ts = generated_tables();
  std::vector<int> seqs = {1, 100, 1000, 5000, 1 << 20};
  for (int i = 0; i < ts.count; ++i)
    for (int j = 0; j < ts.tables[i].count; ++j)
      for (int d : {-1, 0, 1}) seqs.push_back(ts.tables[i].entries[j].seq_max + d);
  // Contiguous K/V (0), and paged caches of page sizes the plan does not list (it lists powers of two).
  const int page_sizes[] = {0, 16, 32, 48, 96, 160, 192, 256, 384, 768, 1000, 1280, 65536};
  // Unknown (the smallest), and values between the tables' own (8, 64, 512) that the nearest rule sends to 64 and 512.
  const std::vector<long long> decode_bh = {0, 23, 182};
  // Grouped-query calls (16-bit: no fp32 entry has a group): the groups the tables hold, and one they do not (the
  // multi-head entries serve it).
  std::set<int> group_set = {0, 3};
  for (int i = 0; i < ts.count; ++i)
    for (int j = 0; j < ts.tables[i].count; ++j)
      if (ts.tables[i].entries[j].group > 0) group_set.insert(ts.tables[i].entries[j].group);
  const std::vector<int> groups(group_set.begin(), group_set.end());
  for (const char* entry : {"80", "90", "90a"}) {
    const AotArch a = parse_aot_arch(entry);
    std::vector<std::string> devices = {"Some Other GPU"};  // and the tabled devices of this arch
    for (int i = 0; i < ts.count; ++i)
      if (ts.tables[i].arch == a.arch) devices.push_back(ts.tables[i].device);
    const Compiler compiler(a.arch);
    const AotPlan plan = aot_variants(ts, a);
    std::set<std::string> planned, needed;
    int packed = 0, paged = 0, nhd = 0;
    for (const Variant& v : plan.variants) {
      planned.insert(compiler.variant_hash(v));
      packed += v.varlen;
      paged += v.paged;
      nhd += v.page_layout == PageLayout::nhd;
      EXPECT_TRUE(v.page_layout == PageLayout::hnd || (v.paged && v.family->paged_nhd)) << v.family->name;
      EXPECT_TRUE(!v.varlen || v.family->varlen) << v.family->name;
      EXPECT_TRUE(!v.paged || v.family->paged) << v.family->name;
      EXPECT_TRUE(!v.family->hopper_only || a.hopper) << entry << " " << v.family->name;
      if (a.arch == "sm_80" && !v.paged) EXPECT_EQ(v.config, v.family->default_config) << "sm_80 has no table";
      if (a.arch == "sm_80" && v.paged)  // the default, or its nearest config for pages it cannot read
        EXPECT_TRUE(v.config == v.family->default_config ||
                    v.config == nearest_paged_config(*v.family, v.family->default_config, v.head_dim, 32))
            << v.family->config_string(v.config);
    }
    EXPECT_EQ(planned.size(), plan.variants.size()) << "duplicates";
    EXPECT_GT(packed, 0) << entry << ": packed calls' kernels";
    EXPECT_GT(paged, 0) << entry << ": paged calls' kernels";
    EXPECT_EQ(2 * nhd, paged) << entry << ": every paged kernel in both pool layouts";
    bool hopper_skipped = false;
    // Every (variant, first query that picks it): hashed once each after the sweep (a hash costs more than a pick).
    std::map<std::string, std::pair<Variant, std::string>> picked;
    for (const char* dir : {"fwd", "bwd"})
      for (DType t : {DType::fp32, DType::fp16, DType::bf16})
        for (int d : {32, 64, 96, 128, 192, 256})
          for (bool causal : {false, true})
            for (const std::string& device : devices)
              for (int seq : seqs)
                for (int seq_q : {0, 1, 16, 17})
                  for (bool varlen : {false, true})
                    for (int page : page_sizes)  // other page sizes than the plan's own
                      // decoding queries (16-bit forwards inside the decoding family's range): batch x kv heads
                      // between and past the tables' own too
                      for (long long bh : seq_q == 1 && !varlen && t != DType::fp32 && std::string(dir) == "fwd"
                                              ? decode_bh : std::vector<long long>{0})
                      for (int group : !varlen && !page && !bh && t != DType::fp32 ? groups : std::vector<int>{0}) {
                        if (varlen && page) continue;
                        // Other batch x kv heads at one page size per class of the BLOCK_Ns that divide it (32; 32,
                        // 64; up to 128; up to 256) and dense: the paged picks depend on the page through that only.
                        if (bh && page != 0 && page != 96 && page != 192 && page != 384 && page != 768) continue;
                        Query q = query(device, a.arch, dir, t, d, causal, seq);
                        q.seq_q = seq_q, q.varlen = varlen, q.page_size = page, q.batch_heads = bh;
                        q.gqa = group > 0, q.group = group;
                        const Pick p = choose(ts, q);
                        if (!p.family) continue;
                        if (p.family->hopper_only && !a.hopper) {
                          hopper_skipped = true;
                          continue;
                        }
                        // A paged call runs the same config in either pool layout: both forms are needed.
                        for (const Config& c : {p.config, fallback_config(*p.family, q)})
                        for (PageLayout layout : {PageLayout::hnd, PageLayout::nhd}) {
                          if (layout == PageLayout::nhd && !(page && p.family->paged_nhd)) continue;
                          const Variant v{p.family, c, d, causal, t, varlen, page > 0, 0, layout};
                          const std::string key = p.family->name + " " + p.family->config_string(c) + " d=" +
                                                  std::to_string(d) + " " + to_string(t) + (causal ? " causal" : "") +
                                                  (varlen ? " packed" : "") + (page ? " paged" : "") +
                                                  (layout == PageLayout::nhd ? " nhd" : "");
                          if (!picked.count(key))
                            picked.emplace(key, std::pair{v, "seq " + std::to_string(seq) + " Sq " + std::to_string(seq_q) +
                                                                 " BxHk " + std::to_string(bh) +
                                                                 (group ? " group " + std::to_string(group) : "") +
                                                                 (page ? " page " + std::to_string(page) : "") + " on " +
                                                                 device});
                        }
                      }
    for (const auto& [key, vq] : picked) {
      const std::string h = compiler.variant_hash(vq.first);
      needed.insert(h);
      EXPECT_TRUE(planned.count(h)) << entry << " " << key << " (" << vq.second << ")";
    }
    EXPECT_EQ(planned, needed) << entry << ": the plan holds variants no query picks";
    // What the build prints it leaves out: Hopper-only variants off 90a, and tabled configs a query's family
    // rejects (here: LOAD 1 for fa2_wgmma_bwd's packed form, whose default is built instead).
    bool hopper_line = false;
    for (const std::string& line : plan.skipped) {
      hopper_line = hopper_line || line.find("Hopper-only") != std::string::npos;
      EXPECT_TRUE(line.find("Hopper-only") != std::string::npos || line.find("default used") != std::string::npos)
          << line;
    }
    EXPECT_EQ(hopper_skipped, hopper_line) << entry;
  }
  // A filter narrows the queries (what the generator's test table uses).
  AotFilter filter;
  filter.families = {"fa2_simt"};
  filter.head_dims = {32};
  filter.dtypes = {DType::fp32};
  filter.causal = {0};
  const AotPlan small = aot_variants(ts, parse_aot_arch("80"), filter);
  ASSERT_EQ(small.variants.size(), 1u);
  EXPECT_EQ(small.variants[0].family->name, "fa2_simt");
  EXPECT_EQ(small.variants[0].config, find_family("fa2_simt").default_config);
}

// ---- disk cache -----------------------------------------------------------------------------------

TEST(RuntimeDiskCache, RoundTripTruncatedAndCorrupted) {
  const std::string dir = temp_dir("cache");
  const DiskCache cache(dir + "/sub/folder");  // created on first store
  const std::string key = content_hash("variant"), payload = std::string("names\0cubin", 11) + std::string(5000, 'x');
  EXPECT_FALSE(cache.load(key));
  ASSERT_TRUE(cache.store(key, payload));
  EXPECT_EQ(cache.load(key).value_or(""), payload);

  // Truncated: detected, removed, rebuilt.
  fs::resize_file(cache.path(key), fs::file_size(cache.path(key)) - 7);
  EXPECT_FALSE(cache.load(key));
  EXPECT_FALSE(fs::exists(cache.path(key)));
  ASSERT_TRUE(cache.store(key, payload));
  EXPECT_EQ(cache.load(key).value_or(""), payload);

  // One flipped byte in the payload, or in the header: detected.
  for (size_t at : {fs::file_size(cache.path(key)) - 100, (uintmax_t)3, (uintmax_t)10}) {
    ASSERT_TRUE(cache.store(key, payload));
    {
      std::fstream fh(cache.path(key), std::ios::in | std::ios::out | std::ios::binary);
      fh.seekg(at);
      char c;
      fh.get(c);
      fh.seekp(at);
      fh.put((char)(c ^ 0x20));
    }
    EXPECT_FALSE(cache.load(key)) << "byte " << at;
  }
  // Keys are hex: never a path.
  EXPECT_FALSE(cache.store("../evil", payload));
  EXPECT_FALSE(cache.load("../evil"));
  EXPECT_FALSE(DiskCache("").store(key, payload));
  fs::remove_all(dir);
}

TEST(RuntimeDiskCache, ConcurrentProcessesLeaveOneValidEntry) {
  const std::string dir = temp_dir("cache2");
  const DiskCache cache(dir);
  const std::string key = content_hash("same variant");
  const std::string payload = std::string("k\0", 2) + std::string(1 << 20, 'c');  // 1 MiB: writes interleave
  constexpr int kProcs = 4, kRounds = 20;
  pid_t pids[kProcs];
  for (int i = 0; i < kProcs; ++i) {
    pids[i] = fork();
    ASSERT_GE(pids[i], 0);
    if (pids[i] == 0) {
      bool ok = true;
      for (int r = 0; r < kRounds; ++r) {
        ok = cache.store(key, payload) && ok;
        auto got = cache.load(key);  // a reader between writers sees a whole entry
        ok = ok && got && *got == payload;
      }
      _exit(ok ? 0 : 1);
    }
  }
  for (pid_t pid : pids) {
    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(e.path().filename().string(), key + ".ftk");  // no temp file left behind
  }
  EXPECT_EQ(files, 1);
  EXPECT_EQ(cache.load(key).value_or(""), payload);
  fs::remove_all(dir);
}

TEST(RuntimeDiskCache, FolderFromEnvironment) {
  const char* keep[] = {"FLASHTUNE_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
  std::string saved[3];
  bool had[3];
  for (int i = 0; i < 3; ++i) {
    const char* v = std::getenv(keep[i]);
    had[i] = v != nullptr;
    saved[i] = v ? v : "";
  }
  setenv("FLASHTUNE_CACHE_DIR", "/a", 1);
  setenv("XDG_CACHE_HOME", "/b", 1);
  setenv("HOME", "/c", 1);
  EXPECT_EQ(DiskCache::default_dir(), "/a");
  unsetenv("FLASHTUNE_CACHE_DIR");
  EXPECT_EQ(DiskCache::default_dir(), "/b/flashtune");
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(DiskCache::default_dir(), "/c/.cache/flashtune");
  for (int i = 0; i < 3; ++i) had[i] ? (void)setenv(keep[i], saved[i].c_str(), 1) : (void)unsetenv(keep[i]);
}

// A shared folder (mode 1777, or another user's) is never a cache: anyone could plant kernels that the
// caller's process would load. default_dir passes it over for the next candidate, with a note.
TEST(RuntimeDiskCache, SharedOrForeignFolderIsNotUsed) {
  const std::string dir = temp_dir("cache-shared");
  const std::string shared = dir + "/shared", mine = dir + "/home";
  fs::create_directories(shared);
  fs::create_directories(mine);
  chmod(shared.c_str(), 01777);
  EXPECT_EQ(DiskCache::unsafe_reason(shared), "is writable by others");
  EXPECT_EQ(DiskCache::unsafe_reason(mine), "");
  EXPECT_EQ(DiskCache::unsafe_reason(dir + "/absent"), "");  // created mode 0700 on first store
  const std::string key = content_hash("planted");
  const DiskCache planted(shared);
  EXPECT_FALSE(planted.store(key, "payload"));
  {  // an entry another user left in the shared folder: never loaded
    std::ofstream(planted.path(key), std::ios::binary) << DiskCache::encode("someone else's cubin");
  }
  EXPECT_FALSE(planted.load(key));
  chmod(shared.c_str(), 0755);
  if (geteuid() == 0) {  // root can hand the folder to another uid, as a second user would own it
    ASSERT_EQ(chown(shared.c_str(), 65534, 65534), 0);
    EXPECT_EQ(DiskCache::unsafe_reason(shared), "belongs to another user");
    EXPECT_FALSE(planted.load(key));
    ASSERT_EQ(chown(shared.c_str(), 0, 0), 0);
    ASSERT_EQ(chown(planted.path(key).c_str(), 65534, 65534), 0);  // our folder, someone else's entry
    EXPECT_FALSE(planted.load(key));
    EXPECT_TRUE(fs::exists(planted.path(key)));
  }
  chmod(shared.c_str(), 01777);
  const char* saved = std::getenv("FLASHTUNE_CACHE_DIR");
  const std::string keep = saved ? saved : "";
  setenv("FLASHTUNE_CACHE_DIR", shared.c_str(), 1);
  setenv("XDG_CACHE_HOME", mine.c_str(), 1);
  EXPECT_EQ(DiskCache::default_dir(), mine + "/flashtune");
  unsetenv("XDG_CACHE_HOME");
  saved ? (void)setenv("FLASHTUNE_CACHE_DIR", keep.c_str(), 1) : (void)unsetenv("FLASHTUNE_CACHE_DIR");
  fs::remove_all(dir);
}

// An entry is read only when it is a regular file of ours of an entry's size: a FIFO does not block,
// a link is not followed (nor its target removed), an oversized file is not read.
TEST(RuntimeDiskCache, EntriesThatAreNotRegularFiles) {
  const std::string dir = temp_dir("cache-entries");
  const DiskCache cache(dir);
  ASSERT_TRUE(cache.store(content_hash("first"), "x"));  // the folder exists, mode 0700
  const std::string fifo = content_hash("fifo"), link = content_hash("link"), big = content_hash("big");
  ASSERT_EQ(mkfifo(cache.path(fifo).c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(cache.load(fifo));
  EXPECT_FALSE(cache.contains(fifo));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  const std::string target = dir + "/target";
  std::ofstream(target, std::ios::binary) << DiskCache::encode("linked cubin");
  fs::create_symlink(target, cache.path(link));
  EXPECT_FALSE(cache.load(link));
  EXPECT_TRUE(fs::exists(target));
  fs::create_symlink("/dev/zero", cache.path(content_hash("zero")));
  EXPECT_FALSE(cache.load(content_hash("zero")));
  { std::ofstream(cache.path(big), std::ios::binary) << "x"; }
  fs::resize_file(cache.path(big), (uintmax_t{1} << 30) + 4096);  // sparse: never read
  EXPECT_FALSE(cache.load(big));
  EXPECT_TRUE(fs::exists(cache.path(big)));
  // store() replaces whatever was there with a whole entry.
  ASSERT_TRUE(cache.store(link, "mine"));
  EXPECT_EQ(cache.load(link).value_or(""), "mine");
  EXPECT_TRUE(fs::exists(target));
  fs::remove_all(dir);
}

// ---- argument checks and the C ABI without a GPU -----------------------------------------------

namespace {
alignas(16) char g_fake[16];  // a non-null pointer: checks never dereference it

ft_tensor contiguous(int64_t h, int64_t s, int64_t d) { return ft_tensor{g_fake, {h * s * d, s * d, d, 1}}; }

ft_forward_args good_forward() {
  ft_forward_args a{};
  a.batch = 2, a.heads = 3, a.seq_q = 130, a.seq_k = 200, a.head_dim = 64, a.dtype = FT_BF16, a.causal = 1;
  a.q = a.o = contiguous(3, 130, 64);
  a.k = a.v = contiguous(3, 200, 64);
  return a;
}
ft_backward_args good_backward() {
  ft_backward_args a{};
  a.batch = 2, a.heads = 3, a.seq_q = 130, a.seq_k = 200, a.head_dim = 64, a.dtype = FT_FP32;
  a.q = a.o = a.dout = a.dq = contiguous(3, 130, 64);
  a.k = a.v = a.dk = a.dv = contiguous(3, 200, 64);
  a.lse = reinterpret_cast<const float*>(g_fake);
  return a;
}
void expect_one_line(const std::string& s) {
  EXPECT_FALSE(s.empty());
  EXPECT_EQ(s.find('\n'), std::string::npos) << s;
}

// An edit of a valid argument struct and how the library must refuse it.
template <class A>
struct Refusal {
  void (*edit)(A&);
  ft_status want;
  const char* says;  // a part of the one-line message
};
// Each edit of `good` is refused with its status and a one-line message naming the problem, by the argument
// check and through the C ABI alike (the call, explain and explain_text), before any driver call.
template <class A, size_t N>
void expect_refusals(const A& good, const Refusal<A> (&cases)[N], Check (*check)(const A*),
                     ft_status (*call)(const A*, void*), ft_status (*explain)(const A*, ft_explanation*),
                     ft_status (*explain_text)(const A*, char*, size_t)) {
  for (const Refusal<A>& c : cases) {
    A a = good;
    c.edit(a);
    const Check k = check(&a);
    EXPECT_EQ(k.status, c.want) << c.says;
    EXPECT_NE(k.message.find(c.says), std::string::npos) << k.message;
    expect_one_line(k.message);
    EXPECT_EQ(call(&a, nullptr), c.want);
    EXPECT_EQ(std::string(ft_last_error()), k.message);
    ft_explanation e;
    EXPECT_EQ(explain(&a, &e), c.want);
    char buf[64];
    EXPECT_EQ(explain_text(&a, buf, sizeof buf), c.want);
  }
}
}  // namespace

TEST(RuntimeArgs, ForwardChecks) {
  EXPECT_EQ(check_forward(nullptr).status, FT_INVALID_ARGUMENT);
  EXPECT_EQ(check_forward(&(const ft_forward_args&)good_forward()).status, FT_OK);
  const Refusal<ft_forward_args> cases[] = {
      {[](ft_forward_args& a) { a.q.data = nullptr; }, FT_INVALID_ARGUMENT, "q.data is null"},
      {[](ft_forward_args& a) { a.o.data = nullptr; }, FT_INVALID_ARGUMENT, "o.data is null"},
      {[](ft_forward_args& a) { a.batch = 0; }, FT_INVALID_ARGUMENT, "batch must be positive"},
      {[](ft_forward_args& a) { a.seq_k = -3; }, FT_INVALID_ARGUMENT, "seq_k must be positive"},
      {[](ft_forward_args& a) { a.head_dim = 80; }, FT_UNSUPPORTED, "head_dim 80 is not supported for bf16 forward"},
      {[](ft_forward_args& a) { a.dtype = FT_FP32, a.head_dim = 256; }, FT_UNSUPPORTED, "(supported: 32, 64, 96, 128)"},
      {[](ft_forward_args& a) { a.dtype = (ft_dtype)7; }, FT_INVALID_ARGUMENT, "dtype 7"},
      {[](ft_forward_args& a) { a.scale = 1.0f / 0.0f; }, FT_INVALID_ARGUMENT, "scale is not finite"},
      {[](ft_forward_args& a) { a.k.stride[2] = -64; }, FT_INVALID_ARGUMENT, "k.stride[2] is negative"},
      {[](ft_forward_args& a) { a.o.stride[2] = 0; }, FT_INVALID_ARGUMENT, "o has overlapping strides"},
      {[](ft_forward_args& a) { a.o.stride[1] = 64; }, FT_INVALID_ARGUMENT, "o has overlapping strides"},
      // Score modifications (ft_mods): the fields, then a family that has them
      {[](ft_forward_args& a) { a.mods.window = 2; }, FT_INVALID_ARGUMENT, "mods.window must be 0 (none) or 1, got 2"},
      {[](ft_forward_args& a) { a.mods = ft_mods{1, -2, 0, 0}; }, FT_INVALID_ARGUMENT,
       "mods.window_left must be -1 (unbounded) or a key count in 0..1073741824, got -2"},
      {[](ft_forward_args& a) { a.mods = ft_mods{1, 0, 1 << 30 | 1, 0}; }, FT_INVALID_ARGUMENT, "mods.window_right"},
      {[](ft_forward_args& a) { a.mods.softcap = 0.0f / 0.0f; }, FT_INVALID_ARGUMENT, "mods.softcap must be 0 (off)"},
      {[](ft_forward_args& a) { a.mods.softcap = -30; }, FT_INVALID_ARGUMENT, "mods.softcap must be 0 (off)"},
      {[](ft_forward_args& a) { a.dtype = FT_FP32, a.mods = ft_mods{1, 128, -1, 0}; }, FT_UNSUPPORTED,
       "no family runs fp32 forward with a sliding window"},
      {[](ft_forward_args& a) { a.dtype = FT_FP32, a.mods.softcap = 30; }, FT_UNSUPPORTED,
       "no family runs fp32 forward with a softcap"},
      {[](ft_forward_args& a) { a.dtype = FT_FP32, a.mods = ft_mods{1, 128, 0, 30}; }, FT_UNSUPPORTED,
       "no family runs fp32 forward with a sliding window and a softcap"},
      // ALiBi: aligned fp32 slopes, a batch stride of 0 or at least heads, and a family that has them
      {[](ft_forward_args& a) { a.mods.alibi_slopes = reinterpret_cast<const float*>(uintptr_t{0x1002}); },
       FT_INVALID_ARGUMENT, "mods.alibi_slopes must be 4-byte aligned"},
      {[](ft_forward_args& a) { a.mods.alibi_slopes = reinterpret_cast<const float*>(uintptr_t{0x1000}), a.mods.alibi_batch_stride = 1; },
       FT_INVALID_ARGUMENT, "mods.alibi_batch_stride must be 0 (slopes [H]) or in heads"},
      {[](ft_forward_args& a) { a.mods.alibi_slopes = reinterpret_cast<const float*>(uintptr_t{0x1000}), a.mods.alibi_batch_stride = -4; },
       FT_INVALID_ARGUMENT, "mods.alibi_batch_stride"},
      {[](ft_forward_args& a) { a.mods.alibi_batch_stride = 16; }, FT_INVALID_ARGUMENT,
       "mods.alibi_batch_stride 16 without mods.alibi_slopes"},
      {[](ft_forward_args& a) { a.dtype = FT_FP32, a.mods.alibi_slopes = reinterpret_cast<const float*>(uintptr_t{0x1000}); },
       FT_UNSUPPORTED, "no family runs fp32 forward with ALiBi slopes"},
      {[](ft_forward_args& a) { a.dtype = FT_FP32, a.mods = ft_mods{0, 0, 0, 30, reinterpret_cast<const float*>(uintptr_t{0x1000}), 0}; },
       FT_UNSUPPORTED, "no family runs fp32 forward with a softcap and ALiBi slopes"},
  };
  expect_refusals(good_forward(), cases, check_forward, ft_attention_forward, ft_explain_forward, ft_explain_forward_text);
  {  // a window the Hopper forward has passes the checks; window 0 ignores the edges; both edges -1 is none
    ft_forward_args m = good_forward();
    m.mods = ft_mods{1, 4096, -1, 50};
    EXPECT_EQ(check_forward(&m).status, FT_OK) << check_forward(&m).message;
    m.mods = ft_mods{0, -7, 99, 0};
    EXPECT_EQ(check_forward(&m).status, FT_OK) << check_forward(&m).message;
    m.dtype = FT_FP32, m.mods = ft_mods{1, -1, -1, 0};
    EXPECT_EQ(check_forward(&m).status, FT_OK) << check_forward(&m).message;
    m = good_forward();  // ALiBi slopes [H] and [B, H] (any stride >= heads) on the Hopper forward
    m.mods.alibi_slopes = reinterpret_cast<const float*>(uintptr_t{0x1000});
    EXPECT_EQ(check_forward(&m).status, FT_OK) << check_forward(&m).message;
    m.mods.alibi_batch_stride = m.heads + 3;
    EXPECT_EQ(check_forward(&m).status, FT_OK) << check_forward(&m).message;
  }
  // Inputs may broadcast (stride 0); transposed outputs are fine.
  ft_forward_args a = good_forward();
  a.k.stride[1] = 0;
  a.o.stride[1] = 64, a.o.stride[2] = 3 * 64;
  EXPECT_EQ(check_forward(&a).status, FT_OK);
  EXPECT_FALSE(is_contiguous(tensor_args(&a)[3]));
  const ft_forward_args g = good_forward();
  EXPECT_TRUE(is_contiguous(tensor_args(&g)[3]));
}

// mask_mod (ft_mask_mod, ABI 0.8): the struct's fields, the predicate's checks and NVRTC's compile of it (one line,
// FT_INVALID_ARGUMENT), then the call's: not with a window, nor a deterministic backward, a family that has it;
// ft_check_mask_mod alone. No GPU: every refusal comes before the driver.
TEST(RuntimeArgs, MaskModChecks) {
  static const int32_t* const dev = reinterpret_cast<const int32_t*>(uintptr_t{0x1000});
  auto mask = [](const char* text, std::vector<const char*> names = {}) {
    ft_mask_mod m{};
    m.struct_size = sizeof m;
    m.predicate = text;
    m.num_tensors = (int)names.size();
    for (size_t i = 0; i < names.size(); ++i) m.names[i] = names[i], m.tensors[i] = dev, m.lengths[i] = 128;
    return m;
  };
  auto status = [](const ft_mask_mod& m) { return ft_check_mask_mod(&m); };
  const ft_mask_mod doc = mask("doc[q_idx] == doc[kv_idx]", {"doc"});
  EXPECT_EQ(status(doc), FT_OK) << ft_last_error();
  EXPECT_EQ(ft_check_mask_mod(nullptr), FT_INVALID_ARGUMENT);
  struct Case {
    ft_mask_mod m;
    ft_status want;
    const char* says;
  };
  ft_mask_mod old_size = doc;
  old_size.struct_size = 8;
  ft_mask_mod unaligned = doc;
  unaligned.tensors[0] = reinterpret_cast<const int32_t*>(uintptr_t{0x1002});
  ft_mask_mod no_len = doc;
  no_len.lengths[0] = 0;
  ft_mask_mod no_name = doc;
  no_name.names[0] = nullptr;
  ft_mask_mod too_many = doc;
  too_many.num_tensors = 5;
  const Case cases[] = {
      {old_size, FT_INVALID_ARGUMENT, "mask_mod.struct_size 8 is below sizeof(ft_mask_mod)"},
      {unaligned, FT_INVALID_ARGUMENT, "mask_mod tensor 0 ('doc') must be 4-byte aligned"},
      {no_len, FT_INVALID_ARGUMENT, "length 0 is outside 1..2^31-1"},
      {no_name, FT_INVALID_ARGUMENT, "mask_mod tensor 0: its name is null"},
      {too_many, FT_INVALID_ARGUMENT, "mask_mod.num_tensors must be 0..4, got 5"},
      {mask("#include <cstdio>\nreturn true;"), FT_INVALID_ARGUMENT, "mask_mod may not hold '#'"},
      {mask("return 1; } void f() {"), FT_INVALID_ARGUMENT, "mask_mod has an unbalanced '}'"},
      {mask("return true;", {"doc"}), FT_INVALID_ARGUMENT, "mask_mod tensor 'doc' is not read by the predicate"},
      {mask("dox[q_idx] == doc[kv_idx]", {"doc"}), FT_INVALID_ARGUMENT,
       "mask_mod does not compile: identifier \"dox\" is undefined (at column 1"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(status(c.m), c.want) << c.says;
    EXPECT_NE(std::string(ft_last_error()).find(c.says), std::string::npos) << ft_last_error();
    expect_one_line(ft_last_error());
    ft_forward_args a = good_forward();
    a.mask_mod = &c.m;
    const Check k = check_forward(&a);
    EXPECT_EQ(k.status, c.want);
    EXPECT_NE(k.message.find(c.says), std::string::npos) << k.message;
    EXPECT_EQ(ft_attention_forward(&a, nullptr), c.want);
  }
  ft_forward_args f = good_forward();  // bf16 d 64 (the Hopper forward's): a mask passes
  f.mask_mod = &doc;
  EXPECT_EQ(check_forward(&f).status, FT_OK) << check_forward(&f).message;
  f.mods = ft_mods{1, 128, -1, 0};
  EXPECT_EQ(check_forward(&f).status, FT_INVALID_ARGUMENT);
  EXPECT_NE(check_forward(&f).message.find("mask_mod and a window (mods.window) do not combine"), std::string::npos);
  f = good_forward();
  f.mask_mod = &doc, f.dtype = FT_FP32;
  EXPECT_EQ(check_forward(&f).status, FT_UNSUPPORTED);
  EXPECT_NE(check_forward(&f).message.find("no family runs fp32 forward with a mask_mod"), std::string::npos)
      << check_forward(&f).message;
  ft_backward_args b = good_backward();
  b.mask_mod = &doc, b.dtype = FT_BF16;
  EXPECT_EQ(check_backward(&b).status, FT_OK) << check_backward(&b).message;
  b.deterministic = 1;
  EXPECT_EQ(check_backward(&b).status, FT_UNSUPPORTED);
  EXPECT_NE(check_backward(&b).message.find("a deterministic backward has no mask_mod form"), std::string::npos);
}

// Dense calls past the kernels' 32-bit indexing run in batch chunks that each fit (batch_chunk, batch_slice),
// where nothing else is wrong with them: the decode shape of issue 31 (B 64 x 8 kv heads x Sk 128k x d 128:
// k has 8.6e9 elements, one batch 134M, so 15 batches a chunk), a backward whose dq accumulator alone passes.
TEST(RuntimeArgs, BatchChunks) {
  static char base[16];
  auto at = [](int64_t h, int64_t s, int64_t d) { return ft_tensor{base, {h * s * d, s * d, d, 1}}; };
  ft_forward_args f{};
  f.batch = 64, f.heads = 32, f.heads_k = 8, f.seq_q = 1, f.seq_k = 131072, f.head_dim = 128, f.dtype = FT_BF16;
  f.q = f.o = at(32, 1, 128);
  f.k = f.v = at(8, 131072, 128);
  f.lse = reinterpret_cast<float*>(base);
  EXPECT_NE(check_forward(&f).message.find("k has over 2^31 elements"), std::string::npos) << check_forward(&f).message;
  EXPECT_EQ(check_forward(&f, false).status, FT_OK);
  const int64_t one = 8LL * 131072 * 128;  // k's elements per batch
  const int per = batch_chunk(&f);
  EXPECT_EQ(per, (int)(((1LL << 31) - 1) / one));  // n batches' elements within 2^31 - 1
  EXPECT_EQ(per, 15);
  for (int b0 = 0; b0 < f.batch; b0 += per) {
    const int n = std::min(per, f.batch - b0);
    const ft_forward_args s = batch_slice(f, b0, n);
    EXPECT_EQ(check_forward(&s).status, FT_OK) << check_forward(&s).message;
    EXPECT_EQ(s.batch, n);
    EXPECT_EQ(static_cast<char*>(s.k.data) - base, b0 * one * 2);             // bf16: 2 bytes an element
    EXPECT_EQ(static_cast<char*>(s.q.data) - base, b0 * 32LL * 128 * 2);
    EXPECT_EQ(s.lse - reinterpret_cast<float*>(base), b0 * 32LL);              // [B, H, Sq] fp32
    EXPECT_EQ(s.k.stride[0], f.k.stride[0]);
  }
  // Not chunked: one batch alone past 2^31 elements, a stride past 2^31, or anything else wrong besides.
  ft_forward_args big = f;
  big.batch = 1, big.heads_k = 1, big.heads = 1, big.seq_k = 1 << 24;
  big.k = big.v = at(1, 1 << 24, 128);
  big.q = big.o = at(1, 1, 128);
  EXPECT_EQ(batch_chunk(&big), 0);
  EXPECT_EQ(ft_attention_forward(&big, nullptr), FT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ft_last_error()).find("k.stride[0] is over 2^31"), std::string::npos) << ft_last_error();
  ft_forward_args far = f;
  far.k.stride[0] = 1LL << 32;
  EXPECT_EQ(batch_chunk(&far), 0);
  ft_forward_args alias = f;
  alias.o.stride[0] = 0;  // every batch's output at one address: refused whole, never split into chunks
  EXPECT_NE(check_forward(&alias, false).message.find("o has overlapping strides"), std::string::npos);
  EXPECT_EQ(ft_attention_forward(&alias, nullptr), FT_INVALID_ARGUMENT);  // the call's own first refusal
  EXPECT_NE(std::string(ft_last_error()).find("k has over 2^31 elements"), std::string::npos) << ft_last_error();
  // A call that fits is its own chunk.
  const ft_forward_args small = good_forward();
  EXPECT_EQ(batch_chunk(&small), small.batch);

  // The backward: q, dq and the dq accumulator (B H Sq d) at exactly 2^31 elements; 63 batches, then 1.
  ft_backward_args b{};
  b.batch = 64, b.heads = 32, b.heads_k = 8, b.seq_q = 8192, b.seq_k = 8192, b.head_dim = 128, b.dtype = FT_BF16;
  b.q = b.o = b.dout = b.dq = at(32, 8192, 128);
  b.k = b.v = b.dk = b.dv = at(8, 8192, 128);
  b.lse = reinterpret_cast<const float*>(base);
  EXPECT_NE(check_backward(&b).message.find("over 2^31"), std::string::npos) << check_backward(&b).message;
  EXPECT_EQ(check_backward(&b, false).status, FT_OK);
  const int bper = batch_chunk(&b);
  EXPECT_EQ(bper, (int)(((1LL << 31) - 1) / (32LL * 8192 * 128)));  // 63 of 64
  EXPECT_GE(bper, 1);
  const ft_backward_args bs = batch_slice(b, bper, b.batch - bper);
  EXPECT_EQ(check_backward(&bs).status, FT_OK) << check_backward(&bs).message;
  EXPECT_EQ(static_cast<const char*>(bs.dv.data) - base, bper * 8LL * 8192 * 128 * 2);
  EXPECT_EQ(bs.lse - reinterpret_cast<const float*>(base), bper * 32LL * 8192);
}

TEST(RuntimeArgs, BackwardChecks) {
  ft_backward_args a = good_backward();
  EXPECT_EQ(check_backward(&a).status, FT_OK);
  a.lse = nullptr;
  EXPECT_EQ(check_backward(&a).status, FT_INVALID_ARGUMENT);
  EXPECT_EQ(ft_attention_backward(&a, nullptr), FT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ft_last_error()).find("lse is null"), std::string::npos);
  a = good_backward();
  a.dv.data = nullptr;
  EXPECT_NE(check_backward(&a).message.find("dv.data is null"), std::string::npos);
  a = good_backward();
  a.dtype = FT_FP16, a.head_dim = 48;
  EXPECT_EQ(check_backward(&a).status, FT_UNSUPPORTED);
  EXPECT_NE(check_backward(&a).message.find("fp16 backward"), std::string::npos);
  size_t bytes = 0;
  EXPECT_EQ(ft_backward_workspace_bytes(&a, &bytes), FT_UNSUPPORTED);
  EXPECT_EQ(ft_backward_workspace_bytes(&a, nullptr), FT_INVALID_ARGUMENT);
  a = good_backward();  // the forward's modifications, checked as the forward's
  a.mods = ft_mods{1, 64, -1, 0};
  EXPECT_EQ(check_backward(&a).status, FT_UNSUPPORTED);
  EXPECT_NE(check_backward(&a).message.find("no family runs fp32 backward with a sliding window"), std::string::npos)
      << check_backward(&a).message;
  a.mods = ft_mods{3, 64, -1, 0};
  EXPECT_NE(check_backward(&a).message.find("mods.window must be 0 (none) or 1"), std::string::npos);
}

// ---- packed variable-length batches: argument checks and the host's stand-in lengths -------------

namespace {
alignas(16) int32_t g_cu[8];
ft_packed_tensor packed_contiguous(int64_t h, int64_t d) { return ft_packed_tensor{g_fake, {h * d, d, 1}}; }
ft_varlen_forward_args good_varlen_forward() {
  ft_varlen_forward_args a{};
  a.batch = 3, a.heads = 8, a.heads_k = 2, a.head_dim = 128;
  a.total_q = 300, a.total_k = 500, a.max_seqlen_q = 200, a.max_seqlen_k = 300;
  a.cu_seqlens_q = a.cu_seqlens_k = g_cu;
  a.dtype = FT_BF16, a.causal = 1;
  a.q = a.o = packed_contiguous(8, 128);
  a.k = a.v = packed_contiguous(2, 128);
  return a;
}
ft_varlen_backward_args good_varlen_backward() {
  const ft_varlen_forward_args f = good_varlen_forward();
  ft_varlen_backward_args a{};
  a.batch = f.batch, a.heads = f.heads, a.heads_k = f.heads_k, a.head_dim = f.head_dim;
  a.total_q = f.total_q, a.total_k = f.total_k, a.max_seqlen_q = f.max_seqlen_q, a.max_seqlen_k = f.max_seqlen_k;
  a.cu_seqlens_q = a.cu_seqlens_k = g_cu;
  a.dtype = FT_FP16;
  a.q = a.o = a.dout = a.dq = packed_contiguous(8, 128);
  a.k = a.v = a.dk = a.dv = packed_contiguous(2, 128);
  a.lse = reinterpret_cast<const float*>(g_fake);
  return a;
}
}  // namespace

TEST(RuntimeArgs, VarlenForwardChecks) {
  EXPECT_EQ(check_varlen_forward(nullptr).status, FT_INVALID_ARGUMENT);
  const ft_varlen_forward_args good = good_varlen_forward();
  EXPECT_EQ(check_varlen_forward(&good).status, FT_OK) << check_varlen_forward(&good).message;
  const Refusal<ft_varlen_forward_args> cases[] = {
      {[](ft_varlen_forward_args& a) { a.cu_seqlens_q = nullptr; }, FT_INVALID_ARGUMENT, "cu_seqlens_q is null"},
      {[](ft_varlen_forward_args& a) { a.cu_seqlens_k = reinterpret_cast<const int32_t*>(g_fake + 2); },
       FT_INVALID_ARGUMENT, "cu_seqlens_k is not 4-byte aligned"},
      {[](ft_varlen_forward_args& a) { a.batch = 0; }, FT_INVALID_ARGUMENT, "batch must be positive, got 0"},
      {[](ft_varlen_forward_args& a) { a.batch = 65536; }, FT_INVALID_ARGUMENT, "batch 65536 is over 65535 sequences"},
      {[](ft_varlen_forward_args& a) { a.total_q = 601; }, FT_INVALID_ARGUMENT,
       "total_q 601 is more than batch 3 x max_seqlen_q 200"},
      {[](ft_varlen_forward_args& a) { a.max_seqlen_k = 166; }, FT_INVALID_ARGUMENT,
       "total_k 500 is more than batch 3 x max_seqlen_k 166"},
      {[](ft_varlen_forward_args& a) { a.max_seqlen_k = 0; }, FT_INVALID_ARGUMENT, "max_seqlen_k must be positive"},
      {[](ft_varlen_forward_args& a) { a.total_k = (1 << 24) + 1; }, FT_INVALID_ARGUMENT, "total_k 16777217 is over 2^24"},
      {[](ft_varlen_forward_args& a) { a.max_seqlen_q = 1 << 20, a.total_q = 1 << 21; }, FT_INVALID_ARGUMENT,
       "q has over 2^31 elements"},
      {[](ft_varlen_forward_args& a) { a.dtype = FT_FP32; }, FT_UNSUPPORTED,
       "no family runs fp32 packed variable-length forward"},
      {[](ft_varlen_forward_args& a) { a.head_dim = 80; }, FT_UNSUPPORTED,
       "head_dim 80 is not supported for bf16 packed variable-length forward with grouped-query heads"},
      {[](ft_varlen_forward_args& a) { a.heads_k = 3; }, FT_INVALID_ARGUMENT, "heads_k 3 must be 0 or divide heads 8"},
      {[](ft_varlen_forward_args& a) { a.scale = std::nanf(""); }, FT_INVALID_ARGUMENT, "scale is not finite"},
      {[](ft_varlen_forward_args& a) { a.k.data = nullptr; }, FT_INVALID_ARGUMENT, "k.data is null"},
      {[](ft_varlen_forward_args& a) { a.q.stride[1] = -128; }, FT_INVALID_ARGUMENT, "q.stride[1] is negative"},
      {[](ft_varlen_forward_args& a) { a.v.stride[2] = 1ll << 32; }, FT_INVALID_ARGUMENT, "v.stride[2] is over 2^31"},
      {[](ft_varlen_forward_args& a) { a.o.stride[0] = 128; }, FT_INVALID_ARGUMENT, "o has overlapping strides"},
      {[](ft_varlen_forward_args& a) { a.lse = reinterpret_cast<float*>(g_fake + 1); }, FT_INVALID_ARGUMENT,
       "lse is not 4-byte aligned"},
  };
  expect_refusals(good_varlen_forward(), cases, check_varlen_forward, ft_attention_varlen_forward, ft_explain_varlen_forward, ft_explain_varlen_forward_text);
  // Multi-head (heads_k 0), a longest length past the total (a loose bound: the grid is larger), inputs
  // with other strides (q of a packed qkv projection: tokens 3*H*d apart), a broadcast k head: accepted;
  // such a tensor is packed to contiguous scratch, a contiguous 16-byte aligned one goes straight in.
  ft_varlen_forward_args a = good_varlen_forward();
  a.heads_k = 0, a.k = a.v = packed_contiguous(8, 128);
  a.max_seqlen_q = 1000;
  a.q.stride[0] = 3 * 8 * 128;
  a.k.stride[1] = 0;
  EXPECT_EQ(check_varlen_forward(&a).status, FT_OK) << check_varlen_forward(&a).message;
  EXPECT_FALSE(direct(tensor_args(&a)[0]));
  EXPECT_TRUE(direct(tensor_args(&a)[3]));
  const TensorArg q = tensor_args(&a)[0];  // [total, H, d] seen as [total, H, 1, d]: token-major when packed
  EXPECT_EQ(std::vector<int64_t>(q.ext, q.ext + 4), (std::vector<int64_t>{300, 8, 1, 128}));
  EXPECT_EQ(std::vector<int64_t>(q.stride, q.stride + 4), (std::vector<int64_t>{3 * 8 * 128, 128, 0, 1}));
}

TEST(RuntimeArgs, VarlenBackwardChecks) {
  ft_varlen_backward_args a = good_varlen_backward();
  EXPECT_EQ(check_varlen_backward(&a).status, FT_OK) << check_varlen_backward(&a).message;
  a.lse = nullptr;
  EXPECT_EQ(ft_attention_varlen_backward(&a, nullptr), FT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ft_last_error()).find("lse is null"), std::string::npos);
  a = good_varlen_backward();
  a.dk.stride[1] = 0;  // an output whose heads share memory
  EXPECT_EQ(ft_attention_varlen_backward(&a, nullptr), FT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ft_last_error()).find("dk has overlapping strides"), std::string::npos) << ft_last_error();
  a = good_varlen_backward();
  a.dout.data = nullptr;
  EXPECT_NE(check_varlen_backward(&a).message.find("dout.data is null"), std::string::npos);
  a = good_varlen_backward();
  a.head_dim = 48;
  EXPECT_EQ(check_varlen_backward(&a).status, FT_UNSUPPORTED);
  EXPECT_NE(check_varlen_backward(&a).message.find("fp16 packed variable-length backward"), std::string::npos);
  size_t bytes = 0;
  EXPECT_EQ(ft_varlen_backward_workspace_bytes(&a, &bytes), FT_UNSUPPORTED);
  a = good_varlen_backward();
  EXPECT_EQ(ft_varlen_backward_workspace_bytes(&a, nullptr), FT_INVALID_ARGUMENT);
  EXPECT_STREQ(ft_last_error(), "bytes is null");
  EXPECT_EQ(check_varlen_backward(nullptr).status, FT_INVALID_ARGUMENT);
}

// The runtime never sees a packed batch's lengths (they are in device memory): its Problem carries
// stand-in lengths with the call's count, totals and longest lengths (host_lengths). Every family with a
// packed form must then launch, size its workspace and describe its tensor maps exactly as for the real
// lengths, for any lengths with those totals: a family that reads the per-sequence lengths on the host fails.
TEST(RuntimeArgs, HostLengthsStandInForTheDeviceOnes) {
  EXPECT_EQ(host_lengths(4, 10, 3), (std::vector<int>{3, 3, 3, 1}));
  EXPECT_EQ(host_lengths(3, 9, 3), (std::vector<int>{3, 3, 3}));
  EXPECT_EQ(host_lengths(2, 1, 5), (std::vector<int>{1, 0}));
  const std::vector<std::pair<std::vector<int>, std::vector<int>>> batches = {
      {{17, 0, 300, 5, 129}, {40, 7, 300, 0, 512}},  // ragged, empty sequences, cross-attention lengths
      {{1000}, {1000}},
      {{64, 64, 64, 64, 64, 64, 64, 64}, {1, 2, 3, 4, 5, 6, 7, 2000}}};
  int checked = 0;
  for (const Family& f : families()) {
    if (!f.varlen || f.test_only) continue;
    for (const auto& [lq, lk] : batches)
      for (int heads_k : {0, 2}) {
        Problem real;
        real.batch = (int)lq.size(), real.heads = 8, real.heads_k = heads_k, real.head_dim = 128;
        real.dtype = DType::bf16, real.causal = true, real.direction = f.direction, real.sm_count = 132;
        real.seq_q = *std::max_element(lq.begin(), lq.end());
        real.seq_k = *std::max_element(lk.begin(), lk.end());
        real.varlen.lengths = "list", real.varlen.seq_lens_q = lq, real.varlen.seq_lens_k = lk;
        Problem host = real;
        host.varlen.seq_lens_q = host_lengths(real.batch, (int)real.varlen.total_q(), real.seq_q);
        host.varlen.seq_lens_k = host_lengths(real.batch, (int)real.varlen.total_k(), real.seq_k);
        ASSERT_EQ(host.varlen.total_q(), real.varlen.total_q());
        ASSERT_EQ(host.varlen.total_k(), real.varlen.total_k());
        std::vector<Config> configs = {f.default_config};
        for (size_t i = 0; i < f.params.size(); ++i)
          for (int v : f.params[i].domain) {  // each value of each tunable once, where valid
            Config c = f.default_config;
            c[i] = v;
            if (!f.check(c, 128) && !f.varlen_check(c)) configs.push_back(c);
          }
        for (const Config& c : configs) {
          SCOPED_TRACE(f.name + " " + f.config_string(c) + " " + real.str());
          const auto lr = f.launches(c, real), lh = f.launches(c, host);
          ASSERT_EQ(lr.size(), lh.size());
          for (size_t i = 0; i < lr.size(); ++i) {
            EXPECT_EQ(std::vector<unsigned>(lr[i].grid, lr[i].grid + 3), std::vector<unsigned>(lh[i].grid, lh[i].grid + 3));
            EXPECT_EQ(lr[i].threads, lh[i].threads);
            EXPECT_EQ(lr[i].smem_bytes, lh[i].smem_bytes);
          }
          EXPECT_EQ(f.workspace_bytes(c, real), f.workspace_bytes(c, host));
          const auto sr = f.tensor_maps(c, real), sh = f.tensor_maps(c, host);
          ASSERT_EQ(sr.size(), sh.size());
          if (!sr.empty()) {
            const AttnTensorMaps mr = encode_tensor_maps(&record_tensor_map, sr, real, {0x1000, 0x2000, 0x3000, 0x4000});
            const AttnTensorMaps mh = encode_tensor_maps(&record_tensor_map, sh, host, {0x1000, 0x2000, 0x3000, 0x4000});
            EXPECT_EQ(std::memcmp(&mr, &mh, sizeof mr), 0);
          }
          ++checked;
        }
      }
  }
  EXPECT_GT(checked, 0);
}

// ---- paged K/V caches: argument checks ----------------------------------------------------------------

namespace {
alignas(16) int32_t g_table[16];
ft_paged_forward_args good_paged_forward() {
  ft_paged_forward_args a{};
  a.batch = 3, a.heads = 8, a.heads_k = 2, a.seq_q = 1, a.head_dim = 128;
  a.num_pages = 40, a.page_size = 64, a.max_pages = 16, a.max_seqlen_k = 900;
  a.dtype = FT_BF16, a.causal = 1;
  a.block_table = g_table, a.cache_seqlens = g_table + 8;
  a.q = a.o = contiguous(8, 1, 128);
  a.k_pages = a.v_pages = contiguous(2, 64, 128);
  return a;
}
}  // namespace

TEST(RuntimeArgs, PagedForwardChecks) {
  EXPECT_EQ(check_paged_forward(nullptr).status, FT_INVALID_ARGUMENT);
  const ft_paged_forward_args good = good_paged_forward();
  EXPECT_EQ(check_paged_forward(&good).status, FT_OK) << check_paged_forward(&good).message;
  const Refusal<ft_paged_forward_args> cases[] = {
      {[](ft_paged_forward_args& a) { a.batch = 0; }, FT_INVALID_ARGUMENT, "batch must be positive, got 0"},
      {[](ft_paged_forward_args& a) { a.seq_q = 0; }, FT_INVALID_ARGUMENT, "seq_q must be positive, got 0"},
      {[](ft_paged_forward_args& a) { a.num_pages = 0; }, FT_INVALID_ARGUMENT, "num_pages must be positive, got 0"},
      {[](ft_paged_forward_args& a) { a.page_size = -64; }, FT_INVALID_ARGUMENT, "page_size must be positive, got -64"},
      {[](ft_paged_forward_args& a) { a.max_pages = 0; }, FT_INVALID_ARGUMENT, "max_pages must be positive, got 0"},
      {[](ft_paged_forward_args& a) { a.batch = 65536; }, FT_INVALID_ARGUMENT, "batch 65536 is over 65535 sequences"},
      {[](ft_paged_forward_args& a) { a.max_pages = 1 << 20, a.page_size = 2048; }, FT_INVALID_ARGUMENT,
       "max_pages x page_size = 2147483648 keys a sequence is over 2^30"},
      {[](ft_paged_forward_args& a) { a.max_seqlen_k = 1025; }, FT_INVALID_ARGUMENT,
       "max_seqlen_k 1025 is outside 0..max_pages x page_size = 1024"},
      {[](ft_paged_forward_args& a) { a.max_seqlen_k = -1; }, FT_INVALID_ARGUMENT, "max_seqlen_k -1 is outside"},
      {[](ft_paged_forward_args& a) { a.block_table = nullptr; }, FT_INVALID_ARGUMENT,
       "block_table is null (int32 [batch, max_pages] in device memory)"},
      {[](ft_paged_forward_args& a) { a.cache_seqlens = reinterpret_cast<const int32_t*>(g_fake + 2); },
       FT_INVALID_ARGUMENT, "cache_seqlens is not 4-byte aligned"},
      {[](ft_paged_forward_args& a) { a.dtype = FT_FP32; }, FT_UNSUPPORTED, "no family runs fp32 paged K/V cache forward"},
      {[](ft_paged_forward_args& a) { a.dtype = (ft_dtype)5; }, FT_INVALID_ARGUMENT, "dtype 5"},
      {[](ft_paged_forward_args& a) { a.head_dim = 96; }, FT_UNSUPPORTED,
       "head_dim 96 is not supported for bf16 paged K/V cache forward with grouped-query heads (heads_k) (supported: 64, "
       "128, 256)"},
      {[](ft_paged_forward_args& a) { a.heads_k = 3; }, FT_INVALID_ARGUMENT, "heads_k 3 must be 0 or divide heads 8"},
      {[](ft_paged_forward_args& a) { a.scale = std::nanf(""); }, FT_INVALID_ARGUMENT, "scale is not finite"},
      {[](ft_paged_forward_args& a) { a.seq_q = 17, a.q = a.o = contiguous(8, 17, 128); }, FT_UNSUPPORTED,
       "seq_q 17: paged K/V caches are read for Sq <= 16 only"},
      {[](ft_paged_forward_args& a) { a.page_size = 16, a.max_seqlen_k = 0; }, FT_UNSUPPORTED,
       "page_size 16 is not one decode_splitkv reads (BLOCK_N must divide the page size"},
      {[](ft_paged_forward_args& a) { a.page_size = 48, a.max_seqlen_k = 0; }, FT_UNSUPPORTED,
       "the smallest page it reads holds 32 keys"},
      {[](ft_paged_forward_args& a) { a.q.data = nullptr; }, FT_INVALID_ARGUMENT, "q.data is null"},
      {[](ft_paged_forward_args& a) { a.k_pages.data = nullptr; }, FT_INVALID_ARGUMENT, "k_pages.data is null"},
      {[](ft_paged_forward_args& a) { a.v_pages.data = g_fake + 8; }, FT_INVALID_ARGUMENT,
       "v_pages is not 16-byte aligned"},
      // FlashAttention's [num_blocks, page_size, heads_k, d] pool seen as [num_pages, heads_k, page_size, d].
      {[](ft_paged_forward_args& a) { a.k_pages.stride[1] = 128, a.k_pages.stride[2] = 2 * 128; }, FT_INVALID_ARGUMENT,
       "k_pages is not a contiguous [num_pages, heads_k, page_size, head_dim] pool (strides 16384, 128, 256, 1, want "
       "16384, 8192, 128, 1)"},
      {[](ft_paged_forward_args& a) { a.v_pages.stride[3] = 2; }, FT_INVALID_ARGUMENT, "v_pages is not a contiguous"},
      {[](ft_paged_forward_args& a) { a.num_pages = 1 << 30, a.heads_k = a.heads = 64; }, FT_INVALID_ARGUMENT,
       "k_pages has over 2^47 elements"},  // 2^49: not a pool any GPU holds
      {[](ft_paged_forward_args& a) { a.o.stride[1] = 0; }, FT_INVALID_ARGUMENT, "o has overlapping strides"},
      {[](ft_paged_forward_args& a) { a.q.stride[0] = -1; }, FT_INVALID_ARGUMENT, "q.stride[0] is negative"},
      {[](ft_paged_forward_args& a) { a.lse = reinterpret_cast<float*>(g_fake + 1); }, FT_INVALID_ARGUMENT,
       "lse is not 4-byte aligned"},
  };
  expect_refusals(good_paged_forward(), cases, check_paged_forward, ft_attention_paged_forward, ft_explain_paged_forward, ft_explain_paged_forward_text);
  // Accepted: multi-head (heads_k 0), Sq 16 causal, max_seqlen_k 0 (the capacity), pages of 32 (BLOCK_N 32) and
  // of 96 keys, a strided q (a query row of a packed qkv projection) and a transposed o: packed and unpacked by
  // the library; a single-page pool whose page stride is arbitrary; the pools always go straight in.
  ft_paged_forward_args a = good_paged_forward();
  a.heads_k = 0, a.k_pages = a.v_pages = contiguous(8, 64, 128);
  a.seq_q = 16, a.max_seqlen_k = 0;
  a.q = ft_tensor{g_fake, {16 * 3 * 8 * 128, 128, 3 * 8 * 128, 1}};
  a.o = ft_tensor{g_fake, {16 * 8 * 128, 128, 8 * 128, 1}};
  EXPECT_EQ(check_paged_forward(&a).status, FT_OK) << check_paged_forward(&a).message;
  EXPECT_FALSE(direct(tensor_args(&a)[0]));
  EXPECT_FALSE(direct(tensor_args(&a)[3]));
  EXPECT_TRUE(direct(tensor_args(&a)[1]));
  EXPECT_TRUE(tensor_args(&a)[1].pool && tensor_args(&a)[2].pool && !tensor_args(&a)[0].pool);
  for (int page : {32, 96, 1 << 20}) {
    a.page_size = page, a.max_pages = 1, a.k_pages = a.v_pages = contiguous(8, page, 128);
    EXPECT_EQ(check_paged_forward(&a).status, FT_OK) << page << ": " << check_paged_forward(&a).message;
  }
  a.num_pages = 1, a.k_pages.stride[0] = 12345;
  EXPECT_EQ(check_paged_forward(&a).status, FT_OK) << check_paged_forward(&a).message;
  const TensorArg pool = tensor_args(&a)[1];  // [num_pages, Hk, page_size, d]
  EXPECT_EQ(std::vector<int64_t>(pool.ext, pool.ext + 4), (std::vector<int64_t>{1, 8, 1 << 20, 128}));
}

// Token-major pools (layout FT_PAGES_NHD, ABI 0.7: FlashAttention's and vLLM's [num_pages, page_size, heads_k, d]):
// checked as that view; a head-major pool given as token-major (and the reverse) refused in one line; a layout
// other than 0 and 1 refused; the problem and the plan key carry it, the config lookup does not.
TEST(RuntimeArgs, PagedForwardLayouts) {
  ft_paged_forward_args a = good_paged_forward();
  a.layout = FT_PAGES_NHD;
  a.k_pages = a.v_pages = contiguous(64, 2, 128);  // [num_pages, 64 keys, 2 kv heads, 128]
  EXPECT_EQ(check_paged_forward(&a).status, FT_OK) << check_paged_forward(&a).message;
  const TensorArg pool = tensor_args(&a)[1];
  EXPECT_EQ(std::vector<int64_t>(pool.ext, pool.ext + 4), (std::vector<int64_t>{40, 64, 2, 128}));
  EXPECT_TRUE(pool.pool && direct(pool));
  const Refusal<ft_paged_forward_args> cases[] = {
      {[](ft_paged_forward_args& x) { x.layout = 2; }, FT_INVALID_ARGUMENT,
       "layout must be FT_PAGES_HND (0: [num_pages, heads_k, page_size, d]) or FT_PAGES_NHD (1: [num_pages, page_size, "
       "heads_k, d]), got 2"},
      {[](ft_paged_forward_args& x) { x.layout = -1; }, FT_INVALID_ARGUMENT, "layout must be FT_PAGES_HND"},
      // the head-major pool of good_paged_forward() given as token-major
      {[](ft_paged_forward_args& x) { x.k_pages = contiguous(2, 64, 128); }, FT_INVALID_ARGUMENT,
       "k_pages is not a contiguous [num_pages, page_size, heads_k, head_dim] pool (strides 16384, 8192, 128, 1, want "
       "16384, 256, 128, 1): pages are read in place (layout FT_PAGES_NHD)"},
      {[](ft_paged_forward_args& x) { x.v_pages.data = g_fake + 8; }, FT_INVALID_ARGUMENT, "v_pages is not 16-byte aligned"},
      {[](ft_paged_forward_args& x) { x.page_size = 16, x.max_seqlen_k = 0; }, FT_UNSUPPORTED,
       "page_size 16 is not one decode_splitkv reads"},
  };
  expect_refusals(a, cases, check_paged_forward, ft_attention_paged_forward, ft_explain_paged_forward,
                  ft_explain_paged_forward_text);
  // A token-major pool given as head-major (layout 0): FlashAttention's layout named.
  ft_paged_forward_args h = a;
  h.layout = FT_PAGES_HND;
  EXPECT_EQ(check_paged_forward(&h).status, FT_INVALID_ARGUMENT);
  EXPECT_NE(check_paged_forward(&h).message.find("is layout FT_PAGES_NHD"), std::string::npos)
      << check_paged_forward(&h).message;
  // The C++ interface carries the field; a zeroed struct is head-major.
  flashtune::runtime::PagedForwardArgs cpp;
  EXPECT_EQ(cpp.c().layout, FT_PAGES_HND);
  cpp.layout = FT_PAGES_NHD;
  EXPECT_EQ(cpp.c().layout, FT_PAGES_NHD);
  EXPECT_EQ(ft_paged_forward_args{}.layout, FT_PAGES_HND);
}

TEST(RuntimeArgs, LayoutAligns) {
  Layout l;
  EXPECT_EQ(l.add(10), 0u);
  EXPECT_EQ(l.add(256), 256u);
  EXPECT_EQ(l.add(0), 512u);
  EXPECT_EQ(l.total, 512u);
  EXPECT_FLOAT_EQ(softmax_scale(0, 64), 0.125f);
  EXPECT_FLOAT_EQ(softmax_scale(0.5f, 64), 0.5f);
}

// The scratch calls need no GPU: an allocator is recorded (one of its two functions alone refused in one line),
// the pool's size is 0 and releasing it nothing to do where no call reached a GPU; the C++ interface alike.
namespace {
void* no_alloc(size_t, int, void*, void*) { return nullptr; }
void no_free(void*, size_t, int, void*, void*) {}
}  // namespace
TEST(RuntimeCApi, ScratchCallsWithoutGpu) {
  EXPECT_EQ(ft_set_scratch_allocator(no_alloc, nullptr, nullptr), FT_INVALID_ARGUMENT);
  EXPECT_STREQ(ft_last_error(), "free_fn is null: give both functions, or neither for the library's pool");
  EXPECT_EQ(ft_set_scratch_allocator(nullptr, no_free, nullptr), FT_INVALID_ARGUMENT);
  EXPECT_STREQ(ft_last_error(), "alloc_fn is null: give both functions, or neither for the library's pool");
  EXPECT_EQ(ft_scratch_pool_bytes(nullptr), FT_INVALID_ARGUMENT);
  EXPECT_STREQ(ft_last_error(), "bytes is null");
  EXPECT_EQ(runtime::set_scratch_allocator(no_alloc, no_free).code, FT_OK);
  EXPECT_STREQ(ft_last_error(), "");
  if (ft_device_available() != FT_OK) {
    // Calls still stop at the driver, before any scratch: the allocator is never asked.
    ft_backward_args b = good_backward();
    EXPECT_EQ(ft_attention_backward(&b, nullptr), FT_NO_GPU);
    size_t bytes = 1;
    EXPECT_EQ(ft_scratch_pool_bytes(&bytes), FT_OK);
    EXPECT_EQ(bytes, 0u);
  }
  EXPECT_EQ(ft_set_scratch_allocator(nullptr, nullptr, nullptr), FT_OK);
  EXPECT_EQ(ft_release_scratch(), FT_OK) << ft_last_error();
  EXPECT_STREQ(ft_last_error(), "");
  EXPECT_EQ(runtime::release_scratch().code, FT_OK);
  size_t bytes = 1;
  EXPECT_EQ(runtime::scratch_pool_bytes(&bytes).code, FT_OK);
  if (ft_device_available() != FT_OK) EXPECT_EQ(bytes, 0u);
}

TEST(RuntimeCApi, NoGpuIsOneLine) {
  const ft_status s = ft_device_available();
  if (s == FT_OK) {
    EXPECT_STREQ(ft_last_error(), "");
    GTEST_SKIP() << "a GPU is present";
  }
  EXPECT_EQ(s, FT_NO_GPU);
  expect_one_line(ft_last_error());
  // Valid arguments get past the checks and stop at the driver, with the same reason.
  const std::string why = ft_last_error();
  ft_forward_args f = good_forward();
  EXPECT_EQ(ft_attention_forward(&f, nullptr), FT_NO_GPU);
  EXPECT_EQ(std::string(ft_last_error()), why);
  ft_backward_args b = good_backward();
  EXPECT_EQ(ft_attention_backward(&b, nullptr), FT_NO_GPU);
  // The C++ interface: errors as values.
  runtime::ForwardArgs cf;
  cf.batch = 1, cf.heads = 1, cf.seq_q = 1, cf.seq_k = 1, cf.head_dim = 64;
  runtime::Status st = runtime::forward(cf);
  EXPECT_FALSE(st);
  EXPECT_EQ(st.code, FT_INVALID_ARGUMENT);
  EXPECT_EQ(st.message, "q.data is null");
  EXPECT_EQ(runtime::device_available().code, FT_NO_GPU);
  EXPECT_EQ(runtime::explain(cf), "error: q.data is null");
  // Packed variable-length calls alike.
  ft_varlen_forward_args vf = good_varlen_forward();
  EXPECT_EQ(ft_attention_varlen_forward(&vf, nullptr), FT_NO_GPU);
  EXPECT_EQ(std::string(ft_last_error()), why);
  ft_varlen_backward_args vb = good_varlen_backward();
  EXPECT_EQ(ft_attention_varlen_backward(&vb, nullptr), FT_NO_GPU);
  size_t bytes = 0;
  EXPECT_EQ(ft_varlen_backward_workspace_bytes(&vb, &bytes), FT_NO_GPU);
  runtime::VarlenForwardArgs cv;
  EXPECT_EQ(runtime::varlen_forward(cv).message, "batch must be positive, got 0");
  EXPECT_EQ(runtime::explain(cv), "error: batch must be positive, got 0");
  // Paged K/V caches alike.
  ft_paged_forward_args pf = good_paged_forward();
  EXPECT_EQ(ft_attention_paged_forward(&pf, nullptr), FT_NO_GPU);
  EXPECT_EQ(std::string(ft_last_error()), why);
  ft_explanation e;
  EXPECT_EQ(ft_explain_paged_forward(&pf, &e), FT_NO_GPU);
  runtime::PagedForwardArgs cp;
  EXPECT_EQ(runtime::paged_forward(cp).message, "batch must be positive, got 0");
  EXPECT_EQ(runtime::explain(cp), "error: batch must be positive, got 0");
  const ft_paged_forward_args round = [] {
    runtime::PagedForwardArgs x;
    x.batch = 1, x.heads = 2, x.heads_k = 3, x.seq_q = 4, x.head_dim = 5, x.num_pages = 6, x.page_size = 7;
    x.max_pages = 8, x.max_seqlen_k = 9, x.dtype = FT_FP16, x.causal = true, x.scale = 0.5f;
    x.block_table = g_table, x.cache_seqlens = g_table + 1, x.lse = reinterpret_cast<float*>(g_fake);
    x.q = runtime::Tensor{g_fake, {1, 2, 3, 4}}, x.k_pages = runtime::Tensor{g_fake, {5, 6, 7, 8}};
    x.v_pages = runtime::Tensor{g_fake, {9, 10, 11, 12}}, x.o = runtime::Tensor{g_fake, {13, 14, 15, 16}};
    return x.c();
  }();  // the C++ struct's fields land in the C struct's (c() is positional)
  EXPECT_EQ(std::vector<int>({round.batch, round.heads, round.heads_k, round.seq_q, round.head_dim, round.num_pages,
                              round.page_size, round.max_pages, round.max_seqlen_k, (int)round.dtype, round.causal}),
            std::vector<int>({1, 2, 3, 4, 5, 6, 7, 8, 9, (int)FT_FP16, 1}));
  EXPECT_EQ(round.scale, 0.5f);
  EXPECT_EQ(round.block_table, g_table);
  EXPECT_EQ(round.cache_seqlens, g_table + 1);
  EXPECT_EQ(round.k_pages.stride[0], 5);
  EXPECT_EQ(round.v_pages.stride[3], 12);
  EXPECT_EQ(round.o.stride[0], 13);
  EXPECT_EQ(runtime::version(), "0.8.0");
}
