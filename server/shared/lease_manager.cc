#include "server/shared/lease_manager.h"

#include <unistd.h>

#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/shared/l2_records.h"
#include "spdlog/spdlog.h"

namespace kiln::shared {
namespace {

// Extend / delete the lease only while it still holds our token: a lease that ran out and was
// taken over by another replica is theirs now.
constexpr char kRenewScript[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
constexpr char kReleaseScript[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('del', KEYS[1]) else return 0 end";

std::string DefaultOwnerId() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::random_device random;
  return absl::StrCat(host, ":", getpid(), ":", absl::Hex(random(), absl::kZeroPad8));
}

}  // namespace

LeaseManager::LeaseManager(RedisClient* client, LeaseOptions options)
    : client_(client),
      options_(std::move(options)),
      owner_id_(options_.owner_id.empty() ? DefaultOwnerId() : options_.owner_id),
      ttl_ms_(absl::StrCat(std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.ttl)))),
      renewer_([this] { RenewLoop(); }) {}

LeaseManager::~LeaseManager() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  renewer_.join();
}

compile::CompileCoordinator::Claim LeaseManager::Acquire(
    const std::string& key, absl::Time give_up, const std::function<bool()>& done_elsewhere) {
  const std::string lease_key = LeaseKey(key);
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    token = absl::StrCat(owner_id_, ":", next_token_++);
  }
  bool waited = false;
  absl::Duration delay = options_.poll_initial;
  while (true) {
    absl::StatusOr<RedisReply> set =
        client_->Command({"SET", lease_key, token, "NX", "PX", ttl_ms_});
    if (!set.ok()) {
      errors_.fetch_add(1, std::memory_order_relaxed);
      return Claim::kUncoordinated;
    }
    if (!set->is_nil()) {
      // Ours. The previous holder may have stored its result just before letting go, and a
      // request may have missed just before that: look once more before compiling.
      if (done_elsewhere()) {
        client_->Command({"EVAL", kReleaseScript, "1", lease_key, token}, 3).IgnoreError();
        done_elsewhere_.fetch_add(1, std::memory_order_relaxed);
        return Claim::kDoneElsewhere;
      }
      if (waited) {
        expired_.fetch_add(1, std::memory_order_relaxed);
        spdlog::info("took over the compile of {}: the previous lease ran out without a result",
                     key.substr(0, 12));
      }
      taken_.fetch_add(1, std::memory_order_relaxed);
      absl::MutexLock lock(&mu_);
      held_[key] = token;
      return Claim::kOwner;
    }
    if (!waited) {
      waited = true;
      waited_.fetch_add(1, std::memory_order_relaxed);
    }
    if (done_elsewhere()) {
      done_elsewhere_.fetch_add(1, std::memory_order_relaxed);
      return Claim::kDoneElsewhere;
    }
    const absl::Time now = absl::Now();
    if (now >= give_up) return Claim::kGaveUp;
    absl::SleepFor(std::min(delay, give_up - now));
    delay = std::min(delay * 2, options_.poll_max);
  }
}

void LeaseManager::Release(const std::string& key) {
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(key);
    if (it == held_.end()) return;
    token = std::move(it->second);
    held_.erase(it);
  }
  // Best effort: a lease we fail to delete runs out by itself within the ttl.
  client_->Command({"EVAL", kReleaseScript, "1", LeaseKey(key), token}, 3).IgnoreError();
}

void LeaseManager::RenewLoop() {
  while (true) {
    std::vector<std::pair<std::string, std::string>> held;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.ttl / 3);
      if (stopping_) return;
      held.assign(held_.begin(), held_.end());
    }
    for (const auto& [key, token] : held) {
      absl::StatusOr<RedisReply> renewed =
          client_->Command({"EVAL", kRenewScript, "1", LeaseKey(key), token, ttl_ms_}, 3);
      if (!renewed.ok()) {
        errors_.fetch_add(1, std::memory_order_relaxed);
        continue;  // Redis down: the compile goes on; the lease may run out meanwhile
      }
      if (renewed->integer == 0) {
        // It ran out (e.g. Redis was away longer than the ttl) and someone else may be
        // compiling too: harmless, both store the same result.
        lost_.fetch_add(1, std::memory_order_relaxed);
        spdlog::warn("lost the lease of {} while compiling it", key.substr(0, 12));
        absl::MutexLock lock(&mu_);
        if (auto it = held_.find(key); it != held_.end() && it->second == token) held_.erase(it);
      }
    }
  }
}

void LeaseManager::AddStats(v1::GetStatsResponse* stats) const {
  v1::SharedCacheStats* s = stats->mutable_shared();
  s->set_leases_taken(taken_.load(std::memory_order_relaxed));
  s->set_leases_waited(waited_.load(std::memory_order_relaxed));
  s->set_leases_expired(expired_.load(std::memory_order_relaxed));
  s->set_leases_done_elsewhere(done_elsewhere_.load(std::memory_order_relaxed));
  s->set_lease_errors(errors_.load(std::memory_order_relaxed) +
                      lost_.load(std::memory_order_relaxed));
}

}  // namespace kiln::shared
