#include "common/layer_name.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace qlinear {

absl::Status validate_layer_name(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("layer name is empty");
  if (name.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer name is ", name.size(), " characters long; the limit is 128"));
  }
  for (char c : name) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':' ||
          c == '/' || c == '-')) {
      return absl::InvalidArgumentError(absl::StrCat("layer name '", absl::CHexEscape(name),
                                                     "' has characters outside [A-Za-z0-9_.:/-]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace qlinear
