// Tests of server/worker: framing over a real socketpair, and WorkerProcessCompiler driving real
// worker processes (the kilnd binary in --compile-worker-fd mode, with fault injection on):
// results equal to the in-process pipeline's, crashes and hangs turned into errors with the
// worker replaced, cancellation within a second, and no process left behind.
#include "server/worker/worker.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/ir/decode.h"
#include "tests/integration/wire_graph.h"

namespace kiln::worker {
namespace {

using ::kiln::testing::WireGraph;

TEST(FramingTest, RoundTripEndOfStreamAndCancel) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  v1::WorkerRequest sent;
  sent.set_id(42);
  sent.mutable_compile()->mutable_graph()->add_outputs(7);
  ASSERT_TRUE(WriteFrame(fds[0], sent).ok());
  v1::WorkerRequest got;
  ASSERT_TRUE(ReadFrame(fds[1], &got, absl::InfiniteFuture(), nullptr).ok());
  EXPECT_EQ(got.id(), 42u);
  EXPECT_EQ(got.compile().graph().outputs(0), 7);

  // Nothing arrives: the deadline, then the cancel flag, end the wait.
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      ReadFrame(fds[1], &got, absl::Now() + absl::Milliseconds(50), nullptr)));
  std::atomic<bool> cancel(true);
  EXPECT_TRUE(absl::IsCancelled(ReadFrame(fds[1], &got, absl::InfiniteFuture(), &cancel)));

  // Half a frame, then the writer goes: broken, not a clean end.
  const char partial[6] = {10, 0, 0, 0, 1, 2};
  ASSERT_EQ(write(fds[0], partial, sizeof partial), 6);
  close(fds[0]);
  EXPECT_TRUE(absl::IsUnavailable(ReadFrame(fds[1], &got, absl::InfiniteFuture(), nullptr)));
  EXPECT_TRUE(absl::IsNotFound(ReadFrame(fds[1], &got, absl::InfiniteFuture(), nullptr)));
  close(fds[1]);
  // Writing to a peer that is gone is an error, not SIGPIPE.
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  close(fds[1]);
  EXPECT_TRUE(absl::IsUnavailable(WriteFrame(fds[0], sent)));
  close(fds[0]);
}

// exp(x) * scale + 1 over 64 floats; `fault` names the last node kiln-fault:KIND.
ir::Graph Graph(double scale, const std::string& fault = "") {
  WireGraph w;
  const int x = w.Input("x", v1::F32, {64});
  const int e = w.Op("exp", {x});
  const int m = w.Op("mul", {e, w.Scalar(scale)});
  const int y = w.Op("add", {m, w.Scalar(1.0)}, {}, fault.empty() ? "" : "kiln-fault:" + fault);
  w.Output(y);
  absl::StatusOr<ir::Graph> g = ir::DecodeGraph(w.graph());
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

// User + system CPU seconds of `pid` so far, from /proc/PID/stat.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; fields >> field && i <= 15; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

class WorkerProcessCompilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("KILN_BINARY_DIR");
    ASSERT_NE(dir, nullptr) << "KILN_BINARY_DIR is not set";
    kilnd_ = std::string(dir) + "/server/kilnd";
    ASSERT_EQ(access(kilnd_.c_str(), X_OK), 0) << kilnd_;
  }

  std::unique_ptr<WorkerProcessCompiler> Make(int workers, double timeout_s) {
    WorkerProcessOptions options;
    options.argv = {kilnd_, "--fault-injection=crash,hang", "--log-level=warn"};
    options.workers = workers;
    options.timeout_s = timeout_s;
    auto local = Pipeline::Create(PipelineConfig());
    EXPECT_TRUE(local.ok()) << local.status();
    auto compiler = WorkerProcessCompiler::Create(options, *std::move(local));
    EXPECT_TRUE(compiler.ok()) << compiler.status();
    return *std::move(compiler);
  }

  std::string kilnd_;
  const Target cpu_;
  const CompileOptions options_;
};

TEST_F(WorkerProcessCompilerTest, SameBytesAsInProcess) {
  auto compiler = Make(1, 0);
  auto in_process = Pipeline::Create(PipelineConfig());
  ASSERT_TRUE(in_process.ok());
  absl::StatusOr<CompileResult> local = (*in_process)->Compile(Graph(2), cpu_, options_);
  absl::StatusOr<CompileResult> remote = compiler->Compile(Graph(2), cpu_, options_);
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_TRUE(remote.ok()) << remote.status();
  ASSERT_EQ(remote->artifacts.size(), local->artifacts.size());
  for (size_t i = 0; i < local->artifacts.size(); ++i) {
    EXPECT_EQ(remote->artifacts[i].kind, local->artifacts[i].kind);
    if (local->artifacts[i].kind != ArtifactKind::kSharedObject) {
      EXPECT_EQ(remote->artifacts[i].bytes, local->artifacts[i].bytes) << i;
    }
  }
  EXPECT_EQ(remote->plan.steps.size(), local->plan.steps.size());
  EXPECT_EQ(remote->plan.buffers.size(), local->plan.buffers.size());
  EXPECT_EQ(remote->plan.workspace_bytes, local->plan.workspace_bytes);
  EXPECT_EQ(remote->stats.num_kernels, local->stats.num_kernels);
}

TEST_F(WorkerProcessCompilerTest, CrashIsAnErrorAndTheWorkerIsReplaced) {
  auto compiler = Make(1, 0);
  const std::vector<pid_t> before = compiler->WorkerPids();
  ASSERT_EQ(before.size(), 1u);
  absl::StatusOr<CompileResult> crashed = compiler->Compile(Graph(3, "crash"), cpu_, options_);
  ASSERT_TRUE(absl::IsInternal(crashed.status())) << crashed.status();
  EXPECT_NE(crashed.status().message().find("compile worker crashed: signal 11"), std::string::npos)
      << crashed.status();
  const std::vector<pid_t> after = compiler->WorkerPids();
  ASSERT_EQ(after.size(), 1u);
  EXPECT_NE(after[0], before[0]);
  EXPECT_FALSE(Alive(before[0]));
  EXPECT_TRUE(compiler->Compile(Graph(4), cpu_, options_).ok());
  v1::GetStatsResponse stats;
  compiler->AddStats(&stats);
  EXPECT_EQ(stats.worker_crashes(), 1);
  EXPECT_EQ(stats.worker_restarts(), 1);
}

TEST_F(WorkerProcessCompilerTest, HangRunsIntoTheTimeout) {
  auto compiler = Make(1, 1.0);
  const absl::Time start = absl::Now();
  absl::StatusOr<CompileResult> hung = compiler->Compile(Graph(5, "hang"), cpu_, options_);
  EXPECT_TRUE(absl::IsDeadlineExceeded(hung.status())) << hung.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(compiler->Compile(Graph(6), cpu_, options_).ok());
}

TEST_F(WorkerProcessCompilerTest, CancelStopsTheWorkerWithinASecond) {
  auto compiler = Make(2, 0);
  std::atomic<bool> cancel(false);
  absl::Time cancelled_at;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(300));
    cancelled_at = absl::Now();
    cancel.store(true);
  });
  absl::StatusOr<CompileResult> r =
      compiler->CompileCancellable(Graph(7, "hang"), cpu_, options_, cancel);
  const absl::Time returned = absl::Now();
  canceller.join();
  EXPECT_TRUE(absl::IsCancelled(r.status())) << r.status();
  EXPECT_LT(returned - cancelled_at, absl::Seconds(1));
  EXPECT_TRUE(compiler->Compile(Graph(8), cpu_, options_).ok());
}

TEST_F(WorkerProcessCompilerTest, ConcurrentCompilesShareThePool) {
  auto compiler = Make(2, 0);
  std::vector<std::thread> threads;
  std::atomic<int> ok(0);
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      if (compiler->Compile(Graph(10 + i), cpu_, options_).ok()) ok.fetch_add(1);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), 6);
}

TEST_F(WorkerProcessCompilerTest, IdleWorkersSleep) {
  auto compiler = Make(2, 0);
  ASSERT_TRUE(compiler->Compile(Graph(20), cpu_, options_).ok());  // both started and ready
  const std::vector<pid_t> pids = compiler->WorkerPids();
  std::vector<double> before;
  for (pid_t pid : pids) before.push_back(CpuSeconds(pid));
  absl::SleepFor(absl::Seconds(1));
  for (size_t i = 0; i < pids.size(); ++i) {
    EXPECT_LT(CpuSeconds(pids[i]) - before[i], 0.1)
        << "worker " << pids[i] << " is busy while idle";
  }
}

TEST_F(WorkerProcessCompilerTest, DestructorLeavesNoProcess) {
  std::vector<pid_t> pids;
  {
    auto compiler = Make(2, 0);
    pids = compiler->WorkerPids();
    ASSERT_EQ(pids.size(), 2u);
  }
  for (pid_t pid : pids) EXPECT_FALSE(Alive(pid)) << pid;
}

}  // namespace
}  // namespace kiln::worker
