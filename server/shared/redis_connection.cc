#include "server/shared/redis_connection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln::shared {
namespace {

RedisReply Convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(Convert(r->element[i]));
      break;
    default:
      out.type = RedisReply::Type::kNil;
  }
  return out;
}

// The oldest error on this thread's OpenSSL queue (the queue is cleared), or `fallback`.
std::string SslError(absl::string_view fallback) {
  const unsigned long code = ERR_get_error();  // NOLINT(google-runtime-int): OpenSSL's type
  ERR_clear_error();
  if (code == 0) return std::string(fallback);
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

timeval AtLeastOneMs(absl::Duration d) {
  return absl::ToTimeval(std::max(d, absl::Milliseconds(1)));
}

bool SetTimeouts(int fd, absl::Duration timeout) {
  const timeval tv = AtLeastOneMs(timeout);
  return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0 &&
         setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0;
}

bool IsIpAddress(const std::string& host) {
  in6_addr addr;
  return inet_pton(AF_INET, host.c_str(), &addr) == 1 ||
         inet_pton(AF_INET6, host.c_str(), &addr) == 1;
}

// A TCP connection to one of `endpoint`'s addresses within `timeout`, blocking afterwards.
absl::StatusOr<int> ConnectTcp(const RedisEndpoint& endpoint, absl::Duration timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(endpoint.port);
  if (const int rc = getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", endpoint.ToString(), ": ", gai_strerror(rc)));
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ms =
          static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
      rc = poll(&p, 1, ms);
      if (rc == 0) {
        errno = ETIMEDOUT;
        rc = -1;
      } else if (rc > 0) {
        int error = 0;
        socklen_t len = sizeof(error);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
        errno = error;
        rc = error == 0 ? 0 : -1;
      }
    }
    if (rc != 0) {
      why = errno == ETIMEDOUT ? "connect timed out" : std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", endpoint.ToString(), ": ", why));
  }
  const int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// SSL_write and SSL_shutdown write to the socket with write(2), which raises SIGPIPE on a
// closed peer. This blocks SIGPIPE in the calling thread for the scope and discards one that
// the scope raised, so the write fails with EPIPE instead of ending kilnd.
class NoSigpipeScope {
 public:
  NoSigpipeScope() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~NoSigpipeScope() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{};
        sigtimedwait(&pipe_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  NoSigpipeScope(const NoSigpipeScope&) = delete;
  NoSigpipeScope& operator=(const NoSigpipeScope&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

}  // namespace

std::string RedisEndpoint::ToString() const { return absl::StrCat(host, ":", port); }

absl::StatusOr<std::shared_ptr<const RedisTls>> RedisTls::Create(const RedisTlsOptions& options) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return absl::InternalError(SslError("SSL_CTX_new failed"));
  std::shared_ptr<const RedisTls> tls(new RedisTls(ctx, options.server_name));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  const int loaded = options.ca_file.empty()
                         ? SSL_CTX_set_default_verify_paths(ctx)
                         : SSL_CTX_load_verify_locations(ctx, options.ca_file.c_str(), nullptr);
  if (loaded != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared cache TLS: cannot load the CA certificates",
                     options.ca_file.empty() ? "" : absl::StrCat(" from ", options.ca_file), ": ",
                     SslError("no certificate")));
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "shared cache TLS: a client certificate needs its key, and a key its certificate");
  }
  if (!options.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, options.cert_file.c_str()) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("shared cache TLS: cannot use certificate ",
                                                     options.cert_file, ": ", SslError("")));
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, options.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("shared cache TLS: cannot use key ",
                                                     options.key_file, " with ", options.cert_file,
                                                     ": ", SslError("")));
    }
  }
  return tls;
}

RedisTls::~RedisTls() { SSL_CTX_free(ctx_); }

RedisConnection::RedisConnection(int fd, const RedisEndpoint& endpoint)
    : fd_(fd), reader_(redisReaderCreate()), endpoint_(endpoint) {}

RedisConnection::~RedisConnection() {
  if (ssl_ != nullptr) {
    if (!broken_) {
      NoSigpipeScope no_sigpipe;
      SSL_shutdown(ssl_);  // close_notify, best effort; the socket closes either way
    }
    SSL_free(ssl_);
  }
  if (reader_ != nullptr) redisReaderFree(reader_);
  close(fd_);
}

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisConnection::Open(
    const RedisEndpoint& endpoint, const RedisTls* tls, absl::Duration connect_timeout,
    absl::Duration command_timeout) {
  absl::StatusOr<int> fd = ConnectTcp(endpoint, connect_timeout);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<RedisConnection> conn(new RedisConnection(*fd, endpoint));
  if (conn->reader_ == nullptr) return absl::ResourceExhaustedError("out of memory");
  if (tls != nullptr) {
    if (!SetTimeouts(*fd, connect_timeout)) return conn->Fail("setsockopt");
    if (absl::Status s = conn->Handshake(*tls); !s.ok()) return s;
  }
  if (!SetTimeouts(*fd, command_timeout)) return conn->Fail("setsockopt");
  return conn;
}

absl::Status RedisConnection::Handshake(const RedisTls& tls) {
  ssl_ = SSL_new(tls.context());
  if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1) {
    broken_ = true;
    return absl::UnavailableError(
        absl::StrCat("TLS to ", endpoint_.ToString(), ": ", SslError("cannot make a session")));
  }
  const std::string& name = tls.server_name().empty() ? endpoint_.host : tls.server_name();
  if (IsIpAddress(name)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), name.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl_, name.c_str());  // SNI
    SSL_set1_host(ssl_, name.c_str());
  }
  NoSigpipeScope no_sigpipe;
  ERR_clear_error();
  if (SSL_connect(ssl_) != 1) {
    broken_ = true;
    const long verify = SSL_get_verify_result(ssl_);  // NOLINT(google-runtime-int)
    const int error = errno;
    std::string why;
    if (verify != X509_V_OK) {
      why = absl::StrCat("the server's certificate is not trusted for '", name,
                         "': ", X509_verify_cert_error_string(verify));
    } else if (ERR_peek_error() != 0) {
      why = SslError("");
    } else {
      // No TLS answer at all: a plaintext Redis reads the ClientHello as a command and waits.
      why = absl::StrCat(error == EAGAIN || error == EWOULDBLOCK ? "no answer in time"
                         : error != 0                            ? std::strerror(error)
                                      : "the server closed the connection",
                         " (does this port serve TLS?)");
    }
    return absl::UnavailableError(
        absl::StrCat("TLS handshake with ", endpoint_.ToString(), " failed: ", why));
  }
  return absl::OkStatus();
}

absl::Status RedisConnection::Fail(absl::string_view what) {
  broken_ = true;
  const bool timed_out = errno == EAGAIN || errno == EWOULDBLOCK;
  return absl::UnavailableError(absl::StrCat(endpoint_.ToString(), ": ", what, ": ",
                                             timed_out ? "timed out" : std::strerror(errno)));
}

absl::Status RedisConnection::SendAll(const char* data, size_t size) {
  while (size > 0) {
    ssize_t n;
    if (ssl_ != nullptr) {
      NoSigpipeScope no_sigpipe;
      ERR_clear_error();
      errno = 0;
      n = SSL_write(ssl_, data, static_cast<int>(std::min<size_t>(size, 1 << 30)));
      if (n <= 0) {
        const int error = SSL_get_error(ssl_, static_cast<int>(n));
        if (error != SSL_ERROR_SYSCALL) {
          broken_ = true;
          return absl::UnavailableError(
              absl::StrCat(endpoint_.ToString(), ": TLS write: ", SslError("failed")));
        }
        return Fail("send");
      }
    } else {
      n = send(fd_, data, size, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Fail("send");
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> RedisConnection::Receive(char* buf, size_t size) {
  for (;;) {
    ssize_t n;
    if (ssl_ != nullptr) {
      ERR_clear_error();
      errno = 0;
      n = SSL_read(ssl_, buf, static_cast<int>(size));
      if (n <= 0) {
        const int error = SSL_get_error(ssl_, static_cast<int>(n));
        if (error == SSL_ERROR_ZERO_RETURN) {
          broken_ = true;
          return absl::UnavailableError(
              absl::StrCat(endpoint_.ToString(), ": the server closed the connection"));
        }
        if (error != SSL_ERROR_SYSCALL && error != SSL_ERROR_WANT_READ) {
          broken_ = true;
          return absl::UnavailableError(
              absl::StrCat(endpoint_.ToString(), ": TLS read: ", SslError("failed")));
        }
        if (errno == 0) errno = error == SSL_ERROR_WANT_READ ? EAGAIN : ECONNRESET;
        return Fail("receive");
      }
    } else {
      n = recv(fd_, buf, size, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) {
        broken_ = true;
        return absl::UnavailableError(
            absl::StrCat(endpoint_.ToString(), ": the server closed the connection"));
      }
      if (n < 0) return Fail("receive");
    }
    return static_cast<size_t>(n);
  }
}

absl::StatusOr<RedisReply> RedisConnection::Execute(const std::vector<absl::string_view>& args) {
  if (broken_) return absl::UnavailableError(absl::StrCat(endpoint_.ToString(), ": broken"));
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (absl::string_view a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  char* command = nullptr;
  const int length =
      redisFormatCommandArgv(&command, static_cast<int>(argv.size()), argv.data(), lens.data());
  if (length < 0) return absl::ResourceExhaustedError("out of memory formatting a command");
  absl::Status sent = SendAll(command, static_cast<size_t>(length));
  redisFreeCommand(command);
  if (!sent.ok()) return sent;

  void* raw = nullptr;
  char buf[16384];
  while (raw == nullptr) {
    if (redisReaderGetReply(reader_, &raw) != REDIS_OK) {
      broken_ = true;
      return absl::UnavailableError(
          absl::StrCat(endpoint_.ToString(), ": malformed reply: ", reader_->errstr));
    }
    if (raw != nullptr) break;
    absl::StatusOr<size_t> got = Receive(buf, sizeof(buf));
    if (!got.ok()) return got.status();
    if (redisReaderFeed(reader_, buf, *got) != REDIS_OK) {
      broken_ = true;
      return absl::ResourceExhaustedError("out of memory reading a reply");
    }
  }
  auto* r = static_cast<redisReply*>(raw);
  absl::StatusOr<RedisReply> out;
  if (r->type == REDIS_REPLY_ERROR) {
    out = absl::FailedPreconditionError(std::string(r->str, r->len));
  } else {
    out = Convert(r);
  }
  freeReplyObject(r);
  return out;
}

}  // namespace kiln::shared
