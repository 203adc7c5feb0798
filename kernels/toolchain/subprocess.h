// Runs a compiler as a child process in a private working directory, with a wall-clock
// timeout and resource limits (address space, CPU time, file size), capturing its output.
// Thread-safety: RunSandboxed may be called from many threads at once.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::toolchain {

struct ProcessResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string output;  // stdout and stderr, interleaved, truncated to 64 KiB
  double ms = 0;
};

struct SandboxLimits {
  double timeout_s = 60;
  int64_t address_space_bytes = int64_t{8} << 30;
  int64_t file_size_bytes = int64_t{1} << 30;
  // RLIMIT_NPROC for the child (counted per user: meaningful with run_as_uid); 0: unchanged.
  int64_t max_processes = 0;
  // When >= 0 (and the caller may), the child drops to this uid/gid, with no supplementary
  // groups, before exec: the process cap then counts only its own processes.
  int run_as_uid = -1;
  int run_as_gid = -1;
};

// Runs argv[0] (looked up on PATH) in `workdir`. DeadlineExceeded on timeout (the child is
// killed), Unavailable if it cannot be started.
absl::StatusOr<ProcessResult> RunSandboxed(const std::vector<std::string>& argv,
                                           const std::string& workdir, const SandboxLimits& limits);

// A fresh private directory under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  static absl::StatusOr<TempDir> Create(const std::string& prefix);
  // The same, inside `parent` instead of $TMPDIR.
  static absl::StatusOr<TempDir> CreateIn(const std::string& parent, const std::string& prefix);
  TempDir(TempDir&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  TempDir(const TempDir&) = delete;
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string p) : path_(std::move(p)) {}
  std::string path_;
};

absl::Status WriteFile(const std::string& path, const std::string& bytes);
absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace kiln::toolchain
