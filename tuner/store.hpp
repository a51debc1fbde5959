// SQLite store: the compile cache (kernels) and every measured attempt (results).
// One transaction per write, WAL journal, a schema version in `meta`.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "tuner/problem.hpp"

struct sqlite3;

namespace flashtune {

inline constexpr int kSchemaVersion = 3;  // 2: results.detail; 3: experiment_runs, experiment_rows

struct DeviceInfo {
  std::string name;          // "NVIDIA H100 80GB HBM3"
  std::string arch;          // "sm_90"
  int sm_count = 0;
  int driver_version = 0;    // cuDriverGetVersion, e.g. 13000
  long long memory_bytes = 0;
  int l2_bytes = 0;
  int max_smem_optin = 0;    // per block, bytes
  int clock_khz = 0;
  std::string slug() const;  // "nvidia_h100_80gb_hbm3"
};

struct Resources {
  int registers = 0, smem_static = 0, stack_bytes = 0, spill_stores = 0, spill_loads = 0;
};

// One compiled (or pruned, or failed) kernel variant, keyed by the hash of everything that
// determines its code: source, options, NVRTC version, arch, name expression.
struct KernelRecord {
  std::string hash;
  std::string family, direction, config;  // config as "K=V,..."
  int head_dim = 0;
  bool causal = false;
  DType dtype = DType::fp32;
  std::string arch, nvrtc_version, options, source_hash;
  std::string name_expression;  // one per kernel of the family, newline-separated
  std::string status;  // compiled | compile_error | pruned
  std::string reason;  // why pruned / the compiler's first error
  std::string lowered_name;  // one per kernel, newline-separated, in launch order
  Resources res;             // the worst over the family's kernels
  double compile_ms = 0;
  std::string log;
  std::string cubin;   // bytes; empty unless status == compiled
};

// One attempt to run a compiled variant on one problem on one device.
struct ResultRecord {
  long long id = 0;
  std::string kernel_hash;
  std::string family, direction, config;
  Problem problem;
  std::string status;  // ok | invalid | crashed | timeout | launch_error | error | pruned | compile_error
  std::string error;
  double max_abs = 0, max_rel = 0, mse = 0;
  std::string detail;  // JSON: per-output errors (backward: dq/dk/dv relative L2), rows checked, determinism
  double ms_median = 0, ms_p20 = 0, ms_p80 = 0;
  int reps = 0;
  double tflops = 0, gbps = 0;
  unsigned long long seed = 0;
  // metadata riding with every result
  std::string device_name, arch, nvrtc_version, options, source_hash, created;
  int sm_count = 0, driver_version = 0;
  Resources res;
};

// One run of an experiment definition (experiments/*.json) on one device: the spec as run and the
// peak probes measured in the same call (matmul TFLOP/s per dtype, copy GB/s), as JSON.
struct ExperimentRun {
  long long id = 0;
  std::string experiment, title, device_name, probes, spec, created;
};

// One implementation on one problem within an experiment run: ours (a family's config), a library
// baseline (cuBLAS) or a Python one (torch SDPA backends, PyTorch CPU, Triton), all in one row format.
struct ExperimentRow {
  long long run_id = 0;
  std::string impl, family, config;
  Problem problem;
  std::string status, error;  // ok | invalid | oom | unsupported | skipped | crashed | timeout | error
  double ms_median = 0, ms_p20 = 0, ms_p80 = 0;
  int reps = 0;
  double tflops = 0, gbps = 0;
  double max_abs = 0, mean_abs = 0, mse = 0, max_rel = 0;  // vs the float64 reference
  long long peak_bytes = 0;                                 // device memory the run needed
  std::string device, detail;                               // detail: JSON
};

struct ResultFilter {
  std::string family, device, dtype, direction;
  int head_dim = 0;         // 0: any
  int causal = -1;          // -1: any
  bool ok_only = false;
};

class Store {
 public:
  explicit Store(const std::string& path);  // creates or opens; throws on a foreign schema
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  std::optional<KernelRecord> find_kernel(const std::string& hash, bool with_cubin = true);
  void put_kernel(const KernelRecord&);

  bool has_result(const std::string& kernel_hash, const DeviceInfo&, const Problem&);
  void put_result(const ResultRecord&, const DeviceInfo&);
  std::vector<ResultRecord> results(const ResultFilter&);

  long long begin_experiment(const ExperimentRun&);  // returns the run id
  void set_experiment_probes(long long run_id, const std::string& probes_json);
  void put_experiment_row(const ExperimentRow&);
  std::vector<ExperimentRun> experiment_runs(const std::string& experiment = "");
  std::vector<ExperimentRow> experiment_rows(long long run_id);

  void drop_cubins();  // keep metadata and resources, drop binaries (for committing a DB)
  const std::string& path() const { return path_; }

 private:
  void exec(const std::string& sql);
  sqlite3* db_ = nullptr;
  std::string path_;
};

}  // namespace flashtune
