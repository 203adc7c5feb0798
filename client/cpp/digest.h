// Content digests as kiln names artifacts: the lowercase hex SHA-256 of the bytes.
// Thread-safety: pure functions.
#pragma once

#include <string>

namespace kiln::client {

// Lowercase hex SHA-256 of `bytes`.
std::string Sha256Hex(const std::string& bytes);

// Whether `digest` has the form of one (64 lowercase hex digits). Checked before a digest is
// used in a path, so a hostile one cannot name a file outside the cache.
bool IsDigest(const std::string& digest);

}  // namespace kiln::client
