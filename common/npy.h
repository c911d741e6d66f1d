// A small reader and writer for NumPy .npy files, enough for the tensors qlinear-cli exchanges
// with Python: format versions 1.0 and 2.0, C order, little-endian dtypes |i1 (int8), <f2
// (float16), <f4 (float32) and <i4 (int32). Anything else (Fortran order, big-endian, other
// dtypes, object arrays, a truncated file) is rejected with a message that says what was found.
//
// Data is kept as the raw little-endian bytes of the file, row-major; this host is little-endian.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qlinear {

enum class NpyDType { kI1, kF2, kF4, kI4 };

// "|i1", "<f2", "<f4", "<i4".
absl::string_view npy_descr(NpyDType t);
size_t npy_dtype_size(NpyDType t);

struct NpyArray {
  NpyDType dtype = NpyDType::kF4;
  std::vector<int64_t> shape;  // empty = a scalar (one element)
  std::string data;            // product(shape) * npy_dtype_size(dtype) bytes

  int64_t elements() const;
};

// True when `bytes` starts with the .npy magic string.
bool is_npy(absl::string_view bytes);

// Parses a whole .npy file held in memory. INVALID_ARGUMENT says what is wrong with it.
absl::StatusOr<NpyArray> parse_npy(absl::string_view bytes);

// The same checks, with the data left where it is: `data` points into `bytes`.
struct NpyView {
  NpyDType dtype = NpyDType::kF4;
  std::vector<int64_t> shape;
  absl::string_view data;
};
absl::StatusOr<NpyView> view_npy(absl::string_view bytes);

// Serializes `array` (format 1.0, or 2.0 when the header does not fit 1.0). The data size must
// match the shape.
absl::StatusOr<std::string> serialize_npy(const NpyArray& array);

// File helpers. Errors name the path: NOT_FOUND / PERMISSION_DENIED for I/O, INVALID_ARGUMENT
// for content.
absl::StatusOr<std::string> read_file(const std::string& path);
// A regular file as open_regular_file found it: its size, and what tells it from a file that
// replaced it under the same path.
struct RegularFile {
  uint64_t bytes = 0;
  uint64_t device = 0, inode = 0;
  int64_t mtime_ns = 0;
  bool same_file(const RegularFile& o) const {
    return device == o.device && inode == o.inode && bytes == o.bytes && mtime_ns == o.mtime_ns;
  }
};
// Opens the regular file at `path` for reading into `*in`. NOT_FOUND or PERMISSION_DENIED
// ("cannot open PATH: reason"), INVALID_ARGUMENT for a folder or other non-file.
absl::StatusOr<RegularFile> open_regular_file(const std::string& path, std::ifstream* in);
absl::Status write_file(const std::string& path, absl::string_view bytes);
absl::StatusOr<NpyArray> read_npy_file(const std::string& path);
absl::Status write_npy_file(const std::string& path, const NpyArray& array);

// "[2, 3]" for messages.
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace qlinear
