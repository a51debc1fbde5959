// A synthetic store for tests that need results without a GPU: two devices, two problems
// per bucket, configs that win, lose, or fail on one problem.
#pragma once
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

#include "core/family.hpp"
#include "results/store.hpp"

namespace flashtune::fixture {

// A folder of this test process's own in the temp folder (mkdtemp: flashtune_test_XXXXXX), removed with all it
// holds when the process exits: the stores a test makes, their -wal/-shm files (left behind where a store is
// removed while it is still open) and emitted headers never stay in /tmp, whatever the test removes itself.
// (A child forked after it was made does not remove it.)
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    pid_t owner = getpid();
    Dir() {
      std::string t = (std::filesystem::temp_directory_path() / "flashtune_test_XXXXXX").string();
      if (!mkdtemp(t.data())) throw std::runtime_error("cannot make a folder like " + t);
      path = t;
    }
    ~Dir() {
      std::error_code ec;
      if (getpid() == owner) std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

inline DeviceInfo fixture_device(const std::string& name = "NVIDIA H100 80GB HBM3", const std::string& arch = "sm_90") {
  DeviceInfo d;
  d.name = name;
  d.arch = arch;
  d.sm_count = 132;
  d.driver_version = 13000;
  return d;
}

inline ResultRecord fixture_result(const std::string& config, const Problem& p, const std::string& status, double ms) {
  ResultRecord r;
  r.kernel_hash = "hash-" + config + "-" + std::to_string(p.head_dim) + (p.causal ? "c" : "n");
  r.family = "fa2_simt";
  r.direction = "fwd";
  r.config = config;
  r.problem = p;
  r.status = status;
  r.ms_median = ms;
  r.ms_p20 = ms * 0.99;
  r.ms_p80 = ms * 1.01;
  r.reps = 10;
  r.tflops = status == "ok" ? p.flops() / (ms * 1e-3) / 1e12 : 0;
  r.arch = "sm_90";
  r.nvrtc_version = "13.0";
  r.options = "--std=c++17";
  r.source_hash = "src";
  return r;
}

// Bucket 4096, d64, non-causal: A is fastest on one problem but fails the other, so B must win.
inline void fill_fixture(Store& s) {
  const DeviceInfo dev = fixture_device();
  const char* A = "BLOCK_M=128,BLOCK_N=64,TM=8,TN=4,KV_STAGES=2";
  const char* B = "BLOCK_M=64,BLOCK_N=64,TM=4,TN=4,KV_STAGES=2";
  const char* C = "BLOCK_M=64,BLOCK_N=32,TM=4,TN=4,KV_STAGES=2";  // the family default
  Problem p1{4, 16, 4096, 4096, 64, DType::fp32, false};
  Problem p2{2, 16, 3000, 3000, 64, DType::fp32, false};
  s.put_result(fixture_result(A, p1, "ok", 10.0), dev);
  s.put_result(fixture_result(A, p2, "invalid", 0), dev);
  s.put_result(fixture_result(B, p1, "ok", 12.0), dev);
  s.put_result(fixture_result(B, p2, "ok", 3.0), dev);
  s.put_result(fixture_result(C, p1, "ok", 20.0), dev);
  s.put_result(fixture_result(C, p2, "ok", 5.0), dev);
  s.put_result(fixture_result(C, p2, "crashed", 0), fixture_device("NVIDIA H200", "sm_90"));
  Problem p3{16, 32, 1024, 1024, 64, DType::fp32, true};
  s.put_result(fixture_result(C, p3, "ok", 1.0), fixture_device("NVIDIA H200", "sm_90"));
}

// Experiment runs: an older and a newer run of the classic comparison (the report must use the
// newer), a scaling run with an out-of-memory point, a backward run and a tuned-vs-default run.
inline ExperimentRow fixture_row(long long run, const std::string& impl, Problem p, const std::string& status,
                                 double ms, long long peak_bytes = 0) {
  ExperimentRow r;
  r.run_id = run;
  r.impl = impl;
  r.family = impl.rfind("torch", 0) == 0 || impl == "triton" || impl == "cublas_unfused" ? "" : impl.substr(0, impl.find(':'));
  r.problem = p;
  r.status = status;
  r.error = status == "oom" ? "out of memory" : "";
  if (status == "ok") {
    r.ms_median = ms;
    r.ms_p20 = ms * 0.98;
    r.ms_p80 = ms * 1.02;
    r.reps = 10;
    r.tflops = p.flops() / (ms * 1e-3) / 1e12;
    r.gbps = p.bytes() / (ms * 1e-3) / 1e9;
    r.max_abs = 1e-6;
    r.mean_abs = 1e-7;
  }
  r.peak_bytes = peak_bytes;
  r.device = impl == "torch_cpu" ? "cpu: fixture" : "NVIDIA H100 80GB HBM3";
  return r;
}

inline void fill_experiments(Store& s) {
  const std::string dev = "NVIDIA H100 80GB HBM3";
  const std::string probes =
      R"({"matmul_fp32_tflops":50.0,"matmul_tf32_tflops":400.0,"matmul_bf16_tflops":700.0,"matmul_fp16_tflops":700.0,"copy_gbps":3000.0,"memory_bytes":85899345920,"status":"ok"})";
  auto spec = [](const std::string& name, const std::string& plot) {
    return R"({"name":")" + name + R"(","plot":")" + plot + R"(","description":"fixture )" + name + R"("})";
  };
  Problem f32{2, 8, 1024, 1024, 64, DType::fp32, false, "fwd"};
  Problem b16{2, 8, 1024, 1024, 64, DType::bf16, false, "fwd"};
  long long old_run = s.begin_experiment({0, "classic_shapes", "Classic shapes", dev, probes, spec("classic_shapes", "compare"), ""});
  s.put_experiment_row(fixture_row(old_run, "fa2_simt", f32, "ok", 99.0));
  long long run = s.begin_experiment({0, "classic_shapes", "Classic shapes", dev, probes, spec("classic_shapes", "compare"), ""});
  // 4*2*8*1024^2*64 = 4.294967296e9 FLOP: 0.1 ms is 42.95 TFLOP/s, 85.9% of the 50 TFLOP/s fp32 probe.
  s.put_experiment_row(fixture_row(run, "fa2_simt", f32, "ok", 0.1, 20 << 20));
  s.put_experiment_row(fixture_row(run, "naive", f32, "ok", 1.0, 300 << 20));
  s.put_experiment_row(fixture_row(run, "torch_cpu", f32, "ok", 50.0));
  s.put_experiment_row(fixture_row(run, "fa2_mma", b16, "ok", 0.02, 10 << 20));
  s.put_experiment_row(fixture_row(run, "torch_flash", b16, "ok", 0.025, 12 << 20));
  s.put_experiment_row(fixture_row(run, "triton", b16, "invalid", 0));

  long long scal = s.begin_experiment({0, "seq_scaling", "Scaling", dev, probes, spec("seq_scaling", "scaling"), ""});
  for (int S : {1024, 65536}) {
    Problem p{4, 8, S, S, 64, DType::fp32, false, "fwd"};
    s.put_experiment_row(fixture_row(scal, "fa2_simt", p, "ok", S == 1024 ? 0.2 : 800.0, 32ll * S * 64 * 4 * 4));
    s.put_experiment_row(S == 1024 ? fixture_row(scal, "naive", p, "ok", 2.0, 32ll * S * S * 4)
                                   : fixture_row(scal, "naive", p, "oom", 0));
  }
  long long bwd = s.begin_experiment({0, "backward", "Backward", dev, probes, spec("backward", "backward"), ""});
  Problem pb{2, 8, 1024, 1024, 64, DType::bf16, false, "bwd"};
  s.put_experiment_row(fixture_row(bwd, "fa2_mma_bwd", pb, "ok", 0.1));
  s.put_experiment_row(fixture_row(bwd, "torch_flash", pb, "ok", 0.12));
  long long tvd = s.begin_experiment({0, "tuned_vs_default", "Tuned vs default", dev, probes,
                                      spec("tuned_vs_default", "tuned_vs_default"), ""});
  s.put_experiment_row(fixture_row(tvd, "fa2_mma", b16, "ok", 0.02));
  s.put_experiment_row(fixture_row(tvd, "fa2_mma:default", b16, "ok", 0.03));
}

}  // namespace flashtune::fixture
