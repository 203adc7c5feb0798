#include "server/ext/build_jobs.h"

#include <algorithm>
#include <atomic>
#include <thread>

namespace kiln::ext {

void JobSlots::Acquire() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* free) { return *free > 0; }, &free_));
  --free_;
}

void JobSlots::Release() {
  absl::MutexLock lock(&mu_);
  ++free_;
}

absl::Status RunAll(int n, int lanes, const std::function<absl::Status(int, std::string*)>& run,
                    std::vector<std::string>* logs) {
  logs->assign(std::max(n, 0), "");
  std::vector<absl::Status> results(logs->size());
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  auto lane = [&] {
    for (int i = next.fetch_add(1); i < n && !failed.load(); i = next.fetch_add(1)) {
      results[i] = run(i, &(*logs)[i]);
      if (!results[i].ok()) failed.store(true);
    }
  };
  std::vector<std::thread> helpers;
  for (int i = 1; i < std::min(lanes, n); ++i) helpers.emplace_back(lane);
  lane();
  for (std::thread& t : helpers) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace kiln::ext
