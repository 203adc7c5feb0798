// OpenSSL helpers for wire/ and server/auth (internal: not part of the wire contract).
// Thread-safety: pure functions; OpenSslError reads this thread's OpenSSL error queue.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "openssl/bio.h"
#include "openssl/evp.h"
#include "wire/ed25519.h"

namespace kiln::wire::internal {

// OpenSslFree, OpenSslError and the key sizes are ed25519.h's.
inline constexpr size_t kEd25519PublicKeyBytes = ::kiln::wire::kEd25519PublicKeyBytes;
inline constexpr size_t kEd25519SignatureBytes = ::kiln::wire::kEd25519SignatureBytes;

using BioDeleter = OpenSslFree<BIO_free>;
using PkeyDeleter = OpenSslFree<EVP_PKEY_free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyDeleter>;

// The 32 raw bytes of an Ed25519 key's public half; InvalidArgument naming `path` for a key of
// another type.
absl::StatusOr<std::string> RawPublicKey(EVP_PKEY* pkey, const std::string& path);

}  // namespace kiln::wire::internal
