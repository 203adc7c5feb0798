// Build commands in parallel: JobSlots, a count of slots shared by all custom builds (at most
// that many sandboxed commands run at once, kilnd-wide), and RunAll, which runs one build's
// independent commands (its translation units) several at once, as ninja does for
// cpp_extension: a build alone uses every slot, several builds share them.
// Thread-safety: JobSlots and RunAll may be used from many threads at once.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace kiln::ext {

class JobSlots {
 public:
  // REQUIRES: slots >= 1.
  explicit JobSlots(int slots) : size_(slots), free_(slots) {}

  JobSlots(const JobSlots&) = delete;
  JobSlots& operator=(const JobSlots&) = delete;

  // Blocks until a slot is free and takes it. Never held while waiting for another: a holder
  // runs one command and gives it back, so waiting cannot deadlock.
  void Acquire();
  void Release();
  int size() const { return size_; }

 private:
  const int size_;  // immutable after construction
  absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
};

// Calls run(i, &(*logs)[i]) for i in [0, n) on up to `lanes` threads, the caller's among them,
// taking the lowest index not yet started each time; once a call fails no more start, and the
// ones running finish. Returns the failure of the lowest index that failed (what a build
// running them one after another would have reported first), else OK. `logs` is resized to n.
// REQUIRES: lanes >= 1; `run` may be called concurrently.
absl::Status RunAll(int n, int lanes, const std::function<absl::Status(int, std::string*)>& run,
                    std::vector<std::string>* logs);

}  // namespace kiln::ext
