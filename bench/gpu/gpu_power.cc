#include "bench/gpu/gpu_power.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qlinear::gpu {

// The few NVML entry points used here, as the driver exports them (nvml.h's declarations: every
// function returns an nvmlReturn_t, 0 on success; nvmlDevice_t is an opaque pointer).
struct GpuPower::Api {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  const char* (*error_string)(int) = nullptr;
  int (*handle_by_pci)(const char*, void**) = nullptr;
  int (*energy)(void*, unsigned long long*) = nullptr;
  int (*clock)(void*, int, unsigned*) = nullptr;
  int (*limit)(void*, unsigned*) = nullptr;
  int (*reasons)(void*, unsigned long long*) = nullptr;

  absl::Status error(const char* what, int rc) const {
    return absl::InternalError(
        absl::StrCat(what, ": ", error_string != nullptr ? error_string(rc) : "NVML error ", rc));
  }
};

namespace {
constexpr int kNvmlClockSm = 1;  // NVML_CLOCK_SM

template <typename F>
bool bind(void* lib, const char* name, F* f) {
  *f = reinterpret_cast<F>(dlsym(lib, name));
  return *f != nullptr;
}
}  // namespace

GpuPower::~GpuPower() {
  if (api_ == nullptr) return;
  if (device_ != nullptr && api_->shutdown != nullptr) api_->shutdown();
  if (api_->lib != nullptr) dlclose(api_->lib);
  delete api_;
}

absl::Status GpuPower::init(int device) {
  if (api_ != nullptr) return absl::FailedPreconditionError("GpuPower::init called twice");
  api_ = new Api;
  api_->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (api_->lib == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(
        absl::StrCat("cannot open the driver's NVML (libnvidia-ml.so.1): ", why ? why : "?"));
  }
  void* lib = api_->lib;
  bind(lib, "nvmlErrorString", &api_->error_string);
  // Drivers from 535 on name the reasons "clock events"; older ones "clocks throttle".
  if (!bind(lib, "nvmlDeviceGetCurrentClocksEventReasons", &api_->reasons)) {
    bind(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", &api_->reasons);
  }
  if (!bind(lib, "nvmlInit_v2", &api_->init) || !bind(lib, "nvmlShutdown", &api_->shutdown) ||
      !bind(lib, "nvmlDeviceGetHandleByPciBusId_v2", &api_->handle_by_pci) ||
      !bind(lib, "nvmlDeviceGetTotalEnergyConsumption", &api_->energy) ||
      !bind(lib, "nvmlDeviceGetClockInfo", &api_->clock) ||
      !bind(lib, "nvmlDeviceGetEnforcedPowerLimit", &api_->limit) || api_->reasons == nullptr) {
    return absl::UnavailableError("the driver's NVML lacks a function this benchmark reads");
  }
  if (const int rc = api_->init(); rc != 0) return api_->error("nvmlInit", rc);
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != cudaSuccess) {
    cudaGetLastError();
    api_->shutdown();
    return absl::InternalError(absl::StrCat("cannot read CUDA device ", device, "'s PCI bus id"));
  }
  if (const int rc = api_->handle_by_pci(bus_id, &device_); rc != 0) {
    device_ = nullptr;
    api_->shutdown();
    return api_->error(bus_id, rc);
  }
  return absl::OkStatus();
}

namespace {
// One NVML getter of `device`: value = (api->*f)(device, args..., &value), its error named `what`.
template <typename V, typename Api, typename F, typename... Args>
absl::StatusOr<V> read(const Api* api, void* device, const char* what, F Api::*f, Args... args) {
  if (api == nullptr || device == nullptr) return absl::FailedPreconditionError("NVML not opened");
  V v{};
  if (const int rc = (api->*f)(device, args..., &v); rc != 0) return api->error(what, rc);
  return v;
}
}  // namespace

absl::StatusOr<uint64_t> GpuPower::energy_mj() const {
  return read<unsigned long long>(api_, device_, "nvmlDeviceGetTotalEnergyConsumption",
                                  &Api::energy);
}

absl::StatusOr<unsigned> GpuPower::sm_clock_mhz() const {
  return read<unsigned>(api_, device_, "nvmlDeviceGetClockInfo", &Api::clock, kNvmlClockSm);
}

absl::StatusOr<unsigned> GpuPower::power_limit_mw() const {
  return read<unsigned>(api_, device_, "nvmlDeviceGetEnforcedPowerLimit", &Api::limit);
}

absl::StatusOr<uint64_t> GpuPower::clock_event_reasons() const {
  return read<unsigned long long>(api_, device_, "nvmlDeviceGetCurrentClocksEventReasons",
                                  &Api::reasons);
}

std::string GpuPower::describe_reasons(uint64_t reasons) {
  // nvml.h's nvmlClocksEventReason* bits.
  static constexpr struct {
    uint64_t bit;
    const char* name;
  } kNames[] = {
      {0x1, "idle"},        {0x2, "application clocks"}, {0x4, "sw power cap"},
      {0x8, "hw slowdown"}, {0x10, "sync boost"},        {0x20, "sw thermal"},
      {0x40, "hw thermal"}, {0x80, "hw power brake"},    {0x100, "display clock"},
  };
  std::vector<std::string> words;
  uint64_t known = 0;
  for (const auto& n : kNames) {
    known |= n.bit;
    if (reasons & n.bit) words.emplace_back(n.name);
  }
  if (reasons & ~known) words.push_back(absl::StrCat("0x", absl::Hex(reasons & ~known)));
  return words.empty() ? "none" : absl::StrJoin(words, ", ");
}

}  // namespace qlinear::gpu
