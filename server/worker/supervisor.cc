// The kilnd side: starting, using, killing and replacing worker processes.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/ir/decode.h"
#include "server/compile/result_convert.h"
#include "server/worker/worker.h"
#include "spdlog/spdlog.h"

namespace kiln::worker {
namespace {

// The worker's end of the socketpair, in the worker.
constexpr int kWorkerFd = 3;

v1::CompileOptions EncodeOptions(const CompileOptions& options) {
  v1::CompileOptions wire;
  wire.set_opt_level(options.opt_level);
  wire.set_opt_level_set(true);
  wire.set_disable_vector_math(!options.vector_math);
  wire.set_disable_algebraic_rewrites(!options.algebraic_rewrites);
  wire.set_variant(options.variant);
  return wire;
}

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return absl::StrCat("signal ", sig, " (", strsignal(sig), ")");
  }
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  return "unknown status";
}

// Parent pid of every process, from /proc/PID/stat (the field after the parenthesised name).
absl::flat_hash_map<pid_t, pid_t> ParentsOfAll() {
  absl::flat_hash_map<pid_t, pid_t> parents;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return parents;
  while (struct dirent* e = readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string line;
    if (!std::getline(stat, line)) continue;
    const size_t close = line.rfind(')');
    if (close == std::string::npos || close + 4 >= line.size()) continue;
    // ") S PPID ..."
    const size_t start = close + 4;
    const size_t end = line.find(' ', start);
    int ppid = 0;
    if (absl::SimpleAtoi(line.substr(start, end - start), &ppid)) parents[pid] = ppid;
  }
  closedir(proc);
  return parents;
}

// SIGKILLs `root`, every descendant and their process groups (g++ runs in a group of its own,
// and its cc1plus/as/ld children in that group). `root` is stopped first so it cannot start
// anything new while its descendants are collected.
void KillTree(pid_t root) {
  kill(root, SIGSTOP);
  absl::flat_hash_map<pid_t, pid_t> parents = ParentsOfAll();
  std::vector<pid_t> tree = {root};
  for (size_t i = 0; i < tree.size(); ++i) {
    for (const auto& [pid, ppid] : parents) {
      if (ppid == tree[i]) tree.push_back(pid);
    }
  }
  for (size_t i = tree.size(); i-- > 1;) {
    kill(-tree[i], SIGKILL);  // its group, when it leads one
    kill(tree[i], SIGKILL);
  }
  kill(-root, SIGKILL);
  kill(root, SIGKILL);
}

// Waits up to `wait` for `pid` to exit on its own; true and its status when it did.
bool ReapWithin(pid_t pid, absl::Duration wait, int* status) {
  const absl::Time until = absl::Now() + wait;
  for (;;) {
    const pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return true;
    if (r < 0 && errno != EINTR) return true;  // not ours any more: nothing to reap
    if (absl::Now() >= until) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerProcessCompiler>> WorkerProcessCompiler::Create(
    const WorkerProcessOptions& options, std::unique_ptr<Pipeline> local) {
  if (options.argv.empty() || options.workers < 1) {
    return absl::InvalidArgumentError("worker command line empty or no workers");
  }
  std::unique_ptr<WorkerProcessCompiler> compiler(
      new WorkerProcessCompiler(options, std::move(local)));
  {
    absl::MutexLock lock(&compiler->mu_);
    for (Slot& slot : compiler->slots_) {
      if (absl::Status s = compiler->Spawn(slot); !s.ok()) return s;
    }
  }
  return compiler;
}

WorkerProcessCompiler::WorkerProcessCompiler(WorkerProcessOptions options,
                                             std::unique_ptr<Pipeline> local)
    : options_(std::move(options)), local_(std::move(local)) {
  slots_.resize(static_cast<size_t>(options_.workers));
}

WorkerProcessCompiler::~WorkerProcessCompiler() {
  absl::MutexLock lock(&mu_);
  // End of stream asks each worker to exit; give them a moment together, then force it.
  for (Slot& slot : slots_) {
    if (slot.fd >= 0) close(slot.fd);
    slot.fd = -1;
  }
  const absl::Time until = absl::Now() + absl::Seconds(2);
  for (Slot& slot : slots_) {
    if (slot.pid <= 0) continue;
    int status = 0;
    if (!ReapWithin(slot.pid, std::max(absl::ZeroDuration(), until - absl::Now()), &status)) {
      KillTree(slot.pid);
      waitpid(slot.pid, &status, 0);
    }
    slot.pid = 0;
  }
}

absl::Status WorkerProcessCompiler::Spawn(Slot& slot) const {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::UnavailableError(absl::StrCat("socketpair: ", strerror(errno)));
  }
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> args = options_.argv;
  args.push_back(absl::StrCat("--compile-worker-fd=", kWorkerFd));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  struct rlimit memory {};
  memory.rlim_cur = memory.rlim_max =
      options_.memory_bytes > 0 ? static_cast<rlim_t>(options_.memory_bytes) : RLIM_INFINITY;

  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::UnavailableError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);  // killed as a group; out of the terminal's way
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // kilnd died before the line above took effect
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);   // kilnd blocks SIGTERM for its sigwait
    if (dup2(fds[1], kWorkerFd) < 0) _exit(1);  // dup2 clears close-on-exec
    close_range(kWorkerFd + 1, ~0U, 0);         // nothing else of kilnd's (sockets, files) leaks in
    dup2(STDERR_FILENO, STDOUT_FILENO);         // kilnd's stdout is for its own announcements
    if (options_.memory_bytes > 0) setrlimit(RLIMIT_AS, &memory);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  slot.pid = pid;
  slot.fd = fds[0];
  return absl::OkStatus();
}

std::string WorkerProcessCompiler::Retire(Slot& slot, bool already_dying) const {
  int status = 0;
  std::string how = "killed";
  if (already_dying && ReapWithin(slot.pid, absl::Seconds(1), &status)) {
    how = DescribeExit(status);
  } else {
    KillTree(slot.pid);
    while (waitpid(slot.pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (slot.fd >= 0) close(slot.fd);
  slot.pid = 0;
  slot.fd = -1;
  return how;
}

std::string WorkerProcessCompiler::Replace(Slot& slot, bool already_dying) {
  std::string how = Retire(slot, already_dying);
  // Started at once, so the replacement loads while this request's error goes out.
  restarts_.fetch_add(1, std::memory_order_relaxed);
  if (absl::Status s = Spawn(slot); !s.ok()) {
    spdlog::error("cannot start a compile worker (retried on the next compile): {}", s.ToString());
  }
  return how;
}

int WorkerProcessCompiler::Acquire(Slot* slot) {
  absl::MutexLock lock(&mu_);
  for (;;) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i].busy) {
        slots_[i].busy = true;
        *slot = slots_[i];
        return static_cast<int>(i);
      }
    }
    idle_.Wait(&mu_);
  }
}

void WorkerProcessCompiler::Release(int index, const Slot& slot) {
  absl::MutexLock lock(&mu_);
  slots_[static_cast<size_t>(index)] = slot;
  slots_[static_cast<size_t>(index)].busy = false;
  idle_.Signal();
}

absl::Status WorkerProcessCompiler::CheckTarget(const Target& target) const {
  return local_->CheckTarget(target);
}

std::string WorkerProcessCompiler::Fingerprint(const Target& target) const {
  return local_->Fingerprint(target);
}

absl::StatusOr<CompileResult> WorkerProcessCompiler::Compile(const ir::Graph& graph,
                                                             const Target& target,
                                                             const CompileOptions& options) {
  const std::atomic<bool> never(false);
  return CompileCancellable(graph, target, options, never);
}

absl::StatusOr<CompileResult> WorkerProcessCompiler::CompileCancellable(
    const ir::Graph& graph, const Target& target, const CompileOptions& options,
    const std::atomic<bool>& cancel) {
  v1::WorkerRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_id(next_id_++);
  }
  v1::CompileRequest* wire = request.mutable_compile();
  *wire->mutable_graph() = ir::EncodeGraph(graph);
  *wire->mutable_target() = ir::EncodeTarget(target);
  *wire->mutable_options() = EncodeOptions(options);

  Slot slot;
  const int index = Acquire(&slot);
  absl::StatusOr<CompileResult> result = RunOn(slot, request, cancel);
  Release(index, slot);
  return result;
}

absl::StatusOr<CompileResult> WorkerProcessCompiler::RunOn(Slot& slot,
                                                           const v1::WorkerRequest& request,
                                                           const std::atomic<bool>& cancel) {
  if (slot.pid == 0) {
    // The replacement could not be started when the last worker was lost: try again.
    if (absl::Status s = Spawn(slot); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot start a compile worker: ", s.message()));
    }
  }
  const pid_t pid = slot.pid;
  const absl::Time deadline = options_.timeout_s > 0
                                  ? absl::Now() + absl::Seconds(options_.timeout_s)
                                  : absl::InfiniteFuture();
  v1::WorkerResponse response;
  absl::Status io = WriteFrame(slot.fd, request);
  if (io.ok()) io = ReadFrame(slot.fd, &response, deadline, &cancel);
  if (io.ok() && response.id() != request.id()) {
    io = absl::DataLossError(
        absl::StrCat("answer to request ", response.id(), ", not ", request.id()));
  }

  if (!io.ok()) {
    if (absl::IsCancelled(io)) {
      cancels_.fetch_add(1, std::memory_order_relaxed);
      Replace(slot, /*already_dying=*/false);
      return absl::CancelledError(
          "compile abandoned: every caller had gone (deadline or cancel); its worker was "
          "stopped");
    }
    if (absl::IsDeadlineExceeded(io)) {
      timeouts_.fetch_add(1, std::memory_order_relaxed);
      Replace(slot, /*already_dying=*/false);
      spdlog::warn("compile worker {} ran past {} s; killed", pid, options_.timeout_s);
      return absl::DeadlineExceededError(
          absl::StrCat("compile worker ran past its ", options_.timeout_s,
                       " s limit (--worker-timeout-s) and was killed"));
    }
    // The stream ended or broke: the worker died, or is about to.
    crashes_.fetch_add(1, std::memory_order_relaxed);
    const std::string how = Replace(slot, /*already_dying=*/true);
    spdlog::error("compile worker {} lost during a compile: {} ({})", pid, how, io.ToString());
    if (how.rfind(absl::StrCat("signal ", SIGXCPU, " "), 0) == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the compile ran past its CPU-time limit of ", options_.cpu_seconds,
                       " s (--worker-cpu-s); its worker was killed"));
    }
    return absl::InternalError(absl::StrCat("compile worker crashed: ", how));
  }

  if (response.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
  }
  CompileResult result;
  for (v1::WorkerArtifact& a : *response.mutable_artifacts()) {
    result.artifacts.push_back(
        {static_cast<ArtifactKind>(a.kind()), std::move(*a.mutable_bytes())});
  }
  result.plan = compile::FromWirePlan(response.plan());
  result.log = std::move(*response.mutable_log());
  result.stats = compile::FromWireStats(response.stats());
  return result;
}

void WorkerProcessCompiler::AddStats(v1::GetStatsResponse* stats) const {
  stats->set_worker_crashes(crashes_.load(std::memory_order_relaxed));
  stats->set_worker_timeouts(timeouts_.load(std::memory_order_relaxed));
  stats->set_worker_cancels(cancels_.load(std::memory_order_relaxed));
  stats->set_worker_restarts(restarts_.load(std::memory_order_relaxed));
}

std::vector<pid_t> WorkerProcessCompiler::WorkerPids() const {
  absl::MutexLock lock(&mu_);
  std::vector<pid_t> pids;
  for (const Slot& slot : slots_) {
    if (slot.pid > 0) pids.push_back(slot.pid);
  }
  return pids;
}

}  // namespace kiln::worker
