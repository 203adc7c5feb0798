// SHA-256 as kiln names content: raw, as lowercase hex, and the test for a name of that form.
// The one implementation for the compiler, kilnd and every client. It needs OpenSSL alone (no
// Abseil), so the client core, which must stay standalone, compiles this very file
// (client/core/sources.txt) while everything else links it through kiln_digest; digest.h adds
// the Abseil-typed helpers.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kiln::key {

inline constexpr size_t kDigestBytes = 32;

// Raw 32-byte SHA-256; empty only if OpenSSL fails to allocate.
std::string Sha256Raw(std::string_view data);
// Lowercase hex SHA-256 (64 characters); empty only if OpenSSL fails to allocate.
std::string Sha256Hex(std::string_view data);
// Whether `digest` has the form of one: 64 lowercase hex digits. Checked before a digest is
// used in a path or a key, so a hostile one names nothing it should not.
bool IsDigest(std::string_view digest);
// Raw bytes -> lowercase hex.
std::string DigestToHex(std::string_view raw);

}  // namespace kiln::key
