// For tests of what a host at its limit of threads gets: forbid_new_threads() leaves the calling
// process unable to start a thread or a process. Call it only in a child process (a death test's
// statement): it gives up root for good, since the kernel does not hold root to the limit.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace qlinear::testing {

// Returns an empty string once no thread can start, else why it could not be arranged.
inline std::string forbid_new_threads() {
  constexpr uid_t kNobody = 65534;
  if (geteuid() == 0 && (setgid(kNobody) != 0 || setuid(kNobody) != 0)) {
    return std::string("could not give up root: ") + std::strerror(errno);
  }
  const rlimit none{0, 0};
  if (setrlimit(RLIMIT_NPROC, &none) != 0) {
    return std::string("setrlimit(RLIMIT_NPROC): ") + std::strerror(errno);
  }
  return "";
}

}  // namespace qlinear::testing
