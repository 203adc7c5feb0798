// Helpers of the client tests: a scratch folder, files read, written and aged, a loopback port
// with nothing listening, and a kilnd that a whole suite shares.
// Thread-safety: free functions without shared state; SuiteDaemon has one owner.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/integration/kilnd_process.h"

namespace kiln::client {

// A fresh folder under the system's temporary folder, or "" when it cannot be made.
inline std::string MakeTempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-client-XXXXXX").string();
  return mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
}

// The bytes of the file at `path` ("" when it cannot be read).
inline std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Replaces the file's bytes in place (the same file, as a careless writer would).
inline void Overwrite(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// Moves the file's modification time `seconds` into the past; false when it cannot.
inline bool Age(const std::string& path, int seconds) {
  struct timespec times[2];
  clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= seconds;
  times[1] = times[0];
  return utimensat(AT_FDCWD, path.c_str(), times, 0) == 0;
}

// A loopback port with (almost certainly) nothing listening: bound, then released.
inline int DeadPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// A scratch folder and a kilnd serving from it, for a suite that shares one daemon: made in
// SetUpTestSuite, stopped (EXPECT the exit status) and deleted in TearDownTestSuite.
class SuiteDaemon {
 public:
  SuiteDaemon() : dir_(MakeTempDir()) {}
  SuiteDaemon(const SuiteDaemon&) = delete;
  SuiteDaemon& operator=(const SuiteDaemon&) = delete;
  ~SuiteDaemon() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Starts kilnd with its store in dir()/server-cache: "" on success, else what failed.
  std::string Start(std::vector<std::string> args = {}, bool quiet = false) {
    if (dir_.empty()) return "no scratch folder";
    return kilnd_.Start(dir_ + "/server-cache", std::move(args), quiet);
  }
  const std::string& dir() const { return dir_; }
  testing::KilndProcess& kilnd() { return kilnd_; }

 private:
  const std::string dir_;
  testing::KilndProcess kilnd_;
};

}  // namespace kiln::client
