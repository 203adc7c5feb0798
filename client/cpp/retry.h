// The client retry policy, shared with the Python client (kiln/retry.py); client/RETRY.md
// states it in full:
//
//   - UNAVAILABLE is retried with exponential backoff and jitter for at most
//     `unavailable_timeout` from the call's first attempt, never past its deadline: a daemon
//     that is down fails a call in seconds, one that comes back within the window is reached.
//   - RESOURCE_EXHAUSTED carrying the daemon's `kiln-retry-after-ms` trailer (its compile queue
//     is full) is retried while the deadline allows, waiting at least what the daemon asks.
//     Without the trailer it is a limit of the request and returns at once, as every other
//     code does.
//   - Attempt k waits initial_backoff * multiplier^(k-1), capped at max_backoff, times a jitter
//     factor uniform in [1 - jitter, 1 + jitter].
//
// All Kiln RPCs are idempotent (Compile is get-or-compile), which is what makes this safe.
// Thread-safety: value types and a function safe from any thread.
#pragma once

#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace kiln::client {

// The trailer of a RESOURCE_EXHAUSTED worth retrying: milliseconds to wait, decimal.
inline constexpr char kRetryAfterTrailer[] = "kiln-retry-after-ms";

struct RetryPolicy {
  int max_attempts = 1000;  // attempts in all, whatever the code; 1 disables retries
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  double multiplier = 2.0;
  double jitter = 0.2;
  // How long UNAVAILABLE is retried, from the call's first attempt.
  absl::Duration unavailable_timeout = absl::Seconds(5);
  // Retry RESOURCE_EXHAUSTED that carries kRetryAfterTrailer.
  bool retry_overloaded = true;
};

// Whether and after how long to retry: attempt `attempt` (1-based) of a call that started at
// `start` and must end by `deadline` failed with `status`; `context` is that attempt's (its
// trailers are read). nullopt: give up and return `status`.
std::optional<absl::Duration> NextRetry(const RetryPolicy& policy, const absl::Status& status,
                                        const grpc::ClientContext& context, int attempt,
                                        absl::Time start, absl::Time deadline);

}  // namespace kiln::client
