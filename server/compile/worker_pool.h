// WorkerPool: a fixed set of threads draining a bounded two-priority queue.
//
// Interactive tasks always run before queued prewarm tasks; within a priority, first in first
// out. The queue is bounded so a flood is refused at the door (ResourceExhausted) instead of
// growing memory and latency without limit; prewarm may fill only three quarters of it, so a
// bulk prewarm never locks interactive clients out.
// Thread-safety: all methods may be called concurrently. Tasks must not call Stop().
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kiln::compile {

enum class Priority { kInteractive = 0, kPrewarm = 1 };

class WorkerPool {
 public:
  // REQUIRES: workers >= 1, queue_capacity >= 1.
  WorkerPool(int workers, int64_t queue_capacity);
  ~WorkerPool();  // Stop(absl::Now()) if not stopped yet.

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `task`. ResourceExhausted when the queue is full for this priority, Unavailable
  // once Stop() has begun. On error the task is not kept.
  absl::Status Submit(Priority priority, std::function<void()> task);

  // Stops accepting, lets the workers drain the queue until it is empty and idle or until
  // `drain_deadline`, then drops what is still queued and joins the threads (a task already
  // running is always finished). Returns the number of dropped tasks. Idempotent.
  int64_t Stop(absl::Time drain_deadline);

  int workers() const { return static_cast<int>(threads_.size()); }
  int64_t queue_depth() const;
  int64_t running() const;

 private:
  void WorkerLoop();
  int64_t QueuedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int64_t>(interactive_.size() + prewarm_.size());
  }

  // Immutable after construction.
  const int64_t capacity_;
  const int64_t prewarm_capacity_;
  std::vector<std::thread> threads_;

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> interactive_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> prewarm_ ABSL_GUARDED_BY(mu_);
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool exit_ ABSL_GUARDED_BY(mu_) = false;  // workers leave once the queue is empty
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kiln::compile
