// A byte string sized for a writer that fills every byte itself.
#pragma once

#include <cstddef>
#include <string>

namespace qlinear {

// Resizes *s to n bytes without writing the bytes it grows by: those hold unspecified values
// until the caller overwrites them, which it must do before reading them. The bytes it keeps are
// unchanged. A response's y, which a kernel writes whole, is sized this way: std::string::resize
// would zero-fill it first (a 512 KB y took 23-28 us to fill on the H200 host).
void resize_for_overwrite(std::string* s, size_t n);

// Whether resize_for_overwrite skips the fill in this build (it needs the C++23 standard
// library's std::string::resize_and_overwrite; otherwise it fills like resize).
bool resize_for_overwrite_skips_fill();

}  // namespace qlinear
