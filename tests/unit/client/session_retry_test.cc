// The client's everyday rules against real daemons: the thread-count rule
// (kernels/runtime/kiln_threads.h), the retry policy (client/cpp/retry.h) against a daemon that
// is not running and one whose compile queue overflows, the Session's CUDA path up to the
// driver (this machine has no GPU: tests/gpu/session_cuda.sh runs the rest), and the example
// program. Timings are asserted as loose bounds.
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/kiln.h"
#include "gtest/gtest.h"
#include "kernels/runtime/kiln_threads.h"
#include "tests/integration/kilnd_process.h"
#include "tests/unit/client/test_support.h"

namespace kiln::client {
namespace {

namespace fs = std::filesystem;

// exp(x) * scale over f32 [n]: a distinct graph (and so a distinct compile) per (n, scale).
v1::Graph ScaledExp(int64_t n, double scale) {
  v1::Graph g;
  v1::Input* x = g.add_inputs();
  x->set_name("x");
  x->mutable_type()->set_dtype(v1::F32);
  x->mutable_type()->add_shape(n);
  v1::Node* e = g.add_nodes();
  e->set_op("exp");
  e->add_inputs(0);
  v1::Node* c = g.add_nodes();  // value 2: `scale` in the shape of x
  c->set_op("full");
  (*c->mutable_attrs())["shape"].mutable_ints()->add_values(n);
  (*c->mutable_attrs())["value"].set_f(scale);
  (*c->mutable_attrs())["dtype"].set_dtype(v1::F32);
  v1::Node* m = g.add_nodes();
  m->set_op("mul");
  m->add_inputs(1);
  m->add_inputs(2);
  g.add_outputs(3);
  return g;
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old, had_ = true;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(ThreadCountTest, KilnThenOpenMpThenAffinity) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  const int cpus = CPU_COUNT(&all);
  {
    ScopedEnv kiln("KILN_NUM_THREADS", nullptr), omp("OMP_NUM_THREADS", nullptr);
    EXPECT_EQ(runtime::DefaultNumThreads(), cpus);
  }
  {
    ScopedEnv kiln("KILN_NUM_THREADS", nullptr), omp("OMP_NUM_THREADS", "3");
    EXPECT_EQ(runtime::DefaultNumThreads(), 3);
  }
  {
    ScopedEnv kiln("KILN_NUM_THREADS", nullptr), omp("OMP_NUM_THREADS", "5,2");  // per level
    EXPECT_EQ(runtime::DefaultNumThreads(), 5);
  }
  {
    ScopedEnv kiln("KILN_NUM_THREADS", "7"), omp("OMP_NUM_THREADS", "3");
    EXPECT_EQ(runtime::DefaultNumThreads(), 7);
  }
  for (const char* bad : {"0", "-2", "many", "4x", ""}) {
    ScopedEnv kiln("KILN_NUM_THREADS", bad), omp("OMP_NUM_THREADS", "2");
    EXPECT_EQ(runtime::DefaultNumThreads(), 2) << "KILN_NUM_THREADS=" << bad;
  }
  {
    // The affinity mask, as taskset or a cpuset would narrow it.
    ScopedEnv kiln("KILN_NUM_THREADS", nullptr), omp("OMP_NUM_THREADS", nullptr);
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &all)) {
        CPU_SET(c, &one);
        break;
      }
    }
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    EXPECT_EQ(runtime::DefaultNumThreads(), 1);
    ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  }
}

TEST(RetryPolicyTest, NothingListeningFailsInSecondsNotTheDeadline) {
  const int port = DeadPort();
  ASSERT_GT(port, 0);
  ClientOptions options;
  options.address = "127.0.0.1:" + std::to_string(port);  // the default policy
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::GetStatsResponse> stats = (*client)->GetStats(start + absl::Seconds(60));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kUnavailable) << stats.status();
  EXPECT_GE(took, absl::Seconds(2));   // it did retry for the policy's window (5 s)...
  EXPECT_LT(took, absl::Seconds(20));  // ...and not for the 60 s deadline
  EXPECT_GT((*client)->stats().retries, 1);
}

// A kilnd with one compile worker and room for one queued job.
class OverloadedDaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTempDir());
    kilnd_ = new testing::KilndProcess();
    ASSERT_EQ(kilnd_->Start(*dir_ + "/cache", {"--workers=1", "--queue-size=1"}), "");
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(kilnd_->Stop(), 0);
    delete kilnd_;
    fs::remove_all(*dir_);
    delete dir_;
  }

  // Compiles `n` distinct graphs at once, one client each; returns each outcome.
  std::vector<absl::Status> Flood(int n, double salt, const RetryPolicy& policy) {
    std::vector<absl::Status> out(n);
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        ClientOptions options;
        options.address = kilnd_->address();
        options.retry = policy;
        auto client = Client::Create(options);
        if (!client.ok()) {
          out[i] = client.status();
          return;
        }
        ready.fetch_add(1);
        while (ready.load() < n) std::this_thread::yield();
        out[i] = (*client)
                     ->Compile(ScaledExp(40 + i, salt + i), HostCpuTarget(), {},
                               absl::Now() + absl::Seconds(120))
                     .status();
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  static testing::KilndProcess* kilnd_;
  static std::string* dir_;
};

testing::KilndProcess* OverloadedDaemonTest::kilnd_ = nullptr;
std::string* OverloadedDaemonTest::dir_ = nullptr;

TEST_F(OverloadedDaemonTest, FullQueueIsRetriedUntilEveryCompileLands) {
  for (const absl::Status& s : Flood(6, 1.5, RetryPolicy{})) EXPECT_TRUE(s.ok()) << s;
  auto client = Client::Create(kilnd_->address());
  ASSERT_TRUE(client.ok());
  absl::StatusOr<v1::GetStatsResponse> stats = (*client)->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GE(stats->rejected(), 1);  // the burst did overflow the queue
}

TEST_F(OverloadedDaemonTest, WithoutRetriesTheFullQueueReachesTheCaller) {
  RetryPolicy policy;
  policy.retry_overloaded = false;
  int exhausted = 0;
  for (const absl::Status& s : Flood(6, 100.5, policy)) {
    if (absl::IsResourceExhausted(s)) {
      ++exhausted;
      EXPECT_NE(s.message().find("queue is full"), std::string::npos) << s;
    } else {
      EXPECT_TRUE(s.ok()) << s;
    }
  }
  EXPECT_GE(exhausted, 1);
}

// One ordinary daemon for the Session tests.
class SessionTest : public OverloadedDaemonTest {};

TEST_F(SessionTest, CudaResultIsFetchedAndLoadedThroughTheSamePath) {
  SessionOptions options;
  options.client.address = kilnd_->address();
  options.cache_dir = *dir_ + "/local";
  auto session = Session::Create(options);
  ASSERT_TRUE(session.ok());
  absl::StatusOr<LoadedKernel> kernel =
      (*session)->CompileAndLoad(ScaledExp(64, 0.25), CudaTarget(90));
  if (kernel.ok()) {
    // A machine with a GPU: the same call gives a kernel that runs.
    ASSERT_TRUE(kernel->is_cuda());
    std::vector<float> x(64, 1.0f), y(64, 0.0f);
    ASSERT_TRUE(kernel->Run({{x.data(), 256}}, {{y.data(), 256}}).ok());
    EXPECT_NEAR(y[0], 0.25 * std::exp(1.0), 1e-5);
    return;
  }
  // No driver here: the cubin was compiled and fetched, and loading names the driver.
  EXPECT_EQ(kernel.status().code(), absl::StatusCode::kFailedPrecondition) << kernel.status();
  EXPECT_NE(kernel.status().message().find("libcuda"), std::string::npos) << kernel.status();
  EXPECT_GE((*session)->client().stats().fetches, 1);
}

// A CUDA result with symbolic sizes reaches the CUDA loader with every expression: the
// plan the C++ client hands the loader evaluates to the sizes the graph implies.
TEST_F(SessionTest, SymbolicCudaPlanReachesTheLoaderWhole) {
  auto client = Client::Create(kilnd_->address());
  ASSERT_TRUE(client.ok());
  v1::Graph g;
  v1::Input* x = g.add_inputs();
  x->set_name("x");
  x->mutable_type()->set_dtype(v1::F32);
  x->mutable_type()->add_shape(300);
  x->mutable_type()->add_shape(1000);
  x->mutable_type()->add_dim_symbols("R");
  x->mutable_type()->add_dim_symbols("C");
  g.add_nodes()->set_op("softmax");
  g.mutable_nodes(0)->add_inputs(0);
  g.add_nodes()->set_op("sum");
  g.mutable_nodes(1)->add_inputs(0);
  g.add_outputs(1);
  g.add_outputs(2);
  absl::StatusOr<v1::CompileResponse> r =
      (*client)->Compile(g, CudaTarget(90), {}, absl::Now() + absl::Seconds(120));
  ASSERT_TRUE(r.ok()) << r.status();
  CudaPlan plan = CudaPlanFromWire(r->result().plan());
  ASSERT_TRUE(plan.symbolic());
  EXPECT_EQ(plan.abi_version, 2u);
  ASSERT_EQ(plan.symbols.size(), 2u);
  EXPECT_EQ(plan.symbols[0].name, "R");
  EXPECT_EQ(plan.symbols[1].axis, 1);
  const int64_t sizes[] = {7, 130};
  int temps = 0;
  for (const CudaPlan::Buffer& b : plan.buffers) {
    if (b.role == CudaPlan::Role::kInput) {
      EXPECT_EQ(b.bytes_expr.Eval(sizes), 7 * 130 * 4);
    }
    if (b.role == CudaPlan::Role::kOutput && b.index == 0) {
      ASSERT_EQ(b.shape_exprs.size(), 2u);
      EXPECT_EQ(b.shape_exprs[0].Eval(sizes), 7);
      EXPECT_EQ(b.shape_exprs[1].Eval(sizes), 130);
    }
    temps += b.role == CudaPlan::Role::kTemp;
  }
  EXPECT_GT(temps, 0);  // the sum's partials
  for (const CudaPlan::Step& s : plan.steps) {
    EXPECT_GT(s.grid_per_block, 0) << s.kernel;
    EXPECT_GT(s.grid_work.Eval(sizes), 0) << s.kernel;
  }
  EXPECT_GE(plan.index_bound.Eval(sizes), 7 * 130);
}

TEST_F(SessionTest, ExampleProgramRunsOnTheCpu) {
  const std::string command = std::string(KILN_EXAMPLE_PATH) + " --server " + kilnd_->address() +
                              " --target cpu --rows 33 --cols 70 2>&1";
  ::setenv("KILN_CACHE_DIR", (*dir_ + "/example-cache").c_str(), 1);
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int status = pclose(pipe);
  EXPECT_EQ(status, 0) << output;
  int passes = 0;
  for (size_t at = output.find("PASS"); at != std::string::npos; at = output.find("PASS", at + 1)) {
    ++passes;
  }
  EXPECT_EQ(passes, 3) << output;
  EXPECT_EQ(output.find("FAIL"), std::string::npos) << output;
}

}  // namespace
}  // namespace kiln::client
