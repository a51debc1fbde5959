#include "lookup.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/util.hpp"
#include "dispatch.hpp"
#ifndef FLASHTUNE_NO_STORE
#include "results/select.hpp"
#include "results/store.hpp"
#endif

namespace flashtune::rt {

TableSet generated_tables() {
  return {tuned::kTables, (int)(sizeof(tuned::kTables) / sizeof(tuned::kTables[0]))};
}

namespace {
bool has(const std::vector<int>& v, int x) {
  for (int y : v)
    if (y == x) return true;
  return false;
}
bool has(const std::vector<DType>& v, DType x) {
  for (DType y : v)
    if (y == x) return true;
  return false;
}
bool runs(const Family& f, const std::string& direction, DType dtype, int head_dim) {
  return !f.test_only && f.direction == direction && has(f.dtypes, dtype) && has(f.head_dims, head_dim);
}
// Inside the family's query-length range (every query when it has none).
bool in_range(const Family& f, int seq_q) { return f.max_seq_q == 0 || (seq_q > 0 && seq_q <= f.max_seq_q); }

// What explain() says of a decoding bucket: "batch x kv heads 64 (of 8, 64, 512), Sk <= 4096"; "" where the
// pick is not keyed by batch x kv heads (batch_heads 0).
std::string bucket_text(int batch_heads, std::set<int> of, int seq_bucket, int group = 0) {
  if (batch_heads <= 0 && group > 0)  // a grouped-query bucket (explain's "bucket")
    return "group " + std::to_string(group) + " (query heads per kv head), S <= " + std::to_string(seq_bucket);
  if (batch_heads <= 0) return "";
  std::string list;
  for (int v : of) list += (list.empty() ? "" : ", ") + std::to_string(v);
  return "batch x kv heads " + std::to_string(batch_heads) + " (of " + list + "), Sk <= " + std::to_string(seq_bucket);
}

// The entry for (family, query) in the tables whose device (by_device) or arch matches; nullptr if none.
// paged: the tables' paged K/V cache entries, else the dense ones.
// A deterministic backward query reads the deterministic entries only. bucket: set to bucket_text of the entry.
bool wants_reproducible(const Query& q) { return q.deterministic && q.direction == "bwd"; }
const tuned::Entry* find(const TableSet& ts, const std::string& family, const Query& q, bool by_device,
                         bool paged = false, std::string* bucket = nullptr) {
  for (int i = 0; i < ts.count; ++i) {
    const tuned::Table& t = ts.tables[i];
    if (!t.count || (by_device ? q.device != t.device : q.arch != t.arch)) continue;
    const bool det = wants_reproducible(q);
    if (const tuned::Entry* e = tuned::find_in(t, family.c_str(), q.direction.c_str(), to_string(q.dtype), q.head_dim,
                                               q.causal, q.seq, paged, det, q.batch_heads, q.group)) {
      if (bucket && e->batch_heads <= 0) *bucket = bucket_text(0, {}, e->seq_max, e->group);
      if (bucket && e->batch_heads > 0) {
        std::set<int> of;  // the batch x kv heads the table holds for this (family, direction, dtype, d, mask)
        for (int k = 0; k < t.count; ++k) {
          const tuned::Entry& o = t.entries[k];
          if (o.batch_heads > 0 && tuned::str_eq(o.family, e->family) && tuned::str_eq(o.direction, e->direction) &&
              tuned::str_eq(o.dtype, e->dtype) && o.head_dim == e->head_dim && o.causal == e->causal &&
              o.paged == e->paged && o.deterministic == det)
            of.insert(o.batch_heads);
        }
        *bucket = bucket_text(e->batch_heads, of, e->seq_max);
      }
      return e;
    }
  }
  return nullptr;
}
// The config nearest `from` (fewest tunables changed; among those the larger values first, in parameter
// order, or the smaller ones with smaller_first) that its check at head_dim and `ok` accept; empty when none does.
template <class Ok>
Config nearest_config(const Family& f, const Config& from, int head_dim, Ok ok, bool smaller_first = false) {
  Config best, c(f.params.size());
  int best_changed = 0;
  std::vector<size_t> idx(f.params.size(), 0);  // every config of the domains (decode_splitkv: 288)
  for (;;) {
    int changed = 0;
    for (size_t i = 0; i < c.size(); ++i) changed += (c[i] = f.params[i].domain[idx[i]]) != (i < from.size() ? from[i] : -1);
    if (!f.check(c, head_dim) && ok(c) &&
        (best.empty() || changed < best_changed || (changed == best_changed && (smaller_first ? c < best : c > best)))) {
      best = c;
      best_changed = changed;
    }
    size_t i = 0;
    while (i < idx.size() && ++idx[i] == f.params[i].domain.size()) idx[i++] = 0;
    if (i == idx.size()) return best;
  }
}
bool has_reproducible(const Family& f, int head_dim, bool causal) {
  const Config& d = f.default_config;
  return (!f.check(d, head_dim) && f.reproducible(d)) || !nearest_reproducible_config(f, d, head_dim, causal).empty();
}
// Whether this device's tables hold any entry of `family` for the query's direction, dtype and head dim (any
// mask, any bucket, dense or paged). A device table with entries for the query but none of a family another
// device of its arch measured was emitted before that family landed: it is stale for it.
bool device_measured(const TableSet& ts, const std::string& family, const Query& q) {
  for (int i = 0; i < ts.count; ++i) {
    const tuned::Table& t = ts.tables[i];
    if (q.device != t.device) continue;
    for (int k = 0; k < t.count; ++k) {
      const tuned::Entry& e = t.entries[k];
      if (tuned::str_eq(e.family, family.c_str()) && tuned::str_eq(e.direction, q.direction.c_str()) &&
          tuned::str_eq(e.dtype, to_string(q.dtype)) && e.head_dim == q.head_dim)
        return true;
    }
  }
  return false;
}
}  // namespace

std::vector<const Family*> candidate_families(const Query& q) {
  std::vector<const Family*> out;
  for (const Family& f : families())
    if (runs(f, q.direction, q.dtype, q.head_dim) && (!f.hopper_only || q.arch == "sm_90") && (!q.gqa || f.gqa) &&
        (!q.varlen || f.varlen) && (!q.page_size || f.paged) && f.has_mods(q.mods, q.head_dim) && in_range(f, q.seq_q) &&
        (!wants_reproducible(q) || has_reproducible(f, q.head_dim, q.causal)))
      out.push_back(&f);
  return out;
}

int lookup_seq(const Problem& p) {
  const int seq = std::max(p.seq_q, p.seq_k);
  if (p.direction != "fwd" || !p.windowed() || seq < 1) return seq;
  const long long left = p.window_left < 0 ? p.seq_k : p.window_left;
  const long long right = p.causal ? 0 : p.window_right < 0 ? p.seq_k : p.window_right;
  const long long keys = std::min<long long>(p.seq_k, left + right + 1);
  return (int)std::clamp<long long>(p.causal ? 2 * keys : keys, 1, seq);
}

int seq_q_class(int seq_q) {
  // The registry's query-length ranges, ascending, once (every call's plan key asks).
  static const std::vector<int> ranges = [] {
    std::vector<int> r;
    for (const Family& f : families())
      if (f.max_seq_q > 0) r.push_back(f.max_seq_q);
    std::sort(r.begin(), r.end());
    return r;
  }();
  if (seq_q <= 0) return 0;
  for (int m : ranges)
    if (seq_q <= m) return m;
  return 0;
}

std::string unsupported_reason(const std::string& direction, DType dtype, int head_dim, bool gqa, bool varlen,
                               bool paged, unsigned mods) {
  std::vector<int> dims;
  bool dtype_known = false;
  for (const Family& f : families()) {
    if (f.test_only || f.direction != direction || !has(f.dtypes, dtype) || (gqa && !f.gqa) || (varlen && !f.varlen) ||
        (paged && !f.paged) || (mods & ~f.mods))
      continue;
    dtype_known = true;
    if (has(f.head_dims, head_dim) && f.has_mods(mods, head_dim)) return "";
    for (int d : f.head_dims)
      if (!has(dims, d) && f.has_mods(mods, d)) dims.push_back(d);
  }
  std::vector<std::string> with;  // "with grouped-query heads (heads_k), a sliding window and a softcap"
  if (gqa) with.push_back("grouped-query heads (heads_k)");
  if (mods & kModWindow) with.push_back("a sliding window");
  if (mods & kModSoftcap) with.push_back("a softcap");
  if (mods & kModAlibi) with.push_back("ALiBi slopes");
  if (mods & kModMask) with.push_back("a mask_mod");
  std::string what = std::string(to_string(dtype)) + (varlen ? " packed variable-length" : "") +
                     (paged ? " paged K/V cache" : "") + (direction == "fwd" ? " forward" : " backward");
  for (size_t i = 0; i < with.size(); ++i)
    what += (i == 0 ? " with " : i + 1 == with.size() ? " and " : ", ") + with[i];
  if (!dtype_known) return "no family runs " + what;
  std::string list;
  for (int d : dims) list += (list.empty() ? "" : ", ") + std::to_string(d);
  return "head_dim " + std::to_string(head_dim) + " is not supported for " + what + " (supported: " + list + ")";
}

int paged_max_seq_q() {
  int m = 0;
  for (const Family& f : families())
    if (!f.test_only && f.paged) {
      if (f.max_seq_q == 0) return 0;  // one serves any Sq
      m = std::max(m, f.max_seq_q);
    }
  return m;
}

Config nearest_paged_config(const Family& f, const Config& from, int head_dim, int page_size) {
  return nearest_config(f, from, head_dim, [&](const Config& c) { return !f.paged_check(c, page_size); });
}

Config nearest_reproducible_config(const Family& f, const Config& from, int head_dim, bool causal) {
  return nearest_config(
      f, from, head_dim, [&](const Config& c) { return f.reproducible(c) && !f.causal_check(c, causal); }, true);
}

std::string paged_page_reason(DType dtype, int head_dim, int page_size) {
  const Family* first = nullptr;
  for (const Family& f : families()) {
    if (f.test_only || !f.paged || f.direction != "fwd" || !has(f.dtypes, dtype) || !has(f.head_dims, head_dim))
      continue;
    const Config& d = f.default_config;  // the usual case, without a search
    if ((!f.check(d, head_dim) && !f.paged_check(d, page_size)) ||
        !nearest_paged_config(f, d, head_dim, page_size).empty())
      return "";
    if (!first) first = &f;
  }
  if (!first) return unsupported_reason("fwd", dtype, head_dim, false, false, true);
  int smallest = 0;  // the smallest page it reads, for the message
  for (int p = 1; p <= 4096 && !smallest; ++p)
    if (!nearest_paged_config(*first, first->default_config, head_dim, p).empty()) smallest = p;
  const char* why = first->paged_check(first->default_config, page_size);
  return "page_size " + std::to_string(page_size) + " is not one " + first->name + " reads (" +
         (why ? why : "no config passes its checks") + ")" +
         (smallest ? "; the smallest page it reads holds " + std::to_string(smallest) + " keys" : "");
}

Config fallback_config(const Family& f, const Query& q) {
  if (wants_reproducible(q))
    return f.reproducible(f.default_config) ? f.default_config
                                            : nearest_reproducible_config(f, f.default_config, q.head_dim, q.causal);
  if (!q.page_size) return f.default_config;
  return nearest_paged_config(f, f.default_config, q.head_dim, q.page_size);
}

const char* preferred_family(const Query& q) {
  const bool fp32 = q.dtype == DType::fp32;
  if (q.direction == "fwd") return fp32 ? "fa2_simt" : "fa2_mma";
  if (fp32) return "fa2_simt_bwd";
  return q.arch == "sm_90" ? "fa2_wgmma_bwd" : "fa2_mma_bwd";
}

const Family* choose_family(const TableSet& ts, const Query& q) {
  const std::vector<const Family*> cands = candidate_families(q);
  if (cands.empty()) return nullptr;
  // The tables' fastest candidate on this device (by_device) or on any device of its arch; families with a
  // query-length range first.
  auto best_at = [&](bool by_device) -> const Family* {
    for (bool ranged : {true, false}) {
      const Family* best = nullptr;
      float best_tflops = 0;
      for (const Family* f : cands)
        if (const tuned::Entry* e = find(ts, f->name, q, by_device, q.page_size > 0);
            e && (f->max_seq_q > 0) == ranged && (!best || e->tflops > best_tflops)) {
          best = f;
          best_tflops = e->tflops;
        }
      if (best) return best;
    }
    return nullptr;
  };
  const Family* device = best_at(true);
  const Family* arch = best_at(false);
  // The device's table is stale for the arch's pick (it never measured that family here): the arch's pick,
  // measured on another device of the arch, rather than a family the device's table had before it landed.
  if (device && arch && arch != device && !device_measured(ts, arch->name, q)) return arch;
  if (device) return device;
  if (arch) return arch;
  if (q.page_size) return cands.front();  // only families with a paged form are candidates: any of them
  for (const Family* f : cands)
    if (f->name == preferred_family(q)) return f;
  for (const Family* f : cands)
    if (f->max_seq_q == 0) return f;
  return cands.front();
}

namespace {
// The store's pick for f's bucket of q on this device (best_per_bucket + pick_bucket), "" when none.
// paged: its paged buckets (rows measured on paged caches), else its dense ones.
#ifdef FLASHTUNE_NO_STORE
// A runtime built without the results store (a wheel without the tuner: no SQLite, no nlohmann_json): a store to
// read is refused in one line ($FLASHTUNE_DB fails the call; the user's store is passed over with this note).
std::string stored_config(const Family&, const Query&, const std::string&, bool = false, double* = nullptr,
                          std::string* = nullptr) {
  throw UsageError("this flashtune runtime reads no results store (built without the tuner: a wheel without "
                   "FLASHTUNE_PYTHON_TOOLS)");
}
#else
std::string stored_config(const Family& f, const Query& q, const std::string& db_path, bool paged = false,
                          double* tflops = nullptr, std::string* bucket = nullptr) {
  Store store(db_path, Store::Mode::read_only);
  // Every status: a newer prune or failure of a config supersedes its older success (select.cpp). Only the rows
  // that can make this pick are read, filtered in SQL: this family, device, dtype, direction, head dim and mask,
  // no packed rows (never a bucket's pick), the paged rows for a paged pick and the dense ones otherwise, and
  // only the columns selection reads; more than kMaxLookupRows of them are refused before one is read.
  ResultFilter filter{f.name, q.device, to_string(q.dtype), q.direction, q.head_dim, (int)q.causal, false};
  filter.dense_only = true;
  filter.paged = paged ? 1 : 0;
  filter.lean = true;
  filter.max_rows = kMaxLookupRows;
  const std::vector<BucketChoice> choices = best_per_bucket(store.results(filter), wants_reproducible(q));
  const BucketChoice* b = pick_bucket(choices, seq_bucket_of(q.seq), q.batch_heads, paged, wants_reproducible(q), q.group);
  if (b && tflops) *tflops = b->tflops;
  if (b && bucket) {
    std::set<int> of;
    for (const BucketChoice& c : choices)
      if (c.batch_heads > 0 && c.paged == b->paged && c.deterministic == b->deterministic) of.insert(c.batch_heads);
    *bucket = bucket_text(b->batch_heads, of, b->seq_bucket, b->group);
  }
  return b ? b->config : "";
}
#endif

// The family a results store measured for this query on this device: a family with a query-length range
// that holds a bucket of it first (as a table entry of its own does in choose_family), else the candidate
// whose stored pick has the most TFLOP/s; nullptr when the store holds none of the candidates.
const Family* stored_family(const Query& q, const std::string& db_path) {
  const Family* best = nullptr;
  double best_tflops = 0;
  for (const Family* c : candidate_families(q)) {
    double tflops = 0;
    if (stored_config(*c, q, db_path, q.page_size > 0, &tflops).empty()) continue;
    if (c->max_seq_q > 0) return c;
    if (!best || tflops > best_tflops) {
      best = c;
      best_tflops = tflops;
    }
  }
  return best;
}

// A paged query's config: the first of the store's paged bucket, the store's dense pick, then per table
// (this device's, then the arch's) its paged entry and its dense pick, then the default and the default's
// nearest config that the family accepts at this head dim and its paged form at this page size. A tuned
// config whose BLOCK_N does not divide the page is no error: decode_splitkv's H100 entries have BLOCK_N
// 256, and a serving engine's pages are often 16-128. The note names the first source passed over and
// why, then what ran; a dense pick is always noted.
Pick choose_paged_config(const TableSet& ts, const Family& f, const Query& q, const std::string& db_path) {
  Pick p{&f, {}, "", ""};
  const std::string pages = "pages of " + std::to_string(q.page_size) + " keys";
  auto refuse = [&](const std::string& what, const Config& c, const std::string& why) {
    if (p.note.empty()) p.note = what + (c.empty() ? "" : " " + f.config_string(c)) + " rejected " + why;
    return false;
  };
  auto accept = [&](const Config& c, const std::string& source, const std::string& what,
                    const std::string& bucket = "") {
    if (const char* why = f.check(c, q.head_dim))
      return refuse(what, c, "for d=" + std::to_string(q.head_dim) + " (" + why + ")");
    if (const char* why = f.paged_check(c, q.page_size)) return refuse(what, c, "for " + pages + " (" + why + ")");
    p.config = c;
    p.source = source;
    p.bucket = bucket;
    return true;
  };
  auto stored = [&](bool paged, const std::string& what) {
    if (db_path.empty()) return false;
    std::string bucket;
    const std::string text = stored_config(f, q, db_path, paged, nullptr, &bucket);
    if (text.empty()) return false;
    Config c;
    try {
      c = f.parse_config(text);
    } catch (const std::exception& e) {
      return refuse(what, {}, std::string("(unreadable: ") + e.what() + ")");  // as a config the checks refuse
    }
    return accept(c, "db", what, bucket);
  };
  auto tabled = [&](bool by_device, bool paged, const std::string& what) {
    std::string bucket;
    const tuned::Entry* e = find(ts, f.name, q, by_device, paged, &bucket);
    return e && accept(Config(e->params, e->params + f.params.size()), by_device ? "device" : "arch", what, bucket);
  };
  auto ran = [&](const std::string& what) {
    if (!p.note.empty()) p.note += ": " + what + " used";
    return p;
  };
  auto dense_pick = [&] {
    if (!p.note.empty()) return ran("the dense decoding pick");
    p.note = "no paged entry for this bucket: the dense decoding pick used";
    return p;
  };
  // Source by source, the nearest to this GPU first (this device's store, this device's table, the
  // arch's table), and in each the paged entry before the dense pick.
  if (stored(true, "stored paged config")) return ran("the stored paged config");
  if (stored(false, "stored dense config")) return dense_pick();
  for (bool by_device : {true, false}) {
    if (tabled(by_device, true, "tabled paged config")) return ran("the tabled paged config");
    if (tabled(by_device, false, "tabled dense config")) return dense_pick();
  }
  if (accept(f.default_config, "default", "default")) return ran("the default");
  p.config = nearest_paged_config(f, f.default_config, q.head_dim, q.page_size);
  if (p.config.empty()) return Pick{};  // no config reads such pages (the argument checks refuse the call first)
  p.source = "default";
  return ran("the default's nearest config that reads " + pages);
}
}  // namespace

Pick choose_config(const TableSet& ts, const Family& f, const Query& q, const std::string& db_path) {
  if (q.page_size) return choose_paged_config(ts, f, q, db_path);
  Pick p{&f, fallback_config(f, q), "default", ""};
  const std::string fallback = wants_reproducible(q) && !f.reproducible(f.default_config)
                                   ? "the default's nearest reproducible config " + f.config_string(p.config) + " used"
                                   : "default used";
  auto accept = [&](Config c, const char* source, const std::string& what, const std::string& bucket) {
    if (q.mods && f.mods_check(c, q.mods) && !wants_reproducible(q)) {  // the pick without what the modifications
      const Config alt = f.mods_fallback(c, q.mods);                    // refuse, where it has a variant
      if (alt != c && !f.check(alt, q.head_dim) && !f.mods_check(alt, q.mods)) c = alt;
    }
    const char* why = f.check(c, q.head_dim);
    const bool packed_only = !why && q.varlen && (why = f.varlen_check(c));
    const bool masked = !why && (why = f.causal_check(c, q.causal));
    const bool modded = !why && q.mods && (why = f.mods_check(c, q.mods));  // the config has no such variant
    const bool nondeterministic = !why && wants_reproducible(q) && !f.reproducible(c);
    if (nondeterministic) why = "its gradients are not bitwise reproducible";
    if (why) {
      p.note = what + " " + f.config_string(c) + " rejected " +
               (packed_only      ? std::string("for the packed form")
                : masked         ? std::string(q.causal ? "causal" : "non-causal")
                : modded         ? "with " + mods_string(q.mods)
                : nondeterministic ? std::string("for a deterministic backward")
                                 : "for d=" + std::to_string(q.head_dim)) +
               " (" + why + "): " + fallback;
      return false;
    }
    p.config = std::move(c);
    p.source = source;
    p.bucket = bucket;
    return true;
  };
  std::string bucket;
  if (!db_path.empty())
    if (const std::string stored = stored_config(f, q, db_path, false, nullptr, &bucket); !stored.empty()) {
      Config c;
      try {
        c = f.parse_config(stored);
      } catch (const std::exception& e) {
        p.note = std::string("stored config unreadable (") + e.what() + "): ";
      }
      if (!c.empty() && accept(c, "db", "stored config", bucket)) return p;
    }
  for (bool by_device : {true, false})
    if (const tuned::Entry* e = find(ts, f.name, q, by_device, false, &bucket)) {
      Config c(e->params, e->params + f.params.size());
      accept(c, by_device ? "device" : "arch", "tabled config", bucket);
      return p;
    }
  return p;
}

Pick choose(const TableSet& ts, const Query& q, const std::string& db_path) {
  const Family* f = db_path.empty() ? nullptr : stored_family(q, db_path);
  if (!f) f = choose_family(ts, q);
  if (!f) return {};
  Pick p = choose_config(ts, *f, q, db_path);
  // A stale device table passed over (choose_family): say so, and what to do about it.
  if (p.source == "arch" && p.note.empty())
    for (const Family* c : candidate_families(q))
      if (c != f && device_measured(ts, c->name, q)) {
        p.note = "the " + q.device + " table predates " + f->name + " (no entry of it for " + q.direction + " " +
                 to_string(q.dtype) + " d=" + std::to_string(q.head_dim) + "): its " + q.arch +
                 " measurement used; re-tune and emit for this GPU";
        break;
      }
  return p;
}

}  // namespace flashtune::rt
