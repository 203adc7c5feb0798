// A stand-in for the CUDA driver (built as a library with soname libcuda.so.1) for testing the
// CUDA loader without a GPU: "device memory" is host memory, a "module" is an emulated kernel
// library (see cuda_emulation.h) registered beforehand with fake_cuda_use_library, and a launch
// runs the kernel there. Images passed to cuModuleLoadData are checked to be a cubin (ELF) or
// PTX text and otherwise ignored. In a dry run (fake_cuda_dry_run) launches are checked and
// recorded but run nothing, so any kernel name resolves and launches may come from any thread.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

void* emulated = nullptr;  // the kernels' library
int (*emu_launch)(void*, unsigned, unsigned, void**, int) = nullptr;
struct Function {
  void* fn;
  int nargs;
};
std::vector<std::string> launched;
std::vector<void*> launch_streams;
int context = 1;
int sm = 90;                // the device's compute capability, as major * 10 + minor
bool refuse_cubin = false;  // a device of another architecture: only PTX loads
bool dry_run = false;
// Dynamic shared memory: what a kernel may use unless its limit is raised, and the most it can
// be raised to (sm_90's 227 KiB).
constexpr int kDefaultShared = 48 * 1024;
constexpr int kMaxShared = 227 * 1024;
std::mutex mu;                        // guards the records below and launched, launch_streams
std::map<void*, int> shared_limit;    // per function, as raised by cuFuncSetAttribute
std::vector<int> shared_limit_tries;  // every value cuFuncSetAttribute was asked to set
int over_limit_launches = 0;          // launches refused for more shared memory than allowed

}  // namespace

extern "C" {

// Test hooks.
void fake_cuda_use_library(void* handle) {
  emulated = handle;
  emu_launch = reinterpret_cast<int (*)(void*, unsigned, unsigned, void**, int)>(
      dlsym(handle, "kiln_emu_launch"));
}
int fake_cuda_launch_count() { return static_cast<int>(launched.size()); }
const char* fake_cuda_launched(int i) { return launched[i].c_str(); }
void* fake_cuda_launch_stream(int i) { return launch_streams[i]; }
void fake_cuda_set_sm(int value) { sm = value; }
void fake_cuda_refuse_cubin(int refuse) { refuse_cubin = refuse != 0; }
// Dry runs on or off; either way the launch and shared memory records start afresh.
void fake_cuda_dry_run(int on) {
  std::lock_guard<std::mutex> lock(mu);
  dry_run = on != 0;
  launched.clear();
  launch_streams.clear();
  shared_limit.clear();
  shared_limit_tries.clear();
  over_limit_launches = 0;
}
int fake_cuda_shared_limit_try_count() {
  std::lock_guard<std::mutex> lock(mu);
  return static_cast<int>(shared_limit_tries.size());
}
int fake_cuda_shared_limit_try(int i) {
  std::lock_guard<std::mutex> lock(mu);
  return shared_limit_tries[i];
}
int fake_cuda_over_limit_launches() {
  std::lock_guard<std::mutex> lock(mu);
  return over_limit_launches;
}

// The driver API subset the loader resolves; return codes as in cuda.h.
int cuInit(unsigned) { return 0; }
int cuDeviceGet(int* d, int ordinal) {
  *d = ordinal;
  return ordinal == 0 ? 0 : 101;  // CUDA_ERROR_INVALID_DEVICE
}
int cuCtxGetCurrent(void** ctx) {
  *ctx = &context;
  return 0;
}
int cuCtxSetCurrent(void*) { return 0; }
int cuCtxGetDevice(int* d) {
  *d = 0;
  return 0;
}
int cuDeviceGetCount(int* n) {
  *n = 1;
  return 0;
}
int cuDeviceGetAttribute(int* value, int attribute, int) {
  if (attribute == 75)
    *value = sm / 10;  // COMPUTE_CAPABILITY_MAJOR
  else if (attribute == 76)
    *value = sm % 10;  // _MINOR
  else
    return 1;  // CUDA_ERROR_INVALID_VALUE
  return 0;
}
int cuFuncSetAttribute(void* fn, int attribute, int value) {
  if (attribute != 8) return 0;  // MAX_DYNAMIC_SHARED_SIZE_BYTES is the one recorded
  // A driver call takes a while: callers racing to set the limit overlap here, as they would.
  if (dry_run) std::this_thread::sleep_for(std::chrono::microseconds(500));
  std::lock_guard<std::mutex> lock(mu);
  shared_limit_tries.push_back(value);
  if (value < 0 || value > kMaxShared) return 1;  // CUDA_ERROR_INVALID_VALUE
  shared_limit[fn] = value;  // set, not raised: a lower value lowers the limit, as in the driver
  return 0;
}
int cuDevicePrimaryCtxRetain(void** ctx, int) {
  *ctx = &context;
  return 0;
}
int cuModuleLoadData(void** module, const void* image) {
  const char* p = static_cast<const char*>(image);
  bool cubin = std::memcmp(p,
                           "\x7f"
                           "ELF",
                           4) == 0;
  bool ptx = std::strstr(p, ".target") != nullptr;
  if (!cubin && !ptx) return 200;         // CUDA_ERROR_INVALID_IMAGE
  if (cubin && refuse_cubin) return 209;  // CUDA_ERROR_NO_BINARY_FOR_GPU
  *module = dry_run ? &dry_run : emulated;
  return *module ? 0 : 200;
}
int cuModuleUnload(void*) { return 0; }
int cuModuleGetFunction(void** fn, void* module, const char* name) {
  // In a dry run any name resolves: the kernel is never called.
  void* f = module == &dry_run ? &dry_run : dlsym(module, name);
  if (!f) return 500;  // CUDA_ERROR_NOT_FOUND
  // The name travels with the handle, for the launch record. One handle per kernel of a
  // module, as from the driver: attributes set through one are the kernel's.
  static std::map<std::pair<void*, std::string>, std::pair<void*, std::string>*> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto*& rec = handles[{module, name}];
  if (rec == nullptr || rec->first != f) rec = new std::pair<void*, std::string>(f, name);
  *fn = rec;
  return 0;
}
int cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void* stream, void** params, void** extra) {
  auto* rec = static_cast<std::pair<void*, std::string>*>(fn);
  if (dry_run) {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = shared_limit.find(fn);
    if (static_cast<int>(shared) >
        std::max(kDefaultShared, it == shared_limit.end() ? 0 : it->second)) {
      ++over_limit_launches;
      return 1;  // CUDA_ERROR_INVALID_VALUE, as the driver answers a launch over the limit
    }
    launched.push_back(rec->second);
    launch_streams.push_back(stream);
    return 0;
  }
  // The emulation has no dynamic shared memory.
  if (gy != 1 || gz != 1 || by != 1 || bz != 1 || shared != 0 || extra)
    return 1;  // CUDA_ERROR_INVALID_VALUE
  // Parameters are all device pointers: count them by the kernel's arity, which the emulated
  // library cannot tell us, so pass every one up to the null after the last (at most the
  // emulation's 64) and let the kernel read what it declares.
  std::vector<void*> args;
  for (int i = 0; i < 64 && params[i]; ++i) args.push_back(*static_cast<void**>(params[i]));
  {
    std::lock_guard<std::mutex> lock(mu);
    launched.push_back(rec->second);
    launch_streams.push_back(stream);
  }
  return emu_launch(rec->first, gx, bx, args.data(), static_cast<int>(args.size()));
}
int cuMemAlloc_v2(unsigned long long* p, size_t bytes) {
  *p = reinterpret_cast<unsigned long long>(std::aligned_alloc(256, (bytes + 255) / 256 * 256));
  return 0;
}
int cuMemFree_v2(unsigned long long p) {
  std::free(reinterpret_cast<void*>(p));
  return 0;
}
// Device memory is host memory here, so copies are memcpy and every launch has finished.
int cuMemcpyHtoD_v2(unsigned long long dst, const void* src, size_t bytes) {
  std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return 0;
}
int cuMemcpyDtoH_v2(void* dst, unsigned long long src, size_t bytes) {
  std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  return 0;
}
int cuCtxSynchronize() { return 0; }
int cuGetErrorName(int, const char** s) {
  *s = "CUDA_ERROR_FAKE";
  return 0;
}
int cuGetErrorString(int, const char** s) {
  *s = "fake driver error";
  return 0;
}

}  // extern "C"
