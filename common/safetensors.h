// A reader of safetensors files (the format of Hugging Face checkpoints, compressed-tensors W8A8
// ones among them): an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the data. The header is read alone; a tensor's bytes are
// read on their own, so that a layer's weights are taken from a checkpoint of many layers without
// reading the others.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/npy.h"

namespace qlinear {

struct SafetensorsTensor {
  std::string dtype;           // as stored: "I8", "I32", "F32", "F16", "BF16", ...
  std::vector<int64_t> shape;  // empty = a scalar
  uint64_t offset = 0;         // from the start of the file
  uint64_t bytes = 0;

  int64_t elements() const;
};

struct SafetensorsHeader {
  std::string path;
  std::map<std::string, SafetensorsTensor> tensors;  // by name ("__metadata__" left out)
  // The file the header was read from: a tensor is read only from that same file, never with
  // these offsets from one that replaced it.
  RegularFile file;
};

// The header of the file at `path`, checked: every tensor's byte range lies inside the file and,
// where its dtype is known (safetensors_dtype_size), holds exactly its shape's bytes. Messages
// start with the path.
absl::StatusOr<SafetensorsHeader> read_safetensors_header(const std::string& path);

// The bytes of tensor `name` of the file `header` describes; NOT_FOUND names the tensor, and
// FAILED_PRECONDITION says the file changed since its header was read.
absl::StatusOr<std::string> read_safetensors_tensor(const SafetensorsHeader& header,
                                                    absl::string_view name);
// The same into `out`, which has room for the tensor's bytes (SafetensorsTensor::bytes).
absl::Status read_safetensors_tensor_into(const SafetensorsHeader& header, absl::string_view name,
                                          char* out);

// The size of one element of a safetensors dtype ("BF16": 2), or 0 for one not known.
int safetensors_dtype_size(absl::string_view dtype);

}  // namespace qlinear
