#include "server/compile/result_cache.h"

#include <vector>

namespace kiln::compile {

ResultCache::ResultCache(size_t capacity, absl::Duration ttl) : capacity_(capacity), ttl_(ttl) {}

ResultCache::Lookup ResultCache::Get(const std::string& key, absl::Time now) {
  Lookup out;
  if (capacity_ == 0) return out;
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return out;
  Entry& e = *it->second;
  lru_.splice(lru_.begin(), lru_, it->second);
  out.result = e.result;
  if (e.revalidate_at <= now && !e.revalidating) {
    e.revalidating = true;
    out.revalidate = true;
  }
  return out;
}

void ResultCache::Put(const std::string& key, Result result, absl::Time now) {
  if (capacity_ == 0 || result == nullptr) return;
  Result evicted;  // released after the lock, in case it is the last reference
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it != index_.end()) {
    it->second->result = std::move(result);
    it->second->revalidate_at = now + ttl_;
    it->second->revalidating = false;
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.push_front(Entry{key, std::move(result), now + ttl_, false});
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

std::string RequestIndex::Get(const std::string& request_key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(request_key);
  if (it == index_.end()) return "";
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void RequestIndex::Put(const std::string& request_key, const std::string& action_key) {
  if (capacity_ == 0) return;
  absl::MutexLock lock(&mu_);
  auto it = index_.find(request_key);
  if (it != index_.end()) {
    it->second->second = action_key;
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.emplace_front(request_key, action_key);
  index_.emplace(request_key, lru_.begin());
  if (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

size_t RequestIndex::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

}  // namespace kiln::compile
