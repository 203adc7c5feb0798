/* The kiln client core: what every kiln client does with a compiled result once kilnd has
 * returned it, written once in C++ and exported as this C ABI, so that the C++ Session, the
 * Python package (through ctypes) and the GPU scripts share one implementation.
 *
 *   - the local artifact store: a content-addressed folder shared by every client on the
 *     machine (layout in store.h), each artifact verified by its SHA-256 before use;
 *   - the answers folder beside it: kilnd's answers to this machine's requests, which a fresh
 *     process uses again for a while without asking kilnd (answers.h, FORMAT.md);
 *   - CPU artifacts: a kernel library (kernels/codegen/ABI.md) opened once per process from a
 *     path or from verified bytes, its ABI version checked and its entry points resolved;
 *   - CUDA artifacts: a cubin (or PTX) loaded through the driver and its launch plan run on a
 *     stream. Those functions are kiln_cuda_*, declared in client/core/cuda_loader.h, because the
 *     torch part runner compiles that file into itself;
 *   - signed results and request keys: the bytes kilnd signs, the check of a signature against
 *     trusted Ed25519 keys, and the request key, the very code kilnd and the C++ client run
 *     (wire/result_bytes.h, wire/ed25519.h, wire/serialized_request_key.h).
 *
 * libkiln_core.so needs nothing but libc: the C++ runtime and OpenSSL's libcrypto (for
 * SHA-256 and Ed25519) are linked into it, and the CUDA driver is opened at run time. Every
 * function is safe to call from any thread. A function that fails returns NULL or a negative number
 * and leaves a description for the calling thread in kiln_core_last_error().
 */
#ifndef KILN_CLIENT_CORE_KILN_CORE_H_
#define KILN_CLIENT_CORE_KILN_CORE_H_

#include <stddef.h>
#include <stdint.h>

#define KILN_CORE_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this ABI; bumped when a function is added or changes meaning or signature
 * (kiln.core checks it before it binds any function). */
#define KILN_CORE_ABI_VERSION 5
KILN_CORE_API uint32_t kiln_core_abi_version(void);

/* What the last failing call on this thread said (empty when none failed). */
KILN_CORE_API const char* kiln_core_last_error(void);

/* Error classes, from kiln_core_last_error_code(): how a caller maps them to its own errors. */
enum kiln_core_error {
  KILN_CORE_OK = 0,
  KILN_CORE_INVALID_ARGUMENT = 1,    /* a malformed digest, a null argument */
  KILN_CORE_NOT_FOUND = 2,           /* a file that is not there */
  KILN_CORE_FAILED_PRECONDITION = 3, /* not a kiln library, an ABI it does not speak */
  KILN_CORE_DATA_LOSS = 4,           /* bytes that do not hash to their digest */
  KILN_CORE_UNAVAILABLE = 5,         /* the file system refused (full, read-only, no access) */
  KILN_CORE_INTERNAL = 6,            /* anything else */
};
KILN_CORE_API int kiln_core_last_error_code(void);

/* ---- The artifact store. */
typedef struct kiln_store kiln_store;

/* Opens (creating its folder) the store at `root`; NULL or "" means the default root:
 * $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln. NULL on failure. */
KILN_CORE_API kiln_store* kiln_store_open(const char* root);
KILN_CORE_API void kiln_store_close(kiln_store* store);
/* The root folder, valid as long as the store. */
KILN_CORE_API const char* kiln_store_root(const kiln_store* store);

/* Where the store keeps `digest` (whether or not it is there; the layout is the store's own,
 * store.h), copied into `path` of `path_size` bytes: 0, or -1 (INVALID_ARGUMENT for a malformed
 * digest). Reading the file there is not verifying it: kiln_store_find verifies. */
KILN_CORE_API int kiln_store_path_for(const kiln_store* store, const char* digest, char* path,
                                      size_t path_size);

/* Looks `digest` up: 1 when a verified artifact is there (its path, NUL-terminated, copied into
 * `path` of `path_size` bytes), 0 when it is absent (a corrupt file counts as absent and is
 * deleted), -1 on failure (a path that does not fit is one). */
KILN_CORE_API int kiln_store_find(kiln_store* store, const char* digest, char* path,
                                  size_t path_size);
/* Stores `bytes` under `digest` after checking that they hash to it (DATA_LOSS otherwise,
 * nothing written); 0 and the path, or -1. Writing an artifact that is there already is a
 * no-op. */
KILN_CORE_API int kiln_store_put(kiln_store* store, const char* digest, const void* bytes,
                                 size_t num_bytes, char* path, size_t path_size);
/* Stores `bytes` under their SHA-256, computed once, here: its 64 hex digits and a NUL go to
 * `digest` (65 bytes). For a caller without a digest of its own (kiln_store_put would have it
 * hash the bytes first, and then hash them again). 0 and the path, or -1. */
KILN_CORE_API int kiln_store_add(kiln_store* store, const void* bytes, size_t num_bytes,
                                 char* digest, char* path, size_t path_size);
/* Counters since the store was opened: hits (verified finds), corrupt files deleted, puts. */
KILN_CORE_API void kiln_store_counters(const kiln_store* store, int64_t* hits, int64_t* corruptions,
                                       int64_t* puts);

/* Lowercase hex SHA-256 of `bytes` into `hex` (65 bytes: 64 digits and a NUL). */
KILN_CORE_API void kiln_sha256_hex(const void* bytes, size_t num_bytes, char* hex);

/* ---- Answers: kilnd's answers (serialized CompileResponses a client's trust policy accepted)
 * kept under the store's root in answers/, by daemon address and request key, so that every
 * client of the machine, Python or C++, finds the same files (answers.h, FORMAT.md). The core
 * keeps bytes and checks their integrity; what they mean and whether to trust them is the
 * client's (its trust policy, with is_private below). */

/* The name of the answer to `request_key` from the daemon at `address` (both NUL-terminated
 * text): the hex SHA-256 of address, a NUL byte and the key, into `name` (65 bytes). */
KILN_CORE_API void kiln_answer_name(const char* address, const char* request_key, char* name);
/* Reads the answer saved under `name` (64 hex digits): 1 when it is there, intact and saved at
 * most `max_age_s` seconds ago, with its bytes in a buffer allocated here (`*bytes`, released
 * with kiln_core_free; `*num_bytes` long) and in `*is_private` 1 when the file is owned by this
 * user and writable by no one else, else 0. 0 when there is none: absent, older, unreadable,
 * or damaged (then removed); `max_age_s` <= 0 is always 0. -1 for a malformed name or a null
 * argument. */
KILN_CORE_API int kiln_store_load_answer(kiln_store* store, const char* name, double max_age_s,
                                         void** bytes, size_t* num_bytes, int* is_private);
/* Saves `bytes` as the answer `name`, atomically, replacing one there (its age starts again).
 * 0, or -1 (a malformed name; UNAVAILABLE when the file system refuses). */
KILN_CORE_API int kiln_store_save_answer(kiln_store* store, const char* name, const void* bytes,
                                         size_t num_bytes);
/* Forgets the answer `name` (one that is not there is forgotten already): 0, or -1 for a
 * malformed name. */
KILN_CORE_API int kiln_store_drop_answer(kiln_store* store, const char* name);
/* Releases a buffer the core allocated for the caller (kiln_store_load_answer's). */
KILN_CORE_API void kiln_core_free(void* bytes);

/* ---- Signed results and request keys (wire/FORMAT.md). A result is passed as its serialized
 * kiln.v1.ActionResult: the serialization of the very record the caller goes on to use (a
 * client serializes its parsed record), so that what was checked is what runs. */

/* The bytes the signature of the result for the action `handle` (NUL-terminated) covers, in a
 * buffer allocated here (`*bytes`, released with kiln_core_free; `*num_bytes` long): 0, or -1
 * (INVALID_ARGUMENT: bytes that are not a serialized ActionResult, a null argument). */
KILN_CORE_API int kiln_result_signed_bytes(const char* handle, const void* result,
                                           size_t result_bytes, void** bytes, size_t* num_bytes);

/* The request key of a request given as the deterministic serializations of its kiln.v1.Graph,
 * Target and CompileOptions: 64 hex digits and a NUL into `hex` (65 bytes). */
KILN_CORE_API void kiln_request_key(const void* graph, size_t graph_bytes, const void* target,
                                    size_t target_bytes, const void* options, size_t options_bytes,
                                    char* hex);

/* Trusted Ed25519 public keys, and the check of a result's signature against them. Keys are
 * added before the object is shared: a check may run on any thread at once with others, never
 * with an add. */
typedef struct kiln_trust kiln_trust;

/* What became of adding a key or checking a result: 0 or one of these, the message in
 * kiln_core_last_error() (its class in kiln_core_last_error_code(): NOT_FOUND for an unreadable
 * file, INVALID_ARGUMENT for a file that is no Ed25519 public key or bytes that are no result,
 * FAILED_PRECONDITION for a result unsigned, signed another way or by a key not trusted here,
 * DATA_LOSS for a signature that does not match). */
enum kiln_trust_outcome {
  KILN_TRUST_OK = 0,
  KILN_TRUST_KEY_UNREADABLE = 1,  /* a key file that cannot be read */
  KILN_TRUST_KEY_NOT_PEM = 2,     /* a file that holds no PEM public key */
  KILN_TRUST_KEY_NOT_ED25519 = 3, /* a public key of another type */
  KILN_TRUST_MALFORMED = 4,       /* bytes that are not a serialized ActionResult */
  KILN_TRUST_UNSIGNED = 5,        /* a result without a signature */
  KILN_TRUST_OTHER_ALGORITHM = 6, /* signed with another algorithm than Ed25519 */
  KILN_TRUST_UNTRUSTED_KEY = 7,   /* signed by a key not trusted here */
  KILN_TRUST_MISMATCH = 8,        /* the signature does not match: the record was changed */
};

/* An empty set of trusted keys (NULL only when out of memory). */
KILN_CORE_API kiln_trust* kiln_trust_new(void);
KILN_CORE_API void kiln_trust_free(kiln_trust* trust);
/* Adds the Ed25519 public key in the PEM file `path` (`openssl pkey -pubout` form): 0 and its
 * key id (16 hex digits and a NUL) in `key_id` (17 bytes), or a KILN_TRUST_KEY_* outcome; -1
 * for a null argument. */
KILN_CORE_API int kiln_trust_add_key_file(kiln_trust* trust, const char* path, char* key_id);
/* Checks the result for the action `handle` (NUL-terminated): 0 when it carries an Ed25519
 * signature by one of the keys over its signed bytes, else the outcome that refuses it
 * (KILN_TRUST_MALFORMED ... KILN_TRUST_MISMATCH); -1 for a null argument. */
KILN_CORE_API int kiln_trust_verify(const kiln_trust* trust, const char* handle, const void* result,
                                    size_t result_bytes);

/* ---- CPU artifacts. */
typedef struct kiln_cpu_library kiln_cpu_library;

/* Opens the kernel library at `path` once per process (later calls return the same library).
 * Libraries are never closed: a kernel library pulls in libgomp, whose threads outlive the
 * parallel regions. NULL on failure (NOT_FOUND, FAILED_PRECONDITION). */
KILN_CORE_API const kiln_cpu_library* kiln_cpu_open(const char* path);
/* Opens a library from its bytes, once per process per `name` (its digest): the bytes are
 * written to an anonymous in-memory file and loaded from there, so the code that runs is the
 * code the caller verified, whatever happens to the store's folder meanwhile. */
KILN_CORE_API const kiln_cpu_library* kiln_cpu_open_image(const void* bytes, size_t num_bytes,
                                                          const char* name);
/* kiln_abi_version() of the library (1: static sizes, 2: symbolic sizes). */
KILN_CORE_API uint32_t kiln_cpu_abi_version(const kiln_cpu_library* library);
/* The library's kiln_run: ABI 1 `int (void* const* args, void* workspace, int threads)`,
 * ABI 2 `int (void* const* args, const int64_t* sizes, void* workspace, int threads)`. */
KILN_CORE_API void* kiln_cpu_run_function(const kiln_cpu_library* library);
/* ABI 2: `int64_t kiln_workspace_bytes(const int64_t* sizes)`; NULL for ABI 1. */
KILN_CORE_API void* kiln_cpu_workspace_function(const kiln_cpu_library* library);
/* How many libraries this process has opened. */
KILN_CORE_API int64_t kiln_cpu_library_count(void);

/* ---- CUDA (cuda_loader.h). The driver, libcuda.so.1, is opened on the first call; without one
 * every call fails with FAILED_PRECONDITION, as does every refusal of the driver. `device` is a
 * CUDA device index: a load goes into that device's primary context (the one the CUDA runtime,
 * PyTorch and CuPy use); -1 means the calling thread's current context (device 0's primary
 * context when it has none). Runs use the context their module was loaded in. */
typedef struct kiln_cuda_module kiln_cuda_module;
typedef struct kiln_cuda_function kiln_cuda_function;

/* How many CUDA devices there are; -1 without a usable driver. */
KILN_CORE_API int kiln_cuda_device_count(void);
/* The compute capability of `device` as kiln's sm number (90 for 9.0); -1 on failure. */
KILN_CORE_API int kiln_cuda_device_sm(int device);
/* The device of the calling thread's current context (0 when it has none); -1 on failure. */
KILN_CORE_API int kiln_cuda_current_device(void);

/* Loads a compiled result: its cubin (when the driver refuses it, a device of another
 * architecture, the PTX, which may be NULL) and its launch plan as plan.json's text
 * (kernels/codegen/PLAN.md). The plan's ABI version is checked and every kernel resolved.
 * NULL on failure. */
KILN_CORE_API kiln_cuda_module* kiln_cuda_load(int device, const void* cubin, size_t cubin_bytes,
                                               const char* ptx, const char* plan_json);
/* Loads kernel.cubin, kernel.ptx and plan.json from a kilnc output folder (device -1). */
KILN_CORE_API kiln_cuda_module* kiln_cuda_load_dir(const char* dir);
KILN_CORE_API void kiln_cuda_free(kiln_cuda_module* module);
/* 1 when the module was JIT-compiled from its PTX (the cubin was refused), else 0. */
KILN_CORE_API int kiln_cuda_loaded_from_ptx(const kiln_cuda_module* module);
KILN_CORE_API int kiln_cuda_num_inputs(const kiln_cuda_module* module);
KILN_CORE_API int kiln_cuda_num_outputs(const kiln_cuda_module* module);
/* How many sizes a run takes: the plan's symbols (0 for a static plan). */
KILN_CORE_API int kiln_cuda_num_symbols(const kiln_cuda_module* module);
/* The workspace a run at `sizes` (num_symbols values; none for a static plan) needs, in bytes;
 * -1 for sizes the kernels cannot run at (INVALID_ARGUMENT: negative, or an index past their
 * 32-bit range). */
KILN_CORE_API int64_t kiln_cuda_workspace_bytes(const kiln_cuda_module* module,
                                                const int64_t* sizes, int num_sizes);
/* Launches the plan's steps on `stream` (a CUstream; NULL: the legacy default stream),
 * asynchronously. `buffers`: device pointers, the inputs in graph order then the outputs,
 * each 16-byte aligned. `workspace`: kiln_cuda_workspace_bytes(sizes) bytes, or NULL to use one
 * the module allocates and keeps (runs must then not overlap in time). `sizes`: one value per
 * symbol, each the dimension of an input the plan names (the buffers must have the shapes
 * they give). 0 on success, -1 on failure. */
KILN_CORE_API int kiln_cuda_run(kiln_cuda_module* module, void* const* buffers, void* workspace,
                                void* stream, const int64_t* sizes, int num_sizes);

/* A raw kernel: function `name` (its lowered name) of `cubin`, loaded on `device`. */
KILN_CORE_API kiln_cuda_function* kiln_cuda_function_load(int device, const void* cubin,
                                                          size_t cubin_bytes, const char* name);
KILN_CORE_API void kiln_cuda_function_free(kiln_cuda_function* function);
/* Launches it with `params` as cuLaunchKernel takes them (a pointer to each argument's value);
 * `grid` and `block` hold 3 values each. 0 on success, -1 on failure. */
KILN_CORE_API int kiln_cuda_function_launch(kiln_cuda_function* function, const unsigned* grid,
                                            const unsigned* block, unsigned shared_bytes,
                                            void* stream, void** params);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_CLIENT_CORE_KILN_CORE_H_ */
