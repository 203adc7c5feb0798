// CUDA backend tests that need no GPU:
//  - every op of kernels/ir/OPS.md, in several dtypes, compiles through NVRTC into a cubin
//    (and PTX) for sm_80 and sm_90;
//  - fusion: the reference workloads are one launch each;
//  - the generated kernels, built as host C++ against a model of the CUDA built-ins
//    (cuda_emulation.h), compute what the CPU backend computes, for every strategy
//    (pointwise, row, per-output, column tile, whole-tensor partials) and every op;
//  - golden files pin the generated source for a few graphs (tests/golden/cuda/).
#include <filesystem>
#include <functional>

#include "google/protobuf/text_format.h"
#include "kernels/ir/decode.h"
#include "tests/unit/kernels/cuda_test_util.h"

namespace kiln {
namespace {

using ir::DType;
using ir::ValueId;
using namespace kiln::testing;  // NOLINT: test helpers

// ---- NVRTC: every op compiles for sm_80 and sm_90.

TEST(CudaNvrtc, EveryOpCompilesForSm80AndSm90) {
  REQUIRE_NVRTC();
  std::vector<std::pair<std::string, ir::Graph>> graphs;
  for (DType t : kAllTypes) {
    graphs.push_back({absl::StrCat("unary ", ir::DTypeName(t)), AllElementwise(t, {4, 64}, false)});
    graphs.push_back({absl::StrCat("binary ", ir::DTypeName(t)), AllElementwise(t, {4, 64}, true)});
    graphs.push_back({absl::StrCat("reduce ", ir::DTypeName(t)), AllReductions(t, {16, 100})});
  }
  for (int sm : {80, 90}) {
    for (const auto& [name, g] : graphs) {
      SCOPED_TRACE(absl::StrCat(name, " sm_", sm));
      auto r = testing::SharedPipeline().Compile(g, CudaTarget(sm), CompileOptions{});
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_GE(r->artifacts.size(), 4u);
      EXPECT_EQ(r->artifacts[0].kind, ArtifactKind::kCubin);
      EXPECT_EQ(r->artifacts[0].bytes.substr(0, 4),
                "\x7f"
                "ELF");
      EXPECT_EQ(r->artifacts[1].kind, ArtifactKind::kPtx);
      EXPECT_NE(r->artifacts[1].bytes.find(absl::StrCat(".target sm_", sm)), std::string::npos);
      EXPECT_EQ(r->artifacts[2].kind, ArtifactKind::kSource);
      EXPECT_EQ(r->artifacts[3].kind, ArtifactKind::kFusionReport);
      EXPECT_EQ(r->plan.abi_version, codegen::kCudaAbiVersion);
      for (const PlanStep& s : r->plan.steps) {
        EXPECT_GT(s.grid[0], 0u);
        EXPECT_GT(s.block[0], 0u);
        EXPECT_LE(s.block[0], 1024u);
      }
    }
  }
}

// Reduced outer products build for both architectures: factored (row sums of 64, 8 threads
// per row) and, without the rewrite or with a function of the product in between, rows bound
// by arithmetic (128 threads per row, 32 products each).
TEST(CudaNvrtc, OuterProductSumsCompileForSm80AndSm90) {
  REQUIRE_NVRTC();
  CompileOptions off;
  off.algebraic_rewrites = false;
  const struct {
    ir::Graph g;
    CompileOptions options;
    const char* strategy;
  } cases[] = {
      {OuterProductSum(1024, 64, nullptr, DType::kF32), CompileOptions{},
       "8 thread(s) per row, 16 row(s) per block"},
      {OuterProductSum(1024, 64, nullptr, DType::kF32), off,
       "128 thread(s) per row, 1 row(s) per block"},
      {OuterProductSum(1024, 64, "exp", DType::kF32), CompileOptions{},
       "128 thread(s) per row, 1 row(s) per block"},
  };
  for (int sm : {80, 90})
    for (const auto& c : cases) {
      auto r = testing::SharedPipeline().Compile(c.g, CudaTarget(sm), c.options);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->artifacts[0].bytes.substr(0, 4),
                "\x7f"
                "ELF");
      EXPECT_NE(r->artifacts[3].bytes.find(c.strategy), std::string::npos) << r->artifacts[3].bytes;
    }
}

// Tuning variants (CompileOptions.variant) build, and change what their knobs say: the
// pointwise block and the threads per row of a row kernel; past the table's end: the default.
TEST(CudaNvrtc, VariantsBuildAndApplyTheirKnobs) {
  REQUIRE_NVRTC();
  ir::Graph g = Make({Ty(DType::kF32, {1000, 300}), Ty(DType::kF32, {4096})}, [](ir::Builder& b) {
    return std::vector<ValueId>{*b.Add("softmax", {0}, {{"axis", int64_t{-1}}}),
                                *b.Add("exp", {1})};
  });
  auto report = [&](int variant) {
    CompileOptions o;
    o.variant = variant;
    auto r = testing::SharedPipeline().Compile(g, CudaTarget(90), o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->artifacts[3].bytes : "";
  };
  const std::string dflt = report(0);
  EXPECT_NE(dflt.find("64 thread(s) per row"), std::string::npos) << dflt;
  EXPECT_NE(dflt.find("block 256"), std::string::npos) << dflt;
  EXPECT_NE(report(1).find("block 128"), std::string::npos);
  EXPECT_NE(report(2).find("block 512"), std::string::npos);
  EXPECT_NE(report(3).find("32 thread(s) per row"), std::string::npos);
  EXPECT_NE(report(4).find("128 thread(s) per row"), std::string::npos);
  EXPECT_NE(report(5).find("512 thread(s) per row"), std::string::npos);
  EXPECT_NE(report(6).find("1024 thread(s) per row"), std::string::npos);  // clamped to a block
  EXPECT_EQ(report(99), dflt);
}

TEST(CudaNvrtc, FingerprintNamesNvrtcAndOptions) {
  REQUIRE_NVRTC();
  std::string f = testing::SharedPipeline().Fingerprint(CudaTarget(90));
  EXPECT_NE(f.find("nvrtc"), std::string::npos) << f;
  EXPECT_NE(f.find("--gpu-architecture=sm_90"), std::string::npos) << f;
  EXPECT_NE(f, testing::SharedPipeline().Fingerprint(CudaTarget(80)));
}

TEST(CudaNvrtc, OldArchitectureIsFailedPrecondition) {
  REQUIRE_NVRTC();
  absl::Status st = testing::SharedPipeline().CheckTarget(CudaTarget(50));
  if (st.ok()) GTEST_SKIP() << "this NVRTC still builds for sm_50";
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
}

// ---- Fusion: one launch each.

int Launches(const ir::Graph& g) {
  auto gen = testing::SharedPipeline().Generate(g, CudaTarget(90), CompileOptions{});
  EXPECT_TRUE(gen.ok()) << gen.status();
  return gen.ok() ? static_cast<int>(gen->plan.steps.size()) : -1;
}

TEST(CudaFusion, ReferenceWorkloadsAreOneLaunch) {
  EXPECT_EQ(Launches(SinCos(1 << 20)), 1);
  EXPECT_EQ(Launches(Softmax(32768, 4096)), 1);
  EXPECT_EQ(Launches(LayerNormGelu(32768, 4096)), 1);
  EXPECT_EQ(Launches(KMeans(20'000'000, 8, DType::kF32)), 1);
}

TEST(CudaFusion, ReportNamesStrategies) {
  auto gen =
      testing::SharedPipeline().Generate(Softmax(32768, 4096), CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(gen.ok()) << gen.status();
  EXPECT_NE(gen->fusion_report.find("cuda k0: row"), std::string::npos) << gen->fusion_report;
  EXPECT_NE(gen->fusion_report.find("registers hold in0"), std::string::npos) << gen->fusion_report;
  EXPECT_NE(gen->source.find("kiln_vload<4>"), std::string::npos);
  // Memory-bound pointwise kernels use 16-byte accesses.
  auto add = testing::SharedPipeline().Generate(
      Make({Ty(DType::kF32, {1 << 20}), Ty(DType::kF32, {1 << 20})},
           [](ir::Builder& b) {
             return std::vector<ValueId>{*b.Add("add", {0, 1})};
           }),
      CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(add.ok());
  EXPECT_NE(add->source.find("kiln_vstore<4>"), std::string::npos) << add->source;
}

// sin and cos of one value come from one kiln_sincos call (one argument reduction); a lone
// sin is a kiln_sincos whose cosine is dead.
TEST(CudaFusion, SinAndCosOfOneValueShareOneCall) {
  auto gen = testing::SharedPipeline().Generate(SinCos(1 << 20), CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(gen.ok()) << gen.status();
  size_t calls = 0;
  for (size_t at = gen->source.find("kiln_sincos("); at != std::string::npos;
       at = gen->source.find("kiln_sincos(", at + 1))
    ++calls;
  EXPECT_EQ(calls, 4u) << gen->source;  // one per lane of a 4-wide vector
  EXPECT_EQ(gen->source.find("kiln_sin("), std::string::npos) << gen->source;
  EXPECT_EQ(gen->source.find("kiln_cos("), std::string::npos) << gen->source;
}

TEST(CudaFusion, WholeTensorReductionIsTwoStages) {
  auto g = Make({Ty(DType::kF32, {1 << 22})},
                [](ir::Builder& b) { return std::vector<ValueId>{*b.Add("sum", {0})}; });
  auto gen = testing::SharedPipeline().Generate(g, CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(gen.ok()) << gen.status();
  ASSERT_EQ(gen->plan.steps.size(), 2u) << gen->fusion_report;
  EXPECT_EQ(gen->plan.steps[0].kernel, "k0_p0");
  EXPECT_GT(gen->plan.workspace_bytes, 0);
  EXPECT_EQ(gen->source.find("atomic"), std::string::npos);
}

}  // namespace
}  // namespace kiln
