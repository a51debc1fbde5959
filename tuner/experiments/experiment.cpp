#include "tuner/experiments/experiment.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "process/subprocess.hpp"
#include "results/select.hpp"
#include "tuner/interop/merge.hpp"
#include "tuner/space/space.hpp"

using nlohmann::json;

namespace flashtune {

namespace {

const std::set<std::string> kPythonImpls = {"torch_math",  "torch_efficient", "torch_flash",
                                            "torch_cudnn", "torch_cpu",       "triton"};
const std::set<std::string> kLibraryImpls = {"cublas_unfused"};
const std::set<std::string> kPlots = {"compare", "scaling", "backward", "head_dim", "landscape", "tuned_vs_default"};

ImplSpec parse_impl(const std::string& s) {
  ImplSpec i;
  i.name = s;
  if (kPythonImpls.count(s)) {
    i.kind = ImplKind::python;
    return i;
  }
  if (kLibraryImpls.count(s)) {
    i.kind = ImplKind::library;
    return i;
  }
  std::string fam = s, which = "tuned";
  if (auto c = s.find(':'); c != std::string::npos) {
    fam = s.substr(0, c);
    which = s.substr(c + 1);
  }
  if (which != "tuned" && which != "default")
    throw UsageError("implementation '" + s + "': the config must be ':tuned' or ':default'");
  const Family& f = find_family(fam);  // UsageError names the unknown family
  if (f.test_only) throw UsageError("implementation '" + s + "' is a test-only family");
  i.kind = ImplKind::family;
  i.family = &f;
  i.default_config = which == "default";
  return i;
}

std::string resolve(const std::string& path, const std::string& base) {
  std::filesystem::path p(path);
  return p.is_absolute() ? path : (std::filesystem::path(base) / p).string();
}

// The row of an implementation that did not run on a problem.
ExperimentRow unrun_row(long long run, const ImplSpec& impl, const Problem& p, const std::string& status,
                        const std::string& why) {
  ExperimentRow r;
  r.run_id = run;
  r.impl = impl.name;
  r.family = impl.family ? impl.family->name : "";
  r.problem = p;
  r.status = status;
  r.error = why;
  return r;
}

ExperimentRow row_from_result(long long run, const ImplSpec& impl, const ResultRecord& res) {
  ExperimentRow r;
  r.run_id = run;
  r.impl = impl.name;
  r.family = res.family;
  r.config = res.config;
  r.problem = res.problem;
  r.status = res.status;
  r.error = res.error;
  r.ms_median = res.ms_median;
  r.ms_p20 = res.ms_p20;
  r.ms_p80 = res.ms_p80;
  r.reps = res.reps;
  r.tflops = res.tflops;
  r.gbps = res.gbps;
  r.max_abs = res.max_abs;
  r.max_rel = res.max_rel;
  r.mse = res.mse;
  r.device = res.device_name;
  json d = res.detail.empty() ? json::object() : json::parse(res.detail, nullptr, false);
  if (d.is_discarded() || !d.is_object()) d = json::object();
  r.mean_abs = d.value("mean_abs", 0.0);
  r.peak_bytes = d.value("peak_bytes", 0LL);
  r.detail = d.dump();
  return r;
}

// A point is skipped when the same implementation's last measured point of the same kind,
// scaled by FLOPs, predicts more than the limit per run (so a sweep over S stays bounded).
struct Pace {
  std::map<std::string, std::pair<double, double>> last;  // kind -> (ms, flops)
  static std::string kind(const std::string& impl, const Problem& p) {
    return impl + "|" + to_string(p.dtype) + "|" + p.direction + "|" + std::to_string(p.head_dim) + "|" +
           std::to_string(p.causal);
  }
  double predicted_s(const std::string& impl, const Problem& p) const {
    auto it = last.find(kind(impl, p));
    if (it == last.end()) return 0;
    return it->second.first * 1e-3 * p.flops() / it->second.second;
  }
  void record(const ExperimentRow& r) {
    if (r.status == "ok") last[kind(r.impl, r.problem)] = {r.ms_median, r.problem.flops()};
  }
};

std::string fmt_row(const ExperimentRow& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-18s %-40s %-8s %10.4f ms %8.2f TFLOP/s  max_abs %.2g", r.impl.c_str(),
                r.problem.str().c_str(), r.status.c_str(), r.ms_median, r.tflops, r.max_abs);
  std::string s = buf;
  if (!r.error.empty()) s += "  (" + r.error.substr(0, 80) + ")";
  return s;
}

// Runs experiments/baselines.py for one implementation over the problems; its rows come back as
// JSON lines in the same format as ours.
std::vector<ExperimentRow> run_python(const ImplSpec& impl, const std::vector<Problem>& problems,
                                      const ExperimentSpec& spec, const ExperimentOptions& opt, long long run,
                                      const std::string& tmp) {
  const std::string in = tmp + "/problems_" + impl.name + ".json", out = tmp + "/rows_" + impl.name + ".jsonl";
  json list = json::array();
  for (const Problem& p : problems) list.push_back(to_json(p));
  std::ofstream(in) << list.dump();
  std::filesystem::remove(out);
  const std::string script = opt.source_dir + "/experiments/baselines.py";
  std::vector<std::string> args = {opt.python,     script,      "--impl", impl.name,
                                   "--problems",   in,          "--out",  out,
                                   "--reps",       std::to_string(spec.reps),
                                   "--seed",       std::to_string(opt.run.seed),
                                   "--cpu-max-gflop", std::to_string(spec.cpu_max_gflop),
                                   "--time-limit-s",  std::to_string(spec.time_limit_s)};
  // A hung baseline must not hang the experiment: killed at its timeout, its unanswered problems recorded.
  std::string why;
  try {
    ProcessOptions ro;
    ro.search_path = true;  // --python may be a name in PATH
    ro.timeout_s = opt.python_timeout_s;
    why = "baseline process: " + run_process(args, ro).status.describe();
  } catch (const SpawnError& e) {
    why = e.what();
  }
  std::vector<ExperimentRow> rows;
  std::set<size_t> seen;
  std::ifstream f(out);
  for (std::string line; std::getline(f, line);) {
    json j;
    try {
      j = parse_json_bounded(line, "a baseline row");
    } catch (const UsageError&) {
      continue;
    }
    if (!j.is_object()) continue;
    ExperimentRow r;
    r.run_id = run;
    r.impl = impl.name;
    r.config = j.value("config", "");
    try {
      json pj = {{"batch", j.at("batch")},     {"heads", j.at("heads")},   {"seq_q", j.at("seq_q")},
                 {"seq_k", j.at("seq_k")},     {"head_dim", j.at("head_dim")}, {"dtype", j.at("dtype")},
                 {"causal", j.at("causal").get<int>() != 0}, {"direction", j.at("direction")}};
      r.problem = problem_from_json(pj);
    } catch (const std::exception&) {
      continue;
    }
    r.status = j.value("status", "error");
    r.error = j.value("error", "");
    r.ms_median = j.value("ms_median", 0.0);
    r.ms_p20 = j.value("ms_p20", 0.0);
    r.ms_p80 = j.value("ms_p80", 0.0);
    r.reps = j.value("reps", 0);
    r.tflops = j.value("tflops", 0.0);
    r.gbps = j.value("gbps", 0.0);
    r.max_abs = j.value("max_abs", 0.0);
    r.mean_abs = j.value("mean_abs", 0.0);
    r.mse = j.value("mse", 0.0);
    r.max_rel = j.value("max_rel", 0.0);
    r.peak_bytes = j.value("peak_bytes", 0LL);
    r.device = j.value("device", "");
    if (j.contains("detail")) r.detail = j["detail"].dump();
    for (size_t i = 0; i < problems.size(); ++i)
      if (problems[i] == r.problem) seen.insert(i);
    rows.push_back(std::move(r));
  }
  // Problems the script never answered (it died, or was stopped): recorded, not dropped.
  for (size_t i = 0; i < problems.size(); ++i)
    if (!seen.count(i)) rows.push_back(unrun_row(run, impl, problems[i], "error", "no row: " + why));
  return rows;
}

}  // namespace

ExperimentSpec experiment_from_json(const json& j, const std::string& base_dir) {
  if (!j.is_object()) throw UsageError("an experiment must be a JSON object");
  for (auto& [k, _] : j.items())
    if (!std::set<std::string>{"name", "title", "description", "plot", "problems", "implementations", "tune", "reps",
                               "time_limit_s", "cpu_max_gflop"}
             .count(k))
      throw UsageError("experiment: unknown key '" + k + "'");
  ExperimentSpec s;
  if (!j.contains("name") || !j["name"].is_string()) throw UsageError("experiment: missing 'name'");
  s.name = j["name"];
  if (!is_experiment_name(s.name))
    throw UsageError("experiment name '" + brief(s.name) + "' must be 1..64 lower-case letters, digits and '_'");
  auto text = [&](const char* k, const std::string& def) {  // a wrong type names its field
    if (!j.contains(k)) return def;
    if (!j[k].is_string()) throw UsageError(std::string("experiment: '") + k + "' must be a string");
    return j[k].get<std::string>();
  };
  s.title = text("title", s.name);
  s.description = text("description", "");
  s.plot = text("plot", "compare");
  if (!kPlots.count(s.plot)) throw UsageError("experiment: unknown plot '" + s.plot + "'");
  if (!j.contains("problems")) throw UsageError("experiment: missing 'problems'");
  const json& pj = j["problems"];
  s.problems = pj.is_string() ? load_problems(resolve(pj.get<std::string>(), base_dir)) : problems_from_json(pj);
  if (s.problems.empty()) throw UsageError("experiment: no problems");
  for (const Problem& p : s.problems)  // experiment rows and the Python baselines are dense: B, H, Sq, Sk
    if (p.varlen.enabled())
      throw UsageError("experiment: packed variable-length problems are measured by experiments/varlen_vs_peers.py, "
                       "not by experiment definitions");
    else if (p.paged.enabled())
      throw UsageError("experiment: paged K/V cache problems are measured by experiments/decode_vs_peers.py --paged, "
                       "not by experiment definitions");
  if (j.contains("implementations")) {
    if (!j["implementations"].is_array()) throw UsageError("experiment: 'implementations' must be a list");
    for (const auto& i : j["implementations"]) {
      if (!i.is_string()) throw UsageError("experiment: implementations are strings");
      s.impls.push_back(parse_impl(i.get<std::string>()));
    }
  }
  if (j.contains("tune")) {
    if (!j["tune"].is_array()) throw UsageError("experiment: 'tune' must be a list of space files");
    for (const auto& t : j["tune"]) {
      if (!t.is_string()) throw UsageError("experiment: 'tune' lists space files");
      s.tune_spaces.push_back(resolve(t.get<std::string>(), base_dir));
      const Space space = load_space(s.tune_spaces.back());  // validated now, not after an hour
      std::vector<Problem> ps;
      for (const Problem& p : s.problems)
        if (p.direction == space.family->direction) ps.push_back(p);
      if (variants_for(space, ps).empty())
        throw UsageError("experiment: the space " + t.get<std::string>() + " matches none of its problems");
    }
  }
  if (s.impls.empty() && s.tune_spaces.empty()) throw UsageError("experiment: no implementations and nothing to tune");
  auto num = [&](const char* k, double def, double lo, double hi) {
    if (!j.contains(k)) return def;
    if (!j[k].is_number() || j[k].get<double>() < lo || j[k].get<double>() > hi)
      throw UsageError(std::string("experiment: '") + k + "' must be a number in " + std::to_string(lo) + ".." +
                       std::to_string(hi));
    return j[k].get<double>();
  };
  s.reps = (int)num("reps", 30, 3, 1000);
  s.time_limit_s = num("time_limit_s", 2.0, 0.001, 600);
  s.cpu_max_gflop = num("cpu_max_gflop", 50, 0, 1e6);
  s.text = j.dump();
  return s;
}

ExperimentSpec load_experiment(const std::string& path) {
  json j = read_json_file(path);
  // Relative paths in an experiment are relative to the source tree (the experiment's parent folder).
  auto base = std::filesystem::absolute(path).parent_path().parent_path().string();
  try {
    return experiment_from_json(j, base);
  } catch (const json::exception& e) {  // a field of the wrong type: bad input, one line
    throw UsageError(path + ": " + brief(e.what(), 160));
  }
}

bool impl_applies(const ImplSpec& i, const Problem& p) {
  switch (i.kind) {
    case ImplKind::family:
      return i.family->direction == p.direction &&
             std::find(i.family->dtypes.begin(), i.family->dtypes.end(), p.dtype) != i.family->dtypes.end();
    case ImplKind::library:
      return p.direction == "fwd";
    case ImplKind::python:
      // torch's flash backend and our Triton kernel on tensor cores: half precision only; the
      // CPU baseline runs fp32.
      if (i.name == "torch_flash") return p.dtype != DType::fp32;
      if (i.name == "torch_cpu") return p.dtype == DType::fp32;
      return true;
  }
  return false;
}

std::vector<std::pair<std::string, Problem>> experiment_plan(const ExperimentSpec& s) {
  std::vector<std::pair<std::string, Problem>> out;
  for (const auto& i : s.impls)
    for (const auto& p : s.problems)
      if (impl_applies(i, p)) out.emplace_back(i.name, p);
  return out;
}

long long run_experiment(const ExperimentSpec& spec, Store& store, const ExperimentOptions& opt) {
  // 1. Sweeps the experiment asks for (the landscape), stored like any `tune`.
  for (const auto& path : spec.tune_spaces) {
    Space space = load_space(path);
    SweepOptions so;
    so.run = opt.run;
    so.progress = opt.progress;
    std::vector<Problem> ps;
    for (const Problem& p : spec.problems)
      if (p.direction == space.family->direction) ps.push_back(p);
    std::fprintf(stderr, "experiment %s: tuning %s on %zu problems\n", spec.name.c_str(), space.family->name.c_str(),
                 ps.size());
    tune(space, ps, store, so);
  }

  GpuSession gpu(opt.run);
  if (!gpu.has_gpu()) throw UsageError("no GPU found (" + gpu.no_gpu_reason() + "): an experiment measures on a GPU");
  const DeviceInfo& dev = gpu.device();
  const long long run = store.begin_experiment({0, spec.name, spec.title, dev.name, "", spec.text, ""});
  std::fprintf(stderr, "experiment %s (run %lld) on %s\n", spec.name.c_str(), run, dev.name.c_str());
  if (spec.impls.empty()) return run;

  // 2. Peak probes of this GPU, in this call: the denominators of "% of peak".
  json probes = gpu.probe();
  probes["memory_bytes"] = dev.memory_bytes;  // the ceiling of the memory plots
  store.set_experiment_probes(run, probes.dump());
  std::fprintf(stderr, "probes: %s\n", probes.dump().c_str());

  const std::string tmp = make_private_tmpdir("flashtune-exp");  // 0700, under $TMPDIR

  // 3. Python baselines first: they run in their own process while the worker holds no buffers.
  for (const auto& impl : spec.impls) {
    if (impl.kind != ImplKind::python) continue;
    std::vector<Problem> ps;
    for (const Problem& p : spec.problems)
      if (impl_applies(impl, p)) ps.push_back(p);
    if (ps.empty()) continue;
    std::fprintf(stderr, "%s: %zu problems\n", impl.name.c_str(), ps.size());
    for (const auto& r : run_python(impl, ps, spec, opt, run, tmp)) {
      store.put_experiment_row(r);
      std::fprintf(stderr, "  %s\n", fmt_row(r).c_str());
    }
  }

  // 4. Our families: the config per problem (tuned from the store, or the default), compiled together.
  struct Job {
    const ImplSpec* impl;
    Problem problem;
    Variant variant;
    std::string config_source;  // problem | bucket | default
  };
  std::vector<Job> jobs;
  std::vector<ExperimentRow> unsupported;
  for (const auto& impl : spec.impls) {
    if (impl.kind != ImplKind::family) continue;
    const Family& f = *impl.family;
    for (const Problem& p : spec.problems) {
      if (!impl_applies(impl, p)) continue;
      if (std::find(f.head_dims.begin(), f.head_dims.end(), p.head_dim) == f.head_dims.end()) {
        unsupported.push_back(unrun_row(run, impl, p, "unsupported", f.name + " has no head_dim " +
                                                                         std::to_string(p.head_dim)));
        continue;
      }
      Config cfg = f.default_config;
      std::string source = "default";
      if (!impl.default_config) {
        ResultFilter filter{f.name, dev.name, to_string(p.dtype), f.direction, p.head_dim, (int)p.causal, false};  // every status: see select.cpp's superseded
        if (const StoredChoice c = stored_choice(store.results(filter), p); !c.source.empty()) {
          cfg = f.parse_config(c.config);
          source = c.source;
        }
      }
      Variant v{&f, cfg, p.head_dim, p.causal, p.dtype, false, false, problem_mods(p)};
      v.mask = variant_for(f, cfg, p).mask;
      jobs.push_back({&impl, p, v, source});
    }
  }
  for (const auto& r : unsupported) store.put_experiment_row(r);
  std::vector<Variant> variants;
  for (const auto& j : jobs) variants.push_back(j.variant);
  Compiler compiler(dev.arch);
  std::vector<KernelRecord> kernels = compiler.compile_all(variants, &store);

  // One measured (or skipped) point: a point predicted over the time limit is stored as skipped.
  Pace pace;
  auto measure = [&](const ImplSpec& impl, const Problem& p, const std::function<ResultRecord()>& run_it,
                     const json& extra_detail) {
    ExperimentRow row;
    const double predicted = pace.predicted_s(impl.name, p);
    if (predicted > spec.time_limit_s) {
      char why[128];
      std::snprintf(why, sizeof why, "predicted %.1f s per run, over the experiment's %.1f s limit", predicted,
                    spec.time_limit_s);
      row = unrun_row(run, impl, p, "skipped", why);
    } else {
      row = row_from_result(run, impl, run_it());
      json d = json::parse(row.detail);
      d.update(extra_detail);
      row.detail = d.dump();
    }
    pace.record(row);
    store.put_experiment_row(row);
    return row;
  };

  Progress prog("experiment " + spec.name, jobs.size(), opt.progress);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = jobs[i];
    ExperimentRow row = measure(*job.impl, job.problem, [&] { return gpu.run(kernels[i], job.variant, job.problem); },
                                {{"config_source", job.config_source}});
    prog.update(i + 1, fmt_row(row));
  }
  prog.finish();

  // 5. The library baseline (cuBLAS unfused) in the same worker.
  for (const auto& impl : spec.impls) {
    if (impl.kind != ImplKind::library) continue;
    for (const Problem& p : spec.problems)
      if (impl_applies(impl, p))
        std::fprintf(stderr, "  %s\n",
                     fmt_row(measure(impl, p, [&] { return gpu.run_library(impl.name, p); }, json::object())).c_str());
  }
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return run;
}

}  // namespace flashtune
