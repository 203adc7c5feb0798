// trust_bench: what TLS, tokens and result verification cost on a cache hit.
//
// Makes a test PKI (openssl, kilnd keygen) in a temporary folder, then for each setup starts
// kilnd on a free port, warms one key, and times cache-hit Compile calls made by the C++
// client (one client, one call in flight) for --seconds:
//
//   plaintext          no TLS, no token, unsigned results, no verification
//   tls+token          TLS (server certificate) and a bearer token
//   mtls+token+signed  client certificates too, and kilnd signs results; client does not verify
//   ...+verify         the same daemon; the client verifies every result (TrustPolicy::Check)
//
// and the cost of verification alone (Check on one real signed response, many times).
//
//   trust_bench [--seconds=2] [--kilnd=PATH]
//
// A benchmark, not a test: it is not registered with ctest.
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "client/cpp/kiln.h"
#include "tests/integration/kilnd_process.h"
#include "tests/integration/test_pki.h"
#include "tests/integration/wire_graph.h"

namespace kiln::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

v1::Graph Graph() {
  testing::WireGraph g;
  const int x = g.Input("x", v1::F32, {1024});
  g.Output(g.Op("add", {g.Op("exp", {x}), g.Scalar(1.0)}));
  return g.graph();
}

struct Setup {
  const char* name;
  std::vector<std::string> kilnd_args;
  bool tls = false;
  bool client_cert = false;
  bool token = false;
  bool verify = false;
};

struct Row {
  std::string name;
  double p50 = 0, p99 = 0, mean = 0;
  size_t calls = 0;
};

int Main(int argc, char** argv) {
  double seconds = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--seconds=", 0) == 0) {
      seconds = std::atof(argv[i] + 10);
    } else if (arg.rfind("--kilnd=", 0) == 0) {
      setenv("KILND_PATH", argv[i] + 8, 1);
    } else {
      std::fprintf(stderr, "usage: trust_bench [--seconds=2] [--kilnd=PATH]\n");
      return 2;
    }
  }
  std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-trust-bench-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) return 1;
  const std::string dir = tmpl;
  auto path = [&](const std::string& name) { return dir + "/" + name; };
  if (std::string error = testing::MakeTestPki(dir); !error.empty()) {
    std::fprintf(stderr, "trust_bench: %s\n", error.c_str());
    return 1;
  }
  const std::vector<std::string> tls = {"--tls-cert=" + path("server.crt"),
                                        "--tls-key=" + path("server.key"),
                                        "--auth-tokens=" + path("tokens")};
  std::vector<std::string> secure = tls;
  secure.push_back("--tls-client-ca=" + path("ca.crt"));
  secure.push_back("--signing-key=" + path("sign.pem"));
  const std::vector<Setup> setups = {
      {"plaintext", {}, false, false, false, false},
      {"tls+token", tls, true, false, true, false},
      {"mtls+token+signed", secure, true, true, true, false},
      {"mtls+token+signed+verify", secure, true, true, true, true},
  };

  v1::CompileRequest request;
  *request.mutable_graph() = Graph();
  request.mutable_target()->mutable_cpu()->set_isa("x86-64-v2");
  std::vector<Row> rows;
  v1::CompileResponse signed_response;
  for (const Setup& setup : setups) {
    testing::KilndProcess kilnd;
    std::vector<std::string> args = setup.kilnd_args;
    args.push_back("--log-level=warn");
    if (std::string e = kilnd.Start(path("cache"), args, /*quiet=*/true); !e.empty()) {
      std::fprintf(stderr, "trust_bench: %s\n", e.c_str());
      return 1;
    }
    client::ClientOptions options;
    options.address = kilnd.address();
    if (setup.tls) options.tls_ca = path("ca.crt");
    if (setup.client_cert) {
      options.tls_cert = path("client.crt");
      options.tls_key = path("client.key");
    }
    if (setup.token) options.token = testing::kBuilderToken;
    absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Create(options);
    absl::StatusOr<client::TrustPolicy> trust =
        setup.verify ? client::TrustPolicy::Create({path("sign.pem.pub")}, false)
                     : client::TrustPolicy::Create({}, true);
    if (!c.ok() || !trust.ok()) {
      std::fprintf(stderr, "trust_bench: client setup failed\n");
      return 1;
    }
    absl::StatusOr<v1::CompileResponse> warm = (*c)->Compile(request);
    if (!warm.ok()) {
      std::fprintf(stderr, "trust_bench: warm-up compile: %s\n", warm.status().ToString().c_str());
      return 1;
    }
    if (setup.verify) signed_response = *warm;
    std::vector<double> ms;
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      const auto t0 = Clock::now();
      absl::StatusOr<v1::CompileResponse> r = (*c)->Compile(request);
      if (!r.ok() || !r->cache_hit() || !trust->Check(*r).ok()) {
        std::fprintf(stderr, "trust_bench: a hit failed in %s\n", setup.name);
        return 1;
      }
      ms.push_back(Ms(Clock::now() - t0));
    }
    double sum = 0;
    for (double v : ms) sum += v;
    rows.push_back({setup.name, Percentile(ms, 0.5), Percentile(ms, 0.99),
                    sum / static_cast<double>(ms.size()), ms.size()});
    kilnd.Stop();
  }

  // Verification alone, on one real signed response: the full check (canonical bytes and
  // Ed25519, what every new record costs) and the client's check of a record it has verified
  // before (one hash), in thread CPU time, which the load of other processes does not inflate.
  absl::StatusOr<wire::TrustedKeys> keys = wire::TrustedKeys::FromPemFiles({path("sign.pem.pub")});
  absl::StatusOr<client::TrustPolicy> trust =
      client::TrustPolicy::Create({path("sign.pem.pub")}, false);
  if (!keys.ok() || !trust.ok()) return 1;
  constexpr int kChecks = 5000;
  auto per_check_us = [&](auto&& check) {
    timespec a{}, b{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    for (int i = 0; i < kChecks; ++i) {
      if (!check()) std::abort();
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e3 / kChecks;
  };
  const double full_us = per_check_us(
      [&] { return keys->VerifyResult(signed_response.handle(), signed_response.result()).ok(); });
  const double repeat_us = per_check_us([&] { return trust->Check(signed_response).ok(); });

  std::printf("%-26s %9s %9s %9s %8s\n", "cache-hit Compile", "p50 ms", "p99 ms", "mean ms",
              "calls");
  for (const Row& r : rows) {
    std::printf("%-26s %9.3f %9.3f %9.3f %8zu\n", r.name.c_str(), r.p50, r.p99, r.mean, r.calls);
  }
  std::printf(
      "verification CPU time per result: full %.1f us (Ed25519 over %zu canonical bytes), "
      "repeat of a verified record %.1f us\n",
      full_us,
      wire::CanonicalResultBytes(signed_response.handle(), signed_response.result()).size(),
      repeat_us);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

}  // namespace
}  // namespace kiln::bench

int main(int argc, char** argv) { return kiln::bench::Main(argc, argv); }
