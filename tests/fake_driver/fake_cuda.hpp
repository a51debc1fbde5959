// What the fake driver (fake_cuda.cpp) records, for tests/test_runtime_fake_driver.cpp.
#pragma once
#include <string>
#include <vector>

struct FakeLaunch {
  std::string name;  // the function's name as looked up (lowered name)
  unsigned grid[3];
  unsigned threads, smem;
  unsigned cluster = 1;  // CTAs per cluster along x (cuLaunchKernelEx's attribute)
};

struct FakeState {
  std::vector<FakeLaunch> launches;
  std::vector<size_t> allocated;  // cuMemAllocAsync sizes
  int live_allocations = 0, module_loads = 0, primary_retains = 0, pushes = 0, pops = 0;
  // The library's pool: what it holds from the "driver" (every pool allocation, kept after its free, as a pool
  // with release threshold never keeps it) until cuMemPoolTrimTo drops it to what is still live.
  size_t pool_reserved = 0;
  int pool_trims = 0;
  // The device's compute capability (8.0: sm_80). The runtime keeps the first description it reads, so a
  // test that wants another sets it before its first call (in a child process).
  int cc_major = 8, cc_minor = 0;
  std::string device_name = "Fake GPU";  // likewise: a tabled device's name reaches its table entries
  void (*hook)(const char* name, void** params) = nullptr;  // plays a launch on the host
};

extern "C" FakeState* fake_cuda_state();  // looked up with dlsym by the test
