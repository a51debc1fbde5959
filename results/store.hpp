// SQLite store: the compile cache (kernels) and every measured attempt (results).
// One BEGIN IMMEDIATE transaction per write, WAL journal, a schema version in `meta`, and
// `PRAGMA application_id` = kApplicationId marking the file as ours. Read-only verbs open it
// with SQLITE_OPEN_READONLY and never migrate; only a write verb migrates, and only our files.
#pragma once
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/kernel_record.hpp"
#include "core/problem.hpp"

struct sqlite3;

namespace flashtune {

// 2: results.detail; 3: experiment_runs, experiment_rows; 4: results.inputs (part of the unique key);
// 5: provenance (merged and imported sources) and `origin` on kernels, results and experiment_runs;
// 6: results.heads_k (grouped-query attention) in the unique key; 7: results.varlen (packed
// variable-length batches: Varlen::key(), '' for dense) in the unique key; 8: results.paged (paged K/V
// caches: Paged::key(), '' for contiguous K/V) in the unique key
inline constexpr int kSchemaVersion = 11;
inline constexpr int kApplicationId = 0x466c546e;  // "FlTn" in the SQLite header, set at creation

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

// One merged store or imported file (schema 5): `source` as given, made absolute; `content_hash` of
// its rows (a store) or bytes (a file), unique, so the same content is never taken twice; the rows it
// added; `upstream`: a merged store's own provenance rows, as JSON.
struct Provenance {
  long long id = 0;
  std::string kind;  // merge | import
  std::string source, content_hash, upstream, created;
  int source_schema = 0;  // a merged store's schema version; 0 for an imported file
  long long kernels = 0, results = 0, experiment_runs = 0;
};

// How results name the device they were measured on. select and emit key on the name alone, so
// one name must not stand for two kinds of GPU (see merge.hpp).
struct DeviceSignature {
  std::string name, arch;
  int sm_count = 0, driver_version = 0;
  bool operator<(const DeviceSignature& o) const {
    return std::tie(name, arch, sm_count, driver_version) < std::tie(o.name, o.arch, o.sm_count, o.driver_version);
  }
  bool operator==(const DeviceSignature&) const = default;
};

// What a copy into a store found: the row added, its key already stored with the same values,
// or its key already stored with other values (the stored row is kept).
enum class Copied { added, present, differs };

// Store::results holds every packed (varlen) and paged row's sequence lengths in memory: at most this many
// in all (q and k, 4 bytes each: 128 MiB), else the read is refused in one line before going further. 20,000
// rows of the largest batch (65,535 sequences, a few bytes of stored text each) would take 10 GB.
inline constexpr long long kMaxResultLengths = 1ll << 25;

// Bounds on what a read of a store holds in memory (best, emit, export, merge, run --best, tune's resume): a
// store may come from someone else, and millions of rows or huge text cells must not exhaust memory.
// - Rows: one read (results, experiment runs, experiment rows, provenance) holds at most kMaxReadRows rows,
//   counted in SQL before one is read (the largest committed store holds 19,611 results rows; a results row
//   takes some 1.5 KB in memory).
// - Text: at most kMaxReadTextBytes of stored text in all (a committed results row holds some 700 bytes), and
//   one results text cell at most kMaxStoredTextBytes (the longest, a packed batch's 65,535 lengths, is about
//   1 MB; the check comes before it is parsed).
// - Any one value SQLite reads or writes (a cubin included): kMaxStoredValueBytes, SQLITE_LIMIT_LENGTH on every
//   connection, so a cell of a GB is refused before SQLite allocates it.
// Past a bound the read is refused in one line (UsageError: exit 2 in the CLI), before the work it feeds.
inline constexpr long long kMaxReadRows = 250000;
inline constexpr long long kMaxReadTextBytes = 256ll << 20;
inline constexpr long long kMaxStoredTextBytes = 4ll << 20;
inline constexpr int kMaxStoredValueBytes = 64 << 20;
// The distinct devices (name, arch, SM count, driver) a store's results may name, as a T4 file's (kMaxT4Devices).
inline constexpr long long kMaxStoreDevices = 4096;

// What reads may still hold. Each read takes a fresh one unless the caller passes its own, which the read then
// draws down: merge passes one to every read of every input, so that all of them together stay within it.
struct ReadBudget {
  long long rows = kMaxReadRows;
  long long text_bytes = kMaxReadTextBytes;
  std::string scope = "one read";                                              // the refusal names it
  std::string advice = "select fewer rows (family, device, dtype, head dim)";  // and ends with this
};

struct ResultFilter {
  std::string family, device, dtype, direction;
  int head_dim = 0;         // 0: any
  int causal = -1;          // -1: any
  bool ok_only = false;
  // Narrower reads for selection alone (the runtime's lookup): every condition is part of the SQL, so rows
  // that do not match are never read.
  bool dense_only = false;  // no packed variable-length rows (best_per_bucket never picks them)
  int paged = -1;           // -1: any; 0: contiguous K/V rows only; 1: paged K/V cache rows only
  bool lean = false;        // kernel_hash, error, detail, options and nvrtc_version read as '' (selection reads none)
  // 0: the ReadBudget's rows (kMaxReadRows); else at most this many (the runtime's lookup: kMaxLookupRows). More
  // matching rows are refused (UsageError) before any is read.
  long long max_rows = 0;
};

// A DB path the CLI accepts: not empty, not ":memory:", not a "file:" URI (each would lose results).
// Throws UsageError.
void check_db_path(const std::string& path);

class Store : public KernelCache {
 public:
  enum class Mode {
    read_write,  // creates a missing or empty file; migrates an older schema of ours
    read_only,   // the file must exist and be ours (any version up to kSchemaVersion); nothing is written
  };
  // Throws UsageError (one line) for a bad path, a missing file (read_only), a folder, a file that is
  // not SQLite, a database that is not ours, or a newer schema: the file is left as it was.
  explicit Store(const std::string& path, Mode mode = Mode::read_write);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  std::optional<KernelRecord> find_kernel(const std::string& hash, bool with_cubin = true) override;
  void put_kernel(const KernelRecord&) override;

  bool has_result(const std::string& kernel_hash, const DeviceInfo&, const Problem&);
  void put_result(const ResultRecord&, const DeviceInfo&);
  // Bounded by the filter's max_rows and by `budget` (a fresh ReadBudget when none is given): UsageError past them.
  std::vector<ResultRecord> results(const ResultFilter&, ReadBudget* budget = nullptr);

  long long begin_experiment(const ExperimentRun&);  // returns the run id
  void set_experiment_probes(long long run_id, const std::string& probes_json);
  void put_experiment_row(const ExperimentRow&);
  std::vector<ExperimentRun> experiment_runs(const std::string& experiment = "", ReadBudget* budget = nullptr);
  std::vector<ExperimentRow> experiment_rows(long long run_id, ReadBudget* budget = nullptr);

  void drop_cubins();  // keep metadata and resources, drop binaries (for committing a DB)

  // --- merge and import (tuner/interop/merge.cpp, tuner/interop/t4.cpp) ---
  // body in one write transaction: put_* and the copies below join it; a throw rolls all of it back.
  void transaction(const std::function<void()>& body);
  // body inside one read transaction: what it reads is one consistent state of the file.
  void snapshot(const std::function<void()>& body);
  // Every kernel row in hash order, stripped binaries included (cubin empty); with_cubin false reads none.
  void each_kernel(const std::function<void(const KernelRecord&)>& fn, bool with_cubin);
  // The distinct devices of the results table: at most kMaxDevices, names of at most 256 bytes (UsageError).
  std::set<DeviceSignature> device_signatures();
  std::vector<Provenance> provenance(ReadBudget* budget = nullptr);  // none before schema 5
  std::optional<Provenance> find_provenance(const std::string& content_hash);
  long long add_provenance(const Provenance&);    // returns its id
  void set_provenance_counts(long long id, long long kernels, long long results, long long experiment_runs);
  // Copies from another store or a file: the row's own `created` is kept, `origin` is a provenance
  // id, and a row whose key is already stored is left as it is (row identity = the unique keys:
  // kernels.hash and results' UNIQUE). Experiment runs have no key: merge.cpp compares a run's rows.
  Copied copy_kernel(const KernelRecord&, long long origin);
  Copied copy_result(const ResultRecord&, long long origin);
  // Runs with the same experiment, device, start time, spec and probes (candidates for the same run).
  std::vector<long long> find_experiment_runs(const ExperimentRun&);
  long long copy_experiment_run(const ExperimentRun&, long long origin);  // the new run's id
  const std::string& path() const { return path_; }
  int schema_version() const { return version_; }  // as found on open (read_only) or after migrating

 private:
  void exec(const std::string& sql);
  // body inside BEGIN IMMEDIATE ... COMMIT; SQLITE_BUSY where SQLite did not wait is retried.
  void write_txn(const std::function<void()>& body);
  void open_checked(Mode mode);
  sqlite3* db_ = nullptr;
  std::string path_;
  bool read_only_ = false;
  int version_ = kSchemaVersion;
  int txn_depth_ = 0;  // write_txn nesting: inner calls join the outer transaction
  bool has_detail_ = true, has_inputs_ = true, has_heads_k_ = true, has_varlen_ = true, has_paged_ = true, has_mask_ = true, has_alibi_ = true, has_mask_mod_ = true, has_experiments_ = true, has_provenance_ = true;  // older stores read read-only
};

}  // namespace flashtune
