#include "worker/telemetry.hpp"

#include <dlfcn.h>

#include <cstdio>

namespace flashtune {

// NVML's C ABI, declared here for the few calls made (its header is not part of the toolkit image):
// nvmlReturn_t is an int (0: success), nvmlDevice_t an opaque pointer; the enum values are NVML's.
struct Telemetry::Api {
  using Device = void*;
  int (*init)() = nullptr;
  int (*by_pci)(const char*, Device*) = nullptr;
  int (*clock)(Device, int, unsigned*) = nullptr;
  int (*temperature)(Device, int, unsigned*) = nullptr;
  int (*power)(Device, unsigned*) = nullptr;
  int (*reasons)(Device, unsigned long long*) = nullptr;
  static constexpr int kClockSm = 1, kClockMem = 2, kTemperatureGpu = 0;
};

namespace {
const Telemetry::Api* load_api(std::string* why);
}

Telemetry::Telemetry(const std::string& pci_bus_id) {
  api_ = load_api(&why_);
  if (!api_) return;
  if (api_->by_pci(pci_bus_id.c_str(), &device_) != 0) {
    why_ = "NVML does not know the device at PCI " + pci_bus_id;
    api_ = nullptr;
  }
}

nlohmann::json Telemetry::sample() const {
  if (!api_) return {{"unavailable", why_}};
  nlohmann::json j = nlohmann::json::object();
  unsigned v = 0;
  if (api_->clock(device_, Api::kClockSm, &v) == 0) j["sm_clock_mhz"] = v;
  if (api_->clock(device_, Api::kClockMem, &v) == 0) j["mem_clock_mhz"] = v;
  if (api_->temperature(device_, Api::kTemperatureGpu, &v) == 0) j["temperature_c"] = v;
  if (api_->power(device_, &v) == 0) j["power_w"] = v / 1000.0;
  unsigned long long mask = 0;
  if (api_->reasons && api_->reasons(device_, &mask) == 0) j["throttle"] = throttle_reason_names(mask);
  return j;
}

std::vector<std::string> throttle_reason_names(unsigned long long mask) {
  static const char* names[] = {"gpu_idle",     "applications_clocks", "sw_power_cap",         "hw_slowdown",
                                "sync_boost",   "sw_thermal",          "hw_thermal",           "hw_power_brake",
                                "display_clocks"};
  std::vector<std::string> out;
  for (int bit = 0; bit < 64; ++bit) {
    if (!(mask >> bit & 1)) continue;
    if (bit < (int)(sizeof names / sizeof *names)) {
      out.push_back(names[bit]);
    } else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%llx", 1ull << bit);
      out.push_back(buf);
    }
  }
  return out;
}

namespace {
const Telemetry::Api* load_api(std::string* why) {
  static Telemetry::Api api;
  static std::string failure;
  static const bool ok = [] {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      failure = std::string("no NVML: ") + (e ? e : "libnvidia-ml.so.1 not found");
      return false;
    }
    auto sym = [&](const char* name) { return dlsym(lib, name); };
    api.init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
    api.by_pci = reinterpret_cast<int (*)(const char*, void**)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
    api.clock = reinterpret_cast<int (*)(void*, int, unsigned*)>(sym("nvmlDeviceGetClockInfo"));
    api.temperature = reinterpret_cast<int (*)(void*, int, unsigned*)>(sym("nvmlDeviceGetTemperature"));
    api.power = reinterpret_cast<int (*)(void*, unsigned*)>(sym("nvmlDeviceGetPowerUsage"));
    // Renamed "clocks event reasons" in newer drivers; the old name stays exported.
    void* r = sym("nvmlDeviceGetCurrentClocksEventReasons");
    if (!r) r = sym("nvmlDeviceGetCurrentClocksThrottleReasons");
    api.reasons = reinterpret_cast<int (*)(void*, unsigned long long*)>(r);
    if (!api.init || !api.by_pci || !api.clock || !api.temperature || !api.power) {
      failure = "NVML lacks a function flashtune reads";
      return false;
    }
    if (int rc = api.init(); rc != 0) {
      failure = "nvmlInit failed (" + std::to_string(rc) + ")";
      return false;
    }
    return true;
  }();
  if (!ok) {
    *why = failure;
    return nullptr;
  }
  return &api;
}
}  // namespace

}  // namespace flashtune
