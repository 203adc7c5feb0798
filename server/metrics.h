// MetricsServer: kilnd's Prometheus endpoint, a small HTTP server running beside gRPC.
//
// GET /metrics renders one stats snapshot (the same one GetStats answers with) in the
// Prometheus text exposition format, version 0.0.4. GET /healthz answers 200 "ok" while
// serving and 503 "draining" once SetDraining() was called, so a scraper or an HTTP-only
// load balancer sees the same lame-duck state as the gRPC health service. With an HTTPS setup
// function the endpoint speaks TLS only (cpp-httplib's SSLServer over OpenSSL); the function
// configures the server context (certificate, client verification), e.g. auth::TlsMaterial's
// ConfigureHttps, so certificates reload there without restarting the endpoint. Per-token
// counters are labelled with the token's name, never the token.
//
// Thread-safety: Start, Stop and the destructor are for one owner thread. SetDraining may be
// called from any thread. The snapshot function runs on the HTTP server's threads, possibly
// concurrently, until Stop() returns.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "kiln/v1/service.pb.h"

namespace httplib {
class Server;
}  // namespace httplib
struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace kiln::server {

// Returns the current counters; must be cheap and safe to call concurrently.
using StatsSnapshot = std::function<v1::GetStatsResponse()>;
// Configures the HTTPS server context; false refuses to start.
using HttpsSetup = std::function<bool(ssl_ctx_st* ctx)>;

// `stats` as a Prometheus text exposition (0.0.4) page, every metric with # HELP and # TYPE.
std::string RenderPrometheus(const v1::GetStatsResponse& stats);

class MetricsServer {
 public:
  explicit MetricsServer(StatsSnapshot snapshot);
  ~MetricsServer();  // Stop()

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Binds `address` (HOST:PORT, or [V6HOST]:PORT; port 0 lets the system choose) and serves
  // on a background thread, over HTTPS when `https` is given. Returns the bound port. May be
  // called once.
  absl::StatusOr<int> Start(const std::string& address, const HttpsSetup& https = nullptr);

  // /healthz turns to 503; /metrics keeps answering, so the drain itself can be watched.
  void SetDraining() { draining_.store(true, std::memory_order_relaxed); }

  // Stops accepting, waits for requests in progress and the serving thread. Idempotent.
  void Stop();

 private:
  const StatsSnapshot snapshot_;
  std::atomic<bool> draining_{false};
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
};

}  // namespace kiln::server
