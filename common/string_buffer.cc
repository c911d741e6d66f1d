// Compiled as C++23 where the compiler offers it (common/CMakeLists.txt), for
// std::string::resize_and_overwrite; std::string's layout is the same in every language mode.
#include "common/string_buffer.h"

namespace qlinear {

void resize_for_overwrite(std::string* s, size_t n) {
#if defined(__cpp_lib_string_resize_and_overwrite)
  // The operation returns n itself, not the count it is given: GCC 12's libstdc++ passes the
  // grown capacity there when the string reallocates (up to twice the old capacity).
  s->resize_and_overwrite(n, [n](char*, size_t) { return n; });
#else
  s->resize(n);
#endif
}

bool resize_for_overwrite_skips_fill() {
#if defined(__cpp_lib_string_resize_and_overwrite)
  return true;
#else
  return false;
#endif
}

}  // namespace qlinear
