// Replays every checked-in fuzz input (tests/fuzz/regressions/: inputs a fuzz run once found,
// and hand-made hard cases) through the frontend contract in the normal build, so a fixed
// finding stays fixed without clang or libFuzzer.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/fuzz/frontend_check.h"

namespace kiln::fuzz {
namespace {

std::vector<std::filesystem::path> Inputs() {
  const char* src = std::getenv("KILN_SOURCE_DIR");
  std::filesystem::path dir = std::filesystem::path(src ? src : ".") / "tests/fuzz/regressions";
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(FuzzRegressionTest, EveryCheckedInInputKeepsTheContract) {
  auto checker = FrontendChecker::Create();
  EXPECT_TRUE(checker->ReportCudaCoverage("fuzz regression test"))
      << "KILN_REQUIRE_NVRTC=1, but the CUDA target cannot be checked: " << checker->cuda_status();
  std::vector<std::filesystem::path> files = Inputs();
  ASSERT_GE(files.size(), 5u) << "regression inputs missing";
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    absl::Status s = checker->CheckFrontendInput(bytes.str());
    EXPECT_TRUE(s.ok()) << f.filename() << ": " << s;
  }
}

}  // namespace
}  // namespace kiln::fuzz
