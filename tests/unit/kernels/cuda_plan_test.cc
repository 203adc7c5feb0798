// The CUDA launch plan between its two ends: kilnc writes plan.json, the CUDA loader reads it
// (client/core/cuda_plan.h); and the loader without a driver fails with a clear error.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>

#include "client/core/cuda_loader.h"
#include "google/protobuf/text_format.h"
#include "kernels/ir/decode.h"
#include "tests/unit/kernels/cuda_test_util.h"

namespace kiln {
namespace {

using core::CudaPlan;

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
  auto r = toolchain::RunSandboxed(
      {std::string(bin) + "/kernels/kilnc", "g.txtpb", "--target", "cuda:sm_90", "--out", "out"},
      dir->path(), limits);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->exit_code, 0) << r->output;
  for (const char* f : {"kernel.cubin", "kernel.ptx", "kernel.cu", "report.txt", "plan.json"})
    EXPECT_TRUE(std::filesystem::exists(dir->path() + "/out/" + f)) << f;

  CudaPlan plan;
  std::string error;
  ASSERT_TRUE(
      core::ParseCudaPlan(testing::SlurpFile(dir->path() + "/out/plan.json"), &plan, &error))
      << error;

  auto gen = testing::SharedPipeline().Generate(
      testing::Verified([&] {
        v1::Graph wire;
        EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(graph, &wire));
        return *ir::DecodeGraph(wire);
      }()),
      testing::CudaTarget(90), CompileOptions{});
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
    EXPECT_EQ(plan.steps[i].args,
              std::vector<int>(want.steps[i].args.begin(), want.steps[i].args.end()));
  }
}

TEST(CudaPlanJson, RejectsBadPlans) {
  CudaPlan plan;
  std::string error;
  EXPECT_FALSE(core::ParseCudaPlan("{", &plan, &error));
  EXPECT_NE(error.find("malformed"), std::string::npos) << error;
  EXPECT_FALSE(
      core::ParseCudaPlan("{\"abi_version\": 1, \"buffers\": [], \"steps\": []}", &plan, &error));
  EXPECT_NE(error.find("workspace_bytes"), std::string::npos) << error;
  EXPECT_FALSE(
      core::ParseCudaPlan("{\"abi_version\": 1, \"workspace_bytes\": 0, \"buffers\": [], "
                          "\"steps\": [{\"kernel\": \"k0\", \"grid\": [1,1,1], "
                          "\"block\": [32,1,1], \"shared_bytes\": 0, \"args\": [0]}]}",
                          &plan, &error));
  EXPECT_NE(error.find("out of range"), std::string::npos) << error;
}

// Size expressions as plan.json writes them (kernels/codegen/symbolic.cc, SizeExprToString):
// terms joined by " + ", factors by '*', coefficients possibly negative, a symbol repeated for
// a power; anything else is refused with the expression in the message.
TEST(CudaPlanJson, SizeExpressions) {
  const std::vector<std::string> names = {"R", "C"};
  const int64_t at[] = {7, 130};
  auto eval = [&](const std::string& text) {
    core::CudaSizeExpr e;
    std::string error;
    EXPECT_TRUE(core::ParseCudaSizeExpr(text, names, &e, &error)) << text << ": " << error;
    return e.Eval(at);
  };
  EXPECT_EQ(eval("0"), 0);
  EXPECT_EQ(eval("5"), 5);
  EXPECT_EQ(eval("R"), 7);
  EXPECT_EQ(eval("4*R*C + 1"), 4 * 7 * 130 + 1);
  EXPECT_EQ(eval("R*R + -3*C"), 49 - 390);
  EXPECT_EQ(eval("C + R + 256"), 393);
  core::CudaSizeExpr e;
  std::string error;
  EXPECT_FALSE(core::ParseCudaSizeExpr("4*T", names, &e, &error));
  EXPECT_NE(error.find("unknown symbol 'T'"), std::string::npos) << error;
  EXPECT_FALSE(core::ParseCudaSizeExpr("R +  + C", names, &e, &error));
  EXPECT_FALSE(core::ParseCudaSizeExpr("2x*R", names, &e, &error));
  EXPECT_NE(error.find("2x*R"), std::string::npos) << error;
  const int64_t huge[] = {int64_t{1} << 40, int64_t{1} << 40};
  ASSERT_TRUE(core::ParseCudaSizeExpr("R*C", names, &e, &error));
  EXPECT_EQ(e.Eval(huge), INT64_MAX);  // overflow saturates, so bound checks refuse it
  // A symbolic plan needs every symbol to name an input axis, and positive grid_per_block.
  CudaPlan plan;
  EXPECT_FALSE(
      core::ParseCudaPlan("{\"abi_version\": 2, \"workspace_bytes\": 0, \"buffers\": [{\"role\": "
                          "\"input\", \"index\": 0, "
                          "\"dtype\": \"f32\", \"shape\": [-1], \"bytes\": -1, \"offset\": 0, "
                          "\"shape_exprs\": [\"N\"], "
                          "\"bytes_expr\": \"4*N\"}], \"symbols\": [{\"name\": \"N\", \"input\": "
                          "3, \"axis\": 0}], \"steps\": []}",
                          &plan, &error));
  EXPECT_NE(error.find("names no input"), std::string::npos) << error;
  EXPECT_FALSE(core::ParseCudaPlan(
      "{\"abi_version\": 2, \"workspace_bytes\": 0, \"buffers\": [{\"role\": \"input\", \"index\": "
      "0, "
      "\"dtype\": \"f32\", \"shape\": [-1], \"bytes\": -1, \"offset\": 0, \"shape_exprs\": "
      "[\"N\"], "
      "\"bytes_expr\": \"4*N\"}], \"symbols\": [{\"name\": \"N\", \"input\": 0, \"axis\": 0}], "
      "\"steps\": [{\"kernel\": \"k0\", \"grid\": [0,1,1], \"block\": [256,1,1], \"shared_bytes\": "
      "0, "
      "\"args\": [0], \"grid_work\": \"N\", \"grid_per_block\": 0}]}",
      &plan, &error));
  EXPECT_NE(error.find("grid_per_block"), std::string::npos) << error;
}

// Launch-time choices: guarded steps run where guard_min <= guard <= guard_max (0: unbounded).
TEST(CudaPlanJson, GuardedSteps) {
  auto json = [](const std::string& guards) {
    return "{\"abi_version\": 2, \"workspace_bytes\": 0, \"buffers\": [{\"role\": \"input\", "
           "\"index\": 0, "
           "\"dtype\": \"f32\", \"shape\": [-1, -1], \"bytes\": -1, \"offset\": 0, "
           "\"shape_exprs\": [\"R\", \"L\"], "
           "\"bytes_expr\": \"4*R*L\"}], \"symbols\": [{\"name\": \"R\", \"input\": 0, \"axis\": "
           "0}, "
           "{\"name\": \"L\", \"input\": 0, \"axis\": 1}], \"steps\": [{\"kernel\": \"a\", "
           "\"grid\": [0,1,1], "
           "\"block\": [128,1,1], \"shared_bytes\": 0, \"args\": [0], \"grid_work\": \"R\", "
           "\"grid_per_block\": 8" +
           guards + "}]}";
  };
  CudaPlan plan;
  std::string error;
  ASSERT_TRUE(core::ParseCudaPlan(
      json(", \"guard\": \"L\", \"guard_min\": 129, \"guard_max\": 512"), &plan, &error))
      << error;
  ASSERT_EQ(plan.steps.size(), 1u);
  const CudaPlan::Step& s = plan.steps[0];
  EXPECT_TRUE(s.guarded());
  for (auto [L, runs] : {std::pair{128, false}, {129, true}, {512, true}, {513, false}}) {
    const int64_t sizes[] = {3, L};
    EXPECT_EQ(s.Runs(sizes), runs) << L;
  }
  ASSERT_TRUE(core::ParseCudaPlan(
      json(", \"guard\": \"2*L\", \"guard_min\": 100, \"guard_max\": 0"), &plan, &error));
  const int64_t long_rows[] = {1, 1 << 20}, short_rows[] = {1, 49};
  EXPECT_TRUE(plan.steps[0].Runs(long_rows));
  EXPECT_FALSE(plan.steps[0].Runs(short_rows));
  ASSERT_TRUE(core::ParseCudaPlan(json(""), &plan, &error));
  EXPECT_TRUE(plan.steps[0].Runs(short_rows));  // no guard: always
  EXPECT_FALSE(core::ParseCudaPlan(
      json(", \"guard\": \"L\", \"guard_min\": 600, \"guard_max\": 512"), &plan, &error));
  EXPECT_NE(error.find("guard range 600..512"), std::string::npos) << error;
}

TEST(CudaLoader, WithoutADriverLoadFailsCleanly) {
  if (void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(lib);
    GTEST_SKIP() << "a CUDA driver is installed here";
  }
  CudaPlan plan;
  plan.abi_version = 1;
  std::string error;
  EXPECT_EQ(core::CudaModule::Load("not a cubin", "", plan, &error), nullptr);
  EXPECT_NE(error.find("libcuda.so.1"), std::string::npos) << error;
  EXPECT_EQ(core::CudaModule::LoadDir("/nonexistent", &error), nullptr);
  EXPECT_NE(error.find("plan.json"), std::string::npos) << error;
}

}  // namespace
}  // namespace kiln
