// One build's commands several at once: they overlap, the slots bound them kilnd-wide, and a
// failure stops what has not started and is reported as a sequential build would.
#include "server/ext/build_jobs.h"

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace kiln::ext {
namespace {

TEST(RunAll, RunsCommandsAtOnceUpToTheLanes) {
  // Each of the first three calls waits for the other two: they finish only if run at once.
  absl::Mutex mu;
  int arrived = 0;
  std::atomic<int> running{0}, most{0};
  std::vector<std::string> logs;
  absl::Status s = RunAll(
      6, 3,
      [&](int i, std::string* log) -> absl::Status {
        int now = running.fetch_add(1) + 1;
        for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
        }
        if (i < 3) {
          absl::MutexLock lock(&mu);
          ++arrived;
          if (!mu.AwaitWithTimeout(absl::Condition(
                                       +[](int* n) { return *n >= 3; }, &arrived),
                                   absl::Seconds(10))) {
            running.fetch_sub(1);
            return absl::DeadlineExceededError(absl::StrCat("command ", i, " ran alone"));
          }
        }
        running.fetch_sub(1);
        *log = absl::StrCat("out", i, ";");
        return absl::OkStatus();
      },
      &logs);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(most.load(), 3);
  EXPECT_EQ(absl::StrJoin(logs, ""), "out0;out1;out2;out3;out4;out5;");
}

TEST(RunAll, OneLaneRunsInOrderOnTheCallersThread) {
  std::vector<int> order;
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::string> logs;
  ASSERT_TRUE(RunAll(
                  4, 1,
                  [&](int i, std::string*) {
                    EXPECT_EQ(std::this_thread::get_id(), caller);
                    order.push_back(i);
                    return absl::OkStatus();
                  },
                  &logs)
                  .ok());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

TEST(RunAll, ReportsTheFirstFailureInOrderAndStartsNoMore) {
  // Command 2 fails at once, command 1 later: the answer is command 1's, as if run in order;
  // nothing after them starts.
  std::atomic<int> started{0};
  absl::Notification two_failed;
  std::vector<std::string> logs;
  absl::Status s = RunAll(
      20, 2,
      [&](int i, std::string*) -> absl::Status {
        started.fetch_add(1);
        if (i == 1) {
          two_failed.WaitForNotificationWithTimeout(absl::Seconds(10));
          return absl::InvalidArgumentError("one");
        }
        if (i == 2) {
          two_failed.Notify();
          return absl::InvalidArgumentError("two");
        }
        return absl::OkStatus();
      },
      &logs);
  EXPECT_EQ(s.message(), "one");
  EXPECT_EQ(started.load(), 3);
  EXPECT_EQ(logs.size(), 20u);
}

TEST(JobSlots, BoundCommandsAcrossCallers) {
  JobSlots slots(2);
  std::atomic<int> held{0}, most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < 50; ++k) {
        slots.Acquire();
        int now = held.fetch_add(1) + 1;
        for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
        }
        std::this_thread::yield();
        held.fetch_sub(1);
        slots.Release();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(most.load(), 2);
  EXPECT_EQ(slots.size(), 2);
}

}  // namespace
}  // namespace kiln::ext
