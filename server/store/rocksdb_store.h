// RocksDbStore: the embedded L1 cache. One RocksDB database with three column families
// (FORMAT.md): cas.v1 (digest -> blob bytes, large values in blob files), ac.v1 (action key ->
// ActionResult record) and lru.v1 (action key -> last-access tick).
//
// Beside the database the store keeps an in-memory index, rebuilt at Open: every AC entry with
// its blob digests and recency, and every blob with its reference count (how many AC entries
// name it). The index makes eviction and the byte budget cheap and decides which blobs die with
// an entry: a blob is deleted exactly when the last entry naming it goes. The write protocol
// keeps one invariant on disk: a blob is present iff some AC entry references it. Every change
// is one WriteBatch, built against the index, and applied to the index only once the batch is
// written, so the index never claims what the database does not hold.
//
// Write faults. When a write fails for a reason of the disk's (ENOSPC, EIO, a RocksDB
// background error), the store suspends writing rather than fail: hits are still served from
// disk; PutResult still succeeds, keeping the result in a bounded memory overflow from which
// GetResult and GetBlob serve it (IsPersisted() says false); recency updates and eviction
// pause. RocksDB's own recovery waits until write_buffer_bytes are free on the disk. A
// background thread retries every write_retry_interval: DB::Resume(), then the
// overflow is written out in put order, and writing resumes, without a restart. Nothing already
// on disk is touched by a failed write (a batch is all or nothing).
//
// Thread-safety: all methods may be called concurrently. Content reads (RocksDB Get, SHA-256)
// run without the lock; index changes and the writes that go with them hold mu_, so batches are
// built and applied in one order.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"
#include "server/store/artifact_store.h"

namespace kiln::store {

struct RocksDbStoreOptions {
  // Directory of the database; created if missing.
  std::string path;
  // Byte budget over CAS and AC records (see FORMAT.md, "Accounting"); 0 = unlimited. Enforced
  // after every put and at Open, by evicting least-recently-used AC entries.
  int64_t capacity_bytes = 0;
  // CAS values at least this large go to RocksDB blob files instead of SST files, so compaction
  // does not rewrite artifact bytes over and over.
  uint64_t min_blob_size = 4096;
  // GetResult reads and verifies every artifact blob before answering a hit, so a hit never
  // names a corrupt blob. Off: GetResult trusts the index and only GetBlob verifies.
  bool verify_blobs_on_result = true;
  // Reads and hashes every CAS value at Open, deleting corrupt and unreferenced blobs and the
  // entries that named them. Costs a full read of the cache.
  bool scrub_on_open = false;
  // fsync the WAL on every write. Off, a crash may lose the latest writes but never splits a
  // batch.
  bool sync_writes = false;
  // After a failed write (disk full, I/O error) the store stops writing: results are kept in
  // memory (at most this many bytes, oldest dropped first) and served from there, and every
  // `write_retry_interval` the store asks RocksDB to recover and writes them out.
  int64_t max_unpersisted_bytes = int64_t{256} << 20;
  // Memtable size per column family; 0: RocksDB's default (64 MiB). RocksDB resumes after a
  // full disk only once this much space is free, so small disks want a small value.
  uint64_t write_buffer_bytes = 0;
  absl::Duration write_retry_interval = absl::Seconds(1);
};

class RocksDbStore : public ArtifactStore {
 public:
  // Opens (or creates) the database at options.path and rebuilds the index. Records this
  // reader cannot use (damaged, unknown version) are deleted; column families of other
  // format versions are opened and left alone. Unavailable when the database cannot be opened
  // (e.g. another process holds it), InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<RocksDbStore>> Open(const RocksDbStoreOptions& options);

  // Flushes memtables and closes the database.
  ~RocksDbStore() override;

  RocksDbStore(const RocksDbStore&) = delete;
  RocksDbStore& operator=(const RocksDbStore&) = delete;

  // REQUIRES: key non-empty; blobs.size() == result.artifacts_size(); each blob hashes to its
  // artifact's digest and has its size (size 0 means "fill in"). InvalidArgument otherwise.
  // Replaces an entry under the same key. Blobs already held are not written again.
  absl::Status PutResult(const std::string& key, const v1::ActionResult& result,
                         const std::vector<std::string>& blobs) override;

  absl::StatusOr<std::optional<v1::ActionResult>> GetResult(const std::string& key) override;

  // InvalidArgument unless `digest` is 64 lowercase hex digits.
  absl::StatusOr<std::optional<std::string>> GetBlob(const std::string& digest) override;

  StoreStats Stats() const override;
  bool IsPersisted(const std::string& key) const override;

  // From graphs.v1 (graph_index.cc). Index records whose entry is gone are deleted on the way.
  absl::StatusOr<std::vector<std::pair<std::string, v1::ActionResult>>> ResultsForGraph(
      const std::string& graph_digest, size_t limit) override;
  // From ac.v1 on disk (graph_index.cc); results held only in memory are not listed.
  absl::StatusOr<std::vector<std::pair<std::string, v1::ActionResult>>> ListResults(
      const std::string& after_key, size_t limit) override;

 private:
  // A result accepted while writes are suspended.
  struct Unpersisted {
    v1::ActionResult result;
    std::vector<std::string> raws;  // raw digests, in artifact order
    int64_t bytes = 0;              // as counted against max_unpersisted_bytes
  };
  struct UnpersistedBlob {
    std::string bytes;
    int64_t refs = 0;
  };
  struct Entry {
    uint64_t write_tick = 0;           // identifies this write of the key
    uint64_t access_tick = 0;          // recency; orders the entry in recency_
    int64_t bytes = 0;                 // AC + lru records, as accounted
    std::vector<std::string> digests;  // raw, without duplicates
  };
  struct Blob {
    int64_t refs = 0;
    int64_t size = 0;  // blob bytes, without the key
  };
  struct Mutation;

  RocksDbStore(RocksDbStoreOptions options, rocksdb::DB* db,
               std::vector<rocksdb::ColumnFamilyHandle*> handles);

  absl::Status LoadIndex();

  // Builds and commits the batch that stores one verified result (`payload` is `result`
  // serialized; the result itself feeds the graph index).
  absl::Status WriteLocked(const std::string& key, const v1::ActionResult& result,
                           const std::string& payload, const std::vector<std::string>& raws,
                           const std::vector<std::string>& blobs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool IsWriteFault(const absl::Status& status);
  void SuspendLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KeepUnpersistedLocked(const std::string& key, v1::ActionResult result,
                             std::vector<std::string> raws, const std::vector<std::string>& blobs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropUnpersistedLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recovers RocksDB and writes the overflow out; true when writing has resumed.
  bool TryResumeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetryLoop();
  absl::Status Scrub();

  // Reads `raw` from cas.v1 and checks its SHA-256. nullopt when absent or corrupt; a corrupt
  // blob is deleted with the entries that name it.
  absl::StatusOr<std::optional<std::string>> ReadVerifiedBlob(const std::string& raw);
  absl::Status HandleCorruptBlob(const std::string& raw, const std::string& why);
  // Drops `key` if its entry is still the write identified by `write_tick`.
  absl::Status DropEntryIfUnchanged(const std::string& key, uint64_t write_tick);

  // Mutation building and applying; see the class comment.
  int64_t RefsAfter(const Mutation& m, const std::string& raw) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void PlanRelease(Mutation& m, const Entry& entry) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void PlanRemove(Mutation& m, const std::string& key) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status Commit(Mutation& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EvictToBudget(const std::string* keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NextTick() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_tick_++; }

  // Immutable after construction.
  const RocksDbStoreOptions options_;
  rocksdb::DB* const db_;                                    // owned; closed in the destructor
  const std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // owned
  rocksdb::ColumnFamilyHandle* cas_ = nullptr;
  rocksdb::ColumnFamilyHandle* ac_ = nullptr;
  rocksdb::ColumnFamilyHandle* lru_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* graphs_cf_ = nullptr;
  rocksdb::WriteOptions write_options_;

  // Guarded by mu_.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, std::string>> recency_ ABSL_GUARDED_BY(mu_);  // (tick, key)
  absl::flat_hash_map<std::string, Blob> blobs_ ABSL_GUARDED_BY(mu_);        // raw digest -> blob
  uint64_t next_tick_ ABSL_GUARDED_BY(mu_) = 1;

  // Write faults; suspended_ changes only under mu_ and is read without it.
  std::atomic<bool> suspended_{false};
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Unpersisted> unpersisted_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, UnpersistedBlob> unpersisted_blobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> unpersisted_order_ ABSL_GUARDED_BY(mu_);  // put order; may be stale
  int64_t unpersisted_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar retry_cv_;

  // Counters, read without the lock by Stats(). bytes_ and entries_count_ change only under mu_.
  std::atomic<int64_t> hits_{0};
  std::atomic<int64_t> misses_{0};
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> entries_count_{0};
  std::atomic<int64_t> evictions_{0};
  std::atomic<int64_t> corruptions_{0};
  std::atomic<int64_t> write_errors_{0};
  std::atomic<int64_t> unpersisted_puts_{0};
  std::atomic<int64_t> write_resumes_{0};

  std::thread retry_thread_;  // started last in the constructor, joined first in the destructor
};

}  // namespace kiln::store
