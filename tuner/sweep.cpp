#include "tuner/sweep.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tuner/library_kernels.hpp"
#include "tuner/util.hpp"

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
  double eta = done ? elapsed / done * (total_ - done) : 0;
  std::fprintf(stderr, "%s%s [%zu/%zu] %3d%%  elapsed %s  eta %s  %s%s", tty_ ? "\r\033[K" : "", what_.c_str(), done,
               total_, (int)(100.0 * done / total_), format_duration(elapsed).c_str(), format_duration(eta).c_str(),
               label.substr(0, 60).c_str(), tty_ ? "" : "\n");
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

ResultRecord GpuSession::run(const KernelRecord& k, const Variant& v, const Problem& p) {
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
  const std::vector<Launch> launches = v.family->launches(v.config, p);
  const std::vector<std::string> names = split(k.lowered_name, '\n');
  json kernels = json::array();
  for (size_t i = 0; i < launches.size() && i < names.size(); ++i)
    kernels.push_back({{"name", names[i]},
                       {"grid", {launches[i].grid[0], launches[i].grid[1], launches[i].grid[2]}},
                       {"threads", launches[i].threads},
                       {"smem", launches[i].smem_bytes}});
  json req = {{"op", "run"},
              {"cubin_path", cubin_path},
              {"kernels", kernels},
              {"workspace", v.family->workspace_bytes(v.config, p)},
              {"workspace_fill", v.family->workspace_written ? 0xFF : 0},
              {"check_determinism", opt_.check_determinism}};
  if (!opt_.save_outputs_dir.empty()) req["save_dir"] = opt_.save_outputs_dir;
  take_reply(worker_.request(req, opt_.timeout_s), p, r);
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

std::vector<Variant> variants_for(const Space& s, const std::vector<Problem>& problems) {
  std::vector<Variant> out;
  for (const Variant& v : s.variants()) {
    bool needed = false;
    for (const Problem& p : problems)
      needed |= p.head_dim == v.head_dim && p.causal == v.causal && p.dtype == v.dtype &&
                p.direction == v.family->direction;
    if (needed) out.push_back(v);
  }
  return out;
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
                k.causal ? "yes" : "no", to_string(k.dtype), k.status.c_str(), k.res.registers,
                smem + k.res.smem_static, k.res.spill_stores, k.reason.substr(0, 70).c_str());
  }
}

SweepSummary tune(const Space& space, const std::vector<Problem>& problems, Store& store, const SweepOptions& opt) {
  SweepSummary sum;
  if (variants_for(space, problems).empty())
    throw UsageError("no problem matches a variant of the " + space.family->name + " space");
  GpuSession gpu(opt.run);
  std::string arch = opt.arch.empty() ? "sm_90" : opt.arch;
  if (gpu.has_gpu()) {
    if (!opt.arch.empty() && opt.arch != gpu.device().arch)
      throw UsageError("--arch " + opt.arch + " does not match device " + gpu.device().name + " (" +
                       gpu.device().arch + ")");
    arch = gpu.device().arch;
    std::fprintf(stderr, "device %d: %s (%s, %d SMs, driver %d)\n", opt.run.device, gpu.device().name.c_str(),
                 arch.c_str(), gpu.device().sm_count, gpu.device().driver_version);
  } else {
    std::fprintf(stderr, "no GPU found (%s): compiling and pruning for %s only, no kernel runs\n",
                 gpu.no_gpu_reason().c_str(), arch.c_str());
  }

  const std::vector<Variant> variants = variants_for(space, problems);
  Compiler compiler(arch);
  Progress cprog("compile " + arch, variants.size(), opt.progress);
  const auto kernels = compiler.compile_all(variants, &store, [&](size_t d, size_t) { cprog.update(d); });
  cprog.finish();
  std::map<std::string, int> compile_status;
  for (const auto& k : kernels) compile_status[k.status]++;
  std::fprintf(stderr, "%zu variants:", kernels.size());
  for (auto& [s, n] : compile_status) std::fprintf(stderr, " %d %s", n, s.c_str());
  std::fprintf(stderr, "\n");

  if (!gpu.has_gpu()) {
    print_resource_table(variants, kernels);
    sum.by_status = compile_status;
    return sum;
  }

  // Candidates: every (problem, variant) pair whose d, causal and dtype agree.
  struct Candidate {
    size_t variant;
    const Problem* problem;
  };
  std::vector<Candidate> todo;
  for (const Problem& p : problems)
    for (size_t i = 0; i < variants.size(); ++i) {
      const Variant& v = variants[i];
      if (v.head_dim != p.head_dim || v.causal != p.causal || v.dtype != p.dtype ||
          v.family->direction != p.direction)
        continue;
      if (store.has_result(kernels[i].hash, gpu.device(), p)) {
        ++sum.skipped;
        continue;
      }
      todo.push_back({i, &p});
    }
  if (sum.skipped) std::fprintf(stderr, "%d candidates already stored: skipped\n", sum.skipped);
  Progress prog("tune", todo.size(), opt.progress);
  size_t done = 0;
  for (const Candidate& c : todo) {
    const KernelRecord& k = kernels[c.variant];
    // Checked again just before the run: another tune on the same store may have stored it meanwhile.
    if (store.has_result(k.hash, gpu.device(), *c.problem)) {
      ++sum.skipped;
      prog.update(++done, k.config + ": stored by another run");
      continue;
    }
    ResultRecord r = gpu.run(k, variants[c.variant], *c.problem);
    store.put_result(r, gpu.device());
    sum.by_status[r.status]++;
    sum.ran_kernels |= k.status == "compiled";
    char label[160];
    std::snprintf(label, sizeof label, "%s %s: %s %.1f TFLOP/s", k.config.c_str(), c.problem->str().c_str(),
                  r.status.c_str(), r.tflops);
    prog.update(++done, label);
  }
  prog.finish();
  if (gpu.restarts()) std::fprintf(stderr, "the worker was restarted %d times (crashes or hangs)\n", gpu.restarts());
  return sum;
}

}  // namespace flashtune
