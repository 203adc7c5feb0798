// Golden files for the CUDA backend: for each tests/golden/cuda/<case>/graph.txtpb, the
// generated source (kernel.cu) and the fusion report (report.txt, with each launch's
// strategy) for sm_90 must match byte for byte. KILN_UPDATE_GOLDEN=1 rewrites them.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "google/protobuf/text_format.h"
#include "kernels/ir/decode.h"
#include "tests/unit/kernels/cuda_test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

void CheckOrUpdate(const fs::path& p, const std::string& actual) {
  if (std::getenv("KILN_UPDATE_GOLDEN")) {
    std::ofstream(p, std::ios::binary) << actual;
    return;
  }
  ASSERT_TRUE(fs::exists(p)) << p << " missing; run with KILN_UPDATE_GOLDEN=1";
  EXPECT_EQ(testing::SlurpFile(p.string()), actual) << "generated output differs from " << p;
}

TEST(CudaGolden, Sm90) {
  const char* src = std::getenv("KILN_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  fs::path root = fs::path(src) / "tests/golden/cuda";
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    fs::path graph_file = entry.path() / "graph.txtpb";
    if (!fs::exists(graph_file)) continue;
    SCOPED_TRACE(entry.path().string());
    v1::Graph wire;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
        testing::SlurpFile(graph_file.string()), &wire));
    auto g = ir::DecodeGraph(wire);
    ASSERT_TRUE(g.ok()) << g.status();
    auto gen = testing::SharedPipeline().Generate(*g, testing::CudaTarget(90), CompileOptions{});
    if (!gen.ok() && gen.status().code() == absl::StatusCode::kFailedPrecondition)
      GTEST_SKIP() << gen.status();
    ASSERT_TRUE(gen.ok()) << gen.status();
    CheckOrUpdate(entry.path() / "kernel.cu", gen->source);
    CheckOrUpdate(entry.path() / "report.txt", gen->fusion_report);
    ++cases;
  }
  EXPECT_GT(cases, 0);
}

}  // namespace
}  // namespace kiln
