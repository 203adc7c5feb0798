#include "server/shared/redis_client.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"

namespace kiln::shared {
namespace {

constexpr int kSlots = 16384;
constexpr int kMaxRedirects = 5;

absl::StatusOr<RedisEndpoint> ParseEndpoint(absl::string_view text, absl::string_view url) {
  const size_t colon = text.rfind(':');
  RedisEndpoint e;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(text.substr(colon + 1), &e.port) || e.port <= 0 || e.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared cache URL '", url, "': '", text, "' is not HOST:PORT"));
  }
  e.host = std::string(text.substr(0, colon));
  return e;
}

// An error reply that says the server will not serve this client at all.
bool Refused(absl::string_view message) {
  return absl::StartsWith(message, "NOAUTH") || absl::StartsWith(message, "WRONGPASS") ||
         absl::StartsWith(message, "NOPERM") || absl::StartsWith(message, "ERR AUTH") ||
         absl::StartsWith(message, "ERR invalid password");
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381" -> the endpoint.
bool ParseRedirect(absl::string_view message, absl::string_view kind, RedisEndpoint* to) {
  if (!absl::ConsumePrefix(&message, kind)) return false;
  std::vector<absl::string_view> parts = absl::StrSplit(message, ' ', absl::SkipEmpty());
  if (parts.size() != 2) return false;
  absl::StatusOr<RedisEndpoint> e = ParseEndpoint(parts[1], message);
  if (!e.ok()) return false;
  *to = *std::move(e);
  return true;
}

// "%41" -> "A"; false on a malformed escape.
bool PercentDecode(absl::string_view in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    int value = 0;
    if (i + 2 >= in.size()) return false;  // "%" or "%4" at the end
    for (int k = 1; k <= 2; ++k) {
      const char c = in[i + k];
      const int d = absl::ascii_isdigit(c)   ? c - '0'
                    : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                    : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                             : -1;
      if (d < 0) return false;
      value = value * 16 + d;
    }
    out->push_back(static_cast<char>(value));
    i += 2;
  }
  return true;
}

// Where the user information of a URL ends ('@' before the host list), or npos.
size_t UserInfoEnd(absl::string_view rest) {
  const size_t at = rest.rfind('@');
  const size_t slash = rest.find('/');
  return at != absl::string_view::npos && (slash == absl::string_view::npos || at < slash)
             ? at
             : absl::string_view::npos;
}

}  // namespace

std::string RedactRedisUrl(absl::string_view url) {
  const size_t scheme = url.find("://");
  if (scheme == absl::string_view::npos) return std::string(url);
  absl::string_view rest = url.substr(scheme + 3);
  const size_t at = UserInfoEnd(rest);
  if (at == absl::string_view::npos) return std::string(url);
  absl::string_view info = rest.substr(0, at);
  const size_t colon = info.find(':');
  return absl::StrCat(url.substr(0, scheme + 3),
                      colon == absl::string_view::npos ? info : info.substr(0, colon), ":***",
                      rest.substr(at));
}

namespace {

absl::Status ParseUserInfo(absl::string_view info, absl::string_view url, RedisOptions* options) {
  const size_t colon = info.find(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared cache URL '", RedactRedisUrl(url),
                     "' names a user but no password (USER:PASSWORD@)"));
  }
  if (!PercentDecode(info.substr(0, colon), &options->username) ||
      !PercentDecode(info.substr(colon + 1), &options->password)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared cache URL '", RedactRedisUrl(url),
                     "': a malformed %-escape in the user or password"));
  }
  if (options->password.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared cache URL '", RedactRedisUrl(url), "' has an empty password"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RedisOptions> ParseRedisUrl(absl::string_view full_url) {
  RedisOptions options;
  const std::string redacted = RedactRedisUrl(full_url);
  const absl::string_view url = redacted;  // every message below quotes the redacted form
  absl::string_view rest = full_url;
  if (absl::ConsumePrefix(&rest, "redis-cluster://")) {
    options.cluster = true;
  } else if (absl::ConsumePrefix(&rest, "rediss-cluster://")) {
    options.cluster = true;
    options.tls.enabled = true;
  } else if (absl::ConsumePrefix(&rest, "rediss://")) {
    options.tls.enabled = true;
  } else if (!absl::ConsumePrefix(&rest, "redis://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared cache URL '", url,
                     "' must start with redis://, rediss:// (TLS), redis-cluster:// or "
                     "rediss-cluster://"));
  }
  if (const size_t at = UserInfoEnd(rest); at != absl::string_view::npos) {
    if (absl::Status s = ParseUserInfo(rest.substr(0, at), full_url, &options); !s.ok()) return s;
    rest = rest.substr(at + 1);
  }
  if (!options.cluster) {
    const size_t slash = rest.find('/');
    if (slash != absl::string_view::npos) {
      absl::string_view db = rest.substr(slash + 1);
      if (!db.empty() && (!absl::SimpleAtoi(db, &options.db) || options.db < 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("shared cache URL '", url, "': database '", db, "' is not a number"));
      }
      rest = rest.substr(0, slash);
    }
  }
  for (absl::string_view part : absl::StrSplit(rest, ',', absl::SkipEmpty())) {
    absl::StatusOr<RedisEndpoint> e = ParseEndpoint(part, url);
    if (!e.ok()) return e.status();
    options.seeds.push_back(*std::move(e));
  }
  if (options.seeds.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("shared cache URL '", url, "' names no server"));
  }
  if (!options.cluster && options.seeds.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared cache URL '", url,
                     "' names several servers; use redis-cluster:// (or rediss-cluster://) for a "
                     "cluster"));
  }
  return options;
}

uint16_t KeySlot(absl::string_view key) {
  // A non-empty {tag} routes by the tag alone, so related keys can share a slot.
  const size_t open = key.find('{');
  if (open != absl::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != absl::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  // CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as the cluster specification says.
  uint16_t crc = 0;
  for (unsigned char c : key) {
    crc ^= static_cast<uint16_t>(c) << 8;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc % kSlots;
}

struct RedisClient::Node {
  RedisEndpoint endpoint;
  absl::Mutex mu;
  std::vector<std::unique_ptr<RedisConnection>> idle ABSL_GUARDED_BY(mu);
  std::atomic<bool> down{false};
  std::atomic<int64_t> down_until_ns{0};  // absl::GetCurrentTimeNanos() scale
};

namespace {

absl::StatusOr<std::shared_ptr<const RedisTls>> MakeTls(const RedisTlsOptions& options) {
  if (!options.enabled) return std::shared_ptr<const RedisTls>();
  return RedisTls::Create(options);
}

}  // namespace

RedisClient::RedisClient(RedisOptions options)
    : options_(std::move(options)),
      description_(absl::StrCat(
          "redis", options_.tls.enabled ? "s" : "", options_.cluster ? "-cluster://" : "://",
          options_.password.empty() ? "" : absl::StrCat(options_.username, ":***@"),
          absl::StrJoin(
              options_.seeds, ",",
              [](std::string* out, const RedisEndpoint& e) { absl::StrAppend(out, e.ToString()); }),
          options_.db != 0 ? absl::StrCat("/", options_.db) : "")),
      tls_(MakeTls(options_.tls)) {
  absl::MutexLock lock(&mu_);
  if (options_.cluster) slots_.assign(kSlots, nullptr);
}

absl::StatusOr<std::unique_ptr<RedisClient>> RedisClient::Create(RedisOptions options) {
  auto client = std::make_unique<RedisClient>(std::move(options));
  if (!client->tls_.ok()) return client->tls_.status();
  return client;
}

RedisClient::~RedisClient() = default;

RedisClient::Node* RedisClient::NodeFor(const std::string& host, int port) {
  const std::string name = absl::StrCat(host, ":", port);
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Node>& node = nodes_[name];
  if (node == nullptr) {
    node = std::make_unique<Node>();
    node->endpoint = RedisEndpoint{host, port};
    known_nodes_.fetch_add(1, std::memory_order_relaxed);
  }
  return node.get();
}

RedisClient::Node* RedisClient::NodeForSlot(uint16_t slot) {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (slots_[slot] != nullptr) return slots_[slot];
  }
  // Unknown slot: learn the map (at most a few times a second), else ask a seed and let a
  // MOVED reply say where the slot lives.
  RefreshSlots().IgnoreError();
  {
    absl::ReaderMutexLock lock(&mu_);
    if (slots_[slot] != nullptr) return slots_[slot];
  }
  const RedisEndpoint& seed = options_.seeds[slot % options_.seeds.size()];
  return NodeFor(seed.host, seed.port);
}

absl::Status RedisClient::RefreshSlots() {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - slots_refreshed_ < absl::Milliseconds(200)) return absl::OkStatus();
    slots_refreshed_ = now;
  }
  // Ask the seeds first, then any node learned since; the first full answer wins. Nodes in
  // their fail-fast interval are skipped: each would cost a connect timeout.
  std::vector<RedisEndpoint> ask = options_.seeds;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, node] : nodes_) ask.push_back(node->endpoint);
  }
  absl::Status last = absl::UnavailableError("no cluster node answered CLUSTER SLOTS");
  for (const RedisEndpoint& e : ask) {
    Node* asked = NodeFor(e.host, e.port);
    if (FailsFast(*asked)) continue;
    absl::StatusOr<RedisReply> reply = RunOn(asked, {"CLUSTER", "SLOTS"}, false);
    if (!reply.ok()) {
      last = reply.status();
      continue;
    }
    if (reply->type != RedisReply::Type::kArray) continue;
    std::vector<std::pair<std::pair<int64_t, int64_t>, Node*>> ranges;
    for (const RedisReply& range : reply->elements) {
      if (range.elements.size() < 3 || range.elements[2].elements.size() < 2) continue;
      const RedisReply& master = range.elements[2];
      // An empty host means "the address you reached me on".
      const std::string host = master.elements[0].str.empty() ? e.host : master.elements[0].str;
      ranges.push_back({{range.elements[0].integer, range.elements[1].integer},
                        NodeFor(host, static_cast<int>(master.elements[1].integer))});
    }
    absl::MutexLock lock(&mu_);
    for (const auto& [span, node] : ranges) {
      for (int64_t s = std::max<int64_t>(0, span.first); s <= span.second && s < kSlots; ++s) {
        slots_[s] = node;
      }
    }
    return absl::OkStatus();
  }
  return last;
}

absl::StatusOr<RedisReply> RedisClient::RunOn(Node* node,
                                              const std::vector<absl::string_view>& args,
                                              bool asking) {
  std::unique_ptr<RedisConnection> conn;
  {
    absl::MutexLock lock(&node->mu);
    if (!node->idle.empty()) {
      conn = std::move(node->idle.back());
      node->idle.pop_back();
    }
  }
  if (conn == nullptr) {
    if (!tls_.ok()) return absl::UnavailableError(tls_.status().message());
    absl::StatusOr<std::unique_ptr<RedisConnection>> opened = RedisConnection::Open(
        node->endpoint, tls_->get(), options_.connect_timeout, options_.command_timeout);
    if (!opened.ok()) return opened.status();
    conn = *std::move(opened);
    if (!options_.password.empty()) {
      absl::StatusOr<RedisReply> authed =
          options_.username.empty() ? conn->Execute({"AUTH", options_.password})
                                    : conn->Execute({"AUTH", options_.username, options_.password});
      if (!authed.ok()) return authed.status();
    }
    if (!options_.cluster && options_.db != 0) {
      const std::string db = absl::StrCat(options_.db);
      absl::StatusOr<RedisReply> selected = conn->Execute({"SELECT", db});
      if (!selected.ok()) return selected.status();
    }
  }
  absl::StatusOr<RedisReply> reply = RedisReply();
  if (asking) reply = conn->Execute({"ASKING"});
  if (reply.ok()) reply = conn->Execute(args);
  // A connection that saw an I/O error or a timeout may hold a late reply: never reuse it.
  if (!conn->broken()) {
    absl::MutexLock lock(&node->mu);
    if (node->idle.size() < static_cast<size_t>(options_.max_idle_connections)) {
      node->idle.push_back(std::move(conn));
    }
  }
  return reply;
}

absl::StatusOr<RedisReply> RedisClient::Command(const std::vector<absl::string_view>& args,
                                                size_t key_index) {
  Node* node;
  if (options_.cluster) {
    node = NodeForSlot(key_index < args.size() ? KeySlot(args[key_index]) : 0);
  } else {
    node = NodeFor(options_.seeds[0].host, options_.seeds[0].port);
  }
  if (FailsFast(*node)) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnavailableError(
        options_.cluster
            ? absl::StrCat("shared cache ", description_, ": node ", node->endpoint.ToString(),
                           " is unreachable; retrying shortly")
            : absl::StrCat("shared cache ", description_, " is unreachable; retrying shortly"));
  }
  bool asking = false;
  absl::StatusOr<RedisReply> reply;
  for (int hop = 0; hop <= kMaxRedirects; ++hop) {
    reply = RunOn(node, args, asking);
    asking = false;
    if (!options_.cluster || !absl::IsFailedPrecondition(reply.status())) break;
    RedisEndpoint to;
    const std::string message(reply.status().message());
    if (ParseRedirect(message, "MOVED ", &to)) {
      // The slot moved for good: remember where, and relearn the whole map soon.
      Node* target = NodeFor(to.host, to.port);
      {
        absl::MutexLock lock(&mu_);
        slots_[KeySlot(args[key_index])] = target;
      }
      RefreshSlots().IgnoreError();
      node = target;
    } else if (ParseRedirect(message, "ASK ", &to)) {
      node = NodeFor(to.host, to.port);  // this one command only, during a migration
      asking = true;
    } else {
      break;
    }
  }
  if (absl::IsFailedPrecondition(reply.status()) && Refused(reply.status().message())) {
    // The server is there but will not serve kilnd (no password, a wrong one, an ACL that
    // forbids the command): as useless as an unreachable one, and logged as such.
    reply = absl::UnavailableError(
        absl::StrCat("the server refuses kilnd: ", reply.status().message()));
  }
  if (absl::IsUnavailable(reply.status())) {
    MarkDown(node, std::string(reply.status().message()));
    // A master that went away may have been replaced by its replica: the next map says.
    if (options_.cluster) RefreshSlots().IgnoreError();
  } else {
    MarkUp(node);
  }
  if (!reply.ok()) errors_.fetch_add(1, std::memory_order_relaxed);
  return reply;
}

bool RedisClient::FailsFast(const Node& node) {
  return node.down.load(std::memory_order_relaxed) &&
         absl::GetCurrentTimeNanos() < node.down_until_ns.load(std::memory_order_relaxed);
}

void RedisClient::MarkDown(Node* node, const std::string& why) {
  node->down_until_ns.store(
      absl::GetCurrentTimeNanos() + absl::ToInt64Nanoseconds(options_.retry_interval),
      std::memory_order_relaxed);
  if (!node->down.exchange(true, std::memory_order_relaxed)) {
    down_nodes_.fetch_add(1, std::memory_order_relaxed);
    outages_.fetch_add(1, std::memory_order_relaxed);
    if (options_.cluster) {
      spdlog::warn(
          "shared cache {}: node {} unreachable ({}): its slots are served from the local cache "
          "only, retrying every {}",
          description_, node->endpoint.ToString(), why,
          absl::FormatDuration(options_.retry_interval));
    } else {
      spdlog::warn(
          "shared cache {} unreachable ({}): serving from the local cache only, retrying every {}",
          description_, why, absl::FormatDuration(options_.retry_interval));
    }
  }
}

void RedisClient::MarkUp(Node* node) {
  if (node->down.exchange(false, std::memory_order_relaxed)) {
    down_nodes_.fetch_sub(1, std::memory_order_relaxed);
    if (options_.cluster) {
      spdlog::info("shared cache {}: node {} reachable again", description_,
                   node->endpoint.ToString());
    } else {
      spdlog::info("shared cache {} reachable again", description_);
    }
  }
}

}  // namespace kiln::shared
