// A fake libcuda.so.1 for testing the runtime library's GPU path on a machine without one: device
// memory is host memory, contexts are counters, a module is the cubin's bytes (checked to be ELF),
// launches are recorded and handed to a hook the test installs (which plays the kernel on the host).
// Only the entry points flashtune's runtime loads (runtime/src/driver.hpp). Test-only.
#include <cuda.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "fake_cuda.hpp"
#include "record_tensor_map.hpp"

namespace {
FakeState g_state;
std::mutex g_mu;
thread_local std::vector<CUcontext> t_stack;
CUcontext const kPrimary = reinterpret_cast<CUcontext>(0x1000);
struct Fn {
  std::string name;
};
std::vector<Fn*> g_fns;
std::map<CUdeviceptr, size_t> g_pool_live;  // the pool's allocations not freed yet
}  // namespace

extern "C" {

FakeState* fake_cuda_state() { return &g_state; }

CUresult CUDAAPI cuInit(unsigned int) { return CUDA_SUCCESS; }
// NVRTC dlopens libcuda.so.1 too (it finds this fake by its SONAME) and asks for an export table.
CUresult CUDAAPI cuGetExportTable(const void** table, const CUuuid*) {
  *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cuGetErrorName(CUresult e, const char** s) {
  *s = e == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_FAKE";
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGetErrorString(CUresult, const char** s) {
  *s = "fake driver";
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetCount(int* n) {
  *n = 1;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice) {
  std::snprintf(name, len, "%s", g_state.device_name.c_str());
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
  *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR   ? g_state.cc_major
       : a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR ? g_state.cc_minor
                                                           : 1;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxGetCurrent(CUcontext* c) {
  *c = t_stack.empty() ? nullptr : t_stack.back();
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxGetDevice(CUdevice* d) {
  if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  *d = 0;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxPushCurrent(CUcontext c) {
  t_stack.push_back(c);
  std::lock_guard<std::mutex> l(g_mu);
  ++g_state.pushes;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxPopCurrent(CUcontext* c) {
  if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (c) *c = t_stack.back();
  t_stack.pop_back();
  std::lock_guard<std::mutex> l(g_mu);
  ++g_state.pops;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) {
  *c = kPrimary;
  std::lock_guard<std::mutex> l(g_mu);
  ++g_state.primary_retains;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute a, CUdeviceptr p) {
  if (a != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL || !p) return CUDA_ERROR_INVALID_VALUE;
  *static_cast<int*>(data) = 0;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleLoadData(CUmodule* m, const void* image) {
  if (std::memcmp(image, "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  std::lock_guard<std::mutex> l(g_mu);
  ++g_state.module_loads;
  *m = reinterpret_cast<CUmodule>(static_cast<uintptr_t>(g_state.module_loads));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleGetFunction(CUfunction* f, CUmodule, const char* name) {
  std::lock_guard<std::mutex> l(g_mu);
  g_fns.push_back(new Fn{name});
  *f = reinterpret_cast<CUfunction>(g_fns.back());
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuFuncSetAttribute(CUfunction, CUfunction_attribute, int) { return CUDA_SUCCESS; }
CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                unsigned bz, unsigned smem, CUstream, void** params, void**) {
  FakeLaunch l{reinterpret_cast<Fn*>(f)->name, {gx, gy, gz}, bx * by * bz, smem};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_state.launches.push_back(l);
  }
  if (g_state.hook) g_state.hook(l.name.c_str(), params);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void**) {
  FakeLaunch l{reinterpret_cast<Fn*>(f)->name, {c->gridDimX, c->gridDimY, c->gridDimZ},
               c->blockDimX * c->blockDimY * c->blockDimZ, c->sharedMemBytes};
  for (unsigned i = 0; i < c->numAttrs; ++i)
    if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) l.cluster = c->attrs[i].value.clusterDim.x;
  if (l.grid[0] % l.cluster) return CUDA_ERROR_INVALID_CLUSTER_SIZE;  // as the driver: whole clusters only
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_state.launches.push_back(l);
  }
  if (g_state.hook) g_state.hook(l.name.c_str(), params);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* p, size_t bytes, CUstream) {
  void* m = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memset(m, 0xff, bytes);  // not zero: the library must zero what needs it
  *p = reinterpret_cast<CUdeviceptr>(m);
  std::lock_guard<std::mutex> l(g_mu);
  g_state.allocated.push_back(bytes);
  ++g_state.live_allocations;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps*) {
  static int the_pool;
  *pool = reinterpret_cast<CUmemoryPool>(&the_pool);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool, CUmemPool_attribute, void*) { return CUDA_SUCCESS; }
CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* p, size_t bytes, CUmemoryPool, CUstream s) {
  const CUresult r = cuMemAllocAsync(p, bytes, s);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> l(g_mu);
  g_pool_live[*p] = bytes;
  g_state.pool_reserved += bytes;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr p, CUstream) {
  std::free(reinterpret_cast<void*>(p));
  std::lock_guard<std::mutex> l(g_mu);
  g_pool_live.erase(p);
  --g_state.live_allocations;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool, size_t keep) {
  std::lock_guard<std::mutex> l(g_mu);
  size_t live = 0;
  for (const auto& [ptr, bytes] : g_pool_live) live += bytes;
  g_state.pool_reserved = std::max(live, std::min(keep, g_state.pool_reserved));
  ++g_state.pool_trims;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute a, void* value) {
  if (a != CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard<std::mutex> l(g_mu);
  *static_cast<cuuint64_t*>(value) = g_state.pool_reserved;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream) {
  std::memset(reinterpret_cast<void*>(p), v, n);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap* m, CUtensorMapDataType type, cuuint32_t rank, void* addr,
                                        const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                        const cuuint32_t* elem_strides, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                        CUtensorMapFloatOOBfill fill) {
  return record_tensor_map(m, type, rank, addr, dims, strides, box, elem_strides, interleave, swizzle, l2, fill);
}

}  // extern "C"
