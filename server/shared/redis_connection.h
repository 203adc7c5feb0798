// RedisConnection: one connection to one Redis server node, in plaintext or over TLS, speaking
// RESP. RedisClient pools these; nothing else uses them.
//
// The socket and TLS are kiln's own (POSIX sockets and OpenSSL); hiredis only formats commands
// and parses replies (redisFormatCommandArgv, redisReader). Debian 12's hiredis (0.14) has no
// TLS, and managed Redis services require it, so the transport cannot be hiredis's.
//
// Every step is bounded: the TCP connect and the TLS handshake by the connect timeout, each
// send and receive by the command timeout (SO_SNDTIMEO / SO_RCVTIMEO). Any I/O error leaves the
// connection broken(): its caller must drop it, as a late reply may still be on the wire.
//
// TLS verifies the server's certificate chain against the given CA file (the system's CAs when
// none is given) and its name: the server name given, else the host the connection was made to
// (a DNS name or an IP address, matched against the certificate's subjectAltName). A client
// certificate is presented when one is given (Redis's `tls-auth-clients yes`). Writes never
// raise SIGPIPE in kilnd: a peer that went away is an error reply, not a signal.
//
// Thread-safety: RedisTls is immutable and shared; a RedisConnection has one user at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

struct ssl_ctx_st;
struct ssl_st;
struct redisReader;

namespace kiln::shared {

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  std::string ToString() const;
};

// A reply copied out of hiredis. Error replies never appear here: they are statuses.
struct RedisReply {
  enum class Type { kNil, kString, kInteger, kArray, kStatus };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus
  int64_t integer = 0;
  std::vector<RedisReply> elements;  // kArray
  bool is_nil() const { return type == Type::kNil; }
};

// What TLS to the Redis servers uses. Files are PEM.
struct RedisTlsOptions {
  bool enabled = false;     // rediss:// or rediss-cluster://
  std::string ca_file;      // empty: the system's trusted CAs
  std::string cert_file;    // client certificate (chain); empty: none
  std::string key_file;     // its private key; REQUIRES: set exactly when cert_file is
  std::string server_name;  // the name every server's certificate must carry; empty: its host
};

// An OpenSSL client context made from RedisTlsOptions, shared by every connection of a client.
class RedisTls {
 public:
  // InvalidArgument naming the file and OpenSSL's reason when a file cannot be used.
  static absl::StatusOr<std::shared_ptr<const RedisTls>> Create(const RedisTlsOptions& options);
  ~RedisTls();
  RedisTls(const RedisTls&) = delete;
  RedisTls& operator=(const RedisTls&) = delete;

  ssl_ctx_st* context() const { return ctx_; }
  const std::string& server_name() const { return server_name_; }

 private:
  RedisTls(ssl_ctx_st* ctx, std::string server_name)
      : ctx_(ctx), server_name_(std::move(server_name)) {}
  ssl_ctx_st* const ctx_;
  const std::string server_name_;
};

class RedisConnection {
 public:
  // Connects (and, with `tls`, handshakes) within `connect_timeout`. Unavailable naming the
  // endpoint and the reason (refused, timed out, certificate not trusted, ...) otherwise.
  static absl::StatusOr<std::unique_ptr<RedisConnection>> Open(const RedisEndpoint& endpoint,
                                                               const RedisTls* tls,
                                                               absl::Duration connect_timeout,
                                                               absl::Duration command_timeout);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends one command and reads its reply. An error reply is FailedPrecondition with Redis's
  // message; an I/O failure or a timeout is Unavailable and makes the connection broken().
  absl::StatusOr<RedisReply> Execute(const std::vector<absl::string_view>& args);

  bool broken() const { return broken_; }

 private:
  RedisConnection(int fd, const RedisEndpoint& endpoint);
  absl::Status Handshake(const RedisTls& tls);
  absl::Status SendAll(const char* data, size_t size);
  // Bytes received into `buf` (> 0), or Unavailable (closed by the peer, timed out, reset).
  absl::StatusOr<size_t> Receive(char* buf, size_t size);
  absl::Status Fail(absl::string_view what);

  int fd_;
  ssl_st* ssl_ = nullptr;
  redisReader* reader_;
  RedisEndpoint endpoint_;
  bool broken_ = false;
};

}  // namespace kiln::shared
