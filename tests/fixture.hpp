// A synthetic store for tests that need results without a GPU: two devices, two problems
// per bucket, configs that win, lose, or fail on one problem.
#pragma once
#include <string>

#include "tuner/family.hpp"
#include "tuner/store.hpp"

namespace flashtune::fixture {

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

}  // namespace flashtune::fixture
