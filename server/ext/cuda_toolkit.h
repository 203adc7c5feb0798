// The CUDA toolkit of custom builds: nvcc found as PyTorch's cpp_extension finds it, resolved
// through the symlinks that usually name it (/usr/local/cuda -> /etc/alternatives/cuda ->
// /usr/local/cuda-13.0), and what the build sandbox must hold for nvcc to run there and for
// includes that name the toolkit by any of those paths to work.
// Thread-safety: FindCudaToolkit reads the file system only; the result is a plain value.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::ext {

struct CudaToolkit {
  std::string nvcc;  // nvcc's real path (no symlink in it); empty: no nvcc
  std::string root;  // the toolkit's real root: nvcc's ../..
  std::string how;   // how it was found, for the log ("$CUDA_HOME=/usr/local/cuda")
  // For the sandbox: the real root to mount read-only in place (empty when /usr holds it),
  // and each symlink met on the way from the name it was found by to `nvcc` (link path,
  // target), to recreate inside.
  std::string mount;
  std::vector<std::pair<std::string, std::string>> links;
};

// An environment variable's value, or nullptr (std::getenv in kilnd, a fake in tests).
using GetEnv = std::function<const char*(const char*)>;

// `nvcc_flag` non-empty: that program (a path, or a name looked up on $PATH). Empty: as
// cpp_extension looks, $CUDA_HOME/bin/nvcc, else $CUDA_PATH/bin/nvcc, else nvcc on $PATH, else
// /usr/local/cuda/bin/nvcc. A variable that is set decides, as in cpp_extension: no nvcc where it
// points means none. The result's nvcc is empty when no executable was found (`how` says where
// it looked).
CudaToolkit FindCudaToolkit(const std::string& nvcc_flag, const GetEnv& getenv);

// Resolves `path` (absolute) as the kernel does, one component at a time, appending to `links`
// each symlink it follows (its path, with no symlink above it, and its target as written).
// Returns the real path, or empty (a dangling link, a loop).
std::string ResolveFollowingLinks(const std::string& path,
                                  std::vector<std::pair<std::string, std::string>>* links);

}  // namespace kiln::ext
