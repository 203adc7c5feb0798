// kilnd's Ed25519 signing key and its ResultSigner, and key pair generation. The bytes a
// signature covers and their verification are shared with clients (wire/).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/key/digest.h"
#include "kernels/util/status_macros.h"
#include "openssl/crypto.h"
#include "openssl/err.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "server/auth/auth.h"
#include "wire/openssl.h"

namespace kiln::auth {
namespace {

using wire::internal::kEd25519SignatureBytes;
using wire::internal::OpenSslError;
using wire::internal::PkeyPtr;
using wire::internal::RawPublicKey;
using BioDeleter = internal::OpenSslFree<BIO_free>;
using MdCtxDeleter = internal::OpenSslFree<EVP_MD_CTX_free>;

}  // namespace

// ---------------------------------------------------------------------------- SigningKey

absl::StatusOr<std::unique_ptr<SigningKey>> SigningKey::FromPemFile(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string pem, ReadSecretFile(path, "signing key"));
  std::unique_ptr<BIO, BioDeleter> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  PkeyPtr pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds no PEM private key: ", OpenSslError()));
  }
  KILN_ASSIGN_OR_RETURN(std::string raw, RawPublicKey(pkey.get(), path));
  std::unique_ptr<SigningKey> key(new SigningKey());
  key->pkey_ = pkey.release();
  key->key_id_ = KeyIdOf(raw);
  key->raw_public_key_ = std::move(raw);
  return key;
}

SigningKey::~SigningKey() { EVP_PKEY_free(pkey_); }

absl::Status SigningKey::Sign(absl::string_view handle, v1::ActionResult* result) const {
  result->clear_signature();
  const std::string message = CanonicalResultBytes(handle, *result);
  std::string signature(kEd25519SignatureBytes, '\0');
  size_t len = signature.size();
  std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  if (ctx == nullptr || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, pkey_) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &len,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1) {
    return absl::InternalError(absl::StrCat("Ed25519 signing failed: ", OpenSslError()));
  }
  signature.resize(len);
  v1::ResultSignature* out = result->mutable_signature();
  out->set_algorithm(kSignatureAlgorithm);
  out->set_key_id(key_id_);
  out->set_signature(std::move(signature));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------- ResultSigner

struct ResultSigner::State {
  std::unique_ptr<SigningKey> key;
  TrustedKeys trusted;  // the signing key's own public key included
};

absl::StatusOr<std::unique_ptr<ResultSigner>> ResultSigner::Load(std::string key_file,
                                                                 std::vector<std::string> trusted) {
  std::unique_ptr<ResultSigner> signer(new ResultSigner(std::move(key_file), std::move(trusted)));
  KILN_RETURN_IF_ERROR(signer->Reload());
  return signer;
}

absl::StatusOr<std::shared_ptr<const ResultSigner::State>> ResultSigner::Read() const {
  auto state = std::make_shared<State>();
  KILN_ASSIGN_OR_RETURN(state->key, SigningKey::FromPemFile(key_file_));
  KILN_ASSIGN_OR_RETURN(state->trusted, TrustedKeys::FromPemFiles(trusted_files_));
  KILN_RETURN_IF_ERROR(state->trusted.AddRawPublicKey(state->key->raw_public_key()));
  return state;
}

absl::Status ResultSigner::Reload() {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const State> state, Read());
  absl::MutexLock lock(&mu_);
  state_ = std::move(state);
  return absl::OkStatus();
}

std::shared_ptr<const ResultSigner::State> ResultSigner::Current() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

absl::Status ResultSigner::Sign(absl::string_view handle, v1::ActionResult* result) const {
  return Current()->key->Sign(handle, result);
}

absl::Status ResultSigner::VerifyStored(absl::string_view handle,
                                        const v1::ActionResult& result) const {
  return Current()->trusted.VerifyResult(handle, result);
}

std::string ResultSigner::key_id() const { return Current()->key->key_id(); }

// ---------------------------------------------------------------------------- keygen

absl::Status WriteKeyPair(const std::string& private_path, const std::string& public_path) {
  PkeyPtr pkey(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  if (pkey == nullptr) {
    return absl::InternalError(absl::StrCat("Ed25519 key generation failed: ", OpenSslError()));
  }
  auto write = [&](const std::string& path, mode_t mode, bool is_private) -> absl::Status {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
      return absl::FailedPreconditionError(absl::StrCat("cannot create ", path, ": ",
                                                        std::strerror(errno),
                                                        " (an existing key is never "
                                                        "overwritten)"));
    }
    FILE* file = fdopen(fd, "w");
    if (file == nullptr) {
      close(fd);
      return absl::InternalError(absl::StrCat("cannot open ", path));
    }
    const int ok = is_private ? PEM_write_PKCS8PrivateKey(file, pkey.get(), nullptr, nullptr, 0,
                                                          nullptr, nullptr)
                              : PEM_write_PUBKEY(file, pkey.get());
    const bool closed = std::fclose(file) == 0;
    if (ok != 1 || !closed) {
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", OpenSslError()));
    }
    return absl::OkStatus();
  };
  KILN_RETURN_IF_ERROR(write(private_path, 0600, true));
  return write(public_path, 0644, false);
}

}  // namespace kiln::auth
