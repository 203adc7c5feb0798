#include "client/core/store.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include "client/core/files.h"
#include "kernels/key/sha256.h"
#include "openssl/evp.h"

namespace kiln::core {
namespace {

// Hashes the file at `path` into `hex`; false with errno's error when it cannot be read
// (ENOENT is reported through `missing`).
bool HashFile(const std::string& path, std::string* hex, bool* missing, Error* error) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      *missing = true;
      return true;
    }
    return ErrnoFail(error, "cannot open", path, errno);
  }
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      EVP_MD_CTX_free(ctx);
      return ErrnoFail(error, "cannot read", path, err);
    }
    EVP_DigestUpdate(ctx, buffer, static_cast<size_t>(n));
  }
  close(fd);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx, digest, &length);
  EVP_MD_CTX_free(ctx);
  *hex = key::DigestToHex(std::string_view(reinterpret_cast<const char*>(digest), length));
  return true;
}

}  // namespace

StoreLock::StoreLock(StoreLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
StoreLock::~StoreLock() {
  if (fd_ >= 0) close(fd_);
}

std::string ArtifactStore::DefaultRoot(Error* error) {
  if (const char* dir = std::getenv("KILN_CACHE_DIR"); dir != nullptr && *dir != '\0') return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return std::string(xdg) + "/kiln";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::string(home) + "/.cache/kiln";
  error->Fail(KILN_CORE_FAILED_PRECONDITION,
              "no artifact cache folder: set KILN_CACHE_DIR (or HOME)");
  return "";
}

std::unique_ptr<ArtifactStore> ArtifactStore::Open(const std::string& root, Error* error) {
  std::string dir = root.empty() ? DefaultRoot(error) : root;
  if (dir.empty()) return nullptr;
  // "~/x" as a shell would read it: Python callers hand over paths as users type them.
  if (dir[0] == '~' && (dir.size() == 1 || dir[1] == '/')) {
    const char* home = std::getenv("HOME");
    if (home != nullptr) dir = std::string(home) + dir.substr(1);
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(dir) / "artifacts", ec);
  if (ec) {
    error->Fail(KILN_CORE_FAILED_PRECONDITION,
                "cannot create the artifact cache " + dir + ": " + ec.message());
    return nullptr;
  }
  return std::unique_ptr<ArtifactStore>(new ArtifactStore(std::move(dir)));
}

std::string ArtifactStore::PathFor(std::string_view digest) const {
  return ShardedPath(root_ + "/artifacts", digest);
}

std::optional<std::string> ArtifactStore::CheckedPathFor(std::string_view digest,
                                                         Error* error) const {
  if (!CheckDigest(digest, error)) return std::nullopt;
  return PathFor(digest);
}

ArtifactStore::FileId ArtifactStore::IdOf(const struct stat& st) {
  return FileId{static_cast<uint64_t>(st.st_ino), static_cast<int64_t>(st.st_size),
                static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec};
}

void ArtifactStore::Remember(std::string_view digest, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return;
  const FileId id = IdOf(st);
  std::lock_guard<std::mutex> lock(mu_);
  verified_.insert_or_assign(std::string(digest), id);
}

ArtifactStore::Check ArtifactStore::Verify(const std::string& path, std::string_view digest,
                                           Error* error) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Check::kMissing;
    ErrnoFail(error, "cannot stat", path, errno);
    return Check::kMissing;
  }
  const FileId id = IdOf(st);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = verified_.find(digest); it != verified_.end() && it->second == id)
      return Check::kValid;
  }
  std::string hex;
  bool missing = false;
  if (!HashFile(path, &hex, &missing, error)) return Check::kMissing;
  if (missing) return Check::kMissing;
  if (hex != digest) return Check::kCorrupt;
  std::lock_guard<std::mutex> lock(mu_);
  verified_.insert_or_assign(std::string(digest), id);
  return Check::kValid;
}

bool ArtifactStore::AdoptLegacy(std::string_view digest, const std::string& path) {
  const std::string legacy = ShardedPath(root_ + "/cas", digest);
  if (access(legacy.c_str(), F_OK) != 0) return false;
  Error ignored;
  if (!MakeParent(path, &ignored)) return false;
  return rename(legacy.c_str(), path.c_str()) == 0;
}

ArtifactStore::Check ArtifactStore::VerifyAndRepairLocked(std::string_view digest, Error* error) {
  const std::string path = PathFor(digest);
  Check check = Verify(path, digest, error);
  if (check != Check::kCorrupt) return check;
  corruptions_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = verified_.find(digest); it != verified_.end()) verified_.erase(it);
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    ErrnoFail(error, "cannot delete the corrupt artifact", path, errno);
  }
  return Check::kMissing;
}

std::optional<StoreLock> ArtifactStore::LockFor(std::string_view digest, Error* error) {
  if (!CheckDigest(digest, error)) return std::nullopt;
  const std::string path = PathFor(digest) + ".lock";
  if (!MakeParent(path, error)) return std::nullopt;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    ErrnoFail(error, "cannot open the lock file", path, errno);
    return std::nullopt;
  }
  while (flock(fd, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    close(fd);
    ErrnoFail(error, "cannot lock", path, err);
    return std::nullopt;
  }
  return StoreLock(fd);
}

std::optional<std::string> ArtifactStore::Find(std::string_view digest, Error* error) {
  if (!CheckDigest(digest, error)) return std::nullopt;
  const std::string path = PathFor(digest);
  Check check = Verify(path, digest, error);
  if (!error->ok()) return std::nullopt;
  if (check == Check::kMissing && AdoptLegacy(digest, path)) check = Verify(path, digest, error);
  if (check == Check::kValid) {
    hits_.fetch_add(1, std::memory_order_relaxed);
    return path;
  }
  if (check == Check::kMissing) return std::nullopt;
  // Delete only under the lock: unlocked, this could remove a good copy that a fetcher renamed
  // into place after our read.
  std::optional<StoreLock> lock = LockFor(digest, error);
  if (!lock.has_value()) return std::nullopt;
  return FindLocked(digest, error);
}

std::optional<std::string> ArtifactStore::FindLocked(std::string_view digest, Error* error) {
  if (!CheckDigest(digest, error)) return std::nullopt;
  if (VerifyAndRepairLocked(digest, error) != Check::kValid) return std::nullopt;
  hits_.fetch_add(1, std::memory_order_relaxed);
  return PathFor(digest);
}

std::optional<std::string> ArtifactStore::Put(std::string_view digest, std::string_view bytes,
                                              Error* error) {
  if (!CheckDigest(digest, error)) return std::nullopt;
  if (const std::string got = key::Sha256Hex(bytes); got != digest) {
    error->Fail(KILN_CORE_DATA_LOSS,
                "bytes for artifact " + std::string(digest) + " hash to " + got + "; not stored");
    return std::nullopt;
  }
  return Write(digest, bytes, error);
}

std::optional<std::string> ArtifactStore::PutVerified(std::string_view digest,
                                                      std::string_view bytes, Error* error) {
  if (!CheckDigest(digest, error)) return std::nullopt;
  return Write(digest, bytes, error);
}

std::optional<std::string> ArtifactStore::Add(std::string_view bytes, std::string* digest,
                                              Error* error) {
  *digest = key::Sha256Hex(bytes);
  if (!key::IsDigest(*digest)) {  // empty: OpenSSL could not allocate
    error->Fail(KILN_CORE_INTERNAL, "SHA-256 failed in OpenSSL");
    return std::nullopt;
  }
  return Write(*digest, bytes, error);
}

std::optional<std::string> ArtifactStore::Write(std::string_view digest, std::string_view bytes,
                                                Error* error) {
  const std::string path = PathFor(digest);
  if (Verify(path, digest, error) == Check::kValid) return path;
  *error = Error();  // a file that cannot be read is replaced
  if (!MakeParent(path, error)) return std::nullopt;
  if (!WriteAtomically(path, "." + std::string(digest) + ".", {bytes}, /*durable=*/true, error)) {
    return std::nullopt;
  }
  puts_.fetch_add(1, std::memory_order_relaxed);
  Remember(digest, path);
  return path;
}

ArtifactStore::Counters ArtifactStore::counters() const {
  Counters c;
  c.hits = hits_.load(std::memory_order_relaxed);
  c.corruptions = corruptions_.load(std::memory_order_relaxed);
  c.puts = puts_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace kiln::core
