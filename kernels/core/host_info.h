// What this host can run, detected once at start-up and passed to every `is_supported` check.
#pragma once

#include <string>
#include <vector>

namespace qlinear {

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0;  // compute capability
  int cc_minor = 0;
  int64_t memory_bytes = 0;
  int sm_count = 0;
};

struct HostInfo {
  std::string cpu_model;
  int cpu_threads = 0;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
  bool amx_int8 = false;       // AMX tiles with int8 multiplies (TDPBUSD), as the CPU reports them
  bool cuda_compiled = false;  // the binary holds CUDA code
  std::string cuda_error;      // why no GPU is usable, when `gpus` is empty
  std::vector<GpuInfo> gpus;

  // One line for logs and the kernel listing, e.g. "AMD EPYC (2 threads; avx2 avx512f ...)".
  std::string cpu_description() const;
  std::string gpu_description() const;
};

// Detects the host once (thread-safe) and returns the same object afterwards.
const HostInfo& host_info();

// Detection without caching; tests use it to build hosts that lack features.
HostInfo detect_host_info();

// Implemented by the CUDA module when it is compiled in, and by a stub otherwise.
void detect_cuda_devices(HostInfo* info);

}  // namespace qlinear
