// The C++ client against the real kilnd: compile a softmax built with ir::Builder, fetch,
// load and run it against a scalar reference; a second compile is a cache hit that fetches
// nothing; bad graphs come back as INVALID_ARGUMENT; a dead address is UNAVAILABLE after
// bounded retries.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/kiln.h"
#include "gtest/gtest.h"
#include "kernels/ir/builder.h"
#include "kernels/ir/decode.h"
#include "kernels/key/digest.h"
#include "tests/integration/kilnd_process.h"
#include "tests/unit/client/test_support.h"
#include "wire/wire.h"

namespace kiln::client {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kRows = 37, kCols = 129;

v1::Graph SoftmaxGraph(int64_t rows, int64_t cols) {
  ir::Graph in;
  ir::TensorType x;
  x.dtype = ir::DType::kF32;
  x.shape = {rows, cols};
  in.inputs = {x};
  in.input_names = {"x"};
  ir::Builder b(in);
  absl::StatusOr<ir::ValueId> y = b.Add("softmax", {0}, {{"axis", int64_t{-1}}}, "probs");
  EXPECT_TRUE(y.ok()) << y.status();
  return ir::EncodeGraph(b.Finish({*y}));
}

std::vector<float> Softmax(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> out(x.size());
  for (int64_t i = 0; i < rows; ++i) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < cols; ++j) m = std::max<double>(m, x[i * cols + j]);
    for (int64_t j = 0; j < cols; ++j) s += std::exp(double{x[i * cols + j]} - m);
    for (int64_t j = 0; j < cols; ++j) {
      out[i * cols + j] = static_cast<float>(std::exp(double{x[i * cols + j]} - m) / s);
    }
  }
  return out;
}

// One kilnd for the whole suite: every test uses its own graphs or its own local cache.
class ClientDaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    suite_ = new SuiteDaemon();
    ASSERT_EQ(suite_->Start(), "");
  }
  static void TearDownTestSuite() {
    if (suite_ != nullptr) {
      EXPECT_EQ(suite_->kilnd().Stop(), 0);
    }
    delete suite_;
    suite_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(suite_, nullptr);
    ASSERT_FALSE(suite_->kilnd().address().empty());
  }

  // A session on the suite's daemon with a local cache of its own (or a shared one).
  std::unique_ptr<Session> NewSession(const std::string& cache_name) {
    SessionOptions options;
    options.client.address = suite_->kilnd().address();
    options.cache_dir = suite_->dir() + "/" + cache_name;
    auto session = Session::Create(options);
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? std::move(*session) : nullptr;
  }

  static SuiteDaemon* suite_;
};

SuiteDaemon* ClientDaemonTest::suite_ = nullptr;

TEST_F(ClientDaemonTest, SoftmaxCompilesLoadsRunsAndIsCachedAtBothEnds) {
  const v1::Graph graph = SoftmaxGraph(kRows, kCols);
  std::unique_ptr<Session> session = NewSession("local-a");
  ASSERT_NE(session, nullptr);

  absl::StatusOr<LoadedKernel> kernel = session->CompileAndLoad(graph);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_FALSE(kernel->cache_hit());
  EXPECT_EQ(kernel->handle().size(), 64u);
  EXPECT_EQ(kernel->plan().abi_version(), 1u);
  EXPECT_EQ(session->client().stats().fetches, 1);
  EXPECT_TRUE(fs::exists(kernel->library_path()));

  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> x(kRows * kCols), y(kRows * kCols, -1.0f);
  for (float& v : x) v = dist(rng);
  const std::vector<float> want = Softmax(x, kRows, kCols);
  for (int threads : {1, 3}) {
    std::fill(y.begin(), y.end(), -1.0f);
    absl::Status ran = kernel->Run({{x.data(), x.size() * sizeof(float)}},
                                   {{y.data(), y.size() * sizeof(float)}}, threads);
    ASSERT_TRUE(ran.ok()) << ran;
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], 1e-6f) << "at " << i;
  }

  // kilnd and the client agree on the request's key.
  EXPECT_EQ(kernel->response().request_key(), wire::RequestKey(graph, HostCpuTarget(), {}));

  // The same graph again: answered by the session itself, no RPC, and the .so is already here.
  const int64_t calls = session->client().stats().calls;
  absl::StatusOr<LoadedKernel> again = session->CompileAndLoad(graph);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->cache_hit());
  EXPECT_EQ(again->handle(), kernel->handle());
  EXPECT_EQ(again->library_path(), kernel->library_path());
  EXPECT_EQ(session->client().stats().fetches, 1);
  EXPECT_EQ(session->client().stats().calls, calls);
  EXPECT_EQ(session->local_hits(), 1);

  // Another session (another client, as another process would have) on the same directory
  // fetches nothing either; by handle alone it loads the same library.
  std::unique_ptr<Session> second = NewSession("local-a");
  ASSERT_NE(second, nullptr);
  absl::StatusOr<LoadedKernel> by_handle = second->LoadHandle(kernel->handle());
  ASSERT_TRUE(by_handle.ok()) << by_handle.status();
  EXPECT_EQ(by_handle->library_path(), kernel->library_path());
  EXPECT_EQ(second->client().stats().fetches, 0);
  std::fill(y.begin(), y.end(), -1.0f);
  ASSERT_TRUE(by_handle->Run({{x.data(), x.size() * 4}}, {{y.data(), y.size() * 4}}).ok());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], 1e-6f) << "at " << i;

  // A session with an empty directory fetches once.
  std::unique_ptr<Session> fresh = NewSession("local-b");
  ASSERT_NE(fresh, nullptr);
  absl::StatusOr<LoadedKernel> fresh_kernel = fresh->CompileAndLoad(graph);
  ASSERT_TRUE(fresh_kernel.ok()) << fresh_kernel.status();
  EXPECT_TRUE(fresh_kernel->cache_hit());
  EXPECT_EQ(fresh_kernel->handle(), kernel->handle());
  EXPECT_EQ(fresh->client().stats().fetches, 1);
  EXPECT_EQ(fresh->key_hits(), 1) << "asked by request key, without the graph";
  EXPECT_EQ(fresh->client().stats().calls, 2);  // the lookup by key and the fetch
}

// A softmax over rows of symbolic length: one compile, one library, every size.
TEST_F(ClientDaemonTest, SymbolicSoftmaxRunsAtEverySize) {
  v1::Graph graph = SoftmaxGraph(5, 17);
  graph.mutable_inputs(0)->mutable_type()->add_dim_symbols("R");
  graph.mutable_inputs(0)->mutable_type()->add_dim_symbols("C");
  std::unique_ptr<Session> session = NewSession("local-sym");
  ASSERT_NE(session, nullptr);
  absl::StatusOr<LoadedKernel> kernel = session->CompileAndLoad(graph);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ(kernel->plan().abi_version(), 2u);
  ASSERT_EQ(kernel->plan().symbols_size(), 2);
  const CpuKernel& cpu = kernel->kernel();
  ASSERT_TRUE(cpu.is_symbolic());

  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (auto [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 3}, {0, 7}, {37, 129}, {3, 1000}}) {
    const std::vector<int64_t> sizes = {rows, cols};
    absl::StatusOr<std::vector<int64_t>> shape = cpu.Shape(v1::OUTPUT, 0, sizes);
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_EQ(*shape, sizes);
    std::vector<float> x(rows * cols), y(rows * cols, -1.0f);
    for (float& v : x) v = dist(rng);
    absl::Status ran =
        cpu.RunSized(sizes, {{x.data(), x.size() * 4}}, {{y.data(), y.size() * 4}}, 2);
    ASSERT_TRUE(ran.ok()) << ran;
    const std::vector<float> want = Softmax(x, rows, cols);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], want[i], 1e-6f) << rows << "x" << cols << " at " << i;
  }
  std::vector<float> small(4), out(8);
  const std::vector<int64_t> two_by_four = {2, 4};
  EXPECT_EQ(
      cpu.RunSized(two_by_four, {{small.data(), small.size() * 4}}, {{out.data(), out.size() * 4}})
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu.Run({{small.data(), 16}}, {{out.data(), 32}}).code(),
            absl::StatusCode::kFailedPrecondition);
  const std::vector<int64_t> negative = {-1, 4};
  EXPECT_EQ(cpu.RunSized(negative, {{small.data(), 16}}, {{out.data(), 32}}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientDaemonTest, LookupSourceStatsAndFetchThroughTheClient) {
  std::unique_ptr<Session> session = NewSession("local-c");
  ASSERT_NE(session, nullptr);
  Client& client = session->client();
  const v1::Graph graph = SoftmaxGraph(5, 17);
  const v1::Target target = HostCpuTarget();

  absl::StatusOr<std::optional<v1::CompileResponse>> miss = client.Lookup(graph, target);
  ASSERT_TRUE(miss.ok()) << miss.status();
  EXPECT_FALSE(miss->has_value());

  absl::StatusOr<v1::CompileResponse> compiled = client.Compile(graph, target);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  absl::StatusOr<std::optional<v1::CompileResponse>> hit = client.Lookup(graph, target);
  ASSERT_TRUE(hit.ok()) << hit.status();
  ASSERT_TRUE(hit->has_value());
  EXPECT_EQ((*hit)->handle(), compiled->handle());

  absl::StatusOr<v1::GetSourceResponse> source = client.GetSource(compiled->handle());
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->language(), "c++");
  EXPECT_NE(source->source().find("kiln_run"), std::string::npos);

  const v1::Artifact* so = FindArtifact(*compiled, v1::SHARED_OBJECT);
  ASSERT_NE(so, nullptr);
  absl::StatusOr<std::string> bytes = client.FetchArtifact(so->digest());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(static_cast<int64_t>(bytes->size()), so->size());
  EXPECT_EQ(key::Sha256Hex(*bytes), so->digest());

  EXPECT_EQ(client.FetchArtifact(std::string(64, '0')).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client.FetchArtifact("../etc/passwd").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.GetResult(std::string(64, 'f')).status().code(), absl::StatusCode::kNotFound);

  absl::StatusOr<v1::GetStatsResponse> stats = client.GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GE(stats->compiles(), 1);
  EXPECT_GE(stats->requests(), 1);
  EXPECT_EQ(client.stats().retries, 0);
}

TEST_F(ClientDaemonTest, LoaderChecksAbiVersionAndBufferSizes) {
  std::unique_ptr<Session> session = NewSession("local-d");
  ASSERT_NE(session, nullptr);
  absl::StatusOr<LoadedKernel> kernel = session->CompileAndLoad(SoftmaxGraph(3, 8));
  ASSERT_TRUE(kernel.ok()) << kernel.status();

  v1::LaunchPlan future = kernel->plan();
  future.set_abi_version(future.abi_version() + 1);
  absl::StatusOr<CpuKernel> refused = CpuKernel::Load(kernel->library_path(), future);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  absl::StatusOr<uint32_t> abi = CpuKernel::AbiVersion(kernel->library_path());
  ASSERT_TRUE(abi.ok());
  EXPECT_EQ(*abi, 1u);
  EXPECT_EQ(CpuKernel::Load("/nonexistent/kernel.so", kernel->plan()).status().code(),
            absl::StatusCode::kNotFound);

  std::vector<float> x(3 * 8), y(3 * 8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7) % 11) * 0.3f - 1.0f;
  EXPECT_EQ(kernel->Run({{x.data(), 4}}, {{y.data(), y.size() * 4}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kernel->Run({{x.data(), x.size() * 4}}, {{y.data(), 4}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kernel->Run({}, {{y.data(), y.size() * 4}}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(kernel->Run({{x.data(), x.size() * 4}}, {{y.data(), y.size() * 4}}).ok());
  const std::vector<float> want = Softmax(x, 3, 8);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-6f) << i;
}

TEST_F(ClientDaemonTest, BadGraphIsInvalidArgumentAndNotRetried) {
  std::unique_ptr<Session> session = NewSession("local-e");
  ASSERT_NE(session, nullptr);
  v1::Graph bad = SoftmaxGraph(4, 4);
  bad.mutable_nodes(0)->set_op("no_such_op");
  absl::StatusOr<v1::CompileResponse> compiled = session->client().Compile(bad, HostCpuTarget());
  EXPECT_EQ(compiled.status().code(), absl::StatusCode::kInvalidArgument) << compiled.status();
  EXPECT_NE(compiled.status().message().find("no_such_op"), std::string::npos) << compiled.status();
  EXPECT_EQ(session->CompileAndLoad(v1::Graph()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->client().stats().retries, 0);
  EXPECT_EQ(session->client().stats().fetches, 0);

  v1::Target cuda;
  cuda.mutable_cuda()->set_sm(90);
  EXPECT_EQ(session->CompileAndLoad(SoftmaxGraph(4, 4), cuda).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(ClientDaemonTest, PrewarmReportsOneEventPerRequest) {
  std::unique_ptr<Session> session = NewSession("local-f");
  ASSERT_NE(session, nullptr);
  std::vector<v1::CompileRequest> requests(3);
  *requests[0].mutable_graph() = SoftmaxGraph(2, 33);
  *requests[1].mutable_graph() = SoftmaxGraph(2, 34);
  // requests[2] keeps an empty graph: invalid.
  for (v1::CompileRequest& r : requests) {
    *r.mutable_target() = HostCpuTarget();
    r.set_priority(v1::PREWARM);
  }
  std::vector<v1::PrewarmEvent> events;
  absl::Status status =
      session->client().Prewarm(requests, [&](const v1::PrewarmEvent& e) { events.push_back(e); });
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(events.size(), 3u);
  for (const v1::PrewarmEvent& e : events) {
    const absl::Status outcome = wire::FromWireCode(e.code(), e.message());
    if (e.index() == 2) {
      EXPECT_EQ(outcome.code(), absl::StatusCode::kInvalidArgument);
    } else {
      EXPECT_TRUE(outcome.ok()) << outcome;
      EXPECT_EQ(e.handle().size(), 64u);
    }
  }
  // Prewarmed graphs are hits afterwards.
  auto hit = session->client().Lookup(requests[0].graph(), requests[0].target());
  ASSERT_TRUE(hit.ok());
  EXPECT_TRUE(hit->has_value());
}

TEST(ClientRetryTest, DeadAddressIsUnavailableAfterBoundedAttempts) {
  const int port = DeadPort();
  ASSERT_GT(port, 0);
  ClientOptions options;
  options.address = "127.0.0.1:" + std::to_string(port);
  options.retry.max_attempts = 3;
  options.retry.initial_backoff = absl::Milliseconds(20);
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::CompileResponse> response =
      (*client)->Compile(SoftmaxGraph(2, 2), HostCpuTarget(), {}, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
  EXPECT_NE(response.status().message().find("after 3 attempts"), std::string::npos)
      << response.status();
  EXPECT_EQ((*client)->stats().attempts, 3);
  EXPECT_EQ((*client)->stats().retries, 2);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(ClientRetryTest, ShortDeadlineBoundsTheRetries) {
  const int port = DeadPort();
  ASSERT_GT(port, 0);
  ClientOptions options;
  options.address = "127.0.0.1:" + std::to_string(port);
  options.retry.max_attempts = 1000;
  options.retry.initial_backoff = absl::Milliseconds(50);
  options.retry.max_backoff = absl::Milliseconds(200);
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::GetStatsResponse> stats = (*client)->GetStats(start + absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kUnavailable) << stats.status();
  EXPECT_GT((*client)->stats().attempts, 1);
  EXPECT_LT((*client)->stats().attempts, 1000);
  EXPECT_LT(took, absl::Milliseconds(1500));
}

TEST(ClientRetryTest, RetriesCarryACallOverADaemonThatComesUpLate) {
  const int port = DeadPort();
  ASSERT_GT(port, 0);
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  ClientOptions options;
  options.address = "127.0.0.1:" + std::to_string(port);
  options.retry.max_attempts = 100;
  options.retry.initial_backoff = absl::Milliseconds(50);
  options.retry.max_backoff = absl::Milliseconds(200);
  options.retry.unavailable_timeout = absl::Seconds(60);  // however slow kilnd is to start
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<v1::GetStatsResponse> stats = absl::UnknownError("not run");
  std::thread caller([&] { stats = (*client)->GetStats(absl::Now() + absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(300));
  testing::KilndProcess kilnd;
  // A later --listen overrides the helper's port 0.
  const std::string error =
      kilnd.Start(dir + "/cache", {"--listen=127.0.0.1:" + std::to_string(port)});
  caller.join();
  ASSERT_EQ(error, "");
  EXPECT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT((*client)->stats().retries, 0);
  EXPECT_EQ(kilnd.Stop(), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::client
