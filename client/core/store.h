// ArtifactStore: the machine's content-addressed artifact folder, shared by every kiln client
// (the C++ Session and the Python package go through this one class) and every process.
//
// Layout under the root:
//
//   artifacts/<d0d1>/<digest>          the bytes whose lowercase hex SHA-256 is <digest>
//   artifacts/<d0d1>/<digest>.lock     empty; flock()ed while <digest> is fetched or repaired
//   artifacts/<d0d1>/.<digest>.XXXXXX  a write in progress (or one a crash left)
//   cas/<d0d1>/<digest>                where Python clients before the shared layout kept
//                                      artifacts; moved into artifacts/ when first asked for
//
// <d0d1> is the digest's first two hex digits, which keeps folders small. A file is written to
// a temporary name in its final folder, fsynced and renamed into place, so a file under its
// final name is always whole. It may have been damaged since, so a file is hashed before its
// first use in a process and again whenever its inode, size, modification time or status-change
// time changes (any write moves the last, and no call can set it back); one
// whose SHA-256 is not its name is deleted (under the lock, so that a good copy renamed into
// place meanwhile is never removed) and counts as absent.
//
// Thread-safety: thread-safe. Several processes may share one root.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "client/core/error.h"

namespace kiln::core {

// An exclusive flock() on a digest's lock file, released with the object.
class StoreLock {
 public:
  StoreLock(StoreLock&& other) noexcept;
  StoreLock& operator=(StoreLock&&) = delete;
  ~StoreLock();

 private:
  friend class ArtifactStore;
  explicit StoreLock(int fd) : fd_(fd) {}
  int fd_;
};

class ArtifactStore {
 public:
  struct Counters {
    int64_t hits = 0;         // finds answered with a verified file
    int64_t corruptions = 0;  // files whose bytes did not match their name, deleted
    int64_t puts = 0;         // artifacts written
  };

  // $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; "" (and an error)
  // when none is set.
  static std::string DefaultRoot(Error* error);
  // Opens the store at `root` (DefaultRoot() when empty), creating its folder. Null on failure.
  static std::unique_ptr<ArtifactStore> Open(const std::string& root, Error* error);

  const std::string& root() const { return root_; }
  // Where `digest` lives (whether or not it is there): the layout above, known here alone.
  // REQUIRES: key::IsDigest(digest).
  std::string PathFor(std::string_view digest) const;
  // PathFor for a digest from outside (the C ABI's callers): nullopt and INVALID_ARGUMENT for a
  // malformed one, which must never become a path.
  std::optional<std::string> CheckedPathFor(std::string_view digest, Error* error) const;

  // The path of a verified artifact; nullopt when absent (a corrupt file is deleted and is
  // absent) or on failure (then `error` is set).
  std::optional<std::string> Find(std::string_view digest, Error* error);
  // As Find, for a caller that holds the digest's lock (LockFor) already.
  std::optional<std::string> FindLocked(std::string_view digest, Error* error);
  // Checks that `bytes` hash to `digest` (DATA_LOSS otherwise, nothing written), then writes
  // them atomically; the path, or nullopt on failure.
  std::optional<std::string> Put(std::string_view digest, std::string_view bytes, Error* error);
  // As Put, for bytes the caller has just checked against `digest` itself (a fetch that hashes
  // what it received): they are not hashed a second time. REQUIRES: the SHA-256 of `bytes` is
  // `digest` (were it not, the next Find would delete the file as corrupt).
  std::optional<std::string> PutVerified(std::string_view digest, std::string_view bytes,
                                         Error* error);
  // Writes `bytes` atomically under their SHA-256, computed here once, into `*digest`: for a
  // caller that has no digest of its own, which Put would only make it compute twice. The
  // path, or nullopt on failure. REQUIRES: digest != nullptr.
  std::optional<std::string> Add(std::string_view bytes, std::string* digest, Error* error);
  // Serialises fetches (and repairs) of one digest across threads and processes.
  std::optional<StoreLock> LockFor(std::string_view digest, Error* error);

  Counters counters() const;

 private:
  explicit ArtifactStore(std::string root) : root_(std::move(root)) {}
  enum class Check { kValid, kMissing, kCorrupt };
  // Verifies the file at `path` (hashing it unless this process verified the same file).
  Check Verify(const std::string& path, std::string_view digest, Error* error);
  // Verify, deleting a corrupt file; the caller holds the digest's lock.
  Check VerifyAndRepairLocked(std::string_view digest, Error* error);
  // Writes `bytes`, which hash to `digest`, under it (unless a valid copy is there already).
  std::optional<std::string> Write(std::string_view digest, std::string_view bytes, Error* error);
  // Moves a legacy cas/ copy into place; true when there was one.
  bool AdoptLegacy(std::string_view digest, const std::string& path);
  void Remember(std::string_view digest, const std::string& path);

  const std::string root_;
  // digest -> identity (inode, size, mtime, ctime) of the file whose bytes this process verified.
  struct FileId {
    uint64_t inode = 0;
    int64_t size = 0;
    int64_t mtime_ns = 0;
    int64_t ctime_ns = 0;
    bool operator==(const FileId&) const = default;
  };
  static FileId IdOf(const struct stat& st);
  std::mutex mu_;
  std::map<std::string, FileId, std::less<>> verified_;  // guarded by mu_
  std::atomic<int64_t> hits_{0}, corruptions_{0}, puts_{0};
};

}  // namespace kiln::core
