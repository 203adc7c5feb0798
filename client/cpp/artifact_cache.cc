#include "client/cpp/artifact_cache.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cpp/core_status.h"

namespace kiln::client {

absl::StatusOr<std::string> ArtifactCache::DefaultRoot() {
  core::Error error;
  std::string root = core::ArtifactStore::DefaultRoot(&error);
  if (!error.ok()) return ToStatus(error);
  return root;
}

absl::StatusOr<std::unique_ptr<ArtifactCache>> ArtifactCache::Open(const std::string& root) {
  core::Error error;
  std::unique_ptr<core::ArtifactStore> store = core::ArtifactStore::Open(root, &error);
  if (store == nullptr) return ToStatus(error);
  return std::unique_ptr<ArtifactCache>(new ArtifactCache(std::move(store)));
}

std::string ArtifactCache::PathFor(const std::string& digest) const {
  return store_->PathFor(digest);
}

absl::StatusOr<std::optional<std::string>> ArtifactCache::Find(const std::string& digest) {
  core::Error error;
  std::optional<std::string> path = store_->Find(digest, &error);
  if (!error.ok()) return ToStatus(error);
  return path;
}

absl::StatusOr<std::string> ArtifactCache::Put(const std::string& digest,
                                               const std::string& bytes) {
  core::Error error;
  std::optional<std::string> path = store_->Put(digest, bytes, &error);
  if (!path.has_value()) return ToStatus(error);
  return *std::move(path);
}

absl::StatusOr<std::string> ArtifactCache::GetOrFetch(const std::string& digest,
                                                      const FetchFn& fetch) {
  return FindOrFetch(digest, fetch, /*fetch_verifies=*/false);
}

absl::StatusOr<std::string> ArtifactCache::GetOrFetchVerified(const std::string& digest,
                                                              const FetchFn& fetch) {
  return FindOrFetch(digest, fetch, /*fetch_verifies=*/true);
}

absl::StatusOr<std::string> ArtifactCache::FindOrFetch(const std::string& digest,
                                                       const FetchFn& fetch, bool fetch_verifies) {
  core::Error error;
  if (std::optional<std::string> found = store_->Find(digest, &error); found.has_value()) {
    hits_.fetch_add(1, std::memory_order_relaxed);
    return *std::move(found);
  }
  if (!error.ok()) return ToStatus(error);
  std::optional<core::StoreLock> lock = store_->LockFor(digest, &error);
  if (!lock.has_value()) return ToStatus(error);
  // Whoever held the lock before us may have stored it meanwhile.
  if (std::optional<std::string> found = store_->FindLocked(digest, &error); found.has_value()) {
    hits_.fetch_add(1, std::memory_order_relaxed);
    return *std::move(found);
  }
  if (!error.ok()) return ToStatus(error);
  fetches_.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<std::string> bytes = fetch(digest);
  if (!bytes.ok()) return bytes.status();
  if (!fetch_verifies) return Put(digest, *bytes);
  std::optional<std::string> path = store_->PutVerified(digest, *bytes, &error);
  if (!path.has_value()) return ToStatus(error);
  return *std::move(path);
}

absl::StatusOr<std::optional<core::AnswerFolder::Answer>> ArtifactCache::LoadAnswer(
    const std::string& name, absl::Duration max_age) const {
  core::Error error;
  std::optional<core::AnswerFolder::Answer> answer =
      answers_.Load(name, absl::ToDoubleSeconds(max_age), &error);
  if (!error.ok()) return ToStatus(error);
  return answer;
}

absl::Status ArtifactCache::SaveAnswer(const std::string& name, std::string_view response) const {
  core::Error error;
  answers_.Save(name, response, &error);
  return ToStatus(error);
}

absl::Status ArtifactCache::DropAnswer(const std::string& name) const {
  core::Error error;
  answers_.Drop(name, &error);
  return ToStatus(error);
}

ArtifactCacheStats ArtifactCache::stats() const {
  ArtifactCacheStats s;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.fetches = fetches_.load(std::memory_order_relaxed);
  s.corruptions = store_->counters().corruptions;
  return s;
}

}  // namespace kiln::client
