// TLS material with reload: gRPC through its certificate-config fetcher (consulted on every
// new handshake), HTTPS through an OpenSSL certificate callback (likewise).
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "grpc/grpc_security.h"
#include "grpcpp/security/server_credentials.h"
#include "kernels/util/status_macros.h"
#include "openssl/err.h"
#include "openssl/pem.h"
#include "openssl/ssl.h"
#include "openssl/x509.h"
#include "server/auth/auth.h"

namespace kiln::auth {
namespace {

using X509Deleter = internal::OpenSslFree<X509_free>;
using StoreDeleter = internal::OpenSslFree<X509_STORE_free>;
using PkeyDeleter = internal::OpenSslFree<EVP_PKEY_free>;
using BioDeleter = internal::OpenSslFree<BIO_free>;
struct ChainDeleter {
  void operator()(STACK_OF(X509) * s) const { sk_X509_pop_free(s, X509_free); }
};

// Every certificate in `pem`, in order.
std::vector<std::unique_ptr<X509, X509Deleter>> ParseCertificates(const std::string& pem) {
  std::vector<std::unique_ptr<X509, X509Deleter>> out;
  std::unique_ptr<BIO, BioDeleter> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  ERR_clear_error();  // the read past the last certificate
  return out;
}

// gRPC's C++ API has no credentials type around a certificate-config fetcher, which is what
// reloading without a restart needs; this is the thin wrapper its secure credentials are too.
class FetcherServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit FetcherServerCredentials(grpc_server_credentials* creds) : creds_(creds) {}
  ~FetcherServerCredentials() override { grpc_server_credentials_release(creds_); }
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {}

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }
  grpc_server_credentials* const creds_;
};

}  // namespace

struct TlsMaterial::Pem {
  int64_t generation = 0;
  std::string cert_chain_text;
  std::string key_text;
  std::string client_ca_text;
  std::unique_ptr<X509, X509Deleter> leaf;
  std::unique_ptr<STACK_OF(X509), ChainDeleter> chain;  // after the leaf
  std::unique_ptr<EVP_PKEY, PkeyDeleter> key;
  std::unique_ptr<X509_STORE, StoreDeleter> client_ca;  // null without mTLS
};

struct TlsMaterial::GrpcFetchState {
  absl::Mutex mu;
  int64_t served ABSL_GUARDED_BY(mu) = 0;  // generation gRPC has now
};

TlsMaterial::TlsMaterial(TlsFiles files)
    : files_(std::move(files)), grpc_fetch_(std::make_unique<GrpcFetchState>()) {}

TlsMaterial::~TlsMaterial() = default;

absl::StatusOr<std::unique_ptr<TlsMaterial>> TlsMaterial::Load(const TlsFiles& files) {
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and a private key file");
  }
  std::unique_ptr<TlsMaterial> material(new TlsMaterial(files));
  KILN_RETURN_IF_ERROR(material->Reload());
  return material;
}

absl::StatusOr<std::shared_ptr<const TlsMaterial::Pem>> TlsMaterial::Read() const {
  auto pem = std::make_shared<Pem>();
  KILN_ASSIGN_OR_RETURN(pem->cert_chain_text, ReadSecretFile(files_.cert, "certificate"));
  KILN_ASSIGN_OR_RETURN(pem->key_text, ReadSecretFile(files_.key, "private key"));
  auto certs = ParseCertificates(pem->cert_chain_text);
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(files_.cert, " holds no PEM certificate"));
  }
  pem->leaf = std::move(certs.front());
  pem->chain.reset(sk_X509_new_null());
  for (size_t i = 1; i < certs.size(); ++i) sk_X509_push(pem->chain.get(), certs[i].release());
  std::unique_ptr<BIO, BioDeleter> bio(
      BIO_new_mem_buf(pem->key_text.data(), static_cast<int>(pem->key_text.size())));
  pem->key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (pem->key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(files_.key, " holds no PEM private key"));
  }
  if (X509_check_private_key(pem->leaf.get(), pem->key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        "the private key ", files_.key, " does not belong to the certificate ", files_.cert));
  }
  if (!files_.client_ca.empty()) {
    KILN_ASSIGN_OR_RETURN(pem->client_ca_text, ReadSecretFile(files_.client_ca, "client CA"));
    auto cas = ParseCertificates(pem->client_ca_text);
    if (cas.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(files_.client_ca, " holds no PEM certificate"));
    }
    pem->client_ca.reset(X509_STORE_new());
    for (auto& ca : cas) X509_STORE_add_cert(pem->client_ca.get(), ca.get());
  }
  return pem;
}

absl::Status TlsMaterial::Reload() {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const Pem> read, Read());
  auto pem = std::const_pointer_cast<Pem>(read);
  absl::MutexLock lock(&mu_);
  pem->generation = ++generation_;
  current_ = std::move(pem);
  return absl::OkStatus();
}

std::shared_ptr<const TlsMaterial::Pem> TlsMaterial::Current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

int64_t TlsMaterial::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

std::shared_ptr<grpc::ServerCredentials> TlsMaterial::GrpcServerCredentials() {
  // Called by gRPC on each new handshake: hands over a new config only when a reload made one.
  auto fetch =
      [](void* user_data,
         grpc_ssl_server_certificate_config** config) -> grpc_ssl_certificate_config_reload_status {
    auto* self = static_cast<TlsMaterial*>(user_data);
    std::shared_ptr<const Pem> pem = self->Current();
    absl::MutexLock lock(&self->grpc_fetch_->mu);
    if (pem->generation == self->grpc_fetch_->served)
      return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    grpc_ssl_pem_key_cert_pair pair{pem->key_text.c_str(), pem->cert_chain_text.c_str()};
    // gRPC's fetcher path requires root certificates even when no client certificate is
    // asked for (it asserts on null); without mTLS they are never consulted, so the server's
    // own chain stands in.
    *config = grpc_ssl_server_certificate_config_create(
        pem->client_ca_text.empty() ? pem->cert_chain_text.c_str() : pem->client_ca_text.c_str(),
        &pair, 1);
    if (*config == nullptr) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
    self->grpc_fetch_->served = pem->generation;
    return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
  };
  grpc_ssl_server_credentials_options* options =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          requires_client_cert() ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                 : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
          fetch, this);
  return std::make_shared<FetcherServerCredentials>(
      grpc_ssl_server_credentials_create_with_options(options));
}

bool TlsMaterial::ConfigureHttps(ssl_ctx_st* ctx) {
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) return false;
  // Runs on each handshake, before the server picks its certificate.
  SSL_CTX_set_cert_cb(
      ctx,
      [](SSL* ssl, void* arg) -> int {
        std::shared_ptr<const Pem> pem = static_cast<TlsMaterial*>(arg)->Current();
        if (SSL_use_cert_and_key(ssl, pem->leaf.get(), pem->key.get(), pem->chain.get(), 1) != 1) {
          return 0;
        }
        if (pem->client_ca != nullptr &&
            SSL_set1_verify_cert_store(ssl, pem->client_ca.get()) != 1) {
          return 0;
        }
        return 1;
      },
      this);
  if (requires_client_cert()) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return true;
}

}  // namespace kiln::auth
