// Cluster mode end to end: real redis-server processes (standalone, and a 3-master Redis
// Cluster) on loopback ports, and two or three real kilnd replicas sharing them with
// --shared-cache. Every process is killed when its test ends, passed or failed.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "httplib.h"
#include "kernels/key/digest.h"
#include "server/shared/l2_records.h"
#include "tests/integration/kilnd_process.h"
#include "tests/integration/redis_process.h"
#include "tests/integration/wire_graph.h"

namespace kiln::testing {
namespace {

using Clock = std::chrono::steady_clock;

// A kilnd replica with a private L1 and the shared tier at `url`.
class Replica {
 public:
  std::string Start(const std::string& cache_dir, const std::string& url,
                    std::vector<std::string> extra = {}) {
    extra.push_back("--shared-cache=" + url);
    extra.push_back("--workers=2");
    const bool quiet = std::getenv("KILND_LOG_LEVEL") == nullptr;
    std::string error = process_.Start(cache_dir, std::move(extra), quiet);
    if (error.empty()) stub_ = process_.Stub();
    return error;
  }

  grpc::Status Compile(const v1::CompileRequest& request, v1::CompileResponse* response,
                       int deadline_s = 120) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_s));
    return stub_->Compile(&ctx, request, response);
  }

  v1::GetStatsResponse Stats() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::GetStatsResponse stats;
    grpc::Status s = stub_->GetStats(&ctx, v1::GetStatsRequest(), &stats);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return stats;
  }

  // The artifact's bytes, streamed; empty (and a test failure) when the fetch fails.
  std::string Fetch(const std::string& digest) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::FetchArtifactRequest request;
    request.set_digest(digest);
    std::unique_ptr<grpc::ClientReader<v1::ArtifactChunk>> reader =
        stub_->FetchArtifact(&ctx, request);
    std::string bytes;
    v1::ArtifactChunk chunk;
    while (reader->Read(&chunk)) bytes += chunk.data();
    grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << "fetch " << digest << ": " << s.error_message();
    return s.ok() ? bytes : std::string();
  }

  KilndProcess& process() { return process_; }

 private:
  KilndProcess process_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
};

// A request no other test (or earlier run against the same Redis) asks for.
v1::CompileRequest FreshRequest(double tag) { return MakeRequest(SinCosGraph(1024, tag)); }

std::string ValueOf(int port, const std::string& key) {
  RedisReplyPtr r = RedisCall(port, {"GET", key});
  return r != nullptr && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : "";
}

void SetValue(int port, const std::string& key, const std::string& value) {
  RedisReplyPtr r = RedisCall(port, {"SET", key, value});
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->type, REDIS_REPLY_STATUS);
}

class SharedCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kiln-shared-it-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ASSERT_EQ(redis_.Start(), "");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Dir(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
  RedisProcess redis_;
};

TEST_F(SharedCacheTest, CompileOnOneReplicaIsAnL2HitOnAnother) {
  Replica a, b;
  ASSERT_EQ(a.Start(Dir("a"), redis_.url()), "");
  ASSERT_EQ(b.Start(Dir("b"), redis_.url(), {"--metrics-listen=127.0.0.1:0"}), "");
  const v1::CompileRequest request = FreshRequest(1.25);

  v1::CompileResponse first, second;
  grpc::Status s = a.Compile(request, &first);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(first.cache_hit());
  s = b.Compile(request, &second);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(second.cache_hit());
  EXPECT_EQ(first.handle(), second.handle());

  ASSERT_GT(first.result().artifacts_size(), 0);
  ASSERT_EQ(first.result().artifacts_size(), second.result().artifacts_size());
  for (int i = 0; i < first.result().artifacts_size(); ++i) {
    const std::string& digest = first.result().artifacts(i).digest();
    EXPECT_EQ(digest, second.result().artifacts(i).digest());
    const std::string from_a = a.Fetch(digest);
    const std::string from_b = b.Fetch(digest);
    EXPECT_FALSE(from_b.empty());
    EXPECT_EQ(from_a, from_b) << "artifact " << i << " differs between replicas";
    EXPECT_EQ(key::Sha256Hex(from_b), digest);
  }

  const v1::GetStatsResponse sa = a.Stats(), sb = b.Stats();
  EXPECT_EQ(sa.compiles(), 1);
  EXPECT_EQ(sb.compiles(), 0);
  EXPECT_TRUE(sb.shared().enabled());
  EXPECT_TRUE(sb.shared().available());
  EXPECT_GE(sb.shared().hits(), 1);
  EXPECT_GT(sa.shared().bytes_written(), 0);
  EXPECT_GT(sb.shared().bytes_read(), 0);
  EXPECT_EQ(sa.shared().leases_taken(), 1);
  int64_t timed = 0;
  for (int64_t c : sb.shared().latency_counts()) timed += c;
  EXPECT_GT(timed, 0);

  // /metrics says the same, with the latency as a cumulative Prometheus histogram.
  const std::string& out = b.process().startup_output();
  const std::string marker = "kilnd metrics on 127.0.0.1:";
  const size_t at = out.find(marker);
  ASSERT_NE(at, std::string::npos) << out;
  httplib::Client http("127.0.0.1", std::atoi(out.c_str() + at + marker.size()));
  httplib::Result page = http.Get("/metrics");
  ASSERT_TRUE(page) << "no answer from /metrics";
  const std::string& text = page->body;
  EXPECT_NE(text.find("\nkiln_shared_up 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nkiln_shared_hits_total " + std::to_string(sb.shared().hits()) + "\n"),
            std::string::npos);
  EXPECT_NE(text.find("# TYPE kiln_shared_latency_seconds histogram"), std::string::npos);
  const std::string all_bucket = "kiln_shared_latency_seconds_bucket{le=\"+Inf\"} ";
  const size_t inf = text.find(all_bucket);
  ASSERT_NE(inf, std::string::npos);
  EXPECT_GE(std::atoll(text.c_str() + inf + all_bucket.size()), timed);

  // The L2 hit filled B's L1: restarted on the same cache with Redis gone, B still hits.
  redis_.Stop();
  ASSERT_EQ(b.process().Stop(), 0);
  Replica b_again;
  ASSERT_EQ(b_again.Start(Dir("b"), redis_.url()), "");
  v1::CompileResponse third;
  ASSERT_TRUE(b_again.Compile(request, &third).ok());
  EXPECT_TRUE(third.cache_hit());
  EXPECT_EQ(b_again.Stats().compiles(), 0);
}

TEST_F(SharedCacheTest, SixtyFourConcurrentRequestsOnThreeReplicasCompileOnce) {
  Replica replicas[3];
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(replicas[i].Start(Dir("r" + std::to_string(i)), redis_.url()), "");
  }
  const v1::CompileRequest request = FreshRequest(2.5);
  std::atomic<int> ok{0}, go{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 64; ++i) {
    clients.emplace_back([&, i] {
      while (go.load() == 0) std::this_thread::yield();
      v1::CompileResponse response;
      grpc::Status s = replicas[i % 3].Compile(request, &response, 120);
      if (s.ok() && response.result().artifacts_size() > 0) ok.fetch_add(1);
    });
  }
  go.store(1);
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(ok.load(), 64);
  int64_t compiles = 0, waited = 0;
  for (Replica& r : replicas) {
    const v1::GetStatsResponse s = r.Stats();
    compiles += s.compiles();
    waited += s.shared().leases_waited() + s.joined_in_flight();
  }
  EXPECT_EQ(compiles, 1) << "identical requests on three replicas must compile once";
  EXPECT_GT(waited, 0);
}

TEST_F(SharedCacheTest, KillingTheLeaseHolderHandsTheCompileToAnotherReplica) {
  // A real g++ behind a pause, so the compile is still running when its replica is killed.
  const std::string slow = Dir("slow-g++");
  {
    std::ofstream script(slow);
    script << "#!/bin/sh\ncase \" $* \" in *\" kernel.cc \"*) sleep 3;; esac\nexec g++ \"$@\"\n";
  }
  std::filesystem::permissions(slow, std::filesystem::perms::owner_all);
  const std::vector<std::string> args = {"--host-compiler=" + slow, "--lease-ttl-s=1"};
  Replica a, b, c;
  ASSERT_EQ(a.Start(Dir("a"), redis_.url(), args), "");
  ASSERT_EQ(b.Start(Dir("b"), redis_.url(), args), "");
  ASSERT_EQ(c.Start(Dir("c"), redis_.url(), args), "");
  const v1::CompileRequest request = FreshRequest(3.75);

  std::thread on_a([&] {
    v1::CompileResponse ignored;
    a.Compile(request, &ignored, 60);  // fails when A dies; that is the point
  });
  // Wait until A holds the lease (its owner id carries its pid).
  const std::string mark = ":" + std::to_string(a.process().pid()) + ":";
  bool held = false;
  for (auto until = Clock::now() + std::chrono::seconds(30); !held && Clock::now() < until;) {
    RedisReplyPtr keys = RedisCall(redis_.port(), {"KEYS", "kiln:v1:lease:*"});
    if (keys != nullptr && keys->type == REDIS_REPLY_ARRAY && keys->elements == 1) {
      held = ValueOf(redis_.port(), std::string(keys->element[0]->str, keys->element[0]->len))
                 .find(mark) != std::string::npos;
    }
    if (!held) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(held) << "replica A never took the lease";

  const int kDeadlineS = 45;
  std::atomic<int> ok{0};
  std::vector<std::thread> waiters;
  const auto start = Clock::now();
  for (Replica* r : {&b, &c, &b, &c}) {
    waiters.emplace_back([&, r] {
      v1::CompileResponse response;
      if (r->Compile(request, &response, kDeadlineS).ok()) ok.fetch_add(1);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(WIFSIGNALED(a.process().Stop(SIGKILL)));
  for (std::thread& t : waiters) t.join();
  on_a.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(kDeadlineS));

  const v1::GetStatsResponse sb = b.Stats(), sc = c.Stats();
  EXPECT_EQ(sb.compiles() + sc.compiles(), 1) << "one survivor compiles, the other waits";
  EXPECT_EQ(sb.shared().leases_expired() + sc.shared().leases_expired(), 1);
  EXPECT_GE(sb.shared().leases_waited() + sc.shared().leases_waited(), 1);
}

TEST_F(SharedCacheTest, CorruptOrTruncatedValuesInRedisAreNeverServed) {
  Replica a;
  ASSERT_EQ(a.Start(Dir("a"), redis_.url()), "");
  std::vector<v1::CompileRequest> requests;
  std::vector<v1::CompileResponse> answers(4);
  for (int i = 0; i < 4; ++i) {
    requests.push_back(FreshRequest(4.0 + i));
    ASSERT_TRUE(a.Compile(requests[i], &answers[i]).ok());
  }
  auto blob_key = [&](int i) { return shared::BlobKey(answers[i].result().artifacts(0).digest()); };
  // 0: garbage in place of a blob. 1: a blob cut short. 2: a blob with one byte changed.
  // 3: an action record cut short.
  SetValue(redis_.port(), blob_key(0), "not a blob at all");
  std::string blob = ValueOf(redis_.port(), blob_key(1));
  ASSERT_GT(blob.size(), 100u);
  SetValue(redis_.port(), blob_key(1), blob.substr(0, blob.size() - 100));
  blob = ValueOf(redis_.port(), blob_key(2));
  blob[blob.size() / 2] ^= 0x5a;
  SetValue(redis_.port(), blob_key(2), blob);
  const std::string record_key = shared::ActionKey(answers[3].handle());
  const std::string record = ValueOf(redis_.port(), record_key);
  ASSERT_FALSE(record.empty());
  SetValue(redis_.port(), record_key, record.substr(0, record.size() - 7));

  Replica b;
  ASSERT_EQ(b.Start(Dir("b"), redis_.url()), "");
  for (int i = 0; i < 4; ++i) {
    v1::CompileResponse response;
    ASSERT_TRUE(b.Compile(requests[i], &response).ok());
    EXPECT_FALSE(response.cache_hit()) << "request " << i << " was served from a bad value";
    for (const v1::Artifact& art : response.result().artifacts()) {
      EXPECT_EQ(key::Sha256Hex(b.Fetch(art.digest())), art.digest());
    }
  }
  const v1::GetStatsResponse sb = b.Stats();
  EXPECT_EQ(sb.compiles(), 4);
  EXPECT_EQ(sb.shared().corruptions(), 4);

  // B's compiles replaced the bad values: a third replica now hits all four.
  Replica c;
  ASSERT_EQ(c.Start(Dir("c"), redis_.url()), "");
  for (int i = 0; i < 4; ++i) {
    v1::CompileResponse response;
    ASSERT_TRUE(c.Compile(requests[i], &response).ok());
    EXPECT_TRUE(response.cache_hit()) << "request " << i;
  }
  EXPECT_EQ(c.Stats().compiles(), 0);
}

TEST_F(SharedCacheTest, AResultWhoseBlobWasEvictedIsAMiss) {
  Replica a, b;
  ASSERT_EQ(a.Start(Dir("a"), redis_.url()), "");
  ASSERT_EQ(b.Start(Dir("b"), redis_.url()), "");
  const v1::CompileRequest request = FreshRequest(5.5);
  v1::CompileResponse first;
  ASSERT_TRUE(a.Compile(request, &first).ok());
  // What maxmemory eviction does: the blob goes, the record naming it stays.
  RedisReplyPtr del =
      RedisCall(redis_.port(), {"DEL", shared::BlobKey(first.result().artifacts(0).digest())});
  ASSERT_NE(del, nullptr);
  ASSERT_EQ(del->integer, 1);
  ASSERT_FALSE(ValueOf(redis_.port(), shared::ActionKey(first.handle())).empty());

  v1::CompileResponse second;
  ASSERT_TRUE(b.Compile(request, &second).ok());
  EXPECT_FALSE(second.cache_hit());
  const v1::GetStatsResponse sb = b.Stats();
  EXPECT_EQ(sb.compiles(), 1);
  // Each look at the record (the request, the job, the lease) finds it incomplete.
  EXPECT_GE(sb.shared().incomplete(), 1);
  EXPECT_EQ(sb.shared().corruptions(), 0);
}

TEST_F(SharedCacheTest, RedisDownIsNotAnOutageAndItsReturnIsNoticed) {
  Replica a, b;
  ASSERT_EQ(a.Start(Dir("a"), redis_.url()), "");
  ASSERT_EQ(b.Start(Dir("b"), redis_.url()), "");
  redis_.Stop();

  const v1::CompileRequest while_down = FreshRequest(6.25);
  const auto start = Clock::now();
  v1::CompileResponse r;
  ASSERT_TRUE(a.Compile(while_down, &r).ok());
  EXPECT_FALSE(r.cache_hit());
  ASSERT_TRUE(a.Compile(while_down, &r).ok());
  EXPECT_TRUE(r.cache_hit()) << "L1 still answers";
  ASSERT_TRUE(b.Compile(while_down, &r).ok()) << "B compiles locally";
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(60));
  v1::GetStatsResponse sa = a.Stats();
  EXPECT_FALSE(sa.shared().available());
  EXPECT_EQ(sa.shared().outages(), 1);
  EXPECT_GT(sa.shared().errors(), 0);
  EXPECT_EQ(b.Stats().compiles(), 1);

  ASSERT_EQ(redis_.StartAgain(), "");
  // The clients retry after their 1 s back-off; the first call after it reconnects.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const v1::CompileRequest after = FreshRequest(6.5);
  ASSERT_TRUE(a.Compile(after, &r).ok());
  EXPECT_FALSE(r.cache_hit());
  EXPECT_TRUE(a.Stats().shared().available());
  ASSERT_TRUE(b.Compile(after, &r).ok());
  EXPECT_TRUE(r.cache_hit()) << "B reads A's compile from Redis again";
  EXPECT_EQ(b.Stats().compiles(), 1);
}

TEST_F(SharedCacheTest, AHungRedisCostsATimeoutNotAnOutage) {
  Replica a, b;
  ASSERT_EQ(a.Start(Dir("a"), redis_.url()), "");
  ASSERT_EQ(b.Start(Dir("b"), redis_.url()), "");
  // Stopped, not dead: connections are accepted by the kernel but nothing answers, so every
  // call must end by its timeout.
  ASSERT_EQ(kill(redis_.pid(), SIGSTOP), 0);
  const v1::CompileRequest while_hung = FreshRequest(8.25);
  v1::CompileResponse r;
  const auto start = Clock::now();
  grpc::Status s = a.Compile(while_hung, &r, 60);
  kill(redis_.pid(), SIGCONT);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(r.cache_hit());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  const v1::GetStatsResponse sa = a.Stats();
  EXPECT_EQ(sa.compiles(), 1);
  EXPECT_GE(sa.shared().outages(), 1);
  EXPECT_GE(sa.shared().errors(), 1);

  // Redis answers again: after the back-off, A writes through and B reads it.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const v1::CompileRequest after = FreshRequest(8.5);
  ASSERT_TRUE(a.Compile(after, &r).ok());
  ASSERT_TRUE(b.Compile(after, &r).ok());
  EXPECT_TRUE(r.cache_hit());
  EXPECT_EQ(b.Stats().compiles(), 0);
}

TEST(SharedCacheClusterTest, ThreeMasterClusterSharesResults) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kiln-cluster-it-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  RedisCluster cluster;
  ASSERT_EQ(cluster.Start(), "");
  Replica a, b;
  ASSERT_EQ(a.Start((dir / "a").string(), cluster.url()), "");
  // B knows one node only and learns the slot map from it (CLUSTER SLOTS).
  ASSERT_EQ(b.Start((dir / "b").string(), cluster.url(/*all_nodes=*/false)), "");
  std::vector<v1::CompileRequest> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(FreshRequest(7.0 + i));
    v1::CompileResponse r;
    ASSERT_TRUE(a.Compile(requests.back(), &r).ok());
  }
  for (const v1::CompileRequest& request : requests) {
    v1::CompileResponse r;
    ASSERT_TRUE(b.Compile(request, &r).ok());
    EXPECT_TRUE(r.cache_hit());
  }
  EXPECT_EQ(b.Stats().compiles(), 0);
  EXPECT_EQ(b.Stats().shared().hits(), 4);
  int nodes_used = 0;
  for (int i = 0; i < 3; ++i) {
    RedisReplyPtr size = RedisCall(cluster.node(i).port(), {"DBSIZE"});
    ASSERT_NE(size, nullptr);
    nodes_used += size->integer > 0 ? 1 : 0;
  }
  EXPECT_GE(nodes_used, 2) << "keys should spread over the masters";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln::testing
