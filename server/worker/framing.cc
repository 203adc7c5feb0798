#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/worker/worker.h"

namespace kiln::worker {
namespace {

// Larger than any compile request kilnd accepts or any artifact set it produces.
constexpr uint32_t kMaxFrameBytes = uint32_t{1} << 30;

// Waits until `fd` is readable. OK, DeadlineExceeded or Cancelled.
absl::Status WaitReadable(int fd, absl::Time deadline, const std::atomic<bool>* cancel) {
  for (;;) {
    if (cancel != nullptr && cancel->load(std::memory_order_acquire)) {
      return absl::CancelledError("cancelled");
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("deadline");
    const absl::Duration slice = cancel != nullptr ? std::min(left, kPollInterval) : left;
    // -1: wait without a timeout (an infinite deadline and nothing to watch).
    const int ms = slice == absl::InfiniteDuration()
                       ? -1
                       : static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(slice) + 1,
                                                            int64_t{1} << 30));
    struct pollfd pfd = {fd, POLLIN, 0};
    const int n = poll(&pfd, 1, ms);
    if (n > 0) return absl::OkStatus();  // readable, or hung up: the read tells which
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll: ", strerror(errno)));
    }
  }
}

// Reads exactly `size` bytes. `*got_any` says whether any byte arrived (to tell a clean end
// of stream from a broken message).
absl::Status ReadFull(int fd, char* data, size_t size, absl::Time deadline,
                      const std::atomic<bool>* cancel, bool* got_any) {
  size_t done = 0;
  while (done < size) {
    if (absl::Status s = WaitReadable(fd, deadline, cancel); !s.ok()) return s;
    const ssize_t n = recv(fd, data + done, size - done, 0);
    if (n == 0) return absl::UnavailableError("end of stream");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::UnavailableError(absl::StrCat("recv: ", strerror(errno)));
    }
    done += static_cast<size_t>(n);
    *got_any = true;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& message) {
  std::string bytes;
  if (!message.SerializeToString(&bytes) || bytes.size() > kMaxFrameBytes) {
    return absl::InternalError("worker message does not serialize");
  }
  const auto size = static_cast<uint32_t>(bytes.size());
  const char header[4] = {static_cast<char>(size), static_cast<char>(size >> 8),
                          static_cast<char>(size >> 16), static_cast<char>(size >> 24)};
  bytes.insert(0, header, sizeof header);
  size_t done = 0;
  while (done < bytes.size()) {
    // MSG_NOSIGNAL: a dead peer is an error to report, not a SIGPIPE to die of.
    const ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadFrame(int fd, google::protobuf::MessageLite* out, absl::Time deadline,
                       const std::atomic<bool>* cancel) {
  unsigned char header[4];
  bool got_any = false;
  absl::Status s =
      ReadFull(fd, reinterpret_cast<char*>(header), sizeof header, deadline, cancel, &got_any);
  if (absl::IsUnavailable(s) && !got_any) return absl::NotFoundError("end of stream");
  if (!s.ok()) return s;
  const uint32_t size = header[0] | (uint32_t{header[1]} << 8) | (uint32_t{header[2]} << 16) |
                        (uint32_t{header[3]} << 24);
  if (size > kMaxFrameBytes) {
    return absl::DataLossError(absl::StrCat("worker frame of ", size, " bytes"));
  }
  std::string body(size, '\0');
  if (s = ReadFull(fd, body.data(), size, deadline, cancel, &got_any); !s.ok()) return s;
  if (!out->ParseFromString(body)) return absl::DataLossError("worker message does not parse");
  return absl::OkStatus();
}

}  // namespace kiln::worker
