// The one place where an absl::Status becomes a grpc::Status and back (Abseil codes are gRPC
// codes).
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace qlinear {

// The most bytes a status message takes as gRPC sends it. Messages quote what the client sent (a
// kernel name, a shape), and one over gRPC's metadata limit (8 KiB by default; grpc-message
// travels in the trailers, percent-encoded: a byte outside printable ASCII, or '%', takes three)
// would reach the client as a RESOURCE_EXHAUSTED of the transport instead of its own code, or, as
// a stream's answer, could end the stream.
inline constexpr size_t kMaxStatusMessageBytes = 4096;

// The bytes `c` takes in grpc-message.
inline size_t grpc_message_bytes(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return u >= 0x20 && u <= 0x7e && u != '%' ? 1 : 3;
}

// The longest start of `s` of at most `max_bytes` that ends at a UTF-8 character boundary (a
// protobuf string field must hold whole characters: a parser refuses the message otherwise).
inline absl::string_view utf8_prefix(absl::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut);
}

// `message`, cut to kMaxStatusMessageBytes as sent, at a UTF-8 character boundary (the stream's
// answers carry it in a protobuf string), and saying how long it was.
inline std::string bounded_status_message(absl::string_view message) {
  size_t sent = 0;
  for (size_t i = 0; i < message.size() && sent <= kMaxStatusMessageBytes; ++i) {
    sent += grpc_message_bytes(message[i]);
  }
  if (sent <= kMaxStatusMessageBytes) return std::string(message);
  const std::string tail = absl::StrCat("... (", message.size(), " bytes in all)");
  size_t cut = 0;
  for (size_t used = 0; cut < message.size(); ++cut) {
    used += grpc_message_bytes(message[cut]);
    if (used > kMaxStatusMessageBytes - tail.size()) break;
  }
  return absl::StrCat(utf8_prefix(message, cut), tail);
}

inline grpc::Status to_grpc_status(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), bounded_status_message(s.message()));
}

// A status the service made as a grpc::Status (a refusal), where the engine's are absl::Status.
inline absl::Status from_grpc_status(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace qlinear
