// End to end through the real kilnd binary and the real compiler: compile a sin/cos graph whose
// every element depends on its input through every op, fetch the .so, load it and run it
// against a host reference; restart kilnd on the same
// cache directory and get a hit with identical bytes; SIGTERM exits 0 and lets a compile in
// flight finish; Prewarm answers each request of its stream; the health service says SERVING.
#include <dlfcn.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/integration/kilnd_process.h"
#include "tests/integration/wire_graph.h"

namespace kiln::testing {
namespace {

std::string Sha256Hex(const std::string& bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

std::string MakeTempDir(const char* what) {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / (std::string(what) + "-XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

grpc::Status Fetch(v1::Kiln::Stub& stub, const std::string& digest, std::string* bytes) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::FetchArtifactRequest req;
  req.set_digest(digest);
  auto reader = stub.FetchArtifact(&ctx, req);
  v1::ArtifactChunk chunk;
  bytes->clear();
  while (reader->Read(&chunk)) {
    if (chunk.offset() != static_cast<int64_t>(bytes->size())) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "chunk out of order");
    }
    bytes->append(chunk.data());
  }
  return reader->Finish();
}

grpc::Status CompileOnce(v1::Kiln::Stub& stub, const v1::CompileRequest& req,
                         v1::CompileResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  return stub.Compile(&ctx, req, resp);
}

const v1::Artifact* Find(const v1::ActionResult& r, v1::ArtifactKind kind) {
  for (const auto& a : r.artifacts()) {
    if (a.kind() == kind) return &a;
  }
  return nullptr;
}

class KilndCompileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("kiln-it");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(KilndCompileTest, CompileFetchRunRestartHit) {
  const int64_t n = 1000;
  const v1::CompileRequest request = MakeRequest(SinCosGraph(n));
  v1::CompileResponse first;
  std::string so_bytes;
  {
    KilndProcess kilnd;
    ASSERT_EQ(kilnd.Start(dir_ + "/cache"), "");
    auto stub = kilnd.Stub();
    grpc::Status s = CompileOnce(*stub, request, &first);
    ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
    EXPECT_FALSE(first.cache_hit());
    EXPECT_EQ(first.handle().size(), 64u);
    const v1::Artifact* so = Find(first.result(), v1::SHARED_OBJECT);
    ASSERT_NE(so, nullptr);
    ASSERT_NE(Find(first.result(), v1::SOURCE), nullptr);

    s = Fetch(*stub, so->digest(), &so_bytes);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(static_cast<int64_t>(so_bytes.size()), so->size());
    EXPECT_EQ(Sha256Hex(so_bytes), so->digest());

    // A second identical request is a hit, answered from the cache.
    v1::CompileResponse again;
    ASSERT_TRUE(CompileOnce(*stub, request, &again).ok());
    EXPECT_TRUE(again.cache_hit());
    EXPECT_EQ(again.handle(), first.handle());

    // GetResult and GetSource by handle.
    {
      grpc::ClientContext ctx;
      v1::GetResultRequest req;
      req.set_handle(first.handle());
      v1::CompileResponse by_handle;
      ASSERT_TRUE(stub->GetResult(&ctx, req, &by_handle).ok());
      EXPECT_EQ(by_handle.result().artifacts_size(), first.result().artifacts_size());
    }
    {
      grpc::ClientContext ctx;
      v1::GetSourceRequest req;
      req.set_handle(first.handle());
      v1::GetSourceResponse source;
      grpc::Status gs = stub->GetSource(&ctx, req, &source);
      ASSERT_TRUE(gs.ok()) << gs.error_message();
      EXPECT_NE(source.source().find("kiln_run"), std::string::npos);
      EXPECT_EQ(source.language(), "c++");
    }
    {
      grpc::ClientContext ctx;
      v1::GetStatsResponse stats;
      ASSERT_TRUE(stub->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
      EXPECT_EQ(stats.compiles(), 1);
      EXPECT_EQ(stats.cache_hits(), 1);
      EXPECT_EQ(stats.store().entries(), 1);
    }
    EXPECT_EQ(kilnd.Stop(SIGTERM), 0) << "kilnd must exit 0 on SIGTERM";
  }

  // Load the artifact and run it.
  const std::string so_path = dir_ + "/kernel.so";
  {
    std::ofstream f(so_path, std::ios::binary);
    f.write(so_bytes.data(), static_cast<std::streamsize>(so_bytes.size()));
  }
  void* lib = dlopen(so_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  using AbiFn = uint32_t (*)();
  using RunFn = int (*)(void* const*, void*, int);
  auto abi = reinterpret_cast<AbiFn>(dlsym(lib, "kiln_abi_version"));
  auto run = reinterpret_cast<RunFn>(dlsym(lib, "kiln_run"));
  ASSERT_NE(abi, nullptr);
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(abi(), 1u);
  EXPECT_EQ(first.result().plan().abi_version(), 1u);

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-10.0f, 10.0f);
  std::vector<float> x(n), y(n, -1.0f);
  for (float& v : x) v = dist(rng);
  std::vector<char> workspace(static_cast<size_t>(first.result().plan().workspace_bytes()) + 64);
  void* args[] = {x.data(), y.data()};
  for (int threads : {1, 2}) {
    std::fill(y.begin(), y.end(), -1.0f);
    ASSERT_EQ(run(args, workspace.data(), threads), 0);
    for (int64_t i = 0; i < n; ++i) {
      const double want = SinCosReference(x[i]);
      ASSERT_NEAR(y[i], want, 2e-5 * (1 + std::fabs(want))) << "at " << i << " with x=" << x[i];
    }
  }
  dlclose(lib);

  // Restart on the same cache: a hit with identical artifacts, no compile.
  {
    KilndProcess kilnd;
    ASSERT_EQ(kilnd.Start(dir_ + "/cache"), "");
    auto stub = kilnd.Stub();
    v1::CompileResponse after;
    grpc::Status s = CompileOnce(*stub, request, &after);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(after.cache_hit());
    EXPECT_EQ(after.handle(), first.handle());
    ASSERT_EQ(after.result().artifacts_size(), first.result().artifacts_size());
    for (int i = 0; i < after.result().artifacts_size(); ++i) {
      EXPECT_EQ(after.result().artifacts(i).digest(), first.result().artifacts(i).digest());
    }
    std::string bytes_after;
    ASSERT_TRUE(Fetch(*stub, Find(after.result(), v1::SHARED_OBJECT)->digest(), &bytes_after).ok());
    EXPECT_EQ(bytes_after, so_bytes);

    grpc::ClientContext ctx;
    v1::GetStatsResponse stats;
    ASSERT_TRUE(stub->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
    EXPECT_EQ(stats.compiles(), 0);
    EXPECT_EQ(kilnd.Stop(SIGTERM), 0);
  }
}

// CompileOptions.disable_algebraic_rewrites reaches the compile worker and enters the key:
// sum(x[:, :, None] * y[:, None, :], axes=(1, 2)) is two row sums (two accumulators) by
// default and one reduction over both axes (one accumulator) when disabled.
TEST_F(KilndCompileTest, AlgebraicRewritesOptionReachesTheWorker) {
  WireGraph g;
  const int x = g.Input("x", v1::F32, {64, 32});
  const int y = g.Input("y", v1::F32, {64, 32});
  const int xe = g.Op("unsqueeze", {x}, {{"axes", WireGraph::Ints({2})}});
  const int ye = g.Op("unsqueeze", {y}, {{"axes", WireGraph::Ints({1})}});
  g.Output(g.Op("sum", {g.Op("mul", {xe, ye})}, {{"axes", WireGraph::Ints({1, 2})}}));
  KilndProcess kilnd;
  ASSERT_EQ(kilnd.Start(dir_ + "/cache"), "");
  auto stub = kilnd.Stub();
  auto accumulators = [&](bool disable, std::string* handle) {
    v1::CompileRequest req = MakeRequest(g.graph());
    req.mutable_options()->set_disable_algebraic_rewrites(disable);
    v1::CompileResponse resp;
    grpc::Status s = CompileOnce(*stub, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    *handle = resp.handle();
    grpc::ClientContext ctx;
    v1::GetSourceRequest sreq;
    sreq.set_handle(resp.handle());
    v1::GetSourceResponse source;
    EXPECT_TRUE(stub->GetSource(&ctx, sreq, &source).ok());
    int n = 0;
    for (size_t at = source.source().find("_acc = "); at != std::string::npos;
         at = source.source().find("_acc = ", at + 1))
      ++n;
    return n;
  };
  std::string on, off;
  EXPECT_EQ(accumulators(false, &on), 2);
  EXPECT_EQ(accumulators(true, &off), 1);
  EXPECT_NE(on, off);
}

TEST_F(KilndCompileTest, PrewarmStreamsOneEventPerRequest) {
  KilndProcess kilnd;
  ASSERT_EQ(kilnd.Start(dir_ + "/cache"), "");
  auto stub = kilnd.Stub();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
  auto stream = stub->Prewarm(&ctx);
  const int kRequests = 4;
  for (int i = 0; i < kRequests; ++i) {
    // Two distinct graphs, each twice, and one bad request.
    ASSERT_TRUE(
        stream->Write(MakeRequest(SinCosGraph(256, 1.0 + (i % 2)), CpuTarget(), v1::PREWARM)));
  }
  ASSERT_TRUE(stream->Write(MakeRequest(v1::Graph(), CpuTarget(), v1::PREWARM)));
  stream->WritesDone();
  std::vector<v1::PrewarmEvent> events;
  v1::PrewarmEvent e;
  while (stream->Read(&e)) events.push_back(e);
  grpc::Status s = stream->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(events.size(), static_cast<size_t>(kRequests + 1));
  std::vector<bool> seen(kRequests + 1, false);
  for (const auto& ev : events) {
    ASSERT_GE(ev.index(), 0);
    ASSERT_LE(ev.index(), kRequests);
    seen[ev.index()] = true;
    if (ev.index() == kRequests) {
      EXPECT_EQ(ev.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    } else {
      EXPECT_EQ(ev.code(), 0) << ev.message();
      EXPECT_EQ(ev.handle().size(), 64u);
    }
  }
  for (bool b : seen) EXPECT_TRUE(b);
  grpc::ClientContext sctx;
  v1::GetStatsResponse stats;
  ASSERT_TRUE(stub->GetStats(&sctx, v1::GetStatsRequest(), &stats).ok());
  EXPECT_EQ(stats.compiles(), 2);
  EXPECT_EQ(kilnd.Stop(SIGTERM), 0);
}

TEST_F(KilndCompileTest, SigtermLetsTheCompileInFlightFinish) {
  KilndProcess kilnd;
  ASSERT_EQ(kilnd.Start(dir_ + "/cache"), "");
  auto stub = kilnd.Stub();
  v1::CompileResponse resp;
  grpc::Status status;
  std::thread client(
      [&] { status = CompileOnce(*stub, MakeRequest(SinCosGraph(4096, 3.0)), &resp); });
  // Wait until the compile is running (or queued) on the server, then ask kilnd to stop.
  for (int i = 0; i < 500; ++i) {
    grpc::ClientContext ctx;
    v1::GetStatsResponse stats;
    ASSERT_TRUE(stub->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
    if (stats.in_flight() + stats.queue_depth() > 0 || stats.compiles() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const int exit_status = kilnd.Stop(SIGTERM);
  client.join();
  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_FALSE(resp.cache_hit());
  EXPECT_EQ(exit_status, 0);
}

TEST_F(KilndCompileTest, HealthServiceAnswersServing) {
  KilndProcess kilnd;
  ASSERT_EQ(kilnd.Start(dir_ + "/cache"), "");
  grpc::GenericStub generic(kilnd.Channel());
  // grpc.health.v1.HealthCheckRequest{service: ""} is the empty message; the response
  // HealthCheckResponse{status: SERVING (1)} is the two bytes 08 01.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::ByteBuffer request, response;
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      std::lock_guard<std::mutex> lock(mu);
                      status = s;
                      done = true;
                      cv.notify_one();
                    });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  EXPECT_EQ(kilnd.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace kiln::testing
