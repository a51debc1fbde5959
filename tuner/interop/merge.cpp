#include "tuner/interop/merge.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/family.hpp"
#include "core/util.hpp"

using nlohmann::json;

namespace flashtune {

namespace {

const std::set<std::string> kKernelStatuses = {"compiled", "compile_error", "pruned"};
const std::set<std::string> kResultStatuses = {"ok",           "invalid", "crashed", "timeout",
                                               "launch_error", "error",   "pruned",  "compile_error"};

void check_family_config(const std::string& family, const std::string& direction, const std::string& config) {
  const Family& f = find_family(family);
  if (direction != f.direction)
    throw UsageError("family " + f.name + " computes " + f.direction + ", not '" + brief(direction) + "'");
  f.parse_config(config);
}

void check_kernel_row(const KernelRecord& k) {
  if (k.hash.empty()) throw UsageError("a kernel without a hash");
  try {
    check_family_config(k.family, k.direction, k.config);
    if (!kKernelStatuses.count(k.status)) throw UsageError("unknown status '" + brief(k.status) + "'");
    if (!is_arch_name(k.arch)) throw UsageError("arch '" + brief(k.arch) + "' is not sm_NN[a]");
    for (const std::string& name : split(k.lowered_name, '\n'))  // `compile-check --save-cubins` names files so
      if (!name.empty() && !is_safe_file_name(name))
        throw UsageError("lowered name '" + brief(name) + "' is not a plain file name");
  } catch (const UsageError& e) {
    throw UsageError("kernel " + brief(k.hash, 40) + ": " + e.what());
  }
}

std::string signatures_text(const std::set<DeviceSignature>& sigs) {
  std::string s;
  for (const auto& d : sigs)
    s += (s.empty() ? "" : " and ") + d.arch + ", " + std::to_string(d.sm_count) + " SMs, driver " +
         std::to_string(d.driver_version);
  return s;
}

// One input, read in one snapshot and checked; its rows in key order, hashed. Merge reads each input twice: once
// to check it and hash it (rows dropped, `hash`, `devices`, `schema` and `upstream` kept), then, one input at a
// time, to copy it (its hash again, which must be the same): memory holds one input's rows at a time.
struct Loaded {
  int schema = 0;
  std::string hash, upstream;
  std::set<DeviceSignature> devices;
  std::vector<ResultRecord> results;
  struct Run {
    ExperimentRun run;
    std::vector<ExperimentRow> rows;
    std::string rows_hash;
  };
  std::vector<Run> runs;
};

// An experiment run has no key: two runs are the same when their fields and all their rows are.
std::string rows_hash(const std::vector<ExperimentRow>& rows) {
  std::string text;
  for (const auto& r : rows) {
    const Problem& p = r.problem;
    text += json::array({r.impl, r.family, r.config, p.direction, to_string(p.dtype), p.batch, p.heads, p.seq_q, p.seq_k,
                         p.head_dim, p.causal, r.status, r.error, r.ms_median, r.ms_p20, r.ms_p80, r.reps, r.tflops,
                         r.gbps, r.max_abs, r.mean_abs, r.mse, r.max_rel, r.peak_bytes, r.device, r.detail})
                .dump() +
            "\n";
  }
  return content_hash(text);
}

std::string result_key(const ResultRecord& r) {
  const Problem& p = r.problem;
  json key = json::array({r.kernel_hash, r.device_name, r.sm_count, p.batch, p.heads, p.heads_k, p.seq_q, p.seq_k, p.inputs.str()});
  if (p.varlen.enabled()) key.push_back(p.varlen.key());  // dense keys (and the content hashes of stores) as before
  if (p.paged.enabled()) key.push_back("paged " + p.paged.key());  // likewise; never equal to a varlen key
  if (p.windowed() || p.softcapped())  // likewise
    key.push_back("mask " + std::to_string(p.window_left) + "," + std::to_string(p.window_right) + "," + json(p.softcap).dump());
  if (p.alibi) key.push_back("alibi");  // likewise
  if (p.mask_mod.enabled()) key.push_back("mask_mod " + p.mask_mod.key());  // likewise
  return key.dump();
}

// keep: the rows go into the result (else only the hash, devices, schema and upstream); each kernel row,
// checked, goes to on_kernel inside the snapshot (kernels are never held: their cubins are the bulk of a store).
// What one input's reads hold is bounded (ReadBudget): rows, stored text.
Loaded load(Store& s, bool keep, const std::function<void(const KernelRecord&)>& on_kernel = {}) {
  Loaded l;
  l.schema = s.schema_version();
  ReadBudget budget;
  budget.scope = "merge's read of one input";
  budget.advice = "merge reads each input whole, and this one is larger than it takes";
  // The content hash covers what the rows say, not where SQLite put them: per-row hashes in key
  // order (ids and origins left out), hashed again (the same as hashing their concatenation).
  ContentHasher rows;
  auto add = [&](const std::string& row_hash) {
    rows.update(row_hash);
    rows.update("\n");
  };
  rows.update("flashtune-store\n");
  s.snapshot([&] {
    s.each_kernel(
        [&](const KernelRecord& k) {
          check_kernel_row(k);
          if (on_kernel) on_kernel(k);
          add(content_hash(json::array({k.hash, k.family, k.direction, k.config, k.head_dim, k.causal,
                                            to_string(k.dtype), k.arch, k.nvrtc_version, k.options, k.source_hash,
                                            k.name_expression, k.status, k.reason, k.lowered_name, k.res.registers,
                                            k.res.smem_static, k.res.stack_bytes, k.res.spill_stores,
                                            k.res.spill_loads, k.compile_ms, k.log, content_hash(k.cubin),
                                            k.cubin.size(), k.created})
                                   .dump()));
        },
        true);
    l.results = s.results({}, &budget);
    for (const auto& r : l.results) {
      try {
        check_result_row(r);
      } catch (const UsageError& e) {
        throw UsageError("'" + s.path() + "': results row " + std::to_string(r.id) + ": " + e.what());
      }
    }
    // In key order: each key made once (a comparison that made them would make some 20 per row).
    std::vector<std::pair<std::string, size_t>> keys;
    keys.reserve(l.results.size());
    for (size_t i = 0; i < l.results.size(); ++i) keys.emplace_back(result_key(l.results[i]), i);
    std::sort(keys.begin(), keys.end());
    std::vector<size_t> order;
    order.reserve(keys.size());
    for (auto& [key, i] : keys) {
      const ResultRecord& r = l.results[i];
      const Problem& p = r.problem;
      add(content_hash(json::array({std::move(key), r.family, r.direction, r.config, p.head_dim, to_string(p.dtype),
                                        p.causal, r.status, r.error, r.max_abs, r.max_rel, r.mse, r.detail, r.ms_median,
                                        r.ms_p20, r.ms_p80, r.reps, r.tflops, r.gbps, r.seed, r.arch, r.driver_version,
                                        r.nvrtc_version, r.options, r.source_hash, r.res.registers, r.res.smem_static,
                                        r.res.spill_stores, r.created})
                               .dump()));
      l.devices.insert({r.device_name, r.arch, r.sm_count, r.driver_version});
      order.push_back(i);
    }
    keys = {};
    if (keep) {  // the rows put in key order where they are (a second vector of them would double the peak)
      for (size_t start = 0; start < order.size(); ++start) {
        if (order[start] == start) continue;
        // The cycle through start: position j takes the row at order[j], which then is in place.
        ResultRecord held = std::move(l.results[start]);
        size_t j = start;
        while (order[j] != start) {
          const size_t from = order[j];
          l.results[j] = std::move(l.results[from]);
          order[j] = j;
          j = from;
        }
        l.results[j] = std::move(held);
        order[j] = j;
      }
    } else {
      l.results = {};  // checked and hashed: read again to copy
    }
    for (auto& run : s.experiment_runs("", &budget)) {
      if (!is_experiment_name(run.experiment))  // `report` names files after it
        throw UsageError("'" + s.path() + "': experiment run " + std::to_string(run.id) + ": name '" +
                         brief(run.experiment) + "' is not 1..64 of lower-case letters, digits and '_'");
      const long long run_id = run.id;
      Loaded::Run r{std::move(run), s.experiment_rows(run_id, &budget), ""};
      r.rows_hash = rows_hash(r.rows);
      add(content_hash(json::array({r.run.experiment, r.run.title, r.run.device_name, r.run.probes, r.run.spec,
                                    r.run.created, r.rows_hash})
                           .dump()));
      if (keep) l.runs.push_back(std::move(r));
    }
    // A merged store's own provenance goes along as JSON, so a merge of merges still names the shards.
    json up = json::array();
    for (const auto& p : s.provenance(&budget))
      up.push_back({{"kind", p.kind}, {"source", p.source}, {"content_hash", p.content_hash},
                    {"kernels", p.kernels}, {"results", p.results}, {"experiment_runs", p.experiment_runs},
                    {"created", p.created}});
    l.upstream = up.empty() ? "" : up.dump();
  });
  l.hash = rows.hex();
  return l;
}

}  // namespace

bool is_arch_name(const std::string& a) {
  size_t n = a.size();
  if (n > 0 && a[n - 1] == 'a') --n;
  if (a.rfind("sm_", 0) != 0 || n < 5 || n > 6) return false;
  for (size_t i = 3; i < n; ++i)
    if (a[i] < '0' || a[i] > '9') return false;
  return true;
}

bool is_experiment_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 &&
         std::all_of(name.begin(), name.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

bool is_result_status(const std::string& s) { return kResultStatuses.count(s) > 0; }

void check_result_row(const ResultRecord& r) {
  check_family_config(r.family, r.direction, r.config);
  if (!kResultStatuses.count(r.status)) throw UsageError("unknown status '" + brief(r.status) + "'");
  if (r.device_name.empty() || r.device_name.size() > 256 || brief(r.device_name, 256) != r.device_name)
    throw UsageError("device name '" + brief(r.device_name) + "' is empty, over 256 bytes or holds control characters");
  if (!is_arch_name(r.arch)) throw UsageError("arch '" + brief(r.arch) + "' is not sm_NN[a]");
  if (r.sm_count < 1 || r.sm_count > 4096) throw UsageError("sm_count " + std::to_string(r.sm_count) + " is out of range");
  // The figures decide `best` and `run --best`: those a T4 import takes, however the row came.
  auto figure = [](const char* name, double v, double max) {
    if (!(v >= 0 && v <= max))  // NaN fails too
      throw UsageError(std::string(name) + " " + brief(nlohmann::json(v).dump(), 24) + " is not a number in 0.." +
                       brief(nlohmann::json(max).dump(), 24));
  };
  figure("ms_median", r.ms_median, 1e9);
  figure("ms_p20", r.ms_p20, 1e9);
  figure("ms_p80", r.ms_p80, 1e9);
  figure("tflops", r.tflops, 1e4);
  figure("gbps", r.gbps, 1e7);
  figure("reps", r.reps, 1e9);
  if (r.status == "ok" && !(r.ms_median > 0)) throw UsageError("ms_median must be above 0 for status ok");
  if (!is_utc_timestamp(r.created))
    throw UsageError("created '" + brief(r.created, 40) + "' is not a UTC time as YYYY-MM-DDTHH:MM:SSZ");
}

bool is_utc_timestamp(const std::string& s) {
  // YYYY-MM-DDTHH:MM:SS, then .f{1,9} or nothing, then Z
  if (s.size() < 20 || s.size() > 30 || s.back() != 'Z') return false;
  auto digits = [&](size_t at, size_t n, int lo, int hi) {
    int v = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return false;
      v = v * 10 + (s[i] - '0');
    }
    return v >= lo && v <= hi;
  };
  if (!digits(0, 4, 0, 9999) || s[4] != '-' || !digits(5, 2, 1, 12) || s[7] != '-' || !digits(8, 2, 1, 31) ||
      s[10] != 'T' || !digits(11, 2, 0, 23) || s[13] != ':' || !digits(14, 2, 0, 59) || s[16] != ':' ||
      !digits(17, 2, 0, 60))
    return false;
  if (s.size() == 20) return true;
  return s[19] == '.' && s.size() >= 22 && digits(20, s.size() - 21, 0, 999999999);
}

std::string device_mismatch(const std::vector<std::set<DeviceSignature>>& sets, const std::vector<std::string>& what) {
  std::map<std::string, std::pair<size_t, std::set<DeviceSignature>>> first;  // name -> (store, its signatures)
  for (size_t i = 0; i < sets.size(); ++i) {
    std::map<std::string, std::set<DeviceSignature>> by_name;
    for (const auto& d : sets[i]) by_name[d.name].insert(d);
    for (const auto& [name, sigs] : by_name) {
      auto [it, fresh] = first.try_emplace(name, i, sigs);
      if (!fresh && it->second.second != sigs)
        return "device '" + brief(name) + "' is " + signatures_text(it->second.second) + " in '" + what[it->second.first] +
               "' but " + signatures_text(sigs) + " in '" + what[i] + "'";
    }
  }
  return "";
}

std::vector<MergeInputSummary> merge_stores(const std::vector<std::string>& inputs, const std::string& output) {
  if (inputs.empty()) throw UsageError("merge needs at least one input store");
  check_db_path(output);
  struct stat out_st {};
  const bool out_exists = stat(output.c_str(), &out_st) == 0;
  if (out_exists && !S_ISREG(out_st.st_mode)) throw UsageError("output '" + output + "' is not a regular file");
  for (const auto& in : inputs) {
    check_db_path(in);
    // The output, or a file SQLite keeps beside it (-wal, -shm, -journal), by any spelling, either way round.
    if (is_store_file(output, in) || is_store_file(in, output))
      throw UsageError("'" + in + "' is the output too (or a file SQLite keeps beside it): merge into another file");
  }

  // Every input read and checked, then the output (if it holds anything) read-only: nothing is
  // created or migrated before the merge is known to be allowed.
  std::vector<std::unique_ptr<Store>> stores;
  std::vector<Loaded> loaded;
  for (const auto& in : inputs) {
    stores.push_back(std::make_unique<Store>(in, Store::Mode::read_only));
    loaded.push_back(load(*stores.back(), false));  // checked and hashed; its rows are read again to copy
  }
  auto check_devices = [&](std::set<DeviceSignature> out_devices) {
    std::vector<std::set<DeviceSignature>> sets = {std::move(out_devices)};
    std::vector<std::string> what = {output};
    for (size_t i = 0; i < inputs.size(); ++i) {
      sets.push_back(loaded[i].devices);
      what.push_back(inputs[i]);
    }
    if (const std::string why = device_mismatch(sets, what); !why.empty()) throw UsageError("cannot merge: " + why);
  };
  if (out_exists && out_st.st_size > 0) {
    Store existing(output, Store::Mode::read_only);
    check_devices(existing.device_signatures());
  } else {
    check_devices({});
  }

  Store out(output);
  std::vector<MergeInputSummary> summaries;
  out.transaction([&] {
    summaries.clear();
    check_devices(out.device_signatures());  // again: another writer may have stored results meanwhile
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Loaded& l = loaded[i];
      MergeInputSummary m;
      m.path = inputs[i];
      if (auto p = out.find_provenance(l.hash)) {
        m.already = true;
        m.provenance_id = p->id;
        summaries.push_back(m);
        continue;
      }
      Provenance p;
      p.kind = "merge";
      p.source = std::filesystem::absolute(inputs[i]).lexically_normal().string();
      p.content_hash = l.hash;
      p.source_schema = l.schema;
      p.upstream = l.upstream;
      m.provenance_id = out.add_provenance(p);
      auto count = [](Copied c, long long& added, long long& present, long long& differ) {
        (c == Copied::added ? added : c == Copied::present ? present : differ)++;
      };
      // The input read again, its kernels copied as they are read (checked again), then its rows: the content
      // checked above, or nothing (one input's rows in memory at a time).
      const Loaded again = load(*stores[i], true, [&](const KernelRecord& k) {
        count(out.copy_kernel(k, m.provenance_id), m.kernels, m.kernels_present, m.kernels_differ);
      });
      if (again.hash != l.hash) throw UsageError("'" + inputs[i] + "' changed while it was merged: nothing merged");
      for (const auto& r : again.results)
        count(out.copy_result(r, m.provenance_id), m.results, m.results_present, m.results_differ);
      for (const auto& r : again.runs) {
        const auto same = out.find_experiment_runs(r.run);
        if (std::any_of(same.begin(), same.end(), [&](long long id) { return rows_hash(out.experiment_rows(id)) == r.rows_hash; }))
          continue;
        const long long id = out.copy_experiment_run(r.run, m.provenance_id);
        ++m.experiment_runs;
        for (ExperimentRow row : r.rows) {
          row.run_id = id;
          out.put_experiment_row(row);
          ++m.experiment_rows;
        }
      }
      out.set_provenance_counts(m.provenance_id, m.kernels, m.results, m.experiment_runs);
      summaries.push_back(m);
    }
  });
  return summaries;
}

}  // namespace flashtune
