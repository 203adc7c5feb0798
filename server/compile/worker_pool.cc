#include "server/compile/worker_pool.h"

#include <algorithm>
#include <utility>

namespace kiln::compile {

WorkerPool::WorkerPool(int workers, int64_t queue_capacity)
    : capacity_(std::max<int64_t>(1, queue_capacity)),
      prewarm_capacity_(std::max<int64_t>(1, capacity_ - capacity_ / 4)) {
  workers = std::max(1, workers);
  threads_.reserve(workers);
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

WorkerPool::~WorkerPool() { Stop(absl::Now()); }

absl::Status WorkerPool::Submit(Priority priority, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (!accepting_) return absl::UnavailableError("compile workers are shutting down");
  const int64_t queued = QueuedLocked();
  if (priority == Priority::kInteractive) {
    if (queued >= capacity_) {
      return absl::ResourceExhaustedError("compile queue is full (" + std::to_string(capacity_) +
                                          " jobs waiting); retry later");
    }
    interactive_.push_back(std::move(task));
  } else {
    if (queued >= prewarm_capacity_) {
      return absl::ResourceExhaustedError("compile queue is full for prewarm jobs (" +
                                          std::to_string(prewarm_capacity_) +
                                          " jobs waiting); retry later");
    }
    prewarm_.push_back(std::move(task));
  }
  return absl::OkStatus();
}

void WorkerPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerPool* p)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->exit_ || p->QueuedLocked() > 0; },
          this));
      if (QueuedLocked() == 0) return;  // exit_ and nothing left
      auto& queue = interactive_.empty() ? prewarm_ : interactive_;
      task = std::move(queue.front());
      queue.pop_front();
      ++running_;
    }
    task();
    // Drop captured state (results, graphs) before taking the lock again.
    task = nullptr;
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

int64_t WorkerPool::Stop(absl::Time drain_deadline) {
  std::deque<std::function<void()>> dropped_interactive;
  std::deque<std::function<void()>> dropped_prewarm;
  {
    absl::MutexLock lock(&mu_);
    if (joined_) return 0;
    accepting_ = false;
    mu_.AwaitWithDeadline(absl::Condition(
                              +[](WorkerPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
                                return p->QueuedLocked() == 0 && p->running_ == 0;
                              },
                              this),
                          drain_deadline);
    // Whatever is still queued will not run; destroy it outside the lock, since a task's
    // captured state may call back into its owner when released.
    dropped_interactive.swap(interactive_);
    dropped_prewarm.swap(prewarm_);
    exit_ = true;
    joined_ = true;
  }
  for (std::thread& t : threads_) t.join();
  return static_cast<int64_t>(dropped_interactive.size() + dropped_prewarm.size());
}

int64_t WorkerPool::queue_depth() const {
  absl::MutexLock lock(&mu_);
  return QueuedLocked();
}

int64_t WorkerPool::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

}  // namespace kiln::compile
