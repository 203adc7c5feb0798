#include "server/metrics.h"

#include <chrono>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "httplib.h"

namespace kiln::server {
namespace {

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// Scrapes are rare (every few seconds) and tiny: two threads are plenty, and a busy scraper
// cannot take threads the daemon needs for compiles.
constexpr size_t kHttpThreads = 2;

void AppendMetric(std::string* out, const char* name, const char* type, const char* help,
                  const std::string& value) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ",
                  value, "\n");
}

void AppendCounter(std::string* out, const char* name, const char* help, int64_t value) {
  AppendMetric(out, name, "counter", help, absl::StrCat(value));
}

void AppendGauge(std::string* out, const char* name, const char* help, int64_t value) {
  AppendMetric(out, name, "gauge", help, absl::StrCat(value));
}

// The shared (Redis) tier: counters, reachability and the latency histogram.
void AppendSharedTier(std::string* out, const v1::SharedCacheStats& sh) {
  AppendGauge(out, "kiln_shared_up", "1 while the shared cache tier (Redis) is reachable.",
              sh.available() ? 1 : 0);
  AppendCounter(out, "kiln_shared_hits_total",
                "Result lookups found complete and verified in the shared tier.", sh.hits());
  AppendCounter(out, "kiln_shared_misses_total", "Result lookups the shared tier missed.",
                sh.misses());
  AppendCounter(out, "kiln_shared_errors_total",
                "Shared-tier calls that failed (timeouts, unreachable, error replies).",
                sh.errors());
  AppendCounter(out, "kiln_shared_corruptions_total",
                "Shared-tier values that failed verification (never served).", sh.corruptions());
  AppendCounter(out, "kiln_shared_incomplete_total",
                "Shared-tier results missed because a blob they name was evicted.",
                sh.incomplete());
  AppendCounter(out, "kiln_shared_read_bytes_total", "Bytes read from the shared tier.",
                sh.bytes_read());
  AppendCounter(out, "kiln_shared_written_bytes_total", "Bytes written to the shared tier.",
                sh.bytes_written());
  AppendCounter(out, "kiln_shared_outages_total",
                "Times a shared-tier node went from reachable to unreachable.", sh.outages());
  AppendGauge(out, "kiln_shared_nodes_down",
              "Shared-tier (Redis) nodes unreachable now; a cluster serves the others' slots.",
              sh.nodes_down());
  AppendCounter(out, "kiln_shared_leases_taken_total",
                "Compiles run holding the cluster-wide lease.", sh.leases_taken());
  AppendCounter(out, "kiln_shared_leases_waited_total",
                "Jobs that waited on another replica's lease.", sh.leases_waited());
  AppendCounter(out, "kiln_shared_leases_expired_total",
                "Leases taken over after the holder's ran out.", sh.leases_expired());
  AppendCounter(out, "kiln_shared_leases_done_elsewhere_total",
                "Lease waits that ended with another replica's result.",
                sh.leases_done_elsewhere());
  AppendCounter(out, "kiln_shared_lease_errors_total",
                "Lease calls that failed or leases lost while compiling.", sh.lease_errors());
  const char* name = "kiln_shared_latency_seconds";
  absl::StrAppend(out, "# HELP ", name, " Latency of shared-tier operations.\n# TYPE ", name,
                  " histogram\n");
  int64_t cumulative = 0;
  for (int i = 0; i < sh.latency_counts_size(); ++i) {
    cumulative += sh.latency_counts(i);
    const std::string le = i < sh.latency_bounds_s_size()
                               ? absl::StrFormat("%g", sh.latency_bounds_s(i))
                               : std::string("+Inf");
    absl::StrAppend(out, name, "_bucket{le=\"", le, "\"} ", cumulative, "\n");
  }
  absl::StrAppend(out, name, "_sum ", absl::StrFormat("%.6f", sh.latency_sum_s()), "\n", name,
                  "_count ", cumulative, "\n");
}

// A label value with \, " and newlines escaped, as the exposition format asks.
std::string LabelValue(const std::string& raw) {
  std::string out;
  for (char c : raw) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

// One metric with a sample per token, labelled by the token's name and role.
void AppendPerToken(std::string* out, const char* name, const char* type, const char* help,
                    const v1::GetStatsResponse& s, int64_t (v1::TokenStats::*field)() const) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  for (const v1::TokenStats& t : s.tokens()) {
    absl::StrAppend(out, name, "{token=\"", LabelValue(t.name()), "\",role=\"",
                    LabelValue(t.role()), "\"} ", (t.*field)(), "\n");
  }
}

}  // namespace

std::string RenderPrometheus(const v1::GetStatsResponse& s) {
  std::string out;
  AppendCounter(&out, "kiln_requests_total", "Compile, prewarm and lookup requests received.",
                s.requests());
  AppendCounter(&out, "kiln_cache_hits_total", "Requests answered from the cache.", s.cache_hits());
  AppendCounter(&out, "kiln_compiles_total", "Jobs that ran the compiler.", s.compiles());
  AppendCounter(&out, "kiln_compile_failures_total", "Jobs whose compile failed.",
                s.compile_failures());
  AppendCounter(&out, "kiln_joined_in_flight_total",
                "Requests that waited on an identical job already in flight.",
                s.joined_in_flight());
  AppendCounter(&out, "kiln_negative_hits_total",
                "Requests answered from the compile failure cache.", s.negative_hits());
  AppendCounter(&out, "kiln_rejected_total", "Requests refused because the queue was full.",
                s.rejected());
  AppendGauge(&out, "kiln_queue_depth", "Compile jobs waiting for a worker.", s.queue_depth());
  AppendGauge(&out, "kiln_in_flight", "Compile jobs running now.", s.in_flight());
  AppendGauge(&out, "kiln_workers", "Compile worker threads.", s.workers());
  // %g-style formatting would round a long uptime to six digits; three decimals keep
  // millisecond resolution.
  AppendMetric(&out, "kiln_uptime_seconds", "gauge", "Seconds since kilnd started.",
               absl::StrFormat("%.3f", s.uptime_s()));
  const v1::StoreStats& st = s.store();
  AppendCounter(&out, "kiln_store_hits_total", "Result lookups found in the store.", st.hits());
  AppendCounter(&out, "kiln_store_misses_total", "Result lookups not found in the store.",
                st.misses());
  AppendGauge(&out, "kiln_store_bytes", "Bytes of results and artifacts held in the store.",
              st.bytes());
  AppendGauge(&out, "kiln_store_entries", "Results held in the store.", st.entries());
  AppendCounter(&out, "kiln_store_evictions_total",
                "Results evicted to stay within the byte budget.", st.evictions());
  AppendCounter(&out, "kiln_store_corruptions_total", "Store records that failed verification.",
                st.corruptions());
  AppendGauge(&out, "kiln_store_capacity_bytes", "Byte budget of the store; 0 is unlimited.",
              st.capacity_bytes());
  AppendGauge(&out, "kiln_store_writes_suspended",
              "1 while the store keeps new results in memory because the disk refused a write.",
              st.writes_suspended() ? 1 : 0);
  AppendCounter(&out, "kiln_store_write_errors_total", "Store writes the disk refused.",
                st.write_errors());
  AppendCounter(&out, "kiln_store_unpersisted_total",
                "Results kept in memory only, because writes were suspended.",
                st.unpersisted_puts());
  AppendCounter(&out, "kiln_store_write_resumes_total",
                "Times the store resumed writing after a suspension.", st.write_resumes());
  AppendCounter(&out, "kiln_worker_crashes_total",
                "Compile worker processes that died during a compile.", s.worker_crashes());
  AppendCounter(&out, "kiln_worker_timeouts_total",
                "Compile worker processes killed for running past the time limit.",
                s.worker_timeouts());
  AppendCounter(&out, "kiln_worker_cancels_total",
                "Compile worker processes killed because nobody waited for their compile.",
                s.worker_cancels());
  AppendCounter(&out, "kiln_worker_restarts_total",
                "Compile worker processes started to replace lost ones.", s.worker_restarts());
  AppendCounter(&out, "kiln_ext_builds_total",
                "Custom builds (extensions, raw kernels) run in the sandbox.", s.ext_builds());
  AppendCounter(&out, "kiln_ext_failures_total",
                "Custom builds that failed (compiler errors, limits).", s.ext_failures());
  AppendCounter(&out, "kiln_ext_cache_hits_total", "Custom builds answered from the cache.",
                s.ext_cache_hits());
  if (s.shared().enabled()) AppendSharedTier(&out, s.shared());
  if (s.tokens_size() > 0) {
    AppendCounter(&out, "kiln_unauthenticated_total",
                  "Calls refused for a missing or unknown bearer token.", s.unauthenticated());
    AppendPerToken(&out, "kiln_token_requests_total", "counter", "Calls allowed, by token name.", s,
                   &v1::TokenStats::requests);
    AppendPerToken(&out, "kiln_token_denied_total", "counter",
                   "Calls refused for too small a role, by token name.", s,
                   &v1::TokenStats::denied);
    AppendPerToken(&out, "kiln_token_compiles_in_flight", "gauge",
                   "Compiles running for each token.", s, &v1::TokenStats::compiles_in_flight);
    AppendPerToken(&out, "kiln_token_limited_total", "counter",
                   "Compiles refused by a token's in-flight limit.", s, &v1::TokenStats::limited);
  }
  return out;
}

MetricsServer::MetricsServer(StatsSnapshot snapshot) : snapshot_(std::move(snapshot)) {}

MetricsServer::~MetricsServer() { Stop(); }

absl::StatusOr<int> MetricsServer::Start(const std::string& address, const HttpsSetup& https) {
  if (http_ != nullptr) return absl::FailedPreconditionError("the metrics server is started");
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "' is not HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }

  std::unique_ptr<httplib::Server> http;
  if (https) {
    http = std::make_unique<httplib::SSLServer>([&https](SSL_CTX& ctx) { return https(&ctx); });
    if (!http->is_valid()) {
      return absl::InvalidArgumentError("cannot set up TLS for the metrics endpoint");
    }
  } else {
    http = std::make_unique<httplib::Server>();
  }
  http->new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
  // Short keep-alive: Stop() waits for open connections, and shutdown must not stall on an
  // idle scraper connection.
  http->set_keep_alive_timeout(1);
  http->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderPrometheus(snapshot_()), kContentType);
  });
  http->Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_.load(std::memory_order_relaxed)) {
      res.status = 503;
      res.set_content("draining", "text/plain");
    } else {
      res.set_content("ok", "text/plain");
    }
  });

  int bound = port;
  if (port == 0) {
    bound = http->bind_to_any_port(host);
  } else if (!http->bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  http_ = std::move(http);
  thread_ = std::thread([server = http_.get()] { server->listen_after_bind(); });
  // stop() only takes effect once the loop runs: wait for it, or an early Stop() would hang.
  while (!http_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return bound;
}

void MetricsServer::Stop() {
  if (http_ == nullptr) return;
  http_->stop();
  if (thread_.joinable()) thread_.join();
  http_.reset();
}

}  // namespace kiln::server
