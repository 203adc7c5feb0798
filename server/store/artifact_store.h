// ArtifactStore: the cache's interface. Two maps: CAS (digest -> bytes) and AC (action key ->
// ActionResult). Implementations: RocksDbStore (L1, embedded), shared::SharedStore (L2, Redis);
// TieredStore composes the two.
//
// Lookups return StatusOr<optional<T>>: an error (store down), a miss (nullopt) or a hit.
// Reads verify content: a CAS value whose SHA-256 does not match its digest is evicted,
// counted as a corruption and reported as a miss; an AC entry any of whose artifacts is gone
// is a miss. Nothing half-written is ever returned.
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/v1/service.pb.h"

namespace kiln::store {

struct StoreStats {
  int64_t hits = 0;  // AC hits
  int64_t misses = 0;
  int64_t bytes = 0;    // CAS + AC bytes currently held
  int64_t entries = 0;  // AC entries
  int64_t evictions = 0;
  int64_t corruptions = 0;
  int64_t capacity_bytes = 0;
  // Write faults (see RocksDbStore): writes suspended after a disk error, and counters.
  bool writes_suspended = false;
  int64_t write_errors = 0;
  int64_t unpersisted_puts = 0;
  int64_t write_resumes = 0;
};

class ArtifactStore {
 public:
  virtual ~ArtifactStore() = default;

  // Writes the blobs and the result that names them atomically (one batch): a reader sees
  // either all of it or none. `blobs` are the artifact bytes in the order of
  // result.artifacts(); their digests must match (checked: InvalidArgument otherwise).
  virtual absl::Status PutResult(const std::string& key, const v1::ActionResult& result,
                                 const std::vector<std::string>& blobs) = 0;

  // AC lookup; a hit refreshes the entry's recency for eviction.
  virtual absl::StatusOr<std::optional<v1::ActionResult>> GetResult(const std::string& key) = 0;

  // CAS read by lowercase hex digest, verified.
  virtual absl::StatusOr<std::optional<std::string>> GetBlob(const std::string& digest) = 0;

  virtual StoreStats Stats() const = 0;

  // Stored results whose key record names the graph `graph_digest` (the hex "graph" field of
  // kernels/key), as (action key, result), at most `limit`. For explaining a miss: reads
  // neither count as hits nor refresh recency. Stores without such an index know none.
  virtual absl::StatusOr<std::vector<std::pair<std::string, v1::ActionResult>>> ResultsForGraph(
      const std::string& graph_digest, size_t limit) {
    (void)graph_digest;
    (void)limit;
    return std::vector<std::pair<std::string, v1::ActionResult>>{};
  }

  // Stored results in key byte order, starting after `after_key` ("" = from the first), at
  // most `limit`: what a bundle exports (kiln export). Reads neither count as hits nor refresh
  // recency; damaged records are skipped. Stores that cannot list their entries answer
  // Unimplemented.
  virtual absl::StatusOr<std::vector<std::pair<std::string, v1::ActionResult>>> ListResults(
      const std::string& after_key, size_t limit) {
    (void)after_key;
    (void)limit;
    return absl::UnimplementedError("this store cannot list its entries");
  }

  // False when the result under `key` was accepted by PutResult but is held only in memory
  // (the disk refused the write); it is still served until evicted or written out later.
  virtual bool IsPersisted(const std::string& key) const {
    (void)key;
    return true;
  }

  // Adds what a tier beyond the local one knows (the shared tier's counters) to a stats
  // reply. The local store has nothing to add.
  virtual void AddTierStats(v1::GetStatsResponse* /*stats*/) const {}
};

}  // namespace kiln::store
