#include "tuner/sweep/sweep.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
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
#include "worker/prepared.hpp"

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

GpuSession::GpuSession(const RunOptions& opt) : opt_(opt), worker_(opt.device, opt.worker_path, opt.worker_threads) {
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

namespace {
// Adds `more`'s phases (ms by name) into `into`.
void add_phases(json& into, const json& more) {
  if (!into.is_object()) into = json::object();
  if (!more.is_object()) return;
  for (const auto& [phase, ms] : more.items())
    if (ms.is_number()) into[phase] = into.value(phase, 0.0) + ms.get<double>();
}
}  // namespace

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
              {"mask_blocks", v.mask ? json::array({v.family->mask_blocks(v.config).first,
                                                   v.family->mask_blocks(v.config).second})
                                     : json::array()},
              {"workspace_fill", v.family->workspace_written ? 0xFF : 0},
              {"check_determinism", opt_.check_determinism},
              {"reproducible_runs", v.family->reproducible(v.config) ? kReproducibleRuns : 0}};
  for (const TensorMapSpec& m : v.family->tensor_maps(v.config, p))
    req["tensor_maps"].push_back(
        {{"tensor", m.tensor}, {"box_rows", m.box_rows}, {"box_cols", m.box_cols}, {"swizzle", m.swizzle_bytes}});
  if (!opt_.save_outputs_dir.empty()) req["save_dir"] = opt_.save_outputs_dir;
  if (!timing.empty()) req["timing"] = timing;
  if (opt_.pause_us > 0) req["timing"]["pause_us"] = opt_.pause_us;
  if (validated) req["time_only"] = true;
  take_reply(run_request(req), p, r);
  if (validated && r.status == "ok") {
    r.max_abs = validated->max_abs;
    r.max_rel = validated->max_rel;
    r.mse = validated->mse;
    // The validation's findings (errors per output, bounds, rows checked) from the validated row; this
    // run's own timing, telemetry and phases over them.
    json d = validated->detail.empty() ? json::object() : json::parse(validated->detail, nullptr, false);
    if (!d.is_object()) d = json::object();
    const json mine = r.detail.empty() ? json::object() : json::parse(r.detail, nullptr, false);
    for (const char* key : {"timing_ms", "telemetry", "phase_ms", "early_stopped", "worker_device", "ms_samples",
                            "request_ms", "pause_us"}) {
      d.erase(key);
      if (mine.is_object() && mine.contains(key)) d[key] = mine[key];
    }
    // The prepares this row's runs waited for add up: the row stands for all of them.
    if (mine.is_object() && mine.contains("prepare_ms")) add_phases(d["prepare_ms"], mine["prepare_ms"]);
    d["validation"] = "reused";
    r.detail = d.dump();
  }
  return r;
}

bool GpuSession::prepare_for(const Problem& p, ResultRecord& r) {
  // Generated and file-backed inputs of the same problem are different problems to the cache.
  if (holds(p)) return true;
  json req = {{"op", "prepare"}, {"problem", to_json(p)}, {"seed", opt_.seed}, {"max_rows", opt_.max_rows}};
  if (!opt_.inputs_dir.empty()) req["inputs_dir"] = opt_.inputs_dir;
  // Prepared ahead: the worker reads the problem's file instead of computing it (it checks the file first).
  double waited_ms = 0;
  if (ahead_ && opt_.inputs_dir.empty())
    if (const std::string file = ahead_->wait(p, &waited_ms); !file.empty()) req["prepared_file"] = file;
  json rep = worker_.request(req, kPrepareTimeout);
  ++spent_.prepares;
  prepare_ms_ = rep.contains("prepare_ms") && rep["prepare_ms"].is_object() ? rep["prepare_ms"] : json();
  if (req.contains("prepared_file") || waited_ms > 0) {
    if (!prepare_ms_.is_object()) prepare_ms_ = json::object();
    prepare_ms_["wait"] = waited_ms;
  }
  add_phases(spent_.prepare_ms, prepare_ms_);
  if (rep.contains("prepared_rejected") && !warned_rejected_) {
    warned_rejected_ = true;  // the worker prepared the problem itself: slower, never wrong
    std::fprintf(stderr, "device %d: the prepared file of %s was not used (%s)\n", opt_.device, p.str().c_str(),
                 rep["prepared_rejected"].is_string() ? rep["prepared_rejected"].get<std::string>().c_str() : "?");
  }
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

json GpuSession::run_request(const json& req) {
  const auto t0 = std::chrono::steady_clock::now();
  json rep = worker_.request(req, opt_.timeout_s);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ++spent_.requests;
  spent_.request_ms += ms;
  if (!rep.contains("detail") || !rep["detail"].is_object()) rep["detail"] = json::object();
  rep["detail"]["request_ms"] = ms;
  if (prepare_ms_.is_object() && !prepare_ms_.empty()) rep["detail"]["prepare_ms"] = prepare_ms_;
  prepare_ms_ = json();
  return rep;
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
  take_reply(run_request({{"op", "run_library"}, {"impl", impl}}), p, r);
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
      // Timed only: each finalist's validated row stands for its validation (after the first round, the
      // previous round's row, which carries it on with the prepares its runs waited for).
      const auto v = validated.find(c.hash);
      const ResultRecord* stands = !rounds[i].empty() ? &last[i] : v != validated.end() ? &v->second : nullptr;
      ResultRecord rec = gpu.run(kernel_for((size_t)worker, c.v, c.hash), c.v, p,
                                 json{{"min_reps", 10}, {"max_reps", 10}, {"warmup", 1}, {"samples", true}}, stands);
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

// "device D: N prepares S s (inputs S s, reference S s, upload S s), N runs S s": where a worker's time went
// (the rest of the sweep's wall time is the tuner's: compiles, stores, waits).
void print_time_spent(int device, const WorkerTime& t) {
  if (t.prepares == 0 && t.requests == 0) return;
  auto s = [](double ms) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f s", ms / 1000);
    return std::string(buf);
  };
  std::string phases;
  for (const auto& [phase, ms] : t.prepare_ms.items())
    if (phase != "total" && ms.is_number()) phases += (phases.empty() ? "" : ", ") + phase + " " + s(ms.get<double>());
  std::fprintf(stderr, "device %d: %d prepares %s (%s), %d runs %s\n", device, t.prepares,
               s(t.prepare_ms.value("total", 0.0)).c_str(), phases.c_str(), t.requests, s(t.request_ms).c_str());
}

// A row of a sweep over several workers names the GPU ordinal that ran it (detail.worker_device):
// agreement between GPUs and a crash on one of them are read from the store.
std::string with_worker_device(const std::string& detail, int device) {
  json d = detail.empty() ? json::object() : json::parse(detail, nullptr, false);
  if (!d.is_object()) d = json::object();
  d["worker_device"] = device;
  return d.dump();
}

// The order a sweep starts its problems in: the cheapest to prepare first (prepare_cost: the float64 reference's
// work), in the given order among equals. The tuner's prepare-ahead thread computes the references in this order,
// a few problems ahead of the GPUs (tuner/sweep/prepare_ahead.hpp): cheap ones first get every GPU running at once,
// and the costly ones (a backward's reference of S = 16k is ~10^11 float64 operations) are computed while the GPUs
// run the cheap ones, instead of while the GPUs wait for them. Issue 33: in the configs' order two H200s waited
// 2.7 and 3.0 s for the backward's S = 16k reference (it was the third problem to start). The rows, the picks and
// the reports (given back in the caller's order) do not depend on the order; with file-backed inputs (nothing
// prepared ahead) the given order stays.
std::vector<Problem> start_order(const std::vector<Problem>& problems, const SweepOptions& opt) {
  std::vector<Problem> out = problems;
  if (!opt.run.inputs_dir.empty()) return out;
  std::vector<std::pair<double, size_t>> cost(problems.size());
  for (size_t i = 0; i < problems.size(); ++i) cost[i] = {prepare_cost(problems[i], opt.run.max_rows), i};
  std::stable_sort(cost.begin(), cost.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < problems.size(); ++i) out[i] = problems[cost[i].second];
  return out;
}

// One GPU sweep, shared by its worker threads (step_problems, one per device): the workers and a store
// connection each, the kernels compiled so far, each problem's candidates, stored rows and report, the
// summary and the one progress line. Its pieces: compile (kernel), reuse a stored row (reuse), a row this
// sweep validated (validated_row), run on the GPU (measure), store (record), and a finished problem's
// re-timing and report (finish). Three locks: kernels_mu_ (the kernels), a problem's ProblemRun::mu (its
// rows) and progress_mu_ (the summary and the progress line), held one at a time, except progress_mu_
// inside a problem's mu where a stored row is reused.
class Sweep {
 public:
  Sweep(const Space& space, const std::vector<Problem>& problems, Store& store, const SweepOptions& opt,
        std::vector<std::unique_ptr<GpuSession>> gpus)
      : space_(space),
        problems_(start_order(problems, opt)),
        store_(store),
        opt_(opt),
        so_(opt.search),
        gpus_(std::move(gpus)),
        compiler_(gpus_[0]->device().arch),
        several_(gpus_.size() > 1),
        runs_(problems.size()),
        reports_(problems.size()) {
    given_.resize(problems_.size());
    std::vector<bool> taken(problems.size());
    for (size_t pi = 0; pi < problems_.size(); ++pi)  // each started problem's place in the caller's list
      for (size_t i = 0; i < problems.size(); ++i)
        if (!taken[i] && problems[i] == problems_[pi]) {
          taken[i] = true;
          given_[pi] = i;
          break;
        }
    // Every worker thread its own connection to the store (SQLite serialises the writers).
    for (size_t i = 0; i < gpus_.size(); ++i) stores_.push_back(std::make_unique<Store>(store.path()));
  }

  SweepSummary run() {
    prepare_ahead();
    compile_upfront();
    const double t0 = seconds_now();
    deadline_ = so_.time_budget_s > 0 ? t0 + so_.time_budget_s : 0;
    plan();
    step_problems(
        problems_.size(), (int)gpus_.size(), deadline_, seconds_now,
        [this](size_t pi, int w) { return start(pi, w); },
        [this](size_t pi, int w, const ProblemSearch::Ticket& t) { return step(pi, w, t); },
        [this](size_t pi, int w, const ProblemSearch& search) { finish(pi, w, search); },
        [this](size_t pi, int w) {
          return !ahead_ || ahead_->ready(pi) || gpus_[(size_t)w]->holds(problems_[pi]);
        });
    if (ahead_) {
      for (auto& g : gpus_) g->set_prepare_ahead(nullptr);
      if (ahead_->prepared())
        std::fprintf(stderr, "tuner: %d problems prepared ahead in %.1f s\n", ahead_->prepared(),
                     ahead_->prepare_ms() / 1000);
      ahead_.reset();  // its thread is idle by now, or ends after the problem it is on
    }
    std::vector<std::optional<ProblemReport>> given(reports_.size());  // the reports in the caller's order
    for (size_t pi = 0; pi < reports_.size(); ++pi) given[given_[pi]] = std::move(reports_[pi]);
    for (auto& r : given)
      if (r) sum_.reports.push_back(std::move(*r));
    progress_->finish();
    for (const auto& g : gpus_)
      if (g->restarts()) std::fprintf(stderr, "a worker was restarted %d times (crashes or hangs)\n", g->restarts());
    for (size_t w = 0; w < gpus_.size(); ++w) print_time_spent(opt_.devices[w], gpus_[w]->time_spent());
    if (deadline_ > 0 && seconds_now() >= deadline_)
      std::fprintf(stderr, "--time-budget reached: stopped; a rerun continues from what is stored\n");
    return std::move(sum_);
  }

 private:
  // One problem's rows on this device: stored ones (reused, not re-run) and those this sweep validated
  // (their later runs are timed only).
  struct ProblemRun {
    std::map<std::string, ResultRecord> stored;  // by kernel hash
    std::set<std::string> validated;
    std::mutex mu;
  };

  // Prepare ahead (issue 33): one thread of the tuner computes each problem's inputs and float64 reference once,
  // in the order the problems start and up to the workers' number plus one past the furthest one a worker
  // asked for, into files the workers read (tuner/sweep/prepare_ahead.hpp); it starts before the compile so
  // that the first problems are ready sooner. File-backed inputs are the workers' to read.
  void prepare_ahead() {
    if (!opt_.run.inputs_dir.empty()) return;
    ahead_ = std::make_unique<PrepareAhead>(problems_, opt_.run.seed, opt_.run.max_rows, (int)gpus_.size() + 1,
                                            opt_.run.worker_threads);
    for (auto& g : gpus_) g->set_prepare_ahead(ahead_.get());
  }

  // Compile. Strategies that will evaluate every candidate anyway get all of them compiled first, on every
  // core; the others compile what they propose, when they propose it (kernel).
  void compile_upfront() {
    if (!so_.max_evals.empty() || so_.strategy == "guided") return;
    const std::vector<Variant> variants = variants_for(space_, problems_);
    Progress cprog("compile " + compiler_.arch(), variants.size(), opt_.progress);
    auto ks = compiler_.compile_all(variants, &store_, [&](size_t d, size_t) { cprog.update(d); });
    cprog.finish();
    for (auto& k : ks) kernels_[k.hash] = std::move(k);
  }

  // The kernel record (its cubin included) by reference: map nodes stay put as others are added. Compiled
  // here, and stored, unless compiled before or found in the store.
  const KernelRecord& kernel(size_t w, const Variant& v, const std::string& hash) {
    {
      std::lock_guard<std::mutex> lock(kernels_mu_);
      if (auto it = kernels_.find(hash); it != kernels_.end()) return it->second;
    }
    Store& st = *stores_[w];
    std::optional<KernelRecord> k = st.find_kernel(hash);
    if (!k) {
      k = compiler_.compile(v);
      st.put_kernel(*k);
    }
    std::lock_guard<std::mutex> lock(kernels_mu_);
    return kernels_.emplace(hash, std::move(*k)).first->second;
  }

  // Each problem's candidates, and one progress line for the whole sweep (its ETA over every problem's
  // planned evaluations).
  void plan() {
    size_t planned = 0;
    for (const Problem& p : problems_) {
      cands_.push_back(search_candidates(space_, p, compiler_, so_.shard));
      const size_t n = cands_.back().size();
      planned += planned_evaluations(
          {so_.strategy, so_.max_evals.empty() || !n ? 0 : parse_max_evals(so_.max_evals, n), so_.seed}, n);
    }
    progress_.emplace("tune " + space_.family->name, planned, opt_.progress);
    if (deadline_ > 0) progress_->set_limit(deadline_ - seconds_now());
  }

  // A problem's search, with what the store holds for it; nullptr when no candidate fits it.
  std::unique_ptr<ProblemSearch> start(size_t pi, int w) {
    if (cands_[pi].empty()) {
      if (ahead_) ahead_->done(pi);
      return nullptr;
    }
    runs_[pi] = std::make_unique<ProblemRun>();
    load_stored(pi, *stores_[(size_t)w]);
    return std::make_unique<ProblemSearch>(cands_[pi], problems_[pi], so_);
  }

  void load_stored(size_t pi, Store& st) {
    const Problem& p = problems_[pi];
    ResultFilter f;
    f.family = space_.family->name;
    f.device = gpus_[0]->device().name;
    f.direction = p.direction;
    f.dtype = to_string(p.dtype);
    f.head_dim = p.head_dim;
    f.causal = p.causal;
    for (auto& r : st.results(f))
      if (r.problem == p) runs_[pi]->stored[r.kernel_hash] = std::move(r);
  }

  // One evaluation of a ticket, then the progress line.
  SearchEvaluation step(size_t pi, int w, const ProblemSearch::Ticket& t) {
    const SearchEvaluation e = evaluate(pi, w, t);
    const Variant& v = cands_[pi][t.prop.candidate].v;
    std::lock_guard<std::mutex> lock(progress_mu_);
    progress_->update(++evaluations_done_, problems_[pi].str() + " " + v.family->config_string(v.config));
    return e;
  }

  SearchEvaluation evaluate(size_t pi, int w, const ProblemSearch::Ticket& t) {
    const SearchCandidate& cand = cands_[pi][t.prop.candidate];
    if (std::optional<SearchEvaluation> e = reuse(pi, w, cand, t.prop)) return *e;
    const std::optional<ResultRecord> validated = validated_row(pi, cand.hash);
    const KernelRecord& k = kernel((size_t)w, cand.v, cand.hash);
    const ResultRecord r = measure(pi, w, k, cand.v, t, validated ? &*validated : nullptr);
    record(pi, w, cand.hash, k, r);
    return evaluation_of(r, false);
  }

  // Reuse: a stored row stands for this evaluation when it was timed with at least the repeats asked for
  // (the worker's default: at least 10), or when it failed (a rerun does not retry a crash).
  std::optional<SearchEvaluation> reuse(size_t pi, int w, const SearchCandidate& cand, const Proposal& prop) {
    ProblemRun& run = *runs_[pi];
    std::lock_guard<std::mutex> lock(run.mu);
    auto it = run.stored.find(cand.hash);
    // Checked again just before the run: another tune on the same store may have stored it meanwhile.
    Store& st = *stores_[(size_t)w];
    if (it == run.stored.end() && st.has_result(cand.hash, gpus_[(size_t)w]->device(), problems_[pi])) {
      load_stored(pi, st);
      it = run.stored.find(cand.hash);
    }
    const int want = prop.reps > 0 ? prop.reps : timing::kMinReps;
    if (it == run.stored.end() || (it->second.status == "ok" && it->second.reps < want)) return std::nullopt;
    std::lock_guard<std::mutex> plock(progress_mu_);
    ++sum_.skipped;
    return evaluation_of(it->second, true);
  }

  // Validate: a candidate this sweep validated already (halving's later rounds) is timed only.
  std::optional<ResultRecord> validated_row(size_t pi, const std::string& hash) {
    ProblemRun& run = *runs_[pi];
    std::lock_guard<std::mutex> lock(run.mu);
    const auto it = run.stored.find(hash);
    if (it != run.stored.end() && it->second.status == "ok" && run.validated.count(hash)) return it->second;
    return std::nullopt;
  }

  // Time: the kernel run on worker w's GPU with the proposal's timing over the worker's defaults, validated
  // unless `validated` stands for that.
  ResultRecord measure(size_t pi, int w, const KernelRecord& k, const Variant& v, const ProblemSearch::Ticket& t,
                       const ResultRecord* validated) {
    json plan = json::object();
    if (t.prop.reps > 0) plan["min_reps"] = plan["max_reps"] = t.prop.reps;
    if (t.prop.warmup >= 0) plan["warmup"] = t.prop.warmup;
    if (t.stop_above_ms > 0) plan["stop_above_ms"] = t.stop_above_ms;
    ResultRecord r = gpus_[(size_t)w]->run(k, v, problems_[pi], plan, validated);
    if (several_) r.detail = with_worker_device(r.detail, opt_.devices[(size_t)w]);
    return r;
  }

  // Record: the row stored on worker w's connection, counted, and kept for the problem's later evaluations.
  void record(size_t pi, int w, const std::string& hash, const KernelRecord& k, const ResultRecord& r) {
    stores_[(size_t)w]->put_result(r, gpus_[(size_t)w]->device());
    {
      std::lock_guard<std::mutex> lock(progress_mu_);
      sum_.by_status[r.status]++;
      sum_.ran_kernels |= k.status == "compiled";
    }
    ProblemRun& run = *runs_[pi];
    std::lock_guard<std::mutex> lock(run.mu);
    run.stored[hash] = r;
    if (r.status == "ok") run.validated.insert(hash);
  }

  // A finished problem's finalists re-timed on the worker's GPU, then its report.
  void finish(size_t pi, int w, const ProblemSearch& search) {
    const Problem& p = problems_[pi];
    std::vector<std::pair<double, size_t>> ranking;
    ProblemReport rep = search.report(&ranking);
    // Re-timed only when something new ran: a rerun over a finished sweep changes nothing.
    if (so_.retime_top > 0 && ranking.size() > 1 && rep.reused < rep.evaluations &&
        !(deadline_ > 0 && seconds_now() >= deadline_))
      retime_finalists(cands_[pi], p, so_, ranking, *gpus_[(size_t)w], *stores_[(size_t)w], w,
                       several_ ? opt_.devices[(size_t)w] : -1, runs_[pi]->stored,
                       [this](size_t worker, const Variant& v, const std::string& hash) -> const KernelRecord& {
                         return kernel(worker, v, hash);
                       },
                       rep);
    if (ahead_) ahead_->done(pi);  // nothing runs on it any more: its file goes
    std::fprintf(stderr, "%s: %zu of %zu candidates evaluated (%zu stored before), best %s %.3f ms %.1f TFLOP/s\n",
                 p.str().c_str(), rep.evaluations, rep.space_size, rep.reused, rep.best_config.c_str(), rep.best_ms,
                 rep.best_tflops);
    reports_[pi] = std::move(rep);
  }

  const Space& space_;
  const std::vector<Problem> problems_;  // in the order the sweep starts them (start_order)
  std::vector<size_t> given_;            // problem pi's index in the caller's list
  Store& store_;  // the caller's connection: the upfront compile's cache
  const SweepOptions& opt_;
  const SearchOptions& so_;
  std::vector<std::unique_ptr<GpuSession>> gpus_;  // one per device of opt_.devices
  std::vector<std::unique_ptr<Store>> stores_;     // one connection per worker thread
  std::unique_ptr<PrepareAhead> ahead_;            // the problems' inputs and references, prepared ahead
  const Compiler compiler_;
  const bool several_;  // more than one worker: rows name their GPU (detail.worker_device)
  double deadline_ = 0;  // --time-budget's end (0: none), counted from after the upfront compile

  std::map<std::string, KernelRecord> kernels_;  // by hash
  std::mutex kernels_mu_;

  std::vector<std::vector<SearchCandidate>> cands_;      // per problem
  std::vector<std::unique_ptr<ProblemRun>> runs_;        // per problem, made when its search starts
  std::vector<std::optional<ProblemReport>> reports_;    // per problem, once finished

  std::optional<Progress> progress_;
  SweepSummary sum_;
  size_t evaluations_done_ = 0;
  std::mutex progress_mu_;  // progress_, sum_ and evaluations_done_
};

// One worker per listed device; the first one says whether there is a GPU at all. The first starts alone (no GPU:
// no others), the rest side by side: each start is a process, a CUDA context and a hello, which one after the
// other put their sum before the sweep.
std::vector<std::unique_ptr<GpuSession>> start_workers(const SweepOptions& opt) {
  auto options = [&](int d) {
    RunOptions ro = opt.run;
    ro.device = d;
    // Every worker keeps every core unless --worker-threads says otherwise: on four H200s of one host a share of
    // cores / 4 made each backward problem's float64 reference, which its GPU waits for, 2-4x slower and the
    // sweep's backward 38.7 s against 27.2 s (docs/measurements.md, issue 33).
    return ro;
  };
  std::vector<std::unique_ptr<GpuSession>> gpus;
  gpus.push_back(std::make_unique<GpuSession>(options(opt.devices[0])));
  if (!gpus[0]->has_gpu() || opt.devices.size() == 1) return gpus;
  gpus.resize(opt.devices.size());
  std::vector<std::thread> starting;
  std::vector<std::exception_ptr> failed(opt.devices.size());
  for (size_t i = 1; i < opt.devices.size(); ++i)
    starting.emplace_back([&, i] {
      try {
        gpus[i] = std::make_unique<GpuSession>(options(opt.devices[i]));
      } catch (...) {
        failed[i] = std::current_exception();
      }
    });
  for (auto& t : starting) t.join();
  for (const auto& e : failed)
    if (e) std::rethrow_exception(e);
  return gpus;
}

// Every listed device has a GPU of one architecture, the one --arch names if given.
void check_workers(const std::vector<std::unique_ptr<GpuSession>>& gpus, const SweepOptions& opt) {
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
}

}  // namespace

SweepSummary tune(const Space& space, const std::vector<Problem>& problems, Store& store, const SweepOptions& opt) {
  if (variants_for(space, problems).empty())
    throw UsageError("no problem matches a variant of the " + space.family->name + " space");
  std::vector<std::unique_ptr<GpuSession>> gpus = start_workers(opt);
  if (!gpus[0]->has_gpu()) {
    const std::string arch = opt.arch.empty() ? "sm_90" : opt.arch;
    std::fprintf(stderr, "no GPU found (%s): compiling and pruning for %s only, no kernel runs\n",
                 gpus[0]->no_gpu_reason().c_str(), arch.c_str());
    return compile_only(space, problems, store, opt, arch);
  }
  check_workers(gpus, opt);
  return Sweep(space, problems, store, opt, std::move(gpus)).run();
}

}  // namespace flashtune
