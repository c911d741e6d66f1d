#include "server/core/periodic.h"

#include <new>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qlinear {

absl::StatusOr<std::unique_ptr<Periodic>> Periodic::start(absl::Duration period,
                                                          std::function<void()> fn) {
  if (period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a periodic task's period must be positive, got ", absl::FormatDuration(period)));
  }
  std::unique_ptr<Periodic> p(new Periodic(period, std::move(fn)));
  try {
    p->thread_ = std::thread([raw = p.get()] { raw->run(); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the housekeeping thread could not be started (", e.what(), ")"));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "the housekeeping thread could not be started (out of memory)");
  }
  return p;
}

Periodic::~Periodic() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Periodic::run() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), period_)) return;
    }
    fn_();
  }
}

}  // namespace qlinear
