// The GPU's energy counter, SM clock, power limit and clock-event reasons, read through NVML
// (the driver's libnvidia-ml.so.1, opened at run time: nothing of NVML is needed to build).
// qlinear_gpu_bench --energy uses it to tell which ops the power cap bounds.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace qlinear::gpu {

class GpuPower {
 public:
  GpuPower() = default;
  ~GpuPower();
  GpuPower(const GpuPower&) = delete;
  GpuPower& operator=(const GpuPower&) = delete;

  // Opens NVML for the CUDA device `device` (matched by PCI bus id). UNAVAILABLE, with the
  // reason, where the driver's NVML cannot be opened or lacks a function used here.
  absl::Status init(int device);

  // Energy used by the GPU since the driver loaded, in millijoules.
  absl::StatusOr<uint64_t> energy_mj() const;
  // The SM clock now, in MHz.
  absl::StatusOr<unsigned> sm_clock_mhz() const;
  // The power limit the driver enforces, in milliwatts.
  absl::StatusOr<unsigned> power_limit_mw() const;
  // Why the clocks are below their maximum now (NVML's clock-event reason bits).
  absl::StatusOr<uint64_t> clock_event_reasons() const;

  // The reason bits as words: "sw power cap, hw slowdown", or "none".
  static std::string describe_reasons(uint64_t reasons);

 private:
  struct Api;
  Api* api_ = nullptr;
  void* device_ = nullptr;  // nvmlDevice_t
};

}  // namespace qlinear::gpu
