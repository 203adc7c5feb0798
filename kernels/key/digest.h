// Content digests: SHA-256 (OpenSSL EVP) of bytes, raw or as lowercase hex. Artifacts, cache
// records and action keys are all named this way. A small library of its own (kiln_digest),
// so the store and the clients use it without linking the compiler.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kiln::key {

inline constexpr size_t kDigestBytes = 32;

// Raw 32-byte SHA-256. Internal only if OpenSSL fails to allocate.
absl::StatusOr<std::string> Sha256(std::string_view data);
// Lowercase hex SHA-256 (64 characters).
std::string Sha256Hex(std::string_view data);
// Whether `digest` has the form of one: 64 lowercase hex digits. Checked before a digest is
// used in a path or a key, so a hostile one names nothing it should not.
bool IsDigest(std::string_view digest);
// 64 lowercase hex digits -> raw 32 bytes; InvalidArgument otherwise.
absl::StatusOr<std::string> DigestFromHex(std::string_view hex);
// Raw bytes -> lowercase hex.
std::string DigestToHex(std::string_view raw);

}  // namespace kiln::key
