// ResultCache: a small in-memory LRU of recent ActionResults in front of the store.
//
// A cache hit must cost well under a millisecond end to end, so the hottest keys are answered
// from memory without a RocksDB read, a protobuf parse and blob checks. Every `ttl` an entry
// is revalidated against the store, which re-checks that the artifacts are still there (the
// store may have evicted them) and refreshes the key's recency in the store's own LRU, so a
// key hot in memory is never cold on disk. Exactly one caller does the revalidation; the
// others keep being answered from memory meanwhile, so a hot key never sees a burst of store
// reads when its entry comes due.
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kiln/v1/service.pb.h"

namespace kiln::compile {

class ResultCache {
 public:
  using Result = std::shared_ptr<const v1::ActionResult>;

  // capacity 0 disables the cache (every Get misses, Put does nothing).
  ResultCache(size_t capacity, absl::Duration ttl);

  struct Lookup {
    Result result;            // nullptr on a miss
    bool revalidate = false;  // this caller must check the store and Put or Erase the key
  };
  // A hit, a miss, or (once per `ttl` per key) a hit this caller must revalidate.
  Lookup Get(const std::string& key, absl::Time now);
  // Inserts or replaces, and ends a pending revalidation.
  void Put(const std::string& key, Result result, absl::Time now);
  void Erase(const std::string& key);
  size_t size() const;

 private:
  struct Entry {
    std::string key;
    Result result;
    absl::Time revalidate_at;
    bool revalidating = false;
  };
  using List = std::list<Entry>;

  // Immutable after construction.
  const size_t capacity_;
  const absl::Duration ttl_;

  mutable absl::Mutex mu_;
  List lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<std::string, List::iterator> index_ ABSL_GUARDED_BY(mu_);
};

// FailureCache: compile failures remembered for a short time, so a storm of retries of a
// graph that breaks the compiler gets the same error without recompiling it each time.
// Thread-safety: all methods may be called concurrently.
class FailureCache {
 public:
  // ttl <= 0 disables it.
  explicit FailureCache(absl::Duration ttl) : ttl_(ttl) {}

  // The remembered error, or OK when there is none (or it expired).
  absl::Status Get(const std::string& key, absl::Time now);
  void Put(const std::string& key, const absl::Status& status, absl::Time now);
  size_t size() const;

 private:
  // Beyond this many entries, expired ones are swept on insert.
  static constexpr size_t kSweepAbove = 1024;

  const absl::Duration ttl_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::pair<absl::Status, absl::Time>> entries_
      ABSL_GUARDED_BY(mu_);
};

// RequestIndex: which action key each recently seen request key (wire/FORMAT.md) led to, so a
// client can ask for a cached result by request key without sending its graph. An LRU of
// `capacity` entries (about 200 bytes each); only keys kilnd computed itself go in.
// Thread-safety: all methods may be called concurrently.
class RequestIndex {
 public:
  explicit RequestIndex(size_t capacity) : capacity_(capacity) {}

  // The action key, or "" when the request key is not (or no longer) known.
  std::string Get(const std::string& request_key);
  void Put(const std::string& request_key, const std::string& action_key);
  size_t size() const;

 private:
  using List = std::list<std::pair<std::string, std::string>>;  // (request key, action key)

  // Immutable after construction.
  const size_t capacity_;

  mutable absl::Mutex mu_;
  List lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<std::string, List::iterator> index_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln::compile
