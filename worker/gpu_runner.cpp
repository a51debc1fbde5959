#include "worker/gpu_runner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/cluster_launch.hpp"
#include "core/dtype_convert.hpp"
#include "core/family.hpp"
#include "core/input_files.hpp"
#include "core/mask_summary.hpp"
#include "core/tensor_maps.hpp"
#include "core/timing.hpp"
#include "reference/attention_ref.hpp"
#include "templates/attention_params.h"
#include "worker/cuda_check.hpp"
#include "worker/inputs.hpp"
#include "worker/prepared.hpp"
#include "worker/validate.hpp"

using nlohmann::json;

namespace flashtune {

namespace {

bool is_sticky(CUresult r) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
      return true;
    default:
      return false;
  }
}

}  // namespace

CudaError::CudaError(CUresult c, const std::string& what) : std::runtime_error(what), code(c), sticky(is_sticky(c)) {}

GpuRunner::GpuRunner(int ordinal, int threads) : ordinal_(ordinal), threads_(threads) {
  CU_CHECK(cuInit(0));
  int count = 0;
  CU_CHECK(cuDeviceGetCount(&count));
  if (ordinal < 0 || ordinal >= count)
    throw std::runtime_error("no CUDA device " + std::to_string(ordinal) + " (found " + std::to_string(count) + ")");
  CU_CHECK(cuDeviceGet(&dev_, ordinal));
  // The device's primary context, the one the CUDA runtime uses too: cuBLAS (library_runner.cpp)
  // then runs in this same context, on the same legacy default stream as our launches.
  CU_CHECK(cuDevicePrimaryCtxRetain(&ctx_, dev_));
  CU_CHECK(cuCtxSetCurrent(ctx_));
  char pci[32] = {};
  CU_CHECK(cuDeviceGetPCIBusId(pci, sizeof pci, dev_));
  telemetry_ = std::make_unique<Telemetry>(pci);

  char name[256] = {};
  CU_CHECK(cuDeviceGetName(name, sizeof name, dev_));
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    CU_CHECK(cuDeviceGetAttribute(&v, a, dev_));
    return v;
  };
  info_.name = name;
  info_.arch = "sm_" + std::to_string(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)) +
               std::to_string(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
  info_.sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  info_.l2_bytes = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  info_.max_smem_optin = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  info_.clock_khz = attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
  size_t mem = 0;
  CU_CHECK(cuDeviceTotalMem(&mem, dev_));
  info_.memory_bytes = (long long)mem;
  CU_CHECK(cuDriverGetVersion(&info_.driver_version));
}

GpuRunner::~GpuRunner() {
  destroy_library();
  if (mask_module_) cuModuleUnload(mask_module_);
  for (Outputs* o : {&outputs_, &again_})
    for (HostBuffer& h : *o) free_host(h);
  for (Buffer* b : problem_buffers())
    if (b->ptr) cuMemFree(b->ptr);
  if (flush_.ptr) cuMemFree(flush_.ptr);
  if (ctx_) cuDevicePrimaryCtxRelease(dev_);
}

std::vector<GpuRunner::Buffer*> GpuRunner::problem_buffers() {
  return {&q_, &k_, &v_, &o_, &lse_, &dout_, &dq_, &dk_, &dv_, &delta_, &dq_accum_, &workspace_, &scores_, &probs_,
          &cu_q_, &cu_k_, &block_table_, &cache_seqlens_, &alibi_, &mask_tensors_[0], &mask_tensors_[1],
          &mask_tensors_[2], &mask_tensors_[3], &mask_states_, &mask_count_, &mask_index_, &mask_dense_};
}

size_t GpuRunner::problem_bytes() {
  size_t sum = 0;
  for (Buffer* b : problem_buffers()) sum += b->bytes;
  return sum;
}

void GpuRunner::release_buffers() {
  prepared_ = false;  // the inputs are gone
  for (Buffer* b : problem_buffers()) {
    if (b->ptr) cuMemFree(b->ptr);  // unchecked: this runs on the error path
    *b = Buffer{};
  }
  if (flush_.ptr) cuMemFree(flush_.ptr);
  flush_ = Buffer{};
}

void GpuRunner::ensure(Buffer& b, size_t bytes) {
  b.bytes = bytes;
  if (b.capacity >= bytes && b.ptr) return;
  if (b.ptr) CU_CHECK(cuMemFree(b.ptr));
  b.ptr = 0;
  b.capacity = 0;
  const size_t n = std::max<size_t>(bytes, 256);
  CUresult rc = cuMemAlloc(&b.ptr, n);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
    // Capacity kept from earlier problems may be what is in the way: free what this problem
    // does not use, then try once more.
    for (Buffer* other : problem_buffers())
      if (other != &b && other->bytes == 0 && other->ptr) {
        CU_CHECK(cuMemFree(other->ptr));
        *other = Buffer{};
      }
    rc = cuMemAlloc(&b.ptr, n);
  }
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
    b.ptr = 0;
    size_t free_b = 0, total_b = 0;
    cuMemGetInfo(&free_b, &total_b);
    throw OutOfMemory(n, 0, "out of device memory: cuMemAlloc of " + std::to_string(n) + " bytes failed (" +
                                std::to_string(free_b) + " of " + std::to_string(total_b) + " bytes free)");
  }
  CU_CHECK(rc);
  b.capacity = bytes;
}

json GpuRunner::prepare(const Problem& p, unsigned long long seed, long long max_rows, const std::string& inputs_dir,
                        const std::string& prepared_file) {
  // Generated and file-backed inputs never stand in for each other, nor two folders' files.
  if (prepared_ && p == problem_ && seed == seed_ && inputs_dir == inputs_dir_) return json::object();
  prepared_ = false;
  prepared_rejected_.clear();
  prepare_clock_ = PhaseClock();
  // Only what this problem ensures counts toward its footprint (peak_bytes).
  for (Buffer* b : problem_buffers()) b->bytes = 0;
  try {
    if (p.varlen.enabled() && !inputs_dir.empty()) throw std::runtime_error("varlen problems take generated inputs");
    if (p.paged.enabled() && !inputs_dir.empty()) throw std::runtime_error("paged problems take generated inputs");
    if (p.paged.enabled() && p.direction != "fwd") throw std::runtime_error("paged problems are forward problems");
    mask_blocks_[0] = mask_blocks_[1] = 0;  // the summary is the problem's and the kernel's blocks'
    if (p.mask_mod.enabled()) {
      if (!inputs_dir.empty()) throw std::runtime_error("mask_mod problems take generated inputs");
      prepare_mask(p);
    }
    if (p.varlen.enabled() && p.direction == "bwd") prepare_varlen_bwd(p, seed);
    else if (p.varlen.enabled()) prepare_varlen_fwd(p, seed, max_rows);
    else if (p.paged.enabled()) prepare_paged_fwd(p, seed, max_rows);
    else if (p.direction == "bwd") prepare_bwd(p, seed, inputs_dir, prepared_file);
    else prepare_fwd(p, seed, max_rows, inputs_dir, prepared_file);
    // The L2 flush buffer: twice the L2, rewritten before every timed repeat.
    ensure(flush_, (size_t)std::max(info_.l2_bytes, 1 << 20) * 2);
    prepare_clock_.lap("upload");
  } catch (const OutOfMemory&) {
    release_buffers();  // OOM is not sticky: the next problem starts from a clean slate
    throw;
  }
  problem_ = p;
  seed_ = seed;
  inputs_dir_ = inputs_dir;
  prepared_ = true;
  return prepare_clock_.ms();
}

// The host side of a dense problem with generated inputs: the tuner's file when it names one and holds exactly
// this problem (worker/prepared.hpp), else computed here by the same function.
HostPrepared GpuRunner::host_side(const Problem& p, unsigned long long seed, long long max_rows,
                                  const std::string& prepared_file) {
  HostPrepared h;
  if (p.mask_mod.enabled())  // the tuner cannot prepare it (it has no GPU to run the predicate on): computed here
    return prepare_host(p, seed, max_rows, threads_, [this](const char* phase) { prepare_clock_.lap(phase); }, {},
                        mask_host_.data());
  if (!prepared_file.empty()) {
    std::string why;
    if (read_prepared(prepared_file, p, seed, max_rows, h, why)) {
      prepare_clock_.lap("read");
      return h;
    }
    prepared_rejected_ = why;
    prepare_clock_.lap("read");
  }
  return prepare_host(p, seed, max_rows, threads_, [this](const char* phase) { prepare_clock_.lap(phase); });
}

void GpuRunner::prepare_fwd(const Problem& p, unsigned long long seed, long long max_rows,
                            const std::string& inputs_dir, const std::string& prepared_file) {
  // Generated inputs: forward_distinct_units' distinct (kv head, query group) units tiled over the
  // B*Hk of the problem (all of them but at scale: 103 GB of host inputs at B = 64, Sk = 128k otherwise),
  // the reference's sampled rows from the units they repeat (prepare_host). File inputs: every head is its own.
  const int bhk = p.batch * p.kv_heads();
  const size_t unit_q = (size_t)p.group() * p.seq_q * p.head_dim, unit_k = (size_t)p.seq_k * p.head_dim;
  const size_t elem = dtype_bytes(p.dtype);
  HostPrepared h;
  if (inputs_dir.empty()) {
    h = host_side(p, seed, max_rows, prepared_file);
  } else {
    // The files' numbers as they are.
    const std::vector<InputFile> files = input_files(p);
    const HostTensor q = loaded_input(inputs_dir, files[0], p.dtype), k = loaded_input(inputs_dir, files[1], p.dtype),
                     v = loaded_input(inputs_dir, files[2], p.dtype);
    prepare_clock_.lap("inputs");
    ref::Shape shape = with_modifications(ref::Shape{p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim, p.causal}, p);
    shape.heads_k = p.heads_k;
    const std::vector<float> slopes = p.alibi ? seeded_alibi_slopes((long long)p.batch * p.heads, p.heads,
                                                                   (long long)p.batch * p.heads)
                                              : std::vector<float>{};
    if (p.alibi) shape.alibi_slopes = slopes.data(), shape.alibi_batch_stride = p.heads;  // every head its own
    h.units = bhk;
    h.fwd = tiled_forward_reference(shape, bhk, q.values.data(), k.values.data(), v.values.data(),
                                    ref::sample_rows(shape, max_rows, seed), threads_);
    prepare_clock_.lap("reference");
    h.q = q.bytes;
    h.k = k.bytes;
    h.v = v.bytes;
  }
  const int units = h.units;
  ensure(q_, bhk * unit_q * elem);
  ensure(k_, bhk * unit_k * elem);
  ensure(v_, bhk * unit_k * elem);
  ensure(o_, bhk * unit_q * elem);
  ensure(lse_, (size_t)p.batch * p.heads * p.seq_q * 4);
  upload_tiled(q_.ptr, h.q.data(), unit_q * elem, units, bhk);
  upload_tiled(k_.ptr, h.k.data(), unit_k * elem, units, bhk);
  upload_tiled(v_.ptr, h.v.data(), unit_k * elem, units, bhk);
  if (p.alibi) upload_alibi(p, (long long)units * p.group());  // the reference's slopes (prepare_host, above)
  fwd_ref_ = std::move(h.fwd);
}

void GpuRunner::prepare_bwd(const Problem& p, unsigned long long seed, const std::string& inputs_dir,
                            const std::string& prepared_file) {
  // Generated inputs: independent heads' worth of data tiled over all B*H heads (prepare_host: two heads, or
  // one when a head alone costs ~10^11 float64 operations), so that the float64 reference of a whole head's
  // backward stays affordable and every output element of every head is checked. File-backed inputs: every
  // head is its own, so the reference covers all B*H of them.
  // Grouped-query attention: the unit is a kv head with its group of query heads (one query head
  // when multi-head); the distinct groups are tiled, query heads over query heads and kv heads over kv
  // heads, so that query head i holds distinct query head i % (groups * g) and kv head G distinct
  // kv head G % groups: element i of every gradient is element i % size of its reference.
  const int bh = p.batch * p.heads, bhk = p.batch * p.kv_heads(), g = p.group();
  const size_t hq = (size_t)p.seq_q * p.head_dim, hk = (size_t)p.seq_k * p.head_dim;
  const size_t elem = dtype_bytes(p.dtype);
  HostPrepared h;
  if (inputs_dir.empty()) {
    h = host_side(p, seed, /*max_rows=*/0, prepared_file);
  } else {
    const double head_cost = (double)p.seq_q * p.seq_k * p.head_dim;
    if (bh * head_cost > kMaxFileBwdReferenceWork)
      throw std::runtime_error("backward with file inputs: B*H*Sq*Sk*d = " + std::to_string(bh * head_cost) +
                               " is over 2^34, too slow for the float64 reference of every head");
    const std::vector<InputFile> files = input_files(p);
    const HostTensor q = loaded_input(inputs_dir, files[0], p.dtype), k = loaded_input(inputs_dir, files[1], p.dtype),
                     v = loaded_input(inputs_dir, files[2], p.dtype), dout = loaded_input(inputs_dir, files[3], p.dtype);
    prepare_clock_.lap("inputs");
    h.groups = bhk;
    h.distinct_heads = bhk * g;
    ref::Shape heads = with_modifications(ref::Shape{1, h.distinct_heads, p.seq_q, p.seq_k, p.head_dim, p.causal}, p);
    heads.heads_k = g > 1 ? h.groups : 0;
    const std::vector<float> slopes =
        p.alibi ? seeded_alibi_slopes(h.distinct_heads, p.heads, h.distinct_heads) : std::vector<float>{};
    if (p.alibi) heads.alibi_slopes = slopes.data();  // every head its own
    h.bwd = backward_reference(heads, q.values.data(), k.values.data(), v.values.data(), dout.values.data(), threads_);
    h.bounds = backward_bounds(p, h.bwd);
    prepare_clock_.lap("reference");
    h.q = q.bytes;
    h.k = k.bytes;
    h.v = v.bytes;
    h.dout = dout.bytes;
  }
  const int groups = h.groups;
  distinct_heads_ = h.distinct_heads;
  if (p.alibi) upload_alibi(p, distinct_heads_);  // head bh's slope that of distinct head bh % distinct_heads_
  bwd_ref_ = std::move(h.bwd);
  bwd_bounds_ = std::move(h.bounds);
  const auto &q_dev = h.q, &k_dev = h.k, &v_dev = h.v, &do_dev = h.dout;
  // The forward's results as the backward's inputs: O in the kernel's dtype, LSE in fp32.
  std::vector<float> o_f(bwd_ref_.o.begin(), bwd_ref_.o.end()), lse_f(bwd_ref_.lse.begin(), bwd_ref_.lse.end());
  const auto o_dev = to_device_format(o_f, p.dtype);

  ensure(q_, bh * hq * elem);
  ensure(k_, bhk * hk * elem);
  ensure(v_, bhk * hk * elem);
  ensure(o_, bh * hq * elem);
  ensure(dout_, bh * hq * elem);
  ensure(lse_, (size_t)bh * p.seq_q * 4);
  ensure(dq_, bh * hq * elem);
  ensure(dk_, bhk * hk * elem);
  ensure(dv_, bhk * hk * elem);
  ensure(delta_, (size_t)bh * p.seq_q * 4);
  ensure(dq_accum_, bh * hq * 4);
  upload_tiled(q_.ptr, q_dev.data(), hq * elem, distinct_heads_, bh);
  upload_tiled(o_.ptr, o_dev.data(), hq * elem, distinct_heads_, bh);
  upload_tiled(dout_.ptr, do_dev.data(), hq * elem, distinct_heads_, bh);
  upload_tiled(lse_.ptr, lse_f.data(), (size_t)p.seq_q * 4, distinct_heads_, bh);
  upload_tiled(k_.ptr, k_dev.data(), hk * elem, groups, bhk);
  upload_tiled(v_.ptr, v_dev.data(), hk * elem, groups, bhk);
}

// Packed variable-length forward: Q (total_q, H, d), K and V (total_k, Hk, d), O likewise, LSE (H, total_q),
// every token and head its own seeded numbers (the same streams as a dense problem's); the reference on
// sampled rows (varlen_sample_rows: every sequence's first, middle and last tokens, then random ones).
void GpuRunner::prepare_varlen_fwd(const Problem& p, unsigned long long seed, long long max_rows) {
  const size_t nq = (size_t)p.varlen.total_q() * p.heads * p.head_dim;
  const size_t nk = (size_t)p.varlen.total_k() * p.kv_heads() * p.head_dim;
  const size_t elem = dtype_bytes(p.dtype);
  const HostTensor q = generated_input(nq, splitmix64(seed ^ 0x51), p.dtype, p.inputs, threads_),
                   k = generated_input(nk, splitmix64(seed ^ 0x4b), p.dtype, p.inputs, threads_),
                   v = generated_input(nk, splitmix64(seed ^ 0x56), p.dtype, p.inputs, threads_);
  prepare_clock_.lap("inputs");
  const std::vector<int> cu_q = p.varlen.cu_seqlens_q(), cu_k = p.varlen.cu_seqlens_k();
  ensure(q_, nq * elem);
  ensure(k_, nk * elem);
  ensure(v_, nk * elem);
  ensure(o_, nq * elem);
  ensure(lse_, (size_t)p.rows_q() * 4);
  ensure(cu_q_, cu_q.size() * 4);
  ensure(cu_k_, cu_k.size() * 4);
  CU_CHECK(cuMemcpyHtoD(q_.ptr, q.bytes.data(), nq * elem));
  CU_CHECK(cuMemcpyHtoD(k_.ptr, k.bytes.data(), nk * elem));
  CU_CHECK(cuMemcpyHtoD(v_.ptr, v.bytes.data(), nk * elem));
  CU_CHECK(cuMemcpyHtoD(cu_q_.ptr, cu_q.data(), cu_q.size() * 4));
  CU_CHECK(cuMemcpyHtoD(cu_k_.ptr, cu_k.data(), cu_k.size() * 4));
  prepare_clock_.lap("upload");
  if (p.alibi) upload_alibi(p, (long long)p.batch * p.heads);  // every (sequence, head) its own
  fwd_ref_ = varlen_forward_reference(p, q.values.data(), k.values.data(), v.values.data(),
                                      varlen_sample_rows(p, max_rows, seed), threads_, alibi_host_.data());
  prepare_clock_.lap("reference");
}

// Packed variable-length backward: as the dense backward, distinct heads' worth of data repeated over the
// heads so that the float64 reference of every element stays affordable, here inside each token
// (prepare_varlen_backward_host: `units` distinct kv heads with their query groups, query head h of every token
// distinct head h % (units*g), kv head hk distinct kv head hk % units). Every element of dQ, dK, dV is checked
// against its distinct one. ALiBi: the slopes the reference read, [B, H] as the packed forward's (stride H).
void GpuRunner::prepare_varlen_bwd(const Problem& p, unsigned long long seed) {
  const int H = p.heads, Hk = p.kv_heads(), d = p.head_dim;
  HostPrepared h =
      prepare_varlen_backward_host(p, seed, threads_, [this](const char* phase) { prepare_clock_.lap(phase); });
  const int units = h.groups, hd = h.distinct_heads;
  distinct_heads_ = hd;
  const int64_t tq = p.varlen.total_q(), tk = p.varlen.total_k();
  const size_t elem = dtype_bytes(p.dtype);
  bwd_ref_ = std::move(h.bwd);
  bwd_bounds_ = std::move(h.bounds);
  std::vector<float> o_f(bwd_ref_.o.begin(), bwd_ref_.o.end()), lse_f(bwd_ref_.lse.begin(), bwd_ref_.lse.end());
  const auto o_dev = to_device_format(o_f, p.dtype);
  // Token t's row of `heads` heads from the distinct row of `distinct` heads: head h is distinct head h % distinct.
  auto expand = [&](const std::vector<uint8_t>& src, int64_t tokens, int distinct, int heads) {
    const size_t head_bytes = (size_t)d * elem;
    std::vector<uint8_t> out((size_t)tokens * heads * head_bytes);
    for (int64_t t = 0; t < tokens; ++t)
      for (int h = 0; h < heads; h += distinct)
        std::memcpy(out.data() + ((size_t)t * heads + h) * head_bytes, src.data() + (size_t)t * distinct * head_bytes,
                    (size_t)std::min(distinct, heads - h) * head_bytes);
    return out;
  };
  const size_t nq = (size_t)tq * H * d, nk = (size_t)tk * Hk * d;
  const std::vector<int> cu_q = p.varlen.cu_seqlens_q(), cu_k = p.varlen.cu_seqlens_k();
  for (Buffer* b : {&q_, &o_, &dout_, &dq_}) ensure(*b, nq * elem);
  for (Buffer* b : {&k_, &v_, &dk_, &dv_}) ensure(*b, nk * elem);
  ensure(lse_, (size_t)tq * H * 4);
  ensure(delta_, (size_t)tq * H * 4);
  ensure(dq_accum_, nq * 4);
  ensure(cu_q_, cu_q.size() * 4);
  ensure(cu_k_, cu_k.size() * 4);
  CU_CHECK(cuMemcpyHtoD(q_.ptr, expand(h.q, tq, hd, H).data(), nq * elem));
  CU_CHECK(cuMemcpyHtoD(o_.ptr, expand(o_dev, tq, hd, H).data(), nq * elem));
  CU_CHECK(cuMemcpyHtoD(dout_.ptr, expand(h.dout, tq, hd, H).data(), nq * elem));
  CU_CHECK(cuMemcpyHtoD(k_.ptr, expand(h.k, tk, units, Hk).data(), nk * elem));
  CU_CHECK(cuMemcpyHtoD(v_.ptr, expand(h.v, tk, units, Hk).data(), nk * elem));
  upload_tiled(lse_.ptr, lse_f.data(), (size_t)tq * 4, hd, H);  // (H, total_q): head h's row is distinct head h % hd's
  CU_CHECK(cuMemcpyHtoD(cu_q_.ptr, cu_q.data(), cu_q.size() * 4));
  CU_CHECK(cuMemcpyHtoD(cu_k_.ptr, cu_k.data(), cu_k.size() * 4));
  if (p.alibi) upload_alibi(std::move(h.alibi));  // sequence b's head h: its distinct head h % hd's slope in sequence b
}

// Paged forward: the dense forward's generated inputs (the same streams, units tiled over the B*Hk kv heads
// past 2^30 elements a tensor) are the logical K and V; each page of the pools (num_pages, Hk, P, d), or
// (num_pages, P, Hk, d) for token-major pages (Paged::layout), gets its sequence's rows of every kv head, in the
// block table's seeded order. A page's rows past its sequence's
// length hold NaN: a kernel that read a key past the cache length would show it. Pages go up in staging
// chunks of whole pages (the B = 64, Sk = 128k point's pools are 17 GB each).
void GpuRunner::prepare_paged_fwd(const Problem& p, unsigned long long seed, long long max_rows) {
  const int B = p.batch, Hk = p.kv_heads(), bhk = B * Hk, d = p.head_dim, P = p.paged.page_size;
  const int units = forward_distinct_units(p);
  const size_t unit_q = (size_t)p.group() * p.seq_q * d, unit_k = (size_t)p.seq_k * d;
  const size_t elem = dtype_bytes(p.dtype);
  const HostTensor q = generated_input(unit_q * units, splitmix64(seed ^ 0x51), p.dtype, p.inputs, threads_),
                   k = generated_input(unit_k * units, splitmix64(seed ^ 0x4b), p.dtype, p.inputs, threads_),
                   v = generated_input(unit_k * units, splitmix64(seed ^ 0x56), p.dtype, p.inputs, threads_);
  prepare_clock_.lap("inputs");
  const PageTable t = page_table(p.paged, B, p.seq_k);
  max_pages_ = t.max_pages;
  const size_t head_bytes = (size_t)P * d * elem, page_bytes = head_bytes * Hk;  // a kv head's rows in a page; a page
  ensure(q_, bhk * unit_q * elem);
  ensure(o_, bhk * unit_q * elem);
  ensure(lse_, (size_t)B * p.heads * p.seq_q * 4);
  ensure(k_, (size_t)t.num_pages * page_bytes);
  ensure(v_, (size_t)t.num_pages * page_bytes);
  ensure(block_table_, t.table.size() * 4);
  ensure(cache_seqlens_, t.cache_seqlens.size() * 4);
  upload_tiled(q_.ptr, q.bytes.data(), unit_q * elem, units, bhk);
  CU_CHECK(cuMemcpyHtoD(block_table_.ptr, t.table.data(), t.table.size() * 4));
  CU_CHECK(cuMemcpyHtoD(cache_seqlens_.ptr, t.cache_seqlens.data(), t.cache_seqlens.size() * 4));
  std::vector<std::pair<int, int>> owner(t.num_pages);  // physical page -> (sequence, logical page)
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < t.max_pages && t.table[(size_t)b * t.max_pages + j] >= 0; ++j)
      owner[t.table[(size_t)b * t.max_pages + j]] = {b, j};
  const size_t chunk_pages = std::max<size_t>(1, (64u << 20) / page_bytes);
  std::vector<uint8_t> staging(std::min<size_t>(chunk_pages, std::max(t.num_pages, 1)) * page_bytes);
  const uint32_t nan = nan_bits(p.dtype);  // its low `elem` bytes (little-endian) are the dtype's NaN
  for (const auto& [logical, pool] : {std::pair{&k, &k_}, std::pair{&v, &v_}})
    for (size_t first = 0; first < (size_t)t.num_pages; first += chunk_pages) {
      const size_t n = std::min(chunk_pages, (size_t)t.num_pages - first);
      for (size_t i = 0; i < n; ++i) {
        const auto [b, j] = owner[first + i];
        const int rows = std::min(P, t.cache_seqlens[b] - j * P);  // the page's keys; the rest NaN
        for (int h = 0; h < Hk; ++h) {
          const uint8_t* src = logical->bytes.data() + ((size_t)(b * Hk + h) % units * unit_k + (size_t)j * P * d) * elem;
          for (int r = 0; r < P; ++r) {  // row r of the page's kv head h, where the layout puts it
            uint8_t* dst = staging.data() + i * page_bytes + (size_t)paged_key_offset(p.paged.layout, 0, Hk, P, h, r, d) * elem;
            if (r < rows) std::memcpy(dst, src + (size_t)r * d * elem, (size_t)d * elem);
            else
              for (int e = 0; e < d; ++e) std::memcpy(dst + (size_t)e * elem, &nan, elem);
          }
        }
      }
      CU_CHECK(cuMemcpyHtoD(pool->ptr + first * page_bytes, staging.data(), n * page_bytes));
    }

  ref::Shape shape = with_modifications(ref::Shape{B, p.heads, p.seq_q, p.seq_k, d, p.causal}, p);
  shape.heads_k = p.heads_k;
  prepare_clock_.lap("upload");
  fwd_ref_ = paged_forward_reference(p, units, q.values.data(), k.values.data(), v.values.data(),
                                     ref::sample_rows(shape, max_rows, seed), threads_);
  prepare_clock_.lap("reference");
}

void GpuRunner::prepare_mask(const Problem& p) {
  const MaskPredicate& m = p.mask_mod.predicate;
  if (p.varlen.enabled() || p.paged.enabled()) throw std::runtime_error("mask_mod problems are dense");
  if (!p.mask_mod.has_values()) throw std::runtime_error("mask_mod: its tensors' values are not here (a stored problem's digests)");
  // The validation's reference tiles distinct heads' inputs over the problem's heads (prepare_host), which holds only
  // where every head has one mask: a predicate that reads b or h would need every head's own reference.
  if (m.reads_batch || m.reads_head)
    throw std::runtime_error("mask_mod: validating a predicate that reads b or h is not built (the reference's "
                             "heads share their inputs, and so must their mask)");
  if (mask_module_hash_ != m.hash()) {
    if (mask_module_) cuModuleUnload(mask_module_);
    mask_module_ = nullptr;
    mask_module_hash_.clear();
    const MaskSummaryProgram prog = compile_mask_summary(m, info_.arch);
    CU_CHECK(cuModuleLoadData(&mask_module_, prog.cubin.data()));
    CU_CHECK(cuModuleGetFunction(&mask_states_fn_, mask_module_, prog.lowered[0].c_str()));
    CU_CHECK(cuModuleGetFunction(&mask_lists_fn_, mask_module_, prog.lowered[1].c_str()));
    CU_CHECK(cuModuleGetFunction(&mask_dense_fn_, mask_module_, prog.lowered[2].c_str()));
    mask_module_hash_ = m.hash();
  }
  mask_args_ = MaskModArgs{};
  for (size_t i = 0; i < m.names.size(); ++i) {
    const std::vector<int32_t>& v = *p.mask_mod.values[i];
    ensure(mask_tensors_[i], v.size() * 4);
    CU_CHECK(cuMemcpyHtoD(mask_tensors_[i].ptr, v.data(), v.size() * 4));
    mask_args_.tensor[i] = MaskTensor{(const int*)mask_tensors_[i].ptr, (int)v.size()};
  }
  // The predicate on every (query, key) of one [Sq, Sk] mask (it reads neither b nor h: above).
  const long long n = mask_dense_elements(m, p.batch, p.heads, p.seq_q, p.seq_k);
  if (n > (1ll << 32)) throw std::runtime_error("mask_mod: a dense mask of " + std::to_string(n) + " bytes for the reference is past 2^32");
  ensure(mask_dense_, (size_t)n);
  MaskStatesArgs a = mask_dense_args(m, p.batch, p.heads, p.seq_q, p.seq_k);
  a.mask = mask_args_;
  a.states = (unsigned char*)mask_dense_.ptr;
  void* args[] = {&a};
  CU_CHECK(cuLaunchKernel(mask_dense_fn_, (unsigned)((n + kMaskDenseThreads - 1) / kMaskDenseThreads), 1, 1,
                          kMaskDenseThreads, 1, 1, 0, nullptr, args, nullptr));
  mask_host_.resize((size_t)n);
  CU_CHECK(cuMemcpyDtoH(mask_host_.data(), mask_dense_.ptr, (size_t)n));  // (synchronises)
  prepare_clock_.lap("mask");
}

void GpuRunner::mask_summary(int block_q, int block_k) {
  const Problem& p = problem_;
  if (mask_blocks_[0] == block_q && mask_blocks_[1] == block_k) return;  // this problem's, these blocks'
  if (block_q <= 0 || block_k <= 0) throw std::runtime_error("mask_mod: the request has no mask_blocks");
  MaskSummaryPlan plan = mask_summary_plan(p.mask_mod.predicate, p.direction == "bwd", p.batch, p.heads, p.heads_k,
                                           p.seq_q, p.seq_k, p.causal, block_q, block_k);
  ensure(mask_states_, plan.states_bytes);
  ensure(mask_count_, plan.count_bytes);
  ensure(mask_index_, plan.index_bytes);
  plan.states.mask = mask_args_;
  plan.states.states = (unsigned char*)mask_states_.ptr;
  void* sargs[] = {&plan.states};
  CU_CHECK(cuLaunchKernel(mask_states_fn_, plan.states_grid[0], plan.states_grid[1], plan.states_grid[2],
                          kMaskStatesThreads, 1, 1, 0, nullptr, sargs, nullptr));
  plan.lists.states = (const unsigned char*)mask_states_.ptr;
  plan.lists.count = (int*)mask_count_.ptr;
  plan.lists.index = (int*)mask_index_.ptr;
  void* largs[] = {&plan.lists};
  CU_CHECK(cuLaunchKernel(mask_lists_fn_, plan.lists_grid, 1, 1, kMaskListsThreads, 1, 1, 0, nullptr, largs, nullptr));
  CU_CHECK(cuCtxSynchronize());
  mask_args_.blocks = plan.blocks;
  mask_args_.blocks.count = (const int*)mask_count_.ptr;
  mask_args_.blocks.index = (const int*)mask_index_.ptr;
  mask_blocks_[0] = block_q, mask_blocks_[1] = block_k;
}

void GpuRunner::upload_alibi(const Problem& p, long long period) {
  upload_alibi(seeded_alibi_slopes((long long)p.batch * p.heads, p.heads, period));
}

void GpuRunner::upload_alibi(std::vector<float> slopes) {
  alibi_host_ = std::move(slopes);
  ensure(alibi_, alibi_host_.size() * 4);
  CU_CHECK(cuMemcpyHtoD(alibi_.ptr, alibi_host_.data(), alibi_host_.size() * 4));
}

void GpuRunner::upload_tiled(CUdeviceptr dst, const void* src, size_t unit_bytes, int distinct, int count) {
  // Unit i comes from unit i % distinct: a run of `distinct` units per copy.
  for (int i = 0; i < count; i += distinct)
    CU_CHECK(cuMemcpyHtoD(dst + (size_t)i * unit_bytes, src, (size_t)std::min(distinct, count - i) * unit_bytes));
}

void GpuRunner::launch_all(const std::vector<Kernel>& kernels, CUstream stream) {
  const Problem& p = problem_;
  const float scale = (float)(1.0 / std::sqrt((double)p.head_dim));
  const float scale_log2 = (float)(scale * M_LOG2E);
  float* workspace = workspace_.ptr ? (float*)workspace_.ptr : nullptr;
  AttnFwdParams fwd{(const void*)q_.ptr, (const void*)k_.ptr, (const void*)v_.ptr, (void*)o_.ptr, (float*)lse_.ptr,
                    workspace, p.batch, p.heads, p.seq_q, p.seq_k, scale, scale_log2, p.heads_k};
  AttnBwdParams bwd{(const void*)q_.ptr, (const void*)k_.ptr, (const void*)v_.ptr, (const void*)o_.ptr,
                    (const float*)lse_.ptr, (const void*)dout_.ptr, (void*)dq_.ptr, (void*)dk_.ptr, (void*)dv_.ptr,
                    (float*)delta_.ptr, (float*)dq_accum_.ptr, p.batch, p.heads, p.seq_q, p.seq_k, scale, scale_log2,
                    (void*)workspace, p.heads_k};
  // A packed variable-length batch: the packed kernels' argument, the dense struct and the offsets.
  const int *cu_q = (const int*)cu_q_.ptr, *cu_k = (const int*)cu_k_.ptr;
  VarlenParams<AttnFwdParams> fwd_varlen{fwd, cu_q, cu_k};
  VarlenParams<AttnBwdParams> bwd_varlen{bwd, cu_q, cu_k};
  const bool packed = p.varlen.enabled();
  // A paged K/V cache: the paged kernels' argument, the dense struct (k and v: the pools) and the block table.
  PagedParams<AttnFwdParams> fwd_paged{fwd, (const int*)block_table_.ptr, (const int*)cache_seqlens_.ptr,
                                       p.paged.page_size, max_pages_};
  // Score modifications (a window, a softcap, ALiBi): the modified kernels' argument, the plain one and AttnMods
  // (ALiBi's slopes [B, H], stride H: upload_alibi's).
  const AttnMods mods = make_attn_mods(p.window_left, p.window_right, p.softcap, scale,
                                       p.alibi ? (const float*)alibi_.ptr : nullptr, p.alibi ? p.heads : 0);
  ModParams<AttnFwdParams> fwd_mods{fwd, mods};
  ModParams<VarlenParams<AttnFwdParams>> fwd_varlen_mods{fwd_varlen, mods};
  ModParams<PagedParams<AttnFwdParams>> fwd_paged_mods{fwd_paged, mods};
  const bool modified = p.windowed() || p.softcapped() || p.alibi;
  // A mask_mod (dense only): MaskModParams, ModParams then the predicate's tensors and the summary's lists.
  const bool masked = p.mask_mod.enabled();
  MaskModParams<AttnFwdParams> fwd_mask{fwd_mods, mask_args_};
  void* fwd_args[] = {masked     ? (void*)&fwd_mask
                      : modified ? (packed ? (void*)&fwd_varlen_mods : p.paged.enabled() ? (void*)&fwd_paged_mods : (void*)&fwd_mods)
                                 : (packed ? (void*)&fwd_varlen : p.paged.enabled() ? (void*)&fwd_paged : (void*)&fwd),
                      &maps_};
  ModParams<AttnBwdParams> bwd_mods{bwd, mods};
  ModParams<VarlenParams<AttnBwdParams>> bwd_varlen_mods{bwd_varlen, mods};
  MaskModParams<AttnBwdParams> bwd_mask{bwd_mods, mask_args_};
  void* bwd_args[] = {masked     ? (void*)&bwd_mask
                      : modified ? (packed ? (void*)&bwd_varlen_mods : (void*)&bwd_mods)
                                 : (packed ? (void*)&bwd_varlen : (void*)&bwd),
                      &maps_};
  for (const Kernel& k : kernels) {
    void** args = p.direction == "bwd" ? bwd_args : fwd_args;
    if (k.cluster == 1) {
      CU_CHECK(cuLaunchKernel(k.fn, k.grid[0], k.grid[1], k.grid[2], k.threads, 1, 1, k.smem, stream, args, nullptr));
      continue;
    }
    CUlaunchAttribute attr;
    const CUlaunchConfig cfg = cluster_launch_config(k.grid, k.threads, k.smem, k.cluster, stream, attr);
    CU_CHECK(cuLaunchKernelEx(&cfg, k.fn, args, nullptr));
  }
}

void GpuRunner::encode_tensor_maps(const json& specs) {
  maps_ = AttnTensorMaps{};
  if (specs.is_null()) return;
  if (!specs.is_array()) throw std::runtime_error("tensor_maps must be an array");
  std::vector<TensorMapSpec> ms;
  for (const json& j : specs)
    ms.push_back({j.at("tensor").get<std::string>(), j.at("box_rows").get<int>(), j.at("box_cols").get<int>(),
                  j.at("swizzle").get<int>()});
  maps_ = flashtune::encode_tensor_maps(&cuTensorMapEncodeTiled, ms, problem_, {q_.ptr, k_.ptr, v_.ptr, o_.ptr, dout_.ptr});
}

void GpuRunner::poison_outputs() {
  const Problem& p = problem_;
  auto poison = [&](Buffer& b, DType t) {
    if (dtype_bytes(t) == 4) CU_CHECK(cuMemsetD32(b.ptr, nan_bits(t), b.bytes / 4));
    else CU_CHECK(cuMemsetD16(b.ptr, (unsigned short)nan_bits(t), b.bytes / 2));
  };
  if (p.direction == "bwd") {
    for (Buffer* b : {&dq_, &dk_, &dv_}) poison(*b, p.dtype);
    poison(delta_, DType::fp32);
    poison(dq_accum_, DType::fp32);
  } else {
    poison(o_, p.dtype);
    poison(lse_, DType::fp32);
  }
}

void GpuRunner::ensure_host(HostBuffer& h, size_t bytes) {
  if (!(h.capacity >= bytes && h.ptr)) {
    free_host(h);  // (resets h: bytes is set below, after it; set before it, a new buffer said 0 bytes, and the
                   // backward's first validated run of a worker, or of a larger problem, compared nothing)
    void* p = nullptr;
    if (cuMemAllocHost(&p, std::max<size_t>(bytes, 1)) == CUDA_SUCCESS) {
      h.pinned = true;
    } else {
      p = std::malloc(std::max<size_t>(bytes, 1));
      if (!p) throw std::bad_alloc();
    }
    h.ptr = static_cast<uint8_t*>(p);
    h.capacity = bytes;
  }
  h.bytes = bytes;
}

void GpuRunner::free_host(HostBuffer& h) {
  if (h.ptr && h.pinned) cuMemFreeHost(h.ptr);  // unchecked: this runs on the error path too
  else std::free(h.ptr);
  h = HostBuffer{};
}

std::vector<GpuRunner::Buffer*> GpuRunner::output_buffers() {
  return problem_.direction == "bwd" ? std::vector<Buffer*>{&dq_, &dk_, &dv_} : std::vector<Buffer*>{&o_, &lse_};
}

void GpuRunner::read_outputs(Outputs& into) {
  const std::vector<Buffer*> bufs = output_buffers();
  if (into.size() < bufs.size()) into.resize(bufs.size());
  for (size_t i = 0; i < bufs.size(); ++i) {
    ensure_host(into[i], bufs[i]->bytes);
    CU_CHECK(cuMemcpyDtoH(into[i].ptr, bufs[i]->ptr, bufs[i]->bytes));
  }
}

bool GpuRunner::same_bytes(const HostBuffer& a, const HostBuffer& b) {
  return a.bytes == b.bytes && std::memcmp(a.ptr, b.ptr, a.bytes) == 0;
}

// The outputs, read in their own format, to the validation module (worker/validate.cpp).
void GpuRunner::validate(const Outputs& outputs, json& out) {
  const Problem& p = problem_;
  // Every output read back whole: a validation over fewer elements than the kernel wrote checks nothing.
  const std::vector<Buffer*> bufs = output_buffers();
  for (size_t i = 0; i < bufs.size(); ++i)
    if (i >= outputs.size() || outputs[i].bytes != bufs[i]->bytes || (bufs[i]->bytes && !outputs[i].ptr))
      throw std::logic_error("validate: output " + std::to_string(i) + " read back as " +
                             std::to_string(i < outputs.size() ? outputs[i].bytes : 0) + " bytes where " +
                             std::to_string(bufs[i]->bytes) + " were written");
  auto tensor = [&](size_t i, DType t) { return OutputTensor{outputs[i].ptr, outputs[i].bytes / dtype_bytes(t), t}; };
  const DType t = p.dtype;
  const Verdict v = p.direction == "bwd"
                        ? validate_backward(p, bwd_ref_, bwd_bounds_, tensor(0, t), tensor(1, t), tensor(2, t), threads_)
                        : validate_forward(p, fwd_ref_, tensor(0, t), tensor(1, DType::fp32), threads_);
  write_verdict(v, out);
}

json GpuRunner::run(const json& req) {
  if (!prepared_) throw std::runtime_error("run before prepare");
  // Where an evaluation's wall time goes (detail.phase_ms): loading the module, the validated run with its
  // copies back, the comparison with the reference, the repeated runs (determinism, reproducibility), the
  // timing.
  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t) { return std::chrono::duration<double, std::milli>(clock::now() - t).count(); };
  auto t0 = clock::now();
  std::string cubin;
  {
    std::ifstream f(req.at("cubin_path").get<std::string>(), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    cubin = ss.str();
  }
  if (cubin.empty()) throw std::runtime_error("empty cubin " + req.at("cubin_path").get<std::string>());
  CUmodule mod = nullptr;
  CU_CHECK(cuModuleLoadData(&mod, cubin.data()));
  struct Unload {
    CUmodule m;
    ~Unload() { cuModuleUnload(m); }
  } unload{mod};
  std::vector<Kernel> kernels;
  for (const auto& k : req.at("kernels")) {
    Kernel kd{};
    CU_CHECK(cuModuleGetFunction(&kd.fn, mod, k.at("name").get<std::string>().c_str()));
    for (int i = 0; i < 3; ++i) kd.grid[i] = k.at("grid")[i].get<unsigned>();
    kd.threads = k.at("threads").get<unsigned>();
    kd.smem = k.at("smem").get<unsigned>();
    kd.cluster = k.value("cluster", 1u);
    if (kd.cluster < 1 || kd.cluster > 8 || kd.grid[0] % kd.cluster)
      throw std::runtime_error("cluster must be 1..8 and divide grid x");
    if (kd.smem > 48 * 1024)
      CU_CHECK(cuFuncSetAttribute(kd.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)kd.smem));
    kernels.push_back(kd);
  }
  if (kernels.empty()) throw std::runtime_error("no kernels in the request");
  encode_tensor_maps(req.value("tensor_maps", json()));
  if (problem_.mask_mod.enabled()) {  // the summary for this kernel's blocks, before (and never in) the timing
    const json mb = req.value("mask_blocks", json::array());
    mask_summary(mb.size() == 2 ? mb[0].get<int>() : 0, mb.size() == 2 ? mb[1].get<int>() : 0);
  }
  const size_t workspace = req.value("workspace", (size_t)0);
  const unsigned char fill = (unsigned char)req.value("workspace_fill", 0);  // 0xFF: the kernels must write it all
  workspace_.bytes = 0;
  try {
    if (workspace) ensure(workspace_, workspace);
  } catch (OutOfMemory& e) {
    e.needed = problem_bytes();
    release_buffers();
    throw;
  }

  // 1. One validated run: outputs poisoned with NaN, every element must be written and match
  //    the float64 reference within the dtype's tolerance.
  json out;
  out["status"] = "ok";
  auto validated_run = [&](Outputs& into) {
    if (workspace) CU_CHECK(cuMemsetD8(workspace_.ptr, fill, workspace));
    poison_outputs();
    launch_all(kernels, nullptr);
    CU_CHECK(cuCtxSynchronize());
    read_outputs(into);
  };
  const double load_ms = ms_since(t0);
  t0 = clock::now();
  if (req.value("time_only", false)) {
    // The tuner validated this kernel on these inputs earlier in its sweep (GpuSession::run says
    // when): timed only, from the state a validated run starts in.
    if (workspace) CU_CHECK(cuMemsetD8(workspace_.ptr, fill, workspace));
    time_repeats([&] { launch_all(kernels, nullptr); }, req.value("timing", json::object()), out);
    out["detail"]["phase_ms"] = {{"load", load_ms}, {"timing", ms_since(t0)}};
    out["peak_bytes"] = problem_bytes();
    return out;
  }
  validated_run(outputs_);
  const double run_ms = ms_since(t0);
  t0 = clock::now();
  validate(outputs_, out);
  out["detail"]["phase_ms"] = {{"load", load_ms}, {"validated_run", run_ms}, {"validate", ms_since(t0)}};
  out["peak_bytes"] = problem_bytes();
  const std::vector<std::string> names =  // the outputs, in read_outputs' order
      problem_.direction == "bwd" ? std::vector<std::string>{"dq", "dk", "dv"} : std::vector<std::string>{"o", "lse"};
  if (const std::string dir = req.value("save_dir", std::string()); !dir.empty()) {
    for (size_t i = 0; i < names.size(); ++i) write_output_file(dir, names[i], outputs_[i].ptr, outputs_[i].bytes);
  }
  if (out["status"] != "ok") return out;
  t0 = clock::now();
  if (req.value("check_determinism", false)) {
    validated_run(again_);
    bool same = true;
    for (size_t i = 0; i < names.size(); ++i) same &= same_bytes(again_[i], outputs_[i]);
    out["detail"]["deterministic"] = same;
  }
  // A config whose family claims bitwise-reproducible outputs (Family::reproducible) is held to it: the
  // validated run repeated, each from poisoned outputs, every output equal bit for bit, else it is invalid.
  if (const int runs = req.value("reproducible_runs", 0); runs > 1) {
    for (int k = 2; k <= runs && out["status"] == "ok"; ++k) {
      validated_run(again_);
      for (size_t i = 0; i < names.size(); ++i)
        if (!same_bytes(again_[i], outputs_[i])) {
          out["status"] = "invalid";
          out["error"] = "claims bitwise-reproducible outputs, but run " + std::to_string(k) + " of " +
                         std::to_string(runs) + " gave a different " + names[i];
          break;
        }
    }
    out["detail"]["reproducible_runs"] = runs;
  }
  if (req.value("check_determinism", false) || req.value("reproducible_runs", 0) > 1)
    out["detail"]["phase_ms"]["repeated_runs"] = ms_since(t0);
  if (out["status"] != "ok") return out;

  // 2. Timing, only for a validated kernel: CUDA events around the family's kernels alone.
  t0 = clock::now();
  time_repeats([&] { launch_all(kernels, nullptr); }, req.value("timing", json::object()), out);
  out["detail"]["phase_ms"]["timing"] = ms_since(t0);
  return out;
}

void GpuRunner::time_repeats(const std::function<void()>& launch, const json& timing, json& out) {
  // Warm-up, then repeats each after an L2 flush, CUDA events around `launch` alone;
  // median and p20/p80 of the repeats.
  const int warmup = timing.value("warmup", timing::kWarmup);
  const int min_reps = timing.value("min_reps", timing::kMinReps), max_reps = timing.value("max_reps", timing::kMaxReps);
  const double target_ms = timing.value("target_ms", timing::kTargetMs);
  CUevent e0, e1;
  CU_CHECK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
  CU_CHECK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
  CU_CHECK(cuEventRecord(e0, nullptr));
  for (int i = 0; i < warmup; ++i) launch();
  CU_CHECK(cuEventRecord(e1, nullptr));
  CU_CHECK(cuEventSynchronize(e1));
  float warm_ms = 0;
  CU_CHECK(cuEventElapsedTime(&warm_ms, e0, e1));
  cuEventDestroy(e0);
  cuEventDestroy(e1);
  const double per_launch = std::max(1e-3, (double)warm_ms / std::max(1, warmup));
  const int reps = std::clamp((int)(target_ms / per_launch), min_reps, max_reps);

  // Timing economy: with stop_above_ms, the first 3 repeats are read before the rest is launched, and a
  // candidate whose median over them is above it (clearly slower than the best so far) stops there.
  const double stop_above = timing.value("stop_above_ms", 0.0);
  // pause_us: the GPU left idle that long before each repeat (synchronised, then a host sleep), so that a heavy
  // kernel is timed off the power cap that back-to-back repeats run into (0: back to back).
  const int pause_us = std::clamp(timing.value("pause_us", 0), 0, 100000);
  const int first = stop_above > 0 ? std::min(reps, 3) : reps;

  std::vector<CUevent> starts(reps), stops(reps);
  for (int i = 0; i < reps; ++i) {
    CU_CHECK(cuEventCreate(&starts[i], CU_EVENT_DEFAULT));
    CU_CHECK(cuEventCreate(&stops[i], CU_EVENT_DEFAULT));
  }
  auto timed = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      if (pause_us > 0) {
        CU_CHECK(cuCtxSynchronize());
        std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      }
      CU_CHECK(cuMemsetD32Async(flush_.ptr, (unsigned)i, flush_.bytes / 4, nullptr));
      CU_CHECK(cuEventRecord(starts[i], nullptr));
      launch();
      CU_CHECK(cuEventRecord(stops[i], nullptr));
    }
    CU_CHECK(cuCtxSynchronize());
  };
  std::vector<float> ms;
  auto read = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      float t = 0;
      CU_CHECK(cuEventElapsedTime(&t, starts[i], stops[i]));
      ms.push_back(t);
    }
  };
  timed(0, first);
  read(0, first);
  bool early = false;
  if (first < reps) {
    if (timing::percentile(ms, 0.5) > stop_above) {
      early = true;
    } else {
      timed(first, reps);
      read(first, reps);
    }
  }
  for (int i = 0; i < reps; ++i) {
    cuEventDestroy(starts[i]);
    cuEventDestroy(stops[i]);
  }
  double spent = warm_ms;
  for (float t : ms) spent += t;
  out["detail"]["timing_ms"] = spent;
  out["detail"]["telemetry"] = telemetry_->sample();  // right after the repeats: the state they ran in
  if (early) out["detail"]["early_stopped"] = true;
  if (pause_us > 0) out["detail"]["pause_us"] = pause_us;
  out["reps"] = (int)ms.size();
  out["ms_median"] = timing::percentile(ms, 0.5);
  out["ms_p20"] = timing::percentile(ms, 0.2);
  out["ms_p80"] = timing::percentile(ms, 0.8);
  // The repeats themselves when asked (the sweep's interleaved re-timing pools its rounds' repeats).
  if (timing.value("samples", false)) out["detail"]["ms_samples"] = ms;
}

}  // namespace flashtune
