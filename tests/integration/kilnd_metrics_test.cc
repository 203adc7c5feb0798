// kilnd's Prometheus endpoint, through the real binary: with --metrics-listen 127.0.0.1:0 it
// prints the bound address, /metrics reflects a compile and a repeat (hit) done over gRPC in
// the text exposition format, /healthz says ok, and SIGTERM still exits 0.
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/integration/kilnd_process.h"
#include "tests/integration/wire_graph.h"

namespace kiln::testing {
namespace {

std::string MakeTempDir(const char* what) {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / (std::string(what) + "-XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

grpc::Status CompileOnce(v1::Kiln::Stub& stub, const v1::CompileRequest& req,
                         v1::CompileResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  return stub.Compile(&ctx, req, resp);
}

// "kilnd metrics on HOST:PORT" from kilnd's startup output -> {HOST, PORT}; port 0 if absent.
std::pair<std::string, int> MetricsAddress(const std::string& output) {
  const std::string marker = "kilnd metrics on ";
  const size_t at = output.find(marker);
  if (at == std::string::npos) return {"", 0};
  const size_t eol = output.find('\n', at);
  const std::string address = output.substr(at + marker.size(), eol - at - marker.size());
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return {"", 0};
  return {address.substr(0, colon), std::atoi(address.c_str() + colon + 1)};
}

// Sample lines of an exposition page: metric name -> value. Comment lines are skipped.
std::map<std::string, double> Samples(const std::string& page) {
  std::map<std::string, double> out;
  std::istringstream lines(page);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    out[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return out;
}

TEST(KilndMetricsTest, ScrapeAfterCompileAndHit) {
  const std::string dir = MakeTempDir("kiln-metrics-it");
  ASSERT_FALSE(dir.empty());
  {
    KilndProcess kilnd;
    ASSERT_EQ(kilnd.Start(dir + "/cache", {"--metrics-listen=127.0.0.1:0"}), "");
    const auto [host, port] = MetricsAddress(kilnd.startup_output());
    ASSERT_EQ(host, "127.0.0.1") << kilnd.startup_output();
    ASSERT_GT(port, 0) << kilnd.startup_output();

    auto stub = kilnd.Stub();
    const v1::CompileRequest request = MakeRequest(SinCosGraph(256));
    v1::CompileResponse first;
    grpc::Status s = CompileOnce(*stub, request, &first);
    ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
    EXPECT_FALSE(first.cache_hit());
    v1::CompileResponse again;
    ASSERT_TRUE(CompileOnce(*stub, request, &again).ok());
    EXPECT_TRUE(again.cache_hit());

    httplib::Client http(host, port);
    http.set_connection_timeout(10);
    http.set_read_timeout(10);

    httplib::Result metrics = http.Get("/metrics");
    ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
    EXPECT_EQ(metrics->status, 200);
    EXPECT_EQ(metrics->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u)
        << metrics->get_header_value("Content-Type");
    const std::string& page = metrics->body;
    const std::map<std::string, double> samples = Samples(page);
    EXPECT_EQ(samples.at("kiln_compiles_total"), 1) << page;
    EXPECT_GE(samples.at("kiln_cache_hits_total"), 1) << page;
    EXPECT_GE(samples.at("kiln_requests_total"), 2) << page;
    EXPECT_EQ(samples.at("kiln_store_entries"), 1) << page;
    EXPECT_GT(samples.at("kiln_workers"), 0) << page;

    // Every metric the endpoint promises, each with its HELP and TYPE lines.
    const std::pair<const char*, const char*> kMetrics[] = {
        {"kiln_requests_total", "counter"},
        {"kiln_cache_hits_total", "counter"},
        {"kiln_compiles_total", "counter"},
        {"kiln_compile_failures_total", "counter"},
        {"kiln_joined_in_flight_total", "counter"},
        {"kiln_negative_hits_total", "counter"},
        {"kiln_rejected_total", "counter"},
        {"kiln_queue_depth", "gauge"},
        {"kiln_in_flight", "gauge"},
        {"kiln_workers", "gauge"},
        {"kiln_uptime_seconds", "gauge"},
        {"kiln_store_hits_total", "counter"},
        {"kiln_store_misses_total", "counter"},
        {"kiln_store_bytes", "gauge"},
        {"kiln_store_entries", "gauge"},
        {"kiln_store_evictions_total", "counter"},
        {"kiln_store_corruptions_total", "counter"},
        {"kiln_store_capacity_bytes", "gauge"},
        {"kiln_store_writes_suspended", "gauge"},
        {"kiln_store_write_errors_total", "counter"},
        {"kiln_store_unpersisted_total", "counter"},
        {"kiln_store_write_resumes_total", "counter"},
        {"kiln_worker_crashes_total", "counter"},
        {"kiln_worker_timeouts_total", "counter"},
        {"kiln_worker_cancels_total", "counter"},
        {"kiln_worker_restarts_total", "counter"},
        {"kiln_ext_builds_total", "counter"},
        {"kiln_ext_failures_total", "counter"},
        {"kiln_ext_cache_hits_total", "counter"},
    };
    const std::string text = "\n" + page;  // every line, the first too, follows a newline
    for (const auto& [name, type] : kMetrics) {
      EXPECT_NE(text.find(std::string("\n# HELP ") + name + " "), std::string::npos) << name;
      EXPECT_NE(text.find(std::string("\n# TYPE ") + name + " " + type + "\n"), std::string::npos)
          << name;
      EXPECT_EQ(samples.count(name), 1u) << name;
    }

    httplib::Result health = http.Get("/healthz");
    ASSERT_TRUE(health) << httplib::to_string(health.error());
    EXPECT_EQ(health->status, 200);
    EXPECT_EQ(health->body, "ok");

    EXPECT_EQ(kilnd.Stop(SIGTERM), 0) << "kilnd must exit 0 on SIGTERM";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln::testing
