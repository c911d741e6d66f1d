#include "common/version.h"

#include "absl/strings/str_cat.h"

namespace qlinear {

std::string version_string() { return absl::StrCat(version(), " (commit ", build_commit(), ")"); }

}  // namespace qlinear
