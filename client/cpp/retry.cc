#include "client/cpp/retry.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "absl/strings/numbers.h"

namespace kiln::client {
namespace {

// What the daemon asked to wait, when it marked the error as retryable.
std::optional<absl::Duration> RetryAfter(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kRetryAfterTrailer);
  if (it == trailers.end()) return std::nullopt;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(std::string(it->second.data(), it->second.size()), &ms) || ms < 0) ms = 0;
  return absl::Milliseconds(ms);
}

double Jitter(double spread) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(1.0 - spread, 1.0 + spread)(rng);
}

}  // namespace

std::optional<absl::Duration> NextRetry(const RetryPolicy& policy, const absl::Status& status,
                                        const grpc::ClientContext& context, int attempt,
                                        absl::Time start, absl::Time deadline) {
  if (attempt >= std::max(1, policy.max_attempts)) return std::nullopt;
  const absl::Duration base = std::min(
      policy.initial_backoff * std::pow(policy.multiplier, attempt - 1), policy.max_backoff);
  absl::Duration wait = base * Jitter(policy.jitter);
  absl::Time limit = deadline;
  if (absl::IsUnavailable(status)) {
    limit = std::min(deadline, start + policy.unavailable_timeout);
  } else if (absl::IsResourceExhausted(status) && policy.retry_overloaded) {
    const std::optional<absl::Duration> hint = RetryAfter(context);
    if (!hint) return std::nullopt;
    wait = std::max(wait, *hint);
  } else {
    return std::nullopt;
  }
  if (absl::Now() + wait >= limit) return std::nullopt;
  return wait;
}

}  // namespace kiln::client
