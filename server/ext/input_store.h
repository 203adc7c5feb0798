// InputStore: the content-addressed blobs that custom builds read (sources, header trees),
// kept on local disk beside the artifact store, and the trees materialized from them.
//
// Layout: <dir>/blobs/<hex digest> (the bytes, kept across restarts) and
// <trees_dir>/<hex digest>/ (a tree's files at their paths, hard-linked from blobs/ where the
// filesystem allows, else copied; rebuilt on demand, so it may live in a scratch folder). Every
// write goes to a temporary name and is renamed into place, and a blob is verified against its
// digest before it is kept, so a reader never sees a half-written or wrong input. Inputs are
// not build results: they live apart from the RocksDB store (whose blobs exist only for the
// entries naming them) and are evicted, least recently used first, beyond a byte budget.
// A tree is evicted with its blobs' bytes counted once; a materialized tree is rebuilt when
// it is needed again.
// With a shared tier (SharedInputs, the cluster's Redis), blobs uploaded to one replica are
// written there too, and a replica that lacks a blob fetches it from there before it asks the
// client: a client load-balanced across replicas uploads its inputs once.
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kiln/v1/service.pb.h"

namespace kiln::ext {

// A second home for input blobs that every replica reads. Blobs are content-addressed: `get`
// answers bytes that hash to `hex` (verified by the tier) or nothing; errors are misses. Each
// function is called from many threads at once. All empty: no shared tier.
struct SharedInputs {
  std::function<bool(const std::string& hex)> has;
  std::function<std::optional<std::string>(const std::string& hex)> get;
  std::function<void(const std::string& hex, const std::string& bytes)> put;
  explicit operator bool() const { return has && get && put; }
};

class InputStore {
 public:
  // Opens (creating) `dir` and `trees_dir`; indexes the blobs already there. 0: no byte budget.
  static absl::StatusOr<std::unique_ptr<InputStore>> Open(const std::string& dir,
                                                          const std::string& trees_dir,
                                                          int64_t capacity_bytes,
                                                          SharedInputs shared = {});

  // Whether the blob is held here (no read).
  bool Has(const std::string& hex) const;
  // Whether a build could have the blob without an upload: held here, or in the shared tier.
  bool Reachable(const std::string& hex) const;
  // Whether the blob is held here once this returns: fetched from the shared tier when it is
  // there and not here.
  bool Ensure(const std::string& hex);
  // Stores `bytes` under their SHA-256 (and in the shared tier) and returns its hex digest.
  absl::StatusOr<std::string> Put(const std::string& bytes);
  // The blob, verified; NotFound when it is not held (a corrupt one is dropped: NotFound).
  absl::StatusOr<std::string> Get(const std::string& hex);

  // The tree `hex` (an InputTree blob), parsed and checked: paths relative, no '..', sorted,
  // unique, no file inside another file's path.
  absl::StatusOr<v1::InputTree> ReadTree(const std::string& hex);
  // The blobs `tree` needs that are neither held nor in the shared tier (those are fetched):
  // the tree itself first, then its files.
  std::vector<std::string> MissingFor(const std::string& tree_hex);
  // A folder holding the tree's files, built on first use. NotFound naming the first missing
  // blob when the tree is incomplete.
  absl::StatusOr<std::string> Materialize(const std::string& tree_hex);

  int64_t blobs() const;
  int64_t bytes() const;

 private:
  struct Held {
    int64_t size = 0;
    uint64_t tick = 0;
  };
  InputStore(std::string dir, std::string trees_dir, int64_t capacity, SharedInputs shared)
      : dir_(std::move(dir)),
        trees_dir_(std::move(trees_dir)),
        capacity_(capacity),
        shared_(std::move(shared)) {}
  // Stores verified bytes here only; `inserted` says whether they were new.
  absl::StatusOr<std::string> PutLocal(const std::string& bytes, bool* inserted);
  void Touch(const std::string& hex);
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  const std::string trees_dir_;
  const int64_t capacity_;
  const SharedInputs shared_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Mutex materialize_mu_;  // one tree built at a time
};

// Whether `path` is a clean relative path: '/'-separated, no empty, '.' or '..' parts, no
// NUL, at most 4096 bytes.
bool IsCleanRelativePath(const std::string& path);
bool IsHexDigest(const std::string& s);

}  // namespace kiln::ext
