// CompileService against a fake compiler and a real RocksDbStore in a temporary directory.
#include "server/compile/compile_service.h"

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/key/key.h"
#include "server/store/rocksdb_store.h"
#include "tests/integration/wire_graph.h"
#include "tests/unit/compile/fake_compiler.h"

namespace kiln::compile {
namespace {

using ::kiln::testing::CpuTarget;
using ::kiln::testing::FakeCompiler;
using ::kiln::testing::MakeRequest;
using ::kiln::testing::WireGraph;

// f32[n] -> x + x: a distinct key per n, and the fake records n as the compile's tag.
v1::Graph AddGraph(int64_t n) {
  WireGraph g;
  const int x = g.Input("x", v1::F32, {n});
  g.Output(g.Op("add", {x, x}));
  return g.graph();
}

CompileServiceOptions Options(int workers, int64_t queue_size = 256,
                              absl::Duration negative_ttl = absl::Seconds(30)) {
  CompileServiceOptions o;
  o.workers = workers;
  o.queue_size = queue_size;
  o.negative_ttl = negative_ttl;
  return o;
}

absl::Time Soon(absl::Duration d = absl::Seconds(30)) { return absl::Now() + d; }

class CompileServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-cs-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    OpenStore();
  }
  void TearDown() override {
    service_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  void OpenStore(int64_t capacity_bytes = 64 << 20) {
    store::RocksDbStoreOptions o;
    o.path = dir_ + "/cache";
    o.capacity_bytes = capacity_bytes;
    auto store = store::RocksDbStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  void Start(CompileServiceOptions options = {}) {
    if (options.workers == 0) options.workers = 2;
    service_ = std::make_unique<CompileService>(&compiler_, store_.get(), options);
  }

  CompileReply CompileNow(const v1::Graph& graph, v1::Priority p = v1::INTERACTIVE,
                          absl::Time deadline = Soon()) {
    return service_->CompileAndWait(MakeRequest(graph, CpuTarget(), p), PriorityFromWire(p),
                                    deadline);
  }

  // Starts a compile without waiting; the reply lands in `out`, `done` is notified.
  void CompileAsync(const v1::Graph& graph, v1::Priority p, CompileReply* out,
                    absl::Notification* done) {
    service_->Compile(MakeRequest(graph, CpuTarget(), p), PriorityFromWire(p), Soon(),
                      [out, done](CompileReply r) {
                        *out = std::move(r);
                        done->Notify();
                      });
  }

  std::string dir_;
  FakeCompiler compiler_;
  std::unique_ptr<store::RocksDbStore> store_;
  std::unique_ptr<CompileService> service_;
};

TEST_F(CompileServiceTest, MissCompilesStoresAndThenHits) {
  Start();
  CompileReply first = CompileNow(AddGraph(8));
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_FALSE(first.cache_hit);
  EXPECT_EQ(first.handle.size(), 64u);
  ASSERT_NE(first.result, nullptr);
  ASSERT_EQ(first.result->artifacts_size(), 3);
  EXPECT_EQ(first.result->artifacts(0).kind(), v1::SHARED_OBJECT);
  EXPECT_EQ(first.result->artifacts(0).digest(), key::Sha256Hex("ELF-so-for-8"));
  EXPECT_EQ(first.result->artifacts(0).size(), 12);
  EXPECT_EQ(first.result->plan().workspace_bytes(), 64);
  EXPECT_EQ(first.result->compile_log(), "ok");
  EXPECT_FALSE(first.result->key_debug().empty());
  EXPECT_EQ(first.result->target().cpu().isa(), "x86-64-v2");

  auto blob = store_->GetBlob(first.result->artifacts(0).digest());
  ASSERT_TRUE(blob.ok() && blob->has_value());
  EXPECT_EQ(**blob, "ELF-so-for-8");

  CompileReply second = CompileNow(AddGraph(8));
  ASSERT_TRUE(second.status.ok());
  EXPECT_TRUE(second.cache_hit);
  EXPECT_EQ(second.handle, first.handle);
  EXPECT_EQ(compiler_.calls(), 1);

  v1::GetStatsResponse stats = service_->Stats();
  EXPECT_EQ(stats.compiles(), 1);
  EXPECT_EQ(stats.requests(), 2);
  EXPECT_EQ(stats.cache_hits(), 1);
  EXPECT_EQ(stats.store().entries(), 1);
}

TEST_F(CompileServiceTest, HundredConcurrentIdenticalRequestsCompileOnce) {
  Start(Options(2));
  compiler_.Close();
  std::vector<std::thread> clients;
  std::vector<CompileReply> replies(100);
  for (int i = 0; i < 100; ++i) {
    clients.emplace_back([&, i] { replies[i] = CompileNow(testing::SinCosGraph(1000)); });
  }
  // Hold the one compile until every other request has joined it.
  while (service_->Stats().joined_in_flight() < 99) absl::SleepFor(absl::Milliseconds(1));
  compiler_.Open();
  for (auto& t : clients) t.join();

  for (const CompileReply& r : replies) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.handle, replies[0].handle);
  }
  EXPECT_EQ(compiler_.calls(), 1);
  v1::GetStatsResponse stats = service_->Stats();
  EXPECT_EQ(stats.compiles(), 1);
  EXPECT_EQ(stats.joined_in_flight(), 99);
  EXPECT_EQ(stats.requests(), 100);
}

TEST_F(CompileServiceTest, FullQueueIsResourceExhausted) {
  Start(Options(1, 2));
  compiler_.Close();
  CompileReply a, b, c;
  absl::Notification a_done, b_done, c_done;
  CompileAsync(AddGraph(1), v1::INTERACTIVE, &a, &a_done);
  compiler_.AwaitStarted(1);  // the one worker is busy
  CompileAsync(AddGraph(2), v1::INTERACTIVE, &b, &b_done);
  CompileAsync(AddGraph(3), v1::INTERACTIVE, &c, &c_done);
  EXPECT_EQ(service_->Stats().queue_depth(), 2);

  CompileReply d = CompileNow(AddGraph(4));  // answered inline: no room
  EXPECT_EQ(d.status.code(), absl::StatusCode::kResourceExhausted) << d.status;
  EXPECT_EQ(service_->Stats().rejected(), 1);

  compiler_.Open();
  for (auto* n : {&a_done, &b_done, &c_done}) n->WaitForNotification();
  EXPECT_TRUE(a.status.ok() && b.status.ok() && c.status.ok());
  EXPECT_EQ(compiler_.calls(), 3);
  // The rejected request was not remembered as a failure: it compiles now.
  EXPECT_TRUE(CompileNow(AddGraph(4)).status.ok());
}

TEST_F(CompileServiceTest, DeadlineExceededButJobStillFinishesAndIsCached) {
  Start();
  compiler_.Close();
  const absl::Time start = absl::Now();
  CompileReply r = CompileNow(AddGraph(5), v1::INTERACTIVE, absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded) << r.status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(r.handle.size(), 64u);

  compiler_.Open();
  // The job runs to completion and lands in the cache: poll with Lookup.
  v1::LookupRequest lookup;
  *lookup.mutable_graph() = AddGraph(5);
  *lookup.mutable_target() = CpuTarget();
  CompileReply hit;
  for (int i = 0; i < 500; ++i) {
    hit = service_->Lookup(lookup);
    if (hit.status.ok()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(hit.status.ok()) << hit.status;
  EXPECT_EQ(hit.handle, r.handle);
  EXPECT_EQ(compiler_.calls(), 1);
}

TEST_F(CompileServiceTest, JobNobodyWaitsForIsCancelled) {
  compiler_.HonourCancel();
  Start();
  compiler_.Close();
  CompileReply r = CompileNow(AddGraph(6), v1::INTERACTIVE, absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded) << r.status;
  // The only caller is gone: the compiler is told to stop.
  for (int i = 0; i < 200 && compiler_.cancelled() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(compiler_.cancelled(), 1);
  // A later request starts afresh instead of joining the abandoned job.
  compiler_.Open();
  CompileReply again = CompileNow(AddGraph(6));
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(again.handle, r.handle);
  EXPECT_FALSE(again.joined);
}

TEST_F(CompileServiceTest, JobGoesOnWhileAnotherCallerWaits) {
  compiler_.HonourCancel();
  Start();
  compiler_.Close();
  CompileReply patient;
  absl::Notification patient_done;
  CompileAsync(AddGraph(7), v1::INTERACTIVE, &patient, &patient_done);
  CompileReply hasty =
      CompileNow(AddGraph(7), v1::INTERACTIVE, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(hasty.status.code(), absl::StatusCode::kDeadlineExceeded) << hasty.status;
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(compiler_.cancelled(), 0);
  compiler_.Open();
  patient_done.WaitForNotification();
  EXPECT_TRUE(patient.status.ok()) << patient.status;
}

TEST_F(CompileServiceTest, PastDeadlineAnswersAtOnce) {
  Start();
  CompileReply r = CompileNow(AddGraph(6), v1::INTERACTIVE, absl::Now() - absl::Seconds(1));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(compiler_.calls(), 0);
}

TEST_F(CompileServiceTest, FailureIsNegativelyCached) {
  Start(Options(2, 256, absl::Milliseconds(300)));
  compiler_.Fail(absl::InternalError("g++: error: boom"));
  CompileReply first = CompileNow(AddGraph(7));
  EXPECT_EQ(first.status.code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(first.negative_hit);
  CompileReply second = CompileNow(AddGraph(7));
  EXPECT_EQ(second.status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(second.negative_hit);
  EXPECT_EQ(second.status.message(), first.status.message());
  EXPECT_EQ(compiler_.calls(), 1);
  v1::GetStatsResponse stats = service_->Stats();
  EXPECT_EQ(stats.compile_failures(), 1);
  EXPECT_EQ(stats.negative_hits(), 1);
  EXPECT_EQ(stats.store().entries(), 0);

  // Once the failure expires the graph is tried again.
  absl::SleepFor(absl::Milliseconds(350));
  compiler_.Fail(absl::OkStatus());
  CompileReply third = CompileNow(AddGraph(7));
  EXPECT_TRUE(third.status.ok()) << third.status;
  EXPECT_EQ(compiler_.calls(), 2);
}

TEST_F(CompileServiceTest, InvalidArgumentFromTheCompilerIsNotRemembered) {
  Start();
  compiler_.Fail(absl::InvalidArgumentError("node 1 (matmul): extern ops are not compiled"));
  EXPECT_EQ(CompileNow(AddGraph(9)).status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CompileNow(AddGraph(9)).status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(compiler_.calls(), 2);
}

TEST_F(CompileServiceTest, InteractiveRunsAheadOfQueuedPrewarm) {
  Start(Options(1));
  compiler_.Close();
  std::vector<CompileReply> r(4);
  std::vector<absl::Notification> done(4);
  CompileAsync(AddGraph(1), v1::INTERACTIVE, &r[0], &done[0]);
  compiler_.AwaitStarted(1);
  CompileAsync(AddGraph(2), v1::PREWARM, &r[1], &done[1]);
  CompileAsync(AddGraph(3), v1::PREWARM, &r[2], &done[2]);
  CompileAsync(AddGraph(4), v1::INTERACTIVE, &r[3], &done[3]);
  compiler_.Open();
  for (auto& n : done) n.WaitForNotification();
  for (auto& reply : r) EXPECT_TRUE(reply.status.ok()) << reply.status;
  EXPECT_EQ(compiler_.order(), (std::vector<int64_t>{1, 4, 2, 3}));
}

TEST_F(CompileServiceTest, InteractiveJoiningAPrewarmJobPromotesIt) {
  Start(Options(1));
  compiler_.Close();
  std::vector<CompileReply> r(4);
  std::vector<absl::Notification> done(4);
  CompileAsync(AddGraph(1), v1::INTERACTIVE, &r[0], &done[0]);
  compiler_.AwaitStarted(1);
  CompileAsync(AddGraph(2), v1::PREWARM, &r[1], &done[1]);
  CompileAsync(AddGraph(3), v1::PREWARM, &r[2], &done[2]);
  CompileAsync(AddGraph(3), v1::INTERACTIVE, &r[3], &done[3]);  // joins, and jumps the queue
  compiler_.Open();
  for (auto& n : done) n.WaitForNotification();
  EXPECT_EQ(compiler_.order(), (std::vector<int64_t>{1, 3, 2}));
  EXPECT_TRUE(r[3].joined);
  EXPECT_EQ(r[2].handle, r[3].handle);
}

TEST_F(CompileServiceTest, InvalidGraphIsInvalidArgumentAndNothingIsCached) {
  Start();
  WireGraph g;
  const int x = g.Input("x", v1::F32, {4});
  g.Output(g.Op("frobnicate", {x}, {}, "bad_node"));
  CompileReply r = CompileNow(g.graph());
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("frobnicate"), absl::string_view::npos) << r.status;
  EXPECT_TRUE(r.handle.empty());
  // Asked again, it is rejected again by validation, not by a cache.
  EXPECT_EQ(CompileNow(g.graph()).status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(compiler_.calls(), 0);
  v1::GetStatsResponse stats = service_->Stats();
  EXPECT_EQ(stats.store().entries(), 0);
  EXPECT_EQ(stats.negative_hits(), 0);
  EXPECT_EQ(stats.compiles(), 0);
}

TEST_F(CompileServiceTest, UnknownTargetIsInvalidArgument) {
  Start();
  CompileReply r = service_->CompileAndWait(MakeRequest(AddGraph(2), CpuTarget("x86-64-v9")),
                                            Priority::kInteractive, Soon());
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(compiler_.calls(), 0);
}

TEST_F(CompileServiceTest, KeyIsStableAcrossNodeOrderAndNames) {
  Start();
  // out = sin(x) + cos(y), the two independent nodes added in either order.
  WireGraph a;
  {
    const int x = a.Input("x", v1::F32, {16});
    const int y = a.Input("y", v1::F32, {16});
    const int s = a.Op("sin", {x}, {}, "first");
    const int c = a.Op("cos", {y}, {}, "second");
    a.Output(a.Op("add", {s, c}));
  }
  WireGraph b;
  {
    const int x = b.Input("input_x", v1::F32, {16});
    const int y = b.Input("input_y", v1::F32, {16});
    const int c = b.Op("cos", {y}, {}, "other_name");
    const int s = b.Op("sin", {x});
    b.Output(b.Op("add", {s, c}, {}, "sum"));
  }
  CompileReply ra = CompileNow(a.graph());
  CompileReply rb = CompileNow(b.graph());
  ASSERT_TRUE(ra.status.ok()) << ra.status;
  ASSERT_TRUE(rb.status.ok()) << rb.status;
  EXPECT_EQ(ra.handle, rb.handle);
  EXPECT_TRUE(rb.cache_hit);
  EXPECT_EQ(compiler_.calls(), 1);

  // A different target is a different key.
  CompileReply rc = service_->CompileAndWait(MakeRequest(a.graph(), CpuTarget("x86-64-v3")),
                                             Priority::kInteractive, Soon());
  ASSERT_TRUE(rc.status.ok());
  EXPECT_NE(rc.handle, ra.handle);
}

TEST_F(CompileServiceTest, ResultsSurviveARestartOnTheSameStore) {
  Start();
  CompileReply first = CompileNow(AddGraph(11));
  ASSERT_TRUE(first.status.ok());
  service_.reset();
  store_.reset();
  OpenStore();
  Start();
  CompileReply again = CompileNow(AddGraph(11));
  ASSERT_TRUE(again.status.ok());
  EXPECT_TRUE(again.cache_hit);
  EXPECT_EQ(again.handle, first.handle);
  EXPECT_EQ(compiler_.calls(), 1);
  auto by_handle = service_->GetResult(first.handle);
  ASSERT_TRUE(by_handle.ok());
  EXPECT_EQ((*by_handle)->artifacts(0).digest(), first.result->artifacts(0).digest());
}

TEST_F(CompileServiceTest, MemoryFrontStopsServingWhatTheStoreEvicted) {
  store_.reset();
  OpenStore(/*capacity_bytes=*/1200);
  CompileServiceOptions options = Options(1);
  options.memory_cache_ttl = absl::Milliseconds(50);
  Start(options);
  CompileReply a = CompileNow(AddGraph(1));
  ASSERT_TRUE(a.status.ok()) << a.status;
  // Fill the small store until `a` is evicted from it.
  for (int n = 2; n < 20 && service_->Stats().store().evictions() == 0; ++n) {
    ASSERT_TRUE(CompileNow(AddGraph(n)).status.ok());
  }
  ASSERT_GT(service_->Stats().store().evictions(), 0);
  absl::SleepFor(absl::Milliseconds(60));
  // Past the revalidation interval the store is asked again, and `a` is gone.
  auto gone = service_->GetResult(a.handle);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  const int calls = compiler_.calls();
  CompileReply again = CompileNow(AddGraph(1));
  ASSERT_TRUE(again.status.ok());
  EXPECT_FALSE(again.cache_hit);
  EXPECT_EQ(compiler_.calls(), calls + 1);
}

// Lookups by request key: only keys kilnd remembered answer, the index is bounded (least
// recently used out first), and a remembered key whose result left the store is a miss.
TEST_F(CompileServiceTest, LookupByRequestKeyAnswersRememberedKeysOnly) {
  CompileServiceOptions o = Options(2);
  o.request_index_entries = 2;
  Start(o);
  auto by_key = [&](const std::string& request_key) {
    v1::LookupRequest lookup;
    lookup.set_request_key(request_key);
    return service_->Lookup(lookup);
  };
  const std::string k1(64, '1'), k2(64, '2'), k3(64, '3');
  EXPECT_TRUE(absl::IsNotFound(by_key(k1).status));
  EXPECT_TRUE(absl::IsInvalidArgument(by_key("not-a-key").status));

  const CompileReply a = CompileNow(AddGraph(21));
  const CompileReply b = CompileNow(AddGraph(22));
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  service_->RememberRequest(k1, a.handle);
  service_->RememberRequest(k2, b.handle);
  CompileReply hit = by_key(k1);
  ASSERT_TRUE(hit.status.ok()) << hit.status;
  EXPECT_TRUE(hit.cache_hit);
  EXPECT_EQ(hit.handle, a.handle);
  ASSERT_NE(hit.result, nullptr);
  EXPECT_EQ(hit.result->artifacts(0).digest(), a.result->artifacts(0).digest());
  EXPECT_EQ(by_key(k2).handle, b.handle);

  service_->RememberRequest(k3, a.handle);  // k1 is now the least recently used: it goes
  EXPECT_TRUE(absl::IsNotFound(by_key(k1).status));
  EXPECT_EQ(by_key(k2).handle, b.handle);
  EXPECT_EQ(by_key(k3).handle, a.handle);

  service_->RememberRequest(k2, std::string(64, 'f'));  // an action key the store lacks
  EXPECT_TRUE(absl::IsNotFound(by_key(k2).status));
}

TEST_F(CompileServiceTest, GetResultChecksTheHandle) {
  Start();
  EXPECT_EQ(service_->GetResult("not-a-key").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_->GetResult(std::string(64, 'a')).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CompileServiceTest, ShutdownAnswersQueuedWaitersUnavailable) {
  Start(Options(1));
  compiler_.Close();
  CompileReply running, queued;
  absl::Notification running_done, queued_done;
  CompileAsync(AddGraph(1), v1::INTERACTIVE, &running, &running_done);
  compiler_.AwaitStarted(1);
  CompileAsync(AddGraph(2), v1::INTERACTIVE, &queued, &queued_done);
  std::thread opener([&] {
    absl::SleepFor(absl::Milliseconds(200));
    compiler_.Open();
  });
  // The drain deadline passes while the first job is held: the queued one is dropped, the
  // running one still finishes.
  service_->Shutdown(absl::Now() + absl::Milliseconds(50));
  opener.join();
  running_done.WaitForNotification();
  queued_done.WaitForNotification();
  EXPECT_TRUE(running.status.ok()) << running.status;
  EXPECT_EQ(queued.status.code(), absl::StatusCode::kUnavailable) << queued.status;
  EXPECT_EQ(CompileNow(AddGraph(3)).status.code(), absl::StatusCode::kUnavailable);
  // Hits are still served while shutting down.
  EXPECT_TRUE(CompileNow(AddGraph(1)).cache_hit);
}

}  // namespace
}  // namespace kiln::compile
