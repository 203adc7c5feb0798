#include "server/compile/deadline_timer.h"

#include <utility>
#include <vector>

namespace kiln::compile {

DeadlineTimer::DeadlineTimer() {
  thread_ = std::thread([this] { Loop(); });
}

DeadlineTimer::~DeadlineTimer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void DeadlineTimer::Schedule(absl::Time when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  pending_.emplace(when, std::move(fn));
}

size_t DeadlineTimer::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

void DeadlineTimer::Loop() {
  mu_.Lock();
  while (!stop_) {
    const absl::Time now = absl::Now();
    if (!pending_.empty() && pending_.begin()->first <= now) {
      std::vector<std::function<void()>> due;
      auto end = pending_.upper_bound(now);
      for (auto it = pending_.begin(); it != end; ++it) due.push_back(std::move(it->second));
      pending_.erase(pending_.begin(), end);
      mu_.Unlock();
      for (auto& fn : due) fn();
      due.clear();  // release captures without the lock held
      mu_.Lock();
      continue;
    }
    // Sleep until the earliest entry is due, waking early on stop or when an entry earlier
    // than that arrives (absl::Mutex re-checks the condition whenever mu_ is released).
    sleeping_until_ = pending_.empty() ? absl::InfiniteFuture() : pending_.begin()->first;
    mu_.AwaitWithDeadline(absl::Condition(this, &DeadlineTimer::ShouldWake), sleeping_until_);
  }
  mu_.Unlock();
}

}  // namespace kiln::compile
