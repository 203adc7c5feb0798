// ArtifactCache: the client's local content-addressed artifact directory, so that loading a
// handle twice (in one process or in many) fetches its artifacts once.
//
// Layout under the root (the directory given, else $KILN_CACHE_DIR, else
// $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln):
//
//   artifacts/<d0d1>/<digest>          the bytes whose lowercase hex SHA-256 is <digest>
//   artifacts/<d0d1>/<digest>.lock     empty; flock()ed while <digest> is being fetched
//   artifacts/<d0d1>/.<digest>.XXXXXX  a write in progress (or left by a crash)
//
// <d0d1> is the first two hex digits of the digest, which keeps directories small. A file is
// written to a temporary name in the same directory, fsynced and renamed into place, so a file
// under its final name is always whole; it may still have been damaged since, so every use
// hashes it first, and one whose SHA-256 is not its name is deleted and fetched again.
// Fetches of one digest are serialised through the lock file: flock() locks belong to an open
// file description, so they exclude other threads of this process as well as other processes.
//
// Thread-safety: thread-safe. Several processes may share one root.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln::client {

struct ArtifactCacheStats {
  int64_t hits = 0;         // GetOrFetch answered from a verified file
  int64_t fetches = 0;      // GetOrFetch called its fetch function
  int64_t corruptions = 0;  // files whose bytes did not match their name, deleted
};

class ArtifactCache {
 public:
  // Fetches the bytes of `digest` from elsewhere (usually Client::FetchArtifact).
  using FetchFn = std::function<absl::StatusOr<std::string>(const std::string& digest)>;

  // Opens (creating it if needed) the cache rooted at `root`, or at DefaultRoot() when empty.
  static absl::StatusOr<std::unique_ptr<ArtifactCache>> Open(const std::string& root = "");
  // $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln. FailedPrecondition
  // when none of them is set.
  static absl::StatusOr<std::string> DefaultRoot();

  ArtifactCache(const ArtifactCache&) = delete;
  ArtifactCache& operator=(const ArtifactCache&) = delete;

  // Where `digest` lives (whether or not it is there). REQUIRES: IsDigest(digest).
  std::string PathFor(const std::string& digest) const;

  // The path of a verified copy of `digest`; nullopt when there is none (a corrupt copy is
  // deleted). InvalidArgument for a malformed digest.
  absl::StatusOr<std::optional<std::string>> Find(const std::string& digest);

  // Stores `bytes` under `digest` atomically and returns the path. DataLoss when the bytes do
  // not hash to `digest`, so nothing unverified ever gets a name.
  absl::StatusOr<std::string> Put(const std::string& digest, const std::string& bytes);

  // The path of a verified copy of `digest`, calling `fetch` only when there is none. Callers
  // racing on one digest (threads or processes) wait for the first one's fetch instead of
  // fetching again. An error from `fetch` is returned as is and nothing is stored.
  absl::StatusOr<std::string> GetOrFetch(const std::string& digest, const FetchFn& fetch);

  const std::string& root() const { return root_; }
  ArtifactCacheStats stats() const;

 private:
  enum class Check { kMissing, kValid, kCorrupt };

  explicit ArtifactCache(std::string root) : root_(std::move(root)) {}
  // Hashes the file at `path`; an unreadable file is an error, not corruption.
  absl::StatusOr<Check> Verify(const std::string& path, const std::string& digest) const;
  // Verifies the file of `digest` and deletes it when corrupt (returning kMissing then).
  // REQUIRES: the digest's lock is held, so no writer is renaming a good copy into place.
  absl::StatusOr<Check> VerifyAndRepairLocked(const std::string& digest);
  absl::Status WriteAtomically(const std::string& path, const std::string& digest,
                               const std::string& bytes) const;

  // Immutable after construction.
  const std::string root_;

  std::atomic<int64_t> hits_{0};
  std::atomic<int64_t> fetches_{0};
  std::atomic<int64_t> corruptions_{0};
};

}  // namespace kiln::client
