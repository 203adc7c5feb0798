// TieredStore: two stores behind one ArtifactStore, a fast local L1 (RocksDbStore) in front
// of a slower, shared L2 (shared::SharedStore on Redis). Composed in main.cc:
// Tiered(L1, L2), where each tier verifies what it reads (L1 its RocksDB values, L2 every
// Redis value through VerifyL2Record), so nothing unverified passes.
//
// Reads: L1, then L2. An L2 hit is served only when the record and every blob it names read
// back verified from L2; they are then written to L1 (the fill), so the next read is local.
// Blob reads fall through to L2 as well (a client may fetch an artifact an L1 evicted).
// Writes: L1, then L2. L1 is the source of truth for this replica: its errors are returned.
// L2 is best effort: its errors and timeouts are logged at debug level and counted by the L2
// itself (the L2's client reports an outage once), and a read error there is a miss, so a
// shared tier that is down or slow costs at most its timeout and is never an outage.
//
// Thread-safety: as its tiers (all methods may be called concurrently).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/store/artifact_store.h"

namespace kiln::store {

class TieredStore : public ArtifactStore {
 public:
  // Both tiers must outlive this store.
  TieredStore(ArtifactStore* l1, ArtifactStore* l2) : l1_(l1), l2_(l2) {}

  absl::Status PutResult(const std::string& key, const v1::ActionResult& result,
                         const std::vector<std::string>& blobs) override;
  absl::StatusOr<std::optional<v1::ActionResult>> GetResult(const std::string& key) override;
  absl::StatusOr<std::optional<std::string>> GetBlob(const std::string& digest) override;

  // Explain and export read the local tier: it holds every entry this replica wrote or
  // served, and the shared tier has no index by graph and no ordered listing.
  absl::StatusOr<std::vector<std::pair<std::string, v1::ActionResult>>> ResultsForGraph(
      const std::string& graph_digest, size_t limit) override {
    return l1_->ResultsForGraph(graph_digest, limit);
  }
  absl::StatusOr<std::vector<std::pair<std::string, v1::ActionResult>>> ListResults(
      const std::string& after_key, size_t limit) override {
    return l1_->ListResults(after_key, limit);
  }
  bool IsPersisted(const std::string& key) const override { return l1_->IsPersisted(key); }

  // L1's counters (the local cache); the L2's come through AddTierStats.
  StoreStats Stats() const override { return l1_->Stats(); }
  void AddTierStats(v1::GetStatsResponse* stats) const override;

 private:
  ArtifactStore* const l1_;
  ArtifactStore* const l2_;
};

}  // namespace kiln::store
