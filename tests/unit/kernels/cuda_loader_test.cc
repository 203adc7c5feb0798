// The CUDA loader end to end without a GPU: a fake driver (fake_libcuda.cc, loaded first under
// the soname libcuda.so.1, so the loader's dlopen finds it) runs the generated kernels in
// emulation on host memory. Checks that the loader launches the plan's steps in order with
// the buffers and workspace the plan names, through both the C++ and the C API, and that the
// results match the CPU backend.
#include <dlfcn.h>

#include <cstdlib>

#include "client/cpp/cuda_loader.h"
#include "tests/unit/kernels/cuda_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;  // NOLINT: test helpers

ir::Graph SoftmaxAndSum();

class FakeDriver : public ::testing::Test {
 protected:
  // NVRTC looks for the driver too, and must not find the fake: compile before loading it.
  static void SetUpTestSuite() {
    if (!HaveNvrtc()) return;  // each test then skips in SetUp, saying why
    auto r = SharedPipeline().Compile(SoftmaxAndSum(), CudaTarget(90), CompileOptions{});
    ASSERT_TRUE(r.ok()) << r.status();
    compiled_ = new CompileResult(std::move(*r));
  }

  void SetUp() override {
    REQUIRE_NVRTC();
    const char* bin = std::getenv("KILN_BINARY_DIR");
    if (!bin) GTEST_SKIP() << "KILN_BINARY_DIR not set";
    ASSERT_NE(compiled_, nullptr);
    driver_ = dlopen((std::string(bin) + "/tests/unit/kernels/libfake_cuda.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(driver_, nullptr) << dlerror();
    use_library_ = reinterpret_cast<void (*)(void*)>(dlsym(driver_, "fake_cuda_use_library"));
    launch_count_ = reinterpret_cast<int (*)()>(dlsym(driver_, "fake_cuda_launch_count"));
    launched_ = reinterpret_cast<const char* (*)(int)>(dlsym(driver_, "fake_cuda_launched"));
  }

  static inline CompileResult* compiled_ = nullptr;
  void* driver_ = nullptr;
  void (*use_library_)(void*) = nullptr;
  int (*launch_count_)() = nullptr;
  const char* (*launched_)(int) = nullptr;
};

client::CudaPlan ToLoaderPlan(const LaunchPlan& p) {
  client::CudaPlan out;
  out.abi_version = p.abi_version;
  out.workspace_bytes = p.workspace_bytes;
  for (const PlanBuffer& b : p.buffers) {
    client::CudaPlan::Buffer c;
    c.role = b.role == BufferRole::kInput    ? client::CudaPlan::Role::kInput
             : b.role == BufferRole::kOutput ? client::CudaPlan::Role::kOutput
                                             : client::CudaPlan::Role::kTemp;
    c.index = b.index;
    c.dtype = ir::DTypeName(b.dtype);
    c.shape = b.shape;
    c.bytes = b.bytes;
    c.offset = b.offset;
    out.buffers.push_back(c);
  }
  for (const PlanStep& s : p.steps) {
    client::CudaPlan::Step c;
    c.kernel = s.kernel;
    for (int k = 0; k < 3; ++k) {
      c.grid[k] = s.grid[k];
      c.block[k] = s.block[k];
    }
    c.shared_bytes = s.shared_bytes;
    c.args.assign(s.args.begin(), s.args.end());
    out.steps.push_back(c);
  }
  return out;
}

// softmax(x) and sum(x): a row kernel, and a whole-tensor sum with a partial step and a temp.
ir::Graph SoftmaxAndSum() {
  return Make({Ty(DType::kF32, {300, 1000})}, [](ir::Builder& b) {
    return std::vector<ValueId>{*b.Add("softmax", {0}), *b.Add("sum", {0})};
  });
}

// The outputs of SoftmaxAndSum against host references: every element of the softmax, and
// the sum (to the rounding of float partial sums).
void ExpectSoftmaxAndSum(const HostTensor& x, const HostTensor& soft, const HostTensor& total) {
  const std::vector<double> want = HostSoftmaxRows(x, 300, 1000);
  int bad = 0;
  for (int64_t i = 0; i < 300 * 1000 && bad < 8; ++i)
    if (!Close(DType::kF32, soft.At(i), want[i])) {
      ++bad;
      ADD_FAILURE() << "softmax element " << i << ": " << soft.At(i) << ", expected " << want[i];
    }
  double sum = 0;
  for (int64_t i = 0; i < 300 * 1000; ++i) sum += x.At(i);
  EXPECT_NEAR(total.At(0), sum, 1e-3 * (1 + std::fabs(sum)));
}

TEST_F(FakeDriver, RunsEveryStepWithThePlansBuffers) {
  const CompileResult* compiled = compiled_;
  auto emu = EmulatedUnit::Build(compiled->artifacts[2].bytes);
  ASSERT_TRUE(emu.ok()) << emu.status();
  use_library_((*emu)->handle());

  std::string error;
  auto module = client::CudaModule::Load(compiled->artifacts[0].bytes, compiled->artifacts[1].bytes,
                                         ToLoaderPlan(compiled->plan), &error);
  ASSERT_NE(module, nullptr) << error;
  EXPECT_FALSE(module->loaded_from_ptx());

  std::mt19937 rng(7);
  HostTensor x = RandomTensor(DType::kF32, 300 * 1000, &rng);
  HostTensor soft = HostTensor::Make(DType::kF32, 300 * 1000), total = HostTensor::Make(DType::kF32, 1);
  void* buffers[] = {x.data.get(), soft.data.get(), total.data.get()};
  int before = launch_count_();
  ASSERT_TRUE(module->Run(buffers, nullptr, nullptr, &error)) << error;
  ASSERT_EQ(launch_count_() - before, static_cast<int>(compiled->plan.steps.size()));
  for (size_t i = 0; i < compiled->plan.steps.size(); ++i)
    EXPECT_EQ(launched_(before + static_cast<int>(i)), compiled->plan.steps[i].kernel);

  ExpectSoftmaxAndSum(x, soft, total);

  // The host path (Session's Run on a CUDA result): copies in, the same launches, copies out.
  HostTensor soft_host = HostTensor::Make(DType::kF32, 300 * 1000), total_host = HostTensor::Make(DType::kF32, 1);
  const void* inputs[] = {x.data.get()};
  void* outputs[] = {soft_host.data.get(), total_host.data.get()};
  before = launch_count_();
  ASSERT_TRUE(module->RunHost(inputs, outputs, &error)) << error;
  EXPECT_EQ(launch_count_() - before, static_cast<int>(compiled->plan.steps.size()));
  ExpectSoftmaxAndSum(x, soft_host, total_host);
}

TEST_F(FakeDriver, CApiLoadsAKilncFolder) {
  const char* bin = std::getenv("KILN_BINARY_DIR");
  auto dir = toolchain::TempDir::Create("kiln-loader-");
  ASSERT_TRUE(dir.ok());
  std::string graph =
      "inputs { name: \"x\" type { dtype: F32 shape: 300 shape: 1000 } }\n"
      "nodes { op: \"softmax\" inputs: 0 }\nnodes { op: \"sum\" inputs: 0 }\noutputs: 1 outputs: 2\n";
  ASSERT_TRUE(toolchain::WriteFile(dir->path() + "/g.txtpb", graph).ok());
  auto r = toolchain::RunSandboxed({std::string(bin) + "/kernels/kilnc", "g.txtpb", "--target", "cuda:sm_90", "--out",
                                    "out"},
                                   dir->path(), toolchain::SandboxLimits{});
  ASSERT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->output : r.status().ToString());
  auto emu = EmulatedUnit::Build(SlurpFile(dir->path() + "/out/kernel.cu"));
  ASSERT_TRUE(emu.ok()) << emu.status();
  use_library_((*emu)->handle());

  kiln_cuda_module* m = kiln_cuda_load_dir((dir->path() + "/out").c_str());
  ASSERT_NE(m, nullptr) << kiln_cuda_last_error();
  EXPECT_EQ(kiln_cuda_num_inputs(m), 1);
  EXPECT_EQ(kiln_cuda_num_outputs(m), 2);
  EXPECT_GT(kiln_cuda_workspace_bytes(m), 0);
  std::mt19937 rng(8);
  HostTensor x = RandomTensor(DType::kF32, 300 * 1000, &rng);
  HostTensor soft = HostTensor::Make(DType::kF32, 300 * 1000), total = HostTensor::Make(DType::kF32, 1);
  HostTensor ws = HostTensor::Make(DType::kU8, kiln_cuda_workspace_bytes(m));  // a caller's workspace
  void* buffers[] = {x.data.get(), soft.data.get(), total.data.get()};
  ASSERT_EQ(kiln_cuda_run(m, buffers, ws.data.get(), nullptr), 0) << kiln_cuda_last_error();
  ExpectSoftmaxAndSum(x, soft, total);
  kiln_cuda_free(m);

  // A plan from another ABI is refused.
  std::string json = SlurpFile(dir->path() + "/out/plan.json");
  json.replace(json.find("\"abi_version\": 1"), 16, "\"abi_version\": 9");
  std::string cubin = SlurpFile(dir->path() + "/out/kernel.cubin");
  EXPECT_EQ(kiln_cuda_load(cubin.data(), cubin.size(), nullptr, json.c_str()), nullptr);
  EXPECT_NE(std::string(kiln_cuda_last_error()).find("ABI version 9"), std::string::npos) << kiln_cuda_last_error();
}

}  // namespace
}  // namespace kiln
