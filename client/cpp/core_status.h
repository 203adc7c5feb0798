// The client core's errors (client/core/error.h) as absl::Status, for the C++ client.
#pragma once

#include "absl/status/status.h"
#include "client/core/error.h"

namespace kiln::client {

inline absl::Status ToStatus(const core::Error& error) {
  switch (error.code) {
    case KILN_CORE_OK:
      return absl::OkStatus();
    case KILN_CORE_INVALID_ARGUMENT:
      return absl::InvalidArgumentError(error.message);
    case KILN_CORE_NOT_FOUND:
      return absl::NotFoundError(error.message);
    case KILN_CORE_FAILED_PRECONDITION:
      return absl::FailedPreconditionError(error.message);
    case KILN_CORE_DATA_LOSS:
      return absl::DataLossError(error.message);
    case KILN_CORE_UNAVAILABLE:
      return absl::UnavailableError(error.message);
    case KILN_CORE_INTERNAL:
      break;
  }
  return absl::InternalError(error.message);
}

}  // namespace kiln::client
