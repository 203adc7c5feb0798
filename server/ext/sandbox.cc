#include "server/ext/sandbox.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace kiln::ext {
namespace {

namespace fs = std::filesystem;

// /lib, /lib64, /bin and /sbin: links into /usr on merged-/usr systems, folders elsewhere.
void AddRootLinks(std::vector<std::string>* args) {
  for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    std::error_code ec;
    fs::file_status st = fs::symlink_status(top, ec);
    if (ec || !fs::exists(st)) continue;
    if (fs::is_symlink(st)) {
      fs::path target = fs::read_symlink(top, ec);
      if (!ec) args->insert(args->end(), {"--symlink", target.string(), top});
    } else if (fs::is_directory(st)) {
      args->insert(args->end(), {"--ro-bind", top, top});
    }
  }
}

// Tasks (threads included: RLIMIT_NPROC counts them) that `uid` runs now.
int64_t TasksOf(uid_t uid) {
  int64_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream status(e.path() / "status");
    std::string line;
    bool mine = false;
    while (std::getline(status, line)) {
      if (line.rfind("Uid:", 0) == 0) {
        mine = std::stoul(line.substr(4)) == uid;
        if (!mine) break;
      } else if (mine && line.rfind("Threads:", 0) == 0) {
        n += std::stoll(line.substr(8));
        break;
      }
    }
  }
  return n;
}

toolchain::SandboxLimits LimitsFor(const SandboxOptions& options, double timeout_s) {
  toolchain::SandboxLimits limits = options.limits;
  if (timeout_s > 0) limits.timeout_s = timeout_s;
  if (geteuid() == 0) {
    limits.run_as_uid = options.uid;
    limits.run_as_gid = options.gid;
  } else if (limits.max_processes > 0) {
    // The commands run as kilnd's own user, whose count includes kilnd's threads: the cap is
    // on top of what runs now.
    limits.max_processes += TasksOf(geteuid());
  }
  return limits;
}

}  // namespace

absl::Status PrepareWritable(const SandboxOptions& options, const std::string& path) {
  if (geteuid() == 0 &&
      chown(path.c_str(), static_cast<uid_t>(options.uid), static_cast<gid_t>(options.gid)) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot hand ", path, " to the sandbox user"));
  }
  return absl::OkStatus();
}

absl::StatusOr<toolchain::ProcessResult> RunInSandbox(const SandboxOptions& options,
                                                      const std::vector<Mount>& mounts,
                                                      const std::string& workdir,
                                                      const std::vector<std::string>& argv,
                                                      double timeout_s) {
  std::vector<std::string> args = {options.bwrap,   "--unshare-all", "--die-with-parent",
                                   "--new-session", "--clearenv",    "--ro-bind",
                                   "/usr",          "/usr"};
  AddRootLinks(&args);
  // The dynamic loader's cache only: nothing else of /etc (passwd, keys, kilnd's config).
  if (fs::exists("/etc/ld.so.cache")) {
    args.insert(args.end(), {"--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"});
  }
  args.insert(args.end(), {"--proc", "/proc", "--dev", "/dev", "--size",
                           absl::StrCat(options.tmp_bytes), "--tmpfs", "/tmp"});
  // After /tmp, so that a toolchain named by a path in it (a link, say) stays visible.
  for (const std::string& dir : options.toolchain_dirs) {
    args.insert(args.end(), {"--ro-bind", dir, dir});
  }
  for (const auto& [path, target] : options.toolchain_links) {
    args.insert(args.end(), {"--symlink", target, path});
  }
  for (const Mount& m : mounts) {
    args.insert(args.end(), {m.writable ? "--bind" : "--ro-bind", m.host, m.inside});
  }
  args.insert(args.end(),
              {"--setenv", "PATH", "/usr/local/cuda/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
               "--setenv", "TMPDIR", "/tmp", "--setenv", "LC_ALL", "C", "--chdir", workdir, "--"});
  args.insert(args.end(), argv.begin(), argv.end());
  return toolchain::RunSandboxed(args, "/", LimitsFor(options, timeout_s));
}

absl::Status ProbeSandbox(const SandboxOptions& options) {
  absl::StatusOr<toolchain::ProcessResult> r = RunInSandbox(options, {}, "/", {"/bin/true"}, 20);
  if (!r.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the build sandbox cannot run (", r.status().message(),
                     "): install bubblewrap (Debian: apt install bubblewrap)"));
  }
  if (r->exit_code != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the build sandbox cannot run: bwrap exited with ", r->exit_code, ": ",
                     r->output, " (user namespaces must be enabled)"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::ext
