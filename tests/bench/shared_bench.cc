// shared_bench: what cluster mode costs and gives, on loopback, with real processes.
//
// Part 1, the tiers alone (in this process: a real redis-server child, a real RocksDB L1),
// for results whose artifact set is `--set-kib` (default 100 KiB, two blobs of random bytes):
//   L1 hit       TieredStore::GetResult from RocksDB (which reads and verifies the blobs)
//   L2 hit       the same on a key only Redis holds (cold L1): record, completeness check,
//                blobs read and verified, L1 filled
//   artifacts    GetBlob of each artifact of the set from L1 (what FetchArtifact reads)
//   miss         GetResult of a key neither tier holds
// each from 1 and 16 threads (distinct keys per thread).
//
// Part 2, through kilnd (Compile RPCs from 1 and 16 clients, one connection each):
//   L1 hit       a repeated request on the replica that has it
//   L2 hit       first request for keys replica A compiled, on replica B (cold L1)
//   miss         requests for graphs nobody compiled (a cold compile each)
// and hit throughput of 16 clients on one replica vs spread over two.
//
//   shared_bench [--seconds=2] [--set-kib=100] [--part=1,2] [--kilnd=PATH]
//
// A benchmark, not a test: it is not registered with ctest.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/key/digest.h"
#include "server/shared/redis_client.h"
#include "server/shared/shared_store.h"
#include "server/store/rocksdb_store.h"
#include "server/store/tiered_store.h"
#include "tests/integration/kilnd_process.h"
#include "tests/integration/redis_process.h"
#include "tests/integration/wire_graph.h"

namespace kiln::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  double seconds = 2;
  int set_kib = 100;
  bool part1 = true, part2 = true;
};

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Summary {
  size_t n = 0;
  double p50 = 0, p99 = 0, per_s = 0;
};

Summary Summarize(std::vector<double> ms, double wall_s) {
  Summary s;
  std::sort(ms.begin(), ms.end());
  s.n = ms.size();
  auto at = [&](double p) {
    return ms.empty() ? 0.0
                      : ms[std::min(ms.size() - 1, static_cast<size_t>(p * (ms.size() - 1) + 0.5))];
  };
  s.p50 = at(0.5);
  s.p99 = at(0.99);
  s.per_s = wall_s > 0 ? static_cast<double>(ms.size()) / wall_s : 0;
  return s;
}

void Print(const char* what, int threads, const Summary& s) {
  std::printf("| %-34s | %7d | %7zu | %8.3f | %8.3f | %9.0f |\n", what, threads, s.n, s.p50, s.p99,
              s.per_s);
  std::fflush(stdout);
}

void Header(const char* title) {
  std::printf("\n%s\n\n| %-34s | %7s | %7s | %8s | %8s | %9s |\n|%s|%s|%s|%s|%s|%s|\n", title,
              "case", "threads", "samples", "p50 ms", "p99 ms", "ops/s",
              std::string(36, '-').c_str(),
              "--------:", "--------:", "---------:", "---------:", "----------:");
}

// Runs `op(thread, i)` for i = 0.. on `threads` threads, each `per_thread` times (or until
// `seconds` pass when per_thread is 0), and collects the latencies.
Summary Drive(int threads, int per_thread, double seconds,
              const std::function<bool(int, int)>& op) {
  std::vector<std::vector<double>> lat(threads);
  std::atomic<int> failures{0};
  const Clock::time_point start = Clock::now();
  const Clock::time_point end =
      start + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; per_thread > 0 ? i < per_thread : Clock::now() < end; ++i) {
        const Clock::time_point t0 = Clock::now();
        if (!op(t, i)) failures.fetch_add(1);
        lat[t].push_back(Ms(Clock::now() - t0));
      }
    });
  }
  for (std::thread& th : pool) th.join();
  const double wall = Ms(Clock::now() - start) / 1000;
  if (failures.load() > 0) std::printf("  (%d operations failed)\n", failures.load());
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  return Summarize(std::move(all), wall);
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    for (size_t j = 0; j < 8 && i + j < n; ++j) s[i + j] = static_cast<char>(v >> (8 * j));
  }
  return s;
}

int PartTiers(const Flags& flags, const std::filesystem::path& dir) {
  testing::RedisProcess redis;
  if (std::string e = redis.Start(); !e.empty()) {
    std::fprintf(stderr, "redis: %s\n", e.c_str());
    return 1;
  }
  shared::RedisClient client(*shared::ParseRedisUrl(redis.url()));
  shared::SharedStore l2(&client, shared::SharedStoreOptions());
  store::RocksDbStoreOptions l1_options;
  l1_options.path = (dir / "l1").string();
  auto l1 = store::RocksDbStore::Open(l1_options);
  if (!l1.ok()) return 1;
  store::TieredStore tiered(l1->get(), &l2);

  // Keys 0..1023: seeded into Redis only, as another replica's compiles would be.
  constexpr int kKeys = 1024;
  const size_t set_bytes = static_cast<size_t>(flags.set_kib) * 1024;
  std::mt19937_64 rng(42);
  std::vector<std::string> keys;
  std::vector<v1::ActionResult> results;
  for (int k = 0; k < kKeys; ++k) {
    std::vector<std::string> blobs = {RandomBytes(rng, set_bytes * 4 / 5),
                                      RandomBytes(rng, set_bytes - set_bytes * 4 / 5)};
    v1::ActionResult r;
    for (const std::string& b : blobs) {
      v1::Artifact* a = r.add_artifacts();
      a->set_digest(key::Sha256Hex(b));
      a->set_size(static_cast<int64_t>(b.size()));
    }
    keys.push_back(key::Sha256Hex("bench key " + std::to_string(k)));
    if (!l2.PutResult(keys.back(), r, blobs).ok()) {
      std::fprintf(stderr, "seeding Redis failed\n");
      return 1;
    }
    results.push_back(std::move(r));
  }
  // What a Compile answer needs: the result, verified and complete (an L2 hit also reads,
  // verifies and stores its blobs in L1). Artifact reads (FetchArtifact) are timed apart.
  auto answer = [&](const std::string& key) {
    absl::StatusOr<std::optional<v1::ActionResult>> r = tiered.GetResult(key);
    return r.ok() && r->has_value();
  };
  auto read_artifacts = [&](int k) {
    for (const v1::Artifact& a : results[k].artifacts()) {
      absl::StatusOr<std::optional<std::string>> b = tiered.GetBlob(a.digest());
      if (!b.ok() || !b->has_value()) return false;
    }
    return true;
  };

  char title[160];
  std::snprintf(title, sizeof(title),
                "Tiers in process: artifact set %d KiB (2 blobs), redis-server + RocksDB on this "
                "machine",
                flags.set_kib);
  Header(title);
  // Cold L1: keys 0..255 from one thread, 256..1023 from 16 threads (48 each).
  Print("L2 hit, cold L1 (fills L1)", 1,
        Drive(1, 256, 0, [&](int, int i) { return answer(keys[i]); }));
  Print("L2 hit, cold L1 (fills L1)", 16,
        Drive(16, 48, 0, [&](int t, int i) { return answer(keys[256 + t * 48 + i]); }));
  // The same keys again: L1 now has them (and verifies the blobs on every hit).
  Print("L1 hit", 1,
        Drive(1, 0, flags.seconds, [&](int, int i) { return answer(keys[i % kKeys]); }));
  Print("L1 hit", 16, Drive(16, 0, flags.seconds, [&](int t, int i) {
          return answer(keys[(t * 64 + i) % kKeys]);
        }));
  Print("artifact reads from L1 (the set)", 1,
        Drive(1, 0, flags.seconds, [&](int, int i) { return read_artifacts(i % kKeys); }));
  auto miss = [&](int t, int i) {
    absl::StatusOr<std::optional<v1::ActionResult>> r =
        tiered.GetResult(key::Sha256Hex("absent " + std::to_string(t) + " " + std::to_string(i)));
    return r.ok() && !r->has_value();
  };
  Print("miss (L1 and L2)", 1, Drive(1, 0, flags.seconds, miss));
  Print("miss (L1 and L2)", 16, Drive(16, 0, flags.seconds, miss));
  l1->reset();
  return 0;
}

// One Compile on a fresh connection per client thread.
class Clients {
 public:
  Clients(const std::vector<std::string>& addresses, int n) {
    for (int i = 0; i < n; ++i) {
      grpc::ChannelArguments args;
      args.SetInt("kiln.bench.client", i);  // a connection each
      stubs_.push_back(v1::Kiln::NewStub(grpc::CreateCustomChannel(
          addresses[i % addresses.size()], grpc::InsecureChannelCredentials(), args)));
    }
  }
  bool Compile(int client, const v1::CompileRequest& request, bool want_hit) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
    v1::CompileResponse response;
    grpc::Status s = stubs_[client]->Compile(&ctx, request, &response);
    return s.ok() && response.cache_hit() == want_hit;
  }

 private:
  std::vector<std::unique_ptr<v1::Kiln::Stub>> stubs_;
};

int PartDaemons(const Flags& flags, const std::filesystem::path& dir) {
  testing::RedisProcess redis;
  if (std::string e = redis.Start(); !e.empty()) return 1;
  testing::KilndProcess a, b;
  const std::vector<std::string> args = {"--shared-cache=" + redis.url(), "--log-level=warn"};
  if (!a.Start((dir / "a").string(), args, true).empty() ||
      !b.Start((dir / "b").string(), args, true).empty()) {
    std::fprintf(stderr, "kilnd did not start\n");
    return 1;
  }
  // A run-unique constant keeps every graph's key new to this Redis.
  const double base = static_cast<double>(getpid() % 1000) + 0.5;
  auto graph = [&](int i) {
    return testing::MakeRequest(testing::SinCosGraph(4096, base + i * 1e-3));
  };
  // 48 results compiled on A (4 at a time), for B to read cold.
  constexpr int kSeeded = 48;
  {
    Clients seeders({a.address()}, 4);
    Summary s = Drive(4, kSeeded / 4, 0, [&](int t, int i) {
      return seeders.Compile(t, graph(t * (kSeeded / 4) + i), false);
    });
    std::printf("\nseeded %zu results on replica A (cold compiles, p50 %.1f ms)\n", s.n, s.p50);
  }
  Header("Through kilnd: Compile RPC round trip on loopback (replica B unless noted)");
  Clients one({b.address()}, 1), sixteen({b.address()}, 16);
  Print("L2 hit, cold L1 (A compiled it)", 1,
        Drive(1, 16, 0, [&](int, int i) { return one.Compile(0, graph(i), true); }));
  Print("L2 hit, cold L1 (A compiled it)", 16, Drive(16, 2, 0, [&](int t, int i) {
          return sixteen.Compile(t, graph(16 + t * 2 + i), true);
        }));
  const v1::CompileRequest hot = graph(0);
  Print("L1 hit (memory front + RocksDB)", 1,
        Drive(1, 0, flags.seconds, [&](int, int) { return one.Compile(0, hot, true); }));
  Print("L1 hit (memory front + RocksDB)", 16,
        Drive(16, 0, flags.seconds, [&](int t, int) { return sixteen.Compile(t, hot, true); }));
  Print("miss (cold compile)", 1,
        Drive(1, 6, 0, [&](int, int i) { return one.Compile(0, graph(1000 + i), false); }));
  Print("miss (cold compile)", 16,
        Drive(16, 1, 0, [&](int t, int) { return sixteen.Compile(t, graph(2000 + t), false); }));

  Header("Hit throughput: 16 clients on one replica vs spread over two");
  Clients on_one({b.address()}, 16), on_two({a.address(), b.address()}, 16);
  Print("1 replica, hot key", 16,
        Drive(16, 0, flags.seconds, [&](int t, int) { return on_one.Compile(t, hot, true); }));
  Print("2 replicas, hot key", 16,
        Drive(16, 0, flags.seconds, [&](int t, int) { return on_two.Compile(t, hot, true); }));
  return 0;
}

}  // namespace
}  // namespace kiln::bench

int main(int argc, char** argv) {
  kiln::bench::Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--seconds=", 0) == 0) {
      flags.seconds = std::atof(arg.c_str() + 10);
    } else if (arg.rfind("--set-kib=", 0) == 0) {
      flags.set_kib = std::max(1, std::atoi(arg.c_str() + 10));
    } else if (arg.rfind("--part=", 0) == 0) {
      flags.part1 = arg.find('1', 7) != std::string::npos;
      flags.part2 = arg.find('2', 7) != std::string::npos;
    } else if (arg.rfind("--kilnd=", 0) == 0) {
      setenv("KILND_PATH", arg.c_str() + 8, 1);
    } else {
      std::fprintf(stderr,
                   "usage: shared_bench [--seconds=2] [--set-kib=100] [--part=1,2] "
                   "[--kilnd=PATH]\n");
      return 2;
    }
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kiln-shared-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::printf("shared_bench on %u hardware threads\n", std::thread::hardware_concurrency());
  int rc = 0;
  if (flags.part1) rc |= kiln::bench::PartTiers(flags, dir);
  if (flags.part2) rc |= kiln::bench::PartDaemons(flags, dir);
  std::filesystem::remove_all(dir);
  return rc;
}
