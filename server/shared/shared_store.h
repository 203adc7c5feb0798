// SharedStore: the shared L2 cache tier on Redis (standalone or Cluster), an ArtifactStore.
//
// Layout (FORMAT.md): blobs under kiln:v1:cas:{DIGEST} (chunked beyond `chunk_bytes`),
// action records under kiln:v1:ac:{KEY}. Every value read passes VerifyL2Record
// (l2_records.h) first, with the replicas' MAC secrets when they have some, and then the
// signature check when kilnd signs; a value that fails is a miss, counted as a corruption
// and deleted.
//
// Writes: PutResult writes each blob not already present (chunks first, head last), then the
// action record, so a reader that finds a record finds blobs written before it. Reads:
// GetResult is a hit only when the record verifies and every blob it names is still present
// (Redis may evict keys under maxmemory: the completeness check); a chunked blob whose chunk
// is gone is a miss at GetBlob. Nothing half-written or corrupt is ever returned.
//
// Redis errors and timeouts are errors (Unavailable), never hits; the caller (TieredStore)
// treats them as misses. Counters and a latency histogram feed GetStats and /metrics.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/shared/l2_records.h"
#include "server/shared/redis_client.h"
#include "server/store/artifact_store.h"

namespace kiln::shared {

struct SharedStoreOptions {
  // Blobs larger than this are split into chunks of this size (Redis handles one huge value
  // badly: it blocks the server while it is copied).
  size_t chunk_bytes = 1 << 20;
  // Expiry of every key written; zero: none (rely on maxmemory + allkeys-lru).
  absl::Duration ttl = absl::ZeroDuration();
  // When set (kilnd signs its results), an action record must also pass this check (its
  // signature by a trusted key) to be a hit; one that fails is a corruption like a bad digest:
  // counted, deleted, never copied into the local tier. Must be thread-safe.
  std::function<absl::Status(const std::string& key, const v1::ActionResult& result)> verify;
  // The replicas' shared secrets: action records are written with a MAC and read only when
  // theirs verifies (l2_records.h). A record refused for its MAC is a corruption too.
  L2Auth auth;
};

// A latency histogram with fixed bounds; lock-free.
class LatencyHistogram {
 public:
  static constexpr std::array<double, 11> kBoundsS = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,   0.025,   0.05,   0.1,   0.25};
  void Record(absl::Duration d);
  void Fill(v1::SharedCacheStats* stats) const;

 private:
  std::array<std::atomic<int64_t>, kBoundsS.size() + 1> counts_{};
  std::atomic<int64_t> sum_ns_{0};
};

class SharedStore : public store::ArtifactStore {
 public:
  // `client` must outlive the store.
  SharedStore(RedisClient* client, SharedStoreOptions options);

  // REQUIRES: as ArtifactStore::PutResult (blobs match their digests; checked).
  absl::Status PutResult(const std::string& key, const v1::ActionResult& result,
                         const std::vector<std::string>& blobs) override;
  absl::StatusOr<std::optional<v1::ActionResult>> GetResult(const std::string& key) override;
  absl::StatusOr<std::optional<std::string>> GetBlob(const std::string& digest) override;

  // Blobs by themselves (a custom build's inputs, which no action record names): stored under
  // their digest like artifacts, read back verified by GetBlob. REQUIRES: key::Sha256Hex(bytes)
  // == digest (checked: InvalidArgument).
  absl::Status PutBlob(const std::string& digest, const std::string& bytes);
  // Whether the blob's head is present (a chunk may still be missing: GetBlob then misses).
  absl::StatusOr<bool> HasBlob(const std::string& digest);

  // hits, misses and corruptions; the shared tier's size is Redis's business (INFO memory).
  store::StoreStats Stats() const override;
  void AddTierStats(v1::GetStatsResponse* stats) const override;

 private:
  absl::Status WriteBlob(const std::string& digest, const std::string& bytes);
  absl::Status Set(const std::string& key, absl::string_view value);
  // Counts a value that failed verification and deletes it, so the next writer replaces it.
  void DropCorrupt(const std::string& key, const absl::Status& why);

  // Immutable after construction.
  RedisClient* const client_;
  const SharedStoreOptions options_;
  const std::string ttl_ms_;  // empty: no expiry

  std::atomic<int64_t> hits_{0};
  std::atomic<int64_t> misses_{0};
  std::atomic<int64_t> corruptions_{0};
  std::atomic<int64_t> incomplete_{0};
  std::atomic<int64_t> bytes_read_{0};
  std::atomic<int64_t> bytes_written_{0};
  LatencyHistogram latency_;
};

}  // namespace kiln::shared
