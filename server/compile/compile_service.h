// CompileService: get-or-compile for kiln.v1 requests, independent of gRPC.
//
// One request goes: decode and validate (ir::DecodeGraph / DecodeTarget / DecodeOptions) ->
// action key -> in-memory result cache -> store (RocksDB) -> failure cache -> single-flight
// registry (identical keys in flight share one job) -> bounded two-priority worker pool ->
// [coordinator: wait while another replica compiles the key] -> compile -> ActionResult ->
// store.PutResult -> every waiter answered.
//
// A hit is answered inline on the caller's thread (no hop to a worker: it must cost well under
// a millisecond). A miss never compiles on the caller's thread: the callback runs later on a
// worker thread, or on the deadline timer's thread when the caller's deadline passes first. The
// job goes on while anyone waits for it; once every waiter of a job has been answered by its
// deadline, the compiler is asked to stop (Compiler::CompileCancellable). Invalid input is
// answered at once and never cached; compile failures are remembered for `negative_ttl` so
// retries do not recompile.
//
// Thread-safety: all public methods may be called concurrently. Callbacks may run on any
// thread, exactly once each, and must not block for long.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/ir/op_registry.h"
#include "kernels/key/key.h"
#include "kiln/v1/service.pb.h"
#include "server/compile/compiler.h"
#include "server/compile/coordinator.h"
#include "server/compile/deadline_timer.h"
#include "server/compile/result_cache.h"
#include "server/compile/worker_pool.h"
#include "server/store/artifact_store.h"

namespace kiln::compile {

struct CompileServiceOptions {
  int workers = 0;           // compile threads; 0: the number of cores
  int64_t queue_size = 256;  // jobs waiting for a worker; beyond it: ResourceExhausted
  absl::Duration negative_ttl = absl::Seconds(30);  // how long a compile failure is replayed
  size_t memory_cache_entries = 4096;               // in-memory front of the store; 0 disables it
  size_t request_index_entries = 65536;  // request keys remembered; 0 disables lookups by key
  absl::Duration memory_cache_ttl = absl::Seconds(2);  // how often a hot entry is revalidated
  ir::Limits limits;
  // Cluster-wide single-flight across replicas sharing a cache; nullptr: this process only.
  // Must outlive the service.
  CompileCoordinator* coordinator = nullptr;

  // When set, every result this service produces is signed before it is stored (the handle is
  // the action key), and every result read back from the store must pass `verify_stored`: one
  // that does not is logged, counted as a corruption of the store and treated as a miss, so it
  // is compiled again and replaced. Both must be thread-safe (auth::ResultSigner is).
  std::function<absl::Status(const std::string& key, v1::ActionResult* result)> sign;
  std::function<absl::Status(const std::string& key, const v1::ActionResult& result)> verify_stored;
};

// A ResourceExhausted worth retrying (the compile queue is full, not a limit of the request)
// carries this payload: the milliseconds a client should wait, as decimal text. The gRPC layer
// turns it into the trailer clients read (client/RETRY.md).
inline constexpr char kRetryAfterPayload[] = "type.kiln.dev/retry-after-ms";
inline constexpr int kQueueFullRetryAfterMs = 250;

// What a Compile / Lookup answers.
struct CompileReply {
  absl::Status status;
  std::string handle;  // the action key; empty when the input was invalid
  std::shared_ptr<const v1::ActionResult> result;  // set iff status.ok()
  bool cache_hit = false;      // answered from the cache, not by a compile started for it
  bool joined = false;         // waited on an identical job another request had started
  bool negative_hit = false;   // answered from the failure cache
  bool not_persisted = false;  // compiled, but kept in memory only (the disk refused writes)
  std::string request_key;     // set by the gRPC layer: the key of the request it answered
};
using CompileCallback = std::function<void(CompileReply)>;
// Withdraws one request (its caller is gone): answers it with Cancelled and lets the compiler
// stop if nobody else waits for the job. Safe to call at any time, more than once, or never;
// it must not outlive the service.
using Withdraw = std::function<void()>;

Priority PriorityFromWire(v1::Priority priority);

class CompileService {
 public:
  // `compiler` and `store` must outlive the service.
  CompileService(Compiler* compiler, store::ArtifactStore* store,
                 const CompileServiceOptions& options);
  ~CompileService();  // Shutdown(absl::Now()) unless already shut down.

  CompileService(const CompileService&) = delete;
  CompileService& operator=(const CompileService&) = delete;

  // Get-or-compile. `done` runs exactly once: inline for a hit, invalid input, a cached
  // failure or a full queue; otherwise later, with the compile's outcome, DeadlineExceeded
  // when `deadline` passes first, or Unavailable when the service shuts down first. Returns
  // the request's Withdraw (a no-op when it was answered inline).
  Withdraw Compile(const v1::CompileRequest& request, Priority priority, absl::Time deadline,
                   CompileCallback done);

  // Compile() and wait for its callback; for tests, tools and blocking callers.
  CompileReply CompileAndWait(const v1::CompileRequest& request, Priority priority,
                              absl::Time deadline);

  // Cache only: NotFound on a miss. Never compiles. A request that names a request key (and no
  // graph) is answered through the request index: NotFound when the key is unknown here.
  CompileReply Lookup(const v1::LookupRequest& request);

  // Remembers that the request with `request_key` (wire::RequestKey, computed by kilnd from a
  // request it decoded) has the action key `action_key`, for Lookup by request key.
  void RememberRequest(const std::string& request_key, const std::string& action_key);

  // The cached result for a handle (a lowercase hex action key): InvalidArgument for a
  // malformed handle, NotFound when it is not (or no longer) cached.
  absl::StatusOr<std::shared_ptr<const v1::ActionResult>> GetResult(const std::string& handle);

  // Why would `request` miss? Its key record (and whether it is cached), beside the stored
  // entries whose key names the same graph, fewest differing fields first. InvalidArgument for
  // a bad graph or target, as Compile. Compiles nothing and counts no hit or miss.
  absl::StatusOr<v1::ExplainResponse> Explain(const v1::ExplainRequest& request);

  // Shared tuning (kiln.v1.RecordTuning / LookupTuning): the fastest variant of a graph on a
  // device model, stored in the artifact store (every tier: a cluster shares it) under a key
  // derived from the action key of the graph's variant 0 and the device's name, signed like
  // results. InvalidArgument for a bad graph, target, device name or variant number.
  absl::StatusOr<v1::TuningResponse> RecordTuning(const v1::TuningRequest& request);
  absl::StatusOr<v1::TuningResponse> LookupTuning(const v1::TuningRequest& request);

  // Compiled models (kiln.v1.PutModel / GetModel; service.proto says what a record is). A
  // record is stored like a result: its bytes as a MODEL_RECORD blob, the entry under
  // ModelStoreKey(format, model_key) with the record's key, format and parts as key fields,
  // signed, in every tier. PutModel refuses (FailedPrecondition) a record naming a part that is
  // not a cached result, and InvalidArgument a malformed key, format or part handle, or a
  // record past the limits. GetModel answers the record, its bytes and each part's result;
  // NotFound when the record or any part is gone (evicted, refused on verification).
  absl::StatusOr<v1::PutModelResponse> PutModel(const v1::PutModelRequest& request);
  absl::StatusOr<v1::GetModelResponse> GetModel(const v1::GetModelRequest& request);

  // Bundles (kiln.v1.ExportEntries / ImportEntries; kiln export / kiln import). Export pages
  // through the store's entries in key order, each with its blobs, as many as fit in
  // `reply_bytes` (at least one); entries that fail verify_stored, or whose blobs are gone, are
  // left out. Import checks every entry before it stores any: a 64-hex key, one blob per
  // artifact hashing to its digest, and, on a kilnd that signs, a signature this kilnd trusts
  // (or, with `resign`, none needed: the entry is signed again with this kilnd's key).
  // InvalidArgument naming the entry and the rule otherwise, with nothing stored.
  absl::StatusOr<v1::ExportEntriesResponse> ExportEntries(const v1::ExportEntriesRequest& request,
                                                          size_t reply_bytes);
  absl::StatusOr<v1::ImportEntriesResponse> ImportEntries(const v1::ImportEntriesRequest& request);

  // Counters for GetStats (store counters included).
  v1::GetStatsResponse Stats() const;

  // New misses get Unavailable from now on; hits and jobs already started still complete.
  void StopAccepting();
  // StopAccepting(), then lets running and queued jobs finish until `drain_deadline`; jobs still
  // queued then are dropped and their waiters get Unavailable. Idempotent.
  void Shutdown(absl::Time drain_deadline);

  int workers() const { return pool_.workers(); }

 private:
  struct Prepared;
  struct Waiter;
  struct Job;
  struct TargetInfo {
    absl::Status check;
    std::string fingerprint;
  };

  absl::StatusOr<Prepared> Prepare(const v1::Graph& graph, const v1::Target& target,
                                   const v1::CompileOptions& options);
  // (store key of the tuning record, action key of variant 0) for a tuning request.
  absl::StatusOr<std::pair<std::string, std::string>> TuningKey(const v1::TuningRequest& request);
  TargetInfo InfoFor(const Target& target);
  // Memory, then store. nullptr on a miss; an error only when the store fails.
  absl::StatusOr<std::shared_ptr<const v1::ActionResult>> LookupCached(const std::string& key,
                                                                       absl::Time now);
  Withdraw StartOrJoin(Prepared prepared, Priority priority, absl::Time deadline,
                       std::shared_ptr<Waiter> waiter);
  void RunJob(const std::shared_ptr<Job>& job);
  // Marks `job` abandoned when every one of its waiters has been answered.
  void AbandonIfUnwanted(Job& job);

  // Cluster-wide single-flight around a compile (see coordinator.h). Returns a reply when the
  // job is answered without compiling; sets *owner when Release must follow the compile.
  std::optional<CompileReply> Coordinate(const Job& job, bool* owner);

  // Answers `waiter` early (deadline, caller gone) with `status`, then AbandonIfUnwanted.
  void Leave(Waiter& waiter, const std::weak_ptr<Job>& job, const std::string& key,
             absl::Status status);
  CompileReply CompileJob(const Job& job);
  void FinishJob(const std::shared_ptr<Job>& job, const CompileReply& reply);

  // Immutable after construction.
  Compiler* const compiler_;
  store::ArtifactStore* const store_;
  const CompileServiceOptions options_;
  const absl::Time started_;

  ResultCache memory_;
  FailureCache failures_;
  RequestIndex requests_index_;

  absl::Mutex targets_mu_;
  absl::flat_hash_map<std::string, TargetInfo> targets_ ABSL_GUARDED_BY(targets_mu_);

  absl::Mutex jobs_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(jobs_mu_);
  bool accepting_ ABSL_GUARDED_BY(jobs_mu_) = true;
  bool shut_down_ ABSL_GUARDED_BY(jobs_mu_) = false;

  // Counters, relaxed: they are read only for stats.
  std::atomic<int64_t> requests_{0};
  std::atomic<int64_t> cache_hits_{0};
  std::atomic<int64_t> compiles_{0};
  std::atomic<int64_t> compile_failures_{0};
  std::atomic<int64_t> joined_{0};
  std::atomic<int64_t> negative_hits_{0};
  std::atomic<int64_t> rejected_{0};
  std::atomic<int64_t> invalid_{0};
  std::atomic<int64_t> unverified_{0};  // stored results refused by verify_stored

  // Declared last: destroyed first, so no timer callback or worker outlives the state above.
  DeadlineTimer timer_;
  WorkerPool pool_;
};

}  // namespace kiln::compile
