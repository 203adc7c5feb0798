// OpenSSL helpers for wire/ and server/auth (internal: not part of the wire contract).
// Thread-safety: pure functions; OpenSslError reads this thread's OpenSSL error queue.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "openssl/bio.h"
#include "openssl/evp.h"

namespace kiln::wire::internal {

inline constexpr size_t kEd25519PublicKeyBytes = 32;
inline constexpr size_t kEd25519SignatureBytes = 64;

// A unique_ptr deleter calling an OpenSSL free function.
template <auto kFree>
struct OpenSslFree {
  template <typename T>
  void operator()(T* p) const {
    kFree(p);
  }
};
using BioDeleter = OpenSslFree<BIO_free>;
using PkeyDeleter = OpenSslFree<EVP_PKEY_free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyDeleter>;

// The oldest error on this thread's OpenSSL queue as text (the queue is cleared).
std::string OpenSslError();

// The 32 raw bytes of an Ed25519 key's public half; InvalidArgument naming `path` for a key of
// another type.
absl::StatusOr<std::string> RawPublicKey(EVP_PKEY* pkey, const std::string& path);

}  // namespace kiln::wire::internal
