// wire: what both ends of a kiln connection must agree on, in one library that kilnd and the
// C++ client link (the client needs nothing else of the server).
//
// 1. Status mapping. absl::Status (used everywhere in kiln) and grpc::Status (the wire) carry
//    the same canonical codes, so the code passes through; the message is bounded, because
//    gRPC carries it in a trailer and a compiler log can be large: its head (where the first
//    error usually is) and its tail are kept. WireCode/FromWireCode do the same for the code
//    numbers PrewarmEvent carries.
//
// 2. Signed results. kilnd signs each action result with an Ed25519 key over a canonical byte
//    encoding (FORMAT.md beside this file; never serialized protobuf) of the handle, the
//    target, every artifact's kind, digest and size, the launch plan and the printed key.
//    CanonicalResultBytes is that encoding; TrustedKeys verifies a result against the public
//    keys a reader trusts (several at once, so a key can be rotated without a flag day). The
//    signing half (the private key) is kilnd's, in server/auth.
//
// 3. Request keys. RequestKey names a (graph, target, options) request so that a client can
//    ask for its cached result by key, without sending the graph (FORMAT.md, "Request keys").
//
// The encodings of 2 and 3 and the signature check are written once, over serialized messages
// and without protobuf or Abseil, in result_bytes.h, ed25519.h and serialized_request_key.h:
// the client core compiles those files too (client/core/sources.txt), so the Python client runs
// the same code. The functions here serialize a message deterministically and call them.
//
// 4. Secret files. ReadSecretFile reads a key, certificate or token file, naming what it is in
//    the error.
//
// Thread-safety: pure functions; a TrustedKeys is safe to use from many threads once built.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"
#include "kiln/v1/service.pb.h"
#include "wire/ed25519.h"

namespace kiln::wire {

// ---------------------------------------------------------------------------- status

// Longest message put on the wire; longer ones keep their head and tail.
inline constexpr size_t kMaxWireMessageBytes = 4096;

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// The google.rpc.Code number of `status`, as PrewarmEvent.code carries it, and back (a code
// outside the canonical set, which a peer might send, becomes UNKNOWN).
int WireCode(const absl::Status& status);
absl::Status FromWireCode(int code, const std::string& message);

// ---------------------------------------------------------------------------- serialization

// The deterministic protobuf serialization of `message`: what RequestKey hashes and what
// CanonicalResultBytes and TrustedKeys decode.
std::string DeterministicBytes(const google::protobuf::MessageLite& message);

// ---------------------------------------------------------------------------- request keys

// Lowercase hex SHA-256 over the deterministic serializations of the three messages, as
// FORMAT.md defines it (RequestKeyOfSerialized, serialized_request_key.h, hashes them). Not an
// action key: an index kilnd keeps of requests it has seen.
std::string RequestKey(const v1::Graph& graph, const v1::Target& target,
                       const v1::CompileOptions& options);

// ---------------------------------------------------------------------------- signed results
// (kSignatureAlgorithm, KeyIdOf and KeyRing are ed25519.h's.)

// The bytes a result's signature covers (FORMAT.md). Deterministic: equal inputs give equal
// bytes on every machine and version of protobuf. Computed from the result's deterministic
// serialization by DecodeSignedResult (result_bytes.h), the encoding every client shares.
std::string CanonicalResultBytes(absl::string_view handle, const v1::ActionResult& result);

// KeyRing (ed25519.h) with absl::Status results, over protobuf messages.
class TrustedKeys {
 public:
  TrustedKeys() = default;
  // Reads PEM Ed25519 public keys (`openssl pkey -pubout` form). NotFound for a file that
  // cannot be read, InvalidArgument naming the file when one is not such a key.
  static absl::StatusOr<TrustedKeys> FromPemFiles(const std::vector<std::string>& paths);
  absl::Status AddPemFile(const std::string& path);
  absl::Status AddRawPublicKey(absl::string_view raw_public_key);

  bool empty() const { return ring_.empty(); }
  size_t size() const { return ring_.size(); }
  // Whether the key with id `key_id` (KeyIdOf) is one of these.
  bool Trusts(absl::string_view key_id) const { return ring_.Trusts(Std(key_id)); }

  // OK when `result` carries an Ed25519 signature by one of these keys over
  // CanonicalResultBytes(handle, result). FailedPrecondition for an unsigned result or one
  // signed by a key not trusted here; DataLoss when the signature does not match the bytes
  // (the record was changed after signing). Messages name the handle and the key id.
  absl::Status VerifyResult(absl::string_view handle, const v1::ActionResult& result) const;

 private:
  static std::string_view Std(absl::string_view s) { return {s.data(), s.size()}; }

  KeyRing ring_;
};

// ---------------------------------------------------------------------------- files

// The bytes of a key, certificate or token file: NotFound naming `what` and `path` when it
// cannot be read.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view what);

}  // namespace kiln::wire
