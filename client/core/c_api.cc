// The C ABI of kiln_core.h over ArtifactStore and CpuLibrary.
#include <cstring>
#include <memory>
#include <string>

#include "client/core/cpu_library.h"
#include "client/core/kiln_core.h"
#include "client/core/store.h"

struct kiln_store {
  std::unique_ptr<kiln::core::ArtifactStore> store;
};
// kiln_cpu_library stays incomplete: a handle is the registry's CpuLibrary, cast.

namespace {

thread_local kiln::core::Error last_error;

// Records `error` as the thread's last one (clearing it when ok); returns error.ok().
bool Record(const kiln::core::Error& error) {
  last_error = error;
  return error.ok();
}

int Fail(kiln_core_error code, const char* message) {
  last_error.Fail(code, message);
  return -1;
}

// Copies `path` into the caller's buffer; -1 when it does not fit.
int CopyPath(const std::string& path, char* out, size_t out_size) {
  if (out == nullptr || out_size <= path.size()) {
    return Fail(KILN_CORE_INVALID_ARGUMENT, "the path buffer is too small");
  }
  std::memcpy(out, path.c_str(), path.size() + 1);
  return 0;
}

const kiln_cpu_library* Wrap(const kiln::core::CpuLibrary* library) {
  return reinterpret_cast<const kiln_cpu_library*>(library);
}

const kiln::core::CpuLibrary* Unwrap(const kiln_cpu_library* library) {
  return reinterpret_cast<const kiln::core::CpuLibrary*>(library);
}

}  // namespace

extern "C" {

uint32_t kiln_core_abi_version(void) { return KILN_CORE_ABI_VERSION; }
const char* kiln_core_last_error(void) { return last_error.message.c_str(); }
int kiln_core_last_error_code(void) { return last_error.code; }

kiln_store* kiln_store_open(const char* root) {
  kiln::core::Error error;
  auto store = kiln::core::ArtifactStore::Open(root != nullptr ? root : "", &error);
  if (!Record(error) || store == nullptr) return nullptr;
  return new kiln_store{std::move(store)};
}

void kiln_store_close(kiln_store* store) { delete store; }

const char* kiln_store_root(const kiln_store* store) {
  return store != nullptr ? store->store->root().c_str() : "";
}

int kiln_store_find(kiln_store* store, const char* digest, char* path, size_t path_size) {
  if (store == nullptr || digest == nullptr)
    return Fail(KILN_CORE_INVALID_ARGUMENT, "null argument");
  kiln::core::Error error;
  std::optional<std::string> found = store->store->Find(digest, &error);
  if (!Record(error)) return -1;
  if (!found.has_value()) return 0;
  return CopyPath(*found, path, path_size) == 0 ? 1 : -1;
}

int kiln_store_put(kiln_store* store, const char* digest, const void* bytes, size_t num_bytes,
                   char* path, size_t path_size) {
  if (store == nullptr || digest == nullptr || (bytes == nullptr && num_bytes > 0))
    return Fail(KILN_CORE_INVALID_ARGUMENT, "null argument");
  kiln::core::Error error;
  std::optional<std::string> stored = store->store->Put(
      digest, std::string_view(static_cast<const char*>(bytes), num_bytes), &error);
  if (!Record(error) || !stored.has_value()) return -1;
  return CopyPath(*stored, path, path_size);
}

void kiln_store_counters(const kiln_store* store, int64_t* hits, int64_t* corruptions,
                         int64_t* puts) {
  kiln::core::ArtifactStore::Counters c;
  if (store != nullptr) c = store->store->counters();
  if (hits != nullptr) *hits = c.hits;
  if (corruptions != nullptr) *corruptions = c.corruptions;
  if (puts != nullptr) *puts = c.puts;
}

void kiln_sha256_hex(const void* bytes, size_t num_bytes, char* hex) {
  const std::string h =
      kiln::core::Sha256Hex(std::string_view(static_cast<const char*>(bytes), num_bytes));
  std::memcpy(hex, h.c_str(), h.size() + 1);
}

const kiln_cpu_library* kiln_cpu_open(const char* path) {
  if (path == nullptr) {
    Fail(KILN_CORE_INVALID_ARGUMENT, "null path");
    return nullptr;
  }
  kiln::core::Error error;
  const kiln::core::CpuLibrary* library = kiln::core::OpenCpuLibrary(path, &error);
  Record(error);
  return Wrap(library);
}

const kiln_cpu_library* kiln_cpu_open_image(const void* bytes, size_t num_bytes, const char* name) {
  if (bytes == nullptr || name == nullptr) {
    Fail(KILN_CORE_INVALID_ARGUMENT, "null argument");
    return nullptr;
  }
  kiln::core::Error error;
  const kiln::core::CpuLibrary* library = kiln::core::OpenCpuImage(
      std::string_view(static_cast<const char*>(bytes), num_bytes), name, &error);
  Record(error);
  return Wrap(library);
}

uint32_t kiln_cpu_abi_version(const kiln_cpu_library* library) {
  return library != nullptr ? Unwrap(library)->abi_version : 0;
}

void* kiln_cpu_run_function(const kiln_cpu_library* library) {
  if (library == nullptr) return nullptr;
  const kiln::core::CpuLibrary& l = *Unwrap(library);
  return l.abi_version == 2 ? reinterpret_cast<void*>(l.run_sized) : reinterpret_cast<void*>(l.run);
}

void* kiln_cpu_workspace_function(const kiln_cpu_library* library) {
  return library != nullptr ? reinterpret_cast<void*>(Unwrap(library)->workspace) : nullptr;
}

int64_t kiln_cpu_library_count(void) { return kiln::core::CpuLibraryCount(); }

}  // extern "C"
