// The worker's side: owns the CUDA context (driver API), the problem's device buffers,
// the seeded inputs and the reference rows; runs, validates and times one kernel per request.
#pragma once
#include <memory>

#include "worker/telemetry.hpp"
#include <cuda.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "templates/attention_params.h"

#include "core/kernel_record.hpp"
#include "core/problem.hpp"
#include "worker/prepared.hpp"
#include "worker/validate.hpp"

namespace flashtune {

// A CUDA call failed. `sticky` errors (illegal address, launch failure...) poison the context:
// the worker reports them as a crash and exits so that the parent starts a fresh one.
struct CudaError : std::runtime_error {
  CUresult code;
  bool sticky;
  CudaError(CUresult c, const std::string& what);
};

// A device allocation failed with CUDA_ERROR_OUT_OF_MEMORY (or cuBLAS could not allocate). Not
// sticky: the runner has freed its large buffers when this reaches the worker's loop, which
// answers "oom" and goes on. `asked`: the allocation that failed; `needed`: what the whole run
// needs, when known (else 0).
struct OutOfMemory : std::runtime_error {
  size_t asked, needed;
  OutOfMemory(size_t asked_bytes, size_t needed_bytes, const std::string& what)
      : std::runtime_error(what), asked(asked_bytes), needed(needed_bytes) {}
};

// Wall time per named phase, in ms: each lap adds the time since the previous lap (or the start) to its phase.
class PhaseClock {
 public:
  void lap(const char* phase) {
    const auto now = std::chrono::steady_clock::now();
    ms_[phase] = ms_.value(phase, 0.0) + std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
  }
  // The phases, with "total": the time since the start.
  nlohmann::json ms() const {
    nlohmann::json out = ms_;
    out["total"] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
    return out;
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_ = start_;
  nlohmann::json ms_ = nlohmann::json::object();
};

class GpuRunner {
 public:
  // threads: the CPU threads its parallel parts (input generation, reference, validation) use; 0: every core.
  explicit GpuRunner(int device_ordinal, int threads = 0);
  ~GpuRunner();
  DeviceInfo device_info() const { return info_; }
  // Generates inputs for the problem (seeded) and the reference, unless already current. With
  // `inputs_dir` non-empty the inputs are read from DIR/q.bin, k.bin, v.bin (and do.bin for a
  // backward; see input_files.hpp) instead, and a backward's reference covers every head. Returns where
  // its time went, in ms: {"inputs" (generated or read), "reference" (with the backward's bounds),
  // "upload" (device buffers, copies, the backward's O and LSE in their formats), "total"}; {} when current.
  // `prepared_file` (generated inputs of a dense problem): the tuner's file of this problem's inputs and reference
  // (worker/prepared.hpp), read instead of computed ("read" in the phases) unless it is not exactly this
  // problem's; then prepared_rejected() says why and the worker computes them itself.
  nlohmann::json prepare(const Problem&, unsigned long long seed, long long max_rows,
                         const std::string& inputs_dir = "", const std::string& prepared_file = "");
  // Why the last prepare's file was not used ("" when it was, or when none was named).
  const std::string& prepared_rejected() const { return prepared_rejected_; }
  // {"cubin_path", "kernels": [{"name","grid":[3],"threads","smem"}...], "workspace", "check_determinism",
  //  "reproducible_runs" (N > 1: the validated run repeated N times, invalid unless every output is equal bit
  //  for bit), "timing": {...}, "save_dir" (optional)} -> result json, with "mean_abs" and "peak_bytes" beside
  //  max_abs/max_rel/mse. With "save_dir" the validated run's outputs are written there as raw files:
  //  forward o.bin (dtype) and lse.bin (fp32); backward dq.bin, dk.bin, dv.bin (dtype).
  nlohmann::json run(const nlohmann::json& request);
  // Library baselines (library_runner.cpp). {"impl": "cublas_unfused", "timing": {...}} on the
  // prepared problem: validated and timed like run(); same result fields.
  nlohmann::json run_library(const nlohmann::json& request);
  // Peak probes: cuBLAS GEMM 8192^3 TFLOP/s (fp32, tf32, bf16, fp16) and device copy GB/s.
  nlohmann::json probe(const nlohmann::json& request);
  // Frees every problem buffer (after an out-of-memory): the next problem starts from nothing.
  void release_buffers();

 private:
  struct Buffer {
    CUdeviceptr ptr = 0;
    size_t capacity = 0;  // allocated; kept across problems
    size_t bytes = 0;     // what the current problem uses (0: unused by it)
  };
  // Page-locked host memory (cuMemAllocHost) for the outputs read back, kept across runs and problems like
  // a Buffer: a copy at the copy engine's speed into pages that are already there, where a fresh pageable
  // vector per read took its page faults and a staged copy. Pageable where pinned memory is refused.
  struct HostBuffer {
    uint8_t* ptr = nullptr;
    size_t capacity = 0;
    size_t bytes = 0;  // the current output's
    bool pinned = false;
  };
  using Outputs = std::vector<HostBuffer>;  // one per output, in read_outputs' order
  struct LibraryState;  // cuBLAS handle and the NVRTC'd softmax module (library_runner.cpp)
  struct Kernel {
    CUfunction fn;
    unsigned grid[3], threads, smem;
    unsigned cluster = 1;  // CTAs per cluster along x (Launch::cluster_x)
  };
  // Sizes the buffer for the current problem, reallocating when it is too small. On out of memory
  // it frees the buffers the current problem does not use and tries once more, then throws
  // OutOfMemory (the caller releases everything).
  void ensure(Buffer&, size_t bytes);
  std::vector<Buffer*> problem_buffers();  // every buffer but the L2 flush
  std::vector<Buffer*> output_buffers();   // the problem's outputs: dQ, dK, dV (backward) or O, LSE
  // ALiBi (Problem::alibi): seeded_alibi_slopes(B*H, H, period), or `slopes` ([B, H]), into alibi_host_ and alibi_.
  void upload_alibi(const Problem& p, long long period);
  void upload_alibi(std::vector<float> slopes);
  // mask_mod (Problem::mask_mod): its summary program compiled (NVRTC) and loaded, its tensors uploaded, and the
  // predicate materialised by mask_mod_dense into mask_host_, the float64 reference's explicit mask.
  void prepare_mask(const Problem& p);
  // The block summary for a kernel's blocks (Family::mask_blocks; the request's "mask_blocks"), computed on the GPU
  // once per (problem, blocks) and kept in mask_states_, mask_count_, mask_index_; mask_list_ is the kernel's view.
  void mask_summary(int block_q, int block_k);
  size_t problem_bytes();                  // sum of their `bytes`: the run's device footprint
  // Warm-up, then `reps` L2-flushed, event-timed repeats of `launch`: reps, ms_median, ms_p20, ms_p80.
  void time_repeats(const std::function<void()>& launch, const nlohmann::json& timing, nlohmann::json& out);
  void init_library();
  void destroy_library();
  void prepare_fwd(const Problem&, unsigned long long seed, long long max_rows, const std::string& inputs_dir,
                   const std::string& prepared_file);
  void prepare_bwd(const Problem&, unsigned long long seed, const std::string& inputs_dir,
                   const std::string& prepared_file);
  HostPrepared host_side(const Problem&, unsigned long long seed, long long max_rows, const std::string& prepared_file);
  // Packed variable-length batches (Problem::varlen): token-major inputs and the offsets.
  void prepare_varlen_fwd(const Problem&, unsigned long long seed, long long max_rows);
  void prepare_varlen_bwd(const Problem&, unsigned long long seed);
  // Paged K/V caches (Problem::paged): prepare_fwd's seeded inputs, K and V scattered into pools of pages in the
  // block table's order, the block table and the cache lengths; the reference reads the logical K/V.
  void prepare_paged_fwd(const Problem&, unsigned long long seed, long long max_rows);
  // count units of unit_bytes to dst, unit i from unit i % distinct of src (inputs tiled over the heads)
  static void upload_tiled(CUdeviceptr dst, const void* src, size_t unit_bytes, int distinct, int count);
  void launch_all(const std::vector<Kernel>&, CUstream);
  // The request's "tensor_maps" (Family::tensor_maps) encoded over this problem's buffers into maps_;
  // none: the kernels take the params struct alone.
  void encode_tensor_maps(const nlohmann::json& specs);
  void poison_outputs();
  static void ensure_host(HostBuffer&, size_t bytes);
  static void free_host(HostBuffer&);
  void read_outputs(Outputs& into);  // the problem's outputs, as bytes
  static bool same_bytes(const HostBuffer&, const HostBuffer&);
  // The validated run's outputs against the reference (worker/validate.hpp) into `out`.
  void validate(const Outputs& outputs, nlohmann::json& out);

  int ordinal_ = 0;
  int threads_ = 0;  // CPU threads for the parallel parts (0: every core)
  CUdevice dev_ = 0;
  std::unique_ptr<Telemetry> telemetry_;  // clocks, temperature, power, throttle reasons beside each timing
  CUcontext ctx_ = nullptr;
  DeviceInfo info_;
  Problem problem_;
  unsigned long long seed_ = 0;
  std::string inputs_dir_;  // where the prepared inputs came from; empty: generated from seed_
  bool prepared_ = false;
  // Forward: q, k, v in, o, lse out. Backward: q, k, v, o, lse, dout in; dq, dk, dv out.
  Buffer q_, k_, v_, o_, lse_, dout_, dq_, dk_, dv_, delta_, dq_accum_, workspace_, flush_;
  Buffer cu_q_, cu_k_;  // varlen: batch + 1 int32 offsets each (unused by dense problems)
  Buffer alibi_;  // ALiBi: B*H fp32 slopes, [B, H] (seeded_alibi_slopes: alibi_host_'s copy)
  std::vector<float> alibi_host_;  // the reference's view of them (it holds a pointer: kept with the problem)
  Buffer block_table_, cache_seqlens_;  // paged: (B, max_pages) and (B) int32 (k_ and v_ then hold the pools)
  // mask_mod: the predicate's tensors, the block summary (states, list counts and entries), the dense mask; the
  // summary program; the mask's host copy for the reference; the summary's blocks and the kernel's list view.
  Buffer mask_tensors_[kMaxMaskTensors], mask_states_, mask_count_, mask_index_, mask_dense_;
  CUmodule mask_module_ = nullptr;
  CUfunction mask_states_fn_ = nullptr, mask_lists_fn_ = nullptr, mask_dense_fn_ = nullptr;
  std::string mask_module_hash_;  // the loaded program's predicate
  std::vector<uint8_t> mask_host_;
  int mask_blocks_[2] = {0, 0};
  MaskModArgs mask_args_{};
  int max_pages_ = 0;                   // paged: the block table's row stride
  // The unfused baseline's scores S (fp32) and probabilities P (dtype): allocated per run_library
  // call and freed at its end, so they never crowd out a family's run.
  Buffer scores_, probs_;
  PhaseClock prepare_clock_;  // the current prepare's phases
  std::string prepared_rejected_;  // why the current prepare's file was not used
  LibraryState* lib_ = nullptr;
  // The current run's TMA descriptors: the kernels' second parameter (ignored by kernels that take one).
  AttnTensorMaps maps_{};
  // Forward reference: sampled query rows (flat b*H*Sq + h*Sq + i) of O and LSE, with their magnitudes;
  // generated inputs tile forward_distinct_units(problem) distinct units over the heads (validate.hpp).
  FwdReference fwd_ref_;
  // Backward reference: every head's gradients; heads repeat the data of `distinct_heads_`
  // independent ones (head h holds head h % distinct_heads_), so all of them are checked in full.
  // File-backed inputs: distinct_heads_ = B*H, every head has its own reference.
  int distinct_heads_ = 0;
  BwdReference bwd_ref_;
  BwdBounds bwd_bounds_;  // each reference element's bound, once per problem
  Outputs outputs_;       // the validated run's outputs
  Outputs again_;         // a repeated run's (check_determinism, reproducible_runs)
};

}  // namespace flashtune
