// KilndProcess: runs the real kilnd binary as a child process for tests and benchmarks.
//
// Start() launches it with --listen 127.0.0.1:0 and the given cache directory, and waits for
// the "kilnd listening on HOST:PORT" line on its stdout to learn the address; what kilnd printed
// until then (e.g. its "kilnd metrics on" line) is kept in startup_output(). Stop() sends a
// signal and reaps the process; the destructor kills a child still running.
// Thread-safety: not thread-safe; one owner.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "kiln/v1/service.grpc.pb.h"

namespace kiln::testing {

// The kilnd binary under test: $KILND_PATH, else the path the build baked in.
inline std::string KilndPath() {
  if (const char* env = std::getenv("KILND_PATH"); env != nullptr && *env != '\0') return env;
#ifdef KILND_PATH
  return KILND_PATH;
#else
  return "kilnd";
#endif
}

class KilndProcess {
 public:
  KilndProcess() = default;
  KilndProcess(const KilndProcess&) = delete;
  KilndProcess& operator=(const KilndProcess&) = delete;
  ~KilndProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (stdout_fd_ >= 0) close(stdout_fd_);
  }

  // Returns an empty string on success, else what went wrong. `quiet` sends kilnd's log to
  // /dev/null instead of this process's stderr.
  std::string Start(const std::string& cache_dir, std::vector<std::string> extra_args = {},
                    bool quiet = false) {
    int out[2];
    if (pipe(out) != 0) return "pipe failed";
    std::vector<std::string> args = {KilndPath(), "--listen=127.0.0.1:0",
                                     "--cache-dir=" + cache_dir};
    // $KILND_LOG_LEVEL (e.g. debug) helps when a test needs the daemon's side of the story.
    if (const char* level = std::getenv("KILND_LOG_LEVEL"); level != nullptr && *level != '\0') {
      args.push_back(std::string("--log-level=") + level);
    }
    for (auto& a : extra_args) args.push_back(std::move(a));
    // Built before fork: the child of a threaded process may only make async-signal-safe calls.
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ < 0) return "fork failed";
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      if (quiet) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, STDERR_FILENO);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    stdout_fd_ = out[0];
    // Read stdout until the listening line, for at most 60 s (a cold start opens RocksDB and
    // probes the host compiler).
    const std::string marker = "kilnd listening on ";
    std::string buffer;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < give_up) {
      pollfd p{stdout_fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) {
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          return "kilnd exited before listening (status " + std::to_string(status) + ")";
        }
        continue;
      }
      char chunk[256];
      const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
      if (n <= 0) continue;
      buffer.append(chunk, static_cast<size_t>(n));
      const size_t at = buffer.find(marker);
      const size_t eol = at == std::string::npos ? at : buffer.find('\n', at);
      if (eol != std::string::npos) {
        address_ = buffer.substr(at + marker.size(), eol - at - marker.size());
        startup_output_ = buffer;
        return "";
      }
    }
    return "kilnd did not print its address within 60 s";
  }

  // Sends `signal` and waits up to `timeout_s` for the exit; returns the exit status as
  // waitpid reports it, or -1 when it did not exit in time (it is then killed).
  int Stop(int signal = SIGTERM, int timeout_s = 60) {
    if (pid_ <= 0) return -1;
    kill(pid_, signal);
    int status = 0;
    for (int i = 0; i < timeout_s * 100; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      usleep(10000);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    return -1;
  }

  const std::string& address() const { return address_; }
  const std::string& startup_output() const { return startup_output_; }
  pid_t pid() const { return pid_; }

  std::shared_ptr<grpc::Channel> Channel() const {
    return grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  }
  std::unique_ptr<v1::Kiln::Stub> Stub() const { return v1::Kiln::NewStub(Channel()); }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string address_;
  std::string startup_output_;
};

}  // namespace kiln::testing
