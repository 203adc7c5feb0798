// CpuLibrary: a CPU kernel library (kernels/codegen/ABI.md) opened in this process, its ABI
// version read and its entry points resolved.
//
// Libraries are opened once per key (a path, or the name given with an image) through a
// process-wide registry and never closed: a kernel library pulls in libgomp, whose worker
// threads outlive the parallel regions, and unloading it under them crashes the process. Paths
// from the artifact store name their content, so one key is one library for the life of the
// process. RTLD_LOCAL: two libraries never see each other's symbols.
//
// Thread-safety: thread-safe; a CpuLibrary is immutable.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "client/core/error.h"

namespace kiln::core {

struct CpuLibrary {
  using AbiFn = uint32_t (*)();
  using RunFn = int (*)(void* const* args, void* workspace, int num_threads);
  // ABI version 2 (graphs with symbolic sizes).
  using RunSizedFn = int (*)(void* const* args, const int64_t* sizes, void* workspace,
                             int num_threads);
  using WorkspaceFn = int64_t (*)(const int64_t* sizes);

  std::string path;
  uint32_t abi_version = 0;
  RunFn run = nullptr;              // version 1
  RunSizedFn run_sized = nullptr;   // version 2
  WorkspaceFn workspace = nullptr;  // version 2
};

// Opens the library at `path`: NOT_FOUND when the file is not there, FAILED_PRECONDITION when
// dlopen refuses it (wrong architecture, a missing libgomp) or it lacks kiln_abi_version or
// kiln_run, or is ABI 2 without kiln_workspace_bytes. Null on failure.
const CpuLibrary* OpenCpuLibrary(const std::string& path, Error* error);

// Opens a library from its bytes through an anonymous in-memory file, once per `name`. The
// file stays open for the life of the process: the loader knows a library by its name, and a
// closed descriptor's number (so /proc/self/fd/N) would be reused by the next image.
const CpuLibrary* OpenCpuImage(std::string_view bytes, const std::string& name, Error* error);

// How many libraries the registry holds.
int64_t CpuLibraryCount();

}  // namespace kiln::core
