// Experiments: one definition file (experiments/*.json) names problems and implementations; one
// call runs every implementation on every problem on this GPU -- our families (tuned or default
// config), the cuBLAS unfused baseline in the worker, and the Python baselines (torch SDPA backends,
// PyTorch on the CPU, our Triton kernel) in a subprocess -- and stores one row per (impl, problem)
// with the peak probes of the same call. Reports are drawn from those rows (reports/make_report.py).
#pragma once
#include <string>
#include <vector>

#include "results/store.hpp"
#include "tuner/sweep/sweep.hpp"

namespace flashtune {

// How an implementation is run.
enum class ImplKind { family, library, python };

struct ImplSpec {
  std::string name;          // as written: "fa2_mma", "fa2_mma:default", "cublas_unfused", "torch_flash"
  ImplKind kind = ImplKind::family;
  const Family* family = nullptr;  // kind == family
  bool default_config = false;     // "<family>:default": the family's fixed default instead of the tuned one
};

struct ExperimentSpec {
  std::string name, title, description;
  std::string plot;  // compare | scaling | backward | head_dim | landscape | tuned_vs_default
  std::vector<Problem> problems;
  std::vector<ImplSpec> impls;
  std::vector<std::string> tune_spaces;  // space files swept over the problems before measuring
  int reps = 30;                 // Python baselines: timed repeats
  double time_limit_s = 2.0;     // a point predicted to take longer per run is skipped (larger S only)
  double cpu_max_gflop = 50;     // PyTorch CPU: larger problems are skipped
  std::string text;              // the file as read, stored with the run
};

ExperimentSpec experiment_from_json(const nlohmann::json&, const std::string& base_dir);  // UsageError
ExperimentSpec load_experiment(const std::string& path);

// Supported by the implementation at all (direction, dtype); unsupported head dims still get a row.
bool impl_applies(const ImplSpec&, const Problem&);

struct ExperimentOptions {
  RunOptions run;
  std::string python = "python3";
  std::string source_dir;        // where experiments/baselines.py lives
  double python_timeout_s = 1800;
  bool progress = true;
};

// Runs the experiment and stores it; returns the run id. Throws UsageError without a GPU.
long long run_experiment(const ExperimentSpec&, Store&, const ExperimentOptions&);

// The (impl, problem) pairs the experiment would measure, for --dry-run.
std::vector<std::pair<std::string, Problem>> experiment_plan(const ExperimentSpec&);

}  // namespace flashtune
