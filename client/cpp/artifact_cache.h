// ArtifactCache: the C++ client's view of the machine's artifact store (the client core's
// ArtifactStore, client/core/store.h, which states the layout and the verification rules), so
// that loading a handle twice (in one process or in many, in C++ or in Python) fetches its
// artifacts once. It adds GetOrFetch: fetches of one digest are serialised through the store's
// lock file, across threads and processes. Beside the artifacts it keeps kilnd's answers to
// this machine's requests (the core's AnswerFolder, client/core/answers.h), which the Python
// package reads and writes too.
//
// Thread-safety: thread-safe. Several processes may share one root.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/core/answers.h"
#include "client/core/store.h"

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
  // As GetOrFetch, for a `fetch` that checks the bytes it returns against `digest` itself
  // (Client::FetchArtifact does): they are stored without being hashed a second time.
  absl::StatusOr<std::string> GetOrFetchVerified(const std::string& digest, const FetchFn& fetch);

  // The answer kilnd gave saved under `name` (core::AnswerName of the daemon's address and the
  // request key) when it is there, intact and at most `max_age` old, with whether its file is
  // private to this user; nullopt otherwise (a damaged file is removed). InvalidArgument for a
  // malformed name.
  absl::StatusOr<std::optional<core::AnswerFolder::Answer>> LoadAnswer(
      const std::string& name, absl::Duration max_age) const;
  // Saves `response` (a serialized CompileResponse the caller's trust policy accepted) as the
  // answer `name`; its age starts again.
  absl::Status SaveAnswer(const std::string& name, std::string_view response) const;
  // Forgets the answer `name`.
  absl::Status DropAnswer(const std::string& name) const;

  const std::string& root() const { return store_->root(); }
  ArtifactCacheStats stats() const;

 private:
  explicit ArtifactCache(std::unique_ptr<core::ArtifactStore> store)
      : store_(std::move(store)), answers_(store_->root()) {}
  absl::StatusOr<std::string> FindOrFetch(const std::string& digest, const FetchFn& fetch,
                                          bool fetch_verifies);

  const std::unique_ptr<core::ArtifactStore> store_;
  const core::AnswerFolder answers_;
  std::atomic<int64_t> hits_{0};
  std::atomic<int64_t> fetches_{0};
};

}  // namespace kiln::client
