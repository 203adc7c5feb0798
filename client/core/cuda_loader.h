// CudaModule: a CUDA artifact (cubin, with PTX as the fallback) loaded through the CUDA
// driver API and bound to its launch plan (kernels/codegen/PLAN.md), ready to run on device
// buffers on a caller's stream. CudaFunction: one kernel of a cubin with no plan (a raw kernel
// a user wrote), launched with the caller's arguments. Both are the client core's
// (kiln_core.h's kiln_cuda_*): the C++ Session, the Python package and the torch part runner
// (which compiles this file into itself) load and launch through them.
//
// The driver library (libcuda.so.1) is opened with dlopen on first use: building and linking
// need no driver or toolkit, and a process without a GPU gets an error, not a load failure.
// The loader has no dependency beyond libc and libdl, so it builds into the runner as is;
// errors are strings rather than the core's Error for the same reason.
//
// Contexts: a load names a device and goes into that device's primary context, the one the
// CUDA runtime, PyTorch and CuPy use; or names none (-1) and uses the calling thread's current
// context, making device 0's primary one current when the thread has none. A module belongs
// to the context it was loaded in: loads and runs make that context current for their driver
// calls when the calling thread has another, and restore it after. A thread that had no
// context keeps the module's (autograd's backward threads start with none; the runtime would
// make the primary context current on their first call anyway).
//
// Thread-safety: Load may be called from many threads. Run may too, on any streams, when each
// call passes its own workspace (or the plan needs none); runs that let the module provide
// the workspace share one allocation and must not overlap in time.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "client/core/cuda_plan.h"

namespace kiln::core {

// The dynamic shared memory a kernel may use without its limit raised first (the driver's
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, set through cuFuncSetAttribute).
inline constexpr unsigned kCudaDefaultSharedBytes = 48 * 1024;

class CudaModule {
 public:
  // Loads `cubin` on `device` (-1: the thread's context; see above); when the driver refuses
  // it (a GPU of another architecture), JIT-compiles `ptx` instead (may be empty: then the
  // refusal is the error). Checks the plan's ABI version, resolves every step's kernel and
  // lets steps use more than 48 KiB of dynamic shared memory where they ask for it. Null and
  // `*error` set on failure.
  static std::unique_ptr<CudaModule> Load(std::string_view cubin, std::string_view ptx,
                                          CudaPlan plan, std::string* error, int device = -1);
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

// One kernel of a cubin, without a launch plan: a raw kernel (kiln.cuda.RawKernel), its
// arguments built by the caller. Loaded like a module (same contexts); never unloaded before
// the object goes.
//
// Thread-safety: Launch may be called from many threads at once.
class CudaFunction {
 public:
  static std::unique_ptr<CudaFunction> Load(int device, std::string_view cubin,
                                            const std::string& name, std::string* error);
  ~CudaFunction();
  // cuLaunchKernel in the function's context: `params` as the driver takes them (one pointer
  // per kernel parameter, to its value). Asynchronous. A launch with more than
  // kCudaDefaultSharedBytes of dynamic shared memory has it allowed first (AllowShared).
  bool Launch(const unsigned grid[3], const unsigned block[3], unsigned shared_bytes, void* stream,
              void** params, std::string* error);

 private:
  CudaFunction() = default;
  // Makes sure the function may use `bytes` of dynamic shared memory: raises its limit
  // (cuFuncSetAttribute) when `bytes` is more than any launch asked for before, and only then,
  // rather than on every launch. The caller's context is the function's.
  bool AllowShared(unsigned bytes, std::string* error);

  // Immutable after Load.
  void* context_ = nullptr;   // CUcontext
  void* module_ = nullptr;    // CUmodule
  void* function_ = nullptr;  // CUfunction
  // The function's dynamic shared memory limit as last set: the largest size any launch asked
  // for (kCudaDefaultSharedBytes until one asked for more). Read without the lock on every
  // launch; written, together with the driver call it records, only under shared_mu_, so that
  // two launches raising it at once cannot leave the driver's limit below the recorded one (the
  // lower setting last). The store (release) follows the driver call, so a launch that reads
  // the new value (acquire) launches after the limit is in place.
  std::mutex shared_mu_;
  std::atomic<unsigned> shared_allowed_{kCudaDefaultSharedBytes};
};

// Device queries, through the same driver binding. Each returns -1 and sets `*error` when
// there is no usable driver (or no such device).
int CudaDeviceCount(std::string* error);
// The compute capability as kiln's sm number (90 for 9.0).
int CudaDeviceSm(int device, std::string* error);
// The device of the calling thread's current context; 0 when it has none.
int CudaCurrentDevice(std::string* error);

}  // namespace kiln::core
