#include "tuner/gpu_runner.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "reference/attention_ref.hpp"
#include "templates/attention_params.h"
#include "tuner/dtype_convert.hpp"
#include "tuner/validate.hpp"

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

std::string describe(CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  cuGetErrorName(r, &name);
  cuGetErrorString(r, &text);
  return std::string(name ? name : "CUDA_ERROR_?") + " (" + (text ? text : "") + ")";
}

#define CU_CHECK(call)                                                       \
  do {                                                                       \
    CUresult rc_ = (call);                                                   \
    if (rc_ != CUDA_SUCCESS) throw CudaError(rc_, std::string(#call) + ": " + describe(rc_)); \
  } while (0)

// Counter-based normal random numbers: element i of stream `seed` is the same whatever
// the thread count, so inputs are reproducible from (problem, seed) alone.
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void fill_normal(std::vector<float>& out, uint64_t seed) {
  const size_t n = out.size();
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i = t; i < n; i += threads) {
        uint64_t a = splitmix64(seed ^ (2 * i)), b = splitmix64(seed ^ (2 * i + 1));
        double u1 = ((a >> 11) + 0.5) * 0x1.0p-53, u2 = (b >> 11) * 0x1.0p-53;
        out[i] = (float)(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
      }
    });
  }
  for (auto& th : pool) th.join();
}

double percentile(std::vector<float> v, double q) {
  std::sort(v.begin(), v.end());
  double pos = q * (v.size() - 1);
  size_t lo = (size_t)pos, hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - lo) * (v[hi] - v[lo]);
}


}  // namespace

CudaError::CudaError(CUresult c, const std::string& what) : std::runtime_error(what), code(c), sticky(is_sticky(c)) {}

GpuRunner::GpuRunner(int ordinal) {
  CU_CHECK(cuInit(0));
  int count = 0;
  CU_CHECK(cuDeviceGetCount(&count));
  if (ordinal < 0 || ordinal >= count)
    throw std::runtime_error("no CUDA device " + std::to_string(ordinal) + " (found " + std::to_string(count) + ")");
  CU_CHECK(cuDeviceGet(&dev_, ordinal));
  CU_CHECK(cuDevicePrimaryCtxRetain(&ctx_, dev_));
  CU_CHECK(cuCtxSetCurrent(ctx_));

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
  for (Buffer* b : {&q_, &k_, &v_, &o_, &lse_, &workspace_, &flush_})
    if (b->ptr) cuMemFree(b->ptr);
  if (ctx_) cuDevicePrimaryCtxRelease(dev_);
}

void GpuRunner::ensure(Buffer& b, size_t bytes) {
  if (b.bytes >= bytes && b.ptr) return;
  if (b.ptr) CU_CHECK(cuMemFree(b.ptr));
  b.ptr = 0;
  b.bytes = 0;
  CU_CHECK(cuMemAlloc(&b.ptr, std::max<size_t>(bytes, 256)));
  b.bytes = bytes;
}

void GpuRunner::prepare(const Problem& p, unsigned long long seed, long long max_rows) {
  if (prepared_ && p == problem_ && seed == seed_) return;
  prepared_ = false;
  const size_t nq = (size_t)p.batch * p.heads * p.seq_q * p.head_dim;
  const size_t nk = (size_t)p.batch * p.heads * p.seq_k * p.head_dim;
  const size_t elem = dtype_bytes(p.dtype);
  std::vector<float> q(nq), k(nk), v(nk);
  // One stream per tensor: fresh inputs for every (problem, seed), never zeros. Rounded to the
  // kernel's dtype, so the reference sees exactly the kernel's inputs.
  fill_normal(q, splitmix64(seed ^ 0x51));
  fill_normal(k, splitmix64(seed ^ 0x4b));
  fill_normal(v, splitmix64(seed ^ 0x56));
  ensure(q_, nq * elem);
  ensure(k_, nk * elem);
  ensure(v_, nk * elem);
  ensure(o_, nq * elem);
  ensure(lse_, (size_t)p.batch * p.heads * p.seq_q * 4);
  CU_CHECK(cuMemcpyHtoD(q_.ptr, to_device_format(q, p.dtype).data(), nq * elem));
  CU_CHECK(cuMemcpyHtoD(k_.ptr, to_device_format(k, p.dtype).data(), nk * elem));
  CU_CHECK(cuMemcpyHtoD(v_.ptr, to_device_format(v, p.dtype).data(), nk * elem));
  // The L2 flush buffer: twice the L2, rewritten before every timed repeat.
  ensure(flush_, (size_t)std::max(info_.l2_bytes, 1 << 20) * 2);

  ref::Shape shape{p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim, p.causal};
  rows_ = ref::sample_rows(shape, max_rows, seed);
  ref_o_.assign(rows_.size() * p.head_dim, 0.0);
  ref_lse_.assign(rows_.size(), 0.0);
  ref::forward_rows(shape, q.data(), k.data(), v.data(), rows_, ref_o_.data(), ref_lse_.data());
  problem_ = p;
  seed_ = seed;
  prepared_ = true;
}

void GpuRunner::launch(CUfunction fn, const nlohmann::json& req, CUstream stream) {
  AttnFwdParams params{};
  params.q = (const void*)q_.ptr;
  params.k = (const void*)k_.ptr;
  params.v = (const void*)v_.ptr;
  params.o = (void*)o_.ptr;
  params.lse = (float*)lse_.ptr;
  params.workspace = workspace_.ptr ? (float*)workspace_.ptr : nullptr;
  params.batch = problem_.batch;
  params.heads = problem_.heads;
  params.seq_q = problem_.seq_q;
  params.seq_k = problem_.seq_k;
  params.scale = (float)(1.0 / std::sqrt((double)problem_.head_dim));
  params.scale_log2 = (float)(params.scale * M_LOG2E);
  void* args[] = {&params};
  const auto& g = req.at("grid");
  CU_CHECK(cuLaunchKernel(fn, g[0].get<unsigned>(), g[1].get<unsigned>(), g[2].get<unsigned>(),
                          req.at("threads").get<unsigned>(), 1, 1, req.at("smem").get<unsigned>(), stream, args,
                          nullptr));
}

nlohmann::json GpuRunner::run(const nlohmann::json& req) {
  if (!prepared_) throw std::runtime_error("run before prepare");
  nlohmann::json out;
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
  CUfunction fn = nullptr;
  CU_CHECK(cuModuleGetFunction(&fn, mod, req.at("kernel").get<std::string>().c_str()));
  const unsigned smem = req.at("smem").get<unsigned>();
  if (smem > 48 * 1024)
    CU_CHECK(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem));

  const size_t workspace = req.value("workspace", (size_t)0);
  if (workspace) {
    ensure(workspace_, workspace);
    CU_CHECK(cuMemsetD8(workspace_.ptr, 0, workspace));
  }

  const Problem& p = problem_;
  const size_t nq = (size_t)p.batch * p.heads * p.seq_q * p.head_dim;
  const size_t nrows = (size_t)p.batch * p.heads * p.seq_q;

  // 1. One validated run: outputs poisoned with NaN, every element must be written,
  //    sampled rows must match the float64 reference.
  const size_t elem = dtype_bytes(p.dtype);
  if (elem == 4) CU_CHECK(cuMemsetD32(o_.ptr, nan_bits(p.dtype), nq));
  else CU_CHECK(cuMemsetD16(o_.ptr, (unsigned short)nan_bits(p.dtype), nq));
  CU_CHECK(cuMemsetD32(lse_.ptr, nan_bits(DType::fp32), nrows));
  launch(fn, req, nullptr);
  CU_CHECK(cuCtxSynchronize());
  std::vector<uint8_t> o_bytes(nq * elem);
  std::vector<float> lse(nrows);
  CU_CHECK(cuMemcpyDtoH(o_bytes.data(), o_.ptr, nq * elem));
  CU_CHECK(cuMemcpyDtoH(lse.data(), lse_.ptr, nrows * 4));
  const std::vector<float> o = from_device_format(o_bytes, p.dtype);

  const Tolerance tol = tolerance_for(p.dtype);
  ErrorStats err;
  size_t unwritten = 0;
  for (size_t i = 0; i < nq; ++i) unwritten += std::isnan(o[i]);
  for (size_t r = 0; r < rows_.size(); ++r) {
    const size_t row = (size_t)rows_[r];
    for (int c = 0; c < p.head_dim; ++c)
      err.add(row * p.head_dim + c, o[row * p.head_dim + c], ref_o_[r * p.head_dim + c], tol);
    err.add(nq + row, lse[row], ref_lse_[r], tol);  // LSE indices follow O's in messages
  }
  out["max_abs"] = err.max_abs;
  out["max_rel"] = std::isfinite(err.max_rel) ? err.max_rel : 1e30;
  out["mse"] = err.mse();
  out["validated_rows"] = rows_.size();
  if (unwritten || err.bad) {
    out["status"] = "invalid";
    std::string msg;
    if (unwritten) msg = std::to_string(unwritten) + " output elements NaN or unwritten; ";
    if (err.bad) msg += std::to_string(err.bad) + " of " + std::to_string(err.count) + " checked values off: " + err.first_bad;
    out["error"] = msg;
    if (out["max_abs"].get<double>() == INFINITY) out["max_abs"] = 1e30;
    return out;
  }

  // 2. Timing, only for a validated kernel: warm-up, then repeats each after an L2 flush,
  //    CUDA events around the launch alone; median and p20/p80 of the repeats.
  const auto& timing = req.value("timing", nlohmann::json::object());
  const int warmup = timing.value("warmup", 3);
  const int min_reps = timing.value("min_reps", 10), max_reps = timing.value("max_reps", 50);
  const double target_ms = timing.value("target_ms", 400.0);
  CUevent e0, e1;
  CU_CHECK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
  CU_CHECK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
  CU_CHECK(cuEventRecord(e0, nullptr));
  for (int i = 0; i < warmup; ++i) launch(fn, req, nullptr);
  CU_CHECK(cuEventRecord(e1, nullptr));
  CU_CHECK(cuEventSynchronize(e1));
  float warm_ms = 0;
  CU_CHECK(cuEventElapsedTime(&warm_ms, e0, e1));
  cuEventDestroy(e0);
  cuEventDestroy(e1);
  const double per_launch = std::max(1e-3, (double)warm_ms / std::max(1, warmup));
  const int reps = std::clamp((int)(target_ms / per_launch), min_reps, max_reps);

  std::vector<CUevent> starts(reps), stops(reps);
  for (int i = 0; i < reps; ++i) {
    CU_CHECK(cuEventCreate(&starts[i], CU_EVENT_DEFAULT));
    CU_CHECK(cuEventCreate(&stops[i], CU_EVENT_DEFAULT));
  }
  for (int i = 0; i < reps; ++i) {
    CU_CHECK(cuMemsetD32Async(flush_.ptr, (unsigned)i, flush_.bytes / 4, nullptr));
    CU_CHECK(cuEventRecord(starts[i], nullptr));
    launch(fn, req, nullptr);
    CU_CHECK(cuEventRecord(stops[i], nullptr));
  }
  CU_CHECK(cuCtxSynchronize());
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    CU_CHECK(cuEventElapsedTime(&ms[i], starts[i], stops[i]));
    cuEventDestroy(starts[i]);
    cuEventDestroy(stops[i]);
  }
  out["status"] = "ok";
  out["reps"] = reps;
  out["ms_median"] = percentile(ms, 0.5);
  out["ms_p20"] = percentile(ms, 0.2);
  out["ms_p80"] = percentile(ms, 0.8);
  return out;
}

}  // namespace flashtune
