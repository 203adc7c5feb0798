// ExtensionBuilder end to end with stand-in compilers (shell scripts in the sandbox): sources
// compile at once, failures read as in source order, .cu files go to the nvcc found through a
// chain of links, run by its real path with the request's -gencode flags, and the build key
// tells architecture variants apart. Skips where the sandbox cannot run (fails there under
// $KILN_REQUIRE_SANDBOX=1, as sandbox_test does).
#include "server/ext/ext.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/key/digest.h"

namespace kiln::ext {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class MapStore : public store::ArtifactStore {
 public:
  absl::Status PutResult(const std::string& key, const v1::ActionResult& result,
                         const std::vector<std::string>& blobs) override {
    absl::MutexLock lock(&mu_);
    results_[key] = result;
    for (const std::string& b : blobs) blobs_[key::Sha256Hex(b)] = b;
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<v1::ActionResult>> GetResult(const std::string& key) override {
    absl::MutexLock lock(&mu_);
    auto it = results_.find(key);
    if (it == results_.end()) return std::nullopt;
    return it->second;
  }
  absl::StatusOr<std::optional<std::string>> GetBlob(const std::string& digest) override {
    absl::MutexLock lock(&mu_);
    auto it = blobs_.find(digest);
    if (it == blobs_.end()) return std::nullopt;
    return it->second;
  }
  store::StoreStats Stats() const override { return {}; }

 private:
  absl::Mutex mu_;
  std::map<std::string, v1::ActionResult> results_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> blobs_ ABSL_GUARDED_BY(mu_);
};

// A host compiler: makes the file -o names; a source named wait* waits (10 s at most) until
// three such compiles of the build have started, a source named bad* fails.
constexpr char kFakeCc[] = R"sh(#!/bin/sh
case "$1" in -dumpfullversion) echo 12.0; exit 0;; -dumpmachine) echo x86_64-test; exit 0;; esac
out=; prev=; src=
for a in "$@"; do [ "$prev" = -o ] && out=$a; case "$a" in /src/*) src=$a;; esac; prev=$a; done
case "$src" in */wait*)
  : > "$out.started"; n=0
  while [ "$(ls /out | grep -c 'started$')" -lt 3 ]; do
    n=$((n+1)); [ $n -gt 200 ] && { echo "$src ran alone"; exit 1; }; sleep 0.05
  done;;
esac
case "$src" in */bad*) echo "$src:1: error: bad source"; exit 1;; esac
: > "$out"
)sh";

// nvcc: prints how it was run and whether the toolkit's header is there by the linked name.
constexpr char kFakeNvcc[] = R"sh(#!/bin/sh
[ "$1" = --version ] && { echo "nvcc test 9.9"; exit 0; }
echo "nvcc: $0 $*"
[ -f LINKED/include/probe.h ] && echo "header through the link: yes"
out=; prev=
for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done
: > "$out"
)sh";

class ExtensionBuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SandboxOptions probe;
    if (absl::Status s = ProbeSandbox(probe); !s.ok()) {
      const char* required = std::getenv("KILN_REQUIRE_SANDBOX");
      if (required != nullptr && std::string(required) == "1")
        GTEST_FAIL() << "KILN_REQUIRE_SANDBOX=1, but the sandbox cannot run: " << s.message();
      GTEST_SKIP() << s.message();
    }
    auto dir = toolchain::TempDir::Create("kiln-ext-test-");
    ASSERT_TRUE(dir.ok());
    dir_ = std::make_unique<toolchain::TempDir>(std::move(*dir));
    root_ = fs::canonical(dir_->path()).string();
    chmod(root_.c_str(), 0755);  // the sandbox's identity mounts the tools from here
    fs::create_directories(root_ + "/tools");
    fs::create_directories(root_ + "/cuda-9.9/bin");
    fs::create_directories(root_ + "/cuda-9.9/include");
    std::ofstream(root_ + "/cuda-9.9/include/probe.h") << "\n";
    fs::create_symlink(root_ + "/cuda-9.9", root_ + "/cuda-link");
    fs::create_symlink("cuda-link", root_ + "/cuda");
    std::string nvcc = kFakeNvcc;
    nvcc.replace(nvcc.find("LINKED"), 6, root_ + "/cuda");
    Script(root_ + "/tools/cc", kFakeCc);
    Script(root_ + "/cuda-9.9/bin/nvcc", nvcc);
  }

  void Script(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
    chmod(path.c_str(), 0755);
  }

  std::unique_ptr<ExtensionBuilder> Builder(int jobs) {
    ExtOptions o;
    o.dir = root_ + "/inputs";
    o.cxx = root_ + "/tools/cc";
    o.nvcc = root_ + "/cuda/bin/nvcc";
    o.jobs = jobs;
    o.sandbox.limits.timeout_s = 60;
    o.sandbox.toolchain_dirs = {root_ + "/tools"};
    auto b = ExtensionBuilder::Create(o, &store_);
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_EQ((*b)->unavailable(), "");
    return b.ok() ? *std::move(b) : nullptr;
  }

  // A request compiling `sources` (uploaded to `b` unless `upload` is false).
  v1::BuildExtensionRequest Request(ExtensionBuilder* b, const std::vector<std::string>& sources,
                                    bool upload = true) {
    v1::InputTree tree;
    v1::UploadBlobsRequest blobs;
    v1::BuildExtensionRequest r;
    r.set_name("m");
    std::vector<std::string> sorted = sources;  // a tree lists its files by path
    std::sort(sorted.begin(), sorted.end());
    for (const std::string& s : sorted) {
      const std::string text = absl::StrCat("// ", s, "\n");
      v1::InputFile* f = tree.add_files();
      f->set_path(s);
      f->set_digest(key::Sha256Hex(text));
      f->set_size(static_cast<int64_t>(text.size()));
      blobs.add_blobs(text);
    }
    for (const std::string& s : sources) r.add_compile(s);
    std::string manifest;
    tree.SerializeToString(&manifest);
    blobs.add_blobs(manifest);
    r.set_source_tree(key::Sha256Hex(manifest));
    r.set_python_tag("cpython-311-x86_64-linux-gnu");
    if (upload) {
      EXPECT_TRUE(b->Upload(blobs).ok());
    }
    return r;
  }

  // The answer to `r`; one naming missing inputs fails the test unless `missing_ok`.
  std::pair<absl::Status, v1::BuildExtensionResponse> Build(ExtensionBuilder* b,
                                                            const v1::BuildExtensionRequest& r,
                                                            bool missing_ok = false) {
    absl::Notification done;
    std::pair<absl::Status, v1::BuildExtensionResponse> out;
    b->Build(r, [&](absl::Status s, v1::BuildExtensionResponse response) {
      out = {s, std::move(response)};
      done.Notify();
    });
    done.WaitForNotification();
    if (!missing_ok) {
      EXPECT_EQ(out.second.missing_size(), 0) << "inputs not uploaded";
    }
    return out;
  }

  std::unique_ptr<toolchain::TempDir> dir_;
  std::string root_;
  MapStore store_;
};

TEST_F(ExtensionBuilderTest, CompilesTheSourcesOfOneBuildAtOnce) {
  auto b = Builder(3);
  ASSERT_NE(b, nullptr);
  auto [s, response] = Build(b.get(), Request(b.get(), {"wait0.cpp", "wait1.cpp", "wait2.cpp"}));
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(response.result().artifacts_size(), 1);
}

TEST_F(ExtensionBuilderTest, ReportsTheFirstFailingSourceInOrder) {
  auto b = Builder(3);
  ASSERT_NE(b, nullptr);
  auto [s, response] = Build(b.get(), Request(b.get(), {"ok.cpp", "bad1.cpp", "bad2.cpp"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("/src/bad1.cpp:1: error"));
  EXPECT_THAT(s.message(), Not(HasSubstr("bad2")));
}

TEST_F(ExtensionBuilderTest, CudaSourcesGoToTheRealNvccWithEachTarget) {
  auto b = Builder(4);
  ASSERT_NE(b, nullptr);
  v1::BuildExtensionRequest r = Request(b.get(), {"k.cu", "host.cpp"});
  r.add_cuda_archs(80);
  v1::CudaArch* a = r.add_cuda_arch_list();
  a->set_sm(90);
  a->set_arch_specific(true);
  a->set_ptx(true);
  auto [s, response] = Build(b.get(), r);
  ASSERT_TRUE(s.ok()) << s;
  const std::string& log = response.result().compile_log();
  EXPECT_THAT(log, HasSubstr(absl::StrCat("nvcc: ", root_, "/cuda-9.9/bin/nvcc -c /src/k.cu")));
  EXPECT_THAT(log, HasSubstr("-gencode arch=compute_80,code=sm_80 -gencode "
                             "arch=compute_90a,code=sm_90a -gencode "
                             "arch=compute_90a,code=compute_90a --threads 3"));
  EXPECT_THAT(log, HasSubstr("header through the link: yes"));
  bool labelled = false;
  for (const v1::KeyField& f : response.result().key_fields()) {
    if (f.label() == "cuda_archs") {
      EXPECT_EQ(f.value(), "80,90a+PTX");
      labelled = true;
    }
  }
  EXPECT_TRUE(labelled);
}

TEST_F(ExtensionBuilderTest, KeyTellsVariantsApartAndKeepsPlainListsKeys) {
  auto b = Builder(2);
  ASSERT_NE(b, nullptr);
  // Inputs not uploaded: the answer names them missing, and the handle is the key.
  auto handle = [&](std::vector<int> plain, std::vector<CudaTarget> variants) {
    v1::BuildExtensionRequest r = Request(b.get(), {"k.cu"}, /*upload=*/false);
    for (int sm : plain) r.add_cuda_archs(sm);
    for (const CudaTarget& t : variants) {
      v1::CudaArch* a = r.add_cuda_arch_list();
      a->set_sm(t.sm);
      a->set_arch_specific(t.arch_specific);
      a->set_ptx(t.ptx);
    }
    auto [s, response] = Build(b.get(), r, /*missing_ok=*/true);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_GT(response.missing_size(), 0);
    return response.handle();
  };
  const std::string plain = handle({90}, {});
  EXPECT_EQ(handle({}, {{90, false, false}}), plain);
  EXPECT_EQ(handle({90, 90}, {}), plain);
  const std::string specific = handle({}, {{90, true, false}});
  const std::string ptx = handle({}, {{90, false, true}});
  EXPECT_NE(specific, plain);
  EXPECT_NE(ptx, plain);
  EXPECT_NE(ptx, specific);
  EXPECT_EQ(handle({90}, {{90, false, true}}), ptx);
}

TEST_F(ExtensionBuilderTest, RefusesArchitecturesNamingFieldAndValue) {
  auto b = Builder(2);
  ASSERT_NE(b, nullptr);
  v1::BuildExtensionRequest r = Request(b.get(), {"k.cu"});
  v1::CudaArch* a = r.add_cuda_arch_list();
  a->set_sm(86);
  a->set_arch_specific(true);
  auto [s, response] = Build(b.get(), r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cuda_arch_list: sm_86a"));
}

}  // namespace
}  // namespace kiln::ext
