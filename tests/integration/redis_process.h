// RedisProcess: a real redis-server child on a free loopback port, for tests and benchmarks;
// RedisCluster: three of them made into a 3-master Redis Cluster with redis-cli.
//
// Start() picks a random port, launches redis-server bound to 127.0.0.1 with persistence off
// and its files in a private directory, and waits until it answers (as itself, not as another
// server on that port). Stop() ends it (SIGKILL; a cache needs no clean shutdown); StartAgain()
// brings it back on the same port. The destructor kills a child still running, also when a test
// failed half way. Thread-safety: not thread-safe; one owner.
#pragma once

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace kiln::testing {

// A port to try: random in 20000..59999, so concurrent tests rarely collide; a port that
// turns out to be taken makes redis-server exit at start and Start() tries another.
inline int RandomLoopbackPort() {
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  return 20000 + static_cast<int>(rng() % 40000);
}

// One command on a fresh connection (1 s timeouts); nullptr when the server did not answer.
using RedisReplyPtr = std::unique_ptr<redisReply, void (*)(void*)>;
inline RedisReplyPtr RedisCall(int port, const std::vector<std::string>& args) {
  RedisReplyPtr none(nullptr, freeReplyObject);
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, timeval{1, 0});
  if (c == nullptr) return none;
  if (c->err != 0) {
    redisFree(c);
    return none;
  }
  redisSetTimeout(c, timeval{1, 0});
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  void* r = redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data());
  redisFree(c);
  return RedisReplyPtr(static_cast<redisReply*>(r), freeReplyObject);
}

class RedisProcess {
 public:
  RedisProcess() = default;
  RedisProcess(const RedisProcess&) = delete;
  RedisProcess& operator=(const RedisProcess&) = delete;
  ~RedisProcess() {
    Stop();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Empty on success, else what went wrong. `extra` are more redis-server arguments.
  std::string Start(std::vector<std::string> extra = {}) {
    extra_ = std::move(extra);
    if (dir_.empty()) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-redis-XXXXXX").string();
      if (mkdtemp(tmpl.data()) == nullptr) return "mkdtemp failed";
      dir_ = tmpl;
    }
    std::string error;
    for (int attempt = 0; attempt < 8; ++attempt) {  // a port in use: try another
      port_ = RandomLoopbackPort();
      error = Launch();
      if (error.empty()) return "";
    }
    return error;
  }

  // Back on the same port after Stop().
  std::string StartAgain() { return Launch(); }

  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string url() const { return "redis://" + address(); }

 private:
  std::string Launch() {
    std::vector<std::string> args = {"redis-server",
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     dir_,
                                     "--protected-mode",
                                     "no",
                                     "--logfile",
                                     dir_ + "/redis.log"};
    for (const std::string& a : extra_) args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ < 0) return "fork failed";
    if (pid_ == 0) {
      execvp("redis-server", argv.data());
      _exit(127);
    }
    for (int i = 0; i < 500; ++i) {  // up to 5 s
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return "redis-server exited at start (port " + std::to_string(port_) + ")";
      }
      // Ours, not another server that already had the port: INFO names its process id.
      RedisReplyPtr info = RedisCall(port_, {"INFO", "server"});
      if (info != nullptr && info->type == REDIS_REPLY_STRING &&
          std::string(info->str, info->len).find("process_id:" + std::to_string(pid_) + "\r") !=
              std::string::npos) {
        return "";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Stop();
    return "redis-server did not answer within 5 s";
  }

  pid_t pid_ = -1;
  int port_ = 0;
  std::string dir_;
  std::vector<std::string> extra_;
};

// Three cluster-enabled redis-servers joined by `redis-cli --cluster create` into a cluster of
// three masters (no replicas), ready when every node reports cluster_state:ok.
class RedisCluster {
 public:
  // `extra`: more redis-server arguments for every node.
  std::string Start(std::vector<std::string> extra = {}) {
    for (auto& node : nodes_) {
      node = std::make_unique<RedisProcess>();
      std::vector<std::string> args = {"--cluster-enabled",      "yes",
                                       "--cluster-config-file",  "nodes.conf",
                                       "--cluster-node-timeout", "2000"};
      args.insert(args.end(), extra.begin(), extra.end());
      const std::string error = node->Start(args);
      if (!error.empty()) return error;
    }
    std::string command = "redis-cli --cluster create";
    for (auto& node : nodes_) command += " " + node->address();
    command += " --cluster-replicas 0 --cluster-yes >/dev/null 2>&1";
    if (std::system(command.c_str()) != 0) return "redis-cli --cluster create failed";
    for (int i = 0; i < 1000; ++i) {  // up to 10 s
      bool ok = true;
      for (auto& node : nodes_) {
        RedisReplyPtr info = RedisCall(node->port(), {"CLUSTER", "INFO"});
        ok = ok && info != nullptr && info->type == REDIS_REPLY_STRING &&
             std::string(info->str, info->len).find("cluster_state:ok") != std::string::npos;
      }
      if (ok) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return "the cluster did not reach cluster_state:ok within 10 s";
  }

  // redis-cluster://H1:P1,H2:P2,H3:P3, or only the first node (the rest is learned).
  std::string url(bool all_nodes = true) const {
    std::string out = "redis-cluster://";
    for (size_t i = 0; i < (all_nodes ? nodes_.size() : 1); ++i) {
      out += (i > 0 ? "," : "") + nodes_[i]->address();
    }
    return out;
  }
  RedisProcess& node(int i) { return *nodes_[i]; }

 private:
  std::array<std::unique_ptr<RedisProcess>, 3> nodes_;
};

}  // namespace kiln::testing
