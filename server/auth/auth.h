// auth: who may talk to kilnd, over what, and whether a result can be trusted to run.
//
// Three parts, one contract each:
//
// 1. Transport. TlsMaterial holds the server's certificate chain, private key and (for mTLS)
//    the CA that client certificates must chain to, read from PEM files and checked (the key
//    must match the certificate) before use. Reload() re-reads the files; a bad set is refused
//    and the old one stays in service. The gRPC credentials it makes fetch the current set on
//    every new handshake, and so does the HTTPS context it configures for the metrics port:
//    a reload never drops a connection and never needs a restart.
//
// 2. Identity. A token file has one line per token, `NAME ROLE TOKEN [compiles=N]`, fields
//    separated by whitespace, `#` starting a comment. Roles are ordered read < compile < admin:
//    read may Lookup, GetResult, FetchArtifact, GetSource and GetStats; compile also Compile
//    and Prewarm; admin everything. The Authorizer checks the `authorization: Bearer TOKEN`
//    header of a call: no or unknown token is Unauthenticated, too small a role is
//    PermissionDenied naming the role needed. Presented tokens are hashed and compared with
//    every known token's hash in constant time, so timing tells nothing about any token.
//    Callers are known by the token's NAME (logs, metrics); the token itself is never logged.
//    `compiles=N` (or the default given to Create) bounds the compiles a token's callers may
//    have running at once, so one tenant's prewarm cannot take every worker. Without a token
//    file everyone is an admin named "anonymous".
//
// 3. Integrity. kilnd signs each action result it produces with an Ed25519 key: the signature
//    covers a canonical byte encoding (wire/FORMAT.md; never serialized protobuf)
//    of the handle, the target, every artifact's kind, digest and size, the launch plan and
//    the printed key. Clients verify it against the public keys they trust, and every
//    artifact's digest, before loading any code. TrustedKeys holds several keys at once, so a
//    signing key can be rotated without a flag day. VerifyResult is the one check every
//    record read back from storage (RocksDB, or a shared tier such as Redis) goes through.
//
// Thread-safety: every class here is thread-safe; Reload() may run while calls are served.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kiln/v1/service.pb.h"
#include "wire/openssl.h"
#include "wire/wire.h"

namespace grpc {
class ServerCredentials;
class ServerContextBase;
}  // namespace grpc
struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace kiln::auth {

// Shared with clients (wire/wire.h): reading key files, and the verification half of signed
// results, used here under auth's names.
using wire::CanonicalResultBytes;
using wire::KeyIdOf;
using wire::kSignatureAlgorithm;
using wire::ReadSecretFile;
using wire::TrustedKeys;

namespace internal {
template <auto kFree>
using OpenSslFree = wire::internal::OpenSslFree<kFree>;
}  // namespace internal

// ------------------------------------------------------------------------------------------
// Transport

struct TlsFiles {
  std::string cert;       // PEM certificate chain, leaf first
  std::string key;        // PEM private key of the leaf
  std::string client_ca;  // PEM CA bundle; non-empty requires and verifies client certs
};

class TlsMaterial {
 public:
  // Reads and checks the files: NotFound naming a file that cannot be read; InvalidArgument
  // naming one that cannot be parsed, or when the key does not belong to the certificate.
  static absl::StatusOr<std::unique_ptr<TlsMaterial>> Load(const TlsFiles& files);
  ~TlsMaterial();

  // Re-reads the same paths. On error the current set stays in use and the error is returned.
  absl::Status Reload();

  // Credentials for grpc::ServerBuilder::AddListeningPort; each new connection's handshake
  // uses the set current at that moment. The object must outlive the server.
  std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials();

  // Configures an OpenSSL server context (the metrics port's) to present the current set on
  // each handshake, and to require client certificates when a client CA is configured.
  // Returns false when the context cannot be set up.
  bool ConfigureHttps(ssl_ctx_st* ctx);

  bool requires_client_cert() const { return !files_.client_ca.empty(); }
  // How many sets were loaded (1 after Load; +1 per successful Reload).
  int64_t generation() const;

  struct Pem;  // parsed and text forms of one set (tls.cc)
  std::shared_ptr<const Pem> Current() const;

 private:
  struct GrpcFetchState;
  explicit TlsMaterial(TlsFiles files);
  absl::StatusOr<std::shared_ptr<const Pem>> Read() const;

  const TlsFiles files_;
  const std::unique_ptr<GrpcFetchState> grpc_fetch_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Pem> current_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

// ------------------------------------------------------------------------------------------
// Identity

enum class Role { kNone = 0, kRead = 1, kCompile = 2, kAdmin = 3 };

absl::string_view RoleName(Role role);  // "read", "compile", "admin" ("none" for kNone)
absl::StatusOr<Role> ParseRole(absl::string_view name);

// Per-token counters; shared by every caller of one token name, and kept across reloads.
struct TokenCounters {
  std::atomic<int64_t> requests{0};  // calls allowed
  std::atomic<int64_t> denied{0};    // calls refused for too small a role
  std::atomic<int64_t> compiles_in_flight{0};
  std::atomic<int64_t> limited{0};  // compiles refused by the in-flight limit
};

// One line of the token file, parsed. The token is kept only as its SHA-256.
struct TokenEntry {
  std::string name;
  Role role = Role::kNone;
  std::string token_sha256;  // raw 32 bytes
  int max_compiles = 0;      // 0: the file's default applies
};

// Parses a token file's text. InvalidArgument naming `file_name`, the line and the rule for a
// malformed line, an unknown role, a duplicate name or token, or a token shorter than 16
// characters.
absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(absl::string_view text,
                                                       absl::string_view file_name);

// Who is calling, once the token checked out.
struct Caller {
  std::string name;  // the token's NAME, "anonymous" without a token file
  Role role = Role::kNone;
  int max_compiles = 0;  // 0: unlimited
  std::shared_ptr<TokenCounters> counters;
};

// A compile slot of one token; releasing it (destruction) lets another compile in.
class CompileSlot {
 public:
  explicit CompileSlot(std::shared_ptr<TokenCounters> counters) : counters_(std::move(counters)) {}
  ~CompileSlot() { counters_->compiles_in_flight.fetch_sub(1, std::memory_order_relaxed); }
  CompileSlot(const CompileSlot&) = delete;
  CompileSlot& operator=(const CompileSlot&) = delete;

 private:
  std::shared_ptr<TokenCounters> counters_;
};

class Authorizer {
 public:
  // `token_file` empty: open access. `default_max_compiles` applies to tokens without their
  // own `compiles=N` (0: unlimited). Errors as ParseTokenFile, or NotFound for the file.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(const std::string& token_file,
                                                            int default_max_compiles = 0);

  // Re-reads the token file (no-op without one). On error the current tokens stay in use.
  absl::Status Reload();

  bool enabled() const { return !token_file_.empty(); }

  // The caller of `context`, if its role is at least `needed`: Unauthenticated without a
  // (known) bearer token, PermissionDenied naming `method` and the role needed otherwise.
  absl::StatusOr<Caller> Authorize(const grpc::ServerContextBase& context, Role needed,
                                   absl::string_view method) const;
  // The same check on the value of an `authorization` header (empty when absent).
  absl::StatusOr<Caller> AuthorizeHeader(absl::string_view authorization, Role needed,
                                         absl::string_view method) const;

  // A compile slot for `caller`, or nullptr when the caller already runs its limit's worth.
  static std::shared_ptr<CompileSlot> TryAcquireCompile(const Caller& caller);

  // Appends one TokenStats per token name (and the unauthenticated count) to `stats`.
  void AddStats(v1::GetStatsResponse* stats) const;

 private:
  struct Table;
  Authorizer(std::string token_file, int default_max_compiles)
      : token_file_(std::move(token_file)), default_max_compiles_(default_max_compiles) {}
  absl::StatusOr<std::shared_ptr<const Table>> ReadTable() const;
  std::shared_ptr<const Table> CurrentTable() const;

  const std::string token_file_;
  const int default_max_compiles_;
  const std::shared_ptr<TokenCounters> anonymous_ = std::make_shared<TokenCounters>();
  mutable std::atomic<int64_t> unauthenticated_{0};

  mutable absl::Mutex mu_;
  std::shared_ptr<const Table> table_ ABSL_GUARDED_BY(mu_);
  // Counters by name, kept across reloads so a renamed role does not reset a token's history.
  mutable absl::flat_hash_map<std::string, std::shared_ptr<TokenCounters>> counters_
      ABSL_GUARDED_BY(mu_);
};

// ------------------------------------------------------------------------------------------
// Integrity

class SigningKey {
 public:
  // Reads a PEM Ed25519 private key (PKCS#8, as `openssl genpkey -algorithm ed25519` or
  // `kilnd keygen` write it). InvalidArgument naming the file otherwise.
  static absl::StatusOr<std::unique_ptr<SigningKey>> FromPemFile(const std::string& path);
  ~SigningKey();

  // Sets result->signature to a signature over CanonicalResultBytes(handle, *result).
  absl::Status Sign(absl::string_view handle, v1::ActionResult* result) const;

  const std::string& key_id() const { return key_id_; }
  const std::string& raw_public_key() const { return raw_public_key_; }

 private:
  SigningKey() = default;
  ::evp_pkey_st* pkey_ = nullptr;
  std::string key_id_;
  std::string raw_public_key_;
};

// kilnd's side of integrity: the signing key plus the keys whose signatures it accepts on
// records read back from storage (its own, and the previous ones named by --trusted-keys while
// a rotation is under way). Reload() re-reads all the files; on error nothing changes.
class ResultSigner {
 public:
  static absl::StatusOr<std::unique_ptr<ResultSigner>> Load(std::string key_file,
                                                            std::vector<std::string> trusted);
  absl::Status Reload();

  absl::Status Sign(absl::string_view handle, v1::ActionResult* result) const;
  // The verification of records read back from a store (see TrustedKeys::VerifyResult).
  absl::Status VerifyStored(absl::string_view handle, const v1::ActionResult& result) const;
  std::string key_id() const;

 private:
  struct State;
  ResultSigner(std::string key_file, std::vector<std::string> trusted)
      : key_file_(std::move(key_file)), trusted_files_(std::move(trusted)) {}
  absl::StatusOr<std::shared_ptr<const State>> Read() const;
  std::shared_ptr<const State> Current() const;

  const std::string key_file_;
  const std::vector<std::string> trusted_files_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const State> state_ ABSL_GUARDED_BY(mu_);
};

// Writes a new Ed25519 key pair: the private key to `private_path` (PKCS#8 PEM, mode 0600,
// refusing to overwrite) and the public key to `public_path` (SubjectPublicKeyInfo PEM).
absl::Status WriteKeyPair(const std::string& private_path, const std::string& public_path);

}  // namespace kiln::auth
