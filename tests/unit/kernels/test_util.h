// Helpers for compiler tests: build small graphs, compile them through the real pipeline and
// run the resulting .so on host data.
#pragma once

#include <dlfcn.h>

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ir/builder.h"
#include "kernels/ir/op_registry.h"
#include "kernels/pipeline.h"
#include "kernels/toolchain/subprocess.h"

namespace kiln::testing {

inline Pipeline& SharedPipeline() {
  static Pipeline* p = [] {
    auto made = Pipeline::Create(PipelineConfig{});
    EXPECT_TRUE(made.ok()) << made.status();
    return made->release();
  }();
  return *p;
}

inline ir::TensorType Ty(ir::DType t, ir::Shape s) {
  ir::TensorType r;
  r.dtype = t;
  r.shape = std::move(s);
  return r;
}

// A loaded kernel library (kept loaded for the life of the process).
class Loaded {
 public:
  explicit Loaded(const CompileResult& r) : plan_(r.plan) {
    auto dir = toolchain::TempDir::Create("kiln-test-");
    dir_ = std::make_unique<toolchain::TempDir>(std::move(*dir));
    std::string path = dir_->path() + "/k.so";
    EXPECT_TRUE(toolchain::WriteFile(path, r.artifacts[0].bytes).ok());
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(handle_, nullptr) << dlerror();
    run_ = reinterpret_cast<int (*)(void* const*, void*, int)>(dlsym(handle_, "kiln_run"));
    abi_ = reinterpret_cast<uint32_t (*)()>(dlsym(handle_, "kiln_abi_version"));
  }
  // Never dlclose: a kernel library pulls in libgomp, whose worker threads outlive the
  // parallel regions; unloading the last user of libgomp under them crashes the process.
  ~Loaded() = default;
  uint32_t abi() const { return abi_(); }
  // args: inputs then outputs.
  int Run(std::vector<void*> args, int threads = 0) {
    std::vector<char> ws(static_cast<size_t>(plan_.workspace_bytes) + 64);
    return run_(args.data(), ws.data(), threads);
  }

 private:
  LaunchPlan plan_;
  std::unique_ptr<toolchain::TempDir> dir_;
  void* handle_ = nullptr;
  int (*run_)(void* const*, void*, int) = nullptr;
  uint32_t (*abi_)() = nullptr;
};

}  // namespace kiln::testing
