// The CUDA loader end to end without a GPU: a fake driver (fake_libcuda.cc, loaded first under
// the soname libcuda.so.1, so the loader's dlopen finds it) runs the generated kernels in
// emulation on host memory. Checks that the loader launches the plan's steps in order with
// the buffers and workspace the plan names, through both the C++ and the C API, and that the
// results match the CPU backend.
#include "client/core/cuda_loader.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iterator>
#include <thread>
#include <vector>

#include "client/core/kiln_core.h"
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
    driver_ = dlopen((std::string(bin) + "/tests/unit/kernels/libfake_cuda.so").c_str(),
                     RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(driver_, nullptr) << dlerror();
    use_library_ = reinterpret_cast<void (*)(void*)>(dlsym(driver_, "fake_cuda_use_library"));
    launch_count_ = reinterpret_cast<int (*)()>(dlsym(driver_, "fake_cuda_launch_count"));
    launched_ = reinterpret_cast<const char* (*)(int)>(dlsym(driver_, "fake_cuda_launched"));
  }

  // Compiles `graph` (text format) with kilnc into `dir`/out and makes the fake driver run
  // its kernels in emulation; `emu` keeps the emulated unit loaded.
  void KilncFolder(const std::string& dir, const std::string& graph,
                   std::unique_ptr<EmulatedUnit>* emu) {
    const char* bin = std::getenv("KILN_BINARY_DIR");
    ASSERT_TRUE(toolchain::WriteFile(dir + "/g.txtpb", graph).ok());
    auto r = toolchain::RunSandboxed(
        {std::string(bin) + "/kernels/kilnc", "g.txtpb", "--target", "cuda:sm_90", "--out", "out"},
        dir, toolchain::SandboxLimits{});
    ASSERT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->output : r.status().ToString());
    auto unit = EmulatedUnit::Build(SlurpFile(dir + "/out/kernel.cu"));
    ASSERT_TRUE(unit.ok()) << unit.status();
    *emu = std::move(*unit);
    use_library_((*emu)->handle());
  }

  static inline CompileResult* compiled_ = nullptr;
  void* driver_ = nullptr;
  void (*use_library_)(void*) = nullptr;
  int (*launch_count_)() = nullptr;
  const char* (*launched_)(int) = nullptr;
};

core::CudaPlan ToLoaderPlan(const LaunchPlan& p) {
  core::CudaPlan out;
  out.abi_version = p.abi_version;
  out.workspace_bytes = p.workspace_bytes;
  for (const PlanBuffer& b : p.buffers) {
    core::CudaPlan::Buffer c;
    c.role = b.role == BufferRole::kInput    ? core::CudaPlan::Role::kInput
             : b.role == BufferRole::kOutput ? core::CudaPlan::Role::kOutput
                                             : core::CudaPlan::Role::kTemp;
    c.index = b.index;
    c.dtype = ir::DTypeName(b.dtype);
    c.shape = b.shape;
    c.bytes = b.bytes;
    c.offset = b.offset;
    out.buffers.push_back(c);
  }
  for (const PlanStep& s : p.steps) {
    core::CudaPlan::Step c;
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
  auto module = core::CudaModule::Load(compiled->artifacts[0].bytes, compiled->artifacts[1].bytes,
                                       ToLoaderPlan(compiled->plan), &error);
  ASSERT_NE(module, nullptr) << error;
  EXPECT_FALSE(module->loaded_from_ptx());

  std::mt19937 rng(7);
  HostTensor x = RandomTensor(DType::kF32, 300 * 1000, &rng);
  HostTensor soft = HostTensor::Make(DType::kF32, 300 * 1000),
             total = HostTensor::Make(DType::kF32, 1);
  void* buffers[] = {x.data.get(), soft.data.get(), total.data.get()};
  int before = launch_count_();
  ASSERT_TRUE(module->Run(buffers, nullptr, nullptr, &error)) << error;
  ASSERT_EQ(launch_count_() - before, static_cast<int>(compiled->plan.steps.size()));
  for (size_t i = 0; i < compiled->plan.steps.size(); ++i)
    EXPECT_EQ(launched_(before + static_cast<int>(i)), compiled->plan.steps[i].kernel);

  ExpectSoftmaxAndSum(x, soft, total);

  // The host path (Session's Run on a CUDA result): copies in, the same launches, copies out.
  HostTensor soft_host = HostTensor::Make(DType::kF32, 300 * 1000),
             total_host = HostTensor::Make(DType::kF32, 1);
  const void* inputs[] = {x.data.get()};
  void* outputs[] = {soft_host.data.get(), total_host.data.get()};
  before = launch_count_();
  ASSERT_TRUE(module->RunHost(inputs, outputs, &error)) << error;
  EXPECT_EQ(launch_count_() - before, static_cast<int>(compiled->plan.steps.size()));
  ExpectSoftmaxAndSum(x, soft_host, total_host);
}

// A step with an empty grid (a zero-size tensor's kernel) is not launched: the driver refuses
// a grid of 0 blocks. The other steps still run.
TEST_F(FakeDriver, SkipsStepsWithAnEmptyGrid) {
  const CompileResult* compiled = compiled_;
  auto emu = EmulatedUnit::Build(compiled->artifacts[2].bytes);
  ASSERT_TRUE(emu.ok()) << emu.status();
  use_library_((*emu)->handle());
  core::CudaPlan plan = ToLoaderPlan(compiled->plan);
  ASSERT_GE(plan.steps.size(), 2u);
  plan.steps[0].grid[0] = 0;
  std::string error;
  auto module = core::CudaModule::Load(compiled->artifacts[0].bytes, compiled->artifacts[1].bytes,
                                       plan, &error);
  ASSERT_NE(module, nullptr) << error;
  std::mt19937 rng(3);
  HostTensor x = RandomTensor(DType::kF32, 300 * 1000, &rng);
  HostTensor soft = HostTensor::Make(DType::kF32, 300 * 1000),
             total = HostTensor::Make(DType::kF32, 1);
  void* buffers[] = {x.data.get(), soft.data.get(), total.data.get()};
  const int before = launch_count_();
  ASSERT_TRUE(module->Run(buffers, nullptr, nullptr, &error)) << error;
  ASSERT_EQ(launch_count_() - before, static_cast<int>(plan.steps.size()) - 1);
  EXPECT_EQ(launched_(before), plan.steps[1].kernel);
}

TEST_F(FakeDriver, CApiLoadsAKilncFolder) {
  auto dir = toolchain::TempDir::Create("kiln-loader-");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<EmulatedUnit> emu;
  ASSERT_NO_FATAL_FAILURE(
      KilncFolder(dir->path(),
                  "inputs { name: \"x\" type { dtype: F32 shape: 300 shape: 1000 } }\n"
                  "nodes { op: \"softmax\" inputs: 0 }\nnodes { op: \"sum\" inputs: 0 }\n"
                  "outputs: 1 outputs: 2\n",
                  &emu));

  kiln_cuda_module* m = kiln_cuda_load_dir((dir->path() + "/out").c_str());
  ASSERT_NE(m, nullptr) << kiln_core_last_error();
  EXPECT_EQ(kiln_cuda_num_inputs(m), 1);
  EXPECT_EQ(kiln_cuda_num_outputs(m), 2);
  EXPECT_GT(kiln_cuda_workspace_bytes(m, nullptr, 0), 0);
  std::mt19937 rng(8);
  HostTensor x = RandomTensor(DType::kF32, 300 * 1000, &rng);
  HostTensor soft = HostTensor::Make(DType::kF32, 300 * 1000),
             total = HostTensor::Make(DType::kF32, 1);
  HostTensor ws = HostTensor::Make(
      DType::kU8, kiln_cuda_workspace_bytes(m, nullptr, 0));  // a caller's workspace
  void* buffers[] = {x.data.get(), soft.data.get(), total.data.get()};
  ASSERT_EQ(kiln_cuda_run(m, buffers, ws.data.get(), nullptr, nullptr, 0), 0)
      << kiln_core_last_error();
  ExpectSoftmaxAndSum(x, soft, total);
  kiln_cuda_free(m);

  // A plan from another ABI is refused.
  std::string json = SlurpFile(dir->path() + "/out/plan.json");
  json.replace(json.find("\"abi_version\": 1"), 16, "\"abi_version\": 9");
  std::string cubin = SlurpFile(dir->path() + "/out/kernel.cubin");
  EXPECT_EQ(kiln_cuda_load(-1, cubin.data(), cubin.size(), nullptr, json.c_str()), nullptr);
  EXPECT_NE(std::string(kiln_core_last_error()).find("ABI version 9"), std::string::npos)
      << kiln_core_last_error();
}

// A plan with symbolic sizes (ABI version 2) through the C API: softmax over rows of symbolic
// length and a whole-tensor sum (partial launches and a temp), run at several sizes from one
// load; grids and temps follow the sizes; wrong size counts, negative sizes and sizes past
// the 32-bit index bound are refused.
TEST_F(FakeDriver, CApiRunsASymbolicPlanAtEverySize) {
  auto dir = toolchain::TempDir::Create("kiln-loader-sym-");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<EmulatedUnit> emu;
  ASSERT_NO_FATAL_FAILURE(KilncFolder(dir->path(),
                                      "inputs { name: \"x\" type { dtype: F32 shape: 300 shape: "
                                      "1000 dim_symbols: \"R\" dim_symbols: \"C\" } }\n"
                                      "nodes { op: \"softmax\" inputs: 0 }\nnodes { op: \"sum\" "
                                      "inputs: 0 }\noutputs: 1 outputs: 2\n",
                                      &emu));

  kiln_cuda_module* m = kiln_cuda_load_dir((dir->path() + "/out").c_str());
  ASSERT_NE(m, nullptr) << kiln_core_last_error();
  ASSERT_EQ(kiln_cuda_num_symbols(m), 2);
  void* none[] = {nullptr, nullptr, nullptr};
  EXPECT_EQ(kiln_cuda_run(m, none, nullptr, nullptr, nullptr, 0), -1);  // it needs sizes
  EXPECT_NE(std::string(kiln_core_last_error()).find("2 symbols; got 0"), std::string::npos)
      << kiln_core_last_error();

  std::mt19937 rng(9);
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {300, 1000}, {7, 130}, {1, 1}, {33, 4097}, {0, 5}}) {
    SCOPED_TRACE(::testing::Message() << rows << " x " << cols);
    const int64_t sizes[] = {rows, cols};
    const int64_t ws_bytes = kiln_cuda_workspace_bytes(m, sizes, 2);
    ASSERT_GE(ws_bytes, 0) << kiln_core_last_error();
    HostTensor x = RandomTensor(DType::kF32, rows * cols, &rng);
    HostTensor soft = HostTensor::Make(DType::kF32, rows * cols),
               total = HostTensor::Make(DType::kF32, 1);
    HostTensor ws = HostTensor::Make(DType::kU8, std::max<int64_t>(ws_bytes, 1));
    void* buffers[] = {x.data.get(), soft.data.get(), total.data.get()};
    const int before = launch_count_();
    ASSERT_EQ(kiln_cuda_run(m, buffers, ws.data.get(), nullptr, sizes, 2), 0)
        << kiln_core_last_error();
    if (rows * cols > 0) {
      EXPECT_GT(launch_count_(), before);
    }
    const std::vector<double> want = HostSoftmaxRows(x, rows, cols);
    int bad = 0;
    for (int64_t i = 0; i < rows * cols && bad < 8; ++i)
      if (!Close(DType::kF32, soft.At(i), want[i])) {
        ++bad;
        ADD_FAILURE() << "softmax element " << i << ": " << soft.At(i) << ", expected " << want[i];
      }
    double sum = 0;
    for (int64_t i = 0; i < rows * cols; ++i) sum += x.At(i);
    EXPECT_NEAR(total.At(0), sum, 1e-3 * (1 + std::fabs(sum)));
  }
  // A module-owned workspace (null) works too, and grows with the sizes.
  {
    const int64_t sizes[] = {64, 3000};
    HostTensor x = RandomTensor(DType::kF32, 64 * 3000, &rng);
    HostTensor soft = HostTensor::Make(DType::kF32, 64 * 3000),
               total = HostTensor::Make(DType::kF32, 1);
    void* buffers[] = {x.data.get(), soft.data.get(), total.data.get()};
    ASSERT_EQ(kiln_cuda_run(m, buffers, nullptr, nullptr, sizes, 2), 0) << kiln_core_last_error();
    double sum = 0;
    for (int64_t i = 0; i < 64 * 3000; ++i) sum += x.At(i);
    EXPECT_NEAR(total.At(0), sum, 1e-3 * (1 + std::fabs(sum)));
  }
  const int64_t one[] = {4};
  EXPECT_EQ(kiln_cuda_run(m, none, nullptr, nullptr, one, 1), -1);
  EXPECT_NE(std::string(kiln_core_last_error()).find("2 symbols"), std::string::npos)
      << kiln_core_last_error();
  const int64_t negative[] = {4, -1};
  EXPECT_EQ(kiln_cuda_run(m, none, nullptr, nullptr, negative, 2), -1);
  EXPECT_NE(std::string(kiln_core_last_error()).find("negative"), std::string::npos)
      << kiln_core_last_error();
  const int64_t huge[] = {int64_t{1} << 20, int64_t{1} << 12};
  EXPECT_EQ(kiln_cuda_workspace_bytes(m, huge, 2), -1);
  EXPECT_NE(std::string(kiln_core_last_error()).find("32-bit"), std::string::npos)
      << kiln_core_last_error();
  kiln_cuda_free(m);
}

// A dry run of the fake driver for the test's length: launches are checked (one with more
// dynamic shared memory than its function's limit is refused, as by the driver) and recorded,
// and nothing runs.
class DryRun {
 public:
  explicit DryRun(void* driver)
      : set_(reinterpret_cast<void (*)(int)>(dlsym(driver, "fake_cuda_dry_run"))),
        try_count_(reinterpret_cast<int (*)()>(dlsym(driver, "fake_cuda_shared_limit_try_count"))),
        try_(reinterpret_cast<int (*)(int)>(dlsym(driver, "fake_cuda_shared_limit_try"))),
        over_(reinterpret_cast<int (*)()>(dlsym(driver, "fake_cuda_over_limit_launches"))) {
    set_(1);
  }
  ~DryRun() { set_(0); }
  // Every value cuFuncSetAttribute was asked to set the limit to, in order.
  std::vector<int> LimitTries() const {
    std::vector<int> out;
    for (int i = 0; i < try_count_(); ++i) out.push_back(try_(i));
    return out;
  }
  int OverLimitLaunches() const { return over_(); }

 private:
  void (*set_)(int);
  int (*try_count_)();
  int (*try_)(int);
  int (*over_)();
};

constexpr char kRawCubin[] =
    "\x7f"
    "ELF: a raw kernel's image";
constexpr unsigned kGrid[3] = {4, 1, 1}, kBlock[3] = {128, 1, 1};

// A raw kernel's limit on dynamic shared memory is raised when a launch needs more than any
// before it, and only then: not on every launch, and never lowered.
TEST_F(FakeDriver, RawKernelRaisesItsSharedMemoryLimitOnlyForANewMaximum) {
  DryRun dry(driver_);
  std::string error;
  auto f = core::CudaFunction::Load(0, kRawCubin, "raw", &error);
  ASSERT_NE(f, nullptr) << error;
  for (unsigned kib : {0, 1, 48, 64, 64, 96, 32, 96, 80, 0, 96}) {
    EXPECT_TRUE(f->Launch(kGrid, kBlock, kib * 1024, nullptr, nullptr, &error))
        << kib << ": " << error;
  }
  EXPECT_EQ(dry.LimitTries(), (std::vector<int>{64 * 1024, 96 * 1024}));
  EXPECT_EQ(launch_count_(), 11);
  // More than the device has: the driver refuses the limit, the launch fails saying why, and the
  // limit stays as it was, so a later launch asking as much asks the driver again.
  EXPECT_FALSE(f->Launch(kGrid, kBlock, 300 * 1024, nullptr, nullptr, &error));
  EXPECT_NE(error.find("shared memory limit"), std::string::npos) << error;
  EXPECT_TRUE(f->Launch(kGrid, kBlock, 96 * 1024, nullptr, nullptr, &error)) << error;
  EXPECT_FALSE(f->Launch(kGrid, kBlock, 300 * 1024, nullptr, nullptr, &error));
  EXPECT_TRUE(f->Launch(kGrid, kBlock, 128 * 1024, nullptr, nullptr, &error)) << error;
  EXPECT_EQ(dry.LimitTries(),
            (std::vector<int>{64 * 1024, 96 * 1024, 300 * 1024, 300 * 1024, 128 * 1024}));
  EXPECT_EQ(dry.OverLimitLaunches(), 0);
  // Another function of the same image starts from the driver's default.
  auto g = core::CudaFunction::Load(0, kRawCubin, "raw", &error);
  ASSERT_NE(g, nullptr) << error;
  EXPECT_TRUE(g->Launch(kGrid, kBlock, 64 * 1024, nullptr, nullptr, &error)) << error;
  EXPECT_EQ(dry.LimitTries().back(), 64 * 1024);
}

// Steps of one kernel asking different amounts of dynamic shared memory: the module sets each
// kernel's limit once, to the most any of its steps asks, so no step finds it lowered under
// what it needs (the driver sets the limit; it does not raise it).
TEST_F(FakeDriver, StepsOfOneKernelGetItsLargestSharedMemoryLimit) {
  DryRun dry(driver_);
  core::CudaPlan plan;
  plan.abi_version = 1;
  for (core::CudaPlan::Role role : {core::CudaPlan::Role::kInput, core::CudaPlan::Role::kOutput}) {
    core::CudaPlan::Buffer& b = plan.buffers.emplace_back();
    b.role = role;
    b.dtype = "F32";
    b.shape = {512};
    b.bytes = 2048;
  }
  const std::pair<const char*, unsigned> steps[] = {{"k", 96},     {"k", 64}, {"small", 16},
                                                    {"other", 80}, {"k", 32}, {"other", 100}};
  for (const auto& [kernel, kib] : steps) {
    core::CudaPlan::Step& s = plan.steps.emplace_back();
    s.kernel = kernel;
    s.grid[0] = 4;
    s.block[0] = 128;
    s.shared_bytes = kib * 1024;
    s.args = {0, 1};
  }
  std::string error;
  std::unique_ptr<core::CudaModule> m =
      core::CudaModule::Load(kRawCubin, "", std::move(plan), &error, 0);
  ASSERT_NE(m, nullptr) << error;
  EXPECT_EQ(dry.LimitTries(), (std::vector<int>{96 * 1024, 100 * 1024}));
  float in = 0, out = 0;
  void* buffers[2] = {&in, &out};
  EXPECT_TRUE(m->Run(buffers, nullptr, nullptr, &error)) << error;
  EXPECT_EQ(launch_count_(), 6);
  EXPECT_EQ(dry.OverLimitLaunches(), 0);
}

// Launches from many threads, each needing its own amount of shared memory: none finds the
// limit below what it needs (two raising it at once must not leave the lower setting last), and
// the limit is only ever raised.
TEST_F(FakeDriver, RawKernelLaunchesFromManyThreadsFindTheLimitRaised) {
  DryRun dry(driver_);
  std::string error;
  auto f = core::CudaFunction::Load(0, kRawCubin, "raw", &error);
  ASSERT_NE(f, nullptr) << error;
  constexpr int kThreads = 8, kLaunches = 400;
  const unsigned kib[] = {0, 50, 64, 100, 72, 160, 96, 128, 200};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::string e;
      for (int i = 0; i < kLaunches; ++i) {
        const unsigned bytes = kib[(t + i) % std::size(kib)] * 1024;
        if (!f->Launch(kGrid, kBlock, bytes, nullptr, nullptr, &e)) failed.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(dry.OverLimitLaunches(), 0);
  EXPECT_EQ(launch_count_(), kThreads * kLaunches);
  const std::vector<int> tries = dry.LimitTries();
  ASSERT_FALSE(tries.empty());
  EXPECT_TRUE(std::is_sorted(tries.begin(), tries.end()) &&
              std::adjacent_find(tries.begin(), tries.end()) == tries.end())
      << "the limit was set to a value no higher than before";
  EXPECT_EQ(tries.back(), 200 * 1024);
  EXPECT_LE(tries.size(), 8u);  // each of 50, 64, 72, 96, 100, 128, 160, 200 KiB once at most
}

}  // namespace
}  // namespace kiln
