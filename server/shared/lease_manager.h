// LeaseManager: cluster-wide single-flight on Redis leases (a compile::CompileCoordinator).
//
// The lease of an action key is kiln:v1:lease:{KEY}, taken with SET NX PX: the value is this
// process's owner id plus a sequence number, the expiry `ttl`. While the compile runs a
// background thread renews every held lease each ttl/3 (compare-and-set in a Lua script, so
// only the holder extends it); Release deletes it the same way. A replica that dies holding a
// lease (kill -9) stops renewing: the lease runs out within `ttl` and a waiting replica takes
// the compile over (counted as "expired").
//
// Waiters poll: between tries they ask `done_elsewhere` (a shared-store lookup) and back off
// from `poll_initial` doubling up to `poll_max`. Polling was chosen over pub/sub because it
// needs no connection per waiter, survives Redis restarts and cluster redirections unchanged,
// and the waiting is already bounded by a compile's length (tens to hundreds of
// milliseconds), where a 50 ms poll costs little.
//
// Redis unreachable: Acquire answers kUncoordinated at once (the client fails fast while
// down) and the job compiles locally; nobody waits on a lease it cannot see.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/compile/coordinator.h"
#include "server/shared/redis_client.h"

namespace kiln::shared {

struct LeaseOptions {
  absl::Duration ttl = absl::Seconds(10);
  absl::Duration poll_initial = absl::Milliseconds(5);
  absl::Duration poll_max = absl::Milliseconds(100);
  // Identifies this process in lease values; empty: host name, pid and a random number.
  std::string owner_id;
};

class LeaseManager : public compile::CompileCoordinator {
 public:
  // `client` must outlive the manager. Starts the renewal thread.
  LeaseManager(RedisClient* client, LeaseOptions options);
  // Stops renewing; leases still held run out by themselves.
  ~LeaseManager() override;

  LeaseManager(const LeaseManager&) = delete;
  LeaseManager& operator=(const LeaseManager&) = delete;

  Claim Acquire(const std::string& key, absl::Time give_up,
                const std::function<bool()>& done_elsewhere) override;
  void Release(const std::string& key) override;
  void AddStats(v1::GetStatsResponse* stats) const override;

  const std::string& owner_id() const { return owner_id_; }

 private:
  void RenewLoop();

  // Immutable after construction.
  RedisClient* const client_;
  const LeaseOptions options_;
  const std::string owner_id_;
  const std::string ttl_ms_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> held_ ABSL_GUARDED_BY(mu_);  // key -> token
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::atomic<int64_t> taken_{0};
  std::atomic<int64_t> waited_{0};
  std::atomic<int64_t> expired_{0};
  std::atomic<int64_t> done_elsewhere_{0};
  std::atomic<int64_t> errors_{0};
  std::atomic<int64_t> lost_{0};

  std::thread renewer_;  // last: started once everything above exists
};

}  // namespace kiln::shared
