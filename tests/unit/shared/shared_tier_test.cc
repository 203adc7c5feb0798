// The shared tier's parts against a real redis-server on a loopback port: slot hashing and
// URL parsing, the record verification, SharedStore (chunking, eviction, verification),
// LeaseManager (exclusion, takeover on expiry, Redis down) and TieredStore over a real
// RocksDbStore.
#include <unistd.h>

#include <array>
#include <atomic>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/key/digest.h"
#include "server/shared/l2_records.h"
#include "server/shared/lease_manager.h"
#include "server/shared/redis_client.h"
#include "server/shared/shared_store.h"
#include "server/store/rocksdb_store.h"
#include "server/store/tiered_store.h"
#include "tests/integration/redis_process.h"
#include "tests/integration/test_pki.h"

namespace kiln::shared {
namespace {

using Claim = compile::CompileCoordinator::Claim;
using kiln::testing::RedisCall;
using kiln::testing::RedisProcess;

TEST(KeySlotTest, MatchesTheClusterSpecification) {
  // CRC16/XMODEM("123456789") is 0x31C3; the rest are what CLUSTER KEYSLOT answers.
  EXPECT_EQ(KeySlot("123456789"), 0x31C3 % 16384);
  EXPECT_EQ(KeySlot("foo"), 12182);
  EXPECT_EQ(KeySlot("somekey"), 11058);
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("user1000"));
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("{user1000}.followers"));
  EXPECT_EQ(KeySlot("foo{}{bar}"), KeySlot("foo{}{bar}"));
  EXPECT_NE(KeySlot("foo{}{bar}"), KeySlot("bar"));  // an empty tag hashes the whole key
  EXPECT_EQ(KeySlot("foo{{bar}}zap"), KeySlot("{bar"));
  const std::string digest(64, 'a');
  EXPECT_EQ(KeySlot(BlobKey(digest)), KeySlot(ChunkKey(digest, 7)));
  EXPECT_EQ(KeySlot(ActionKey(digest)), KeySlot(LeaseKey(digest)));
}

TEST(ParseRedisUrlTest, AcceptsStandaloneAndCluster) {
  absl::StatusOr<RedisOptions> o = ParseRedisUrl("redis://cache.example:6380/2");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->cluster);
  ASSERT_EQ(o->seeds.size(), 1u);
  EXPECT_EQ(o->seeds[0].host, "cache.example");
  EXPECT_EQ(o->seeds[0].port, 6380);
  EXPECT_EQ(o->db, 2);
  o = ParseRedisUrl("redis-cluster://10.0.0.1:7000,10.0.0.2:7001");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->cluster);
  EXPECT_EQ(o->seeds.size(), 2u);
}

TEST(ParseRedisUrlTest, ReadsCredentialsAndNeverQuotesThePassword) {
  absl::StatusOr<RedisOptions> o = ParseRedisUrl("redis://:s3cr%3At%40x@cache.example:6380/1");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->username, "");
  EXPECT_EQ(o->password, "s3cr:t@x");
  EXPECT_EQ(o->seeds[0].host, "cache.example");
  EXPECT_EQ(o->db, 1);
  o = ParseRedisUrl("redis-cluster://kiln:pw@10.0.0.1:7000,10.0.0.2:7001");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->username, "kiln");
  EXPECT_EQ(o->password, "pw");
  EXPECT_EQ(o->seeds.size(), 2u);
  EXPECT_EQ(RedactRedisUrl("redis://kiln:hunter2@h:1/0"), "redis://kiln:***@h:1/0");
  EXPECT_EQ(RedactRedisUrl("redis://h:1"), "redis://h:1");
  for (const char* bad : {"redis://user@h:1", "redis://:@h:1", "redis://:hunter2%zz@h:1",
                          "redis://:hunter2@h", "ftp://:hunter2@h:1"}) {
    absl::StatusOr<RedisOptions> r = ParseRedisUrl(bad);
    ASSERT_TRUE(absl::IsInvalidArgument(r.status())) << bad;
    EXPECT_EQ(r.status().message().find("hunter2"), absl::string_view::npos) << r.status();
  }
}

TEST(ParseRedisUrlTest, RejectsMalformedUrlsNamingThePart) {
  for (const char* bad : {"http://x:1", "redis://", "redis://host", "redis://host:0",
                          "redis://host:99999", "redis://h:1/x", "redis://a:1,b:2"}) {
    absl::StatusOr<RedisOptions> o = ParseRedisUrl(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(o.status())) << bad;
  }
}

TEST(ParseRedisUrlTest, RedissMeansTls) {
  absl::StatusOr<RedisOptions> o = ParseRedisUrl("rediss://:pw@cache.example:6380");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->tls.enabled);
  EXPECT_FALSE(o->cluster);
  EXPECT_EQ(o->password, "pw");
  EXPECT_EQ(RedisClient(*o).description(), "rediss://:***@cache.example:6380");
  o = ParseRedisUrl("rediss-cluster://10.0.0.1:7000,10.0.0.2:7001");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->tls.enabled);
  EXPECT_TRUE(o->cluster);
  EXPECT_EQ(RedisClient(*o).description(), "rediss-cluster://10.0.0.1:7000,10.0.0.2:7001");
  EXPECT_FALSE(ParseRedisUrl("redis://h:1")->tls.enabled);
  EXPECT_FALSE(ParseRedisUrl("redis-cluster://h:1")->tls.enabled);
}

TEST(L2RecordsTest, VerificationRejectsEveryKindOfDamage) {
  const std::string key(64, 'b');
  const std::string record = EncodeActionRecord(key, "payload bytes");
  absl::StatusOr<absl::string_view> ok = VerifyL2Record(L2RecordKind::kAction, key, record);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "payload bytes");
  // Truncated, padded, flipped, and a valid record stored under another key.
  EXPECT_TRUE(absl::IsDataLoss(
      VerifyL2Record(L2RecordKind::kAction, key, record.substr(0, record.size() - 1)).status()));
  EXPECT_TRUE(absl::IsDataLoss(VerifyL2Record(L2RecordKind::kAction, key, record + "x").status()));
  std::string flipped = record;
  flipped.back() ^= 1;
  EXPECT_TRUE(absl::IsDataLoss(VerifyL2Record(L2RecordKind::kAction, key, flipped).status()));
  EXPECT_TRUE(absl::IsDataLoss(
      VerifyL2Record(L2RecordKind::kAction, std::string(64, 'c'), record).status()));
  EXPECT_TRUE(absl::IsDataLoss(VerifyL2Record(L2RecordKind::kAction, key, "short").status()));

  const std::string blob = "artifact bytes";
  const std::string digest = key::Sha256Hex(blob);
  EXPECT_TRUE(VerifyL2Record(L2RecordKind::kBlob, digest, blob).ok());
  EXPECT_TRUE(
      absl::IsDataLoss(VerifyL2Record(L2RecordKind::kBlob, digest, "artifact byte").status()));

  EXPECT_TRUE(DecodeBlobHead(EncodeBlobHead(0, 3, "abc")).ok());
  EXPECT_TRUE(absl::IsDataLoss(DecodeBlobHead(EncodeBlobHead(0, 4, "abc")).status()));
  EXPECT_TRUE(absl::IsDataLoss(DecodeBlobHead("tiny").status()));
}

TEST(L2RecordsTest, MacsBindRecordsToTheClusterSecret) {
  const std::string key(64, 'b');
  const L2Auth ours{{std::string(32, 's')}, false};
  const L2Auth theirs{{std::string(32, 't')}, false};
  const std::string record = EncodeActionRecord(key, "payload bytes", ours);
  absl::StatusOr<absl::string_view> ok = VerifyL2Record(L2RecordKind::kAction, key, record, ours);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "payload bytes");
  // A reader without a secret still reads it (the MAC is a header field it skips).
  EXPECT_EQ(*VerifyL2Record(L2RecordKind::kAction, key, record), "payload bytes");

  // Another secret, a record with its digest recomputed but no MAC, and one with a MAC byte
  // flipped: all refused, the missing MAC accepted only when told to.
  absl::Status other = VerifyL2Record(L2RecordKind::kAction, key, record, theirs).status();
  EXPECT_TRUE(absl::IsDataLoss(other));
  EXPECT_TRUE(absl::StrContains(other.message(), "fails its MAC")) << other;
  const std::string forged = EncodeActionRecord(key, "payload bytes");
  absl::Status bare = VerifyL2Record(L2RecordKind::kAction, key, forged, ours).status();
  EXPECT_TRUE(absl::IsDataLoss(bare));
  EXPECT_TRUE(absl::StrContains(bare.message(), "carries no MAC")) << bare;
  L2Auth migrating = ours;
  migrating.accept_unauthenticated = true;
  EXPECT_TRUE(VerifyL2Record(L2RecordKind::kAction, key, forged, migrating).ok());
  std::string flipped = record;
  flipped[48] ^= 1;
  EXPECT_TRUE(
      absl::IsDataLoss(VerifyL2Record(L2RecordKind::kAction, key, flipped, migrating).status()));
  // Flag cleared to pass a MAC'd record off as unauthenticated: refused without the migration.
  std::string stripped = record;
  stripped[1] = 0;
  EXPECT_TRUE(
      absl::IsDataLoss(VerifyL2Record(L2RecordKind::kAction, key, stripped, ours).status()));

  // Rotation: a reader holding the new and the old secret reads records of both.
  const L2Auth rotating{{std::string(32, 't'), std::string(32, 's')}, false};
  EXPECT_TRUE(VerifyL2Record(L2RecordKind::kAction, key, record, rotating).ok());
  EXPECT_TRUE(VerifyL2Record(L2RecordKind::kAction, key,
                             EncodeActionRecord(key, "payload bytes", rotating), theirs)
                  .ok());
}

v1::ActionResult ResultNaming(const std::vector<std::string>& blobs) {
  v1::ActionResult result;
  for (const std::string& b : blobs) {
    v1::Artifact* a = result.add_artifacts();
    a->set_digest(key::Sha256Hex(b));
    a->set_size(static_cast<int64_t>(b.size()));
  }
  return result;
}

class SharedTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(redis_.Start(), "");
    absl::StatusOr<RedisOptions> options = ParseRedisUrl(redis_.url());
    ASSERT_TRUE(options.ok());
    client_ = std::make_unique<RedisClient>(*options);
  }

  RedisProcess redis_;
  std::unique_ptr<RedisClient> client_;
};

TEST_F(SharedTierTest, LargeBlobsAreChunkedAndAMissingChunkIsAMiss) {
  SharedStoreOptions options;
  options.chunk_bytes = 1000;
  SharedStore store(client_.get(), options);
  std::string big(3500, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + 3);
  const std::vector<std::string> blobs = {big, "small"};
  const v1::ActionResult result = ResultNaming(blobs);
  const std::string key(64, 'd');
  absl::Status put = store.PutResult(key, result, blobs);
  ASSERT_TRUE(put.ok()) << put;

  const std::string digest = key::Sha256Hex(big);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(RedisCall(redis_.port(), {"EXISTS", ChunkKey(digest, i)})->integer, 1) << i;
  }
  absl::StatusOr<std::optional<std::string>> got = store.GetBlob(digest);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, big);
  absl::StatusOr<std::optional<v1::ActionResult>> hit = store.GetResult(key);
  ASSERT_TRUE(hit.ok() && hit->has_value());
  EXPECT_EQ((*hit)->artifacts_size(), 2);

  RedisCall(redis_.port(), {"DEL", ChunkKey(digest, 2)});
  got = store.GetBlob(digest);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  EXPECT_EQ(store.Stats().corruptions, 0);
  // The head went with its lost chunk, so the record is incomplete now: a miss.
  hit = store.GetResult(key);
  ASSERT_TRUE(hit.ok());
  EXPECT_FALSE(hit->has_value());
  v1::GetStatsResponse stats;
  store.AddTierStats(&stats);
  EXPECT_EQ(stats.shared().incomplete(), 1);
  // A writer stores it again.
  ASSERT_TRUE(store.PutResult(key, result, blobs).ok());
  hit = store.GetResult(key);
  ASSERT_TRUE(hit.ok() && hit->has_value());
}

TEST_F(SharedTierTest, PutRejectsBlobsThatDoNotMatchTheirDigests) {
  SharedStore store(client_.get(), SharedStoreOptions());
  v1::ActionResult result = ResultNaming({"right"});
  EXPECT_TRUE(absl::IsInvalidArgument(store.PutResult(std::string(64, 'e'), result, {"wrong"})));
  EXPECT_EQ(RedisCall(redis_.port(), {"DBSIZE"})->integer, 0);
}

TEST_F(SharedTierTest, KeysExpireWhenATtlIsSet) {
  SharedStoreOptions options;
  options.ttl = absl::Seconds(60);
  SharedStore store(client_.get(), options);
  const std::vector<std::string> blobs = {"x"};
  ASSERT_TRUE(store.PutResult(std::string(64, 'f'), ResultNaming(blobs), blobs).ok());
  const int64_t ttl = RedisCall(redis_.port(), {"PTTL", ActionKey(std::string(64, 'f'))})->integer;
  EXPECT_GT(ttl, 50000);
  EXPECT_LE(ttl, 60000);
}

TEST_F(SharedTierTest, TieredFillsL1FromL2AndSurvivesL2Outage) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kiln-tiered-unit-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  store::RocksDbStoreOptions l1_options;
  l1_options.path = (dir / "l1").string();
  auto l1 = store::RocksDbStore::Open(l1_options);
  ASSERT_TRUE(l1.ok()) << l1.status();
  SharedStore l2(client_.get(), SharedStoreOptions());
  store::TieredStore tiered(l1->get(), &l2);

  const std::vector<std::string> blobs = {"shared artifact"};
  const v1::ActionResult result = ResultNaming(blobs);
  const std::string key(64, '1');
  ASSERT_TRUE(l2.PutResult(key, result, blobs).ok());  // as another replica would
  ASSERT_FALSE((*(*l1)->GetResult(key)).has_value());
  absl::StatusOr<std::optional<v1::ActionResult>> got = tiered.GetResult(key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_TRUE((*(*l1)->GetResult(key)).has_value()) << "the L2 hit fills L1";

  redis_.Stop();
  got = tiered.GetResult(key);
  ASSERT_TRUE(got.ok() && got->has_value()) << "L1 answers without Redis";
  got = tiered.GetResult(std::string(64, '2'));
  ASSERT_TRUE(got.ok()) << "an unreachable L2 is a miss, not an error";
  EXPECT_FALSE(got->has_value());
  ASSERT_TRUE(tiered.PutResult(std::string(64, '3'), result, blobs).ok());
  EXPECT_FALSE(client_->available());
  EXPECT_EQ(client_->outages(), 1);
  l1->reset();
  std::filesystem::remove_all(dir);
}

TEST_F(SharedTierTest, ARecordThatFailsTheSignatureCheckIsACorruptionNotAHit) {
  // A writer that can reach Redis but holds no key: its records pass the digest checks (it
  // computed the digests) and must still be refused by replicas that verify signatures.
  SharedStore writer(client_.get(), SharedStoreOptions());
  SharedStoreOptions verifying;
  verifying.verify = [](const std::string&, const v1::ActionResult& r) {
    return r.key_debug() == "vouched"
               ? absl::OkStatus()
               : absl::FailedPreconditionError("not signed by a trusted key");
  };
  SharedStore reader(client_.get(), verifying);
  const std::vector<std::string> blobs = {"compiled code"};
  v1::ActionResult good = ResultNaming(blobs);
  good.set_key_debug("vouched");
  v1::ActionResult forged = ResultNaming(blobs);
  const std::string good_key(64, '4'), forged_key(64, '5');
  ASSERT_TRUE(writer.PutResult(good_key, good, blobs).ok());
  ASSERT_TRUE(writer.PutResult(forged_key, forged, blobs).ok());

  absl::StatusOr<std::optional<v1::ActionResult>> got = reader.GetResult(good_key);
  ASSERT_TRUE(got.ok() && got->has_value());
  got = reader.GetResult(forged_key);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value()) << "a record that fails the check is a miss";
  const store::StoreStats stats = reader.Stats();
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.corruptions, 1) << "counted as a corruption, not a hit";
  got = writer.GetResult(forged_key);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value()) << "and deleted, so the next writer replaces it";
}

TEST_F(SharedTierTest, LeasesExcludeAndAreTakenOverWhenTheHolderStopsRenewing) {
  LeaseOptions options;
  options.ttl = absl::Milliseconds(600);
  options.owner_id = "first";
  auto first = std::make_unique<LeaseManager>(client_.get(), options);
  options.owner_id = "second";
  LeaseManager second(client_.get(), options);
  const std::string key(64, '9');
  const auto never = [] { return false; };

  ASSERT_EQ(first->Acquire(key, absl::InfiniteFuture(), never), Claim::kOwner);
  // Renewed while held: a waiter with a short patience gives up.
  EXPECT_EQ(second.Acquire(key, absl::Now() + absl::Milliseconds(1500), never), Claim::kGaveUp);
  // The holder reports a result: the waiter ends without compiling.
  std::atomic<bool> done{false};
  std::thread finish([&] {
    absl::SleepFor(absl::Milliseconds(200));
    done = true;
  });
  EXPECT_EQ(second.Acquire(key, absl::InfiniteFuture(), [&] { return done.load(); }),
            Claim::kDoneElsewhere);
  finish.join();
  // The holder dies (its renewer stops without releasing): the lease runs out, taken over.
  {
    // Destroying the manager stops renewal; the lease stays until it expires.
    first.reset();
  }
  const absl::Time start = absl::Now();
  EXPECT_EQ(second.Acquire(key, absl::Now() + absl::Seconds(10), never), Claim::kOwner);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  v1::GetStatsResponse stats;
  second.AddStats(&stats);
  EXPECT_EQ(stats.shared().leases_expired(), 1);
  EXPECT_EQ(stats.shared().leases_done_elsewhere(), 1);
  second.Release(key);
  EXPECT_EQ(RedisCall(redis_.port(), {"EXISTS", LeaseKey(key)})->integer, 0);

  redis_.Stop();
  EXPECT_EQ(second.Acquire(key, absl::InfiniteFuture(), never), Claim::kUncoordinated);
}

// A Redis that requires a password: the right one works (percent-encoded, and through an ACL
// user), none or a wrong one is a refusal that marks the tier down with its reason, and the
// password never shows in the client's description.
TEST_F(SharedTierTest, PasswordsAuthenticateAndRefusalsCountAsDown) {
  ASSERT_NE(RedisCall(redis_.port(), {"CONFIG", "SET", "requirepass", "s3cr:t@x"}), nullptr);
  const std::string where = absl::StrCat("127.0.0.1:", redis_.port());
  absl::StatusOr<RedisOptions> options =
      ParseRedisUrl(absl::StrCat("redis://:s3cr%3At%40x@", where));
  ASSERT_TRUE(options.ok()) << options.status();
  RedisClient good(*options);
  ASSERT_TRUE(good.Command({"SET", "k", "v"}).ok());
  absl::StatusOr<RedisReply> got = good.Command({"GET", "k"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->str, "v");
  EXPECT_TRUE(good.available());
  EXPECT_EQ(good.description(), absl::StrCat("redis://:***@", where));

  for (const std::string& url :
       {absl::StrCat("redis://", where), absl::StrCat("redis://:wrong@", where)}) {
    RedisClient refused(*ParseRedisUrl(url));
    absl::StatusOr<RedisReply> r = refused.Command({"GET", "k"});
    EXPECT_TRUE(absl::IsUnavailable(r.status())) << url << ": " << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "refuses")) << r.status();
    EXPECT_FALSE(refused.available()) << url;
    EXPECT_EQ(refused.outages(), 1);
  }

  ASSERT_TRUE(good.Command({"ACL", "SETUSER", "kiln", "on", ">pw2", "~*", "+@all"}, 0).ok());
  RedisClient user(*ParseRedisUrl(absl::StrCat("redis://kiln:pw2@", where)));
  got = user.Command({"GET", "k"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->str, "v");
}

// A holder whose lease ran out and was taken over by another replica: its release must not
// delete the new holder's lease, and its renewal must not extend it (it notices the loss).
TEST_F(SharedTierTest, AHolderThatLostItsLeaseNeitherReleasesNorRenewsTheNewOne) {
  const auto never = [] { return false; };
  auto lease_value = [&](const std::string& key) -> std::string {
    kiln::testing::RedisReplyPtr r = RedisCall(redis_.port(), {"GET", LeaseKey(key)});
    return r != nullptr && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : "";
  };
  LeaseOptions options;
  options.ttl = absl::Seconds(60);  // no renewal during the release case
  options.owner_id = "old";
  LeaseManager old_holder(client_.get(), options);
  options.owner_id = "new";
  LeaseManager new_holder(client_.get(), options);

  // Release: the old holder's lease "expires" (deleted, as the ttl would), the new one takes it.
  const std::string released(64, 'a');
  ASSERT_EQ(old_holder.Acquire(released, absl::InfiniteFuture(), never), Claim::kOwner);
  ASSERT_EQ(RedisCall(redis_.port(), {"DEL", LeaseKey(released)})->integer, 1);
  ASSERT_EQ(new_holder.Acquire(released, absl::InfiniteFuture(), never), Claim::kOwner);
  const std::string theirs = lease_value(released);
  ASSERT_TRUE(absl::StartsWith(theirs, "new:")) << theirs;
  old_holder.Release(released);
  EXPECT_EQ(lease_value(released), theirs) << "the old holder deleted the new holder's lease";
  new_holder.Release(released);
  EXPECT_EQ(RedisCall(redis_.port(), {"EXISTS", LeaseKey(released)})->integer, 0);

  // Renewal: with a short ttl the old holder's renewer runs, finds another token and gives the
  // lease up (counted as a lease error) without touching its expiry.
  options.ttl = absl::Milliseconds(600);
  options.owner_id = "old-short";
  LeaseManager renewing(client_.get(), options);
  const std::string renewed(64, 'b');
  ASSERT_EQ(renewing.Acquire(renewed, absl::InfiniteFuture(), never), Claim::kOwner);
  ASSERT_EQ(RedisCall(redis_.port(), {"DEL", LeaseKey(renewed)})->integer, 1);
  ASSERT_EQ(
      RedisCall(redis_.port(), {"SET", LeaseKey(renewed), "someone-else", "PX", "5000"})->type,
      REDIS_REPLY_STATUS);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  v1::GetStatsResponse stats;
  while (absl::Now() < deadline) {
    stats.Clear();
    renewing.AddStats(&stats);
    if (stats.shared().lease_errors() > 0) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(stats.shared().lease_errors(), 1) << "the renewer never noticed that it lost the lease";
  kiln::testing::RedisReplyPtr ttl = RedisCall(redis_.port(), {"PTTL", LeaseKey(renewed)});
  ASSERT_NE(ttl, nullptr);
  EXPECT_LE(ttl->integer, 5000);
  EXPECT_GT(ttl->integer, 600) << "someone else's lease lost its expiry";
  // Renewal would have set it to the 600 ms ttl: it kept the other holder's 5 s.
  EXPECT_EQ(lease_value(renewed), "someone-else");
  renewing.Release(renewed);  // already given up: nothing is deleted
  EXPECT_EQ(lease_value(renewed), "someone-else");
}

// Which of the cluster's nodes serves `slot`, from node 0's CLUSTER SLOTS.
int OwnerOf(kiln::testing::RedisCluster& cluster, uint16_t slot) {
  kiln::testing::RedisReplyPtr slots = RedisCall(cluster.node(0).port(), {"CLUSTER", "SLOTS"});
  for (size_t i = 0; slots != nullptr && i < slots->elements; ++i) {
    const redisReply* range = slots->element[i];
    if (range->element[0]->integer <= slot && slot <= range->element[1]->integer) {
      for (int n = 0; n < 3; ++n) {
        if (range->element[2]->element[1]->integer == cluster.node(n).port()) return n;
      }
    }
  }
  return -1;
}

std::string NodeId(kiln::testing::RedisCluster& cluster, int n) {
  kiln::testing::RedisReplyPtr id = RedisCall(cluster.node(n).port(), {"CLUSTER", "MYID"});
  return id != nullptr && id->type == REDIS_REPLY_STRING ? std::string(id->str, id->len) : "";
}

TEST(RedisClusterRoutingTest, FollowsMovedAndAskRedirections) {
  kiln::testing::RedisCluster cluster;
  ASSERT_EQ(cluster.Start(), "");
  absl::StatusOr<RedisOptions> options = ParseRedisUrl(cluster.url(/*all_nodes=*/false));
  ASSERT_TRUE(options.ok());
  RedisClient client(*options);

  // The client learns the slot map on first use and routes by it.
  for (int i = 0; i < 30; ++i) {
    const std::string key = "spread-" + std::to_string(i);
    ASSERT_TRUE(client.Command({"SET", key, "v"}).ok()) << key;
  }
  int used = 0;
  for (int n = 0; n < 3; ++n) {
    used += RedisCall(cluster.node(n).port(), {"DBSIZE"})->integer > 0 ? 1 : 0;
  }
  EXPECT_EQ(used, 3);

  // MOVED: the (empty) slot of a key moves to another master after the client learned the map.
  const std::string moved = "moved-key";
  const uint16_t slot = KeySlot(moved);
  const int from = OwnerOf(cluster, slot);
  ASSERT_GE(from, 0);
  const int to = (from + 1) % 3;
  ASSERT_TRUE(client.Command({"GET", moved}).ok());
  for (int n : {from, to, (from + 2) % 3}) {
    kiln::testing::RedisReplyPtr r =
        RedisCall(cluster.node(n).port(),
                  {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", NodeId(cluster, to)});
    ASSERT_NE(r, nullptr);
    ASSERT_NE(r->type, REDIS_REPLY_ERROR) << std::string(r->str, r->len);
  }
  absl::StatusOr<RedisReply> set = client.Command({"SET", moved, "here"});
  ASSERT_TRUE(set.ok()) << set.status();
  kiln::testing::RedisReplyPtr there = RedisCall(cluster.node(to).port(), {"GET", moved});
  ASSERT_EQ(there->type, REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(there->str, there->len), "here");

  // ASK: a slot in migration; a key the source does not hold is asked of the target.
  const std::string asked = "asked-key";
  const uint16_t ask_slot = KeySlot(asked);
  const int src = OwnerOf(cluster, ask_slot);
  ASSERT_GE(src, 0);
  const int dst = (src + 1) % 3;
  ASSERT_TRUE(client.Command({"GET", asked}).ok());
  RedisCall(cluster.node(dst).port(),
            {"CLUSTER", "SETSLOT", std::to_string(ask_slot), "IMPORTING", NodeId(cluster, src)});
  RedisCall(cluster.node(src).port(),
            {"CLUSTER", "SETSLOT", std::to_string(ask_slot), "MIGRATING", NodeId(cluster, dst)});
  set = client.Command({"SET", asked, "imported"});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(
      RedisCall(cluster.node(dst).port(), {"CLUSTER", "COUNTKEYSINSLOT", std::to_string(ask_slot)})
          ->integer,
      1);
  EXPECT_EQ(
      RedisCall(cluster.node(src).port(), {"CLUSTER", "COUNTKEYSINSLOT", std::to_string(ask_slot)})
          ->integer,
      0);
  EXPECT_TRUE(client.available());
}

// One master of three down: its slots fail fast (after the first failure, without waiting on it)
// while the other masters' keys keep working, also once the cluster itself has marked the node
// failed; the client stays available; the node back, its keys work again.
TEST(RedisClusterRoutingTest, AMasterDownTakesOutItsSlotsOnly) {
  kiln::testing::RedisCluster cluster;
  ASSERT_EQ(cluster.Start({"--cluster-require-full-coverage", "no"}), "");
  absl::StatusOr<RedisOptions> options = ParseRedisUrl(cluster.url());
  ASSERT_TRUE(options.ok());
  options->retry_interval = absl::Milliseconds(500);
  RedisClient client(*options);
  // A key on each master.
  std::array<std::string, 3> keys;
  for (int i = 0, found = 0; found < 3 && i < 1000; ++i) {
    const std::string key = "k" + std::to_string(i);
    const int owner = OwnerOf(cluster, KeySlot(key));
    if (owner >= 0 && keys[owner].empty()) {
      keys[owner] = key;
      ++found;
    }
  }
  for (const std::string& key : keys) {
    ASSERT_FALSE(key.empty());
    ASSERT_TRUE(client.Command({"SET", key, "v-" + key}).ok()) << key;
  }

  cluster.node(1).Stop();
  EXPECT_TRUE(absl::IsUnavailable(client.Command({"GET", keys[1]}).status()));
  const absl::Time start = absl::Now();
  absl::StatusOr<RedisReply> again = client.Command({"GET", keys[1]});
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(50)) << "a down node's keys fail fast";
  ASSERT_TRUE(absl::IsUnavailable(again.status()));
  EXPECT_NE(again.status().message().find(cluster.node(1).address()), absl::string_view::npos)
      << again.status();
  // The healthy masters answer now, and after the cluster has marked the node failed.
  for (absl::Duration wait : {absl::ZeroDuration(), absl::Milliseconds(2600)}) {
    absl::SleepFor(wait);
    for (int n : {0, 2}) {
      absl::StatusOr<RedisReply> got = client.Command({"GET", keys[n]});
      ASSERT_TRUE(got.ok()) << keys[n] << ": " << got.status();
      EXPECT_EQ(got->str, "v-" + keys[n]);
    }
    EXPECT_TRUE(client.available());
    EXPECT_EQ(client.nodes_down(), 1);
  }
  EXPECT_EQ(client.outages(), 1);

  ASSERT_EQ(cluster.node(1).StartAgain(), "");
  absl::SleepFor(absl::Milliseconds(600));  // past the retry interval
  absl::StatusOr<RedisReply> back = RedisReply();
  for (int i = 0; i < 50; ++i) {  // the node reloads its cluster state (up to 5 s)
    back = client.Command({"SET", keys[1], "again"});
    if (back.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(client.nodes_down(), 0);
  EXPECT_TRUE(client.available());
}

// Every node down: the client as a whole is unavailable.
TEST(RedisClusterRoutingTest, EveryNodeDownMakesTheClientUnavailable) {
  kiln::testing::RedisCluster cluster;
  ASSERT_EQ(cluster.Start(), "");
  absl::StatusOr<RedisOptions> options = ParseRedisUrl(cluster.url());
  ASSERT_TRUE(options.ok());
  RedisClient client(*options);
  ASSERT_TRUE(client.Command({"SET", "x", "1"}).ok());
  for (int n = 0; n < 3; ++n) cluster.node(n).Stop();
  for (int i = 0; i < 200 && client.available(); ++i) {
    client.Command({"GET", "key-" + std::to_string(i)}).IgnoreError();
  }
  EXPECT_FALSE(client.available());
  EXPECT_EQ(client.nodes_down(), 3);
}

// A redis-server with TLS (Debian's is built with it) on a second port beside its plaintext
// one, which the tests use to configure it; certificates from the test CA.
class RedisTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kiln-redis-tls-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(kiln::testing::MakeTestCertificates(dir_), "");
    std::string error;
    for (int attempt = 0; attempt < 5; ++attempt) {
      tls_port_ = kiln::testing::RandomLoopbackPort();
      error =
          redis_.Start({"--tls-port", std::to_string(tls_port_), "--tls-cert-file",
                        dir_ + "/server.crt", "--tls-key-file", dir_ + "/server.key",
                        "--tls-ca-cert-file", dir_ + "/ca.crt", "--tls-auth-clients", "optional"});
      if (error.empty()) break;
    }
    ASSERT_EQ(error, "");
  }
  void TearDown() override {
    redis_.Stop();
    std::filesystem::remove_all(dir_);
  }

  // rediss:// to the TLS port, trusting the test CA.
  RedisOptions Options(const std::string& userinfo = "") const {
    absl::StatusOr<RedisOptions> options =
        ParseRedisUrl(absl::StrCat("rediss://", userinfo, "127.0.0.1:", tls_port_));
    EXPECT_TRUE(options.ok()) << options.status();
    options->tls.ca_file = dir_ + "/ca.crt";
    return *options;
  }

  std::string dir_;
  int tls_port_ = 0;
  RedisProcess redis_;
};

TEST_F(RedisTlsTest, CommandsRoundTripOverTls) {
  absl::StatusOr<std::unique_ptr<RedisClient>> client = RedisClient::Create(Options());
  ASSERT_TRUE(client.ok()) << client.status();
  // Larger than one TLS record and than one read: the reply arrives in many pieces.
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  ASSERT_TRUE((*client)->Command({"SET", "big", big}).ok());
  for (int i = 0; i < 3; ++i) {  // the pooled connection is reused
    absl::StatusOr<RedisReply> got = (*client)->Command({"GET", "big"});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->str == big);
  }
  // Written over TLS, read over plaintext: the same server.
  kiln::testing::RedisReplyPtr plain = RedisCall(redis_.port(), {"STRLEN", "big"});
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->integer, static_cast<long long>(big.size()));

  RedisOptions by_name = Options();
  by_name.tls.server_name = "localhost";  // the certificate names localhost and 127.0.0.1
  RedisClient named(by_name);
  EXPECT_TRUE(named.Command({"GET", "big"}).ok());

  // With a password too: TLS carries the AUTH.
  ASSERT_NE(RedisCall(redis_.port(), {"CONFIG", "SET", "requirepass", "pw-over-tls"}), nullptr);
  RedisClient authed(Options(":pw-over-tls@"));
  EXPECT_TRUE(authed.Command({"GET", "big"}).ok());
  RedisClient unauthed(Options());
  absl::StatusOr<RedisReply> refused = unauthed.Command({"GET", "big"});
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "NOAUTH")) << refused.status();
}

// A server kilnd cannot trust, or one that is not what the URL names, or the wrong protocol on
// either side: each is Unavailable with its reason, and the tier counts as down.
TEST_F(RedisTlsTest, AnUntrustedOrMisnamedServerIsRefused) {
  struct Case {
    std::string what;
    RedisOptions options;
    std::string reason;
  };
  std::vector<Case> cases;
  RedisOptions system_cas = Options();
  system_cas.tls.ca_file.clear();  // the test CA is not among the system's
  cases.push_back({"system CAs", system_cas, "not trusted"});
  RedisOptions misnamed = Options();
  misnamed.tls.server_name = "cache.elsewhere.example";
  cases.push_back({"another name", misnamed, "not trusted for 'cache.elsewhere.example'"});
  RedisOptions plaintext_to_tls = *ParseRedisUrl(absl::StrCat("redis://127.0.0.1:", tls_port_));
  cases.push_back({"plaintext to the TLS port", plaintext_to_tls, ""});
  RedisOptions tls_to_plaintext = Options();
  tls_to_plaintext.seeds[0].port = redis_.port();
  cases.push_back({"TLS to the plaintext port", tls_to_plaintext, "TLS handshake"});
  for (Case& c : cases) {
    c.options.connect_timeout = c.options.command_timeout = absl::Milliseconds(500);
    RedisClient client(c.options);
    const absl::Time start = absl::Now();
    absl::StatusOr<RedisReply> r = client.Command({"GET", "k"});
    EXPECT_TRUE(absl::IsUnavailable(r.status())) << c.what << ": " << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), c.reason)) << c.what << ": " << r.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << c.what;
    EXPECT_FALSE(client.available()) << c.what;
  }
}

// `tls-auth-clients yes`: a client certificate is required, and the one the test CA signed works.
TEST_F(RedisTlsTest, ClientCertificatesWhenTheServerRequiresThem) {
  ASSERT_NE(RedisCall(redis_.port(), {"CONFIG", "SET", "tls-auth-clients", "yes"}), nullptr);
  RedisClient without(Options());
  absl::StatusOr<RedisReply> r = without.Command({"SET", "k", "v"});
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_FALSE(without.available());

  RedisOptions with = Options();
  with.tls.cert_file = dir_ + "/client.crt";
  with.tls.key_file = dir_ + "/client.key";
  absl::StatusOr<std::unique_ptr<RedisClient>> client = RedisClient::Create(with);
  ASSERT_TRUE(client.ok()) << client.status();
  r = (*client)->Command({"SET", "k", "v"});
  EXPECT_TRUE(r.ok()) << r.status();
}

// TLS files that cannot be used: Create says which; a client made anyway fails every call.
TEST_F(RedisTlsTest, UnusableTlsFilesAreNamed) {
  RedisOptions missing_ca = Options();
  missing_ca.tls.ca_file = dir_ + "/no-such-ca.crt";
  absl::StatusOr<std::unique_ptr<RedisClient>> c = RedisClient::Create(missing_ca);
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "no-such-ca.crt")) << c.status();

  RedisOptions half = Options();
  half.tls.cert_file = dir_ + "/client.crt";
  c = RedisClient::Create(half);
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();

  RedisOptions mismatched = Options();
  mismatched.tls.cert_file = dir_ + "/client.crt";
  mismatched.tls.key_file = dir_ + "/server.key";
  c = RedisClient::Create(mismatched);
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "server.key")) << c.status();

  RedisClient anyway(missing_ca);
  absl::StatusOr<RedisReply> r = anyway.Command({"GET", "k"});
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "no-such-ca.crt")) << r.status();
}

}  // namespace
}  // namespace kiln::shared
