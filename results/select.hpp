// Selection: the best valid config per problem, and per (device, family, direction, dtype,
// head_dim, causal, sequence bucket) for the emitted headers.
#pragma once
#include <string>
#include <vector>

#include "core/timing.hpp"
#include "results/store.hpp"

namespace flashtune {

// The worker's fewest repeats for a full timing; rows with fewer (a search's cheap rounds, timings
// stopped early) are picked only for a problem that has no fully timed row.
inline constexpr int kFullTimingReps = timing::kMinReps;

// The rows whose config its family calls bitwise reproducible (Family::reproducible): what a deterministic
// backward may run.
std::vector<ResultRecord> reproducible_rows(const std::vector<ResultRecord>& rows);

// Among `ok` results: the fastest config for each (device, family, direction, problem).
// every_timing: rank on every ok timing, the cheap ones too (reproducible rows: a search may have stopped a
// deterministic config's timing early against a faster non-reproducible one, which its pick does not compete with).
std::vector<ResultRecord> best_per_problem(const std::vector<ResultRecord>& results, bool every_timing = false);

struct BucketChoice {
  std::string device, arch, family, direction, config;
  DType dtype = DType::fp32;
  int head_dim = 0;
  bool causal = false;
  int seq_bucket = 0;
  double tflops = 0;  // geometric mean over the bucket's problems
  int problems = 0;
  // Of paged K/V cache rows (Problem::paged): buckets of their own, whatever their page sizes (a config
  // must be valid on every problem of the bucket, so one whose BLOCK_N does not divide some problem's page
  // is never the pick); only a paged call takes one, and only where its page size suits the config.
  bool paged = false;
  // Among the configs whose family calls them bitwise reproducible only (Family::reproducible): the pick a
  // deterministic backward takes (best_per_bucket(..., true)); buckets of their own in the tables.
  bool deterministic = false;
  // A decoding family's (Family::max_seq_q) buckets are keyed by batch x kv heads too (batch_kv_heads of their
  // problems: decode_bf16.json's B 1, 8, 64 with 8 kv heads make 8, 64, 512): how many (sequence, kv head) pairs
  // the grid has decides how far the keys are split. 0 for every other family: its buckets span every batch.
  int batch_heads = 0;
  // Grouped-query rows (heads_k > 0) of a family without a query-length range make buckets of their own, keyed by
  // the group (query heads per kv head, Problem::group_key): a grouped-query call takes its group's buckets where
  // there are any, else the multi-head ones (0). A decoding family's rows keep 0 (batch x kv heads keys them).
  int group = 0;
};

// A problem's batch x kv heads: batch x heads_k (heads where heads_k is 0, multi-head), at most 2^31 - 1.
int batch_kv_heads(const Problem& p);

// A config must be valid on every problem of its bucket; among those the highest geometric-mean
// TFLOP/s wins (so one huge shape does not dominate). Paged rows make buckets apart from dense ones.
// deterministic: among the reproducible configs only, each choice marked so.
std::vector<BucketChoice> best_per_bucket(const std::vector<ResultRecord>& results, bool deterministic = false);

// The choice a problem gets (as the emitted headers do, tuned::find_in): a grouped-query problem's among its
// group's buckets where there are any, else among the multi-head ones; of those, among the buckets keyed by batch x kv
// heads, those of the value nearest the problem's (by ratio, a tie to the smaller; the others span every batch);
// of them the smallest bucket that holds its sequence length, else the largest there is; among the paged buckets
// for a paged problem and the dense ones otherwise; nullptr when there is none.
// Only choices whose `deterministic` equals the argument.
const BucketChoice* pick_bucket(const std::vector<BucketChoice>& choices, const Problem& p, bool deterministic = false);
// The same for a sequence bucket, batch x kv heads (0: unknown, taken as 1), paged or not, and a group (0 or 1:
// multi-head).
const BucketChoice* pick_bucket(const std::vector<BucketChoice>& choices, int seq_bucket, long long batch_heads,
                                bool paged, bool deterministic, int group = 0);

// The stored config a measurement of problem p runs (experiment, run --best), from one family's results on
// one device: the problem's own best ("problem"), else its sequence bucket's ("bucket"; dense rows, a grouped-query
// problem's group's buckets first; a packed variable-length problem has its own or none); source "" when there is
// neither.
struct StoredChoice {
  std::string config, source;
};
StoredChoice stored_choice(const std::vector<ResultRecord>& results, const Problem& p);

}  // namespace flashtune
