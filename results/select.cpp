#include "results/select.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <exception>
#include <map>
#include <set>
#include <tuple>

#include "core/family.hpp"
#include "tuned_config.h"  // nearer_batch_heads: the emitted tables' rule, shared

namespace flashtune {

namespace {
using ProblemKey = std::tuple<std::string, std::string, std::string, int, int, int, int, int, std::string, int, int,
                              std::string, std::string, int, int, double, bool, std::string>;
ProblemKey key_of(const ResultRecord& r) {
  const Problem& p = r.problem;
  return {r.device_name, r.family, r.direction, p.head_dim, p.causal, p.seq_q,  p.seq_k,       p.batch,
          to_string(p.dtype), p.heads, p.heads_k, p.varlen.key(), p.paged.key(), p.window_left, p.window_right, p.softcap,
          p.alibi, p.mask_mod.key()};
}
// The rows selection looks at, by address: subsets are taken without copying a row (the runtime's lookup holds
// up to kMaxLookupRows of them in the caller's process).
using Rows = std::vector<const ResultRecord*>;
Rows pointers(const std::vector<ResultRecord>& rows) {
  Rows out;
  out.reserve(rows.size());
  for (const auto& r : rows) out.push_back(&r);
  return out;
}

// A search stores cheap timings too (halving's 2- and 8-repeat rounds, timings stopped after 3 repeats):
// they rank candidates within a sweep, but where a problem has fully timed rows only those may be picked.
Rows fully_timed_where_any(const Rows& results) {
  std::set<ProblemKey> full;
  for (const ResultRecord* r : results)
    if (r->status == "ok" && r->reps >= kFullTimingReps) full.insert(key_of(*r));
  Rows out;
  for (const ResultRecord* r : results)
    if (r->status != "ok" || r->reps >= kFullTimingReps || !full.count(key_of(*r))) out.push_back(r);
  return out;
}

// The family's canonical spelling of a stored config (defaults filled in: a row stored before a tunable
// existed names the same kernel as one that spells the tunable's default), or the stored text as is.
std::string canonical_config(const ResultRecord& r) {
  if (const Family* f = family_named(r.family)) {
    try {
      return f->config_string(f->parse_config(r.config));
    } catch (const std::exception&) {
    }
  }
  return r.config;
}

// Which stored rows still describe the kernel a config names today. Per (problem, canonical config), the newest
// row decides: a row from another source than the newest's (the templates or the compiler changed since) is a
// timing of a kernel that no longer exists, and when the newest row says the kernel no longer compiles cleanly or
// no longer validates (pruned, compile_error, invalid), every older success of it is stale too. A timeout or a
// crash is no verdict on the kernel and decides nothing.
class Staleness {
 public:
  explicit Staleness(const Rows& rows) {
    for (const ResultRecord* p : rows) {
      const ResultRecord& r = *p;
      if (r.status == "timeout" || r.status == "crashed") continue;
      const ResultRecord*& n = newest_[{key_of(r), canonical_config(r)}];
      if (!n || std::tie(r.created, r.id) > std::tie(n->created, n->id)) n = &r;
    }
  }
  bool stale(const ResultRecord& r) const {
    auto it = newest_.find({key_of(r), canonical_config(r)});
    if (it == newest_.end()) return false;
    const ResultRecord& n = *it->second;
    if (n.status == "pruned" || n.status == "compile_error" || n.status == "invalid") return true;
    return !r.source_hash.empty() && !n.source_hash.empty() && r.source_hash != n.source_hash;
  }

 private:
  std::map<std::pair<ProblemKey, std::string>, const ResultRecord*> newest_;
};
}  // namespace

std::vector<ResultRecord> best_per_problem(const std::vector<ResultRecord>& rows, bool every_timing) {
  const Rows all = pointers(rows);
  const Rows results = every_timing ? all : fully_timed_where_any(all);
  const Staleness staleness(all);
  using Key = ProblemKey;
  std::map<Key, const ResultRecord*> best;
  for (const ResultRecord* r : results) {
    if (r->status != "ok" || staleness.stale(*r)) continue;
    const Key key = key_of(*r);
    auto it = best.find(key);
    if (it == best.end() || r->tflops > it->second->tflops) best[key] = r;
  }
  std::vector<ResultRecord> out;
  for (auto& [_, r] : best) out.push_back(*r);
  return out;
}

namespace {
using Bucket = std::tuple<std::string, std::string, std::string, std::string, std::string, int, int, int, bool, int, int>;

// Each bucket's config valid on every problem of the bucket with the highest geometric-mean TFLOP/s,
// from `results`.
std::map<Bucket, BucketChoice> bucket_picks(const Rows& results) {
  const Staleness staleness(results);
  struct Stats {
    double log_sum = 0;
    int ok = 0;
  };
  std::map<Bucket, std::set<std::string>> problems;             // bucket -> problem ids
  std::map<Bucket, std::map<std::string, Stats>> per_config;    // bucket -> config -> stats
  for (const ResultRecord* row : results) {
    const ResultRecord& r = *row;
    const Problem& p = r.problem;
    const Family* f = family_named(r.family);
    // Grouped-query rows make buckets of their own by group (query heads per kv head: a kv-head CTA that walks four
    // query heads is not the multi-head one's best, fa3_wgmma_bwd's scheduler at 32/8 heads), except a decoding
    // family's (Family::max_seq_q): decoding is tuned on the models that decode, which are GQA (Llama-3's 32/8
    // heads), its entries are consulted only inside its query range, where no multi-head row of a general family
    // measured anything, and batch x kv heads keys them.
    const bool ranged = f && f->max_seq_q > 0;
    // Packed variable-length rows: a length distribution of their own (the runtime's packed calls take the
    // dense bucket's config).
    if (p.varlen.enabled()) continue;
    // Windowed, softcapped, ALiBi or mask_mod rows (issue 32): not yet a dispatch key (a window would bucket like a
    // sequence length); each stands for its own problem only (best per problem, `run --best`).
    if (p.windowed() || p.softcapped() || p.alibi || p.mask_mod.enabled()) continue;
    // Outside the family's query-length range (an imported or merged row): never a bucket's pick.
    if (f && !f->shape_reason(p).empty()) continue;
    // Paged K/V cache rows bucket apart (the runtime's paged entry point reads them): the paged form's
    // timings are its own (pages through a block table), and its configs depend on the page size.
    // A decoding family's buckets are per batch x kv heads as well: its pick for one sequence at 4k keys (many
    // splits of the keys to fill the GPU) is not the pick for 64 of them (the H100's: SPLITS 8 against 1).
    Bucket b{r.device_name, r.arch, r.family, r.direction, to_string(p.dtype), p.head_dim, p.causal, p.seq_bucket(),
             p.paged.enabled(), ranged ? batch_kv_heads(p) : 0, ranged ? 0 : p.group_key()};
    problems[b].insert(p.str());
    if (r.status != "ok" || r.tflops <= 0 || staleness.stale(r)) continue;
    auto& s = per_config[b][r.config];
    s.log_sum += std::log(r.tflops);
    s.ok += 1;
  }
  std::map<Bucket, BucketChoice> out;
  for (auto& [b, configs] : per_config) {
    const int n = (int)problems[b].size();
    const std::string* best = nullptr;
    double best_score = -1;
    for (auto& [cfg, s] : configs) {
      if (s.ok < n) continue;  // must be valid on every problem of the bucket
      double score = std::exp(s.log_sum / s.ok);
      if (score > best_score) best_score = score, best = &cfg;
    }
    if (!best) continue;
    BucketChoice c;
    std::tie(c.device, c.arch, c.family, c.direction, std::ignore, c.head_dim, std::ignore, c.seq_bucket, c.paged,
             c.batch_heads, c.group) = b;
    c.dtype = parse_dtype(std::get<4>(b));
    c.causal = std::get<6>(b) != 0;
    c.config = *best;
    c.tflops = best_score;
    c.problems = n;
    out.emplace(b, c);
  }
  return out;
}
}  // namespace

std::vector<ResultRecord> reproducible_rows(const std::vector<ResultRecord>& rows) {
  std::vector<ResultRecord> out;
  for (const auto& r : rows) {
    const Family* f = family_named(r.family);
    if (!f) continue;
    try {
      if (f->reproducible(f->parse_config(r.config))) out.push_back(r);
    } catch (const std::exception&) {  // a config the family no longer reads: not a pick
    }
  }
  return out;
}

std::vector<BucketChoice> best_per_bucket(const std::vector<ResultRecord>& rows, bool deterministic) {
  const std::vector<ResultRecord> kept = deterministic ? reproducible_rows(rows) : std::vector<ResultRecord>{};
  const Rows all = pointers(deterministic ? kept : rows);
  // Reproducible rows rank on every timing: stores hold deterministic configs whose timing a search stopped
  // early against a faster non-reproducible config (before searches kept a bar per class), and such a row
  // may be the fastest deterministic one. A row stopped against a reproducible best is slower than it anyway.
  std::map<Bucket, BucketChoice> picks = bucket_picks(deterministic ? all : fully_timed_where_any(all));
  // A bucket of several problems that a search tuned one by one (halving: each problem's finalists are
  // its own, decode_bf16.json's batches of 1, 8 and 64 in one sequence bucket) may have no config fully
  // timed on all of them. Such a bucket is ranked on every ok row, the cheaper timings included (each
  // candidate was timed on each problem in the first round), rather than left without a pick; a bucket
  // that has one keeps it.
  for (auto& [b, c] : bucket_picks(all)) picks.emplace(b, c);
  std::vector<BucketChoice> out;
  for (auto& [_, c] : picks) {
    c.deterministic = deterministic;
    out.push_back(std::move(c));
  }
  return out;
}

int batch_kv_heads(const Problem& p) { return (int)std::clamp<long long>(p.batch_kv_heads(), 0, INT_MAX); }

const BucketChoice* pick_bucket(const std::vector<BucketChoice>& choices, int seq_bucket, long long batch_heads,
                                bool paged, bool deterministic, int group) {
  // The group's buckets where there are any (of this paged and deterministic kind), else the multi-head ones.
  int g = 0;
  if (group > 1)
    for (const auto& c : choices)
      if (c.paged == paged && c.deterministic == deterministic && c.group == group) g = group;
  const long long want = std::clamp<long long>(batch_heads, 1, INT_MAX);
  int keyed = 0;  // the nearest batch x kv heads of the buckets keyed by it; 0: none is
  for (const auto& c : choices)
    if (c.paged == paged && c.deterministic == deterministic && c.group == g && c.batch_heads > 0 &&
        (keyed == 0 || tuned::nearer_batch_heads(want, c.batch_heads, keyed)))
      keyed = c.batch_heads;
  auto of_class = [&](const BucketChoice& c) {
    return c.paged == paged && c.deterministic == deterministic && c.group == g && std::max(c.batch_heads, 0) == keyed;
  };
  const BucketChoice* pick = nullptr;
  for (const auto& c : choices)
    if (of_class(c) && c.seq_bucket >= seq_bucket && (!pick || c.seq_bucket < pick->seq_bucket)) pick = &c;
  if (!pick)
    for (const auto& c : choices)
      if (of_class(c) && (!pick || c.seq_bucket > pick->seq_bucket)) pick = &c;
  return pick;
}

const BucketChoice* pick_bucket(const std::vector<BucketChoice>& choices, const Problem& p, bool deterministic) {
  return pick_bucket(choices, p.seq_bucket(), batch_kv_heads(p), p.paged.enabled(), deterministic, p.group_key());
}

StoredChoice stored_choice(const std::vector<ResultRecord>& results, const Problem& p) {
  for (const auto& b : best_per_problem(results))
    if (b.problem == p) return {b.config, "problem"};
  if (p.varlen.enabled()) return {};  // a packed batch's rows are its own: no dense bucket stands for it
  if (p.paged.enabled()) return {};   // a paged cache's likewise (its pages and lengths are part of it)
  if (p.windowed() || p.softcapped() || p.alibi || p.mask_mod.enabled())
    return {};  // a window's, softcap's, ALiBi's or mask_mod's likewise (no bucket holds them yet)
  const std::vector<BucketChoice> buckets = best_per_bucket(results);
  if (const BucketChoice* pick = pick_bucket(buckets, p)) return {pick->config, "bucket"};
  return {};
}

}  // namespace flashtune
