// The sweep: space x problems -> compile (cached) -> run each variant in the worker ->
// validate -> time -> store, one transaction per candidate; a rerun skips what is stored.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/compile.hpp"
#include "results/store.hpp"
#include "tuner/search/search.hpp"
#include "tuner/sweep/prepare_ahead.hpp"
#include "tuner/space/space.hpp"
#include "tuner/sweep/worker_client.hpp"

namespace flashtune {

// Validated runs of a config whose family claims bitwise-reproducible outputs (Family::reproducible): all
// must agree bit for bit, else the config is invalid.
inline constexpr int kReproducibleRuns = 5;

struct RunOptions {
  int device = 0;
  double timeout_s = 30;          // per candidate; past it the worker is killed: "timeout"
  unsigned long long seed = 20261121;
  long long max_rows = 512;       // reference rows validated per problem
  std::string worker_path;        // default: next to the executable
  bool check_determinism = false; // run twice and compare the outputs' bits
  // File-backed inputs (input_files.hpp): the worker reads q/k/v(/do).bin from this folder instead of
  // generating seeded ones. Absolute path; empty: generated.
  std::string inputs_dir;
  // Where the worker writes the validated run's outputs as raw files (o/lse or dq/dk/dv .bin); empty: nowhere.
  std::string save_outputs_dir;
  // CPU threads the worker's parallel parts use (input generation, reference, validation); 0: every core, for
  // each of N workers too (tune's --worker-threads sets a share).
  int worker_threads = 0;
  // The GPU left idle this long (microseconds) before each timed repeat (0: the repeats back to back, the default).
  // Back-to-back repeats of a heavy kernel run under the power cap (the rows' telemetry: sw_power_cap, lower SM
  // clocks); a pause times it in the regime the peers' profiler timer sees (a synchronised call at a time). Kept in
  // the row's detail.pause_us.
  int pause_us = 0;
};

// Where a worker's time went over a session, as its tuner saw it: the prepares (their number, and the
// worker's phases summed: inputs, reference, upload, total) and the run requests (their number and round
// trips, which hold the worker's phase_ms and what lies between them: the module load, the replies).
struct WorkerTime {
  int prepares = 0, requests = 0;
  nlohmann::json prepare_ms = nlohmann::json::object();
  double request_ms = 0;
};

// A worker and the device it reports; the bridge between compiled kernels and results.
class GpuSession {
 public:
  explicit GpuSession(const RunOptions&);
  ~GpuSession();
  bool has_gpu() const { return has_gpu_; }
  const std::string& no_gpu_reason() const { return no_gpu_reason_; }
  const DeviceInfo& device() const { return device_; }
  int restarts() const { return worker_.restarts(); }
  const WorkerTime& time_spent() const { return spent_; }
  // Runs one compiled kernel on one problem: validated, then timed. Never throws for a bad
  // kernel: crashes, hangs and wrong answers come back as the record's status.
  // `timing` overrides the worker's timing: min_reps, max_reps, warmup, stop_above_ms (stop after 3
  // repeats when their median is over it: detail.early_stopped). detail.timing_ms: the GPU time spent.
  // `validated`: this kernel's validated row on this problem and seed (status ok), from this sweep:
  // the run is timed only (no second comparison with the reference: halving's later rounds and the
  // re-timing of finalists), and the record keeps that row's errors (detail.validation "reused").
  ResultRecord run(const KernelRecord&, const Variant&, const Problem&,
                   const nlohmann::json& timing = nlohmann::json::object(), const ResultRecord* validated = nullptr);
  // Runs a library baseline on one problem, validated and timed like run(): impl "cublas_unfused"
  // (forward; fp32, fp16, bf16). The record has family = impl, empty config and kernel_hash; detail
  // holds mean_abs and peak_bytes (device bytes the run needs, S and P included). Status "oom" when
  // they do not fit (the worker stays up); "error" with a one-line reason for an unknown impl or an
  // unsupported problem.
  ResultRecord run_library(const std::string& impl, const Problem&);
  // Peak probes: {"status":"ok","matmul_fp32_tflops","matmul_tf32_tflops","matmul_bf16_tflops",
  // "matmul_fp16_tflops","copy_gbps",...}: cuBLAS GEMM 8192^3 medians, 1 GiB device copy (read +
  // write bytes). Otherwise {"status": "no_gpu" | "oom" | "crashed" | "timeout" | "error", "error"}.
  nlohmann::json probe();
  // Problems prepared ahead by the tuner (several workers' sweep): a prepare with generated inputs waits for the
  // problem's file there and names it to the worker ("wait" in prepare_ms: the time it waited). nullptr: none.
  void set_prepare_ahead(PrepareAhead* ahead) { ahead_ = ahead; }
  // The worker holds `p`'s inputs and reference already: a run on it needs no prepare.
  bool holds(const Problem& p) const { return prepared_ && prepared_problem_ == p && prepared_inputs_dir_ == opt_.inputs_dir; }

 private:
  // Sends "prepare" unless the worker holds `p` already; false (with r's status and error) on failure.
  bool prepare_for(const Problem& p, ResultRecord& r);
  // A run or run_library request, its round trip in the reply's detail (request_ms), with the phases of the
  // prepare it waited for, if any (prepare_ms).
  nlohmann::json run_request(const nlohmann::json& req);
  // A run/run_library reply into the record: status, errors, timing, TFLOP/s and GB/s, detail
  // (the worker's detail object with mean_abs, peak_bytes and asked_bytes merged in).
  void take_reply(const nlohmann::json& rep, const Problem& p, ResultRecord& r);

  RunOptions opt_;
  WorkerClient worker_;
  DeviceInfo device_;
  bool has_gpu_ = false;
  std::string no_gpu_reason_;
  std::string tmp_dir_;
  bool prepared_ = false;
  Problem prepared_problem_;
  std::string prepared_inputs_dir_;  // "" when the worker holds generated inputs
  nlohmann::json prepare_ms_;        // the last prepare's phases, until the next run's record carries them
  WorkerTime spent_;
  PrepareAhead* ahead_ = nullptr;
  bool warned_rejected_ = false;
};

// A record for a variant that never ran (pruned, compile_error): stored like any other.
ResultRecord unrun_result(const KernelRecord&, const Problem&);

struct SweepSummary {
  std::map<std::string, int> by_status;  // over this sweep's candidates, stored earlier ones included
  int skipped = 0;                       // already in the store
  bool ran_kernels = false;
  std::vector<ProblemReport> reports;    // per problem (with a GPU)
};

struct SweepOptions {
  RunOptions run;
  std::string arch;   // compile target without a GPU (default sm_90); with one, must match or be empty
  bool progress = true;
  SearchOptions search;
  std::vector<int> devices = {0};
  bool json = false;  // the caller prints reports as JSON: progress and tables go to stderr only
};

SweepSummary tune(const Space&, const std::vector<Problem>&, Store&, const SweepOptions&);

// Terminal progress: "[ 41/240]  17%  eta 3m05s  label", redrawn in place on a TTY.
class Progress {
 public:
  Progress(std::string what, size_t total, bool enabled);
  void update(size_t done, const std::string& label = "");
  void finish();
  // A budgeted run ends by then (seconds after the start) at the latest: the ETA shown never passes it.
  void set_limit(double seconds) { limit_ = seconds; }

 private:
  std::string what_;
  size_t total_;
  bool enabled_, tty_;
  double start_;
  double limit_ = 0;
  double last_print_ = -1;
};

}  // namespace flashtune
