// The C ABI of kiln_core.h over ArtifactStore, AnswerFolder, CpuLibrary, CudaModule,
// CudaFunction, and wire/'s signed-result encoding, KeyRing and request key.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>

#include "client/core/answers.h"
#include "client/core/cpu_library.h"
#include "client/core/cuda_loader.h"
#include "client/core/kiln_core.h"
#include "client/core/store.h"
#include "kernels/key/sha256.h"
#include "wire/ed25519.h"
#include "wire/result_bytes.h"
#include "wire/serialized_request_key.h"

struct kiln_store {
  std::unique_ptr<kiln::core::ArtifactStore> store;
  kiln::core::AnswerFolder answers;  // under the store's root
};
struct kiln_trust {
  kiln::wire::KeyRing keys;
};
struct kiln_cuda_module {
  std::unique_ptr<kiln::core::CudaModule> module;
};
struct kiln_cuda_function {
  std::unique_ptr<kiln::core::CudaFunction> function;
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

// The outcomes are wire::TrustOutcome's, by number.
static_assert(static_cast<int>(kiln::wire::TrustOutcome::kKeyUnreadable) ==
              KILN_TRUST_KEY_UNREADABLE);
static_assert(static_cast<int>(kiln::wire::TrustOutcome::kKeyNotPem) == KILN_TRUST_KEY_NOT_PEM);
static_assert(static_cast<int>(kiln::wire::TrustOutcome::kKeyNotEd25519) ==
              KILN_TRUST_KEY_NOT_ED25519);
static_assert(static_cast<int>(kiln::wire::TrustOutcome::kMalformed) == KILN_TRUST_MALFORMED);
static_assert(static_cast<int>(kiln::wire::TrustOutcome::kUnsigned) == KILN_TRUST_UNSIGNED);
static_assert(static_cast<int>(kiln::wire::TrustOutcome::kOtherAlgorithm) ==
              KILN_TRUST_OTHER_ALGORITHM);
static_assert(static_cast<int>(kiln::wire::TrustOutcome::kUntrustedKey) ==
              KILN_TRUST_UNTRUSTED_KEY);
static_assert(static_cast<int>(kiln::wire::TrustOutcome::kMismatch) == KILN_TRUST_MISMATCH);

// Records a trust outcome as the thread's last error and returns its number (0 when ok).
int RecordTrust(const kiln::wire::TrustStatus& status) {
  using kiln::wire::TrustOutcome;
  kiln_core_error code = KILN_CORE_OK;
  switch (status.outcome) {
    case TrustOutcome::kOk:
      break;
    case TrustOutcome::kKeyUnreadable:
      code = KILN_CORE_NOT_FOUND;
      break;
    case TrustOutcome::kKeyNotPem:
    case TrustOutcome::kKeyNotEd25519:
    case TrustOutcome::kMalformed:
      code = KILN_CORE_INVALID_ARGUMENT;
      break;
    case TrustOutcome::kUnsigned:
    case TrustOutcome::kOtherAlgorithm:
    case TrustOutcome::kUntrustedKey:
      code = KILN_CORE_FAILED_PRECONDITION;
      break;
    case TrustOutcome::kMismatch:
      code = KILN_CORE_DATA_LOSS;
      break;
  }
  last_error = kiln::core::Error{code, status.message};
  return static_cast<int>(status.outcome);
}

std::string_view Bytes(const void* data, size_t size) {
  return std::string_view(static_cast<const char*>(data), data != nullptr ? size : 0);
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
  kiln::core::AnswerFolder answers(store->root());
  return new kiln_store{std::move(store), std::move(answers)};
}

void kiln_store_close(kiln_store* store) { delete store; }

const char* kiln_store_root(const kiln_store* store) {
  return store != nullptr ? store->store->root().c_str() : "";
}

int kiln_store_path_for(const kiln_store* store, const char* digest, char* path, size_t path_size) {
  if (store == nullptr || digest == nullptr)
    return Fail(KILN_CORE_INVALID_ARGUMENT, "null argument");
  kiln::core::Error error;
  std::optional<std::string> where = store->store->CheckedPathFor(digest, &error);
  if (!Record(error) || !where.has_value()) return -1;
  return CopyPath(*where, path, path_size);
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

int kiln_store_add(kiln_store* store, const void* bytes, size_t num_bytes, char* digest, char* path,
                   size_t path_size) {
  if (store == nullptr || digest == nullptr || (bytes == nullptr && num_bytes > 0))
    return Fail(KILN_CORE_INVALID_ARGUMENT, "null argument");
  kiln::core::Error error;
  std::string hex;
  std::optional<std::string> stored =
      store->store->Add(std::string_view(static_cast<const char*>(bytes), num_bytes), &hex, &error);
  if (!Record(error) || !stored.has_value()) return -1;
  std::memcpy(digest, hex.c_str(), hex.size() + 1);
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
      kiln::key::Sha256Hex(std::string_view(static_cast<const char*>(bytes), num_bytes));
  std::memcpy(hex, h.c_str(), h.size() + 1);
}

void kiln_answer_name(const char* address, const char* request_key, char* name) {
  const std::string hex = kiln::core::AnswerName(address != nullptr ? address : "",
                                                 request_key != nullptr ? request_key : "");
  std::memcpy(name, hex.c_str(), hex.size() + 1);
}

int kiln_store_load_answer(kiln_store* store, const char* name, double max_age_s, void** bytes,
                           size_t* num_bytes, int* is_private) {
  if (store == nullptr || name == nullptr || bytes == nullptr || num_bytes == nullptr ||
      is_private == nullptr) {
    return Fail(KILN_CORE_INVALID_ARGUMENT, "null argument");
  }
  kiln::core::Error error;
  std::optional<kiln::core::AnswerFolder::Answer> answer =
      store->answers.Load(name, max_age_s, &error);
  if (!Record(error)) return -1;
  if (!answer.has_value()) return 0;
  // The bytes and the NUL after them: never a zero-byte buffer, which malloc may give as null.
  void* copy = std::malloc(answer->response.size() + 1);
  if (copy == nullptr) return Fail(KILN_CORE_INTERNAL, "out of memory");
  std::memcpy(copy, answer->response.c_str(), answer->response.size() + 1);
  *bytes = copy;
  *num_bytes = answer->response.size();
  *is_private = answer->is_private ? 1 : 0;
  return 1;
}

int kiln_store_save_answer(kiln_store* store, const char* name, const void* bytes,
                           size_t num_bytes) {
  if (store == nullptr || name == nullptr || (bytes == nullptr && num_bytes > 0))
    return Fail(KILN_CORE_INVALID_ARGUMENT, "null argument");
  kiln::core::Error error;
  store->answers.Save(name, std::string_view(static_cast<const char*>(bytes), num_bytes), &error);
  return Record(error) ? 0 : -1;
}

int kiln_store_drop_answer(kiln_store* store, const char* name) {
  if (store == nullptr || name == nullptr) return Fail(KILN_CORE_INVALID_ARGUMENT, "null argument");
  kiln::core::Error error;
  store->answers.Drop(name, &error);
  return Record(error) ? 0 : -1;
}

void kiln_core_free(void* bytes) { std::free(bytes); }

int kiln_result_signed_bytes(const char* handle, const void* result, size_t result_bytes,
                             void** bytes, size_t* num_bytes) {
  if (handle == nullptr || (result == nullptr && result_bytes > 0) || bytes == nullptr ||
      num_bytes == nullptr) {
    return Fail(KILN_CORE_INVALID_ARGUMENT, "null argument");
  }
  std::string error;
  std::optional<kiln::wire::SignedResult> decoded =
      kiln::wire::DecodeSignedResult(handle, Bytes(result, result_bytes), &error);
  if (!decoded.has_value()) return Fail(KILN_CORE_INVALID_ARGUMENT, error.c_str());
  // Never a zero-byte buffer (the encoding is never empty: it starts with its domain).
  void* copy = std::malloc(decoded->bytes.size());
  if (copy == nullptr) return Fail(KILN_CORE_INTERNAL, "out of memory");
  std::copy(decoded->bytes.begin(), decoded->bytes.end(), static_cast<char*>(copy));
  *bytes = copy;
  *num_bytes = decoded->bytes.size();
  Record({});
  return 0;
}

void kiln_request_key(const void* graph, size_t graph_bytes, const void* target,
                      size_t target_bytes, const void* options, size_t options_bytes, char* hex) {
  const std::string key = kiln::wire::RequestKeyOfSerialized(
      Bytes(graph, graph_bytes), Bytes(target, target_bytes), Bytes(options, options_bytes));
  std::memcpy(hex, key.c_str(), key.size() + 1);
}

kiln_trust* kiln_trust_new(void) { return new (std::nothrow) kiln_trust(); }

void kiln_trust_free(kiln_trust* trust) { delete trust; }

int kiln_trust_add_key_file(kiln_trust* trust, const char* path, char* key_id) {
  if (trust == nullptr || path == nullptr || key_id == nullptr)
    return Fail(KILN_CORE_INVALID_ARGUMENT, "null argument");
  std::string id;
  const int outcome = RecordTrust(trust->keys.AddPemFile(path, &id));
  if (outcome == 0) std::memcpy(key_id, id.c_str(), id.size() + 1);
  return outcome;
}

int kiln_trust_verify(const kiln_trust* trust, const char* handle, const void* result,
                      size_t result_bytes) {
  if (trust == nullptr || handle == nullptr || (result == nullptr && result_bytes > 0))
    return Fail(KILN_CORE_INVALID_ARGUMENT, "null argument");
  return RecordTrust(trust->keys.VerifyResult(handle, Bytes(result, result_bytes)));
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

// ---- CUDA. The loader's errors are text; each is FAILED_PRECONDITION here, but for sizes a
// plan cannot run at (INVALID_ARGUMENT).

int kiln_cuda_device_count(void) {
  std::string error;
  const int n = kiln::core::CudaDeviceCount(&error);
  return n < 0 ? Fail(KILN_CORE_FAILED_PRECONDITION, error.c_str()) : n;
}

int kiln_cuda_device_sm(int device) {
  std::string error;
  const int sm = kiln::core::CudaDeviceSm(device, &error);
  return sm < 0 ? Fail(KILN_CORE_FAILED_PRECONDITION, error.c_str()) : sm;
}

int kiln_cuda_current_device(void) {
  std::string error;
  const int dev = kiln::core::CudaCurrentDevice(&error);
  return dev < 0 ? Fail(KILN_CORE_FAILED_PRECONDITION, error.c_str()) : dev;
}

kiln_cuda_module* kiln_cuda_load(int device, const void* cubin, size_t cubin_bytes, const char* ptx,
                                 const char* plan_json) {
  if (plan_json == nullptr) {
    Fail(KILN_CORE_INVALID_ARGUMENT, "no launch plan");
    return nullptr;
  }
  std::string error;
  kiln::core::CudaPlan plan;
  if (!kiln::core::ParseCudaPlan(plan_json, &plan, &error)) {
    Fail(KILN_CORE_FAILED_PRECONDITION, error.c_str());
    return nullptr;
  }
  std::string_view image(static_cast<const char*>(cubin), cubin != nullptr ? cubin_bytes : 0);
  auto module = kiln::core::CudaModule::Load(image, ptx != nullptr ? ptx : "", std::move(plan),
                                             &error, device);
  if (module == nullptr) {
    Fail(KILN_CORE_FAILED_PRECONDITION, error.c_str());
    return nullptr;
  }
  Record({});
  return new kiln_cuda_module{std::move(module)};
}

kiln_cuda_module* kiln_cuda_load_dir(const char* dir) {
  std::string error;
  auto module = kiln::core::CudaModule::LoadDir(dir != nullptr ? dir : ".", &error);
  if (module == nullptr) {
    Fail(KILN_CORE_FAILED_PRECONDITION, error.c_str());
    return nullptr;
  }
  Record({});
  return new kiln_cuda_module{std::move(module)};
}

void kiln_cuda_free(kiln_cuda_module* module) { delete module; }

int kiln_cuda_loaded_from_ptx(const kiln_cuda_module* module) {
  return module != nullptr && module->module->loaded_from_ptx() ? 1 : 0;
}
int kiln_cuda_num_inputs(const kiln_cuda_module* module) {
  return module != nullptr ? module->module->plan().num_inputs() : 0;
}
int kiln_cuda_num_outputs(const kiln_cuda_module* module) {
  return module != nullptr ? module->module->plan().num_outputs() : 0;
}
int kiln_cuda_num_symbols(const kiln_cuda_module* module) {
  return module != nullptr ? static_cast<int>(module->module->plan().symbols.size()) : 0;
}

int64_t kiln_cuda_workspace_bytes(const kiln_cuda_module* module, const int64_t* sizes,
                                  int num_sizes) {
  if (module == nullptr || num_sizes < 0 || (num_sizes > 0 && sizes == nullptr)) {
    return Fail(KILN_CORE_INVALID_ARGUMENT, module == nullptr ? "null module" : "bad sizes");
  }
  std::string error;
  const int64_t bytes =
      module->module->WorkspaceBytes(sizes, static_cast<size_t>(num_sizes), &error);
  return bytes < 0 ? Fail(KILN_CORE_INVALID_ARGUMENT, error.c_str()) : bytes;
}

int kiln_cuda_run(kiln_cuda_module* module, void* const* buffers, void* workspace, void* stream,
                  const int64_t* sizes, int num_sizes) {
  if (module == nullptr || num_sizes < 0 || (num_sizes > 0 && sizes == nullptr)) {
    return Fail(KILN_CORE_INVALID_ARGUMENT, module == nullptr ? "null module" : "bad sizes");
  }
  std::string error;
  kiln::core::CudaModule& m = *module->module;
  bool ok;
  if (m.plan().symbolic()) {
    ok = m.RunSized(buffers, workspace, stream, sizes, static_cast<size_t>(num_sizes), &error);
  } else if (num_sizes != 0) {
    ok = false;
    error = "the plan has no symbols; got " + std::to_string(num_sizes) + " sizes";
  } else {
    ok = m.Run(buffers, workspace, stream, &error);
  }
  return ok ? 0 : Fail(KILN_CORE_FAILED_PRECONDITION, error.c_str());
}

kiln_cuda_function* kiln_cuda_function_load(int device, const void* cubin, size_t cubin_bytes,
                                            const char* name) {
  if (cubin == nullptr || name == nullptr) {
    Fail(KILN_CORE_INVALID_ARGUMENT, "no cubin or no kernel name");
    return nullptr;
  }
  std::string error;
  auto function = kiln::core::CudaFunction::Load(
      device, std::string_view(static_cast<const char*>(cubin), cubin_bytes), name, &error);
  if (function == nullptr) {
    Fail(KILN_CORE_FAILED_PRECONDITION, error.c_str());
    return nullptr;
  }
  Record({});
  return new kiln_cuda_function{std::move(function)};
}

void kiln_cuda_function_free(kiln_cuda_function* function) { delete function; }

int kiln_cuda_function_launch(kiln_cuda_function* function, const unsigned* grid,
                              const unsigned* block, unsigned shared_bytes, void* stream,
                              void** params) {
  if (function == nullptr || grid == nullptr || block == nullptr) {
    return Fail(KILN_CORE_INVALID_ARGUMENT, "null function, grid or block");
  }
  std::string error;
  return function->function->Launch(grid, block, shared_bytes, stream, params, &error)
             ? 0
             : Fail(KILN_CORE_FAILED_PRECONDITION, error.c_str());
}

}  // extern "C"
