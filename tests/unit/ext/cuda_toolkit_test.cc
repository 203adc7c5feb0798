// Finding nvcc as PyTorch's cpp_extension does, and resolving the symlinks that name its
// toolkit: a fake toolkit in a temporary folder, reached through a chain of links.
#include "server/ext/cuda_toolkit.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/toolchain/subprocess.h"

namespace kiln::ext {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

class CudaToolkitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = toolchain::TempDir::Create("kiln-toolkit-test-");
    ASSERT_TRUE(dir.ok());
    dir_ = std::make_unique<toolchain::TempDir>(std::move(*dir));
    // The canonical temporary path: $TMPDIR may itself be named through a link.
    root_ = fs::canonical(dir_->path()).string();
    real_ = root_ + "/cuda-13.0";
    fs::create_directories(real_ + "/bin");
    fs::create_directories(root_ + "/other/bin");
    for (const std::string& nvcc : {real_ + "/bin/nvcc", root_ + "/other/bin/nvcc"}) {
      std::ofstream(nvcc) << "#!/bin/sh\n";
      chmod(nvcc.c_str(), 0755);
    }
    // cuda -> cuda-link (relative) -> <root>/cuda-13.0 (absolute), as images name toolkits.
    fs::create_symlink(real_, root_ + "/cuda-link");
    fs::create_symlink("cuda-link", root_ + "/cuda");
  }

  CudaToolkit Find(const std::string& flag, std::map<std::string, std::string> env) {
    return FindCudaToolkit(flag, [env = std::move(env)](const char* name) -> const char* {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  }

  std::unique_ptr<toolchain::TempDir> dir_;
  std::string root_, real_;
};

TEST_F(CudaToolkitTest, ResolvesTheChainAndRecordsEachLink) {
  std::vector<std::pair<std::string, std::string>> links;
  EXPECT_EQ(ResolveFollowingLinks(root_ + "/cuda/bin/nvcc", &links), real_ + "/bin/nvcc");
  EXPECT_THAT(links, UnorderedElementsAre(Pair(root_ + "/cuda", "cuda-link"),
                                          Pair(root_ + "/cuda-link", real_)));
  links.clear();
  EXPECT_EQ(ResolveFollowingLinks(root_ + "/cuda/../cuda/./bin/nvcc", &links), real_ + "/bin/nvcc");
  fs::create_symlink("loop", root_ + "/loop");
  EXPECT_EQ(ResolveFollowingLinks(root_ + "/loop/x", &links), "");
  EXPECT_EQ(ResolveFollowingLinks(root_ + "/dangling/x", &links), "");
}

TEST_F(CudaToolkitTest, CudaHomeFirstThenCudaPathThenPathThenUsrLocalCuda) {
  const std::map<std::string, std::string> path_only = {{"PATH", root_ + "/other/bin"}};
  CudaToolkit tk = Find("", {{"CUDA_HOME", root_ + "/cuda"},
                             {"CUDA_PATH", root_ + "/other"},
                             {"PATH", root_ + "/other/bin"}});
  EXPECT_EQ(tk.nvcc, real_ + "/bin/nvcc");
  EXPECT_EQ(tk.root, real_);
  EXPECT_THAT(tk.how, HasSubstr("$CUDA_HOME=" + root_ + "/cuda"));
  // The real root is mounted; the links by which it was named are recreated.
  EXPECT_EQ(tk.mount, real_);
  EXPECT_THAT(tk.links, UnorderedElementsAre(Pair(root_ + "/cuda", "cuda-link"),
                                             Pair(root_ + "/cuda-link", real_)));

  tk = Find("", {{"CUDA_PATH", root_ + "/cuda"}, {"PATH", root_ + "/other/bin"}});
  EXPECT_EQ(tk.nvcc, real_ + "/bin/nvcc");
  EXPECT_THAT(tk.how, HasSubstr("$CUDA_PATH"));

  tk = Find("", path_only);
  EXPECT_EQ(tk.nvcc, root_ + "/other/bin/nvcc");
  EXPECT_THAT(tk.how, HasSubstr("nvcc on $PATH"));
  EXPECT_TRUE(tk.links.empty());

  // A variable that is set decides, as in cpp_extension: nothing there means no nvcc.
  tk = Find("", {{"CUDA_HOME", root_ + "/nowhere"}, {"PATH", root_ + "/other/bin"}});
  EXPECT_EQ(tk.nvcc, "");
  EXPECT_THAT(tk.how, HasSubstr(root_ + "/nowhere/bin/nvcc"));

  // Nothing set, none on PATH: /usr/local/cuda, whatever this host has there.
  tk = Find("", {{"PATH", root_}});
  EXPECT_THAT(tk.how, HasSubstr("/usr/local/cuda/bin/nvcc"));
}

TEST_F(CudaToolkitTest, TheFlagWinsAsAPathOrAName) {
  CudaToolkit tk = Find(root_ + "/cuda/bin/nvcc", {{"CUDA_HOME", root_ + "/other"}});
  EXPECT_EQ(tk.nvcc, real_ + "/bin/nvcc");
  EXPECT_THAT(tk.how, HasSubstr("--nvcc="));
  tk = Find("nvcc", {{"CUDA_HOME", root_ + "/cuda"}, {"PATH", root_ + "/other/bin"}});
  EXPECT_EQ(tk.nvcc, root_ + "/other/bin/nvcc");
  tk = Find("no-such-nvcc", {{"PATH", root_ + "/other/bin"}});
  EXPECT_EQ(tk.nvcc, "");
}

TEST_F(CudaToolkitTest, NothingToMountOrRecreateInsideUsr) {
  // A toolkit under /usr (Debian's nvidia-cuda-toolkit, or /usr/local/cuda-X) is in the
  // sandbox already, links and all.
  if (!fs::exists("/usr/bin/true")) GTEST_SKIP() << "no /usr/bin/true";
  CudaToolkit tk = Find("/usr/bin/true", {});
  EXPECT_EQ(tk.mount, "");
  EXPECT_TRUE(tk.links.empty());
}

}  // namespace
}  // namespace kiln::ext
