// hit_bench: how fast kilnd answers a cache hit, and how long a cold compile takes.
//
// Starts kilnd on a free port with a temporary cache (or uses --address=HOST:PORT), compiles
// one graph to warm its key, then drives cache-hit Compile calls on loopback from 1 and from 16
// concurrent clients (each its own connection, one call in flight each) and reports p50/p99
// latency and throughput. Then it compiles a few sample graphs with fresh keys (a constant in
// each graph varies per run) and reports cold compile latency: the median of --cold-runs fresh
// keys per graph. --kilnd-arg passes a flag to the kilnd it starts (repeatable), e.g.
// --kilnd-arg=--compile-in-process to compare against compiling inside kilnd. --seconds=0 skips
// the cache-hit part.
//
//   hit_bench [--address=HOST:PORT] [--seconds=3] [--clients=1,16] [--shared-channel]
//             [--kilnd=PATH] [--cold-runs=1] [--kilnd-arg=FLAG ...]
//
// A benchmark, not a test: it is not registered with ctest.
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "kiln/v1/service.grpc.pb.h"
#include "tests/integration/kilnd_process.h"
#include "tests/integration/wire_graph.h"

namespace kiln::bench {
namespace {

using Clock = std::chrono::steady_clock;
using testing::CpuTarget;
using testing::MakeRequest;
using testing::WireGraph;

struct Flags {
  std::string address;
  std::string kilnd;
  double seconds = 3;
  std::vector<int> clients = {1, 16};
  bool shared_channel = false;  // all clients on one connection instead of one each
  int cold_runs = 1;
  std::vector<std::string> kilnd_args;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const std::string& name) -> const char* {
      return arg.rfind(name + "=", 0) == 0 ? argv[i] + name.size() + 1 : nullptr;
    };
    if (const char* v = value("--address")) {
      f.address = v;
    } else if (const char* v = value("--kilnd")) {
      f.kilnd = v;
    } else if (const char* v = value("--seconds")) {
      f.seconds = std::atof(v);
    } else if (const char* v = value("--cold-runs")) {
      f.cold_runs = std::max(1, std::atoi(v));
    } else if (const char* v = value("--kilnd-arg")) {
      f.kilnd_args.push_back(v);
    } else if (arg == "--shared-channel") {
      f.shared_channel = true;
    } else if (const char* v = value("--clients")) {
      f.clients.clear();
      std::string list = v;
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        f.clients.push_back(std::atoi(list.substr(at, comma - at).c_str()));
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: hit_bench [--address=HOST:PORT] [--seconds=S] "
                   "[--clients=1,16] [--shared-channel] [--kilnd=PATH] "
                   "[--cold-runs=N] [--kilnd-arg=FLAG ...]\n");
      std::exit(2);
    }
  }
  return f;
}

// One client: a connection with one Compile in flight at a time, reissued from its own
// completion callback until told to stop.
class ClientLoop {
 public:
  // Sends `request` (the whole graph) or, when `by_key` is set, that lookup by request key.
  ClientLoop(const std::string& address, int id, bool shared_channel,
             const v1::CompileRequest* request, const v1::LookupRequest* by_key)
      : request_(request), by_key_(by_key) {
    grpc::ChannelArguments args;
    // Distinct channel arguments give each client a connection of its own.
    if (!shared_channel) args.SetInt("kiln.bench.client", id);
    stub_ = v1::Kiln::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }

  void Start(std::atomic<bool>* stop) {
    stop_ = stop;
    Issue();
  }

  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_; });
  }

  // (end time, latency in ms) of every completed call.
  const std::vector<std::pair<Clock::time_point, double>>& samples() const { return samples_; }
  int errors() const { return errors_; }
  const std::string& last_error() const { return last_error_; }

 private:
  void Issue() {
    context_ = std::make_unique<grpc::ClientContext>();
    context_->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    start_ = Clock::now();
    if (by_key_ != nullptr) {
      stub_->async()->Lookup(context_.get(), by_key_, &response_,
                             [this](grpc::Status status) { OnDone(status); });
    } else {
      stub_->async()->Compile(context_.get(), request_, &response_,
                              [this](grpc::Status status) { OnDone(status); });
    }
  }

  void OnDone(const grpc::Status& status) {
    const Clock::time_point end = Clock::now();
    samples_.emplace_back(end, std::chrono::duration<double, std::milli>(end - start_).count());
    if (!status.ok() || !response_.cache_hit()) {
      ++errors_;
      last_error_ = status.ok() ? "not a cache hit" : status.error_message();
    }
    if (!stop_->load(std::memory_order_relaxed)) {
      Issue();
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
    cv_.notify_all();
  }

  const v1::CompileRequest* request_;
  const v1::LookupRequest* by_key_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> context_;
  v1::CompileResponse response_;
  Clock::time_point start_;
  std::atomic<bool>* stop_ = nullptr;
  std::vector<std::pair<Clock::time_point, double>> samples_;
  int errors_ = 0;
  std::string last_error_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
};

struct HitResult {
  int clients = 0;
  size_t requests = 0;
  double p50_ms = 0, p99_ms = 0, mean_ms = 0, per_s = 0;
  int errors = 0;
  std::string last_error;
};

double Percentile(std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(p * (sorted.size() - 1) + 0.5));
  return sorted[i];
}

HitResult MeasureHits(const std::string& address, const v1::CompileRequest& request,
                      const v1::LookupRequest* by_key, int clients, bool shared_channel,
                      double seconds) {
  std::vector<std::unique_ptr<ClientLoop>> loops;
  for (int i = 0; i < clients; ++i) {
    loops.push_back(std::make_unique<ClientLoop>(address, i, shared_channel, &request, by_key));
  }
  std::atomic<bool> stop{false};
  const auto warmup = std::chrono::milliseconds(500);
  const Clock::time_point begin = Clock::now();
  for (auto& l : loops) l->Start(&stop);
  const Clock::time_point window_start = begin + warmup;
  const Clock::time_point window_end =
      window_start + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  std::this_thread::sleep_until(window_end);
  stop.store(true);
  for (auto& l : loops) l->Wait();

  HitResult r;
  r.clients = clients;
  std::vector<double> latencies;
  for (auto& l : loops) {
    for (const auto& [end, ms] : l->samples()) {
      if (end >= window_start && end < window_end) latencies.push_back(ms);
    }
    r.errors += l->errors();
    if (!l->last_error().empty()) r.last_error = l->last_error();
  }
  std::sort(latencies.begin(), latencies.end());
  r.requests = latencies.size();
  r.p50_ms = Percentile(latencies, 0.50);
  r.p99_ms = Percentile(latencies, 0.99);
  r.mean_ms = latencies.empty()
                  ? 0
                  : std::accumulate(latencies.begin(), latencies.end(), 0.0) / latencies.size();
  r.per_s = static_cast<double>(latencies.size()) / seconds;
  return r;
}

// Sample graphs for cold compiles; `c` makes each key fresh.
std::vector<std::pair<std::string, v1::Graph>> SampleGraphs(double c) {
  std::vector<std::pair<std::string, v1::Graph>> out;
  out.emplace_back("sin^2+cos^2+c f32[1000]", testing::SinCosGraph(1000, c));
  {
    WireGraph g;
    const int x = g.Input("x", v1::F32, {64, 1024});
    const int y = g.Op("add", {x, g.Scalar(c)});
    g.Output(g.Op("softmax", {y}, {{"axis", WireGraph::Int(-1)}}));
    out.emplace_back("softmax(x+c) f32[64,1024]", g.graph());
  }
  {
    WireGraph g;
    const int x = g.Input("x", v1::F32, {32, 768});
    const int y = g.Op("mul", {x, g.Scalar(c)});
    g.Output(g.Op("layer_norm", {y}));
    out.emplace_back("layer_norm(x*c) f32[32,768]", g.graph());
  }
  {
    WireGraph g;
    const int x = g.Input("x", v1::F32, {256, 256});
    const int e = g.Op("exp", {g.Op("sub", {x, g.Scalar(c)})});
    g.Output(g.Op("sum", {e}, {{"axes", WireGraph::Ints({1})}}));
    out.emplace_back("sum(exp(x-c), 1) f32[256,256]", g.graph());
  }
  return out;
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  std::string address = flags.address;
  testing::KilndProcess kilnd;
  std::string cache_dir;
  if (address.empty()) {
    if (!flags.kilnd.empty()) setenv("KILND_PATH", flags.kilnd.c_str(), 1);
    cache_dir = (std::filesystem::temp_directory_path() / "kiln-bench-XXXXXX").string();
    if (mkdtemp(cache_dir.data()) == nullptr) return 1;
    // kilnd logs every request as it would in production; the lines go to /dev/null.
    const std::string error = kilnd.Start(cache_dir, flags.kilnd_args, /*quiet=*/true);
    if (!error.empty()) {
      std::fprintf(stderr, "hit_bench: %s\n", error.c_str());
      return 1;
    }
    address = kilnd.address();
  }

  const v1::CompileRequest request = MakeRequest(testing::SinCosGraph(1000));
  auto stub = v1::Kiln::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::CompileResponse warm;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    grpc::Status s = stub->Compile(&ctx, request, &warm);
    if (!s.ok()) {
      std::fprintf(stderr, "hit_bench: warming compile failed: %s\n", s.error_message().c_str());
      return 1;
    }
  }
  std::printf("kilnd at %s; hit key %.12s (%s)\n\n", address.c_str(), warm.handle().c_str(),
              warm.cache_hit() ? "already cached" : "compiled now");

  // The same hit asked two ways: the whole request, and its request key alone (kilnd answers
  // from its memory of requests; wire/FORMAT.md).
  v1::LookupRequest by_key;
  by_key.set_request_key(warm.request_key());
  std::printf("%-22s %8s %10s %9s %9s %9s %11s %7s\n", "cache hit", "clients", "requests", "p50 ms",
              "p99 ms", "mean ms", "hits/s", "errors");
  const v1::LookupRequest* const ways[] = {nullptr, &by_key};
  for (const v1::LookupRequest* key : ways) {
    for (int clients : flags.seconds > 0 ? flags.clients : std::vector<int>{}) {
      HitResult r =
          MeasureHits(address, request, key, clients, flags.shared_channel, flags.seconds);
      std::printf("%-22s %8d %10zu %9.3f %9.3f %9.3f %11.0f %7d\n",
                  key == nullptr ? "Compile (graph sent)" : "Lookup by request key", r.clients,
                  r.requests, r.p50_ms, r.p99_ms, r.mean_ms, r.per_s, r.errors);
      if (r.errors > 0) std::printf("  last error: %s\n", r.last_error.c_str());
      std::fflush(stdout);
    }
  }

  // Medians over --cold-runs fresh keys. "outside ms" is the server's time not spent in the
  // pipeline itself (decode, key, store, and the hop to a worker process when there is one).
  std::printf("\n%-32s %5s %11s %11s %13s %12s %8s\n", "cold compile (fresh key), p50", "runs",
              "client ms", "server ms", "toolchain ms", "outside ms", "kernels");
  std::mt19937 rng(
      static_cast<uint32_t>(std::chrono::system_clock::now().time_since_epoch().count()));
  const size_t num_graphs = SampleGraphs(0).size();
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (size_t gi = 0; gi < num_graphs; ++gi) {
    std::vector<double> client_ms, server_ms, toolchain_ms, outside_ms;
    std::string name;
    int kernels = 0;
    for (int run = 0; run < flags.cold_runs; ++run) {
      const double c = 1.0 + std::uniform_real_distribution<double>(0, 1)(rng);
      auto graphs = SampleGraphs(c);
      name = graphs[gi].first;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      v1::CompileResponse resp;
      const Clock::time_point start = Clock::now();
      grpc::Status s = stub->Compile(&ctx, MakeRequest(graphs[gi].second), &resp);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (!s.ok() || resp.cache_hit()) {
        std::printf("%-32s %s\n", name.c_str(),
                    s.ok() ? "unexpected hit" : s.error_message().substr(0, 200).c_str());
        continue;
      }
      client_ms.push_back(ms);
      server_ms.push_back(resp.server_ms());
      toolchain_ms.push_back(resp.result().stats().toolchain_ms());
      outside_ms.push_back(resp.server_ms() - resp.result().stats().total_ms());
      kernels = resp.result().stats().num_kernels();
    }
    std::printf("%-32s %5zu %11.1f %11.1f %13.1f %12.2f %8d\n", name.c_str(), client_ms.size(),
                median(client_ms), median(server_ms), median(toolchain_ms), median(outside_ms),
                kernels);
    std::fflush(stdout);
  }

  if (!cache_dir.empty()) {
    kilnd.Stop(SIGTERM);
    std::filesystem::remove_all(cache_dir);
  }
  return 0;
}

}  // namespace
}  // namespace kiln::bench

int main(int argc, char** argv) { return kiln::bench::Main(argc, argv); }
