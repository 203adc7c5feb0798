#include "server/compile/result_cache.h"

#include <vector>

namespace kiln::compile {

ResultCache::ResultCache(size_t capacity, absl::Duration ttl) : capacity_(capacity), ttl_(ttl) {}

ResultCache::Result ResultCache::Get(const std::string& key, absl::Time now) {
  if (capacity_ == 0) return nullptr;
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  if (it->second->expires <= now) {
    lru_.erase(it->second);
    index_.erase(it);
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->result;
}

void ResultCache::Put(const std::string& key, Result result, absl::Time now) {
  if (capacity_ == 0 || result == nullptr) return;
  Result evicted;  // released after the lock, in case it is the last reference
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it != index_.end()) {
    it->second->result = std::move(result);
    it->second->expires = now + ttl_;
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.push_front(Entry{key, std::move(result), now + ttl_});
  index_.emplace(key, lru_.begin());
  if (lru_.size() > capacity_) {
    evicted = std::move(lru_.back().result);
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

void ResultCache::Erase(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return;
  lru_.erase(it->second);
  index_.erase(it);
}

size_t ResultCache::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

absl::Status FailureCache::Get(const std::string& key, absl::Time now) {
  if (ttl_ <= absl::ZeroDuration()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return absl::OkStatus();
  if (it->second.second <= now) {
    entries_.erase(it);
    return absl::OkStatus();
  }
  return it->second.first;
}

void FailureCache::Put(const std::string& key, const absl::Status& status, absl::Time now) {
  if (ttl_ <= absl::ZeroDuration() || status.ok()) return;
  absl::MutexLock lock(&mu_);
  if (entries_.size() >= kSweepAbove) {
    std::vector<std::string> expired;
    for (const auto& [k, v] : entries_) {
      if (v.second <= now) expired.push_back(k);
    }
    for (const auto& k : expired) entries_.erase(k);
  }
  entries_[key] = {status, now + ttl_};
}

size_t FailureCache::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace kiln::compile
