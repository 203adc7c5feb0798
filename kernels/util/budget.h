// FrontendBudget: the wall-clock allowance of one compile's frontend (passes, lowering,
// scheduling, codegen), checked at stage boundaries and inside long loops. Exceeding it is
// ResourceExhausted naming the limit and the stage that ran out, never a crash or a hang.
// Thread-safety: immutable after construction; Check() may be called from any thread.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln {

class FrontendBudget {
 public:
  // `limit_ms` <= 0: no limit.
  explicit FrontendBudget(double limit_ms)
      : start_(std::chrono::steady_clock::now()), limit_ms_(limit_ms) {}

  double ElapsedMs() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
        .count();
  }

  absl::Status Check(std::string_view stage) const {
    if (limit_ms_ <= 0) return absl::OkStatus();
    double spent = ElapsedMs();
    if (spent <= limit_ms_) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "frontend time limit exceeded: ", static_cast<int64_t>(spent), " ms spent (in ",
        std::string(stage), ") over the limit of ", static_cast<int64_t>(limit_ms_),
        " ms (max_frontend_ms); split the graph or raise the limit"));
  }

 private:
  std::chrono::steady_clock::time_point start_;
  double limit_ms_;
};

}  // namespace kiln
