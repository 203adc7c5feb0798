#include "client/core/files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <system_error>

#include "kernels/key/sha256.h"

namespace kiln::core {
namespace {

bool WriteAll(int fd, std::string_view bytes, const std::string& path, Error* error) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoFail(error, "cannot write", path, errno);
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// Makes a rename inside `dir` durable (best effort: the file itself is synced already).
void SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  fsync(fd);
  close(fd);
}

}  // namespace

bool ErrnoFail(Error* error, const std::string& what, const std::string& path, int err) {
  const bool environment =
      err == ENOSPC || err == EROFS || err == EDQUOT || err == EACCES || err == EPERM;
  return error->Fail(environment ? KILN_CORE_UNAVAILABLE : KILN_CORE_INTERNAL,
                     what + " " + path + ": " + std::strerror(err));
}

bool CheckDigest(std::string_view name, Error* error) {
  if (key::IsDigest(name)) return true;
  return error->Fail(
      KILN_CORE_INVALID_ARGUMENT,
      "'" + std::string(name) + "' is not a SHA-256 digest (64 lowercase hex digits)");
}

std::string ShardedPath(std::string_view dir, std::string_view name) {
  std::string path(dir);
  path += '/';
  path += name.substr(0, 2);
  path += '/';
  path += name;
  return path;
}

bool MakeParent(const std::string& path, Error* error) {
  std::error_code ec;
  std::filesystem::create_directories(path.substr(0, path.rfind('/')), ec);
  if (ec) {
    return error->Fail(KILN_CORE_UNAVAILABLE,
                       "cannot create the folder for " + path + ": " + ec.message());
  }
  return true;
}

bool WriteAtomically(const std::string& path, std::string_view temp_prefix,
                     std::initializer_list<std::string_view> pieces, bool durable, Error* error) {
  const std::string dir = path.substr(0, path.rfind('/'));
  // The temporary lives in the final folder: rename is atomic only within a file system.
  std::string temp = dir + "/" + std::string(temp_prefix) + "XXXXXX";
  const int fd = mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoFail(error, "cannot create a temporary file in", dir, errno);
  bool ok = true;
  for (std::string_view piece : pieces) {
    if (ok) ok = WriteAll(fd, piece, temp, error);
  }
  // The folders are shared by every user of the cache; mkostemp made the file private.
  if (ok && fchmod(fd, 0644) != 0) ok = ErrnoFail(error, "cannot chmod", temp, errno);
  if (ok && durable && fsync(fd) != 0) ok = ErrnoFail(error, "cannot fsync", temp, errno);
  if (close(fd) != 0 && ok) ok = ErrnoFail(error, "cannot close", temp, errno);
  if (ok && rename(temp.c_str(), path.c_str()) != 0)
    ok = ErrnoFail(error, "cannot rename into", path, errno);
  if (!ok) {
    unlink(temp.c_str());
    return false;
  }
  if (durable) SyncDirectory(dir);
  return true;
}

}  // namespace kiln::core
