#include "server/store/tiered_store.h"

#include <utility>

#include "spdlog/spdlog.h"

namespace kiln::store {

absl::Status TieredStore::PutResult(const std::string& key, const v1::ActionResult& result,
                                    const std::vector<std::string>& blobs) {
  if (absl::Status local = l1_->PutResult(key, result, blobs); !local.ok()) return local;
  if (absl::Status shared = l2_->PutResult(key, result, blobs); !shared.ok()) {
    spdlog::debug("shared tier did not take {}: {}", key.substr(0, 12), shared.ToString());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<v1::ActionResult>> TieredStore::GetResult(const std::string& key) {
  absl::StatusOr<std::optional<v1::ActionResult>> local = l1_->GetResult(key);
  if (!local.ok() || local->has_value()) return local;

  absl::StatusOr<std::optional<v1::ActionResult>> shared = l2_->GetResult(key);
  if (!shared.ok()) {
    spdlog::debug("shared tier lookup of {} failed: {}", key.substr(0, 12),
                  shared.status().ToString());
    return std::nullopt;
  }
  if (!shared->has_value()) return std::nullopt;

  // The fill: L1 must hold the blobs before it may hold the record, and they must come from
  // L2 verified. A blob gone since the record was read makes the whole result a miss.
  const v1::ActionResult& result = **shared;
  std::vector<std::string> blobs;
  blobs.reserve(result.artifacts_size());
  for (const v1::Artifact& a : result.artifacts()) {
    absl::StatusOr<std::optional<std::string>> blob = l2_->GetBlob(a.digest());
    if (!blob.ok() || !blob->has_value()) return std::nullopt;
    blobs.push_back(**std::move(blob));
  }
  if (absl::Status fill = l1_->PutResult(key, result, blobs); !fill.ok()) {
    // Still a hit: GetBlob falls through to L2 for the artifacts L1 could not keep.
    spdlog::warn("filling the local cache with {} failed: {}", key.substr(0, 12), fill.ToString());
  }
  return shared;
}

absl::StatusOr<std::optional<std::string>> TieredStore::GetBlob(const std::string& digest) {
  absl::StatusOr<std::optional<std::string>> local = l1_->GetBlob(digest);
  if (!local.ok() || local->has_value()) return local;
  absl::StatusOr<std::optional<std::string>> shared = l2_->GetBlob(digest);
  if (!shared.ok()) return std::nullopt;
  return shared;
}

void TieredStore::AddTierStats(v1::GetStatsResponse* stats) const {
  l1_->AddTierStats(stats);
  l2_->AddTierStats(stats);
}

}  // namespace kiln::store
