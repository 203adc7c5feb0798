// Tests of RocksDbStore: round trips, restart, corruption, eviction order, blob sharing and
// concurrent use. Damage is done the way it happens in life, behind the store's back: the test
// closes the store, edits the database with the RocksDB API and opens the store again.
#include "server/store/rocksdb_store.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "server/store/records.h"
#include "tests/unit/store/store_test_blobs.h"

namespace kiln::store {
namespace {

using ::testing::Optional;

class RocksDbStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("kiln_store_", info->name(), "_", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  RocksDbStoreOptions Options(int64_t capacity = 0) {
    RocksDbStoreOptions options;
    options.path = dir_.string();
    options.capacity_bytes = capacity;
    return options;
  }

  void Reopen(RocksDbStoreOptions options) {
    store_.reset();
    auto store = RocksDbStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void Reopen(int64_t capacity = 0) { Reopen(Options(capacity)); }

  void Put(const std::string& key, const std::vector<std::string>& blobs) {
    ASSERT_TRUE(store_->PutResult(key, MakeResult(blobs, "log of " + key), blobs).ok());
  }

  bool Has(const std::string& key) {
    auto result = store_->GetResult(key);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() && result->has_value();
  }

  std::optional<std::string> Blob(const std::string& blob) {
    auto got = store_->GetBlob(HexDigest(blob));
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? *got : std::nullopt;
  }

  // Opens the closed database directly, every column family included, and runs `edit`.
  void EditRaw(const std::function<void(rocksdb::DB*, rocksdb::ColumnFamilyHandle* cas,
                                        rocksdb::ColumnFamilyHandle* ac)>& edit) {
    store_.reset();
    std::vector<std::string> names;
    ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir_.string(), &names).ok());
    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
    for (const std::string& name : names) descriptors.push_back({name, {}});
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(
        rocksdb::DB::Open(rocksdb::DBOptions(), dir_.string(), descriptors, &handles, &db).ok());
    rocksdb::ColumnFamilyHandle* cas = nullptr;
    rocksdb::ColumnFamilyHandle* ac = nullptr;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == kCasColumnFamily) cas = handles[i];
      if (names[i] == kAcColumnFamily) ac = handles[i];
    }
    edit(db, cas, ac);
    for (auto* handle : handles) ASSERT_TRUE(db->DestroyColumnFamilyHandle(handle).ok());
    ASSERT_TRUE(db->Close().ok());
    delete db;
  }

  std::filesystem::path dir_;
  std::unique_ptr<RocksDbStore> store_;
};

TEST_F(RocksDbStoreTest, RoundTrip) {
  Reopen();
  // One value below min_blob_size (stays in the SST), one above (goes to a blob file).
  const std::vector<std::string> blobs = {MakeBlob(1, 100), MakeBlob(2, 64 * 1024)};
  const v1::ActionResult put = MakeResult(blobs, "compiled fine");
  ASSERT_TRUE(store_->PutResult("key", put, blobs).ok());

  auto got = store_->GetResult("key");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->SerializeAsString(), put.SerializeAsString());
  for (const std::string& blob : blobs) EXPECT_THAT(Blob(blob), Optional(blob));

  const StoreStats stats = store_->Stats();
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 0);
  EXPECT_EQ(stats.entries, 1);
  EXPECT_GT(stats.bytes, 100 + 64 * 1024);
}

TEST_F(RocksDbStoreTest, MissesAndBadDigests) {
  Reopen();
  auto missing = store_->GetResult("absent");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  EXPECT_EQ(store_->Stats().misses, 1);
  EXPECT_EQ(Blob("never stored"), std::nullopt);
  EXPECT_TRUE(absl::IsInvalidArgument(store_->GetBlob("ABCD").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->GetBlob(std::string(64, 'A')).status()));
}

TEST_F(RocksDbStoreTest, PutRejectsMismatchedBlobs) {
  Reopen();
  const std::string blob = MakeBlob(1, 1000);
  const v1::ActionResult result = MakeResult({blob}, "");

  auto status = store_->PutResult("key", result, {MakeBlob(2, 1000)});
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("artifact 0"));

  EXPECT_TRUE(absl::IsInvalidArgument(store_->PutResult("key", result, {})));
  v1::ActionResult bad_size = result;
  bad_size.mutable_artifacts(0)->set_size(999);
  EXPECT_TRUE(absl::IsInvalidArgument(store_->PutResult("key", bad_size, {blob})));
  v1::ActionResult bad_hex = result;
  bad_hex.mutable_artifacts(0)->set_digest("xyz");
  EXPECT_TRUE(absl::IsInvalidArgument(store_->PutResult("key", bad_hex, {blob})));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->PutResult("", result, {blob})));

  EXPECT_FALSE(Has("key"));
  EXPECT_EQ(Blob(blob), std::nullopt);
  EXPECT_EQ(store_->Stats().bytes, 0);
  EXPECT_EQ(store_->Stats().entries, 0);
}

TEST_F(RocksDbStoreTest, PutFillsInMissingSizes) {
  Reopen();
  const std::string blob = MakeBlob(1, 5000);
  v1::ActionResult result = MakeResult({blob}, "");
  result.mutable_artifacts(0)->set_size(0);
  ASSERT_TRUE(store_->PutResult("key", result, {blob}).ok());
  auto got = store_->GetResult("key");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->artifacts(0).size(), 5000);
}

TEST_F(RocksDbStoreTest, ReopenKeepsEverything) {
  Reopen();
  const std::string shared = MakeBlob(100, 20000);
  for (int i = 0; i < 5; ++i) Put(absl::StrCat("key", i), {shared, MakeBlob(i, 3000 + i)});
  const StoreStats before = store_->Stats();
  EXPECT_EQ(before.entries, 5);

  Reopen();
  const StoreStats after = store_->Stats();
  EXPECT_EQ(after.entries, before.entries);
  EXPECT_EQ(after.bytes, before.bytes);
  for (int i = 0; i < 5; ++i) {
    auto got = store_->GetResult(absl::StrCat("key", i));
    ASSERT_TRUE(got.ok() && got->has_value());
    EXPECT_EQ((*got)->compile_log(), absl::StrCat("log of key", i));
    EXPECT_THAT(Blob(MakeBlob(i, 3000 + i)), Optional(MakeBlob(i, 3000 + i)));
  }
  EXPECT_THAT(Blob(shared), Optional(shared));
}

TEST_F(RocksDbStoreTest, CorruptBlobIsDeletedCountedAndMissed) {
  Reopen();
  const std::string big = MakeBlob(1, 50000);  // in a blob file
  const std::string small = MakeBlob(2, 200);  // inline
  Put("a", {big});
  Put("b", {small});
  Put("c", {MakeBlob(3, 300)});
  EditRaw([&](rocksdb::DB* db, rocksdb::ColumnFamilyHandle* cas, rocksdb::ColumnFamilyHandle*) {
    std::string flipped = big;
    flipped[123] ^= 1;
    ASSERT_TRUE(db->Put({}, cas, *Sha256(big), flipped).ok());
    ASSERT_TRUE(db->Put({}, cas, *Sha256(small), "short").ok());
  });
  Reopen();
  ASSERT_EQ(store_->Stats().entries, 3);

  // Found by GetBlob: the blob goes, and the entry naming it with it.
  EXPECT_EQ(Blob(big), std::nullopt);
  EXPECT_EQ(store_->Stats().corruptions, 1);
  EXPECT_FALSE(Has("a"));
  // Found by GetResult's verification.
  EXPECT_FALSE(Has("b"));
  EXPECT_EQ(store_->Stats().corruptions, 2);
  EXPECT_EQ(Blob(small), std::nullopt);
  EXPECT_TRUE(Has("c"));

  const StoreStats stats = store_->Stats();
  EXPECT_EQ(stats.entries, 1);
  EXPECT_EQ(stats.misses, 2);
  Reopen();
  EXPECT_EQ(store_->Stats().entries, 1);
  EXPECT_EQ(store_->Stats().bytes, stats.bytes);

  // A fresh put of the same content heals the key.
  Put("a", {big});
  EXPECT_THAT(Blob(big), Optional(big));
  EXPECT_TRUE(Has("a"));
}

TEST_F(RocksDbStoreTest, MissingBlobIsAnAcMiss) {
  Reopen();
  const std::string blob = MakeBlob(1, 10000);
  Put("key", {MakeBlob(2, 100), blob});
  EditRaw([&](rocksdb::DB* db, rocksdb::ColumnFamilyHandle* cas, rocksdb::ColumnFamilyHandle*) {
    ASSERT_TRUE(db->Delete({}, cas, *Sha256(blob)).ok());
  });
  Reopen();
  EXPECT_FALSE(Has("key"));
  EXPECT_EQ(store_->Stats().entries, 0);
  EXPECT_EQ(store_->Stats().bytes, 0);  // the surviving blob went with its entry
  EXPECT_EQ(Blob(MakeBlob(2, 100)), std::nullopt);
}

TEST_F(RocksDbStoreTest, DamagedAcRecordIsDroppedAtOpen) {
  Reopen();
  Put("good", {MakeBlob(1, 100)});
  Put("bad", {MakeBlob(2, 100)});
  EditRaw([&](rocksdb::DB* db, rocksdb::ColumnFamilyHandle*, rocksdb::ColumnFamilyHandle* ac) {
    ASSERT_TRUE(db->Put({}, ac, "bad", EncodeAcRecord(7, "not a protobuf \xff\xff\xff")).ok());
    ASSERT_TRUE(db->Put({}, ac, "truncated", std::string(10, '\1')).ok());
  });
  Reopen();
  EXPECT_EQ(store_->Stats().entries, 1);
  EXPECT_EQ(store_->Stats().corruptions, 2);
  EXPECT_TRUE(Has("good"));
  EXPECT_FALSE(Has("bad"));

  // The blob the damaged record named is left unreferenced; a scrub removes it.
  EXPECT_THAT(Blob(MakeBlob(2, 100)), Optional(MakeBlob(2, 100)));
  RocksDbStoreOptions options = Options();
  options.scrub_on_open = true;
  Reopen(options);
  EXPECT_EQ(Blob(MakeBlob(2, 100)), std::nullopt);
  EXPECT_TRUE(Has("good"));
}

TEST_F(RocksDbStoreTest, ListResultsPagesInKeyOrderWithoutCountingUse) {
  Reopen();
  for (const char* key : {"c", "a", "d", "b"}) Put(key, {MakeBlob(key[0], 200)});
  auto keys = [&](const std::string& after, size_t limit) {
    std::vector<std::string> out;
    auto page = store_->ListResults(after, limit);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok()) return out;
    for (const auto& [key, result] : *page) {
      EXPECT_EQ(result.compile_log(), "log of " + key);  // each key with its own result
      out.push_back(key);
    }
    return out;
  };
  EXPECT_EQ(keys("", 3), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(keys("c", 3), (std::vector<std::string>{"d"}));
  EXPECT_EQ(keys("bb", 10),
            (std::vector<std::string>{"c", "d"}));  // after a key that is not stored
  EXPECT_TRUE(keys("d", 10).empty());
  EXPECT_EQ(store_->Stats().hits, 0);
  EXPECT_EQ(store_->Stats().misses, 0);
}

TEST_F(RocksDbStoreTest, ScrubFindsCorruptBlobs) {
  Reopen();
  const std::string blob = MakeBlob(1, 8000);
  Put("a", {blob});
  Put("b", {MakeBlob(2, 8000)});
  EditRaw([&](rocksdb::DB* db, rocksdb::ColumnFamilyHandle* cas, rocksdb::ColumnFamilyHandle*) {
    ASSERT_TRUE(db->Put({}, cas, *Sha256(blob), MakeBlob(3, 8000)).ok());
  });
  RocksDbStoreOptions options = Options();
  options.scrub_on_open = true;
  Reopen(options);
  EXPECT_EQ(store_->Stats().corruptions, 1);
  EXPECT_EQ(store_->Stats().entries, 1);
  EXPECT_TRUE(Has("b"));
}

TEST_F(RocksDbStoreTest, ReplacingAnEntryReleasesItsBlobs) {
  Reopen();
  const std::string kept = MakeBlob(1, 5000);
  const std::string dropped = MakeBlob(2, 5000);
  Put("key", {kept});
  const int64_t one = store_->Stats().bytes;
  Put("key", {kept, dropped});
  Put("key", {kept});
  EXPECT_EQ(store_->Stats().bytes, one);
  EXPECT_EQ(store_->Stats().entries, 1);
  EXPECT_EQ(Blob(dropped), std::nullopt);
  EXPECT_THAT(Blob(kept), Optional(kept));
}

TEST_F(RocksDbStoreTest, EvictionKeepsRecentlyUsedEntries) {
  Reopen();
  Put("p", {MakeBlob(99, 10000)});
  const int64_t entry_bytes = store_->Stats().bytes;
  store_.reset();
  std::filesystem::remove_all(dir_);
  // Room for three entries of this shape, not four.
  Reopen(Options(entry_bytes * 7 / 2));

  Put("a", {MakeBlob(1, 10000)});
  Put("b", {MakeBlob(2, 10000)});
  Put("c", {MakeBlob(3, 10000)});
  EXPECT_TRUE(Has("a"));  // a is now more recent than b
  Put("d", {MakeBlob(4, 10000)});

  EXPECT_EQ(store_->Stats().evictions, 1);
  EXPECT_FALSE(Has("b"));
  EXPECT_EQ(Blob(MakeBlob(2, 10000)), std::nullopt);
  EXPECT_TRUE(Has("a"));
  EXPECT_TRUE(Has("c"));
  EXPECT_TRUE(Has("d"));
  EXPECT_LE(store_->Stats().bytes, store_->Stats().capacity_bytes);

  // Recency survives a restart: touched again, a and d are newer than c.
  EXPECT_TRUE(Has("a"));
  EXPECT_TRUE(Has("d"));
  Reopen(Options(entry_bytes * 7 / 2));
  Put("e", {MakeBlob(5, 10000)});
  EXPECT_FALSE(Has("c"));
  EXPECT_TRUE(Has("a"));
  EXPECT_TRUE(Has("d"));
  EXPECT_TRUE(Has("e"));

  // A smaller budget at open evicts down to it, oldest first.
  Reopen(Options(entry_bytes * 3 / 2));
  EXPECT_EQ(store_->Stats().entries, 1);
  EXPECT_TRUE(Has("e"));
}

TEST_F(RocksDbStoreTest, SharedBlobLivesWhileAnyEntryNamesIt) {
  Reopen();
  const std::string shared = MakeBlob(100, 10000);
  Put("a", {shared, MakeBlob(1, 10000)});
  // Room for the shared blob and two others, not three.
  const int64_t entry_bytes = store_->Stats().bytes;
  Reopen(Options(entry_bytes * 7 / 4));
  Put("b", {shared, MakeBlob(2, 10000)});  // shares: costs only its own blob and record
  EXPECT_EQ(store_->Stats().evictions, 0);
  Put("c", {MakeBlob(3, 10000)});  // a goes
  EXPECT_FALSE(Has("a"));
  EXPECT_EQ(Blob(MakeBlob(1, 10000)), std::nullopt);
  EXPECT_THAT(Blob(shared), Optional(shared));  // b still names it
  EXPECT_TRUE(Has("b"));
  Put("d", {MakeBlob(4, 10000)});  // c goes (b was just used)
  Put("e", {MakeBlob(5, 10000)});  // b goes, and the shared blob with it
  EXPECT_FALSE(Has("b"));
  EXPECT_EQ(Blob(shared), std::nullopt);
}

TEST_F(RocksDbStoreTest, OversizedEntryIsKeptAlone) {
  Reopen(Options(1000));
  Put("small", {MakeBlob(1, 100)});
  Put("huge", {MakeBlob(2, 5000)});
  EXPECT_TRUE(Has("huge"));
  EXPECT_FALSE(Has("small"));
}

TEST_F(RocksDbStoreTest, OtherFormatVersionsAreLeftAlone) {
  Reopen();
  Put("key", {MakeBlob(1, 100)});
  store_.reset();
  {
    std::vector<std::string> names;
    ASSERT_TRUE(rocksdb::DB::ListColumnFamilies({}, dir_.string(), &names).ok());
    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
    for (const std::string& name : names) descriptors.push_back({name, {}});
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open({}, dir_.string(), descriptors, &handles, &db).ok());
    rocksdb::ColumnFamilyHandle* future = nullptr;
    ASSERT_TRUE(db->CreateColumnFamily({}, "ac.v2", &future).ok());
    ASSERT_TRUE(db->Put({}, future, "k", "v").ok());
    handles.push_back(future);
    for (auto* handle : handles) ASSERT_TRUE(db->DestroyColumnFamilyHandle(handle).ok());
    ASSERT_TRUE(db->Close().ok());
    delete db;
  }
  Reopen();
  EXPECT_TRUE(Has("key"));
  store_.reset();
  std::vector<std::string> names;
  ASSERT_TRUE(rocksdb::DB::ListColumnFamilies({}, dir_.string(), &names).ok());
  EXPECT_THAT(names, ::testing::Contains("ac.v2"));
}

TEST_F(RocksDbStoreTest, SecondOpenOfTheSamePathIsUnavailable) {
  Reopen();
  auto second = RocksDbStore::Open(Options());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
}

TEST_F(RocksDbStoreTest, ConcurrentPutsAndGets) {
  Reopen();
  Put("probe", {MakeBlob(0, 4000), MakeBlob(-1, 6000)});
  const int64_t entry_bytes = store_->Stats().bytes;
  store_.reset();
  std::filesystem::remove_all(dir_);
  // Small enough that eviction runs alongside the readers.
  Reopen(Options(entry_bytes * 20));

  constexpr int kThreads = 4;
  constexpr int kOps = 150;
  const std::string common = MakeBlob(1000, 6000);
  std::atomic<int> failures{0};
  std::atomic<int> hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        const std::string key = absl::StrCat("k", t, "_", i);
        const std::vector<std::string> blobs = {MakeBlob(t * 10000 + i, 4000), common};
        if (!store_->PutResult(key, MakeResult(blobs, key), blobs).ok()) ++failures;
        // Read back a recent key of this thread and one of a neighbour's.
        for (const std::string& other :
             {absl::StrCat("k", t, "_", i / 2), absl::StrCat("k", (t + 1) % kThreads, "_", i)}) {
          auto got = store_->GetResult(other);
          if (!got.ok()) {
            ++failures;
            continue;
          }
          if (!got->has_value()) continue;
          ++hits;
          if ((*got)->compile_log() != other) ++failures;
          for (const v1::Artifact& artifact : (*got)->artifacts()) {
            auto blob = store_->GetBlob(artifact.digest());
            // It may have been evicted since; if it is served it must be intact.
            if (!blob.ok() || (blob->has_value() && HexDigest(**blob) != artifact.digest())) {
              ++failures;
            }
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(hits.load(), 0);

  const StoreStats before = store_->Stats();
  EXPECT_EQ(before.corruptions, 0);
  EXPECT_GT(before.evictions, 0);
  EXPECT_LE(before.bytes, before.capacity_bytes);
  EXPECT_EQ(before.entries + before.evictions, kThreads * kOps);
  EXPECT_THAT(Blob(common), Optional(common));
  // The byte count kept under concurrency matches the one rebuilt from disk.
  Reopen(Options(entry_bytes * 20));
  EXPECT_EQ(store_->Stats().bytes, before.bytes);
  EXPECT_EQ(store_->Stats().entries, before.entries);
}

}  // namespace
}  // namespace kiln::store
