// The client's one mapping from what the wire says (grpc::Status, PrewarmEvent.code) to
// absl::Status, the type the rest of kiln returns.
//
// The canonical codes are numerically the same in gRPC and Abseil, so a code passes through;
// one outside the canonical set (which a peer might send) becomes UNKNOWN. The server keeps
// its own direction (absl -> gRPC) in server/status_map.h, which also bounds message sizes.
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace kiln::client {

absl::Status FromGrpcStatus(const grpc::Status& status);

// A google.rpc.Code number with its message, as PrewarmEvent carries the outcome of one
// request.
absl::Status FromWireCode(int code, const std::string& message);

}  // namespace kiln::client
