// Ed25519 public keys and the check of a signed action result against them (FORMAT.md): key
// ids, PEM public-key files, and KeyRing, the keys a reader trusts. kilnd and the C++ client
// use it through TrustedKeys (wire.h), the Python client through the client core's C ABI
// (kiln_trust_*), so a result is verified by the same code in every language. It needs
// OpenSSL's libcrypto and the C++ standard library only (the client core compiles it).
//
// Thread-safety: pure functions; a KeyRing is safe to use from many threads once its keys are
// added (adding is not safe while another thread reads it).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct evp_pkey_st;  // OpenSSL's EVP_PKEY

namespace kiln::wire {

inline constexpr size_t kEd25519PublicKeyBytes = 32;
inline constexpr size_t kEd25519SignatureBytes = 64;
inline constexpr char kSignatureAlgorithm[] = "ed25519";

// The id of an Ed25519 public key: the first 16 hex digits of the SHA-256 of its 32 raw bytes.
std::string KeyIdOf(std::string_view raw_public_key);

// What became of adding a key or checking a result. The numbers are the C ABI's
// (kiln_core.h, enum kiln_trust_outcome): never renumber one.
enum class TrustOutcome : int {
  kOk = 0,
  kKeyUnreadable = 1,   // a key file that cannot be read
  kKeyNotPem = 2,       // a file that holds no PEM public key
  kKeyNotEd25519 = 3,   // a public key of another type, or raw bytes that are no Ed25519 key
  kMalformed = 4,       // bytes that are not a serialized ActionResult
  kUnsigned = 5,        // a result without a signature
  kOtherAlgorithm = 6,  // signed with another algorithm than Ed25519
  kUntrustedKey = 7,    // signed by a key not among these
  kMismatch = 8,        // the signature does not match the signed bytes: the record was changed
};

struct TrustStatus {
  TrustOutcome outcome = TrustOutcome::kOk;
  std::string message;  // empty when ok; else names the file, or the handle and the key id

  bool ok() const { return outcome == TrustOutcome::kOk; }
};

// Whether `signature` is `public_key`'s Ed25519 signature (RFC 8032, pure) over `message`.
bool VerifyEd25519(evp_pkey_st* public_key, std::string_view message, std::string_view signature);

// The 32 raw bytes of the Ed25519 public key in `pem` (`openssl pkey -pubout` form), read from
// the file `path` (which messages name): kKeyNotPem or kKeyNotEd25519 otherwise.
// REQUIRES: raw != nullptr.
TrustStatus ReadPemPublicKey(std::string_view pem, const std::string& path, std::string* raw);

class KeyRing {
 public:
  // Adds the Ed25519 public key in the PEM file `path`; its id in *key_id when key_id is not
  // null. kKeyUnreadable, kKeyNotPem or kKeyNotEd25519 naming the file otherwise.
  TrustStatus AddPemFile(const std::string& path, std::string* key_id = nullptr);
  // Adds a key by its 32 raw bytes (kKeyNotEd25519 for other bytes).
  TrustStatus AddRawPublicKey(std::string_view raw_public_key, std::string* key_id = nullptr);

  bool empty() const { return keys_.empty(); }
  size_t size() const { return keys_.size(); }
  bool Trusts(std::string_view key_id) const { return keys_.find(key_id) != keys_.end(); }

  // Checks the serialized kiln.v1.ActionResult `serialized_result` for the action `handle`:
  // ok when it carries an Ed25519 signature by one of these keys over its canonical bytes
  // (result_bytes.h). Pass the serialization of the record the caller goes on to use.
  TrustStatus VerifyResult(std::string_view handle, std::string_view serialized_result) const;

 private:
  // Key id -> the parsed public key (kept parsed: verification is on every client's hit path).
  std::map<std::string, std::shared_ptr<evp_pkey_st>, std::less<>> keys_;
};

namespace internal {

// A unique_ptr deleter calling an OpenSSL free function.
template <auto kFree>
struct OpenSslFree {
  template <typename T>
  void operator()(T* p) const {
    kFree(p);
  }
};

// The oldest error on this thread's OpenSSL queue as text (the queue is cleared).
std::string OpenSslError();

// The 32 raw bytes of an Ed25519 key's public half into *raw; false for a key of another type
// or one OpenSSL cannot read (*raw then unchanged).
bool RawEd25519PublicKey(evp_pkey_st* pkey, std::string* raw);

}  // namespace internal
}  // namespace kiln::wire
