#include "wire/ed25519.h"

#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "kernels/key/sha256.h"
#include "openssl/bio.h"
#include "openssl/err.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "wire/result_bytes.h"

namespace kiln::wire {
namespace {

using BioPtr = std::unique_ptr<BIO, internal::OpenSslFree<BIO_free>>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, internal::OpenSslFree<EVP_PKEY_free>>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, internal::OpenSslFree<EVP_MD_CTX_free>>;

TrustStatus Refuse(TrustOutcome outcome, std::string message) {
  return TrustStatus{outcome, std::move(message)};
}

}  // namespace

namespace internal {

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "unknown OpenSSL error";
  char buffer[256];
  ERR_error_string_n(e, buffer, sizeof(buffer));
  ERR_clear_error();
  return buffer;
}

bool RawEd25519PublicKey(EVP_PKEY* pkey, std::string* raw) {
  if (EVP_PKEY_id(pkey) != EVP_PKEY_ED25519) return false;
  std::string bytes(kEd25519PublicKeyBytes, '\0');
  size_t len = bytes.size();
  if (EVP_PKEY_get_raw_public_key(pkey, reinterpret_cast<unsigned char*>(bytes.data()), &len) !=
          1 ||
      len != kEd25519PublicKeyBytes) {
    return false;
  }
  *raw = std::move(bytes);
  return true;
}

}  // namespace internal

std::string KeyIdOf(std::string_view raw_public_key) {
  return key::Sha256Hex(raw_public_key).substr(0, 16);
}

bool VerifyEd25519(EVP_PKEY* public_key, std::string_view message, std::string_view signature) {
  if (signature.size() != kEd25519SignatureBytes) return false;
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (ctx == nullptr) return false;
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, public_key) != 1) return false;
  const int ok = EVP_DigestVerify(
      ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
      reinterpret_cast<const unsigned char*>(message.data()), message.size());
  ERR_clear_error();
  return ok == 1;
}

TrustStatus ReadPemPublicKey(std::string_view pem, const std::string& path, std::string* raw) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  PkeyPtr pkey(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  if (pkey == nullptr) {
    return Refuse(TrustOutcome::kKeyNotPem,
                  path + " holds no PEM public key: " + internal::OpenSslError());
  }
  if (!internal::RawEd25519PublicKey(pkey.get(), raw)) {
    ERR_clear_error();
    return Refuse(TrustOutcome::kKeyNotEd25519, path + " is not an Ed25519 key");
  }
  return {};
}

// ---------------------------------------------------------------------------- KeyRing

TrustStatus KeyRing::AddPemFile(const std::string& path, std::string* key_id) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Refuse(TrustOutcome::kKeyUnreadable, "cannot read the public key " + path);
  std::ostringstream pem;
  pem << in.rdbuf();
  std::string raw;
  if (TrustStatus s = ReadPemPublicKey(pem.str(), path, &raw); !s.ok()) return s;
  return AddRawPublicKey(raw, key_id);
}

TrustStatus KeyRing::AddRawPublicKey(std::string_view raw_public_key, std::string* key_id) {
  if (raw_public_key.size() != kEd25519PublicKeyBytes) {
    return Refuse(TrustOutcome::kKeyNotEd25519, "an Ed25519 public key has 32 bytes");
  }
  std::shared_ptr<EVP_PKEY> pkey(
      EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr,
                                  reinterpret_cast<const unsigned char*>(raw_public_key.data()),
                                  raw_public_key.size()),
      internal::OpenSslFree<EVP_PKEY_free>());
  if (pkey == nullptr) {
    return Refuse(TrustOutcome::kKeyNotEd25519,
                  "bad Ed25519 public key: " + internal::OpenSslError());
  }
  std::string id = KeyIdOf(raw_public_key);
  if (key_id != nullptr) *key_id = id;
  keys_.insert_or_assign(std::move(id), std::move(pkey));
  return {};
}

TrustStatus KeyRing::VerifyResult(std::string_view handle,
                                  std::string_view serialized_result) const {
  std::string error;
  std::optional<SignedResult> result = DecodeSignedResult(handle, serialized_result, &error);
  if (!result.has_value()) return Refuse(TrustOutcome::kMalformed, std::move(error));
  const std::string prefix(handle.substr(0, 12));
  if (!result->has_signature || result->signature.empty()) {
    return Refuse(TrustOutcome::kUnsigned, "the result for " + prefix + " is not signed");
  }
  if (result->algorithm != kSignatureAlgorithm) {
    return Refuse(TrustOutcome::kOtherAlgorithm, "the result for " + prefix + " is signed with '" +
                                                     result->algorithm.substr(0, 32) + "', not " +
                                                     kSignatureAlgorithm);
  }
  auto it = keys_.find(result->key_id);
  if (it == keys_.end()) {
    return Refuse(TrustOutcome::kUntrustedKey, "the result for " + prefix + " is signed by key " +
                                                   result->key_id.substr(0, 32) +
                                                   ", which is not trusted here");
  }
  if (!VerifyEd25519(it->second.get(), result->bytes, result->signature)) {
    return Refuse(TrustOutcome::kMismatch, "the signature of the result for " + prefix + " (key " +
                                               result->key_id + ") does not match its contents");
  }
  return {};
}

}  // namespace kiln::wire
