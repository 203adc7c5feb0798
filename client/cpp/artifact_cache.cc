#include "client/cpp/artifact_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/key/digest.h"
#include "kernels/util/status_macros.h"

namespace kiln::client {
namespace {

absl::Status ErrnoError(const std::string& what, const std::string& path, int err) {
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  // A full or read-only disk is the environment's problem, and may pass; anything else here
  // is unexpected.
  if (err == ENOSPC || err == EROFS || err == EDQUOT || err == EACCES || err == EPERM) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

// An exclusive flock() on a lock file, released (with the descriptor) on destruction.
class FileLock {
 public:
  static absl::StatusOr<FileLock> Acquire(const std::string& path) {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError("cannot open lock file", path, errno);
    while (flock(fd, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      return ErrnoError("cannot lock", path, err);
    }
    return FileLock(fd);
  }
  FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileLock& operator=(FileLock&&) = delete;
  ~FileLock() {
    if (fd_ >= 0) close(fd_);
  }

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

// Reads the whole file; nullopt when it does not exist.
absl::StatusOr<std::optional<std::string>> ReadFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    return ErrnoError("cannot open", path, errno);
  }
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      return ErrnoError("cannot read", path, err);
    }
    bytes.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return bytes;
}

absl::Status WriteAll(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", path, errno);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Makes a rename inside `dir` durable.
void SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the file itself is already synced
  fsync(fd);
  close(fd);
}

}  // namespace

absl::StatusOr<std::string> ArtifactCache::DefaultRoot() {
  if (const char* dir = std::getenv("KILN_CACHE_DIR"); dir != nullptr && *dir != '\0') {
    return std::string(dir);
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/kiln");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return absl::StrCat(home, "/.cache/kiln");
  }
  return absl::FailedPreconditionError("no artifact cache directory: set KILN_CACHE_DIR (or HOME)");
}

absl::StatusOr<std::unique_ptr<ArtifactCache>> ArtifactCache::Open(const std::string& root) {
  std::string dir = root;
  if (dir.empty()) {
    KILN_ASSIGN_OR_RETURN(dir, DefaultRoot());
  }
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(dir) / "artifacts", error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create artifact cache ", dir, ": ", error.message()));
  }
  return std::unique_ptr<ArtifactCache>(new ArtifactCache(std::move(dir)));
}

std::string ArtifactCache::PathFor(const std::string& digest) const {
  return absl::StrCat(root_, "/artifacts/", digest.substr(0, 2), "/", digest);
}

absl::StatusOr<ArtifactCache::Check> ArtifactCache::Verify(const std::string& path,
                                                           const std::string& digest) const {
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> bytes, ReadFile(path));
  if (!bytes.has_value()) return Check::kMissing;
  return key::Sha256Hex(*bytes) == digest ? Check::kValid : Check::kCorrupt;
}

absl::StatusOr<ArtifactCache::Check> ArtifactCache::VerifyAndRepairLocked(
    const std::string& digest) {
  const std::string path = PathFor(digest);
  KILN_ASSIGN_OR_RETURN(Check check, Verify(path, digest));
  if (check != Check::kCorrupt) return check;
  corruptions_.fetch_add(1, std::memory_order_relaxed);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("cannot delete corrupt artifact", path, errno);
  }
  return Check::kMissing;
}

absl::StatusOr<std::optional<std::string>> ArtifactCache::Find(const std::string& digest) {
  if (!key::IsDigest(digest)) {
    return absl::InvalidArgumentError(absl::StrCat("'", digest, "' is not a SHA-256 digest"));
  }
  const std::string path = PathFor(digest);
  KILN_ASSIGN_OR_RETURN(Check check, Verify(path, digest));
  if (check == Check::kValid) return path;
  if (check == Check::kMissing) return std::nullopt;
  // Delete only under the lock: unlocked, this could remove a good copy that a fetcher
  // renamed into place after our read.
  KILN_ASSIGN_OR_RETURN(FileLock lock, FileLock::Acquire(path + ".lock"));
  KILN_ASSIGN_OR_RETURN(check, VerifyAndRepairLocked(digest));
  if (check == Check::kValid) return path;
  return std::nullopt;
}

absl::Status ArtifactCache::WriteAtomically(const std::string& path, const std::string& digest,
                                            const std::string& bytes) const {
  const std::string dir = path.substr(0, path.rfind('/'));
  // The temporary lives in the final directory: rename is atomic only within a file system.
  std::string temp = absl::StrCat(dir, "/.", digest, ".XXXXXX");
  const int fd = mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot create temporary file in", dir, errno);
  absl::Status status = WriteAll(fd, bytes, temp);
  // Artifacts are shared by every user of the cache; mkostemp made the file private.
  if (status.ok() && fchmod(fd, 0644) != 0) status = ErrnoError("cannot chmod", temp, errno);
  if (status.ok() && fsync(fd) != 0) status = ErrnoError("cannot fsync", temp, errno);
  if (close(fd) != 0 && status.ok()) status = ErrnoError("cannot close", temp, errno);
  if (status.ok() && rename(temp.c_str(), path.c_str()) != 0) {
    status = ErrnoError("cannot rename into", path, errno);
  }
  if (!status.ok()) {
    unlink(temp.c_str());
    return status;
  }
  SyncDirectory(dir);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ArtifactCache::Put(const std::string& digest,
                                               const std::string& bytes) {
  if (!key::IsDigest(digest)) {
    return absl::InvalidArgumentError(absl::StrCat("'", digest, "' is not a SHA-256 digest"));
  }
  if (const std::string got = key::Sha256Hex(bytes); got != digest) {
    return absl::DataLossError(
        absl::StrCat("bytes for artifact ", digest, " hash to ", got, "; not stored"));
  }
  const std::string path = PathFor(digest);
  std::error_code error;
  std::filesystem::create_directories(path.substr(0, path.rfind('/')), error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create directory for ", path, ": ", error.message()));
  }
  KILN_RETURN_IF_ERROR(WriteAtomically(path, digest, bytes));
  return path;
}

absl::StatusOr<std::string> ArtifactCache::GetOrFetch(const std::string& digest,
                                                      const FetchFn& fetch) {
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> found, Find(digest));
  if (found.has_value()) {
    hits_.fetch_add(1, std::memory_order_relaxed);
    return *std::move(found);
  }
  const std::string path = PathFor(digest);
  std::error_code error;
  std::filesystem::create_directories(path.substr(0, path.rfind('/')), error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create directory for ", path, ": ", error.message()));
  }
  KILN_ASSIGN_OR_RETURN(FileLock lock, FileLock::Acquire(path + ".lock"));
  // Whoever held the lock before us may have stored it meanwhile.
  KILN_ASSIGN_OR_RETURN(Check check, VerifyAndRepairLocked(digest));
  if (check == Check::kValid) {
    hits_.fetch_add(1, std::memory_order_relaxed);
    return path;
  }
  fetches_.fetch_add(1, std::memory_order_relaxed);
  KILN_ASSIGN_OR_RETURN(std::string bytes, fetch(digest));
  return Put(digest, bytes);
}

ArtifactCacheStats ArtifactCache::stats() const {
  ArtifactCacheStats s;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.fetches = fetches_.load(std::memory_order_relaxed);
  s.corruptions = corruptions_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace kiln::client
