#include "client/cpp/grpc_status.h"

namespace kiln::client {

absl::Status FromWireCode(int code, const std::string& message) {
  if (code == 0) return absl::OkStatus();
  const bool canonical = code > 0 && code <= 16;
  return absl::Status(
      canonical ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown, message);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  return FromWireCode(static_cast<int>(status.error_code()), status.error_message());
}

}  // namespace kiln::client
