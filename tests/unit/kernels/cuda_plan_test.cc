// The CUDA launch plan between its two ends: kilnc writes plan.json, the CUDA loader reads it
// (client/cpp/cuda_plan.h); and the loader without a driver fails with a clear error.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>

#include "client/cpp/cuda_loader.h"
#include "google/protobuf/text_format.h"
#include "kernels/ir/decode.h"
#include "tests/unit/kernels/cuda_test_util.h"

namespace kiln {
namespace {

using client::CudaPlan;

TEST(CudaPlanJson, KilncWritesWhatTheLoaderReads) {
  REQUIRE_NVRTC();
  const char* bin = std::getenv("KILN_BINARY_DIR");
  if (!bin) GTEST_SKIP() << "KILN_BINARY_DIR not set";
  auto dir = toolchain::TempDir::Create("kiln-plan-");
  ASSERT_TRUE(dir.ok());
  // A whole-tensor variance: two partial launches with temps, then the final one.
  std::string graph =
      "inputs { name: \"x\" type { dtype: F32 shape: 300 shape: 1000 } }\n"
      "nodes { op: \"var\" inputs: 0 }\n"
      "nodes { op: \"softmax\" inputs: 0 }\n"
      "outputs: 1 outputs: 2\n";
  ASSERT_TRUE(toolchain::WriteFile(dir->path() + "/g.txtpb", graph).ok());
  toolchain::SandboxLimits limits;
  auto r = toolchain::RunSandboxed({std::string(bin) + "/kernels/kilnc", "g.txtpb", "--target", "cuda:sm_90", "--out",
                                    "out"},
                                   dir->path(), limits);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->exit_code, 0) << r->output;
  for (const char* f : {"kernel.cubin", "kernel.ptx", "kernel.cu", "report.txt", "plan.json"})
    EXPECT_TRUE(std::filesystem::exists(dir->path() + "/out/" + f)) << f;

  CudaPlan plan;
  std::string error;
  ASSERT_TRUE(client::ParseCudaPlan(testing::SlurpFile(dir->path() + "/out/plan.json"), &plan, &error)) << error;

  auto gen = testing::SharedPipeline().Generate(testing::Verified([&] {
    v1::Graph wire;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(graph, &wire));
    return *ir::DecodeGraph(wire);
  }()), testing::CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(gen.ok()) << gen.status();
  const LaunchPlan& want = gen->plan;
  EXPECT_EQ(plan.abi_version, want.abi_version);
  EXPECT_EQ(plan.workspace_bytes, want.workspace_bytes);
  EXPECT_EQ(plan.num_inputs(), 1);
  EXPECT_EQ(plan.num_outputs(), 2);
  ASSERT_EQ(plan.buffers.size(), want.buffers.size());
  for (size_t i = 0; i < want.buffers.size(); ++i) {
    EXPECT_EQ(plan.buffers[i].bytes, want.buffers[i].bytes);
    EXPECT_EQ(plan.buffers[i].offset, want.buffers[i].offset);
    EXPECT_EQ(plan.buffers[i].shape, want.buffers[i].shape);
    EXPECT_EQ(plan.buffers[i].dtype, ir::DTypeName(want.buffers[i].dtype));
  }
  ASSERT_EQ(plan.steps.size(), want.steps.size());
  ASSERT_GE(plan.steps.size(), 3u);
  for (size_t i = 0; i < want.steps.size(); ++i) {
    EXPECT_EQ(plan.steps[i].kernel, want.steps[i].kernel);
    EXPECT_EQ(plan.steps[i].grid[0], want.steps[i].grid[0]);
    EXPECT_EQ(plan.steps[i].block[0], want.steps[i].block[0]);
    EXPECT_EQ(plan.steps[i].args, std::vector<int>(want.steps[i].args.begin(), want.steps[i].args.end()));
  }
}

TEST(CudaPlanJson, RejectsBadPlans) {
  CudaPlan plan;
  std::string error;
  EXPECT_FALSE(client::ParseCudaPlan("{", &plan, &error));
  EXPECT_NE(error.find("malformed"), std::string::npos) << error;
  EXPECT_FALSE(client::ParseCudaPlan("{\"abi_version\": 1, \"buffers\": [], \"steps\": []}", &plan, &error));
  EXPECT_NE(error.find("workspace_bytes"), std::string::npos) << error;
  EXPECT_FALSE(client::ParseCudaPlan(
      "{\"abi_version\": 1, \"workspace_bytes\": 0, \"buffers\": [], \"steps\": [{\"kernel\": \"k0\", \"grid\": [1,1,1], "
      "\"block\": [32,1,1], \"shared_bytes\": 0, \"args\": [0]}]}",
      &plan, &error));
  EXPECT_NE(error.find("out of range"), std::string::npos) << error;
}

TEST(CudaLoader, WithoutADriverLoadFailsCleanly) {
  if (void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(lib);
    GTEST_SKIP() << "a CUDA driver is installed here";
  }
  CudaPlan plan;
  plan.abi_version = 1;
  std::string error;
  EXPECT_EQ(client::CudaModule::Load("not a cubin", "", plan, &error), nullptr);
  EXPECT_NE(error.find("libcuda.so.1"), std::string::npos) << error;
  EXPECT_EQ(kiln_cuda_load_dir("/nonexistent"), nullptr);
  EXPECT_NE(std::string(kiln_cuda_last_error()).find("plan.json"), std::string::npos) << kiln_cuda_last_error();
}

}  // namespace
}  // namespace kiln
