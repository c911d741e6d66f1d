// The one place where an absl::Status becomes a grpc::Status (Abseil codes are gRPC codes).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace qlinear {

inline grpc::Status to_grpc_status(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace qlinear
