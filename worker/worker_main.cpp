// flashtune-worker: the process that owns the CUDA context. It reads one JSON request per
// line on stdin and answers one JSON line on stdout. After a sticky CUDA error (a kernel
// that faulted) it answers "crashed" and exits: the context is unusable, and the parent
// starts a fresh worker. A kernel that never ends is the parent's to kill. Running out of device
// memory is not sticky: it answers "oom", frees its buffers and stays.
//
// usage: flashtune-worker [DEVICE] [--threads N]: DEVICE the CUDA ordinal (0); N the CPU threads of its
// parallel parts (input generation, reference, validation; 1 .. 4096, default every core), which tune sets
// to cores / workers when several workers share a host.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "worker/gpu_runner.hpp"

using nlohmann::json;

namespace {

void reply(const json& j) {
  std::cout << j.dump() << std::endl;  // endl flushes: the parent waits for whole lines
}

json device_json(const flashtune::DeviceInfo& d) {
  return {{"name", d.name}, {"arch", d.arch}, {"sm_count", d.sm_count}, {"driver_version", d.driver_version},
          {"memory_bytes", d.memory_bytes}, {"l2_bytes", d.l2_bytes}, {"max_smem_optin", d.max_smem_optin},
          {"clock_khz", d.clock_khz}};
}

// A thread count given on the command line: decimal digits only, 1 .. kMaxThreads; nullopt otherwise.
constexpr int kMaxThreads = 4096;
std::optional<int> thread_count(const char* text) {
  const size_t n = std::strlen(text);
  if (n == 0 || n > 4 || std::strspn(text, "0123456789") != n) return std::nullopt;
  const int v = std::atoi(text);
  if (v < 1 || v > kMaxThreads) return std::nullopt;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int ordinal = argc > 1 ? std::atoi(argv[1]) : 0;
  int threads = 0;  // every core
  for (int i = 2; i < argc; ++i) {
    const std::optional<int> t = i + 1 < argc && std::strcmp(argv[i], "--threads") == 0 ? thread_count(argv[i + 1])
                                                                                         : std::nullopt;
    if (!t) {
      std::fprintf(stderr, "flashtune-worker: usage: flashtune-worker [DEVICE] [--threads 1..%d]\n", kMaxThreads);
      return 2;
    }
    threads = *t;
    ++i;
  }
  std::unique_ptr<flashtune::GpuRunner> gpu;
  try {
    gpu = std::make_unique<flashtune::GpuRunner>(ordinal, threads);
  } catch (const std::exception& e) {
    // No driver, no device: every request gets the same answer.
    std::string why = e.what();
    for (std::string line; std::getline(std::cin, line);) reply({{"status", "no_gpu"}, {"error", why}});
    return 0;
  }
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    json req, out;
    try {
      req = json::parse(line);
      const std::string op = req.at("op");
      if (op == "hello") {
        out = {{"status", "ok"}, {"device", device_json(gpu->device_info())}};
      } else if (op == "prepare") {
        const json ms = gpu->prepare(flashtune::problem_from_json(req.at("problem")),
                                     req.at("seed").get<unsigned long long>(), req.value("max_rows", 512LL),
                                     req.value("inputs_dir", std::string()), req.value("prepared_file", std::string()));
        out = {{"status", "ok"}};
        if (!ms.empty()) out["prepare_ms"] = ms;
        if (!gpu->prepared_rejected().empty()) out["prepared_rejected"] = gpu->prepared_rejected();
      } else if (op == "run") {
        out = gpu->run(req);
      } else if (op == "run_library") {
        out = gpu->run_library(req);
      } else if (op == "probe") {
        out = gpu->probe(req);
      } else {
        out = {{"status", "error"}, {"error", "unknown op '" + op + "'"}};
      }
    } catch (const flashtune::OutOfMemory& e) {
      // Not sticky: free what the runner holds (the problem must be prepared again) and go on.
      gpu->release_buffers();
      out = {{"status", "oom"}, {"error", e.what()}, {"asked_bytes", e.asked}};
      if (e.needed) out["peak_bytes"] = e.needed;
    } catch (const flashtune::CudaError& e) {
      if (e.sticky) {
        reply({{"status", "crashed"}, {"error", e.what()}});
        std::_Exit(3);  // no destructors: the context is poisoned
      }
      out = {{"status", "launch_error"}, {"error", e.what()}};
    } catch (const std::exception& e) {
      out = {{"status", "error"}, {"error", e.what()}};
    }
    reply(out);
  }
  return 0;
}
