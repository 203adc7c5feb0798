// The build sandbox: runs one command of an untrusted build (a compiler, a linker) with
// bubblewrap (Debian's `bubblewrap`), so that what the caller's sources can make the toolchain
// do stays inside.
//
// Inside, the command sees only: the toolchain read-only (/usr, the /lib and /bin links, any
// extra toolchain folders, and the symlinks that name them, such as /etc/alternatives/cuda), a
// fresh /proc and minimal /dev, a size-capped /tmp, and the mounts it is given (the build's
// input trees read-only, its output folder writable). No /etc beyond the loader cache, no
// /home, /root or /var: kilnd's cache, keys and config are not there to read. It runs in new
// user, PID, network (loopback only, nothing listening), IPC and UTS namespaces, in a new
// session, with a clear environment, and dies with kilnd.
//
// Limits: wall-clock time (the whole process tree is killed), address space, CPU time, file
// size, and processes: when kilnd runs as root the command runs as an unprivileged uid
// (default 65534) whose process count RLIMIT_NPROC caps, so a fork bomb stops at the cap.
// Thread-safety: RunInSandbox may be called from many threads at once.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/toolchain/subprocess.h"

namespace kiln::ext {

// bwrap runs as the sandbox's identity and opens mount sources by path: every folder above a
// mount's host path must be traversable by it (ExtensionBuilder keeps its trees and build
// folders in a scratch folder of mode 0711 for that reason, not in the cache folder).
struct Mount {
  std::string host;    // an existing folder (or file) on the host
  std::string inside;  // where the command sees it
  bool writable = false;
};

struct SandboxOptions {
  std::string bwrap = "bwrap";  // looked up on PATH
  // The unprivileged identity commands run as when kilnd is root (a non-root kilnd runs them
  // as itself and caps processes the same way).
  int uid = 65534;
  int gid = 65534;
  toolchain::SandboxLimits limits{.timeout_s = 300,
                                  .address_space_bytes = int64_t{8} << 30,
                                  .file_size_bytes = int64_t{512} << 20,
                                  .max_processes = 64};
  int64_t tmp_bytes = int64_t{512} << 20;  // the /tmp tmpfs
  // Toolchain folders outside /usr (a CUDA toolkit in /opt, say), mounted read-only in place.
  std::vector<std::string> toolchain_dirs;
  // Symlinks (path, target) made inside, so that the names the toolchain is known by outside
  // /usr resolve there as on the host (/etc/alternatives/cuda -> /usr/local/cuda-13.0).
  std::vector<std::pair<std::string, std::string>> toolchain_links;
};

// Whether sandboxed commands can run here: OK, or FailedPrecondition saying why (bwrap
// missing, user namespaces disabled). Runs `/bin/true` in a sandbox.
absl::Status ProbeSandbox(const SandboxOptions& options);

// Runs `argv` (argv[0] an absolute path inside the sandbox) in `workdir` (a path inside).
// `limits_override.timeout_s` > 0 replaces the options' timeout for this command.
// DeadlineExceeded when it ran past its time; otherwise the exit status and output.
absl::StatusOr<toolchain::ProcessResult> RunInSandbox(const SandboxOptions& options,
                                                      const std::vector<Mount>& mounts,
                                                      const std::string& workdir,
                                                      const std::vector<std::string>& argv,
                                                      double timeout_s = 0);

// Makes `path` (a folder the sandbox writes into) usable by the sandbox's identity.
absl::Status PrepareWritable(const SandboxOptions& options, const std::string& path);

}  // namespace kiln::ext
