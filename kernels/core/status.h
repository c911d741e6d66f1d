// Status helpers used at every module boundary. Abseil status codes are the gRPC codes; the
// server turns a status into a grpc::Status in exactly one place.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define QL_CONCAT_INNER(a, b) a##b
#define QL_CONCAT(a, b) QL_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                \
  do {                                       \
    ::absl::Status _ql_status = (expr);      \
    if (!_ql_status.ok()) return _ql_status; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F());` evaluates F() (an absl::StatusOr) and either binds its value
// or returns its status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  QL_ASSIGN_OR_RETURN_IMPL(QL_CONCAT(_ql_statusor_, __LINE__), lhs, expr)
#define QL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
