// The one mapping between absl::Status (used everywhere in kiln) and grpc::Status (the wire).
//
// The canonical codes are numerically the same in both, so the code passes through; the
// message is bounded, because gRPC carries it in a trailer and a compiler log can be large:
// the head (where the first error usually is) and the tail are kept.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace kiln::server {

// Longest message put on the wire; longer ones keep their head and tail.
inline constexpr size_t kMaxWireMessageBytes = 4096;

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// The google.rpc.Code number of `status`, as PrewarmEvent.code carries it, and back (a code
// outside the canonical set, which a peer might send, becomes UNKNOWN).
int WireCode(const absl::Status& status);
absl::Status FromWireCode(int code, const std::string& message);

}  // namespace kiln::server
