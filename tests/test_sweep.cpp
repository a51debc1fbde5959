// The GPU sweep (tune) without a GPU: a Python script stands in for flashtune-worker and answers the
// protocol (hello, prepare, run) with a time made from the kernel's hash, crashing on one chosen kernel.
// The kernels are compiled by NVRTC for sm_90 (label nvrtc). What is checked: every candidate gets a row,
// the crash is a row and costs a worker, the pick is the fastest, the finalists are re-timed, a rerun
// reuses every row and runs nothing; halving (early stops included) on two workers names each row's GPU.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/util.hpp"
#include "results/store.hpp"
#include "tuner/search/search.hpp"
#include "tuner/space/space.hpp"
#include "tuner/sweep/sweep.hpp"

using namespace flashtune;
using nlohmann::json;

namespace {

// The worker's time for a kernel: 0.1 ms plus its hash's first 6 hex digits mod 1000, in microseconds. Its
// command line comes back in each run's detail (worker_args), a prepare's phases as a real worker's.
constexpr const char* kFakeWorker = R"py(#!/usr/bin/env python3
import json, os, sys
crash = os.environ.get("FAKE_WORKER_CRASH_HASH", "")
for line in sys.stdin:
    req = json.loads(line)
    op = req["op"]
    if op == "hello":
        rep = {"status": "ok", "device": {"name": "Fake GPU", "arch": "sm_90", "sm_count": 132,
               "driver_version": 13000, "memory_bytes": 80 << 30, "l2_bytes": 50 << 20,
               "max_smem_optin": 232448, "clock_khz": 1980000}}
    elif op == "prepare":
        rep = {"status": "ok", "prepare_ms": {"inputs": 1.0, "reference": 2.0, "upload": 3.0, "total": 6.0}}
        # The tuner's file of the problem, prepared ahead (tuner/sweep/prepare_ahead.hpp): there, in a private folder.
        f = req.get("prepared_file", "")
        rep["prepare_ms"]["file_ok"] = 1.0 if f and os.path.isfile(f) and (os.stat(os.path.dirname(f)).st_mode & 0o777) == 0o700 else 0.0
    elif op == "run":
        h = os.path.basename(req["cubin_path"])[:-len(".cubin")]
        if h == crash:
            print("fake worker: crashing on " + h, file=sys.stderr, flush=True)
            sys.exit(3)
        ms = 0.1 + (int(h[:6], 16) % 1000) / 1000.0
        t = req.get("timing", {})
        reps = t.get("max_reps", 10)
        detail = {"timing_ms": ms * reps, "worker_args": sys.argv[1:]}
        stop = t.get("stop_above_ms", 0)
        if stop and ms > stop:
            reps = 3
            detail["early_stopped"] = True
        if t.get("samples"):
            detail["ms_samples"] = [ms] * reps
        rep = {"status": "ok", "ms_median": ms, "ms_p20": ms, "ms_p80": ms, "reps": reps,
               "max_abs": 0.0, "max_rel": 0.0, "mse": 0.0, "detail": detail}
    else:
        rep = {"status": "error", "error": "fake worker: no op " + op}
    print(json.dumps(rep), flush=True)
)py";

double fake_ms(const std::string& hash) {
  return 0.1 + (double)(std::stoul(hash.substr(0, 6), nullptr, 16) % 1000) / 1000.0;
}

struct FakeSetup {
  std::string dir = make_private_tmpdir("flashtune-test-sweep");
  std::string worker = dir + "/fake-worker.py";
  std::string db = dir + "/results.db";
  Space space;
  std::vector<Problem> problems = {Problem{1, 2, 256, 256, 64, DType::fp32, false, "fwd"},
                                   Problem{2, 2, 128, 192, 64, DType::fp32, false, "fwd"}};
  FakeSetup() {
    std::ofstream(worker) << kFakeWorker;
    std::filesystem::permissions(worker, std::filesystem::perms::owner_all);
    space = space_from_json(json::parse(R"({"family": "fa2_simt",
      "params": {"BLOCK_M": [64], "BLOCK_N": [32, 64], "TM": [4], "TN": [4], "KV_STAGES": [1, 2]},
      "head_dims": [64], "causal": [false], "dtypes": ["fp32"]})"));
  }
  ~FakeSetup() {
    unsetenv("FAKE_WORKER_CRASH_HASH");
    std::filesystem::remove_all(dir);
  }
  SweepOptions options(std::vector<int> devices) const {
    SweepOptions o;
    o.run.worker_path = worker;
    o.run.timeout_s = 60;
    o.progress = false;
    o.json = true;
    o.devices = std::move(devices);
    return o;
  }
};

// The rows of one problem, by kernel hash: the newest of each.
std::map<std::string, ResultRecord> rows_of(Store& store, const Problem& p) {
  std::map<std::string, ResultRecord> out;
  for (auto& r : store.results({}))
    if (r.problem == p) out[r.kernel_hash] = r;
  return out;
}

}  // namespace

TEST(SweepWithFakeWorker, ExhaustiveStoresEveryCandidateAndARerunReusesThem) {
  FakeSetup f;
  const Compiler compiler("sm_90");
  std::vector<std::vector<SearchCandidate>> cands;
  for (const Problem& p : f.problems) cands.push_back(search_candidates(f.space, p, compiler, Shard{}));
  ASSERT_GE(cands[0].size(), 3u) << "the space must leave a few candidates";
  const std::string crash = cands[0][1].hash;  // this kernel takes the worker down, on every problem
  setenv("FAKE_WORKER_CRASH_HASH", crash.c_str(), 1);

  Store store(f.db);
  SweepOptions o = f.options({0});
  o.search.stop_margin = 0;  // no early stop: every success fully timed, so three finalists are re-timed
  const SweepSummary first = tune(f.space, f.problems, store, o);
  EXPECT_TRUE(first.ran_kernels);
  EXPECT_EQ(first.skipped, 0);
  size_t total = 0, crashes = 0;
  for (size_t i = 0; i < f.problems.size(); ++i) {
    total += cands[i].size();
    const auto rows = rows_of(store, f.problems[i]);
    ASSERT_EQ(rows.size(), cands[i].size()) << f.problems[i].str();
    std::string best;
    double best_ms = 1e9;
    int retimed = 0;
    for (const SearchCandidate& c : cands[i]) {
      const ResultRecord& r = rows.at(c.hash);
      if (c.hash == crash) {
        ++crashes;
        EXPECT_EQ(r.status, "crashed");
        EXPECT_EQ(r.error, "worker died: exit code 3: fake worker: crashing on " + crash);
        continue;
      }
      EXPECT_EQ(r.status, "ok") << r.error;
      EXPECT_DOUBLE_EQ(r.ms_median, fake_ms(c.hash));
      EXPECT_EQ(r.device_name, "Fake GPU");
      const json d = json::parse(r.detail);
      EXPECT_FALSE(d.contains("worker_device")) << "one worker: rows name no GPU";
      EXPECT_EQ(d["worker_args"], json::array({"0"})) << "one worker: every core, no --threads";
      EXPECT_GT(d.value("request_ms", 0.0), 0.0) << r.detail;
      if (d.contains("retime")) {
        ++retimed;
        EXPECT_EQ(d["retime"]["pooled"], "repeats");
        EXPECT_EQ(d["retime"]["rounds"].size(), 3u);
      }
      if (r.ms_median < best_ms) best_ms = r.ms_median, best = c.v.family->config_string(c.v.config);
    }
    EXPECT_EQ(retimed, (int)std::min<size_t>(3, cands[i].size() - 1));
    ASSERT_EQ(first.reports.size(), f.problems.size());
    EXPECT_EQ(first.reports[i].best_config, best);
    EXPECT_DOUBLE_EQ(first.reports[i].best_ms, best_ms);
    EXPECT_EQ(first.reports[i].evaluations, cands[i].size());
    EXPECT_EQ(first.reports[i].reused, 0u);
  }
  // Each prepare's phases ride on the row of the run that waited for it, through re-timing: one per problem
  // and one after each crash (a fresh worker), 6 ms each in the fake.
  double prepared_ms = 0;
  for (const ResultRecord& r : store.results({})) {
    const json d = json::parse(r.detail.empty() ? "{}" : r.detail);
    prepared_ms += d.value("prepare_ms", json::object()).value("total", 0.0);
    // Every prepare named the problem's file, prepared ahead by the tuner, and the tuner's wait for it.
    if (d.contains("prepare_ms")) {
      EXPECT_GE(d["prepare_ms"].value("file_ok", 0.0), 1.0) << r.detail;
      EXPECT_TRUE(d["prepare_ms"].contains("wait")) << r.detail;
    }
  }
  EXPECT_EQ(prepared_ms, 6.0 * (double)(f.problems.size() + crashes));
  EXPECT_EQ(first.by_status.at("crashed"), (int)crashes);
  EXPECT_EQ(first.by_status.at("ok"), (int)(total - crashes));

  // A rerun: every row stands for its evaluation (the crash too), nothing runs, nothing is re-timed.
  const size_t stored = store.results({}).size();
  const SweepSummary again = tune(f.space, f.problems, store, o);
  EXPECT_EQ(again.skipped, (int)total);
  EXPECT_TRUE(again.by_status.empty());
  EXPECT_FALSE(again.ran_kernels);
  EXPECT_EQ(store.results({}).size(), stored);
  for (size_t i = 0; i < f.problems.size(); ++i) {
    EXPECT_EQ(again.reports[i].reused, cands[i].size());
    EXPECT_EQ(again.reports[i].best_config, first.reports[i].best_config);
  }
}

TEST(SweepWithFakeWorker, HalvingOnTwoWorkersNamesEachRowsGpu) {
  FakeSetup f;
  Store store(f.db);
  SweepOptions o = f.options({0, 1});
  o.search.strategy = "halving";
  const SweepSummary sum = tune(f.space, f.problems, store, o);
  EXPECT_TRUE(sum.ran_kernels);
  ASSERT_EQ(sum.reports.size(), f.problems.size());
  const Compiler compiler("sm_90");
  for (size_t i = 0; i < f.problems.size(); ++i) {
    const auto cands = search_candidates(f.space, f.problems[i], compiler, Shard{});
    const auto rows = rows_of(store, f.problems[i]);
    EXPECT_EQ(rows.size(), cands.size());
    std::string best;
    double best_ms = 1e9;
    for (const SearchCandidate& c : cands) {
      const ResultRecord& r = rows.at(c.hash);
      EXPECT_EQ(r.status, "ok") << r.error;
      const json d = json::parse(r.detail);
      const int dev = d.value("worker_device", -1);
      EXPECT_TRUE(dev == 0 || dev == 1) << r.detail;
      // Two workers on one host: each keeps every core (no --threads) unless --worker-threads says otherwise.
      // (The args are those of the worker that validated the row, which a re-timing on the other GPU keeps.)
      const json args = d["worker_args"];
      EXPECT_TRUE(args == json::array({"0"}) || args == json::array({"1"})) << r.detail;
      if (fake_ms(c.hash) < best_ms) best_ms = fake_ms(c.hash), best = c.v.family->config_string(c.v.config);
    }
    EXPECT_EQ(sum.reports[i].best_config, best);
    EXPECT_DOUBLE_EQ(sum.reports[i].best_ms, best_ms);
  }
}
