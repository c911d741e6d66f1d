// The rule for layer names, shared by the server (uploads, requests) and the layer manifest.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace qlinear {

// Layer names: 1-128 characters of [A-Za-z0-9_.:/-]. INVALID_ARGUMENT says what is wrong (the
// name escaped where it holds other characters).
absl::Status validate_layer_name(absl::string_view name);

}  // namespace qlinear
