// RedisClient: kilnd's connection to the shared cache tier.
//
// It speaks to one standalone Redis (redis://[[USER]:PASSWORD@]HOST:PORT[/DB]) or to a Redis
// Cluster (redis-cluster://[[USER]:PASSWORD@]H1:P1,H2:P2,...); rediss:// and rediss-cluster://
// are the same over TLS (RedisTlsOptions: CA, client certificate, server name; see
// redis_connection.h). With a password every new connection authenticates first (AUTH, with the
// ACL user when one is named); the password never appears in logs, errors or stats
// (`description()` shows it as ***). A server that refuses the client (NOAUTH, WRONGPASS,
// NOPERM) or a TLS handshake that fails counts as down, with its reason logged: a shared tier
// that takes no writes must not report itself as serving.
//
// In cluster mode it keeps the slot map (CLUSTER SLOTS), routes each command by the hash slot
// of its key (CRC16 of the key, or of the part between the first "{" and the next "}" when
// that part is non-empty), follows MOVED (updating the map) and ASK (one ASKING + retry on the
// named node) redirections, up to a few hops.
//
// Every call is bounded: connects and commands time out (`connect_timeout`,
// `command_timeout`). After an I/O failure (refused, reset, timed out) the server node that
// failed is "down" for `retry_interval`: calls routed to it fail at once with Unavailable
// instead of waiting on a dead server, and the first call after the interval probes again. In
// a cluster that is one master: the keys of its slots miss while the other masters' keys keep
// working (a failover that promotes its replica is learned from the next slot map), and the
// client as a whole is available while any node is. The change from up to down and back is
// logged once per node, not per call. Other error replies from a reachable server ("-OOM
// ...", "-ERR ...", "-CLUSTERDOWN ...") are FailedPrecondition and do not mark it down. (A
// cluster keeps serving the healthy masters' slots only with `cluster-require-full-coverage
// no`; with the default, Redis itself refuses every key once a master has been gone for
// `cluster-node-timeout`.)
//
// Connections (RedisConnection) are pooled per server node; one that saw an I/O error is closed.
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/shared/redis_connection.h"

namespace kiln::shared {

struct RedisOptions {
  bool cluster = false;
  std::vector<RedisEndpoint> seeds;  // one for standalone; any known nodes for a cluster
  int db = 0;                        // standalone only (a cluster has just db 0)
  std::string username;              // ACL user; empty: the default user
  std::string password;              // empty: no AUTH
  RedisTlsOptions tls;
  absl::Duration connect_timeout = absl::Milliseconds(250);
  absl::Duration command_timeout = absl::Milliseconds(250);
  absl::Duration retry_interval = absl::Seconds(1);
  int max_idle_connections = 32;  // per node
};

// "redis://[[USER]:PASSWORD@]HOST:PORT[/DB]" or "redis-cluster://[[USER]:PASSWORD@]H1:P1,..."
// (user and password percent-encoded where needed), or the same with rediss:// and
// rediss-cluster:// (tls.enabled) -> options with default timeouts.
// InvalidArgument naming the part that is wrong, the password never quoted.
absl::StatusOr<RedisOptions> ParseRedisUrl(absl::string_view url);

// `url` with its password replaced by ***, for messages.
std::string RedactRedisUrl(absl::string_view url);

// The hash slot (0..16383) Redis Cluster assigns `key`, hash tags included.
uint16_t KeySlot(absl::string_view key);

class RedisClient {
 public:
  // Connects to nothing yet: a server that is down at start is simply "down" on first use.
  // With options.tls.enabled the TLS files are read here; when they cannot be used every call
  // fails Unavailable naming why (Create reports it at once instead).
  // REQUIRES: options.seeds non-empty.
  explicit RedisClient(RedisOptions options);
  // The constructor, but InvalidArgument when the TLS files cannot be used.
  static absl::StatusOr<std::unique_ptr<RedisClient>> Create(RedisOptions options);
  ~RedisClient();

  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Runs one command. args[key_index] is the key that routes it in cluster mode (ignored in
  // standalone mode). Unavailable when no answer came in time or the client is down;
  // FailedPrecondition for an error reply.
  absl::StatusOr<RedisReply> Command(const std::vector<absl::string_view>& args,
                                     size_t key_index = 1);

  // False while calls fail fast after an I/O failure: of the server, or of every cluster node
  // the client knows.
  bool available() const {
    const int down = down_nodes_.load(std::memory_order_relaxed);
    return down == 0 || down < known_nodes_.load(std::memory_order_relaxed);
  }
  // Server nodes in their fail-fast interval now (0 or 1 for a standalone server).
  int nodes_down() const { return down_nodes_.load(std::memory_order_relaxed); }
  // Times a node went from up to down.
  int64_t outages() const { return outages_.load(std::memory_order_relaxed); }
  // Calls that failed (I/O, timeouts, fail-fast while down, error replies).
  int64_t errors() const { return errors_.load(std::memory_order_relaxed); }
  // Whether it talks to a Redis Cluster (multi-key commands must then stay in one slot).
  bool cluster() const { return options_.cluster; }
  // What the client was made from, for logs ("redis://127.0.0.1:6379").
  const std::string& description() const { return description_; }

 private:
  struct Node;

  Node* NodeFor(const std::string& host, int port) ABSL_LOCKS_EXCLUDED(mu_);
  Node* NodeForSlot(uint16_t slot) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RefreshSlots() ABSL_LOCKS_EXCLUDED(mu_);
  // One attempt on one node. `asking` prefixes the command with ASKING on the same connection.
  absl::StatusOr<RedisReply> RunOn(Node* node, const std::vector<absl::string_view>& args,
                                   bool asking);
  // Whether `node` is inside its fail-fast interval.
  static bool FailsFast(const Node& node);
  void MarkDown(Node* node, const std::string& why);
  void MarkUp(Node* node);

  // Immutable after construction.
  const RedisOptions options_;
  const std::string description_;
  // Set when options_.tls.enabled: the context, or why there is none.
  const absl::StatusOr<std::shared_ptr<const RedisTls>> tls_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
  std::vector<Node*> slots_ ABSL_GUARDED_BY(mu_);  // cluster: 16384 entries, nullptr unknown
  absl::Time slots_refreshed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  std::atomic<int> known_nodes_{0};
  std::atomic<int> down_nodes_{0};
  std::atomic<int64_t> outages_{0};
  std::atomic<int64_t> errors_{0};
};

}  // namespace kiln::shared
