// RocksDbStore on a full disk: a real tmpfs, filled to the last byte by a file beside the cache.
// The store must suspend writes instead of failing or aborting, keep serving what it holds,
// accept new results into memory (and say so), and write them out by itself once the file is
// removed. Mounting needs root; elsewhere the test is skipped with the reason.
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/store/records.h"
#include "server/store/rocksdb_store.h"
#include "tests/unit/store/store_test_blobs.h"

namespace kiln::store {
namespace {

std::string Key(int i) { return absl::StrCat("key-", i); }

// Writes 64 KiB chunks to `path` until the file system refuses one. Returns the bytes written.
int64_t FillDisk(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  const std::string chunk(64 << 10, 'f');
  int64_t written = 0;
  for (;;) {
    const size_t n = std::fwrite(chunk.data(), 1, chunk.size(), f);
    written += static_cast<int64_t>(n);
    if (n < chunk.size() || std::fflush(f) != 0) break;
  }
  std::fclose(f);
  return written;
}

// Where $KILN_REQUIRE_DISK_FULL is 1 (deploy/test.sh, run as root) the test must run: a
// missing tmpfs fails it instead of skipping it.
bool DiskFullRequired() {
  const char* v = std::getenv("KILN_REQUIRE_DISK_FULL");
  return v != nullptr && std::string(v) == "1";
}

class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      if (DiskFullRequired())
        GTEST_FAIL() << "KILN_REQUIRE_DISK_FULL=1, but mounting a small tmpfs needs root";
      GTEST_SKIP() << "mounting a small tmpfs needs root";
    }
    mount_ = std::filesystem::path(::testing::TempDir()) / absl::StrCat("kiln_full_", getpid());
    std::filesystem::create_directories(mount_);
    if (mount("tmpfs", mount_.c_str(), "tmpfs", 0, "size=24m") != 0) {
      const std::string why = strerror(errno);
      std::filesystem::remove(mount_);
      if (DiskFullRequired())
        GTEST_FAIL() << "KILN_REQUIRE_DISK_FULL=1, but no tmpfs can be mounted: " << why;
      GTEST_SKIP() << "cannot mount a tmpfs here: " << why;
    }
    mounted_ = true;
  }
  void TearDown() override {
    store_.reset();
    if (mounted_) umount2(mount_.c_str(), MNT_DETACH);
    if (!mount_.empty()) std::filesystem::remove_all(mount_);
  }

  RocksDbStoreOptions Options() const {
    RocksDbStoreOptions options;
    options.path = (mount_ / "cache").string();
    options.write_retry_interval = absl::Milliseconds(200);
    options.write_buffer_bytes = 4 << 20;
    return options;
  }

  void Open() {
    store_.reset();
    auto store = RocksDbStore::Open(Options());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  // A hit whose artifact bytes are exactly `blob`.
  void ExpectServed(const std::string& key, const std::string& blob) {
    absl::StatusOr<std::optional<v1::ActionResult>> result = store_->GetResult(key);
    ASSERT_TRUE(result.ok()) << key << ": " << result.status();
    ASSERT_TRUE(result->has_value()) << key << " is a miss";
    ASSERT_EQ((*result)->artifacts_size(), 1);
    absl::StatusOr<std::optional<std::string>> bytes =
        store_->GetBlob((*result)->artifacts(0).digest());
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_TRUE(bytes->has_value()) << key << ": blob missing";
    EXPECT_TRUE(**bytes == blob) << key << ": blob differs";
  }

  std::filesystem::path mount_;
  bool mounted_ = false;
  std::unique_ptr<RocksDbStore> store_;
};

TEST_F(DiskFullTest, SuspendsServesAndResumesWithoutRestart) {
  Open();
  constexpr size_t kBlob = 96 << 10;
  int next = 0;
  for (; next < 8; ++next) {
    const std::string blob = MakeBlob(next, kBlob);
    ASSERT_TRUE(store_->PutResult(Key(next), MakeResult({blob}), {blob}).ok());
    ASSERT_TRUE(store_->IsPersisted(Key(next)));
  }
  const int stored_before = next;

  const std::string filler = (mount_ / "filler").string();
  ASSERT_GT(FillDisk(filler), 0);

  // Puts go on succeeding; once RocksDB's reserves are used up they land in memory.
  int first_unpersisted = -1;
  for (int tries = 0; tries < 200 && first_unpersisted < 0; ++tries, ++next) {
    const std::string blob = MakeBlob(next, kBlob);
    ASSERT_TRUE(store_->PutResult(Key(next), MakeResult({blob}), {blob}).ok()) << next;
    if (!store_->IsPersisted(Key(next))) first_unpersisted = next;
  }
  ASSERT_GE(first_unpersisted, 0) << "the full disk never refused a write";
  EXPECT_TRUE(store_->Stats().writes_suspended);
  EXPECT_GE(store_->Stats().write_errors, 1);
  for (int i = 0; i < 3; ++i, ++next) {
    const std::string blob = MakeBlob(next, kBlob);
    ASSERT_TRUE(store_->PutResult(Key(next), MakeResult({blob}), {blob}).ok());
    EXPECT_FALSE(store_->IsPersisted(Key(next)));
  }
  EXPECT_GE(store_->Stats().unpersisted_puts, 4);

  // Everything is served: what was on disk before, and what is held in memory.
  for (int i = 0; i < next; ++i) ExpectServed(Key(i), MakeBlob(i, kBlob));
  EXPECT_EQ(store_->Stats().corruptions, 0);

  // Space comes back; the store notices by itself.
  std::filesystem::remove(filler);
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (store_->Stats().writes_suspended && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_FALSE(store_->Stats().writes_suspended) << "writes did not resume";
  EXPECT_GE(store_->Stats().write_resumes, 1);
  for (int i = 0; i < next; ++i) EXPECT_TRUE(store_->IsPersisted(Key(i))) << i;
  const std::string blob = MakeBlob(next, kBlob);
  ASSERT_TRUE(store_->PutResult(Key(next), MakeResult({blob}), {blob}).ok());
  EXPECT_TRUE(store_->IsPersisted(Key(next)));
  ++next;

  // A restart finds every result, intact.
  Open();
  for (int i = 0; i < next; ++i) ExpectServed(Key(i), MakeBlob(i, kBlob));
  EXPECT_EQ(store_->Stats().corruptions, 0);
  EXPECT_EQ(store_->Stats().entries, next);
  EXPECT_GE(stored_before, 1);
}

}  // namespace
}  // namespace kiln::store
