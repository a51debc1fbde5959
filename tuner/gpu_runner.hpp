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
  // Generates inputs for the problem (seeded) and the reference rows, unless already current.
  void prepare(const Problem&, unsigned long long seed, long long max_rows);
  // {"cubin_path","kernel","grid":[3],"threads","smem","workspace","check","timing":{...}} -> result json
  nlohmann::json run(const nlohmann::json& request);

 private:
  struct Buffer {
    CUdeviceptr ptr = 0;
    size_t bytes = 0;
  };
  void ensure(Buffer&, size_t bytes);
  void launch(CUfunction, const nlohmann::json& req, CUstream);

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  DeviceInfo info_;
  Problem problem_;
  unsigned long long seed_ = 0;
  bool prepared_ = false;
  Buffer q_, k_, v_, o_, lse_, workspace_, flush_;
  std::vector<int64_t> rows_;           // validated query rows (flat b*H*Sq + h*Sq + i)
  std::vector<double> ref_o_, ref_lse_;  // rows_.size() x d, rows_.size()
};

}  // namespace flashtune
