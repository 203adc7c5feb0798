#include "server/compile/compile_service.h"

#include <algorithm>
#include <exception>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "kernels/codegen/variants.h"
#include "kernels/ir/decode.h"
#include "kernels/key/digest.h"
#include "kernels/util/status_macros.h"
#include "server/compile/result_convert.h"
#include "spdlog/spdlog.h"

namespace kiln::compile {

struct CompileService::Prepared {
  ir::Graph graph;
  Target target;
  CompileOptions options;
  key::ActionKey key;
};

// One caller waiting for a job. Fired exactly once, by whichever comes first: the job's end,
// the caller's deadline, or shutdown.
struct CompileService::Waiter {
  explicit Waiter(CompileCallback cb) : done(std::move(cb)) {}
  void Fire(CompileReply reply) {
    if (fired.exchange(true, std::memory_order_acq_rel)) return;
    done(std::move(reply));
    done = nullptr;  // release what the callback holds as soon as it has run
  }

  CompileCallback done;
  std::atomic<bool> fired{false};
  bool joined = false;  // set before the waiter is shared
};

// A compile in flight, shared by every request for its key.
struct CompileService::Job {
  Prepared prepared;
  // Guarded by the service's jobs_mu_.
  Priority priority = Priority::kInteractive;
  bool started = false;
  absl::Time deadline = absl::InfinitePast();  // the latest of its waiters' deadlines
  std::vector<std::shared_ptr<Waiter>> waiters;
  // Every waiter has been answered (deadlines) before the compile ended: the compiler may stop.
  // Set under jobs_mu_; a request arriving after that starts a fresh job instead of joining.
  std::atomic<bool> abandoned{false};
};

namespace {

// Failures worth replaying: the compiler broke on this exact input, and trying again within
// seconds would break the same way. Client mistakes, missing toolchains and overload are not
// remembered: the next request may well succeed.
bool IsCacheableFailure(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDeadlineExceeded:  // the toolchain's own timeout
      return true;
    default:
      return false;
  }
}

bool IsHexKey(const std::string& s) {
  if (s.size() != 64) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f'); });
}

std::string KeyPrefix(const std::string& key) { return key.substr(0, 12); }

int ResolveWorkers(int workers) {
  if (workers > 0) return workers;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

Priority PriorityFromWire(v1::Priority priority) {
  return priority == v1::PREWARM ? Priority::kPrewarm : Priority::kInteractive;
}

CompileService::CompileService(Compiler* compiler, store::ArtifactStore* store,
                               const CompileServiceOptions& options)
    : compiler_(compiler),
      store_(store),
      options_(options),
      started_(absl::Now()),
      memory_(options.memory_cache_entries, options.memory_cache_ttl),
      failures_(options.negative_ttl),
      requests_index_(options.request_index_entries),
      pool_(ResolveWorkers(options.workers), std::max<int64_t>(1, options.queue_size)) {}

CompileService::~CompileService() { Shutdown(absl::Now()); }

CompileService::TargetInfo CompileService::InfoFor(const Target& target) {
  const std::string name = target.ToString();
  {
    absl::MutexLock lock(&targets_mu_);
    auto it = targets_.find(name);
    if (it != targets_.end()) return it->second;
  }
  // Computed outside the lock: a fingerprint may run the host compiler once.
  TargetInfo info;
  info.check = compiler_->CheckTarget(target);
  if (info.check.ok()) info.fingerprint = compiler_->Fingerprint(target);
  absl::MutexLock lock(&targets_mu_);
  return targets_.emplace(name, std::move(info)).first->second;
}

absl::StatusOr<CompileService::Prepared> CompileService::Prepare(
    const v1::Graph& graph, const v1::Target& target, const v1::CompileOptions& options) {
  Prepared p;
  KILN_ASSIGN_OR_RETURN(p.graph, ir::DecodeGraph(graph, options_.limits));
  KILN_ASSIGN_OR_RETURN(p.target, ir::DecodeTarget(target));
  p.options = ir::DecodeOptions(options);
  TargetInfo info = InfoFor(p.target);
  KILN_RETURN_IF_ERROR(info.check);
  p.key = key::ComputeKey(p.graph, p.target, p.options, info.fingerprint);
  return p;
}

absl::StatusOr<std::shared_ptr<const v1::ActionResult>> CompileService::LookupCached(
    const std::string& key, absl::Time now) {
  ResultCache::Lookup in_memory = memory_.Get(key, now);
  if (in_memory.result != nullptr && !in_memory.revalidate) return std::move(in_memory.result);
  absl::StatusOr<std::optional<v1::ActionResult>> stored = store_->GetResult(key);
  if (!stored.ok()) {
    // Keep serving what memory holds; the next caller past the interval tries the store again.
    if (in_memory.result != nullptr) {
      memory_.Put(key, in_memory.result, now);
      return std::move(in_memory.result);
    }
    return stored.status();
  }
  if (stored->has_value() && options_.verify_stored) {
    if (absl::Status v = options_.verify_stored(key, **stored); !v.ok()) {
      unverified_.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("stored result {} refused: {}", KeyPrefix(key), std::string(v.message()));
      stored->reset();
    }
  }
  if (!stored->has_value()) {
    // Evicted from (or corrupt in) the store: its artifacts can no longer be fetched.
    if (in_memory.result != nullptr) memory_.Erase(key);
    return nullptr;
  }
  auto shared = std::make_shared<const v1::ActionResult>(**std::move(stored));
  memory_.Put(key, shared, now);
  return shared;
}

Withdraw CompileService::Compile(const v1::CompileRequest& request, Priority priority,
                                 absl::Time deadline, CompileCallback done) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<Prepared> prepared = Prepare(request.graph(), request.target(), request.options());
  if (!prepared.ok()) {
    invalid_.fetch_add(1, std::memory_order_relaxed);
    CompileReply reply;
    reply.status = prepared.status();
    done(std::move(reply));
    return [] {};
  }
  const absl::Time now = absl::Now();
  const std::string& key = prepared->key.digest;

  absl::StatusOr<std::shared_ptr<const v1::ActionResult>> cached = LookupCached(key, now);
  if (!cached.ok()) {
    // A store that cannot be read should not stop compiles: treat it as a miss.
    spdlog::warn("store lookup failed for {}: {}", KeyPrefix(key), cached.status().ToString());
  } else if (*cached != nullptr) {
    cache_hits_.fetch_add(1, std::memory_order_relaxed);
    CompileReply reply;
    reply.handle = key;
    reply.result = *std::move(cached);
    reply.cache_hit = true;
    done(std::move(reply));
    return [] {};
  }

  if (absl::Status failed = failures_.Get(key, now); !failed.ok()) {
    negative_hits_.fetch_add(1, std::memory_order_relaxed);
    CompileReply reply;
    reply.status = std::move(failed);
    reply.handle = key;
    reply.negative_hit = true;
    done(std::move(reply));
    return [] {};
  }

  if (deadline <= now) {
    CompileReply reply;
    reply.status = absl::DeadlineExceededError(
        absl::StrCat("deadline passed before the compile of ", KeyPrefix(key), " could start"));
    reply.handle = key;
    done(std::move(reply));
    return [] {};
  }

  return StartOrJoin(*std::move(prepared), priority, deadline,
                     std::make_shared<Waiter>(std::move(done)));
}

Withdraw CompileService::StartOrJoin(Prepared prepared, Priority priority, absl::Time deadline,
                                     std::shared_ptr<Waiter> waiter) {
  const std::string key = prepared.key.digest;
  absl::Status rejected;
  std::weak_ptr<Job> joined_job;
  {
    absl::MutexLock lock(&jobs_mu_);
    if (!accepting_) {
      rejected = absl::UnavailableError("kilnd is shutting down; no new compiles are accepted");
    } else if (auto it = jobs_.find(key);
               it != jobs_.end() && !it->second->abandoned.load(std::memory_order_relaxed)) {
      Job& job = *it->second;
      joined_.fetch_add(1, std::memory_order_relaxed);
      waiter->joined = true;
      job.waiters.push_back(waiter);
      joined_job = it->second;
      job.deadline = std::max(job.deadline, deadline);
      // An interactive caller must not wait behind the prewarm backlog its job sits in: queue
      // a second runner at interactive priority; whichever runner starts first compiles.
      if (priority == Priority::kInteractive && job.priority == Priority::kPrewarm &&
          !job.started) {
        job.priority = Priority::kInteractive;
        std::shared_ptr<Job> shared = it->second;
        pool_.Submit(Priority::kInteractive, [this, shared] { RunJob(shared); }).IgnoreError();
      }
    } else {
      auto job = std::make_shared<Job>();
      job->prepared = std::move(prepared);
      job->priority = priority;
      job->deadline = deadline;
      job->waiters.push_back(waiter);
      // Submitted under jobs_mu_ so nobody can join a job that never made it into the queue.
      rejected = pool_.Submit(priority, [this, job] { RunJob(job); });
      joined_job = job;
      if (rejected.ok()) jobs_.insert_or_assign(key, std::move(job));
    }
  }
  if (!rejected.ok()) {
    if (absl::IsResourceExhausted(rejected)) {
      rejected_.fetch_add(1, std::memory_order_relaxed);
      rejected.SetPayload(kRetryAfterPayload, absl::Cord(absl::StrCat(kQueueFullRetryAfterMs)));
    }
    CompileReply reply;
    reply.status = std::move(rejected);
    reply.handle = key;
    waiter->Fire(std::move(reply));
    return [] {};
  }
  if (deadline != absl::InfiniteFuture() && !waiter->fired.load(std::memory_order_acquire)) {
    std::weak_ptr<Waiter> weak = waiter;
    const absl::Time start = absl::Now();
    timer_.Schedule(deadline, [this, weak, joined_job, key, start] {
      if (std::shared_ptr<Waiter> w = weak.lock()) {
        Leave(*w, joined_job, key,
              absl::DeadlineExceededError(absl::StrCat(
                  "deadline exceeded after ", absl::FormatDuration(absl::Now() - start),
                  " waiting for the compile of ", KeyPrefix(key),
                  "; it goes on (and its result is cached) only while another caller waits "
                  "for it")));
      }
    });
  }
  return [this, weak = std::weak_ptr<Waiter>(waiter), joined_job, key] {
    if (std::shared_ptr<Waiter> w = weak.lock()) {
      Leave(*w, joined_job, key, absl::CancelledError("the caller went away"));
    }
  };
}

void CompileService::Leave(Waiter& waiter, const std::weak_ptr<Job>& job, const std::string& key,
                           absl::Status status) {
  CompileReply reply;
  reply.status = std::move(status);
  reply.handle = key;
  reply.joined = waiter.joined;
  waiter.Fire(std::move(reply));
  if (std::shared_ptr<Job> j = job.lock()) AbandonIfUnwanted(*j);
}

void CompileService::AbandonIfUnwanted(Job& job) {
  absl::MutexLock lock(&jobs_mu_);
  if (job.waiters.empty()) return;  // finished, or never had callers to lose
  for (const std::shared_ptr<Waiter>& w : job.waiters) {
    if (!w->fired.load(std::memory_order_acquire)) return;
  }
  job.abandoned.store(true, std::memory_order_release);
}

void CompileService::RunJob(const std::shared_ptr<Job>& job) {
  {
    absl::MutexLock lock(&jobs_mu_);
    if (job->started) return;  // a promoted twin of this runner got there first
    job->started = true;
  }
  FinishJob(job, CompileJob(*job));
}

CompileReply CompileService::CompileJob(const Job& job) {
  const Prepared& p = job.prepared;
  const std::string& key = p.key.digest;
  CompileReply reply;
  reply.handle = key;
  const absl::Time now = absl::Now();

  // The result may have landed since the request missed: a job for the same key finished in
  // between, or another daemon sharing the store compiled it.
  absl::StatusOr<std::shared_ptr<const v1::ActionResult>> cached = LookupCached(key, now);
  if (cached.ok() && *cached != nullptr) {
    reply.result = *std::move(cached);
    reply.cache_hit = true;
    return reply;
  }

  bool owner = false;
  if (std::optional<CompileReply> answered = Coordinate(job, &owner)) return *std::move(answered);
  // Released once the result is stored (or the compile failed), so waiting replicas find it.
  absl::Cleanup release = [this, owner, &key] {
    if (owner) options_.coordinator->Release(key);
  };

  compiles_.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<CompileResult> compiled;
  try {
    compiled = compiler_->CompileCancellable(p.graph, p.target, p.options, job.abandoned);
  } catch (const std::exception& e) {
    // A bug in the compiler: fail this request, keep the daemon up.
    compiled = absl::InternalError(absl::StrCat("compiler threw: ", e.what()));
  } catch (...) {
    compiled = absl::InternalError("compiler threw an unknown exception");
  }
  if (!compiled.ok()) {
    if (!absl::IsCancelled(compiled.status())) {
      compile_failures_.fetch_add(1, std::memory_order_relaxed);
    }
    reply.status = compiled.status();
    if (IsCacheableFailure(reply.status)) failures_.Put(key, reply.status, absl::Now());
    return reply;
  }

  ConvertedResult converted = ToActionResult(*std::move(compiled), p.key, p.target);
  if (options_.sign) {
    if (absl::Status signed_ok = options_.sign(key, &converted.result); !signed_ok.ok()) {
      spdlog::error("signing the result of {} failed: {}", KeyPrefix(key), signed_ok.ToString());
      reply.status = absl::InternalError(
          absl::StrCat("compiled, but the result could not be signed: ", signed_ok.message()));
      return reply;
    }
  }
  if (absl::Status put = store_->PutResult(key, converted.result, converted.blobs); !put.ok()) {
    // The artifacts could not be kept, so a client could not fetch them: say so.
    spdlog::error("storing the result of {} failed: {}", KeyPrefix(key), put.ToString());
    reply.status = absl::UnavailableError(
        absl::StrCat("compiled, but the cache could not store the result: ", put.message()));
    return reply;
  }
  // Kept in memory only when the disk refuses writes: still served and fetchable, but not
  // durable, which the caller is told.
  reply.not_persisted = !store_->IsPersisted(key);
  auto shared = std::make_shared<const v1::ActionResult>(std::move(converted.result));
  memory_.Put(key, shared, absl::Now());
  reply.result = std::move(shared);
  return reply;
}

std::optional<CompileReply> CompileService::Coordinate(const Job& job, bool* owner) {
  if (options_.coordinator == nullptr) return std::nullopt;
  const std::string& key = job.prepared.key.digest;
  absl::Time give_up;
  {
    absl::MutexLock lock(&jobs_mu_);
    give_up = job.deadline;
  }
  std::shared_ptr<const v1::ActionResult> found;
  const CompileCoordinator::Claim claim =
      options_.coordinator->Acquire(key, give_up, [this, &key, &found] {
        absl::StatusOr<std::shared_ptr<const v1::ActionResult>> r = LookupCached(key, absl::Now());
        if (r.ok() && *r != nullptr) found = *std::move(r);
        return found != nullptr;
      });
  CompileReply reply;
  reply.handle = key;
  switch (claim) {
    case CompileCoordinator::Claim::kOwner:
      *owner = true;
      return std::nullopt;
    case CompileCoordinator::Claim::kUncoordinated:
      return std::nullopt;
    case CompileCoordinator::Claim::kDoneElsewhere:
      if (found == nullptr) return std::nullopt;  // it vanished again: compile here
      reply.result = std::move(found);
      reply.cache_hit = true;
      return reply;
    case CompileCoordinator::Claim::kGaveUp:
      break;
  }
  reply.status = absl::DeadlineExceededError(absl::StrCat(
      "every caller's deadline passed while another replica compiled ", KeyPrefix(key)));
  return reply;
}

void CompileService::FinishJob(const std::shared_ptr<Job>& job, const CompileReply& reply) {
  std::vector<std::shared_ptr<Waiter>> waiters;
  {
    // The result is in the caches before the job leaves the registry, so a request arriving
    // after this point hits instead of starting a second compile.
    absl::MutexLock lock(&jobs_mu_);
    auto it = jobs_.find(job->prepared.key.digest);
    if (it != jobs_.end() && it->second == job) jobs_.erase(it);
    waiters.swap(job->waiters);
  }
  for (const std::shared_ptr<Waiter>& w : waiters) {
    CompileReply r = reply;
    r.joined = w->joined;
    w->Fire(std::move(r));
  }
}

CompileReply CompileService::CompileAndWait(const v1::CompileRequest& request, Priority priority,
                                            absl::Time deadline) {
  struct Slot {
    absl::Notification done;
    CompileReply reply;
  };
  auto slot = std::make_shared<Slot>();
  Compile(request, priority, deadline, [slot](CompileReply reply) {
    slot->reply = std::move(reply);
    slot->done.Notify();
  });
  slot->done.WaitForNotification();
  return std::move(slot->reply);
}

CompileReply CompileService::Lookup(const v1::LookupRequest& request) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  CompileReply reply;
  if (!request.request_key().empty() && !request.has_graph()) {
    if (!IsHexKey(request.request_key())) {
      invalid_.fetch_add(1, std::memory_order_relaxed);
      reply.status = absl::InvalidArgumentError(
          absl::StrCat("request_key '", request.request_key().substr(0, 80),
                       "' is not a 64-digit lowercase hex key"));
      return reply;
    }
    reply.handle = requests_index_.Get(request.request_key());
    if (reply.handle.empty()) {
      reply.status = absl::NotFoundError(absl::StrCat("request key ", request.request_key(),
                                                      " is not known here: send the graph"));
      return reply;
    }
  } else {
    absl::StatusOr<Prepared> prepared =
        Prepare(request.graph(), request.target(), request.options());
    if (!prepared.ok()) {
      invalid_.fetch_add(1, std::memory_order_relaxed);
      reply.status = prepared.status();
      return reply;
    }
    reply.handle = prepared->key.digest;
  }
  absl::StatusOr<std::shared_ptr<const v1::ActionResult>> cached =
      LookupCached(reply.handle, absl::Now());
  if (!cached.ok()) {
    reply.status = cached.status();
  } else if (*cached == nullptr) {
    reply.status = absl::NotFoundError(absl::StrCat("no cached result for key ", reply.handle));
  } else {
    cache_hits_.fetch_add(1, std::memory_order_relaxed);
    reply.result = *std::move(cached);
    reply.cache_hit = true;
  }
  return reply;
}

void CompileService::RememberRequest(const std::string& request_key,
                                     const std::string& action_key) {
  requests_index_.Put(request_key, action_key);
}

absl::StatusOr<std::shared_ptr<const v1::ActionResult>> CompileService::GetResult(
    const std::string& handle) {
  if (!IsHexKey(handle)) {
    return absl::InvalidArgumentError(
        absl::StrCat("handle '", handle.substr(0, 80), "' is not a 64-digit lowercase hex key"));
  }
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const v1::ActionResult> cached,
                        LookupCached(handle, absl::Now()));
  if (cached == nullptr) {
    return absl::NotFoundError(absl::StrCat("no cached result for handle ", handle));
  }
  return cached;
}

v1::GetStatsResponse CompileService::Stats() const {
  v1::GetStatsResponse out;
  const store::StoreStats s = store_->Stats();
  v1::StoreStats* st = out.mutable_store();
  st->set_hits(s.hits);
  st->set_misses(s.misses);
  st->set_bytes(s.bytes);
  st->set_entries(s.entries);
  st->set_evictions(s.evictions);
  st->set_corruptions(s.corruptions + unverified_.load(std::memory_order_relaxed));
  st->set_capacity_bytes(s.capacity_bytes);
  st->set_writes_suspended(s.writes_suspended);
  st->set_write_errors(s.write_errors);
  st->set_unpersisted_puts(s.unpersisted_puts);
  st->set_write_resumes(s.write_resumes);
  out.set_compiles(compiles_.load(std::memory_order_relaxed));
  out.set_compile_failures(compile_failures_.load(std::memory_order_relaxed));
  out.set_requests(requests_.load(std::memory_order_relaxed));
  out.set_cache_hits(cache_hits_.load(std::memory_order_relaxed));
  out.set_joined_in_flight(joined_.load(std::memory_order_relaxed));
  out.set_negative_hits(negative_hits_.load(std::memory_order_relaxed));
  out.set_rejected(rejected_.load(std::memory_order_relaxed));
  out.set_queue_depth(pool_.queue_depth());
  out.set_in_flight(pool_.running());
  out.set_workers(pool_.workers());
  out.set_uptime_s(absl::ToDoubleSeconds(absl::Now() - started_));
  compiler_->AddStats(&out);
  store_->AddTierStats(&out);
  if (options_.coordinator != nullptr) options_.coordinator->AddStats(&out);
  return out;
}

void CompileService::StopAccepting() {
  absl::MutexLock lock(&jobs_mu_);
  accepting_ = false;
}

void CompileService::Shutdown(absl::Time drain_deadline) {
  {
    absl::MutexLock lock(&jobs_mu_);
    if (shut_down_) return;
    shut_down_ = true;
    accepting_ = false;
  }
  const int64_t dropped = pool_.Stop(drain_deadline);
  if (dropped > 0) spdlog::warn("shutdown dropped {} queued compile jobs", dropped);
  // Jobs left in the registry never ran; their callers must still hear back.
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> left;
  {
    absl::MutexLock lock(&jobs_mu_);
    left.swap(jobs_);
  }
  CompileReply reply;
  reply.status = absl::UnavailableError("kilnd shut down before this compile could run");
  for (auto& [key, job] : left) {
    std::vector<std::shared_ptr<Waiter>> waiters;
    {
      absl::MutexLock lock(&jobs_mu_);
      waiters.swap(job->waiters);
    }
    for (const auto& w : waiters) {
      CompileReply r = reply;
      r.handle = key;
      w->Fire(std::move(r));
    }
  }
}

absl::StatusOr<v1::ExplainResponse> CompileService::Explain(const v1::ExplainRequest& request) {
  constexpr int kDefaultEntries = 16;
  KILN_ASSIGN_OR_RETURN(Prepared p, Prepare(request.graph(), request.target(), request.options()));
  v1::ExplainResponse out;
  out.set_handle(p.key.digest);
  for (const auto& [label, value] : p.key.fields) {
    v1::KeyField* field = out.add_fields();
    field->set_label(label);
    field->set_value(value);
    if (label == "graph") out.set_graph_digest(value);
  }
  const int limit = request.max_entries() > 0 ? request.max_entries() : kDefaultEntries;
  // Read a few more than asked for: the request's own entry is among them when cached.
  KILN_ASSIGN_OR_RETURN(auto stored, store_->ResultsForGraph(out.graph_digest(), limit + 1));
  for (auto& [handle, result] : stored) {
    if (handle == p.key.digest) {
      out.set_cached(true);
      continue;
    }
    v1::ExplainEntry* entry = out.add_nearest();
    entry->set_handle(handle);
    int differing = 0;
    for (const v1::KeyField& field : result.key_fields()) {
      *entry->add_fields() = field;
      const auto mine = std::find_if(p.key.fields.begin(), p.key.fields.end(),
                                     [&](const auto& f) { return f.first == field.label(); });
      if (mine == p.key.fields.end() || mine->second != field.value()) ++differing;
    }
    entry->set_differing(differing);
  }
  std::stable_sort(out.mutable_nearest()->begin(), out.mutable_nearest()->end(),
                   [](const v1::ExplainEntry& a, const v1::ExplainEntry& b) {
                     return a.differing() < b.differing();
                   });
  while (out.nearest_size() > limit) out.mutable_nearest()->RemoveLast();
  return out;
}

// ---------------------------------------------------------------------- shared tuning

namespace {
constexpr size_t kMaxDeviceName = 256;
constexpr int kMaxTimings = 64;
}  // namespace

absl::StatusOr<std::pair<std::string, std::string>> CompileService::TuningKey(
    const v1::TuningRequest& request) {
  const std::string& device = request.device();
  if (device.empty() || device.size() > kMaxDeviceName ||
      !std::all_of(device.begin(), device.end(), [](char c) { return c >= 0x20 && c < 0x7f; }))
    return absl::InvalidArgumentError(
        "tuning: bad device name (rule: 1 to 256 printable ASCII characters naming the device "
        "model)");
  v1::CompileOptions options = request.options();
  options.set_variant(0);  // a tuning is for the graph, whichever variant wins
  KILN_ASSIGN_OR_RETURN(Prepared p, Prepare(request.graph(), request.target(), options));
  std::string record = absl::StrCat("kiln.tuning.v1\n", p.key.digest, "\n", device);
  return std::make_pair(key::Sha256Hex(record), p.key.digest);
}

absl::StatusOr<v1::TuningResponse> CompileService::RecordTuning(const v1::TuningRequest& request) {
  KILN_ASSIGN_OR_RETURN(auto keys, TuningKey(request));
  KILN_ASSIGN_OR_RETURN(Target target, ir::DecodeTarget(request.target()));
  const int variants = target.is_cuda() ? codegen::kNumCudaVariants : codegen::kNumCpuVariants;
  if (request.variant() < 0 || request.variant() >= variants)
    return absl::InvalidArgumentError(absl::StrCat("tuning: variant ", request.variant(), " of ",
                                                   target.ToString(), " (rule: 0 to ", variants - 1,
                                                   ")"));
  if (request.timings_size() > kMaxTimings)
    return absl::InvalidArgumentError(absl::StrCat("tuning: ", request.timings_size(),
                                                   " timings (rule: at most ", kMaxTimings, ")"));
  std::vector<std::string> timings;
  for (const v1::VariantTiming& t : request.timings())
    timings.push_back(absl::StrCat(t.variant(), ":", t.median_ms()));
  v1::ActionResult record;
  record.set_key_debug(absl::StrCat("tuning record for ", keys.second, " on ", request.device()));
  *record.mutable_target() = request.target();
  for (const auto& [label, value] : std::vector<std::pair<std::string, std::string>>{
           {"tuning_for", keys.second},
           {"device", request.device()},
           {"variant", absl::StrCat(request.variant())},
           {"timings_ms", absl::StrJoin(timings, ";")}}) {
    v1::KeyField* f = record.add_key_fields();
    f->set_label(label);
    f->set_value(value);
  }
  if (options_.sign) KILN_RETURN_IF_ERROR(options_.sign(keys.first, &record));
  KILN_RETURN_IF_ERROR(store_->PutResult(keys.first, record, {}));
  memory_.Put(keys.first, std::make_shared<const v1::ActionResult>(record), absl::Now());
  v1::TuningResponse out;
  out.set_found(true);
  out.set_variant(request.variant());
  *out.mutable_timings() = request.timings();
  out.set_handle(keys.second);
  return out;
}

absl::StatusOr<v1::TuningResponse> CompileService::LookupTuning(const v1::TuningRequest& request) {
  KILN_ASSIGN_OR_RETURN(auto keys, TuningKey(request));
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const v1::ActionResult> record,
                        LookupCached(keys.first, absl::Now()));
  v1::TuningResponse out;
  out.set_handle(keys.second);
  if (record == nullptr) return out;
  for (const v1::KeyField& f : record->key_fields()) {
    if (f.label() == "tuning_for" && f.value() != keys.second)
      return out;  // not this graph's record
    if (f.label() == "variant") {
      int v = 0;
      if (!absl::SimpleAtoi(f.value(), &v)) return out;
      out.set_variant(v);
      out.set_found(true);
    }
    if (f.label() == "timings_ms" && !f.value().empty()) {
      for (absl::string_view item : absl::StrSplit(f.value(), ';')) {
        std::pair<absl::string_view, absl::string_view> kv =
            absl::StrSplit(item, absl::MaxSplits(':', 1));
        v1::VariantTiming* t = out.add_timings();
        int v = 0;
        double ms = 0;
        if (absl::SimpleAtoi(kv.first, &v) && absl::SimpleAtod(kv.second, &ms)) {
          t->set_variant(v);
          t->set_median_ms(ms);
        }
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------- compiled models

namespace {

constexpr size_t kMaxModelRecordBytes = size_t{32} << 20;
constexpr int kMaxModelParts = 4096;

absl::Status CheckModelKey(const std::string& model_key, const std::string& format) {
  if (!IsHexKey(model_key))
    return absl::InvalidArgumentError(absl::StrCat("model key '", model_key.substr(0, 80),
                                                   "' (rule: a 64-digit lowercase hex SHA-256)"));
  const bool format_ok =
      !format.empty() && format.size() <= 64 &&
      std::all_of(format.begin(), format.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-' || c == '/';
      });
  if (!format_ok)
    return absl::InvalidArgumentError(absl::StrCat("model format '", format.substr(0, 80),
                                                   "' (rule: 1 to 64 of [A-Za-z0-9._/-])"));
  return absl::OkStatus();
}

// The store key of a model record: apart from every action key (its own labelled input).
std::string ModelStoreKey(const std::string& format, const std::string& model_key) {
  return key::Sha256Hex(absl::StrCat("kiln.model.v1\n", format, "\n", model_key));
}

std::string FieldOf(const v1::ActionResult& result, absl::string_view label) {
  for (const v1::KeyField& f : result.key_fields())
    if (f.label() == label) return f.value();
  return "";
}

}  // namespace

absl::StatusOr<v1::PutModelResponse> CompileService::PutModel(const v1::PutModelRequest& request) {
  KILN_RETURN_IF_ERROR(CheckModelKey(request.model_key(), request.format()));
  if (request.record().empty() || request.record().size() > kMaxModelRecordBytes)
    return absl::InvalidArgumentError(absl::StrCat("model record of ", request.record().size(),
                                                   " bytes (rule: 1 byte to ", kMaxModelRecordBytes,
                                                   ")"));
  if (request.parts_size() > kMaxModelParts)
    return absl::InvalidArgumentError(absl::StrCat("model record names ", request.parts_size(),
                                                   " parts (rule: at most ", kMaxModelParts, ")"));
  const absl::Time now = absl::Now();
  for (int i = 0; i < request.parts_size(); ++i) {
    const std::string& part = request.parts(i);
    if (!IsHexKey(part))
      return absl::InvalidArgumentError(absl::StrCat("model record part ", i, " '",
                                                     part.substr(0, 80),
                                                     "' (rule: a 64-digit lowercase hex handle)"));
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<const v1::ActionResult> cached, LookupCached(part, now));
    if (cached == nullptr)
      return absl::FailedPreconditionError(
          absl::StrCat("model record part ", i, " (", part,
                       ") is not a cached result (rule: compile parts first)"));
  }
  const std::string store_key = ModelStoreKey(request.format(), request.model_key());
  v1::ActionResult record;
  v1::Artifact* artifact = record.add_artifacts();
  artifact->set_kind(v1::MODEL_RECORD);
  artifact->set_digest(key::Sha256Hex(request.record()));
  artifact->set_size(static_cast<int64_t>(request.record().size()));
  record.set_key_debug(absl::StrCat("model record ", request.model_key(), " (", request.format(),
                                    ", ", request.parts_size(), " parts)"));
  for (const auto& [label, value] : std::vector<std::pair<std::string, std::string>>{
           {"model_key", request.model_key()},
           {"format", request.format()},
           {"parts", absl::StrJoin(request.parts(), ",")}}) {
    v1::KeyField* f = record.add_key_fields();
    f->set_label(label);
    f->set_value(value);
  }
  if (options_.sign) KILN_RETURN_IF_ERROR(options_.sign(store_key, &record));
  KILN_RETURN_IF_ERROR(store_->PutResult(store_key, record, {request.record()}));
  memory_.Put(store_key, std::make_shared<const v1::ActionResult>(record), now);
  v1::PutModelResponse out;
  out.set_handle(store_key);
  return out;
}

absl::StatusOr<v1::GetModelResponse> CompileService::GetModel(const v1::GetModelRequest& request) {
  KILN_RETURN_IF_ERROR(CheckModelKey(request.model_key(), request.format()));
  const std::string store_key = ModelStoreKey(request.format(), request.model_key());
  const absl::Time now = absl::Now();
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const v1::ActionResult> record,
                        LookupCached(store_key, now));
  auto gone = [&](absl::string_view what) {
    return absl::NotFoundError(absl::StrCat("no cached model record ",
                                            request.model_key().substr(0, 12), " (",
                                            request.format(), "): ", what));
  };
  if (record == nullptr) return gone("never stored, or evicted");
  // A record whose entry names another key (a store that mixed entries up) is no record of this
  // one.
  if (FieldOf(*record, "model_key") != request.model_key() ||
      FieldOf(*record, "format") != request.format())
    return gone("the stored entry names another key");
  const v1::Artifact* artifact = FindArtifact(*record, v1::MODEL_RECORD);
  if (artifact == nullptr) return gone("the stored entry has no record");
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> bytes, store_->GetBlob(artifact->digest()));
  if (!bytes.has_value()) return gone("its bytes were evicted");
  v1::GetModelResponse out;
  out.set_handle(store_key);
  *out.mutable_record_result() = *record;
  out.set_record(*std::move(bytes));
  const std::string parts = FieldOf(*record, "parts");
  if (!parts.empty()) {
    for (absl::string_view part : absl::StrSplit(parts, ',')) {
      KILN_ASSIGN_OR_RETURN(std::shared_ptr<const v1::ActionResult> result,
                            LookupCached(std::string(part), now));
      if (result == nullptr)
        return gone(absl::StrCat("its part ", part.substr(0, 12), " is no longer cached"));
      v1::CompileResponse* p = out.add_parts();
      p->set_handle(std::string(part));
      *p->mutable_result() = *result;
      p->set_cache_hit(true);
    }
  }
  cache_hits_.fetch_add(1, std::memory_order_relaxed);
  return out;
}

// ---------------------------------------------------------------------------- bundles

namespace {

constexpr size_t kExportScanEntries = 256;  // entries read from the store per scan

}  // namespace

absl::StatusOr<v1::ExportEntriesResponse> CompileService::ExportEntries(
    const v1::ExportEntriesRequest& request, size_t reply_bytes) {
  v1::ExportEntriesResponse out;
  std::string after = request.after_key();
  size_t bytes = 0;
  while (true) {
    KILN_ASSIGN_OR_RETURN(auto page, store_->ListResults(after, kExportScanEntries));
    for (auto& [key, result] : page) {
      after = key;
      if (options_.verify_stored && !options_.verify_stored(key, result).ok()) {
        unverified_.fetch_add(1, std::memory_order_relaxed);
        continue;  // not this kilnd's to vouch for; GetResult drops it when asked
      }
      v1::BundleEntry entry;
      entry.set_key(key);
      bool complete = true;
      for (const v1::Artifact& artifact : result.artifacts()) {
        KILN_ASSIGN_OR_RETURN(std::optional<std::string> blob, store_->GetBlob(artifact.digest()));
        if (!blob.has_value()) {
          complete = false;  // evicted (or refused as corrupt) since the scan
          break;
        }
        entry.add_blobs(*std::move(blob));
      }
      if (!complete) continue;
      *entry.mutable_result() = std::move(result);
      const size_t size = entry.ByteSizeLong();
      if (out.entries_size() > 0 && bytes + size > reply_bytes) {
        out.set_next_key(out.entries(out.entries_size() - 1).key());
        return out;
      }
      bytes += size;
      *out.add_entries() = std::move(entry);
    }
    if (page.size() < kExportScanEntries) return out;  // the last page: next_key stays ""
  }
}

absl::StatusOr<v1::ImportEntriesResponse> CompileService::ImportEntries(
    const v1::ImportEntriesRequest& request) {
  std::vector<v1::ActionResult> results;
  results.reserve(request.entries_size());
  for (int i = 0; i < request.entries_size(); ++i) {
    const v1::BundleEntry& entry = request.entries(i);
    auto refuse = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("bundle entry ", i, " (", entry.key().substr(0, 64), "): ", why));
    };
    if (!IsHexKey(entry.key())) return refuse("bad key (rule: a 64-digit lowercase hex key)");
    const v1::ActionResult& result = entry.result();
    if (entry.blobs_size() != result.artifacts_size())
      return refuse(absl::StrCat(entry.blobs_size(), " blobs for ", result.artifacts_size(),
                                 " artifacts (rule: one blob per artifact, in artifact order)"));
    for (int a = 0; a < result.artifacts_size(); ++a) {
      if (key::Sha256Hex(entry.blobs(a)) != result.artifacts(a).digest())
        return refuse(absl::StrCat("blob ", a, " does not hash to its artifact's digest ",
                                   result.artifacts(a).digest().substr(0, 16),
                                   " (rule: every blob is the bytes its digest names)"));
    }
    v1::ActionResult checked = result;
    if (options_.sign && request.resign()) {
      KILN_RETURN_IF_ERROR(options_.sign(entry.key(), &checked));
    } else if (options_.verify_stored) {
      if (absl::Status v = options_.verify_stored(entry.key(), checked); !v.ok())
        return refuse(
            absl::StrCat("its signature is not one this kilnd trusts: ", v.message(),
                         " (rule: import into a kilnd signing with the exporter's key, or "
                         "pass resign to vouch for the bundle)"));
    }
    results.push_back(std::move(checked));
  }
  v1::ImportEntriesResponse out;
  const absl::Time now = absl::Now();
  for (int i = 0; i < request.entries_size(); ++i) {
    const std::string& key = request.entries(i).key();
    KILN_ASSIGN_OR_RETURN(std::optional<v1::ActionResult> stored, store_->GetResult(key));
    if (stored.has_value() && stored->SerializeAsString() == results[i].SerializeAsString()) {
      out.set_present(out.present() + 1);
      continue;
    }
    const auto& blobs = request.entries(i).blobs();
    KILN_RETURN_IF_ERROR(
        store_->PutResult(key, results[i], std::vector<std::string>(blobs.begin(), blobs.end())));
    memory_.Put(key, std::make_shared<const v1::ActionResult>(std::move(results[i])), now);
    out.set_stored(out.stored() + 1);
  }
  return out;
}

}  // namespace kiln::compile
