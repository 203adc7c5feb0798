#include "client/core/cuda_loader.h"

#include <dlfcn.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

namespace kiln::core {
namespace {

// The slice of the CUDA driver API the loader uses, declared here so that building needs no
// CUDA headers. Types and values as in cuda.h.
typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUstream;
typedef unsigned long long CUdeviceptr;
constexpr CUresult kSuccess = 0;
constexpr uint32_t kStaticAbi = 1;    // plans with every size fixed
constexpr uint32_t kSymbolicAbi = 2;  // plans with symbolic sizes (kernels take them as ints)
// The kernels of a symbolic plan index with 32-bit ints: sizes whose index bound reaches this
// are refused (the same limit as the Python loader's).
constexpr int64_t kIndexLimit = int64_t{1} << 30;
// cuDeviceGetAttribute: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR.
constexpr int kComputeCapabilityMajor = 75;
constexpr int kComputeCapabilityMinor = 76;
// cuFuncSetAttribute: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, which a launch with more
// than kCudaDefaultSharedBytes of dynamic shared memory needs raised first.
constexpr int kMaxDynamicShared = 8;

struct Driver {
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuCtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  std::string error;  // why the driver is unusable, if it is

  std::string Describe(CUresult r, const char* what) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (cuGetErrorName) cuGetErrorName(r, &name);
    if (cuGetErrorString) cuGetErrorString(r, &text);
    return std::string(what) + ": " + (name ? name : "CUDA error " + std::to_string(r)) +
           (text ? std::string(" (") + text + ")" : "");
  }
};

template <typename F>
bool Resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

// Opened once per process, never closed (the driver outlives every module).
const Driver& GetDriver() {
  static const Driver* driver = [] {
    auto* d = new Driver;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      d->error = std::string("cannot open libcuda.so.1 (no NVIDIA driver here?): ") + dlerror();
      return d;
    }
    bool ok = Resolve(lib, "cuInit", &d->cuInit) && Resolve(lib, "cuDeviceGet", &d->cuDeviceGet) &&
              Resolve(lib, "cuCtxGetCurrent", &d->cuCtxGetCurrent) &&
              Resolve(lib, "cuCtxSetCurrent", &d->cuCtxSetCurrent) &&
              Resolve(lib, "cuDevicePrimaryCtxRetain", &d->cuDevicePrimaryCtxRetain) &&
              Resolve(lib, "cuDeviceGetCount", &d->cuDeviceGetCount) &&
              Resolve(lib, "cuDeviceGetAttribute", &d->cuDeviceGetAttribute) &&
              Resolve(lib, "cuCtxGetDevice", &d->cuCtxGetDevice) &&
              Resolve(lib, "cuFuncSetAttribute", &d->cuFuncSetAttribute) &&
              Resolve(lib, "cuModuleLoadData", &d->cuModuleLoadData) &&
              Resolve(lib, "cuModuleUnload", &d->cuModuleUnload) &&
              Resolve(lib, "cuModuleGetFunction", &d->cuModuleGetFunction) &&
              Resolve(lib, "cuLaunchKernel", &d->cuLaunchKernel) &&
              Resolve(lib, "cuMemAlloc_v2", &d->cuMemAlloc) &&
              Resolve(lib, "cuMemFree_v2", &d->cuMemFree) &&
              Resolve(lib, "cuMemcpyHtoD_v2", &d->cuMemcpyHtoD) &&
              Resolve(lib, "cuMemcpyDtoH_v2", &d->cuMemcpyDtoH) &&
              Resolve(lib, "cuCtxSynchronize", &d->cuCtxSynchronize) &&
              Resolve(lib, "cuGetErrorName", &d->cuGetErrorName) &&
              Resolve(lib, "cuGetErrorString", &d->cuGetErrorString);
    if (!ok) {
      d->error = "libcuda.so.1 lacks a driver API entry point the loader needs";
      return d;
    }
    if (CUresult r = d->cuInit(0); r != kSuccess) d->error = d->Describe(r, "cuInit");
    return d;
  }();
  return *driver;
}

// The driver, or false and why.
bool Usable(const Driver& d, std::string* error) {
  if (d.error.empty()) return true;
  *error = d.error;
  return false;
}

// Makes sure the calling thread has a current context.
bool EnsureContext(const Driver& d, std::string* error) {
  CUcontext ctx = nullptr;
  if (CUresult r = d.cuCtxGetCurrent(&ctx); r != kSuccess) {
    *error = d.Describe(r, "cuCtxGetCurrent");
    return false;
  }
  if (ctx) return true;
  CUdevice dev = 0;
  CUresult r = d.cuDeviceGet(&dev, 0);
  if (r == kSuccess) r = d.cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r == kSuccess) r = d.cuCtxSetCurrent(ctx);
  if (r != kSuccess) *error = d.Describe(r, "making device 0's primary context current");
  return r == kSuccess;
}

// The context a load goes into: `device`'s primary context (retained for the process's life),
// or with device -1 the thread's current one (see EnsureContext).
bool LoadContext(const Driver& d, int device, CUcontext* ctx, std::string* error) {
  if (device < 0) {
    if (!EnsureContext(d, error)) return false;
    if (CUresult r = d.cuCtxGetCurrent(ctx); r != kSuccess) {
      *error = d.Describe(r, "cuCtxGetCurrent");
      return false;
    }
    return true;
  }
  CUdevice dev = 0;
  CUresult r = d.cuDeviceGet(&dev, device);
  if (r == kSuccess) r = d.cuDevicePrimaryCtxRetain(ctx, dev);
  if (r != kSuccess) *error = d.Describe(r, ("device " + std::to_string(device)).c_str());
  return r == kSuccess;
}

// Makes `ctx` current for its scope when the calling thread has another current, and restores
// that one after; a thread with none keeps `ctx` (see cuda_loader.h).
class ContextScope {
 public:
  ContextScope(const Driver& d, CUcontext ctx, std::string* error) : d_(d) {
    if (CUresult r = d.cuCtxGetCurrent(&prev_); r != kSuccess) {
      *error = d.Describe(r, "cuCtxGetCurrent");
      return;
    }
    if (ctx && prev_ != ctx) {
      if (CUresult r = d.cuCtxSetCurrent(ctx); r != kSuccess) {
        *error = d.Describe(r, "making the module's context current");
        return;
      }
      switched_ = true;
    }
    ok_ = true;
  }
  ~ContextScope() {
    if (switched_ && prev_) d_.cuCtxSetCurrent(prev_);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  bool ok() const { return ok_; }

 private:
  const Driver& d_;
  CUcontext prev_ = nullptr;
  bool switched_ = false;
  bool ok_ = false;
};

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

}  // namespace

std::unique_ptr<CudaModule> CudaModule::Load(std::string_view cubin, std::string_view ptx,
                                             CudaPlan plan, std::string* error, int device) {
  const Driver& d = GetDriver();
  if (!Usable(d, error)) return nullptr;
  const uint32_t want_abi = plan.symbolic() ? kSymbolicAbi : kStaticAbi;
  if (plan.abi_version != want_abi) {
    *error = "launch plan ABI version " + std::to_string(plan.abi_version) +
             " (this loader runs version " + std::to_string(kStaticAbi) + ", and version " +
             std::to_string(kSymbolicAbi) + " for plans with symbols)";
    return nullptr;
  }
  if (!CheckCudaPlan(plan, error)) return nullptr;
  std::unique_ptr<CudaModule> m(new CudaModule);
  if (!LoadContext(d, device, &m->context_, error)) return nullptr;
  ContextScope scope(d, m->context_, error);
  if (!scope.ok()) return nullptr;
  CUresult r = cubin.empty() ? 1 : d.cuModuleLoadData(&m->module_, cubin.data());
  if (r != kSuccess) {
    std::string cubin_error = cubin.empty() ? "no cubin" : d.Describe(r, "loading the cubin");
    if (ptx.empty()) {
      *error = cubin_error;
      return nullptr;
    }
    std::string text(ptx);  // NUL-terminated for the driver's JIT
    r = d.cuModuleLoadData(&m->module_, text.c_str());
    if (r != kSuccess) {
      *error = cubin_error + "; " + d.Describe(r, "JIT-compiling the PTX");
      return nullptr;
    }
    m->from_ptx_ = true;
  }
  // The most dynamic shared memory any step asks of each kernel: one kernel may run in several
  // steps with different amounts, and the limit, which the driver sets rather than raises,
  // must allow the largest.
  std::map<std::string_view, unsigned> most_shared;
  for (const CudaPlan::Step& s : plan.steps) {
    unsigned& most = most_shared[s.kernel];
    most = std::max(most, s.shared_bytes);
  }
  for (const CudaPlan::Step& s : plan.steps) {
    CUfunction f = nullptr;
    if (CUresult fr = d.cuModuleGetFunction(&f, m->module_, s.kernel.c_str()); fr != kSuccess) {
      *error = d.Describe(fr, ("kernel " + s.kernel).c_str());
      return nullptr;
    }
    m->functions_.push_back(f);
    const auto most = most_shared.find(s.kernel);
    if (most == most_shared.end()) continue;  // this kernel's limit is set already
    if (most->second > kCudaDefaultSharedBytes) {
      if (CUresult ar = d.cuFuncSetAttribute(f, kMaxDynamicShared, static_cast<int>(most->second));
          ar != kSuccess) {
        *error = d.Describe(ar, ("allowing kernel " + s.kernel + " its shared memory").c_str());
        return nullptr;
      }
    }
    most_shared.erase(most);
  }
  m->plan_ = std::move(plan);
  return m;
}

std::unique_ptr<CudaModule> CudaModule::LoadDir(const std::string& dir, std::string* error) {
  std::string cubin, ptx, json;
  if (!ReadFile(dir + "/plan.json", &json)) {
    *error = "cannot read " + dir + "/plan.json";
    return nullptr;
  }
  bool have_cubin = ReadFile(dir + "/kernel.cubin", &cubin);
  bool have_ptx = ReadFile(dir + "/kernel.ptx", &ptx);
  if (!have_cubin && !have_ptx) {
    *error = "neither " + dir + "/kernel.cubin nor kernel.ptx is readable";
    return nullptr;
  }
  CudaPlan plan;
  if (!ParseCudaPlan(json, &plan, error)) return nullptr;
  return Load(cubin, ptx, std::move(plan), error);
}

CudaModule::~CudaModule() {
  const Driver& d = GetDriver();
  if (!d.error.empty()) return;
  if (workspace_) d.cuMemFree(workspace_);
  if (module_) d.cuModuleUnload(module_);
}

bool CudaModule::Layout(const int64_t* sizes, size_t num_sizes, std::vector<int64_t>* temp_offsets,
                        int64_t* workspace_bytes, std::vector<unsigned>* grids,
                        std::string* error) const {
  if (num_sizes != plan_.symbols.size()) {
    *error = "the plan has " + std::to_string(plan_.symbols.size()) + " symbols; got " +
             std::to_string(num_sizes) + " sizes";
    return false;
  }
  for (size_t k = 0; k < num_sizes; ++k)
    if (sizes[k] < 0) {
      *error = "size " + plan_.symbols[k].name + " = " + std::to_string(sizes[k]) + " is negative";
      return false;
    }
  const int64_t bound = plan_.index_bound.Eval(sizes);
  if (bound >= kIndexLimit) {
    std::string at;
    for (size_t k = 0; k < num_sizes; ++k)
      at += (k ? ", " : "") + plan_.symbols[k].name + "=" + std::to_string(sizes[k]);
    *error = "sizes " + at + " are too large for the kernels' 32-bit indices (bound " +
             std::to_string(bound) + " >= 2^30); compile this shape statically";
    return false;
  }
  // Temps in plan order, each at the next multiple of 256 bytes (as every kiln loader does).
  int64_t end = 0;
  temp_offsets->clear();
  for (const CudaPlan::Buffer& b : plan_.buffers) {
    if (b.role != CudaPlan::Role::kTemp) continue;
    end = (end + 255) / 256 * 256;
    temp_offsets->push_back(end);
    end += b.bytes_expr.Eval(sizes);
  }
  *workspace_bytes = end;
  grids->clear();
  for (const CudaPlan::Step& s : plan_.steps) {
    if (!s.Runs(sizes)) {  // another kernel of the launch-time choice serves these sizes
      grids->push_back(0);
      continue;
    }
    const int64_t work = s.grid_work.Eval(sizes);
    const int64_t blocks = (work + s.grid_per_block - 1) / s.grid_per_block;
    if (blocks > 0x7FFFFFFF) {
      *error = "launch " + s.kernel + " needs " + std::to_string(blocks) + " blocks";
      return false;
    }
    grids->push_back(static_cast<unsigned>(blocks));
  }
  return true;
}

int64_t CudaModule::WorkspaceBytes(const int64_t* sizes, size_t num_sizes,
                                   std::string* error) const {
  if (!plan_.symbolic()) return plan_.workspace_bytes;
  std::vector<int64_t> offsets;
  std::vector<unsigned> grids;
  int64_t bytes = 0;
  if (!Layout(sizes, num_sizes, &offsets, &bytes, &grids, error)) return -1;
  return bytes;
}

bool CudaModule::RunSized(void* const* buffers, void* workspace, void* stream, const int64_t* sizes,
                          size_t num_sizes, std::string* error) {
  if (!plan_.symbolic() && num_sizes != 0) {
    *error = "the plan has no symbols; got " + std::to_string(num_sizes) + " sizes";
    return false;
  }
  return Launch(buffers, workspace, stream, sizes, num_sizes, error);
}

bool CudaModule::Run(void* const* buffers, void* workspace, void* stream, std::string* error) {
  if (plan_.symbolic()) {
    *error = "the plan has symbolic sizes: run it with RunSized";
    return false;
  }
  return Launch(buffers, workspace, stream, nullptr, 0, error);
}

// The one launcher behind Run and RunSized. A static plan takes its grids and temp offsets
// from the plan; a symbolic one from Layout at `sizes`, and its kernels get the sizes after
// the buffers. Launches run in the context the module was loaded in (a module is valid in
// that context only), made current for the duration when the caller's thread has another.
bool CudaModule::Launch(void* const* buffers, void* workspace, void* stream, const int64_t* sizes,
                        size_t num_sizes, std::string* error) {
  const Driver& d = GetDriver();
  const bool symbolic = plan_.symbolic();
  std::vector<int64_t> offsets;
  std::vector<unsigned> grids;
  int64_t ws_bytes = plan_.workspace_bytes;
  if (symbolic && !Layout(sizes, num_sizes, &offsets, &ws_bytes, &grids, error)) return false;
  CUdeviceptr ws = reinterpret_cast<CUdeviceptr>(workspace);
  if (!ws && ws_bytes > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (workspace_bytes_ < ws_bytes) {  // symbolic plans: grows to the largest sizes seen
      if (workspace_) d.cuMemFree(workspace_);
      workspace_ = 0;
      workspace_bytes_ = 0;
      if (CUresult r = d.cuMemAlloc(&workspace_, static_cast<size_t>(ws_bytes)); r != kSuccess) {
        *error = d.Describe(r, "allocating the workspace");
        return false;
      }
      workspace_bytes_ = ws_bytes;
    }
    ws = workspace_;
  }
  const int num_inputs = plan_.num_inputs();
  std::vector<CUdeviceptr> ptrs;
  ptrs.reserve(plan_.buffers.size());
  size_t temp = 0;
  for (const CudaPlan::Buffer& b : plan_.buffers) {
    switch (b.role) {
      case CudaPlan::Role::kInput:
        ptrs.push_back(reinterpret_cast<CUdeviceptr>(buffers[b.index]));
        break;
      case CudaPlan::Role::kOutput:
        ptrs.push_back(reinterpret_cast<CUdeviceptr>(buffers[num_inputs + b.index]));
        break;
      case CudaPlan::Role::kTemp:
        ptrs.push_back(ws + static_cast<CUdeviceptr>(symbolic ? offsets[temp++] : b.offset));
        break;
    }
  }
  ContextScope scope(d, context_, error);
  if (!scope.ok()) return false;
  // Symbolic kernels take the sizes as `const int` after the buffers. Each lives in an 8-byte
  // slot whose low half is the int (little-endian), so a reader of either width sees the value.
  std::vector<int64_t> slots(sizes, sizes + num_sizes);
  std::vector<void*> params;
  bool ok = true;
  for (size_t i = 0; i < plan_.steps.size() && ok; ++i) {
    const CudaPlan::Step& s = plan_.steps[i];
    const unsigned gx = symbolic ? grids[i] : s.grid[0];
    if (gx == 0 || s.grid[1] == 0 || s.grid[2] == 0) continue;  // an empty iteration space
    params.clear();
    for (int a : s.args) params.push_back(&ptrs[a]);
    for (int64_t& v : slots) params.push_back(&v);
    params.push_back(nullptr);  // the driver reads as many as the kernel takes; tools may count
    const unsigned gy = symbolic ? 1 : s.grid[1], gz = symbolic ? 1 : s.grid[2];
    CUresult r =
        d.cuLaunchKernel(functions_[i], gx, gy, gz, s.block[0], s.block[1], s.block[2],
                         s.shared_bytes, static_cast<CUstream>(stream), params.data(), nullptr);
    if (r != kSuccess) {
      *error = d.Describe(r, ("launching " + s.kernel).c_str());
      ok = false;
    }
  }
  return ok;
}

bool CudaModule::RunHost(const void* const* inputs, void* const* outputs, std::string* error) {
  if (plan_.symbolic()) {
    *error = "the plan has symbolic sizes: run it on device buffers with RunSized";
    return false;
  }
  const Driver& d = GetDriver();
  ContextScope scope(d, context_, error);
  if (!scope.ok()) return false;
  const int num_inputs = plan_.num_inputs();
  const int num_outputs = plan_.num_outputs();
  std::vector<int64_t> bytes(num_inputs + num_outputs, 0);
  for (const CudaPlan::Buffer& b : plan_.buffers) {
    if (b.role == CudaPlan::Role::kInput) bytes[b.index] = b.bytes;
    if (b.role == CudaPlan::Role::kOutput) bytes[num_inputs + b.index] = b.bytes;
  }
  // Device copies of every buffer, freed whatever happens.
  std::vector<CUdeviceptr> device(bytes.size(), 0);
  struct Release {
    const Driver& d;
    std::vector<CUdeviceptr>& ptrs;
    ~Release() {
      for (CUdeviceptr p : ptrs) {
        if (p) d.cuMemFree(p);
      }
    }
  } release{d, device};
  for (size_t i = 0; i < bytes.size(); ++i) {
    // Zero-sized buffers still get a distinct, aligned address.
    const size_t n = static_cast<size_t>(std::max<int64_t>(bytes[i], 16));
    if (CUresult r = d.cuMemAlloc(&device[i], n); r != kSuccess) {
      *error = d.Describe(r, ("allocating buffer " + std::to_string(i)).c_str());
      return false;
    }
  }
  for (int i = 0; i < num_inputs; ++i) {
    if (bytes[i] == 0) continue;
    if (CUresult r = d.cuMemcpyHtoD(device[i], inputs[i], static_cast<size_t>(bytes[i]));
        r != kSuccess) {
      *error = d.Describe(r, ("copying input " + std::to_string(i) + " to the device").c_str());
      return false;
    }
  }
  std::vector<void*> pointers;
  for (CUdeviceptr p : device) pointers.push_back(reinterpret_cast<void*>(p));
  if (!Run(pointers.data(), nullptr, nullptr, error)) return false;
  if (CUresult r = d.cuCtxSynchronize(); r != kSuccess) {
    *error = d.Describe(r, "running the kernels");
    return false;
  }
  for (int i = 0; i < num_outputs; ++i) {
    const size_t n = static_cast<size_t>(bytes[num_inputs + i]);
    if (n == 0) continue;
    if (CUresult r = d.cuMemcpyDtoH(outputs[i], device[num_inputs + i], n); r != kSuccess) {
      *error = d.Describe(r, ("copying output " + std::to_string(i) + " to the host").c_str());
      return false;
    }
  }
  return true;
}

std::unique_ptr<CudaFunction> CudaFunction::Load(int device, std::string_view cubin,
                                                 const std::string& name, std::string* error) {
  const Driver& d = GetDriver();
  if (!Usable(d, error)) return nullptr;
  std::unique_ptr<CudaFunction> f(new CudaFunction);
  if (!LoadContext(d, device, &f->context_, error)) return nullptr;
  ContextScope scope(d, f->context_, error);
  if (!scope.ok()) return nullptr;
  std::string image(cubin);  // PTX text must be NUL-terminated; a cubin does not mind
  if (CUresult r = d.cuModuleLoadData(&f->module_, image.c_str()); r != kSuccess) {
    *error = d.Describe(r, ("loading the cubin of " + name).c_str());
    return nullptr;
  }
  if (CUresult r = d.cuModuleGetFunction(&f->function_, f->module_, name.c_str()); r != kSuccess) {
    *error = d.Describe(r, ("kernel " + name).c_str());
    return nullptr;
  }
  return f;
}

CudaFunction::~CudaFunction() {
  const Driver& d = GetDriver();
  if (d.error.empty() && module_) d.cuModuleUnload(module_);
}

bool CudaFunction::Launch(const unsigned grid[3], const unsigned block[3], unsigned shared_bytes,
                          void* stream, void** params, std::string* error) {
  const Driver& d = GetDriver();
  ContextScope scope(d, context_, error);
  if (!scope.ok()) return false;
  if (!AllowShared(shared_bytes, error)) return false;
  CUresult r = d.cuLaunchKernel(function_, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                shared_bytes, static_cast<CUstream>(stream), params, nullptr);
  if (r != kSuccess) {
    *error = d.Describe(r, "cuLaunchKernel");
    return false;
  }
  return true;
}

bool CudaFunction::AllowShared(unsigned bytes, std::string* error) {
  if (bytes <= shared_allowed_.load(std::memory_order_acquire)) return true;  // the common case
  std::lock_guard<std::mutex> lock(shared_mu_);
  if (bytes <= shared_allowed_.load(std::memory_order_relaxed)) return true;  // raised meanwhile
  const Driver& d = GetDriver();
  if (CUresult r = d.cuFuncSetAttribute(function_, kMaxDynamicShared, static_cast<int>(bytes));
      r != kSuccess) {
    *error = d.Describe(r, "raising the kernel's shared memory limit");
    return false;  // the limit stays as it was: a later launch asking as much tries again
  }
  shared_allowed_.store(bytes, std::memory_order_release);
  return true;
}

int CudaDeviceCount(std::string* error) {
  const Driver& d = GetDriver();
  if (!Usable(d, error)) return -1;
  int n = 0;
  if (CUresult r = d.cuDeviceGetCount(&n); r != kSuccess) {
    *error = d.Describe(r, "cuDeviceGetCount");
    return -1;
  }
  return n;
}

int CudaDeviceSm(int device, std::string* error) {
  const Driver& d = GetDriver();
  if (!Usable(d, error)) return -1;
  CUdevice dev = 0;
  int major = 0, minor = 0;
  CUresult r = d.cuDeviceGet(&dev, device);
  if (r == kSuccess) r = d.cuDeviceGetAttribute(&major, kComputeCapabilityMajor, dev);
  if (r == kSuccess) r = d.cuDeviceGetAttribute(&minor, kComputeCapabilityMinor, dev);
  if (r != kSuccess) {
    *error = d.Describe(r, ("the compute capability of device " + std::to_string(device)).c_str());
    return -1;
  }
  return major * 10 + minor;
}

int CudaCurrentDevice(std::string* error) {
  const Driver& d = GetDriver();
  if (!Usable(d, error)) return -1;
  CUcontext ctx = nullptr;
  if (CUresult r = d.cuCtxGetCurrent(&ctx); r != kSuccess) {
    *error = d.Describe(r, "cuCtxGetCurrent");
    return -1;
  }
  if (!ctx) return 0;
  CUdevice dev = 0;
  if (CUresult r = d.cuCtxGetDevice(&dev); r != kSuccess) {
    *error = d.Describe(r, "cuCtxGetDevice");
    return -1;
  }
  return dev;
}

}  // namespace kiln::core
