#include "client/cpp/client.h"

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/key/digest.h"
#include "kernels/util/status_macros.h"
#include "wire/wire.h"

namespace kiln::client {
namespace {

// Large enough for any CompileResponse (plans and compile logs are small, but a failing
// compile's log can run to megabytes); artifacts themselves arrive in chunks.
constexpr int kMaxReceiveBytes = 64 << 20;

int ToMillis(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, 1 << 30));
}

std::string FromEnv(const std::string& value, const char* name) {
  if (!value.empty()) return value;
  const char* env = std::getenv(name);
  return env != nullptr ? env : "";
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const ClientOptions& options,
                                           std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
  // gRPC's own reconnect backoff starts at a second; while it waits, every call fails at once
  // with UNAVAILABLE, which would make our quicker retries useless. Keep the two in step.
  // (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is left alone: despite its name it bounds how long one
  // connection attempt may take, and a small value aborts handshakes with a busy daemon.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ToMillis(options.retry.initial_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ToMillis(options.retry.max_backoff));
  return grpc::CreateCustomChannel(address, credentials, args);
}

std::string ResolveAddress(const std::string& address) {
  if (!address.empty()) return address;
  if (const char* env = std::getenv("KILN_SERVER"); env != nullptr && *env != '\0') return env;
  return kDefaultServer;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  const std::string address = ResolveAddress(options.address);
  if (address.empty()) return absl::InvalidArgumentError("empty kiln server address");
  options.address = address;
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                        CredentialsFor(options));
  std::shared_ptr<grpc::Channel> channel = MakeChannel(address, options, std::move(credentials));
  return std::make_unique<Client>(std::move(channel), std::move(options));
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Client::CredentialsFor(
    const ClientOptions& options) {
  if (options.credentials != nullptr) return options.credentials;
  const std::string ca = FromEnv(options.tls_ca, "KILN_TLS_CA");
  const std::string cert = FromEnv(options.tls_cert, "KILN_TLS_CERT");
  const std::string key = FromEnv(options.tls_key, "KILN_TLS_KEY");
  if (ca.empty() && cert.empty() && key.empty()) return grpc::InsecureChannelCredentials();
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("a TLS client certificate needs its key, and the reverse");
  }
  grpc::SslCredentialsOptions ssl;
  if (!ca.empty()) {
    KILN_ASSIGN_OR_RETURN(ssl.pem_root_certs, wire::ReadSecretFile(ca, "TLS CA"));
  }
  if (!cert.empty()) {
    KILN_ASSIGN_OR_RETURN(ssl.pem_cert_chain, wire::ReadSecretFile(cert, "TLS certificate"));
    KILN_ASSIGN_OR_RETURN(ssl.pem_private_key, wire::ReadSecretFile(key, "TLS key"));
  }
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const std::string& address) {
  ClientOptions options;
  options.address = address;
  return Create(std::move(options));
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : address_(ResolveAddress(options.address)),
      options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::Kiln::NewStub(channel_)),
      authorization_([this] {
        const std::string token = FromEnv(options_.token, "KILN_TOKEN");
        return token.empty() ? std::string() : "Bearer " + token;
      }()) {}

absl::Time Client::Resolve(absl::Time deadline, absl::Duration default_timeout) const {
  return deadline == kDefaultDeadline ? absl::Now() + default_timeout : deadline;
}

absl::Status Client::WithRetries(absl::Time deadline,
                                 const std::function<absl::Status(grpc::ClientContext&)>& attempt,
                                 const std::function<bool()>& may_retry) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  const absl::Time start = absl::Now();
  absl::Status unreachable;  // the last UNAVAILABLE of this call, while the channel was not up
  for (int n = 1;; ++n) {
    grpc::ClientContext context;  // one per attempt: a context cannot be reused
    if (deadline != absl::InfiniteFuture()) context.set_deadline(absl::ToChronoTime(deadline));
    if (!authorization_.empty()) context.AddMetadata("authorization", authorization_);
    attempts_.fetch_add(1, std::memory_order_relaxed);
    if (n > 1) retries_.fetch_add(1, std::memory_order_relaxed);
    const absl::Status status = attempt(context);
    if (status.ok() || (may_retry && !may_retry())) return status;
    const std::optional<absl::Duration> wait =
        NextRetry(options_.retry, status, context, n, start, deadline);
    const bool connected = channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
    if (!wait) {
      // The caller's deadline ran out while retrying a daemon that could not be reached: the
      // cause is that it is unavailable, not that it was slow (whichever of the two the last
      // attempt happened to end with).
      const absl::Status& cause =
          absl::IsDeadlineExceeded(status) && !unreachable.ok() && !connected ? unreachable
                                                                              : status;
      if (n == 1) return cause;
      return absl::Status(cause.code(),
                          absl::StrCat(cause.message(), " (after ", n, " attempts, ",
                                       absl::FormatDuration(absl::Now() - start), ")"));
    }
    if (absl::IsUnavailable(status) && !connected) unreachable = status;
    if (!absl::IsUnavailable(status) || connected) {
      // Connected, so the daemon itself refused (store down, queue full): back off.
      absl::SleepFor(*wait);
    } else {
      // Not connected: wait for the channel instead of sleeping, which both drives the
      // reconnect (a sleeping thread polls nothing, and a blocked sync call may leave the
      // connection to gRPC's slow backup poller) and retries as soon as the daemon is back.
      channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + *wait));
    }
  }
}

template <typename Request, typename Response>
absl::StatusOr<Response> Client::CallUnary(
    grpc::Status (v1::Kiln::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    const Request& request, absl::Time deadline) {
  Response response;
  absl::Status status = WithRetries(deadline, [&](grpc::ClientContext& context) {
    return wire::FromGrpcStatus(((*stub_).*method)(&context, request, &response));
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::CompileResponse> Client::Compile(const v1::CompileRequest& request,
                                                    absl::Time deadline) {
  return CallUnary(&v1::Kiln::Stub::Compile, request, Resolve(deadline, options_.compile_timeout));
}

absl::StatusOr<v1::CompileResponse> Client::Compile(const v1::Graph& graph,
                                                    const v1::Target& target,
                                                    const v1::CompileOptions& options,
                                                    absl::Time deadline) {
  v1::CompileRequest request;
  *request.mutable_graph() = graph;
  *request.mutable_target() = target;
  *request.mutable_options() = options;
  return Compile(request, deadline);
}

absl::StatusOr<std::optional<v1::CompileResponse>> Client::Lookup(const v1::Graph& graph,
                                                                  const v1::Target& target,
                                                                  const v1::CompileOptions& options,
                                                                  absl::Time deadline) {
  v1::LookupRequest request;
  *request.mutable_graph() = graph;
  *request.mutable_target() = target;
  *request.mutable_options() = options;
  absl::StatusOr<v1::CompileResponse> response =
      CallUnary(&v1::Kiln::Stub::Lookup, request, Resolve(deadline, options_.timeout));
  if (absl::IsNotFound(response.status())) return std::nullopt;
  if (!response.ok()) return response.status();
  return *std::move(response);
}

absl::StatusOr<std::optional<v1::CompileResponse>> Client::LookupByKey(
    const std::string& request_key, absl::Time deadline) {
  v1::LookupRequest request;
  request.set_request_key(request_key);
  absl::StatusOr<v1::CompileResponse> response =
      CallUnary(&v1::Kiln::Stub::Lookup, request, Resolve(deadline, options_.timeout));
  if (absl::IsNotFound(response.status())) return std::nullopt;
  if (!response.ok()) return response.status();
  return *std::move(response);
}

absl::StatusOr<v1::CompileResponse> Client::GetResult(const std::string& handle,
                                                      absl::Time deadline) {
  v1::GetResultRequest request;
  request.set_handle(handle);
  return CallUnary(&v1::Kiln::Stub::GetResult, request, Resolve(deadline, options_.timeout));
}

absl::StatusOr<std::string> Client::FetchArtifact(const std::string& digest, absl::Time deadline) {
  if (!key::IsDigest(digest)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", digest, "' is not a lowercase hex SHA-256 digest"));
  }
  fetches_.fetch_add(1, std::memory_order_relaxed);
  v1::FetchArtifactRequest request;
  request.set_digest(digest);
  std::string bytes;
  absl::Status status =
      WithRetries(Resolve(deadline, options_.timeout), [&](grpc::ClientContext& context) {
        bytes.clear();
        std::unique_ptr<grpc::ClientReader<v1::ArtifactChunk>> reader =
            stub_->FetchArtifact(&context, request);
        v1::ArtifactChunk chunk;
        int64_t total = -1;
        absl::Status framing;
        while (reader->Read(&chunk)) {
          if (!framing.ok()) continue;  // drain, then report the first problem
          if (chunk.offset() != static_cast<int64_t>(bytes.size())) {
            framing = absl::DataLossError(absl::StrCat("artifact ", digest, ": chunk at offset ",
                                                       chunk.offset(), " after ", bytes.size(),
                                                       " bytes"));
            continue;
          }
          if (total >= 0 && chunk.total_size() != total) {
            framing = absl::DataLossError(
                absl::StrCat("artifact ", digest, ": total size changed mid-stream"));
            continue;
          }
          total = chunk.total_size();
          if (total < 0 || static_cast<int64_t>(bytes.size() + chunk.data().size()) > total) {
            framing = absl::DataLossError(
                absl::StrCat("artifact ", digest, ": more than ", total, " bytes sent"));
            continue;
          }
          bytes.append(chunk.data());
        }
        absl::Status finished = wire::FromGrpcStatus(reader->Finish());
        if (!finished.ok()) return finished;
        if (!framing.ok()) return framing;
        if (total >= 0 && static_cast<int64_t>(bytes.size()) != total) {
          return absl::DataLossError(
              absl::StrCat("artifact ", digest, ": got ", bytes.size(), " of ", total, " bytes"));
        }
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  if (const std::string got = key::Sha256Hex(bytes); got != digest) {
    return absl::DataLossError(absl::StrCat("artifact ", digest, " arrived with digest ", got));
  }
  fetched_bytes_.fetch_add(static_cast<int64_t>(bytes.size()), std::memory_order_relaxed);
  return bytes;
}

absl::StatusOr<v1::GetSourceResponse> Client::GetSource(const std::string& handle,
                                                        absl::Time deadline) {
  v1::GetSourceRequest request;
  request.set_handle(handle);
  return CallUnary(&v1::Kiln::Stub::GetSource, request, Resolve(deadline, options_.timeout));
}

absl::StatusOr<v1::GetStatsResponse> Client::GetStats(absl::Time deadline) {
  return CallUnary(&v1::Kiln::Stub::GetStats, v1::GetStatsRequest(),
                   Resolve(deadline, options_.timeout));
}

absl::Status Client::Prewarm(const std::vector<v1::CompileRequest>& requests,
                             const PrewarmCallback& on_event, absl::Time deadline) {
  bool any_event = false;
  return WithRetries(
      Resolve(deadline, options_.compile_timeout),
      [&](grpc::ClientContext& context) {
        std::unique_ptr<grpc::ClientReaderWriter<v1::CompileRequest, v1::PrewarmEvent>> stream =
            stub_->Prewarm(&context);
        // Writing from a second thread lets events be read (and reported) while requests are
        // still going out, so neither side's flow-control window can stall the other.
        std::thread writer([&] {
          for (const v1::CompileRequest& request : requests) {
            if (!stream->Write(request)) break;  // the call ended; Finish says why
          }
          stream->WritesDone();
        });
        v1::PrewarmEvent event;
        while (stream->Read(&event)) {
          any_event = true;
          if (on_event) on_event(event);
        }
        writer.join();
        return wire::FromGrpcStatus(stream->Finish());
      },
      // Once outcomes have been reported, replaying the stream would report them twice.
      [&] { return !any_event; });
}

ClientStats Client::stats() const {
  ClientStats s;
  s.calls = calls_.load(std::memory_order_relaxed);
  s.attempts = attempts_.load(std::memory_order_relaxed);
  s.retries = retries_.load(std::memory_order_relaxed);
  s.fetches = fetches_.load(std::memory_order_relaxed);
  s.fetched_bytes = fetched_bytes_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace kiln::client
