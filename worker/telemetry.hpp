// The GPU's state beside each timing: SM and memory clocks, temperature, power and the reasons the
// clocks are held down, read through NVML loaded at run time (libnvidia-ml.so.1, the driver's). It only
// reads: no clock, power or other setting is ever changed. Without NVML it says why, once per sample.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace flashtune {

class Telemetry {
 public:
  // `pci_bus_id` as cuDeviceGetPCIBusId writes it ("0000:3B:00.0").
  explicit Telemetry(const std::string& pci_bus_id);
  // {"sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "throttle": [names]} with the fields
  // NVML answered, or {"unavailable": why}.
  nlohmann::json sample() const;

  struct Api;  // the NVML functions read (telemetry.cpp)

 private:
  const Api* api_ = nullptr;
  void* device_ = nullptr;  // nvmlDevice_t
  std::string why_;
};

// NVML's clock event reason bits (nvmlClocksEventReasons) as names; unknown bits as "0x..".
std::vector<std::string> throttle_reason_names(unsigned long long mask);

}  // namespace flashtune
