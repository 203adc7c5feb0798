// DeadlineTimer: runs callbacks at given times on one background thread.
//
// The compile service uses it to answer a waiter DEADLINE_EXCEEDED when its request deadline
// passes while the job it waits on is still queued or compiling; the job itself goes on and
// its result is still cached. Callbacks must be short and must not block: they run one after
// another on the timer's thread. A callback whose time is already past when it is scheduled
// runs on the timer thread soon after, never inline.
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kiln::compile {

class DeadlineTimer {
 public:
  DeadlineTimer();
  ~DeadlineTimer();  // Drops callbacks not yet due; joins the thread.

  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // Runs `fn` at `when`. There is no cancel: callers make `fn` a no-op once it is moot
  // (the service's waiters fire at most once), which keeps the hot path free of bookkeeping.
  void Schedule(absl::Time when, std::function<void()> fn);

  size_t pending() const;

 private:
  void Loop();
  bool ShouldWake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || (!pending_.empty() && pending_.begin()->first < sleeping_until_);
  }

  mutable absl::Mutex mu_;
  std::multimap<absl::Time, std::function<void()>> pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time sleeping_until_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::thread thread_;  // started last, in the constructor body
};

}  // namespace kiln::compile
