#include "kernels/core/host_info.h"

#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace qlinear {
namespace {

std::string read_cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "model name")) {
      auto pos = line.find(':');
      if (pos != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(pos + 1)));
      }
    }
  }
  return "unknown CPU";
}

}  // namespace

HostInfo detect_host_info() {
  HostInfo h;
  h.cpu_model = read_cpu_model();
  h.cpu_threads = static_cast<int>(std::thread::hardware_concurrency());
  // __builtin_cpu_supports also checks that the OS saves the wide registers (XCR0).
  __builtin_cpu_init();
  h.avx2 = __builtin_cpu_supports("avx2");
  h.fma = __builtin_cpu_supports("fma");
  h.f16c = __builtin_cpu_supports("f16c");
  h.avx512f = __builtin_cpu_supports("avx512f");
  h.avx512bw = __builtin_cpu_supports("avx512bw");
  h.avx512vl = __builtin_cpu_supports("avx512vl");
  h.avx512_vnni = __builtin_cpu_supports("avx512vnni");
  h.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  // (Whether the OS gives this process the tiles' state is asked when an AMX kernel is checked.)
  h.amx_int8 = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8");
  detect_cuda_devices(&h);
  return h;
}

const HostInfo& host_info() {
  static const HostInfo info = detect_host_info();
  return info;
}

std::string HostInfo::cpu_description() const {
  std::vector<std::string> isa;
  if (avx2) isa.push_back("avx2");
  if (fma) isa.push_back("fma");
  if (f16c) isa.push_back("f16c");
  if (avx512f) isa.push_back("avx512f");
  if (avx512bw) isa.push_back("avx512bw");
  if (avx512vl) isa.push_back("avx512vl");
  if (avx512_vnni) isa.push_back("avx512_vnni");
  if (avx512_bf16) isa.push_back("avx512_bf16");
  if (amx_int8) isa.push_back("amx_int8");
  return absl::StrCat(cpu_model, " (", cpu_threads, " threads; ",
                      isa.empty() ? "no AVX2/AVX-512" : absl::StrJoin(isa, " "), ")");
}

std::string HostInfo::gpu_description() const {
  if (gpus.empty()) {
    return absl::StrCat("no GPU", cuda_error.empty() ? "" : absl::StrCat(" (", cuda_error, ")"));
  }
  std::vector<std::string> parts;
  for (const GpuInfo& g : gpus) {
    parts.push_back(absl::StrCat("cuda:", g.index, " ", g.name, " (sm_", g.cc_major, g.cc_minor,
                                 ", ", g.sm_count, " SMs, ", g.memory_bytes >> 30, " GiB)"));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace qlinear
