// The local artifact directory: layout, verification, atomic writes, corruption repair, and
// one fetch per digest across instances, threads and processes.
#include "client/cpp/artifact_cache.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/key/digest.h"
#include "tests/unit/client/test_support.h"

namespace kiln::client {
namespace {

namespace fs = std::filesystem;

class ArtifactCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kiln-cache-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    auto cache = ArtifactCache::Open(root_);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A fetch function serving `bytes_` and counting its calls.
  ArtifactCache::FetchFn Server() {
    return [this](const std::string& digest) -> absl::StatusOr<std::string> {
      ++fetch_calls_;
      EXPECT_EQ(digest, digest_);
      return bytes_;
    };
  }

  std::string root_;
  std::unique_ptr<ArtifactCache> cache_;
  const std::string bytes_ = std::string(
      "\x7f"
      "ELF pretend kernel library\0\1\2",
      30);
  const std::string digest_ = key::Sha256Hex(bytes_);
  std::atomic<int> fetch_calls_{0};
};

TEST_F(ArtifactCacheTest, PutStoresUnderShardedDigestPathReadableByAll) {
  auto path = cache_->Put(digest_, bytes_);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, root_ + "/artifacts/" + digest_.substr(0, 2) + "/" + digest_);
  EXPECT_EQ(*path, cache_->PathFor(digest_));
  EXPECT_EQ(ReadAll(*path), bytes_);
  struct stat st;
  ASSERT_EQ(stat(path->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  // The write went through a temporary that is gone now.
  for (const auto& entry : fs::directory_iterator(fs::path(*path).parent_path())) {
    EXPECT_NE(entry.path().filename().string()[0], '.') << "left behind: " << entry.path();
  }
  auto found = cache_->Find(digest_);
  ASSERT_TRUE(found.ok());
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ(**found, *path);
}

TEST_F(ArtifactCacheTest, PutRefusesBytesThatDoNotMatchTheDigest) {
  auto path = cache_->Put(digest_, bytes_ + "x");
  EXPECT_EQ(path.status().code(), absl::StatusCode::kDataLoss) << path.status();
  EXPECT_FALSE(fs::exists(cache_->PathFor(digest_)));
}

TEST_F(ArtifactCacheTest, MalformedDigestsNeverBecomePaths) {
  for (std::string bad : {std::string("../../etc/passwd"), digest_.substr(1), std::string(""),
                          std::string(64, 'A')}) {
    EXPECT_EQ(cache_->Find(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(cache_->GetOrFetch(bad, Server()).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(fetch_calls_, 0);
}

TEST_F(ArtifactCacheTest, SecondLoadFetchesNothingEvenFromAnotherInstance) {
  auto first = cache_->GetOrFetch(digest_, Server());
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = cache_->GetOrFetch(digest_, Server());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*first, *second);
  EXPECT_EQ(fetch_calls_, 1);
  EXPECT_EQ(cache_->stats().fetches, 1);
  EXPECT_EQ(cache_->stats().hits, 1);

  // Another instance shares nothing with the first but the files, as another process would.
  auto other = ArtifactCache::Open(root_);
  ASSERT_TRUE(other.ok());
  auto third = (*other)->GetOrFetch(digest_, Server());
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(*third, *first);
  EXPECT_EQ(fetch_calls_, 1);
}

TEST_F(ArtifactCacheTest, CorruptFileIsDeletedAndFetchedAgain) {
  auto path = cache_->GetOrFetch(digest_, Server());
  ASSERT_TRUE(path.ok());
  for (const std::string& damage : {std::string("garbage"), bytes_.substr(0, 10), std::string()}) {
    Overwrite(*path, damage);
    auto again = cache_->GetOrFetch(digest_, Server());
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(ReadAll(*again), bytes_);
  }
  EXPECT_EQ(fetch_calls_, 4);
  EXPECT_EQ(cache_->stats().corruptions, 3);

  // Find alone deletes a corrupt copy rather than handing it out.
  Overwrite(*path, "garbage");
  auto found = cache_->Find(digest_);
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->has_value());
  EXPECT_FALSE(fs::exists(*path));
}

TEST_F(ArtifactCacheTest, FetchErrorStoresNothing) {
  auto failed = cache_->GetOrFetch(digest_, [](const std::string&) -> absl::StatusOr<std::string> {
    return absl::UnavailableError("daemon down");
  });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(fs::exists(cache_->PathFor(digest_)));
  // A fetch that returns the wrong bytes is refused, not stored.
  auto wrong = cache_->GetOrFetch(digest_, [](const std::string&) -> absl::StatusOr<std::string> {
    return std::string("not it");
  });
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(fs::exists(cache_->PathFor(digest_)));
}

// A fetch that checks its bytes itself (the client's does) has them stored without a second
// hash; the store still hashes a file before a process first uses it, so bytes that a broken
// fetch got wrong are deleted at the next find, never handed out.
TEST_F(ArtifactCacheTest, AVerifyingFetchIsStoredWithoutASecondHash) {
  auto path = cache_->GetOrFetchVerified(digest_, Server());
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(ReadAll(*path), bytes_);
  EXPECT_EQ(fetch_calls_, 1);
  auto again = cache_->GetOrFetchVerified(digest_, Server());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(fetch_calls_, 1);

  const std::string other = key::Sha256Hex("other bytes");
  auto wrong = cache_->GetOrFetchVerified(
      other,
      [](const std::string&) -> absl::StatusOr<std::string> { return std::string("not them"); });
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  auto fresh = ArtifactCache::Open(root_);  // another process: nothing verified yet
  ASSERT_TRUE(fresh.ok());
  auto found = (*fresh)->Find(other);
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->has_value());
  EXPECT_FALSE(fs::exists(cache_->PathFor(other)));
}

TEST_F(ArtifactCacheTest, TheFinalNameAppearsOnlyWhenTheBytesAreWhole) {
  // A crash mid-write leaves a temporary, never a partial file under the final name.
  const std::string path = cache_->PathFor(digest_);
  fs::create_directories(fs::path(path).parent_path());
  Overwrite(fs::path(path).parent_path() / ("." + digest_ + ".a1b2c3"), bytes_.substr(0, 5));
  auto found = cache_->Find(digest_);
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->has_value());
  auto loaded =
      cache_->GetOrFetch(digest_, [&](const std::string& d) -> absl::StatusOr<std::string> {
        // While the fetch runs nothing is at the final name yet.
        EXPECT_FALSE(fs::exists(path));
        return Server()(d);
      });
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(ReadAll(path), bytes_);
}

TEST_F(ArtifactCacheTest, ConcurrentThreadsFetchOnce) {
  auto slow = [this](const std::string& d) -> absl::StatusOr<std::string> {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return Server()(d);
  };
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      if (cache_->GetOrFetch(digest_, slow).ok()) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, 8);
  EXPECT_EQ(fetch_calls_, 1);
}

TEST_F(ArtifactCacheTest, ConcurrentProcessesFetchOnce) {
  // Each fetch appends a line to a log; two processes racing on one digest must leave one.
  const std::string log = root_ + "/fetch.log";
  auto logged = [&](const std::string&) -> absl::StatusOr<std::string> {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      (void)!write(fd, "fetch\n", 6);
      close(fd);
    }
    return bytes_;
  };
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto cache = ArtifactCache::Open(root_);
    _exit(cache.ok() && (*cache)->GetOrFetch(digest_, logged).ok() ? 0 : 1);
  }
  auto mine = ArtifactCache::Open(root_);
  ASSERT_TRUE(mine.ok());
  EXPECT_TRUE((*mine)->GetOrFetch(digest_, logged).ok());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(ReadAll(log), "fetch\n");
}

TEST(ArtifactCacheRoot, DefaultRootFollowsTheEnvironment) {
  const char* saved = std::getenv("KILN_CACHE_DIR");
  const std::string keep = saved != nullptr ? saved : "";
  setenv("KILN_CACHE_DIR", "/somewhere/kiln-cache", 1);
  auto root = ArtifactCache::DefaultRoot();
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(*root, "/somewhere/kiln-cache");
  unsetenv("KILN_CACHE_DIR");
  const char* home = std::getenv("HOME");
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  root = ArtifactCache::DefaultRoot();
  if (xdg != nullptr && *xdg != '\0') {
    EXPECT_EQ(*root, std::string(xdg) + "/kiln");
  } else if (home != nullptr && *home != '\0') {
    EXPECT_EQ(*root, std::string(home) + "/.cache/kiln");
  }
  if (saved != nullptr) setenv("KILN_CACHE_DIR", keep.c_str(), 1);
}

}  // namespace
}  // namespace kiln::client
