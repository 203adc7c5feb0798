#include "server/ext/cuda_toolkit.h"

#include <unistd.h>

#include <deque>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kiln::ext {
namespace {

namespace fs = std::filesystem;

// The kernel's own limit on symlinks followed in one lookup.
constexpr int kMaxLinks = 40;

bool Executable(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) && access(path.c_str(), X_OK) == 0;
}

std::string OnPath(const std::string& program, const GetEnv& getenv) {
  const char* path = getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    if (dir.empty()) continue;
    std::string p = absl::StrCat(dir, "/", program);
    if (Executable(p)) return p;
  }
  return "";
}

// Whether the sandbox shows `path` as the host has it already: /usr is mounted whole, and the
// top-level links into it (/bin, /lib, ...) are made as the host has them.
bool InSandboxAlready(const std::string& path) {
  for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    if (path == top) return true;
  }
  return path == "/usr" || absl::StartsWith(path, "/usr/");
}

}  // namespace

std::string ResolveFollowingLinks(const std::string& path,
                                  std::vector<std::pair<std::string, std::string>>* links) {
  if (path.empty() || path[0] != '/') return "";
  std::deque<std::string> todo;
  for (const fs::path& part : fs::path(path).relative_path()) todo.push_back(part.string());
  fs::path cur = "/";
  int followed = 0;
  while (!todo.empty()) {
    const std::string part = todo.front();
    todo.pop_front();
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      cur = cur.parent_path();
      continue;
    }
    const fs::path next = cur / part;
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(next, ec);
    if (ec || !fs::exists(st)) return "";
    if (!fs::is_symlink(st)) {
      cur = next;
      continue;
    }
    if (++followed > kMaxLinks) return "";
    const fs::path target = fs::read_symlink(next, ec);
    if (ec) return "";
    links->emplace_back(next.string(), target.string());
    if (target.is_absolute()) cur = "/";
    std::vector<std::string> parts;
    for (const fs::path& t : target.relative_path()) parts.push_back(t.string());
    todo.insert(todo.begin(), parts.begin(), parts.end());
  }
  return cur.string();
}

CudaToolkit FindCudaToolkit(const std::string& nvcc_flag, const GetEnv& getenv) {
  CudaToolkit tk;
  std::string named;  // the path nvcc was found by, before resolving
  if (!nvcc_flag.empty()) {
    named = nvcc_flag.find('/') != std::string::npos ? nvcc_flag : OnPath(nvcc_flag, getenv);
    tk.how = absl::StrCat("--nvcc=", nvcc_flag);
  } else if (const char* home = getenv("CUDA_HOME"); home != nullptr && *home != '\0') {
    named = absl::StrCat(home, "/bin/nvcc");
    tk.how = absl::StrCat("$CUDA_HOME=", home);
  } else if (const char* path = getenv("CUDA_PATH"); path != nullptr && *path != '\0') {
    named = absl::StrCat(path, "/bin/nvcc");
    tk.how = absl::StrCat("$CUDA_PATH=", path);
  } else if (named = OnPath("nvcc", getenv); !named.empty()) {
    tk.how = "nvcc on $PATH";
  } else {
    named = "/usr/local/cuda/bin/nvcc";
    tk.how = "/usr/local/cuda";
  }
  if (named.empty()) return tk;
  std::error_code ec;
  named = fs::absolute(named, ec).lexically_normal().string();
  if (ec) return tk;
  tk.how = absl::StrCat(tk.how, ": ", named);
  std::vector<std::pair<std::string, std::string>> links;
  const std::string real = ResolveFollowingLinks(named, &links);
  if (real.empty() || !Executable(real)) return tk;
  tk.nvcc = real;
  tk.root = fs::path(real).parent_path().parent_path().string();
  if (!InSandboxAlready(tk.root) && tk.root != "/") tk.mount = tk.root;
  for (auto& [link, target] : links) {
    // Links inside /usr or the toolkit are in the sandbox already.
    if (InSandboxAlready(link) || absl::StartsWith(link, tk.root + "/")) continue;
    tk.links.emplace_back(std::move(link), std::move(target));
  }
  return tk;
}

}  // namespace kiln::ext
