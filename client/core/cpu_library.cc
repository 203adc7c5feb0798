#include "client/core/cpu_library.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

namespace kiln::core {
namespace {

class Registry {
 public:
  // The library under `key`, opening `path` when the key is new. Opening under the lock keeps
  // one dlopen per key when threads race on a new kernel.
  const CpuLibrary* Get(const std::string& key, const std::string& path, Error* error) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = libraries_.find(key); it != libraries_.end()) return it->second.get();
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      error->Fail(KILN_CORE_NOT_FOUND, "kernel library " + path + " does not exist");
      return nullptr;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      error->Fail(KILN_CORE_FAILED_PRECONDITION,
                  "cannot load kernel library " + path + ": " + dlerror());
      return nullptr;
    }
    // From here on the library stays loaded even when it turns out unusable: closing it is
    // what is unsafe.
    auto abi = reinterpret_cast<CpuLibrary::AbiFn>(dlsym(handle, "kiln_abi_version"));
    void* run = dlsym(handle, "kiln_run");
    if (abi == nullptr || run == nullptr) {
      error->Fail(KILN_CORE_FAILED_PRECONDITION,
                  path + " is not a kiln kernel library: it lacks kiln_abi_version or kiln_run");
      return nullptr;
    }
    auto library = std::make_unique<CpuLibrary>();
    library->path = path;
    library->abi_version = abi();
    if (library->abi_version == 2) {
      library->run_sized = reinterpret_cast<CpuLibrary::RunSizedFn>(run);
      library->workspace =
          reinterpret_cast<CpuLibrary::WorkspaceFn>(dlsym(handle, "kiln_workspace_bytes"));
      if (library->workspace == nullptr) {
        error->Fail(KILN_CORE_FAILED_PRECONDITION,
                    path + ": ABI 2 library without kiln_workspace_bytes");
        return nullptr;
      }
    } else {
      library->run = reinterpret_cast<CpuLibrary::RunFn>(run);
    }
    const CpuLibrary* result = library.get();
    libraries_.emplace(key, std::move(library));
    return result;
  }

  bool Has(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return libraries_.count(key) > 0;
  }

  int64_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(libraries_.size());
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<CpuLibrary>> libraries_;  // guarded by mu_
};

Registry& TheRegistry() {
  static Registry* registry = new Registry();  // never destroyed: kernels outlive main()
  return *registry;
}

// Writes `bytes` to a new anonymous in-memory file; its descriptor, or -1.
int ImageFile(std::string_view bytes, const std::string& name, Error* error) {
  const int fd = memfd_create(("kiln-" + name.substr(0, 12)).c_str(), MFD_CLOEXEC);
  if (fd < 0) {
    error->Fail(KILN_CORE_UNAVAILABLE, std::string("memfd_create: ") + std::strerror(errno));
    return -1;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      error->Fail(KILN_CORE_UNAVAILABLE,
                  "writing kernel image " + name + ": " + std::strerror(errno));
      close(fd);
      return -1;
    }
    done += static_cast<size_t>(n);
  }
  return fd;
}

}  // namespace

const CpuLibrary* OpenCpuLibrary(const std::string& path, Error* error) {
  return TheRegistry().Get(path, path, error);
}

const CpuLibrary* OpenCpuImage(std::string_view bytes, const std::string& name, Error* error) {
  const std::string key = "image:" + name;
  Registry& registry = TheRegistry();
  if (registry.Has(key)) return registry.Get(key, "", error);
  const int fd = ImageFile(bytes, name, error);
  if (fd < 0) return nullptr;
  const CpuLibrary* library = registry.Get(key, "/proc/self/fd/" + std::to_string(fd), error);
  // The descriptor stays open (see the header) unless another thread won the race for this
  // name. A failed open keeps it too: dlopen may have mapped the file before the symbols were
  // found missing, and the name must then stay that file's.
  if (library != nullptr && library->path != "/proc/self/fd/" + std::to_string(fd)) close(fd);
  return library;
}

int64_t CpuLibraryCount() { return TheRegistry().size(); }

}  // namespace kiln::core
