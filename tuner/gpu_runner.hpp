// The worker's side: owns the CUDA context (driver API), the problem's device buffers,
// the seeded inputs and the reference rows; runs, validates and times one kernel per request.
#pragma once
#include <cuda.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tuner/problem.hpp"
#include "tuner/store.hpp"

namespace flashtune {

// A CUDA call failed. `sticky` errors (illegal address, launch failure...) poison the context:
// the worker reports them as a crash and exits so that the parent starts a fresh one.
struct CudaError : std::runtime_error {
  CUresult code;
  bool sticky;
  CudaError(CUresult c, const std::string& what);
};

class GpuRunner {
 public:
  explicit GpuRunner(int device_ordinal);
  ~GpuRunner();
  DeviceInfo device_info() const { return info_; }
  // Generates inputs for the problem (seeded) and the reference, unless already current.
  void prepare(const Problem&, unsigned long long seed, long long max_rows);
  // {"cubin_path", "kernels": [{"name","grid":[3],"threads","smem"}...], "workspace", "check_determinism",
  //  "timing": {...}} -> result json
  nlohmann::json run(const nlohmann::json& request);

 private:
  struct Buffer {
    CUdeviceptr ptr = 0;
    size_t capacity = 0;  // allocated; kept across problems
    size_t bytes = 0;     // what the current problem uses
  };
  struct Kernel {
    CUfunction fn;
    unsigned grid[3], threads, smem;
  };
  void ensure(Buffer&, size_t bytes);
  void prepare_fwd(const Problem&, unsigned long long seed, long long max_rows);
  void prepare_bwd(const Problem&, unsigned long long seed);
  void launch_all(const std::vector<Kernel>&, CUstream);
  void poison_outputs();
  std::vector<std::vector<uint8_t>> read_outputs();  // the problem's outputs, as bytes
  void validate_fwd(const std::vector<std::vector<uint8_t>>&, nlohmann::json& out);
  void validate_bwd(const std::vector<std::vector<uint8_t>>&, nlohmann::json& out);

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  DeviceInfo info_;
  Problem problem_;
  unsigned long long seed_ = 0;
  bool prepared_ = false;
  // Forward: q, k, v in, o, lse out. Backward: q, k, v, o, lse, dout in; dq, dk, dv out.
  Buffer q_, k_, v_, o_, lse_, dout_, dq_, dk_, dv_, delta_, dq_accum_, workspace_, flush_;
  // Forward reference: sampled query rows (flat b*H*Sq + h*Sq + i) of O and LSE.
  std::vector<int64_t> rows_;
  std::vector<double> ref_o_, ref_lse_;
  // Backward reference: every head's gradients; heads repeat the data of `distinct_heads_`
  // independent ones (head h holds head h % distinct_heads_), so all of them are checked in full.
  int distinct_heads_ = 0;
  std::vector<double> ref_dq_, ref_dk_, ref_dv_;
};

}  // namespace flashtune
