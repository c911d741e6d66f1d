// One-line server log records on stderr: "2026-11-30T12:00:00.123Z qlinear-server: message".
#pragma once

#include "absl/strings/string_view.h"

namespace qlinear {

void log_info(absl::string_view message);
// Turns logging off (tests) or on; on by default.
void set_logging(bool enabled);

}  // namespace qlinear
