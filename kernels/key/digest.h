// Content digests: SHA-256 (OpenSSL EVP) of bytes, raw or as lowercase hex. Artifacts, cache
// records and action keys are all named this way. A small library of its own (kiln_digest),
// so the store and the clients use it without linking the compiler. The hashing itself is
// sha256.h's (Abseil-free, shared with the client core); this adds the Status-typed helpers.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/key/sha256.h"

namespace kiln::key {

// Raw 32-byte SHA-256. Internal only if OpenSSL fails to allocate.
absl::StatusOr<std::string> Sha256(std::string_view data);
// 64 lowercase hex digits -> raw 32 bytes; InvalidArgument otherwise.
absl::StatusOr<std::string> DigestFromHex(std::string_view hex);

}  // namespace kiln::key
