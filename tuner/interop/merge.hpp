// `flashtune merge`: stores tuned apart (Slurm array shards, several machines) into one.
//
// Rows are copied with their own times; a row whose key the output already holds is kept as stored
// (row identity = the store's unique keys: kernels.hash, results' UNIQUE(kernel_hash, device_name,
// sm_count, batch, heads, seq_q, seq_k, inputs)); an experiment run, which has no key, is the same run
// when its experiment, device, start time, spec, probes and all its rows are. Every input becomes one provenance
// row of the output, keyed by a hash of its rows, so merging the same content again adds nothing.
// Inputs are opened read-only (any schema of ours, never migrated); the output is created, or
// migrated if it is an older store of ours. Everything is checked before the output is opened, and
// the copy is one transaction: a refused or failed merge leaves the output as it was. Each input is read
// twice: checked and hashed (its rows then dropped), and later, inside the transaction, read again and
// copied (an input whose hash changed in between is refused): memory holds one input's rows at a time,
// and each input's reads together stay within one ReadBudget (rows, stored text).
#pragma once
#include <set>
#include <string>
#include <vector>

#include "results/store.hpp"

namespace flashtune {

struct MergeInputSummary {
  std::string path;
  long long provenance_id = 0;
  bool already = false;  // this content was merged before: nothing copied
  long long kernels = 0, kernels_present = 0, kernels_differ = 0;
  long long results = 0, results_present = 0, results_differ = 0;
  long long experiment_runs = 0, experiment_rows = 0;
};

// Throws UsageError (one line) for a bad path, an input that is missing or not ours or newer, an
// output that exists and is not ours, an input that is the output, a malformed row, or devices
// that do not match (device_mismatch).
std::vector<MergeInputSummary> merge_stores(const std::vector<std::string>& inputs, const std::string& output);

// The devices of several stores must agree: for every device name that two of them hold results
// for, both hold it with the same set of (arch, SM count, driver version) -- normally one. select
// and emit key on the name, so otherwise one name would mix two GPUs' (or two drivers') timings.
// Returns "" or a one-line description of the first mismatch. `what[i]` names sets[i].
std::string device_mismatch(const std::vector<std::set<DeviceSignature>>& sets, const std::vector<std::string>& what);

// A result row from another store or a file, checked before it is copied (later verbs trust what a
// store holds): a family this build knows, of the row's direction, with a config in its domain; a
// known status; a device name without control characters; an arch like sm_90 or sm_90a; figures that decide
// `best` and `run --best` in the ranges a T4 import takes (times 0..1e9 ms, above 0 for status ok, TFLOP/s
// 0..1e4, GB/s 0..1e7, reps 0..1e9; no inf or NaN but in the error figures); a UTC timestamp.
void check_result_row(const ResultRecord&);  // throws UsageError naming the problem
bool is_utc_timestamp(const std::string&);   // YYYY-MM-DDTHH:MM:SS[.f]Z with each field in its range
bool is_arch_name(const std::string&);        // sm_NN, sm_NNN, with an optional trailing 'a'
bool is_result_status(const std::string&);    // ok, invalid, crashed, timeout, launch_error, error, pruned, compile_error
bool is_experiment_name(const std::string&);  // 1..64 of [a-z0-9_]: `report` names files after it

}  // namespace flashtune
