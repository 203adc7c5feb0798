#include "kernels/toolchain/subprocess.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace kiln::toolchain {

absl::StatusOr<ProcessResult> RunSandboxed(const std::vector<std::string>& argv,
                                           const std::string& workdir,
                                           const SandboxLimits& limits) {
  auto start = std::chrono::steady_clock::now();
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return absl::UnavailableError("pipe failed");
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return absl::UnavailableError("fork failed");
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    setpgid(0, 0);
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    if (chdir(workdir.c_str()) != 0) _exit(126);
    struct rlimit rl;
    rl.rlim_cur = rl.rlim_max = static_cast<rlim_t>(limits.address_space_bytes);
    setrlimit(RLIMIT_AS, &rl);
    rl.rlim_cur = rl.rlim_max = static_cast<rlim_t>(limits.file_size_bytes);
    setrlimit(RLIMIT_FSIZE, &rl);
    rl.rlim_cur = rl.rlim_max = static_cast<rlim_t>(limits.timeout_s + 5);
    setrlimit(RLIMIT_CPU, &rl);
    rl.rlim_cur = rl.rlim_max = 0;
    setrlimit(RLIMIT_CORE, &rl);
    if (limits.run_as_uid >= 0) {
      if (setgroups(0, nullptr) != 0 && errno != EPERM) _exit(126);
      if (setgid(static_cast<gid_t>(limits.run_as_gid >= 0 ? limits.run_as_gid
                                                           : limits.run_as_uid)) != 0 ||
          setuid(static_cast<uid_t>(limits.run_as_uid)) != 0)
        _exit(126);
    }
    if (limits.max_processes > 0) {
      rl.rlim_cur = rl.rlim_max = static_cast<rlim_t>(limits.max_processes);
      setrlimit(RLIMIT_NPROC, &rl);
    }
    execvp(cargv[0], cargv.data());
    _exit(127);
  }
  close(pipefd[1]);
  ProcessResult r;
  bool timed_out = false;
  auto deadline = start + std::chrono::duration<double>(limits.timeout_s);
  char buf[4096];
  for (;;) {
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      timed_out = true;
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      break;
    }
    int wait_ms =
        static_cast<int>(std::chrono::duration<double, std::milli>(deadline - now).count()) + 1;
    struct pollfd pfd = {pipefd[0], POLLIN, 0};
    int pr = poll(&pfd, 1, std::min(wait_ms, 1000));
    if (pr < 0 && errno != EINTR) break;
    if (pr <= 0) continue;
    ssize_t n = read(pipefd[0], buf, sizeof buf);
    if (n <= 0) break;  // EOF: the child closed its output
    if (r.output.size() < (64 << 10)) r.output.append(buf, static_cast<size_t>(n));
  }
  close(pipefd[0]);
  // The output closed; the child may still run (it closed its own output): wait for it no
  // longer than the deadline.
  int status = 0;
  for (;;) {
    pid_t w = waitpid(pid, &status, timed_out ? 0 : WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) break;
    if (w == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        timed_out = true;
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        continue;
      }
      usleep(2000);
    }
  }
  r.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (timed_out)
    return absl::DeadlineExceededError(
        absl::StrCat(argv[0], " ran past its ", limits.timeout_s, " s limit"));
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
    if (r.exit_code == 127) return absl::UnavailableError(absl::StrCat("cannot run ", argv[0]));
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  return r;
}

absl::StatusOr<TempDir> TempDir::Create(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  return CreateIn(base && *base ? base : "/tmp", prefix);
}

absl::StatusOr<TempDir> TempDir::CreateIn(const std::string& parent, const std::string& prefix) {
  std::string tmpl = absl::StrCat(parent, "/", prefix, "XXXXXX");
  std::vector<char> b(tmpl.begin(), tmpl.end());
  b.push_back('\0');
  if (!mkdtemp(b.data())) return absl::UnavailableError(absl::StrCat("mkdtemp failed for ", tmpl));
  return TempDir(std::string(b.data()));
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace kiln::toolchain
