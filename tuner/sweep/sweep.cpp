#include "tuner/sweep/sweep.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <mutex>
#include <optional>
#include <thread>

#include "core/timing.hpp"
#include "core/util.hpp"
#include "worker/library_kernels.hpp"

using nlohmann::json;

namespace flashtune {

namespace {
double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
constexpr double kPrepareTimeout = 900;  // inputs + reference rows for the largest problems
constexpr double kProbeTimeout = 600;    // four 8192^3 GEMMs (fp32 ~20 ms each) and a copy, repeated
}  // namespace

Progress::Progress(std::string what, size_t total, bool enabled)
    : what_(std::move(what)), total_(total), enabled_(enabled), tty_(isatty(2)), start_(seconds_now()) {}

void Progress::update(size_t done, const std::string& label) {
  if (!enabled_ || total_ == 0) return;
  double now = seconds_now(), elapsed = now - start_;
  // On a terminal redraw often; in a log, one line every 15 s.
  if (done < total_ && now - last_print_ < (tty_ ? 0.2 : 15.0)) return;
  last_print_ = now;
  double eta = done && done < total_ ? elapsed / done * (total_ - done) : 0;
  if (limit_ > 0) eta = std::min(eta, std::max(0.0, limit_ - elapsed));
  std::fprintf(stderr, "%s%s [%zu/%zu] %3d%%  elapsed %s  eta %s  %s%s", tty_ ? "\r\033[K" : "", what_.c_str(), done,
               total_, (int)(100.0 * std::min(done, total_) / total_), format_duration(elapsed).c_str(), format_duration(eta).c_str(),
               label.substr(0, 100).c_str(), tty_ ? "" : "\n");
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && tty_ && total_) std::fprintf(stderr, "\n");
}

GpuSession::GpuSession(const RunOptions& opt) : opt_(opt), worker_(opt.device, opt.worker_path) {
  json hello = worker_.request({{"op", "hello"}}, 120);
  if (hello.value("status", "") != "ok") {
    no_gpu_reason_ = hello.value("error", "worker did not answer");
    return;
  }
  const json& d = hello["device"];
  device_.name = d["name"];
  device_.arch = d["arch"];
  device_.sm_count = d["sm_count"];
  device_.driver_version = d["driver_version"];
  device_.memory_bytes = d["memory_bytes"];
  device_.l2_bytes = d["l2_bytes"];
  device_.max_smem_optin = d["max_smem_optin"];
  device_.clock_khz = d["clock_khz"];
  has_gpu_ = true;
  tmp_dir_ = make_private_tmpdir("flashtune");  // 0700, under $TMPDIR: the cubins handed to the worker
}

GpuSession::~GpuSession() {
  if (!tmp_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(tmp_dir_, ec);
  }
}

ResultRecord unrun_result(const KernelRecord& k, const Problem& p) {
  ResultRecord r;
  r.kernel_hash = k.hash;
  r.family = k.family;
  r.direction = k.direction;
  r.config = k.config;
  r.problem = p;
  r.status = k.status;
  r.error = k.reason;
  r.arch = k.arch;
  r.nvrtc_version = k.nvrtc_version;
  r.options = k.options;
  r.source_hash = k.source_hash;
  r.res = k.res;
  return r;
}

ResultRecord GpuSession::run(const KernelRecord& k, const Variant& v, const Problem& p, const json& timing,
                             const ResultRecord* validated) {
  // A validated row stands for this run's validation only when it is this kernel's, on this problem
  // and these inputs, and it passed.
  if (validated && (validated->status != "ok" || validated->kernel_hash != k.hash || !(validated->problem == p) ||
                    validated->seed != opt_.seed || !opt_.inputs_dir.empty() || opt_.check_determinism))
    validated = nullptr;
  ResultRecord r = unrun_result(k, p);
  r.seed = opt_.seed;
  r.device_name = device_.name;
  r.sm_count = device_.sm_count;
  r.driver_version = device_.driver_version;
  if (k.status != "compiled") return r;
  if (!prepare_for(p, r)) return r;
  const std::string cubin_path = tmp_dir_ + "/" + k.hash + ".cubin";
  if (!std::filesystem::exists(cubin_path)) {
    std::ofstream f(cubin_path, std::ios::binary);
    f.write(k.cubin.data(), (std::streamsize)k.cubin.size());
  }
  Problem on_device = p;  // the persistent grids' SM count (Problem::sm_count)
  on_device.sm_count = device_.sm_count;
  const std::vector<Launch> launches = v.family->launches(v.config, on_device);
  const std::vector<std::string> names = split(k.lowered_name, '\n');
  json kernels = json::array();
  for (size_t i = 0; i < launches.size() && i < names.size(); ++i)
    kernels.push_back({{"name", names[i]},
                       {"grid", {launches[i].grid[0], launches[i].grid[1], launches[i].grid[2]}},
                       {"threads", launches[i].threads},
                       {"smem", launches[i].smem_bytes},
                       {"cluster", launches[i].cluster_x}});
  json req = {{"op", "run"},
              {"cubin_path", cubin_path},
              {"kernels", kernels},
              {"workspace", v.family->workspace_bytes(v.config, p)},
              {"workspace_fill", v.family->workspace_written ? 0xFF : 0},
              {"check_determinism", opt_.check_determinism},
              {"reproducible_runs", v.family->reproducible(v.config) ? kReproducibleRuns : 0}};
  for (const TensorMapSpec& m : v.family->tensor_maps(v.config, p))
    req["tensor_maps"].push_back(
        {{"tensor", m.tensor}, {"box_rows", m.box_rows}, {"box_cols", m.box_cols}, {"swizzle", m.swizzle_bytes}});
  if (!opt_.save_outputs_dir.empty()) req["save_dir"] = opt_.save_outputs_dir;
  if (!timing.empty()) req["timing"] = timing;
  if (validated) req["time_only"] = true;
  take_reply(worker_.request(req, opt_.timeout_s), p, r);
  if (validated && r.status == "ok") {
    r.max_abs = validated->max_abs;
    r.max_rel = validated->max_rel;
    r.mse = validated->mse;
    // The validation's findings (errors per output, bounds, rows checked) from the validated row; this
    // run's own timing, telemetry and phases over them.
    json d = validated->detail.empty() ? json::object() : json::parse(validated->detail, nullptr, false);
    if (!d.is_object()) d = json::object();
    const json mine = r.detail.empty() ? json::object() : json::parse(r.detail, nullptr, false);
    for (const char* key : {"timing_ms", "telemetry", "phase_ms", "early_stopped", "worker_device", "ms_samples"}) {
      d.erase(key);
      if (mine.is_object() && mine.contains(key)) d[key] = mine[key];
    }
    d["validation"] = "reused";
    r.detail = d.dump();
  }
  return r;
}

bool GpuSession::prepare_for(const Problem& p, ResultRecord& r) {
  // Generated and file-backed inputs of the same problem are different problems to the cache.
  if (prepared_ && prepared_problem_ == p && prepared_inputs_dir_ == opt_.inputs_dir) return true;
  json req = {{"op", "prepare"}, {"problem", to_json(p)}, {"seed", opt_.seed}, {"max_rows", opt_.max_rows}};
  if (!opt_.inputs_dir.empty()) req["inputs_dir"] = opt_.inputs_dir;
  json rep = worker_.request(req, kPrepareTimeout);
  if (rep.value("status", "") != "ok") {
    prepared_ = false;
    r.status = rep.value("status", "error");  // crashed, timeout, oom, or error
    r.error = "prepare: " + rep.value("error", std::string());
    if (rep.contains("asked_bytes")) r.detail = json{{"asked_bytes", rep["asked_bytes"]}}.dump();
    return false;
  }
  prepared_ = true;
  prepared_problem_ = p;
  prepared_inputs_dir_ = opt_.inputs_dir;
  return true;
}

void GpuSession::take_reply(const json& rep, const Problem& p, ResultRecord& r) {
  r.status = rep.value("status", "error");
  r.error = rep.value("error", std::string());
  // A fresh worker has nothing; after an OOM the worker has freed the problem's buffers.
  if (r.status == "crashed" || r.status == "timeout" || r.status == "oom") prepared_ = false;
  r.max_abs = rep.value("max_abs", 0.0);
  r.max_rel = rep.value("max_rel", 0.0);
  r.mse = rep.value("mse", 0.0);
  json detail = rep.contains("detail") && rep["detail"].is_object() ? rep["detail"] : json::object();
  for (const char* key : {"mean_abs", "peak_bytes", "asked_bytes"})
    if (rep.contains(key) && !detail.contains(key)) detail[key] = rep[key];
  if (rep.contains("detail") || !detail.empty()) r.detail = detail.dump();
  if (r.status == "ok") {
    r.ms_median = rep["ms_median"];
    r.ms_p20 = rep["ms_p20"];
    r.ms_p80 = rep["ms_p80"];
    r.reps = rep["reps"];
    r.tflops = p.flops() / (r.ms_median * 1e-3) / 1e12;
    r.gbps = p.bytes() / (r.ms_median * 1e-3) / 1e9;
  }
}

ResultRecord GpuSession::run_library(const std::string& impl, const Problem& p) {
  ResultRecord r;
  r.family = impl;
  r.direction = p.direction;
  r.problem = p;
  r.seed = opt_.seed;
  r.device_name = device_.name;
  r.arch = device_.arch;
  r.sm_count = device_.sm_count;
  r.driver_version = device_.driver_version;
  if (const std::string why = lib::unsupported_reason(impl, p); !why.empty()) {
    r.status = "error";
    r.error = why;
    return r;
  }
  if (!prepare_for(p, r)) return r;
  take_reply(worker_.request({{"op", "run_library"}, {"impl", impl}}, opt_.timeout_s), p, r);
  return r;
}

json GpuSession::probe() {
  json rep = worker_.request({{"op", "probe"}}, kProbeTimeout);
  const std::string status = rep.value("status", "error");
  if (status == "crashed" || status == "timeout" || status == "oom") prepared_ = false;
  return rep;
}

static void print_resource_table(const std::vector<Variant>& vs, const std::vector<KernelRecord>& ks) {
  std::printf("%-10s %-44s %4s %-6s %-5s %-13s %5s %7s %6s  %s\n", "family", "config", "d", "causal", "dtype", "status",
              "regs", "smem", "spill", "reason");
  for (size_t i = 0; i < vs.size(); ++i) {
    const auto& k = ks[i];
    unsigned smem = 0;
    for (const Launch& l : vs[i].family->launches(
             vs[i].config, Problem{1, 1, 1, 1, vs[i].head_dim, vs[i].dtype, vs[i].causal, vs[i].family->direction}))
      smem = std::max(smem, l.smem_bytes);
    std::printf("%-10s %-44s %4d %-6s %-5s %-13s %5d %7u %6d  %s\n", k.family.c_str(), k.config.c_str(), k.head_dim,
                vs[i].varlen ? (k.causal ? "yes vl" : "no vl") : vs[i].paged ? (k.causal ? "yes pg" : "no pg") : (k.causal ? "yes" : "no"),
                to_string(k.dtype), k.status.c_str(), k.res.registers,
                smem + k.res.smem_static, k.res.spill_stores, k.reason.substr(0, 70).c_str());
  }
}

namespace {

// Compile-only (no GPU): every variant of this shard compiled and pruned, resources printed.
SweepSummary compile_only(const Space& space, const std::vector<Problem>& problems, Store& store,
                          const SweepOptions& opt, const std::string& arch) {
  SweepSummary sum;
  Compiler compiler(arch);
  std::vector<Variant> variants;
  for (const Variant& v : variants_for(space, problems))
    if (in_shard(opt.search.shard, compiler.variant_hash(v))) variants.push_back(v);
  Progress cprog("compile " + arch, variants.size(), opt.progress);
  const auto kernels = compiler.compile_all(variants, &store, [&](size_t d, size_t) { cprog.update(d); });
  cprog.finish();
  for (const auto& k : kernels) sum.by_status[k.status]++;
  std::fprintf(stderr, "%zu variants%s:", kernels.size(),
               opt.search.shard.all() ? "" : (" (shard " + std::to_string(opt.search.shard.index) + "/" +
                                              std::to_string(opt.search.shard.count) + ")").c_str());
  for (auto& [st, n] : sum.by_status) std::fprintf(stderr, " %d %s", n, st.c_str());
  std::fprintf(stderr, "\n");
  if (!opt.json) print_resource_table(variants, kernels);
  return sum;
}

// A stored row as an evaluation: its outcome, and the GPU time its timing took (0 when `reused`).
SearchEvaluation evaluation_of(const ResultRecord& r, bool reused) {
  SearchEvaluation e;
  e.o.ok = r.status == "ok" && r.ms_median > 0;
  e.o.ms = r.ms_median;
  e.o.reps = r.reps;
  e.reused = reused;
  const json d = r.detail.empty() ? json() : json::parse(r.detail, nullptr, false);
  if (d.is_object()) {
    e.o.early_stopped = d.value("early_stopped", false);
    if (!reused) e.timing_ms = d.value("timing_ms", 0.0);
  }
  return e;
}

}  // namespace

namespace {
void retime_finalists(const std::vector<SearchCandidate>& cands, const Problem& p, const SearchOptions& so,
                      const std::vector<std::pair<double, size_t>>& ranking, GpuSession& gpu, Store& store,
                      int worker, int worker_device, const std::map<std::string, ResultRecord>& validated,
                      const std::function<const KernelRecord&(size_t, const Variant&, const std::string&)>& kernel_for,
                      ProblemReport& rep) {
  // The finalists timed in turn (A B C A B C ...), so that a drift in clocks or temperature during the
  // sweep falls on all of them. Each finalist's figures pool the repeats of all its rounds: median, p20
  // and p80 of the same samples (timing::percentile, the worker's definition), so the stored median lies
  // within its stored spread. A worker that sends no samples: the rounds' medians are the samples.
  const size_t n = std::min<size_t>((size_t)so.retime_top, ranking.size());
  std::vector<std::vector<double>> rounds(n), samples(n);
  std::vector<bool> all_samples(n, true);
  std::vector<ResultRecord> last(n);
  for (int r = 0; r < so.retime_rounds; ++r)
    for (size_t i = 0; i < n; ++i) {
      const SearchCandidate& c = cands[ranking[i].second];
      // Timed only: each finalist's validated row stands for its validation.
      const auto v = validated.find(c.hash);
      ResultRecord rec = gpu.run(kernel_for((size_t)worker, c.v, c.hash), c.v, p,
                                 json{{"min_reps", 10}, {"max_reps", 10}, {"warmup", 1}, {"samples", true}},
                                 v != validated.end() ? &v->second : nullptr);
      if (rec.status != "ok") continue;
      rounds[i].push_back(rec.ms_median);
      const json rd = rec.detail.empty() ? json::object() : json::parse(rec.detail, nullptr, false);
      const json* ms = rd.is_object() && rd.contains("ms_samples") ? &rd["ms_samples"] : nullptr;
      if (ms && ms->is_array() && !ms->empty())
        for (const json& t : *ms) samples[i].push_back(t.is_number() ? t.get<double>() : 0.0);
      else
        all_samples[i] = false;
      last[i] = rec;
    }
  double best = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) {
    if (rounds[i].empty()) continue;
    const std::vector<double>& pool = all_samples[i] ? samples[i] : rounds[i];
    const double ms = timing::percentile(pool, 0.5);
    ResultRecord rec = last[i];
    json d = rec.detail.empty() ? json::object() : json::parse(rec.detail, nullptr, false);
    if (!d.is_object()) d = json::object();
    d.erase("ms_samples");
    d["sweep_ms_median"] = ranking[i].first;
    d["retime"] = {{"order", "interleaved"}, {"rounds", rounds[i]}, {"finalists", n},
                   {"pooled", all_samples[i] ? "repeats" : "round medians"}, {"samples", pool.size()}};
    if (worker_device >= 0) d["worker_device"] = worker_device;
    rec.detail = d.dump();
    rec.ms_median = ms;
    rec.ms_p20 = timing::percentile(pool, 0.2);
    rec.ms_p80 = timing::percentile(pool, 0.8);
    if (all_samples[i]) rec.reps = (int)pool.size();
    rec.tflops = p.flops() / (ms * 1e-3) / 1e12;
    rec.gbps = p.bytes() / (ms * 1e-3) / 1e9;
    store.put_result(rec, gpu.device());
    if (ms < best) {
      best = ms;
      const SearchCandidate& c = cands[ranking[i].second];
      rep.best_config = c.v.family->config_string(c.v.config);
      rep.best_ms = ms;
      rep.best_tflops = rec.tflops;
    }
  }
}

// A row of a sweep over several workers names the GPU ordinal that ran it (detail.worker_device):
// agreement between GPUs and a crash on one of them are read from the store.
std::string with_worker_device(const std::string& detail, int device) {
  json d = detail.empty() ? json::object() : json::parse(detail, nullptr, false);
  if (!d.is_object()) d = json::object();
  d["worker_device"] = device;
  return d.dump();
}

}  // namespace

SweepSummary tune(const Space& space, const std::vector<Problem>& problems, Store& store, const SweepOptions& opt) {
  if (variants_for(space, problems).empty())
    throw UsageError("no problem matches a variant of the " + space.family->name + " space");
  // One worker per listed device; the first one says whether there is a GPU at all.
  std::vector<std::unique_ptr<GpuSession>> gpus;
  for (int d : opt.devices) {
    RunOptions ro = opt.run;
    ro.device = d;
    gpus.push_back(std::make_unique<GpuSession>(ro));
    if (!gpus[0]->has_gpu()) break;
  }
  std::string arch = opt.arch.empty() ? "sm_90" : opt.arch;
  if (!gpus[0]->has_gpu()) {
    std::fprintf(stderr, "no GPU found (%s): compiling and pruning for %s only, no kernel runs\n",
                 gpus[0]->no_gpu_reason().c_str(), arch.c_str());
    return compile_only(space, problems, store, opt, arch);
  }
  for (size_t i = 0; i < gpus.size(); ++i) {
    const GpuSession& g = *gpus[i];
    if (!g.has_gpu())
      throw UsageError("device " + std::to_string(opt.devices[i]) + ": " + g.no_gpu_reason());
    if (g.device().arch != gpus[0]->device().arch)
      throw UsageError("devices " + std::to_string(opt.devices[0]) + " and " + std::to_string(opt.devices[i]) +
                       " differ in architecture (" + gpus[0]->device().arch + ", " + g.device().arch +
                       "): tune them in separate runs");
    std::fprintf(stderr, "device %d: %s (%s, %d SMs, driver %d)\n", opt.devices[i], g.device().name.c_str(),
                 g.device().arch.c_str(), g.device().sm_count, g.device().driver_version);
  }
  if (!opt.arch.empty() && opt.arch != gpus[0]->device().arch)
    throw UsageError("--arch " + opt.arch + " does not match device " + gpus[0]->device().name + " (" +
                     gpus[0]->device().arch + ")");
  arch = gpus[0]->device().arch;
  const Compiler compiler(arch);
  const SearchOptions& so = opt.search;
  // Every worker thread its own connection to the store (SQLite serialises the writers).
  std::vector<std::unique_ptr<Store>> stores;
  for (size_t i = 0; i < gpus.size(); ++i) stores.push_back(std::make_unique<Store>(store.path()));

  // Strategies that will evaluate every candidate anyway get all of them compiled first, on every core;
  // the others compile what they propose, when they propose it.
  const bool compile_first = so.max_evals.empty() && so.strategy != "guided";
  std::map<std::string, KernelRecord> kernels;
  std::mutex kernels_mu;
  if (compile_first) {
    const std::vector<Variant> variants = variants_for(space, problems);
    Progress cprog("compile " + arch, variants.size(), opt.progress);
    auto ks = compiler.compile_all(variants, &store, [&](size_t d, size_t) { cprog.update(d); });
    cprog.finish();
    for (auto& k : ks) kernels[k.hash] = std::move(k);
  }
  // The kernel record (its cubin included) by reference: map nodes stay put as others are added.
  auto kernel_for = [&](size_t worker, const Variant& v, const std::string& hash) -> const KernelRecord& {
    {
      std::lock_guard<std::mutex> lock(kernels_mu);
      if (auto it = kernels.find(hash); it != kernels.end()) return it->second;
    }
    Store& st = *stores[worker];
    std::optional<KernelRecord> k = st.find_kernel(hash);
    if (!k) {
      k = compiler.compile(v);
      st.put_kernel(*k);
    }
    std::lock_guard<std::mutex> lock(kernels_mu);
    return kernels.emplace(hash, std::move(*k)).first->second;
  };

  SweepSummary sum;
  const double t0 = seconds_now();
  const double deadline = so.time_budget_s > 0 ? t0 + so.time_budget_s : 0;
  // One progress line for the whole sweep (its ETA over every problem's planned evaluations).
  std::vector<std::vector<SearchCandidate>> all_cands;
  size_t planned = 0;
  for (const Problem& p : problems) {
    all_cands.push_back(search_candidates(space, p, compiler, so.shard));
    const size_t n = all_cands.back().size();
    planned += planned_evaluations({so.strategy, so.max_evals.empty() || !n ? 0 : parse_max_evals(so.max_evals, n), so.seed}, n);
  }
  Progress prog("tune " + space.family->name, planned, opt.progress);
  if (deadline > 0) prog.set_limit(deadline - seconds_now());
  size_t evaluations_done = 0;
  std::mutex prog_mu;

  // Per problem: what the store holds for it on this device (reused, not re-run) and its search.
  struct ProblemRun {
    std::map<std::string, ResultRecord> stored;
    std::set<std::string> validated;  // validated by this sweep (its later runs are timed only)
    std::mutex stored_mu;
  };
  std::vector<std::unique_ptr<ProblemRun>> runs(problems.size());
  std::vector<std::optional<ProblemReport>> reports(problems.size());
  const bool several = gpus.size() > 1;

  auto load_stored = [&](size_t pi, Store& st) {
    const Problem& p = problems[pi];
    ResultFilter f;
    f.family = space.family->name;
    f.device = gpus[0]->device().name;
    f.direction = p.direction;
    f.dtype = to_string(p.dtype);
    f.head_dim = p.head_dim;
    f.causal = p.causal;
    for (auto& r : st.results(f))
      if (r.problem == p) runs[pi]->stored[r.kernel_hash] = std::move(r);
  };
  auto evaluate = [&](size_t pi, int w, size_t c, const Proposal& prop, double stop_above) {
    const Problem& p = problems[pi];
    const SearchCandidate& cand = all_cands[pi][c];
    ProblemRun& run = *runs[pi];
    const DeviceInfo& dev = gpus[(size_t)w]->device();
    {
      std::lock_guard<std::mutex> lock(run.stored_mu);
      auto it = run.stored.find(cand.hash);
      // Checked again just before the run: another tune on the same store may have stored it meanwhile.
      if (it == run.stored.end() && stores[(size_t)w]->has_result(cand.hash, dev, p)) {
        load_stored(pi, *stores[(size_t)w]);
        it = run.stored.find(cand.hash);
      }
      // A stored row stands for this evaluation when it was timed with at least the repeats asked for
      // (the worker's default: at least 10), or when it failed (a rerun does not retry a crash).
      const int want = prop.reps > 0 ? prop.reps : timing::kMinReps;
      if (it != run.stored.end() && (it->second.status != "ok" || it->second.reps >= want)) {
        std::lock_guard<std::mutex> plock(prog_mu);
        ++sum.skipped;
        return evaluation_of(it->second, true);
      }
    }
    // A candidate this sweep validated already (halving's later rounds) is timed only.
    std::optional<ResultRecord> validated;
    {
      std::lock_guard<std::mutex> lock(run.stored_mu);
      if (auto it = run.stored.find(cand.hash); it != run.stored.end() && it->second.status == "ok" && run.validated.count(cand.hash))
        validated = it->second;
    }
    const KernelRecord& k = kernel_for((size_t)w, cand.v, cand.hash);
    json plan = json::object();  // the proposal's timing, over the worker's defaults
    if (prop.reps > 0) plan["min_reps"] = plan["max_reps"] = prop.reps;
    if (prop.warmup >= 0) plan["warmup"] = prop.warmup;
    if (stop_above > 0) plan["stop_above_ms"] = stop_above;
    ResultRecord r = gpus[(size_t)w]->run(k, cand.v, p, plan, validated ? &*validated : nullptr);
    if (several) r.detail = with_worker_device(r.detail, opt.devices[(size_t)w]);
    stores[(size_t)w]->put_result(r, dev);
    {
      std::lock_guard<std::mutex> plock(prog_mu);
      sum.by_status[r.status]++;
      sum.ran_kernels |= k.status == "compiled";
    }
    std::lock_guard<std::mutex> lock(run.stored_mu);
    run.stored[cand.hash] = r;
    if (r.status == "ok") run.validated.insert(cand.hash);
    return evaluation_of(r, false);
  };
  // A finished problem's finalists re-timed on the worker's GPU, then its report.
  auto finish = [&](size_t pi, int w, const ProblemSearch& search) {
    const Problem& p = problems[pi];
    std::vector<std::pair<double, size_t>> ranking;
    ProblemReport rep = search.report(&ranking);
    // Re-timed only when something new ran: a rerun over a finished sweep changes nothing.
    if (so.retime_top > 0 && ranking.size() > 1 && rep.reused < rep.evaluations &&
        !(deadline > 0 && seconds_now() >= deadline))
      retime_finalists(all_cands[pi], p, so, ranking, *gpus[(size_t)w], *stores[(size_t)w], w, several ? opt.devices[(size_t)w] : -1,
                       runs[pi]->stored, kernel_for, rep);
    std::fprintf(stderr, "%s: %zu of %zu candidates evaluated (%zu stored before), best %s %.3f ms %.1f TFLOP/s\n",
                 p.str().c_str(), rep.evaluations, rep.space_size, rep.reused, rep.best_config.c_str(), rep.best_ms,
                 rep.best_tflops);
    reports[pi] = std::move(rep);
  };

  step_problems(
      problems.size(), (int)gpus.size(), deadline, seconds_now,
      [&](size_t pi, int w) -> std::unique_ptr<ProblemSearch> {
        if (all_cands[pi].empty()) return nullptr;
        runs[pi] = std::make_unique<ProblemRun>();
        load_stored(pi, *stores[(size_t)w]);
        return std::make_unique<ProblemSearch>(all_cands[pi], problems[pi], so);
      },
      [&](size_t pi, int w, const ProblemSearch::Ticket& t) {
        const SearchEvaluation e = evaluate(pi, w, t.prop.candidate, t.prop, t.stop_above_ms);
        const Variant& v = all_cands[pi][t.prop.candidate].v;
        std::lock_guard<std::mutex> plock(prog_mu);
        prog.update(++evaluations_done, problems[pi].str() + " " + v.family->config_string(v.config));
        return e;
      },
      finish);
  for (auto& r : reports)
    if (r) sum.reports.push_back(std::move(*r));
  prog.finish();
  for (const auto& g : gpus)
    if (g->restarts()) std::fprintf(stderr, "a worker was restarted %d times (crashes or hangs)\n", g->restarts());
  if (deadline > 0 && seconds_now() >= deadline)
    std::fprintf(stderr, "--time-budget reached: stopped; a rerun continues from what is stored\n");
  return sum;
}

}  // namespace flashtune
