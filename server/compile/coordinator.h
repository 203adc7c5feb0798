// CompileCoordinator: the seam through which CompileService runs identical compiles once
// across many kilnd replicas (cluster-wide single-flight). Within one process the service's
// own job registry already does this; a coordinator extends it to every replica sharing a
// cache. The implementation on Redis leases is shared::LeaseManager; without one
// (the embedded default) every process compiles on its own.
//
// A job calls Acquire before it compiles and, when told it owns the key, Release after the
// result is stored (or the compile failed). Acquire blocks the job's worker thread while
// another replica holds the key, polling `done_elsewhere` (a lookup in the shared store).
//
// Thread-safety: all methods may be called concurrently, for different or equal keys.
#pragma once

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "kiln/v1/service.pb.h"

namespace kiln::compile {

class CompileCoordinator {
 public:
  enum class Claim {
    kOwner,          // this process holds the key: compile, store, then Release
    kDoneElsewhere,  // another replica stored the result: look it up again
    kUncoordinated,  // coordination is unavailable (e.g. Redis down): compile anyway
    kGaveUp,         // `give_up` passed while another replica still held the key
  };

  virtual ~CompileCoordinator() = default;

  // Claims `key` for this process, waiting while another replica holds it. `done_elsewhere`
  // is called between waits and must return true once the result can be read.
  virtual Claim Acquire(const std::string& key, absl::Time give_up,
                        const std::function<bool()>& done_elsewhere) = 0;

  // Gives up the claim taken by an Acquire that returned kOwner.
  virtual void Release(const std::string& key) = 0;

  // Adds the coordinator's counters (leases taken, waited, expired) to a stats reply.
  virtual void AddStats(v1::GetStatsResponse* stats) const = 0;
};

}  // namespace kiln::compile
