// The request key (FORMAT.md, "Request keys") of a request given as its three serialized
// messages. wire::RequestKey (kilnd and the C++ client) and the Python client (through the
// client core's kiln_request_key) both compute it here. Needs OpenSSL's libcrypto and the C++
// standard library only (the client core compiles it).
//
// Thread-safety: pure function.
#pragma once

#include <string>
#include <string_view>

namespace kiln::wire {

// Lowercase hex SHA-256 of the domain string and each message's bytes, length-prefixed.
// REQUIRES: each argument is its message's deterministic protobuf serialization (that is what
// kilnd hashes; other bytes give a key kilnd has not seen, never a wrong result).
std::string RequestKeyOfSerialized(std::string_view graph, std::string_view target,
                                   std::string_view options);

}  // namespace kiln::wire
