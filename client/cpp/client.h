// Client: a typed wrapper over the kiln.v1.Kiln service, for C++ programs and the `kiln` CLI.
//
// Every call has a deadline that covers all of its attempts, and is retried as RetryPolicy says
// (retry.h, client/RETRY.md: UNAVAILABLE for a few seconds, an overloaded daemon's
// RESOURCE_EXHAUSTED while the deadline allows, nothing else).
// Errors come back as absl::Status with the server's code and message (grpc_status.h).
//
// FetchArtifact reassembles the chunk stream and checks the SHA-256 of the bytes against the
// digest asked for, so a caller never holds bytes that are not what the digest names.
//
// Transport and identity: with a CA (ClientOptions.tls_ca or $KILN_TLS_CA) the channel speaks
// TLS, presenting a client certificate when tls_cert/tls_key ($KILN_TLS_CERT, $KILN_TLS_KEY)
// are given (mTLS); a token ($KILN_TOKEN) is sent on every call as `authorization: Bearer`.
//
// Thread-safety: thread-safe; one Client (one channel) is meant to be shared by all threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cpp/retry.h"
#include "grpcpp/grpcpp.h"
#include "kiln/v1/service.grpc.pb.h"

namespace kiln::client {

// The daemon's address when none is given: $KILN_SERVER, else this.
inline constexpr char kDefaultServer[] = "localhost:50051";

struct ClientOptions {
  // host:port; empty means $KILN_SERVER, else kDefaultServer.
  std::string address;
  // Null means: TLS when tls_ca is set (or $KILN_TLS_CA), else insecure (plaintext).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // PEM files: the CA that signed the daemon's certificate, and for mTLS this client's
  // certificate chain and key. Empty: $KILN_TLS_CA, $KILN_TLS_CERT, $KILN_TLS_KEY.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // Bearer token sent with every call; empty: $KILN_TOKEN (none when that is unset too).
  std::string token;
  // Deadlines of calls that do not name one. Compile and Prewarm may run the compiler, so they
  // get longer.
  absl::Duration compile_timeout = absl::Minutes(10);
  absl::Duration timeout = absl::Minutes(1);
  RetryPolicy retry;
};

// Counts of what this client did, for tests, the CLI's summary and logs.
struct ClientStats {
  int64_t calls = 0;          // public calls made
  int64_t attempts = 0;       // RPC attempts, retries included
  int64_t retries = 0;        // attempts after the first
  int64_t fetches = 0;        // FetchArtifact calls
  int64_t fetched_bytes = 0;  // bytes received by successful fetches
};

class Client {
 public:
  // Passed as a deadline: "the client's default timeout for this kind of call, from now".
  static constexpr absl::Time kDefaultDeadline = absl::InfinitePast();

  // Makes a channel to `options.address` (or the default); connects lazily, so this succeeds
  // even when no daemon is up yet. InvalidArgument for an empty resolved address.
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options = {});
  static absl::StatusOr<std::unique_ptr<Client>> Create(const std::string& address);
  // A client over an existing channel (tests, or programs that share a channel).
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options);

  // The channel credentials `options` ask for (see ClientOptions): NotFound naming a PEM file
  // that cannot be read, InvalidArgument for a certificate given without its key.
  static absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> CredentialsFor(
      const ClientOptions& options);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Get-or-compile. The response carries the handle, the artifacts (kind, digest, size), the
  // launch plan and whether it was a cache hit. A bad graph is InvalidArgument naming the node.
  absl::StatusOr<v1::CompileResponse> Compile(const v1::CompileRequest& request,
                                              absl::Time deadline = kDefaultDeadline);
  absl::StatusOr<v1::CompileResponse> Compile(const v1::Graph& graph, const v1::Target& target,
                                              const v1::CompileOptions& options = {},
                                              absl::Time deadline = kDefaultDeadline);

  // Cache only: nullopt on a miss, never a compile.
  absl::StatusOr<std::optional<v1::CompileResponse>> Lookup(const v1::Graph& graph,
                                                            const v1::Target& target,
                                                            const v1::CompileOptions& options = {},
                                                            absl::Time deadline = kDefaultDeadline);

  // Cache only, by request key (wire::RequestKey of graph, target and options): nullopt when the
  // daemon has not seen the request or no longer has its result. Never sends the graph.
  absl::StatusOr<std::optional<v1::CompileResponse>> LookupByKey(
      const std::string& request_key, absl::Time deadline = kDefaultDeadline);

  // The stored result for a handle; NotFound when it is not (or no longer) cached.
  absl::StatusOr<v1::CompileResponse> GetResult(const std::string& handle,
                                                absl::Time deadline = kDefaultDeadline);

  // The bytes of an artifact, reassembled from the stream and verified: DataLoss when the
  // chunks do not line up or the SHA-256 of the bytes is not `digest`.
  // REQUIRES: `digest` is lowercase hex SHA-256 (InvalidArgument otherwise).
  absl::StatusOr<std::string> FetchArtifact(const std::string& digest,
                                            absl::Time deadline = kDefaultDeadline);

  // Generated source and fusion report for a handle.
  absl::StatusOr<v1::GetSourceResponse> GetSource(const std::string& handle,
                                                  absl::Time deadline = kDefaultDeadline);

  absl::StatusOr<v1::GetStatsResponse> GetStats(absl::Time deadline = kDefaultDeadline);

  // Streams `requests` to the daemon at prewarm priority and calls `on_event` once per
  // outcome, in the order they complete (PrewarmEvent.index says which request), on the
  // calling thread. The returned status is the stream's; per-request failures arrive as events
  // (see FromWireCode). The stream is retried on UNAVAILABLE only while no event has arrived.
  using PrewarmCallback = std::function<void(const v1::PrewarmEvent& event)>;
  absl::Status Prewarm(const std::vector<v1::CompileRequest>& requests,
                       const PrewarmCallback& on_event, absl::Time deadline = kDefaultDeadline);

  const std::string& address() const { return address_; }
  ClientStats stats() const;

 private:
  // Runs `attempt` until it succeeds, NextRetry (retry.h) says to give up, or `may_retry`
  // (when given) says no.
  absl::Status WithRetries(absl::Time deadline,
                           const std::function<absl::Status(grpc::ClientContext&)>& attempt,
                           const std::function<bool()>& may_retry = nullptr);
  absl::Time Resolve(absl::Time deadline, absl::Duration default_timeout) const;
  // One unary RPC through WithRetries: `method` is the stub's synchronous call.
  template <typename Request, typename Response>
  absl::StatusOr<Response> CallUnary(grpc::Status (v1::Kiln::Stub::*method)(grpc::ClientContext*,
                                                                            const Request&,
                                                                            Response*),
                                     const Request& request, absl::Time deadline);

  // Immutable after construction.
  const std::string address_;
  const ClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Kiln::Stub> stub_;
  const std::string authorization_;  // "Bearer TOKEN", or empty

  // Counters; relaxed atomics, read together only for reporting.
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> attempts_{0};
  std::atomic<int64_t> retries_{0};
  std::atomic<int64_t> fetches_{0};
  std::atomic<int64_t> fetched_bytes_{0};
};

}  // namespace kiln::client
