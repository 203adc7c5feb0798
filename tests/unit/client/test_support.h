// Helpers of the client tests that run against real daemons: a scratch folder and a loopback
// port with nothing listening.
// Thread-safety: free functions without shared state.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace kiln::client {

// A fresh folder under the system's temporary folder, or "" when it cannot be made.
inline std::string MakeTempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-client-XXXXXX").string();
  return mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
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

}  // namespace kiln::client
