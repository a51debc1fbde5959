// What the core knows of a compiled kernel and of a device, without the results store: the NVRTC stage
// (compile.hpp) makes KernelRecords, the worker reports a DeviceInfo, and the store (store.hpp) keeps both.
#pragma once
#include <optional>
#include <string>

#include "core/problem.hpp"

namespace flashtune {

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
  std::string created;  // when it was stored (read back; put_kernel stamps the time itself)
};

// Where compiled kernels are kept between runs (the results store implements it): looked up by variant hash
// before compiling, and each new one put there.
class KernelCache {
 public:
  virtual ~KernelCache() = default;
  virtual std::optional<KernelRecord> find_kernel(const std::string& hash, bool with_cubin = true) = 0;
  virtual void put_kernel(const KernelRecord&) = 0;
};

}  // namespace flashtune
