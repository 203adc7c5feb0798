// CudaModule: a CUDA artifact (cubin, with PTX as the fallback) loaded through the CUDA
// driver API and bound to its launch plan (kernels/codegen/PLAN.md), ready to run on device
// buffers on a caller's stream. Also a C API over it, for ctypes.
//
// The driver library (libcuda.so.1) is opened with dlopen on first use: building and linking
// need no driver or toolkit, and a process without a GPU gets an error, not a load failure.
// The loader has no dependency beyond libc and libdl, so the client core's shared build
// (libkiln_core.so) loads anywhere; errors are strings rather than absl::Status for that reason.
//
// The loader uses the calling thread's current CUDA context (PyTorch, for one, makes its
// device's primary context current); when there is none, it makes device 0's primary context
// current. A module belongs to the context it was loaded in: runs make that context current
// for their launches when the calling thread has another (a process driving several GPUs).
//
// Thread-safety: Load may be called from many threads. Run may too, on any streams, when each
// call passes its own workspace (or the plan needs none); runs that let the module provide
// the workspace share one allocation and must not overlap in time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "client/cpp/cuda_plan.h"

namespace kiln::client {

class CudaModule {
 public:
  // Loads `cubin`; when the driver refuses it (a GPU of another architecture), JIT-compiles
  // `ptx` instead (may be empty: then the refusal is the error). Checks the plan's ABI
  // version and resolves every step's kernel. Null and `*error` set on failure.
  static std::unique_ptr<CudaModule> Load(std::string_view cubin, std::string_view ptx,
                                          CudaPlan plan, std::string* error);
  // Reads kernel.cubin, kernel.ptx (optional) and plan.json from a kilnc output folder.
  static std::unique_ptr<CudaModule> LoadDir(const std::string& dir, std::string* error);
  ~CudaModule();

  // Launches the plan's steps on `stream` (a CUstream; null: the legacy default stream).
  // `buffers` holds device pointers: the graph's inputs in order, then its outputs in order.
  // `workspace`: a device pointer to plan().workspace_bytes bytes, 16-byte aligned, or null to
  // use one the module allocates on first need. Asynchronous: returns once launched. REQUIRES
  // every buffer 16-byte aligned (PLAN.md) and no output overlapping another buffer.
  bool Run(void* const* buffers, void* workspace, void* stream, std::string* error);

  // Runs the plan on host memory and waits: copies `inputs` (the plan's bytes each) to fresh
  // device buffers, launches on the legacy default stream, synchronizes the context and copies
  // the outputs back into `outputs`. For programs without device buffers of their own (the
  // Session's host path); device-resident callers use Run.
  bool RunHost(const void* const* inputs, void* const* outputs, std::string* error);

  // Plans with symbolic sizes (plan().symbolic(), ABI version 2): `sizes` holds one value per
  // plan().symbols, in order (each is dimension `axis` of input `input`; the caller passes
  // buffers of the shapes these sizes give). Grids and temp offsets are computed from them;
  // sizes whose index bound reaches 2^30 are refused (the kernels use 32-bit indices).
  // `workspace`: WorkspaceBytes(sizes) bytes, or null for a module-owned one (grown to the
  // largest sizes seen; runs must then not overlap). A static plan takes no sizes (then this
  // is Run). Run and RunHost refuse a symbolic plan.
  bool RunSized(void* const* buffers, void* workspace, void* stream, const int64_t* sizes,
                size_t num_sizes, std::string* error);
  // The workspace a run at `sizes` needs (a static plan: plan().workspace_bytes); -1 and
  // `*error` for sizes the plan cannot run at.
  int64_t WorkspaceBytes(const int64_t* sizes, size_t num_sizes, std::string* error) const;

  const CudaPlan& plan() const { return plan_; }
  bool loaded_from_ptx() const { return from_ptx_; }

 private:
  CudaModule() = default;
  // Run and RunSized: launches every step (`sizes` null for a static plan).
  bool Launch(void* const* buffers, void* workspace, void* stream, const int64_t* sizes,
              size_t num_sizes, std::string* error);
  // A symbolic plan at `sizes`: temp offsets, workspace bytes, grid x of every step.
  bool Layout(const int64_t* sizes, size_t num_sizes, std::vector<int64_t>* temp_offsets,
              int64_t* workspace_bytes, std::vector<unsigned>* grids, std::string* error) const;

  CudaPlan plan_;
  void* context_ = nullptr;       // CUcontext the module was loaded in
  void* module_ = nullptr;        // CUmodule
  std::vector<void*> functions_;  // CUfunction per step
  bool from_ptx_ = false;
  std::mutex mu_;                     // guards workspace_
  unsigned long long workspace_ = 0;  // CUdeviceptr owned by the module, or 0
  int64_t workspace_bytes_ = 0;       // its size (symbolic plans grow it)
};

}  // namespace kiln::client

// ---- C API, part of the client core's (client/core/kiln_core.h, libkiln_core.so). Every
// function is safe to call from any thread; kiln_cuda_last_error() is per thread and describes
// the last failure on the calling thread.
#pragma GCC visibility push(default)
extern "C" {
typedef struct kiln_cuda_module kiln_cuda_module;

// Returns a module, or null on failure. `ptx` may be null; `plan_json` is plan.json's text.
kiln_cuda_module* kiln_cuda_load(const void* cubin, size_t cubin_bytes, const char* ptx,
                                 const char* plan_json);
// Loads kernel.cubin, kernel.ptx and plan.json from a kilnc output folder.
kiln_cuda_module* kiln_cuda_load_dir(const char* dir);
// Runs the steps (see CudaModule::Run); returns 0 on success, -1 on failure.
int kiln_cuda_run(kiln_cuda_module* m, void* const* buffers, void* workspace, void* stream);
// Symbolic plans: runs at `sizes` (see CudaModule::RunSized); 0 on success, -1 on failure.
int kiln_cuda_run_sized(kiln_cuda_module* m, void* const* buffers, void* workspace, void* stream,
                        const int64_t* sizes, int num_sizes);
// The workspace a run at `sizes` needs; -1 on failure.
int64_t kiln_cuda_workspace_bytes_sized(const kiln_cuda_module* m, const int64_t* sizes,
                                        int num_sizes);
// How many sizes a run takes (0 for a static plan).
int kiln_cuda_num_symbols(const kiln_cuda_module* m);
int64_t kiln_cuda_workspace_bytes(const kiln_cuda_module* m);
int kiln_cuda_num_inputs(const kiln_cuda_module* m);
int kiln_cuda_num_outputs(const kiln_cuda_module* m);
const char* kiln_cuda_last_error(void);
void kiln_cuda_free(kiln_cuda_module* m);
}
#pragma GCC visibility pop
