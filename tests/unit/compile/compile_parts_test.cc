// The compile service's parts on their own: worker pool, deadline timer, result and failure
// caches, and the CompileResult -> ActionResult conversion.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/key/key.h"
#include "server/compile/deadline_timer.h"
#include "server/compile/result_cache.h"
#include "server/compile/result_convert.h"
#include "server/compile/worker_pool.h"

namespace kiln::compile {
namespace {

TEST(WorkerPoolTest, RunsInteractiveBeforePrewarmAndRefusesWhenFull) {
  WorkerPool pool(1, 4);
  absl::Notification release;
  absl::Notification started;
  absl::Mutex mu;
  std::vector<int> order;
  ASSERT_TRUE(pool.Submit(Priority::kInteractive,
                          [&] {
                            started.Notify();
                            release.WaitForNotification();
                          })
                  .ok());
  started.WaitForNotification();
  auto record = [&](int tag) {
    return [&, tag] {
      absl::MutexLock lock(&mu);
      order.push_back(tag);
    };
  };
  ASSERT_TRUE(pool.Submit(Priority::kPrewarm, record(1)).ok());
  ASSERT_TRUE(pool.Submit(Priority::kPrewarm, record(2)).ok());
  ASSERT_TRUE(pool.Submit(Priority::kPrewarm, record(3)).ok());
  // Prewarm may fill only three quarters of the queue.
  EXPECT_EQ(pool.Submit(Priority::kPrewarm, record(4)).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(pool.Submit(Priority::kInteractive, record(5)).ok());
  EXPECT_EQ(pool.Submit(Priority::kInteractive, record(6)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.queue_depth(), 4);
  EXPECT_EQ(pool.running(), 1);
  release.Notify();
  EXPECT_EQ(pool.Stop(absl::Now() + absl::Seconds(10)), 0);
  EXPECT_EQ(order, (std::vector<int>{5, 1, 2, 3}));
  EXPECT_EQ(pool.Submit(Priority::kInteractive, [] {}).code(), absl::StatusCode::kUnavailable);
}

TEST(WorkerPoolTest, StopDropsWhatIsStillQueuedAtTheDeadline) {
  WorkerPool pool(1, 8);
  absl::Notification release;
  absl::Notification started;
  std::atomic<int> ran{0};
  ASSERT_TRUE(pool.Submit(Priority::kInteractive,
                          [&] {
                            started.Notify();
                            release.WaitForNotification();
                          })
                  .ok());
  started.WaitForNotification();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.Submit(Priority::kInteractive, [&] { ++ran; }).ok());
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(100));
    release.Notify();
  });
  EXPECT_EQ(pool.Stop(absl::Now() + absl::Milliseconds(20)), 3);
  releaser.join();
  EXPECT_EQ(ran.load(), 0);
}

TEST(DeadlineTimerTest, FiresInTimeOrder) {
  DeadlineTimer timer;
  absl::Mutex mu;
  std::vector<int> fired;
  absl::Notification all;
  const absl::Time now = absl::Now();
  auto add = [&](int tag, absl::Duration at) {
    timer.Schedule(now + at, [&, tag] {
      absl::MutexLock lock(&mu);
      fired.push_back(tag);
      if (fired.size() == 3) all.Notify();
    });
  };
  add(3, absl::Milliseconds(90));
  add(1, absl::Milliseconds(10));
  add(2, absl::Milliseconds(50));
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(fired, (std::vector<int>{1, 2, 3}));
  EXPECT_GE(absl::Now() - now, absl::Milliseconds(90));
  EXPECT_EQ(timer.pending(), 0u);
}

TEST(DeadlineTimerTest, AnEarlierEntryWakesTheSleepingThread) {
  DeadlineTimer timer;
  absl::Notification late_fired, early_fired;
  timer.Schedule(absl::Now() + absl::Hours(1), [&] { late_fired.Notify(); });
  absl::SleepFor(absl::Milliseconds(20));  // the thread now sleeps towards the hour
  timer.Schedule(absl::Now() + absl::Milliseconds(10), [&] { early_fired.Notify(); });
  EXPECT_TRUE(early_fired.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_FALSE(late_fired.HasBeenNotified());
}

std::shared_ptr<const v1::ActionResult> ResultWithLog(const std::string& log) {
  auto r = std::make_shared<v1::ActionResult>();
  r->set_compile_log(log);
  return r;
}

TEST(ResultCacheTest, EvictsLeastRecentlyUsed) {
  ResultCache cache(2, absl::Seconds(10));
  const absl::Time t0 = absl::Now();
  cache.Put("a", ResultWithLog("a"), t0);
  cache.Put("b", ResultWithLog("b"), t0);
  ASSERT_NE(cache.Get("a", t0).result, nullptr);  // a is now the most recent
  cache.Put("c", ResultWithLog("c"), t0);         // evicts b
  EXPECT_EQ(cache.Get("b", t0).result, nullptr);
  EXPECT_EQ(cache.Get("a", t0).result->compile_log(), "a");
  EXPECT_EQ(cache.Get("c", t0).result->compile_log(), "c");
  EXPECT_EQ(cache.size(), 2u);
  cache.Erase("a");
  EXPECT_EQ(cache.Get("a", t0).result, nullptr);
  ResultCache off(0, absl::Seconds(10));
  off.Put("a", ResultWithLog("a"), t0);
  EXPECT_EQ(off.Get("a", t0).result, nullptr);
}

TEST(ResultCacheTest, OneCallerRevalidatesWhileOthersAreServed) {
  ResultCache cache(4, absl::Seconds(10));
  const absl::Time t0 = absl::Now();
  cache.Put("k", ResultWithLog("v1"), t0);
  EXPECT_FALSE(cache.Get("k", t0 + absl::Seconds(9)).revalidate);
  ResultCache::Lookup first = cache.Get("k", t0 + absl::Seconds(11));
  EXPECT_TRUE(first.revalidate);
  ASSERT_NE(first.result, nullptr);
  // While the first caller checks the store, others are answered from memory.
  ResultCache::Lookup second = cache.Get("k", t0 + absl::Seconds(11));
  EXPECT_FALSE(second.revalidate);
  EXPECT_EQ(second.result->compile_log(), "v1");
  cache.Put("k", ResultWithLog("v2"), t0 + absl::Seconds(12));
  ResultCache::Lookup after = cache.Get("k", t0 + absl::Seconds(13));
  EXPECT_FALSE(after.revalidate);
  EXPECT_EQ(after.result->compile_log(), "v2");
  EXPECT_TRUE(cache.Get("k", t0 + absl::Seconds(23)).revalidate);
}

TEST(FailureCacheTest, RemembersForTheTtl) {
  FailureCache failures(absl::Seconds(30));
  const absl::Time t0 = absl::Now();
  failures.Put("k", absl::InternalError("boom"), t0);
  EXPECT_EQ(failures.Get("k", t0 + absl::Seconds(29)).message(), "boom");
  EXPECT_TRUE(failures.Get("k", t0 + absl::Seconds(31)).ok());
  EXPECT_TRUE(failures.Get("other", t0).ok());
  FailureCache off(absl::ZeroDuration());
  off.Put("k", absl::InternalError("boom"), t0);
  EXPECT_TRUE(off.Get("k", t0).ok());
}

TEST(ResultConvertTest, DigestsSizesPlanAndOrder) {
  CompileResult compiled;
  compiled.artifacts.push_back({ArtifactKind::kSharedObject, "binary"});
  compiled.artifacts.push_back({ArtifactKind::kSource, "int main;"});
  compiled.plan.buffers.push_back({BufferRole::kInput, 0, ir::DType::kF32, {2, 3}, 24, 0, {}, {}});
  compiled.plan.buffers.push_back({BufferRole::kTemp, 0, ir::DType::kF64, {4}, 32, 64, {}, {}});
  compiled.plan.steps.push_back({});
  compiled.plan.steps.back().kernel = "k0";
  compiled.plan.steps.back().args = {0, 1};
  compiled.plan.workspace_bytes = 96;
  compiled.log = "warning: x";
  compiled.stats.num_kernels = 1;
  compiled.stats.total_ms = 12.5;
  key::ActionKey key;
  key.digest = std::string(64, 'f');
  Target target;
  target.isa = "x86-64-v3";

  ConvertedResult out = ToActionResult(compiled, key, target);
  ASSERT_EQ(out.blobs.size(), 2u);
  EXPECT_EQ(out.blobs[0], "binary");
  const v1::ActionResult& r = out.result;
  ASSERT_EQ(r.artifacts_size(), 2);
  EXPECT_EQ(r.artifacts(0).kind(), v1::SHARED_OBJECT);
  EXPECT_EQ(r.artifacts(0).digest(), key::Sha256Hex("binary"));
  EXPECT_EQ(r.artifacts(0).size(), 6);
  EXPECT_EQ(r.artifacts(1).kind(), v1::SOURCE);
  ASSERT_EQ(r.plan().buffers_size(), 2);
  EXPECT_EQ(r.plan().buffers(1).role(), v1::TEMP);
  EXPECT_EQ(r.plan().buffers(1).dtype(), v1::F64);
  EXPECT_EQ(r.plan().buffers(1).offset(), 64);
  EXPECT_EQ(r.plan().buffers(0).shape_size(), 2);
  EXPECT_EQ(r.plan().steps(0).args_size(), 2);
  EXPECT_EQ(r.plan().steps(0).grid_size(), 0);  // CPU: no launch geometry
  EXPECT_EQ(r.plan().workspace_bytes(), 96);
  EXPECT_EQ(r.plan().abi_version(), 1u);
  EXPECT_EQ(r.compile_log(), "warning: x");
  EXPECT_EQ(r.stats().total_ms(), 12.5);
  EXPECT_EQ(r.target().cpu().isa(), "x86-64-v3");
  EXPECT_EQ(FindArtifact(r, v1::SOURCE), &r.artifacts(1));
  EXPECT_EQ(FindArtifact(r, v1::CUBIN), nullptr);
}

}  // namespace
}  // namespace kiln::compile
