#include "client/core/answers.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <utility>

#include "client/core/files.h"
#include "kernels/key/sha256.h"

namespace kiln::core {
namespace {

// The first line of every answer file (FORMAT.md); the SHA-256 of the response follows, raw.
constexpr std::string_view kMagic = "kiln-answer-v1\n";

// The whole file behind `fd`, whose size fstat gave as `size` (read on to the end all the
// same, so that a file that grew is seen whole and fails its check). False when it cannot be
// read.
bool ReadAll(int fd, off_t size, std::string* out) {
  out->resize(static_cast<size_t>(size) + 1);
  size_t done = 0;
  for (;;) {
    if (done == out->size()) out->resize(out->size() * 2);
    const ssize_t n = read(fd, out->data() + done, out->size() - done);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  out->resize(done);
  return true;
}

// Seconds from `then` to now, by the wall clock (modification times are wall-clock times).
double SecondsSince(const struct timespec& then) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec - then.tv_sec) +
         static_cast<double>(now.tv_nsec - then.tv_nsec) * 1e-9;
}

}  // namespace

std::string AnswerName(std::string_view address, std::string_view request_key) {
  std::string text;
  text.reserve(address.size() + 1 + request_key.size());
  text.append(address);
  text.push_back('\0');
  text.append(request_key);
  return key::Sha256Hex(text);
}

AnswerFolder::AnswerFolder(std::string root) : dir_(std::move(root) + "/answers") {}

std::string AnswerFolder::PathFor(std::string_view name) const { return ShardedPath(dir_, name); }

std::optional<AnswerFolder::Answer> AnswerFolder::Load(std::string_view name, double max_age_s,
                                                       Error* error) const {
  if (!CheckDigest(name, error)) return std::nullopt;
  if (!(max_age_s > 0)) return std::nullopt;
  const std::string path = PathFor(name);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st;
  std::string data;
  const bool read = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                    SecondsSince(st.st_mtim) <= max_age_s && ReadAll(fd, st.st_size, &data);
  close(fd);
  if (!read) return std::nullopt;
  const size_t head = kMagic.size() + key::kDigestBytes;
  std::string_view view(data);
  if (view.size() < head || view.substr(0, kMagic.size()) != kMagic ||
      key::Sha256Raw(view.substr(head)) != view.substr(kMagic.size(), key::kDigestBytes)) {
    // Removed only while the name still holds the file read: a whole answer renamed into
    // place meanwhile stays.
    struct stat now;
    if (stat(path.c_str(), &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev) {
      unlink(path.c_str());
    }
    return std::nullopt;
  }
  Answer answer;
  answer.is_private = st.st_uid == geteuid() && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
  data.erase(0, head);
  answer.response = std::move(data);
  return answer;
}

bool AnswerFolder::Save(std::string_view name, std::string_view response, Error* error) const {
  if (!CheckDigest(name, error)) return false;
  const std::string path = PathFor(name);
  if (!MakeParent(path, error)) return false;
  const std::string hash = key::Sha256Raw(response);
  if (hash.size() != key::kDigestBytes) {  // empty: OpenSSL could not allocate
    return error->Fail(KILN_CORE_INTERNAL, "SHA-256 failed in OpenSSL");
  }
  return WriteAtomically(path, ".tmp-", {kMagic, hash, response}, /*durable=*/false, error);
}

bool AnswerFolder::Drop(std::string_view name, Error* error) const {
  if (!CheckDigest(name, error)) return false;
  unlink(PathFor(name).c_str());
  return true;
}

}  // namespace kiln::core
