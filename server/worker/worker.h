// Compile workers: the kernel compiler run in supervised child processes, so that a crash, a
// hang or a runaway allocation in the frontend, codegen or NVRTC fails one request instead of
// taking kilnd down.
//
// Contract.
// - kilnd starts `workers` worker processes up front (pre-forked: a compile never waits for a
//   process to start) by re-executing its own binary with --compile-worker-fd=N. Each worker is
//   its own process group, gets SIGKILL when kilnd dies (PR_SET_PDEATHSIG), has its address
//   space capped (RLIMIT_AS, `memory_bytes`) and runs one compile at a time under a CPU-time
//   cap (RLIMIT_CPU set afresh before each compile, `cpu_seconds`). g++ runs as the worker's
//   own sandboxed child (kernels/toolchain/subprocess.h).
// - kilnd and a worker talk over a socketpair: kiln.v1.WorkerRequest / WorkerResponse
//   (proto/kiln/v1/worker.proto), each framed as a 4-byte little-endian length and the bytes.
// - One request, one worker. When the worker dies during the request the request fails with
//   Internal "compile worker crashed: signal 11 (Segmentation fault)" (or the exit code); when
//   it overruns `timeout_s` of wall clock it is killed and the request fails with
//   DeadlineExceeded; past its CPU-time cap the kernel kills it (SIGXCPU) and the request fails
//   with ResourceExhausted; out of memory answers ResourceExhausted. When the caller cancels
//   (CompileCancellable), the worker is killed within kPollInterval and the request answers
//   Cancelled. In every case the worker and everything it started is killed and reaped, and a
//   fresh worker takes its place before the next compile; each event is counted.
// - Fault injection (tests only): a worker started with --fault-injection=KIND[,KIND...]
//   misbehaves on graphs that carry a node named "kiln-fault:KIND": crash (SIGSEGV), abort,
//   hang (sleeps forever), spin (burns CPU forever), oom (allocates until refused). Without
//   the flag the names mean nothing; clients cannot turn it on.
//
// Thread-safety: WorkerProcessCompiler's methods may be called from many threads at once; each
// compile holds one worker exclusively. RunCompileWorker is the whole life of a worker process.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/pipeline.h"
#include "kiln/v1/worker.pb.h"
#include "server/compile/compiler.h"

namespace kiln::worker {

// How often a waiting compile looks at its cancel flag.
inline constexpr absl::Duration kPollInterval = absl::Milliseconds(100);

// ---- Framing (both sides) ----

// Writes one length-prefixed message. Unavailable when the peer is gone.
absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& message);
// Reads one length-prefixed message into `out`, waiting until `deadline`, giving up when
// `cancel` (if given) turns true. NotFound on a clean end of stream before any byte;
// Unavailable when the stream breaks mid-message; DeadlineExceeded; Cancelled; DataLoss when
// the bytes do not parse.
absl::Status ReadFrame(int fd, google::protobuf::MessageLite* out, absl::Time deadline,
                       const std::atomic<bool>* cancel);

// ---- The worker process ----

struct WorkerConfig {
  PipelineConfig pipeline;
  double cpu_seconds = 0;       // per compile; 0: no cap
  std::string fault_injection;  // tests only; see the contract above
};

// Serves compile requests on `fd` until the stream ends. Returns the process exit code.
int RunCompileWorker(int fd, const WorkerConfig& config);

// ---- The supervisor, as a Compiler ----

struct WorkerProcessOptions {
  // The worker's command line: argv[0] is the executable (e.g. "/proc/self/exe"), then its
  // flags; "--compile-worker-fd=N" is appended.
  std::vector<std::string> argv;
  int workers = 1;           // processes; at most this many compiles run at once
  int64_t memory_bytes = 0;  // RLIMIT_AS of each worker; 0: no cap
  double timeout_s = 0;      // wall clock per compile; 0: no limit
  double cpu_seconds = 0;    // reported in messages only; the worker enforces it (WorkerConfig)
};

class WorkerProcessCompiler final : public compile::Compiler {
 public:
  // `local` answers CheckTarget and Fingerprint in kilnd itself (cheap, and they must agree
  // with the workers', which run the same binary and configuration). Starts every worker;
  // Unavailable when one cannot be started.
  static absl::StatusOr<std::unique_ptr<WorkerProcessCompiler>> Create(
      const WorkerProcessOptions& options, std::unique_ptr<Pipeline> local);
  // Closes every worker's socket (a worker exits on end of stream), waits briefly, then
  // kills what is left and reaps all of them.
  ~WorkerProcessCompiler() override;

  absl::Status CheckTarget(const Target& target) const override;
  std::string Fingerprint(const Target& target) const override;
  absl::StatusOr<CompileResult> Compile(const ir::Graph& graph, const Target& target,
                                        const CompileOptions& options) override;
  absl::StatusOr<CompileResult> CompileCancellable(const ir::Graph& graph, const Target& target,
                                                   const CompileOptions& options,
                                                   const std::atomic<bool>& cancel) override;
  void AddStats(v1::GetStatsResponse* stats) const override;

  // Process ids of the live workers (tests).
  std::vector<pid_t> WorkerPids() const;

 private:
  struct Slot {
    pid_t pid = 0;  // 0: no process (lost; started again before the next use)
    int fd = -1;
    bool busy = false;
  };
  WorkerProcessCompiler(WorkerProcessOptions options, std::unique_ptr<Pipeline> local);

  absl::Status Spawn(Slot& slot) const;
  // Kills the worker and everything it started, reaps it, and leaves the slot empty. Returns
  // how the process ended ("signal 11 (Segmentation fault)", "exit code 3", "killed").
  std::string Retire(Slot& slot, bool already_dying) const;
  // Retire(), then Spawn() a replacement (counted). Returns how the old worker ended.
  std::string Replace(Slot& slot, bool already_dying);
  // Waits for an idle worker, marks it busy and copies it out; Release puts it back.
  int Acquire(Slot* slot);
  void Release(int index, const Slot& slot);
  absl::StatusOr<CompileResult> RunOn(Slot& slot, const v1::WorkerRequest& request,
                                      const std::atomic<bool>& cancel);

  // Immutable after construction.
  const WorkerProcessOptions options_;
  const std::unique_ptr<Pipeline> local_;

  mutable absl::Mutex mu_;
  absl::CondVar idle_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);  // a busy slot is owned by its caller
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;

  std::atomic<int64_t> crashes_{0};
  std::atomic<int64_t> timeouts_{0};
  std::atomic<int64_t> cancels_{0};
  std::atomic<int64_t> restarts_{0};
};

}  // namespace kiln::worker
