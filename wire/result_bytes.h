// The bytes a result's signature covers (FORMAT.md, "Signed action results"), computed from a
// serialized kiln.v1.ActionResult. kilnd, the C++ client and the Python client (through the
// client core's C ABI) all call this one function, so the encoding is written once for every
// language. It reads the protobuf wire format itself and needs no protobuf library: it uses the
// C++ standard library only, and the client core compiles it (client/core/sources.txt).
//
// The reader decodes the fields the encoding covers by their numbers (proto/kiln/v1/
// service.proto) as protobuf's parsers do: fields in any order, repeated integers packed or
// not, a singular message given twice merged, the last of a scalar or a oneof kept, unknown
// fields and fields of an unexpected wire type skipped. Bytes that are not a protobuf message
// (a truncated field, a length past the end, an invalid tag) are refused. It does not check
// that strings are UTF-8.
//
// Callers pass the serialization of the very message they go on to use (the C++ and Python
// clients serialize their parsed record), never other bytes: the signature then covers what
// the client loads whatever a parser makes of odd input.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kiln::wire {

// What checking a result's signature needs of it, decoded from its serialization.
struct SignedResult {
  std::string bytes;           // the canonical bytes (FORMAT.md) the signature covers
  bool has_signature = false;  // ActionResult.signature is present
  std::string algorithm;       // ResultSignature.algorithm
  std::string key_id;          // ResultSignature.key_id
  std::string signature;       // ResultSignature.signature
};

// Decodes `serialized_result` (a kiln.v1.ActionResult in protobuf wire format) and encodes it
// for the action `handle`. std::nullopt for bytes that are not such a message, with what is
// wrong and where in *error.
// REQUIRES: error != nullptr.
std::optional<SignedResult> DecodeSignedResult(std::string_view handle,
                                               std::string_view serialized_result,
                                               std::string* error);

}  // namespace kiln::wire
