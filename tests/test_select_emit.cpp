#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/family.hpp"
#include "core/util.hpp"
#include "fixture.hpp"
#include "results/emit.hpp"
#include "results/select.hpp"
#include "templates/tuned_config.h"

using namespace flashtune;
namespace fs = std::filesystem;

namespace {
std::vector<ResultRecord> fixture_results() {
  const auto path = fixture::scratch_dir() / "sel.db";  // removed at exit
  std::vector<ResultRecord> r;
  {
    fs::remove(path);
    Store s(path.string());
    fixture::fill_fixture(s);
    r = s.results({});
  }  // closed before it is removed: no -wal/-shm left
  fs::remove(path);
  return r;
}
std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

TEST(Select, BestPerProblemIsTheFastestValid) {
  auto best = best_per_problem(fixture_results());
  ASSERT_EQ(best.size(), 3u);  // H100: p1, p2; H200: p3 (its p2 crashed)
  int h100 = 0;
  for (const auto& r : best) {
    EXPECT_EQ(r.status, "ok");
    if (r.device_name != "NVIDIA H100 80GB HBM3") continue;
    ++h100;
    if (r.problem.seq_q == 4096) EXPECT_EQ(r.config, "BLOCK_M=128,BLOCK_N=64,TM=8,TN=4,KV_STAGES=2");
    if (r.problem.seq_q == 3000) EXPECT_EQ(r.config, "BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2");
  }
  EXPECT_EQ(h100, 2);
}

TEST(Select, BucketWinnerMustBeValidOnEveryProblem) {
  auto choices = best_per_bucket(fixture_results());
  const BucketChoice* h100 = nullptr;
  for (const auto& c : choices)
    if (c.device == "NVIDIA H100 80GB HBM3") h100 = &c;
  ASSERT_NE(h100, nullptr);
  EXPECT_EQ(h100->seq_bucket, 4096);
  EXPECT_EQ(h100->problems, 2);
  // A is fastest on p1 but invalid on p2: B (12 ms, 3 ms) beats C (20 ms, 5 ms).
  EXPECT_EQ(h100->config, "BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2");
}

TEST(Select, CheapTimingsArePickedOnlyWithoutFullOnes) {
  // A search's 2-repeat row can read faster than it is; a fully timed row of the problem wins over it.
  auto rows = fixture_results();
  ResultRecord cheap;
  for (const auto& r : rows)
    if (r.status == "ok" && r.device_name == "NVIDIA H100 80GB HBM3" && r.problem.seq_q == 4096) cheap = r;
  ASSERT_FALSE(cheap.config.empty());
  cheap.config = "BLOCK_M=32,BLOCK_N=32,TM=2,TN=2,KV_STAGES=1";
  cheap.reps = 2;
  cheap.tflops *= 10;
  rows.push_back(cheap);
  for (const auto& r : best_per_problem(rows))
    if (r.device_name == cheap.device_name && r.problem.seq_q == 4096) EXPECT_NE(r.config, cheap.config);
  for (const auto& c : best_per_bucket(rows)) EXPECT_NE(c.config, cheap.config);
  // Alone (no fully timed row for its problem), a cheap timing is still a pick.
  std::vector<ResultRecord> only{cheap};
  ASSERT_EQ(best_per_problem(only).size(), 1u);
  EXPECT_EQ(best_per_problem(only)[0].config, cheap.config);
}

TEST(Select, ANewerSourcePruneOrFailureSupersedesAnOlderSuccess) {
  // The templates changed: a kernel that validated before now spills (pruned) on the same problem. Its old
  // row, spelled without a tunable added since (the default), must not be the problem's pick any more.
  auto row = [](const char* cfg, const char* status, double tflops, const char* created) {
    ResultRecord r;
    r.family = "fa2_simt", r.direction = "fwd", r.config = cfg, r.status = status;
    r.problem = Problem{1, 4, 1024, 1024, 64, DType::fp32, false};
    r.tflops = tflops, r.reps = kFullTimingReps, r.device_name = "GPU A", r.arch = "sm_90", r.created = created;
    return r;
  };
  const char* A = "BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2";
  const char* B = "BLOCK_M=128,BLOCK_N=64,TM=8,TN=4,KV_STAGES=2";
  std::vector<ResultRecord> rows = {row(A, "ok", 10, "2026-01-01T00:00:00"), row(B, "ok", 8, "2026-01-01T00:00:01")};
  ASSERT_EQ(best_per_problem(rows).size(), 1u);
  EXPECT_EQ(best_per_problem(rows)[0].config, A);
  for (const char* status : {"pruned", "invalid", "compile_error"}) {
    auto later = rows;
    later.push_back(row(A, status, 0, "2026-01-02T00:00:00"));
    ASSERT_EQ(best_per_problem(later).size(), 1u) << status;
    EXPECT_EQ(best_per_problem(later)[0].config, B) << status;
  }
  // A timeout or crash later is not a verdict on the kernel: the success stands.
  auto timed_out = rows;
  timed_out.push_back(row(A, "timeout", 0, "2026-01-02T00:00:00"));
  EXPECT_EQ(best_per_problem(timed_out)[0].config, A);
  // An older failure followed by a success (the fix landed): the success counts.
  auto fixed = rows;
  fixed.insert(fixed.begin(), row(A, "invalid", 0, "2025-12-31T00:00:00"));
  EXPECT_EQ(best_per_problem(fixed)[0].config, A);
  // A newer source of the same kernel (the templates changed): its timing stands for the config, the older
  // source's faster one is a kernel that no longer exists.
  auto resourced = rows;
  resourced[0].source_hash = "old";
  resourced.push_back(row(A, "ok", 7, "2026-01-02T00:00:00"));
  resourced.back().source_hash = "new";
  EXPECT_EQ(best_per_problem(resourced)[0].config, B);  // A now 7 < B's 8
  // The same kernel spelled with its defaults filled in is the same kernel (fa2_simt has no optional
  // tunable, so an unparsable spelling stands for itself and is not superseded by A's prune).
  auto other = rows;
  other.push_back(row(A, "pruned", 0, "2026-01-02T00:00:00"));
  other.push_back(row("NOT=1", "ok", 20, "2026-01-01T00:00:00"));
  EXPECT_EQ(best_per_problem(other)[0].config, "NOT=1");
}

TEST(Select, BucketOfSeparatelyTunedProblemsStillHasAPick) {
  // Two problems of one bucket, each tuned to its own finalists (halving): A fully timed on p1 only, B on
  // p2 only, both timed cheaply on the other. No config is fully timed on both, so the bucket is ranked on
  // every ok row: B (geomean of 8 and 6) over A (10 and 3).
  auto row = [](int seq_q, const char* cfg, double tflops, int reps) {
    ResultRecord r;
    r.family = "fa2_simt", r.direction = "fwd", r.config = cfg, r.status = "ok";
    r.problem = Problem{1, 4, seq_q, seq_q, 64, DType::fp32, false};
    r.tflops = tflops, r.reps = reps, r.device_name = "GPU A", r.arch = "sm_90";
    return r;
  };
  const char* A = "BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2";
  const char* B = "BLOCK_M=128,BLOCK_N=64,TM=8,TN=4,KV_STAGES=2";
  std::vector<ResultRecord> rows = {row(3000, A, 10, kFullTimingReps), row(3000, B, 8, 2),
                                    row(4000, B, 6, kFullTimingReps), row(4000, A, 3, 2)};
  auto choices = best_per_bucket(rows);
  ASSERT_EQ(choices.size(), 1u);
  EXPECT_EQ(choices[0].config, B);
  EXPECT_EQ(choices[0].problems, 2);
  // Once one config is fully timed on both, only full timings rank: A (10, 5) wins over B's cheap 8.
  rows.push_back(row(4000, A, 5, kFullTimingReps));
  rows.erase(rows.begin() + 3);
  choices = best_per_bucket(rows);
  ASSERT_EQ(choices.size(), 1u);
  EXPECT_EQ(choices[0].config, A);
}

// A deterministic config whose timing a search stopped early (3 repeats) against a faster non-reproducible one
// is still the deterministic pick when it is the fastest reproducible row; the plain pick keeps the fully
// timed rule (and `best --deterministic`'s per-problem pick ranks the same way).
TEST(Select, DeterministicPicksRankEveryTiming) {
  const Family& f = find_family("fa3_wgmma_bwd");
  auto row = [&](const char* cfg, double tflops, int reps) {
    ResultRecord r;
    r.family = f.name, r.direction = f.direction, r.config = cfg, r.status = "ok";
    r.problem = Problem{4, 16, 4096, 4096, 128, DType::bf16, false};
    r.problem.direction = "bwd";
    r.tflops = tflops, r.reps = reps, r.device_name = "GPU A", r.arch = "sm_90";
    return r;
  };
  const char* fast = "BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1,DQ_TURNS=0,DETERMINISTIC=0";
  const char* det_cut = "BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1,DQ_TURNS=0,DETERMINISTIC=1";
  const char* det_full = "BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=0,DQ_TURNS=0,DETERMINISTIC=1";
  const std::vector<ResultRecord> rows = {row(fast, 500, kFullTimingReps), row(det_cut, 380, 3),
                                          row(det_full, 300, kFullTimingReps)};
  const std::vector<BucketChoice> only = best_per_bucket(rows, true);
  ASSERT_EQ(only.size(), 1u);
  EXPECT_EQ(only[0].config, det_cut);
  const std::vector<ResultRecord> per_problem = best_per_problem(reproducible_rows(rows), true);
  ASSERT_EQ(per_problem.size(), 1u);
  EXPECT_EQ(per_problem[0].config, det_cut);
  EXPECT_EQ(best_per_problem(reproducible_rows(rows)).at(0).config, det_full) << "the fully timed rule, unchanged";
}

// A deterministic backward's picks: the best of the configs whose family calls them reproducible, buckets of
// their own; emitted as entries marked deterministic, which only a deterministic lookup reads.
TEST(Select, DeterministicPicksBucketApart) {
  const Family& f = find_family("fa3_wgmma_bwd");
  auto row = [&](const char* cfg, double tflops) {
    ResultRecord r;
    r.family = f.name, r.direction = f.direction, r.config = cfg, r.status = "ok";
    r.problem = Problem{4, 16, 4096, 4096, 128, DType::bf16, false};
    r.problem.direction = "bwd";
    r.tflops = tflops, r.reps = kFullTimingReps, r.device_name = "GPU A", r.arch = "sm_90";
    return r;
  };
  const char* fast = "BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1,DQ_TURNS=0,DETERMINISTIC=0";
  const char* det = "BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1,DQ_TURNS=0,DETERMINISTIC=1";
  const char* old = "BLOCK_M=64,CONSUMERS=2,STAGES=2,SCHED=0,DQ_OVERLAP=1,DQ_TURNS=0";  // stored before DETERMINISTIC
  const std::vector<ResultRecord> rows = {row(fast, 400), row(det, 350), row(old, 500)};
  EXPECT_EQ(reproducible_rows(rows).size(), 1u);
  const std::vector<BucketChoice> any = best_per_bucket(rows), only = best_per_bucket(rows, true);
  ASSERT_EQ(only.size(), 1u);
  EXPECT_EQ(only[0].config, det);
  EXPECT_TRUE(only[0].deterministic);
  ASSERT_EQ(any.size(), 1u);
  EXPECT_FALSE(any[0].deterministic);
  std::vector<BucketChoice> both = any;
  both.push_back(only[0]);
  EXPECT_EQ(pick_bucket(both, rows[0].problem, true)->config, det);
  EXPECT_FALSE(pick_bucket(both, rows[0].problem)->deterministic);
  EXPECT_EQ(pick_bucket(any, rows[0].problem, true), nullptr);

  auto dir = fixture::scratch_dir() / "emit_det";
  fs::remove_all(dir);
  BucketChoice fixed = both[0];
  fixed.config = fast;  // the 6-value config stored before DETERMINISTIC is no config today: a valid one
  emit_headers({fixed, only[0]}, dir.string(), "flashtune emit --db x --out y");
  const std::string gpu = slurp(dir / "sm90_gpu_a.hpp");
  EXPECT_NE(gpu.find("{64, 2, 2, 0, 1, 0, 1, 1}, 350.00f, false, true}"), std::string::npos) << gpu;
  EXPECT_NE(gpu.find("{64, 2, 2, 0, 1, 0, 0, 1}, 500.00f},"), std::string::npos) << gpu;
  BucketChoice lie = only[0];
  lie.config = fast;  // marked deterministic, but not a reproducible config
  EXPECT_THROW(emit_headers({lie}, (dir / "lie").string(), "x"), UsageError);
  fs::remove_all(dir);
}

TEST(Emit, HeadersCarryBannerEntriesAndFallbacks) {
  auto dir = fixture::scratch_dir() / "emit";
  fs::remove_all(dir);
  auto res = emit_headers(best_per_bucket(fixture_results()), dir.string(), "flashtune emit --db x --out y");
  EXPECT_EQ(res.entries, 2);
  std::string gpu = slurp(dir / "sm90_nvidia_h100_80gb_hbm3.hpp");
  EXPECT_NE(gpu.find("DO NOT EDIT: generated by `flashtune emit --db x --out y`"), std::string::npos);
  EXPECT_NE(gpu.find("{\"fa2_simt\", \"fwd\", \"fp32\", 64, false, 4096, {64, 64, 4, 4, 2}"), std::string::npos) << gpu;
  EXPECT_NE(gpu.find("BLOCK_M BLOCK_N TM TN KV_STAGES"), std::string::npos);
  std::string dispatch = slurp(dir / "dispatch.hpp");
  EXPECT_NE(dispatch.find("#include \"sm90_nvidia_h100_80gb_hbm3.hpp\""), std::string::npos);
  EXPECT_NE(dispatch.find("#include \"sm90_nvidia_h200.hpp\""), std::string::npos);
  EXPECT_NE(dispatch.find("{\"fa2_simt\", \"fwd\", \"*\""), std::string::npos) << "defaults present";
  EXPECT_EQ(dispatch.find("\"fault\""), std::string::npos) << "test-only families stay out";
  fs::remove_all(dir);
}

// Paged K/V cache rows make buckets of their own (the runtime's paged entry point reads them): a dense problem's
// bucket never takes a paged row's config, nor the reverse; a config invalid on one paged problem of the bucket
// (its BLOCK_N does not divide that problem's page) is never the paged pick; emit marks the paged entries, and
// the header's find_in returns them only to a paged lookup.
TEST(Select, PagedRowsBucketApart) {
  const Family& f = find_family("decode_splitkv");
  auto row = [&](const char* cfg, double tflops, int page_size) {
    ResultRecord r;
    r.family = f.name, r.direction = f.direction, r.config = cfg, r.status = "ok";
    r.problem = Problem{8, 32, 1, 4096, 128, DType::bf16, false};
    r.problem.heads_k = 8;
    r.problem.paged.page_size = page_size;
    r.tflops = tflops, r.reps = kFullTimingReps, r.device_name = "GPU A", r.arch = "sm_90";
    return r;
  };
  const char* big = "SPLITS=16,BLOCK_N=256,WARPS=4,STAGES=1";
  const char* small = "SPLITS=8,BLOCK_N=64,WARPS=4,STAGES=2";
  const char* dense_cfg = "SPLITS=4,BLOCK_N=128,WARPS=4,STAGES=1";
  std::vector<ResultRecord> rows = {row(dense_cfg, 20, 0), row(big, 10, 256), row(small, 9, 256), row(small, 9, 64)};
  const std::vector<BucketChoice> choices = best_per_bucket(rows);
  ASSERT_EQ(choices.size(), 2u);
  const BucketChoice& dense = choices[0].paged ? choices[1] : choices[0];
  const BucketChoice& paged = choices[0].paged ? choices[0] : choices[1];
  ASSERT_FALSE(dense.paged);
  ASSERT_TRUE(paged.paged);
  EXPECT_EQ(dense.config, dense_cfg);
  EXPECT_EQ(dense.problems, 1);
  EXPECT_EQ(paged.config, small) << "BLOCK_N 256 has no row on the 64-key pages: not valid on the whole bucket";
  EXPECT_EQ(paged.problems, 2);
  Problem want = rows[0].problem;
  ASSERT_NE(pick_bucket(choices, want), nullptr);
  EXPECT_EQ(pick_bucket(choices, want)->config, dense_cfg);
  want.paged.page_size = 128;  // any page size: the bucket's config is then the caller's to check
  ASSERT_NE(pick_bucket(choices, want), nullptr);
  EXPECT_EQ(pick_bucket(choices, want)->config, small);
  EXPECT_EQ(pick_bucket({dense}, want), nullptr);
  want.paged = Paged{};
  EXPECT_EQ(pick_bucket({paged}, want), nullptr);
  // stored_choice (run --best, experiments) keeps a paged problem to its own rows.
  EXPECT_EQ(stored_choice(rows, rows[3].problem).source, "problem");
  Problem other = rows[3].problem;
  other.paged.page_size = 128;
  EXPECT_EQ(stored_choice(rows, other).source, "");

  auto dir = fixture::scratch_dir() / "emit_paged";
  fs::remove_all(dir);
  const EmitResult res = emit_headers(choices, dir.string(), "flashtune emit --db x --out y");
  EXPECT_EQ(res.entries, 2);
  const std::string gpu = slurp(dir / "sm90_gpu_a.hpp");
  EXPECT_NE(gpu.find("{\"decode_splitkv\", \"fwd\", \"bf16\", 128, false, 4096, {4, 128, 4, 1}, 20.00f, false, false, 64},"),
            std::string::npos) << gpu;
  EXPECT_NE(gpu.find("{\"decode_splitkv\", \"fwd\", \"bf16\", 128, false, 4096, {8, 64, 4, 2}, 9.00f, true, false, 64},"),
            std::string::npos) << gpu;
  EXPECT_NE(gpu.find("Entries ending in `true` were measured on paged K/V caches"), std::string::npos) << gpu;
  fs::remove_all(dir);
  // The tables' lookup: a dense query never sees the paged entry, a paged one sees only it.
  const tuned::Entry entries[] = {{"decode_splitkv", "fwd", "bf16", 128, false, 4096, {4, 128, 4, 1}, 20.0f},
                                  {"decode_splitkv", "fwd", "bf16", 128, false, 4096, {8, 64, 4, 2}, 9.0f, true}};
  const tuned::Table t{"GPU A", "sm_90", entries, 2};
  EXPECT_EQ(tuned::find_in(t, "decode_splitkv", "fwd", "bf16", 128, false, 4096), &entries[0]);
  EXPECT_EQ(tuned::find_in(t, "decode_splitkv", "fwd", "bf16", 128, false, 4096, true), &entries[1]);
  const tuned::Table dense_only{"GPU A", "sm_90", entries, 1};
  EXPECT_EQ(tuned::find_in(dense_only, "decode_splitkv", "fwd", "bf16", 128, false, 4096, true), nullptr);
  // A paged bucket of a family without a paged form is refused (a hand-edited or foreign store).
  BucketChoice wrong = paged;
  wrong.family = "fa2_mma", wrong.config = "BLOCK_M=64,BLOCK_N=64,WARPS=4,STAGES=2";
  EXPECT_THROW(emit_headers({wrong}, dir.string(), "x"), UsageError);
  fs::remove_all(dir);
}

// A decoding family's buckets are keyed by batch x kv heads as well as the sequence (issue 31: the H100's B 64 at
// 4k keys ran B 1's SPLITS 8 where its own tuned pick was SPLITS 1): each (batch x kv heads, sequence) gets the
// config fastest there, and another family's buckets still span every batch.
TEST(Select, DecodeBucketsByBatchTimesKvHeads) {
  const Family& f = find_family("decode_splitkv");
  auto row = [&](const char* cfg, int batch, int seq_k, double tflops) {
    ResultRecord r;
    r.family = f.name, r.direction = f.direction, r.config = cfg, r.status = "ok";
    r.problem = Problem{batch, 32, 1, seq_k, 128, DType::bf16, false};
    r.problem.heads_k = 8;
    r.tflops = tflops, r.reps = kFullTimingReps, r.device_name = "GPU A", r.arch = "sm_90";
    return r;
  };
  const char* many = "SPLITS=8,BLOCK_N=256,WARPS=4,STAGES=1";
  const char* one = "SPLITS=1,BLOCK_N=256,WARPS=4,STAGES=1";
  // B 1: many splits fastest; B 64: one split fastest; both configs valid on both.
  std::vector<ResultRecord> rows = {row(many, 1, 4096, 7), row(one, 1, 4096, 2), row(many, 64, 4096, 8),
                                    row(one, 64, 4096, 12), row(many, 1, 32768, 10), row(one, 1, 32768, 3)};
  const std::vector<BucketChoice> choices = best_per_bucket(rows);
  ASSERT_EQ(choices.size(), 3u);
  std::map<std::pair<int, int>, std::string> by_key;
  for (const auto& c : choices) by_key[{c.batch_heads, c.seq_bucket}] = c.config;
  EXPECT_EQ(by_key[std::make_pair(8, 4096)], many);
  EXPECT_EQ(by_key[std::make_pair(512, 4096)], one);
  EXPECT_EQ(by_key[std::make_pair(8, 32768)], many);
  EXPECT_EQ(batch_kv_heads(rows[2].problem), 512);
  Problem mha = rows[0].problem;
  mha.heads_k = 0;
  EXPECT_EQ(batch_kv_heads(mha), 32) << "multi-head: batch x heads";

  // pick_bucket: the nearest batch x kv heads by ratio (a tie to the smaller; unknown: the smallest), then the
  // smallest sequence bucket that holds the problem's, else the largest of that batch x kv heads.
  auto pick = [&](long long bh, int seq) {
    const BucketChoice* c = pick_bucket(choices, seq, bh, false, false);
    return c ? std::to_string(c->batch_heads) + "@" + std::to_string(c->seq_bucket) : std::string("none");
  };
  EXPECT_EQ(pick(512, 4096), "512@4096");
  EXPECT_EQ(pick(8, 4096), "8@4096");
  EXPECT_EQ(pick(0, 4096), "8@4096");
  EXPECT_EQ(pick(1, 1000), "8@4096");
  EXPECT_EQ(pick(63, 4096), "8@4096");     // 63/8 = 7.9 < 512/63 = 8.1
  EXPECT_EQ(pick(65, 4096), "512@4096");   // 512/65 = 7.9 < 65/8 = 8.1
  EXPECT_EQ(pick(64, 4096), "8@4096");     // a tie (8x either way): the smaller
  EXPECT_EQ(pick(1 << 30, 4096), "512@4096");
  EXPECT_EQ(pick(512, 32768), "512@4096") << "past its largest sequence bucket: that largest";
  EXPECT_EQ(pick(8, 20000), "8@32768");
  EXPECT_EQ(pick(8, 1 << 20), "8@32768");
  EXPECT_EQ(pick(512, 4096), pick(512, 1));
  Problem p = rows[3].problem;
  ASSERT_NE(pick_bucket(choices, p), nullptr);
  EXPECT_EQ(pick_bucket(choices, p)->config, one);
  EXPECT_EQ(pick_bucket(choices, 4096, 512, true, false), nullptr) << "no paged bucket";

  // The general families' buckets are not keyed by it: batches of one bucket share a pick.
  const Family& g = find_family("fa2_mma");
  ResultRecord a = row("BLOCK_M=64,BLOCK_N=64,WARPS=4,STAGES=2", 1, 4096, 100), b = a;
  a.family = b.family = g.name;
  a.problem.seq_q = b.problem.seq_q = 4096;
  a.problem.heads_k = b.problem.heads_k = 0;
  b.problem.batch = 64;
  const std::vector<BucketChoice> general = best_per_bucket({a, b});
  ASSERT_EQ(general.size(), 1u);
  EXPECT_EQ(general[0].batch_heads, 0);
  EXPECT_EQ(general[0].problems, 2);

  // Emitted as entries ending in (paged, deterministic, batch x kv heads); the header's find_in takes them by the
  // same rule as pick_bucket, and a batch x kv heads bucket of a family without a query-length range is refused.
  auto dir = fs::temp_directory_path() / ("flashtune_emit_bh_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const EmitResult res = emit_headers(choices, dir.string(), "flashtune emit --db x --out y");
  EXPECT_EQ(res.entries, 3);
  const std::string gpu = slurp(dir / "sm90_gpu_a.hpp");
  EXPECT_NE(gpu.find("{\"decode_splitkv\", \"fwd\", \"bf16\", 128, false, 4096, {1, 256, 4, 1}, 12.00f, false, false, 512},"),
            std::string::npos) << gpu;
  EXPECT_NE(gpu.find("{\"decode_splitkv\", \"fwd\", \"bf16\", 128, false, 4096, {8, 256, 4, 1}, 7.00f, false, false, 8},"),
            std::string::npos) << gpu;
  EXPECT_NE(gpu.find("[, batch x kv heads]"), std::string::npos) << gpu;
  EXPECT_NE(slurp(dir / "dispatch.hpp").find("long long batch_heads = 0"), std::string::npos);
  BucketChoice wrong = general[0];
  wrong.batch_heads = 64;
  EXPECT_THROW(emit_headers({wrong}, dir.string(), "x"), UsageError);
  wrong = choices[0];
  wrong.batch_heads = -1;
  EXPECT_THROW(emit_headers({wrong}, dir.string(), "x"), UsageError);
  fs::remove_all(dir);
}

// tuned::find_in's batch x kv heads rule on a hand-made table, and a table without the key (emitted before it, or
// a family's entries that never have it) read as before: every batch takes its sequence bucket.
TEST(Select, FindInNearestBatchTimesKvHeads) {
  const tuned::Entry keyed[] = {
      {"decode_splitkv", "fwd", "bf16", 128, false, 4096, {16, 256, 4, 1}, 1.0f, false, false, 8},
      {"decode_splitkv", "fwd", "bf16", 128, false, 4096, {4, 128, 4, 1}, 2.0f, false, false, 64},
      {"decode_splitkv", "fwd", "bf16", 128, false, 4096, {1, 256, 4, 1}, 3.0f, false, false, 512},
      {"decode_splitkv", "fwd", "bf16", 128, false, 32768, {16, 256, 8, 1}, 4.0f, false, false, 8},
      {"decode_splitkv", "fwd", "bf16", 128, false, 4096, {2, 256, 4, 1}, 5.0f, true, false, 512},
  };
  const tuned::Table t{"GPU A", "sm_90", keyed, 5};
  auto at = [&](long long bh, int seq, bool paged = false) {
    const tuned::Entry* e = tuned::find_in(t, "decode_splitkv", "fwd", "bf16", 128, false, seq, paged, false, bh);
    return e ? (int)(e - keyed) : -1;
  };
  EXPECT_EQ(at(8, 4096), 0);
  EXPECT_EQ(at(64, 4096), 1);
  EXPECT_EQ(at(512, 4096), 2);
  EXPECT_EQ(at(0, 4096), 0) << "unknown: the smallest";
  EXPECT_EQ(at(-5, 4096), 0);
  EXPECT_EQ(at(22, 4096), 0);   // 22/8 = 2.75 < 64/22 = 2.9
  EXPECT_EQ(at(23, 4096), 1);   // 64/23 = 2.78 < 23/8 = 2.875
  EXPECT_EQ(at(181, 4096), 1);  // 181/64 = 2.83 < 512/181 = 2.83 (by a hair)
  EXPECT_EQ(at(182, 4096), 2);
  EXPECT_EQ(at(1LL << 40, 4096), 2) << "past 2^31: the largest";
  EXPECT_EQ(at(8, 10000), 3);
  EXPECT_EQ(at(512, 10000), 2) << "its own largest sequence bucket, not another batch's";
  EXPECT_EQ(at(8, 4096, true), 4) << "paged entries: their own batch x kv heads";
  static_assert(tuned::nearer_batch_heads(100, 64, 512));
  static_assert(!tuned::nearer_batch_heads(300, 64, 512));
  static_assert(tuned::nearer_batch_heads(16, 8, 32) && !tuned::nearer_batch_heads(16, 32, 8));  // a tie: the smaller
  // The same table without the key: the sequence bucket alone, for every batch (the format before issue 31).
  const tuned::Entry plain[] = {{"decode_splitkv", "fwd", "bf16", 128, false, 4096, {16, 256, 4, 1}, 1.0f},
                                {"decode_splitkv", "fwd", "bf16", 128, false, 32768, {16, 256, 8, 1}, 4.0f}};
  const tuned::Table old{"GPU A", "sm_90", plain, 2};
  for (long long bh : {0LL, 8LL, 512LL}) {
    EXPECT_EQ(tuned::find_in(old, "decode_splitkv", "fwd", "bf16", 128, false, 4096, false, false, bh), &plain[0]);
    EXPECT_EQ(tuned::find_in(old, "decode_splitkv", "fwd", "bf16", 128, false, 5000, false, false, bh), &plain[1]);
  }
  EXPECT_EQ(tuned::find_in(old, "decode_splitkv", "fwd", "bf16", 128, false, 4096), &plain[0]);
}

// Grouped-query rows of a general family make buckets of their own by group (query heads per kv head): a kv-head
// CTA walking four query heads has its own best scheduler (fa3_wgmma_bwd at 32/8 heads, causal 8k: SCHED 1). A
// grouped-query problem takes its group's bucket where there is one, else the multi-head bucket; the header holds
// the group after batch x kv heads, and emit refuses a group on a family without grouped-query attention.
TEST(Select, GroupedQueryBucketsByGroup) {
  const Family& f = find_family("fa3_wgmma_bwd");
  Config c1 = f.default_config;
  c1[3] = 1;  // SCHED 1
  const std::string base = f.config_string(f.default_config), lpt = f.config_string(c1);
  auto row = [&](const std::string& cfg, int heads_k, double tflops) {
    ResultRecord r;
    r.family = f.name, r.direction = f.direction, r.config = cfg, r.status = "ok";
    r.problem = Problem{2, 32, 8192, 8192, 128, DType::bf16, true, "bwd"};
    r.problem.heads_k = heads_k;
    r.tflops = tflops, r.reps = kFullTimingReps, r.device_name = "GPU A", r.arch = "sm_90";
    return r;
  };
  const std::vector<ResultRecord> rows = {row(base, 0, 580), row(lpt, 0, 560), row(base, 8, 518), row(lpt, 8, 544)};
  const std::vector<BucketChoice> choices = best_per_bucket(rows);
  ASSERT_EQ(choices.size(), 2u);
  std::map<int, std::string> by_group;
  for (const auto& c : choices) by_group[c.group] = c.config;
  EXPECT_EQ(by_group[0], base);
  EXPECT_EQ(by_group[4], lpt);
  EXPECT_EQ(rows[2].problem.group_key(), 4);
  EXPECT_EQ(rows[0].problem.group_key(), 0);
  Problem wide = rows[2].problem;
  wide.heads = 512, wide.heads_k = 1;  // a group past the plan key's byte: the multi-head buckets
  EXPECT_EQ(wide.group_key(), 0);
  ASSERT_NE(pick_bucket(choices, rows[2].problem), nullptr);
  EXPECT_EQ(pick_bucket(choices, rows[2].problem)->config, lpt);
  EXPECT_EQ(pick_bucket(choices, rows[0].problem)->config, base);
  Problem g8 = rows[2].problem;
  g8.heads_k = 4;  // group 8: no bucket of its own, the multi-head one
  EXPECT_EQ(pick_bucket(choices, g8)->config, base);
  EXPECT_EQ(stored_choice({rows[0], rows[1], rows[2], rows[3]}, g8).config, base);

  auto dir = fs::temp_directory_path() / ("flashtune_emit_group_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const EmitResult res = emit_headers(choices, dir.string(), "flashtune emit --db x --out y");
  EXPECT_EQ(res.entries, 2);
  const std::string gpu = slurp(dir / "sm90_gpu_a.hpp");
  EXPECT_NE(gpu.find(", 544.00f, false, false, 0, 4},"), std::string::npos) << gpu;
  EXPECT_NE(gpu.find(", 580.00f},"), std::string::npos) << gpu;
  EXPECT_NE(gpu.find("[, group]"), std::string::npos) << gpu;
  EXPECT_NE(slurp(dir / "dispatch.hpp").find("int group = 0"), std::string::npos);
  // The header's lookup: the group's entry for its group, the multi-head entry for any other call.
  tuned::Entry grouped{"fa3_wgmma_bwd", "bwd", "bf16", 128, true, 8192, {}, 544.0f};
  grouped.group = 4;
  const tuned::Entry entries[] = {{"fa3_wgmma_bwd", "bwd", "bf16", 128, true, 8192, {}, 580.0f}, grouped};
  const tuned::Table t{"GPU A", "sm_90", entries, 2};
  EXPECT_EQ(tuned::find_in(t, "fa3_wgmma_bwd", "bwd", "bf16", 128, true, 8192, false, false, 0, 4), &entries[1]);
  EXPECT_EQ(tuned::find_in(t, "fa3_wgmma_bwd", "bwd", "bf16", 128, true, 8192, false, false, 0, 8), &entries[0]);
  EXPECT_EQ(tuned::find_in(t, "fa3_wgmma_bwd", "bwd", "bf16", 128, true, 8192), &entries[0]);
  const tuned::Table grouped_only{"GPU A", "sm_90", entries + 1, 1};
  EXPECT_EQ(tuned::find_in(grouped_only, "fa3_wgmma_bwd", "bwd", "bf16", 128, true, 8192), nullptr)
      << "a multi-head call never takes a grouped-query entry";
  // Refused: group 1 (multi-head is 0), and a group on a family without grouped-query attention.
  BucketChoice wrong = choices[0];
  wrong.group = 1;
  EXPECT_THROW(emit_headers({wrong}, dir.string(), "x"), UsageError);
  const Family& simt = find_family("fa2_simt");
  ASSERT_FALSE(simt.gqa);
  wrong.family = simt.name, wrong.direction = simt.direction, wrong.dtype = DType::fp32, wrong.head_dim = 64;
  wrong.config = simt.config_string(simt.default_config), wrong.group = 4;
  EXPECT_THROW(emit_headers({wrong}, dir.string(), "x"), UsageError);
  fs::remove_all(dir);
}
