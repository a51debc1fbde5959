#include "lookup.hpp"

#include <cstring>

#include "dispatch.hpp"
#include "tuner/select.hpp"
#include "tuner/store.hpp"
#include "tuner/util.hpp"

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

// The entry for (family, query) in the tables whose device (by_device) or arch matches; nullptr if none.
const tuned::Entry* find(const TableSet& ts, const std::string& family, const Query& q, bool by_device) {
  for (int i = 0; i < ts.count; ++i) {
    const tuned::Table& t = ts.tables[i];
    if (!t.count || (by_device ? q.device != t.device : q.arch != t.arch)) continue;
    if (const tuned::Entry* e =
            tuned::find_in(t, family.c_str(), q.direction.c_str(), to_string(q.dtype), q.head_dim, q.causal, q.seq))
      return e;
  }
  return nullptr;
}
}  // namespace

std::vector<const Family*> candidate_families(const Query& q) {
  std::vector<const Family*> out;
  for (const Family& f : families())
    if (runs(f, q.direction, q.dtype, q.head_dim) && (!f.hopper_only || q.arch == "sm_90") && (!q.gqa || f.gqa) &&
        (!q.varlen || f.varlen) && in_range(f, q.seq_q))
      out.push_back(&f);
  return out;
}

int seq_q_class(int seq_q) {
  int c = 0;
  for (const Family& f : families())
    if (f.max_seq_q > 0 && in_range(f, seq_q) && (c == 0 || f.max_seq_q < c)) c = f.max_seq_q;
  return c;
}

std::string unsupported_reason(const std::string& direction, DType dtype, int head_dim, bool gqa, bool varlen) {
  std::vector<int> dims;
  bool dtype_known = false;
  for (const Family& f : families()) {
    if (f.test_only || f.direction != direction || !has(f.dtypes, dtype) || (gqa && !f.gqa) || (varlen && !f.varlen))
      continue;
    dtype_known = true;
    if (has(f.head_dims, head_dim)) return "";
    for (int d : f.head_dims)
      if (!has(dims, d)) dims.push_back(d);
  }
  const std::string what = std::string(to_string(dtype)) + (varlen ? " packed variable-length" : "") +
                           (direction == "fwd" ? " forward" : " backward") +
                           (gqa ? " with grouped-query heads (heads_k)" : "");
  if (!dtype_known) return "no family runs " + what;
  std::string list;
  for (int d : dims) list += (list.empty() ? "" : ", ") + std::to_string(d);
  return "head_dim " + std::to_string(head_dim) + " is not supported for " + what + " (supported: " + list + ")";
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
  for (bool by_device : {true, false})
    for (bool ranged : {true, false}) {  // families with a query-length range first
      const Family* best = nullptr;
      float best_tflops = 0;
      for (const Family* f : cands)
        if (const tuned::Entry* e = find(ts, f->name, q, by_device);
            e && (f->max_seq_q > 0) == ranged && (!best || e->tflops > best_tflops)) {
          best = f;
          best_tflops = e->tflops;
        }
      if (best) return best;
    }
  for (const Family* f : cands)
    if (f->name == preferred_family(q)) return f;
  for (const Family* f : cands)
    if (f->max_seq_q == 0) return f;
  return cands.front();
}

namespace {
// The store's pick for f's bucket of q on this device (best_per_bucket + pick_bucket), "" when none.
std::string stored_config(const Family& f, const Query& q, const std::string& db_path) {
  Store store(db_path, Store::Mode::read_only);
  // Every status: a newer prune or failure of a config supersedes its older success (select.cpp).
  ResultFilter filter{f.name, q.device, to_string(q.dtype), q.direction, q.head_dim, (int)q.causal, false};
  const std::vector<BucketChoice> choices = best_per_bucket(store.results(filter));
  Problem prob;
  prob.seq_q = prob.seq_k = q.seq;
  const BucketChoice* b = pick_bucket(choices, prob);
  return b ? b->config : "";
}
}  // namespace

Pick choose_config(const TableSet& ts, const Family& f, const Query& q, const std::string& db_path) {
  Pick p{&f, f.default_config, "default", ""};
  auto accept = [&](Config c, const char* source, const std::string& what) {
    const char* why = f.check(c, q.head_dim);
    const bool packed_only = !why && q.varlen && (why = f.varlen_check(c));
    if (why) {
      p.note = what + " " + f.config_string(c) + " rejected " +
               (packed_only ? std::string("for the packed form") : "for d=" + std::to_string(q.head_dim)) + " (" +
               why + "): default used";
      return false;
    }
    p.config = std::move(c);
    p.source = source;
    return true;
  };
  if (!db_path.empty())
    if (const std::string stored = stored_config(f, q, db_path); !stored.empty()) {
      Config c;
      try {
        c = f.parse_config(stored);
      } catch (const std::exception& e) {
        p.note = std::string("stored config unreadable (") + e.what() + "): ";
      }
      if (!c.empty() && accept(c, "db", "stored config")) return p;
    }
  for (bool by_device : {true, false})
    if (const tuned::Entry* e = find(ts, f.name, q, by_device)) {
      Config c(e->params, e->params + f.params.size());
      accept(c, by_device ? "device" : "arch", "tabled config");
      return p;
    }
  return p;
}

Pick choose(const TableSet& ts, const Query& q, const std::string& db_path) {
  const Family* f = nullptr;
  if (!db_path.empty())
    for (const Family* c : candidate_families(q))
      if (c->max_seq_q > 0 && !stored_config(*c, q, db_path).empty()) {
        f = c;
        break;
      }
  if (!f) f = choose_family(ts, q);
  if (!f) return {};
  return choose_config(ts, *f, q, db_path);
}

}  // namespace flashtune::rt
