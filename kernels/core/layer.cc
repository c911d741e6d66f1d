#include "kernels/core/layer.h"

namespace qlinear {

absl::string_view scheme_name(Scheme s) {
  switch (s) {
    case Scheme::kDynamicSymmetric:
      return "dynamic_symmetric";
    case Scheme::kStaticSymmetric:
      return "static_symmetric";
    case Scheme::kDynamicAsymmetric:
      return "dynamic_asymmetric";
    case Scheme::kStaticAsymmetric:
      return "static_asymmetric";
  }
  return "?";
}

}  // namespace qlinear
