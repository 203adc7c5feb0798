// The absl <-> gRPC status mapping (wire.h).
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "wire/wire.h"

namespace kiln::wire {
namespace {

std::string BoundMessage(absl::string_view message) {
  if (message.size() <= kMaxWireMessageBytes) return std::string(message);
  const size_t tail = kMaxWireMessageBytes / 4;
  const size_t head = kMaxWireMessageBytes - tail - 64;
  return absl::StrCat(message.substr(0, head), "\n... [", message.size() - head - tail,
                      " bytes elided] ...\n", message.substr(message.size() - tail));
}

bool IsCanonical(int code) { return code >= 0 && code <= 16; }

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  // absl may in principle carry a code outside the canonical set; the wire must not.
  const grpc::StatusCode wire =
      IsCanonical(code) ? static_cast<grpc::StatusCode>(code) : grpc::StatusCode::UNKNOWN;
  return grpc::Status(wire, BoundMessage(status.message()));
}

absl::Status FromWireCode(int code, const std::string& message) {
  if (code == 0) return absl::OkStatus();
  const absl::StatusCode local =
      IsCanonical(code) ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
  return absl::Status(local, message);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  return FromWireCode(static_cast<int>(status.error_code()), status.error_message());
}

int WireCode(const absl::Status& status) {
  const int code = static_cast<int>(status.code());
  return IsCanonical(code) ? code : static_cast<int>(absl::StatusCode::kUnknown);
}

}  // namespace kiln::wire
