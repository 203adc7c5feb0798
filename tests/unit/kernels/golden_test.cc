// Golden tests: for each tests/golden/<backend>/<case>/graph.txtpb, the generated source and
// the fusion report must match the files beside it byte for byte, so a refactor that should
// not change output shows that it does not. KILN_UPDATE_GOLDEN=1 rewrites the files.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "google/protobuf/text_format.h"
#include "kernels/ir/decode.h"
#include "tests/unit/kernels/test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void CheckOrUpdate(const fs::path& p, const std::string& actual) {
  if (std::getenv("KILN_UPDATE_GOLDEN")) {
    std::ofstream(p, std::ios::binary) << actual;
    return;
  }
  ASSERT_TRUE(fs::exists(p)) << p << " missing; run with KILN_UPDATE_GOLDEN=1";
  EXPECT_EQ(Slurp(p), actual) << "generated output differs from " << p;
}

void RunBackend(const std::string& backend, const std::string& target_text,
                const std::string& source_name) {
  const char* src = std::getenv("KILN_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  fs::path root = fs::path(src) / "tests/golden" / backend;
  if (!fs::exists(root)) GTEST_SKIP() << "no golden cases for " << backend;
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    fs::path graph_file = entry.path() / "graph.txtpb";
    if (!fs::exists(graph_file)) continue;
    SCOPED_TRACE(entry.path().string());
    v1::Graph wire;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(Slurp(graph_file), &wire));
    auto g = ir::DecodeGraph(wire);
    ASSERT_TRUE(g.ok()) << g.status();
    v1::Target wt;
    if (backend == "cuda")
      wt.mutable_cuda()->set_sm(std::stoi(target_text));
    else
      wt.mutable_cpu()->set_isa(target_text);
    auto t = ir::DecodeTarget(wt);
    ASSERT_TRUE(t.ok());
    auto gen = testing::SharedPipeline().Generate(*g, *t, CompileOptions{});
    if (backend == "cuda" && !gen.ok() &&
        gen.status().code() == absl::StatusCode::kFailedPrecondition)
      GTEST_SKIP() << gen.status();
    ASSERT_TRUE(gen.ok()) << gen.status();
    CheckOrUpdate(entry.path() / source_name, gen->source);
    CheckOrUpdate(entry.path() / "report.txt", gen->fusion_report);
    ++cases;
  }
  EXPECT_GT(cases, 0);
}

TEST(Golden, Cpu) { RunBackend("cpu", "x86-64-v3", "kernel.cc"); }

}  // namespace
}  // namespace kiln
