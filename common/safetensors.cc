#include "common/safetensors.h"

#include <algorithm>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/npy.h"

namespace qlinear {
namespace {

using Json = nlohmann::json;

// Larger headers are refused (the format's own reader caps them at 100,000,000 bytes).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

absl::Status bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

}  // namespace

int64_t SafetensorsTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int safetensors_dtype_size(absl::string_view dtype) {
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" ||
      dtype == "F8_E5M2") {
    return 1;
  }
  if (dtype == "I16" || dtype == "U16" || dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "I32" || dtype == "U32" || dtype == "F32") return 4;
  if (dtype == "I64" || dtype == "U64" || dtype == "F64") return 8;
  return 0;
}

absl::StatusOr<SafetensorsHeader> read_safetensors_header(const std::string& path) {
  std::ifstream in;
  absl::StatusOr<RegularFile> file = open_regular_file(path, &in);
  if (!file.ok()) return file.status();
  const uint64_t file_bytes = file->bytes;
  unsigned char len_bytes[8];
  if (!in.read(reinterpret_cast<char*>(len_bytes), 8)) {
    return bad(path, "too short for a safetensors file (no 8-byte header length)");
  }
  uint64_t header_bytes = 0;
  for (int i = 0; i < 8; ++i) header_bytes |= static_cast<uint64_t>(len_bytes[i]) << (8 * i);
  if (header_bytes > kMaxHeaderBytes || 8 + header_bytes > file_bytes) {
    return bad(path, absl::StrCat("the header length ", header_bytes, " does not fit the file (",
                                  file_bytes, " bytes); not a safetensors file?"));
  }
  std::string text(static_cast<size_t>(header_bytes), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(header_bytes))) {
    return absl::DataLossError(absl::StrCat("error reading ", path));
  }
  // The format forbids a tensor named twice (JSON would keep the last): the parser's callback sees
  // the header's own keys at depth 1.
  std::string twice;
  auto callback = [&twice, seen = std::set<std::string>()](int depth, Json::parse_event_t event,
                                                           Json& parsed) mutable {
    if (event == Json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !seen.insert(parsed.get<std::string>()).second && twice.empty()) {
      twice = parsed.get<std::string>();
    }
    return true;
  };
  Json doc;
  try {
    doc = Json::parse(text, callback);
  } catch (const Json::exception& e) {
    return bad(path, absl::StrCat("the header is not valid JSON: ", e.what()));
  }
  if (!doc.is_object()) return bad(path, "the header is not a JSON object");
  if (!twice.empty()) return bad(path, absl::StrCat("the header names '", twice, "' twice"));
  SafetensorsHeader h;
  h.path = path;
  h.file = *file;
  const uint64_t data_start = 8 + header_bytes;
  for (const auto& [name, t] : doc.items()) {
    if (name == "__metadata__") continue;
    const std::string at = absl::StrCat("tensor '", name, "'");
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2) {
      return bad(path, absl::StrCat(at, " lacks a dtype, shape or data_offsets [begin, end]"));
    }
    SafetensorsTensor out;
    out.dtype = t["dtype"].get<std::string>();
    // A dtype not known here (a newer one) is kept, its byte count unchecked, so that the file's
    // other tensors stay readable; no reader here takes such a tensor.
    const int size = safetensors_dtype_size(out.dtype);
    uint64_t elements = 1;
    for (const Json& d : t["shape"]) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) {
        return bad(path, absl::StrCat(at, " has a shape entry that is not a size"));
      }
      const uint64_t v = d.get<uint64_t>();
      if (v > (uint64_t{1} << 40) || (v > 0 && elements > (uint64_t{1} << 50) / v)) {
        return bad(path, absl::StrCat(at, " has a shape too large"));
      }
      elements *= v;
      out.shape.push_back(static_cast<int64_t>(v));
    }
    const Json& off = t["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return bad(path, absl::StrCat(at, " has data_offsets that are not sizes"));
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (end < begin || (size != 0 && end - begin != elements * size)) {
      return bad(path,
                 absl::StrCat(at, ": data_offsets [", begin, ", ", end, "] hold ", end - begin,
                              " bytes, its shape of ", out.dtype, " needs ", elements * size));
    }
    if (end > file_bytes - data_start) {
      return bad(path, absl::StrCat(at, " ends past the end of the file (truncated?)"));
    }
    out.offset = data_start + begin;
    out.bytes = end - begin;
    h.tensors.emplace(name, std::move(out));
  }
  // Nor may two tensors share bytes.
  std::vector<std::pair<uint64_t, const std::string*>> starts;
  for (const auto& [name, t] : h.tensors) starts.emplace_back(t.offset, &name);
  std::sort(starts.begin(), starts.end());
  for (size_t i = 1; i < starts.size(); ++i) {
    const SafetensorsTensor& prev = h.tensors.at(*starts[i - 1].second);
    if (prev.offset + prev.bytes > starts[i].first) {
      return bad(path, absl::StrCat("tensors '", *starts[i - 1].second, "' and '",
                                    *starts[i].second, "' overlap in the file"));
    }
  }
  return h;
}

absl::Status read_safetensors_tensor_into(const SafetensorsHeader& header, absl::string_view name,
                                          char* out) {
  const auto it = header.tensors.find(std::string(name));
  if (it == header.tensors.end()) {
    return absl::NotFoundError(absl::StrCat(header.path, " has no tensor '", name, "'"));
  }
  std::ifstream in;
  absl::StatusOr<RegularFile> file = open_regular_file(header.path, &in);
  if (!file.ok()) return file.status();
  if (!file->same_file(header.file)) {
    return absl::FailedPreconditionError(
        absl::StrCat(header.path, " changed since its header was read; read it again"));
  }
  in.seekg(static_cast<std::streamoff>(it->second.offset));
  if (!in.read(out, static_cast<std::streamsize>(it->second.bytes))) {
    return absl::DataLossError(absl::StrCat("error reading tensor '", name, "' of ", header.path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> read_safetensors_tensor(const SafetensorsHeader& header,
                                                    absl::string_view name) {
  const auto it = header.tensors.find(std::string(name));
  if (it == header.tensors.end()) {
    return absl::NotFoundError(absl::StrCat(header.path, " has no tensor '", name, "'"));
  }
  std::string bytes;
  try {
    bytes.resize(static_cast<size_t>(it->second.bytes));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", it->second.bytes, " bytes for tensor '", name, "' of ", header.path));
  }
  if (absl::Status s = read_safetensors_tensor_into(header, name, bytes.data()); !s.ok()) return s;
  return bytes;
}

}  // namespace qlinear
