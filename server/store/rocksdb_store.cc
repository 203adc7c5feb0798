#include "server/store/rocksdb_store.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kernels/util/status_macros.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/table.h"
#include "server/store/records.h"
#include "spdlog/spdlog.h"

namespace kiln::store {
namespace {

// One place maps RocksDB's codes onto the house taxonomy: transient trouble is Unavailable
// (retry), a full disk ResourceExhausted, damage DataLoss, anything else our bug.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat("rocksdb ", what, ": ", s.ToString());
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(message);
  if (s.IsIOError() || s.IsBusy() || s.IsTimedOut() || s.IsTryAgain() || s.IsShutdownInProgress() ||
      s.IsIncomplete() || s.IsAborted()) {
    return absl::UnavailableError(message);
  }
  if (s.IsCorruption()) return absl::DataLossError(message);
  return absl::InternalError(message);
}

// RocksDB's own log, sent to kilnd's log instead of a LOG file in the cache directory: a log file
// there fails with the disk it describes, and RocksDB's file logger aborts on the next line it
// writes after a failed one.
class RocksLogToSpdlog final : public rocksdb::Logger {
 public:
  explicit RocksLogToSpdlog(std::string path)
      : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL), path_(std::move(path)) {}

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    char line[1024];
    std::vsnprintf(line, sizeof line, format, ap);
    // One step down: the store reports what matters to kilnd (a suspension, a corruption)
    // itself, and RocksDB calls some routine conditions errors.
    const spdlog::level::level_enum to =
        level >= rocksdb::InfoLogLevel::ERROR_LEVEL  ? spdlog::level::warn
        : level >= rocksdb::InfoLogLevel::WARN_LEVEL ? spdlog::level::info
                                                     : spdlog::level::debug;
    spdlog::log(to, "rocksdb {}: {}", path_, line);
  }

 private:
  const std::string path_;
};

rocksdb::ColumnFamilyOptions PointLookupOptions() {
  rocksdb::ColumnFamilyOptions options;
  // Most lookups of a cache are for keys that may be absent: a Bloom filter answers those
  // without touching data blocks.
  rocksdb::BlockBasedTableOptions table;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return options;
}

void SortUnique(std::vector<std::string>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

// Bytes an entry accounts for: its AC record and its recency record, keys included.
int64_t EntryBytes(const std::string& key, size_t ac_value_size) {
  return static_cast<int64_t>(2 * key.size() + ac_value_size + kTickBytes);
}

int64_t BlobBytes(int64_t size) { return static_cast<int64_t>(kDigestBytes) + size; }

}  // namespace

// A change of the index and the batch that persists it. Built against the index under mu_,
// written with Commit, applied to the index only when the write succeeded.
struct RocksDbStore::Mutation {
  rocksdb::WriteBatch batch;
  std::optional<std::pair<std::string, Entry>> put;     // replaces an entry under the same key
  std::vector<std::string> removed;                     // keys whose entries go
  absl::flat_hash_map<std::string, int64_t> ref_delta;  // raw digest -> change of refs
  absl::flat_hash_map<std::string, int64_t> new_blobs;  // raw digest -> size, written here
  int64_t bytes_delta = 0;
};

absl::StatusOr<std::unique_ptr<RocksDbStore>> RocksDbStore::Open(
    const RocksDbStoreOptions& options) {
  if (options.path.empty()) return absl::InvalidArgumentError("store path is empty");
  if (options.capacity_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity_bytes must be >= 0, got ", options.capacity_bytes));
  }

  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  db_options.info_log = std::make_shared<RocksLogToSpdlog>(options.path);
  // No preallocation of WAL and table files: on a nearly full disk a preallocated WAL would
  // hide the shortage for tens of megabytes and then fail all at once, and the space it holds
  // is not the cache's to take.
  db_options.allow_fallocate = false;

  rocksdb::ColumnFamilyOptions cas_options = PointLookupOptions();
  cas_options.enable_blob_files = true;
  cas_options.min_blob_size = options.min_blob_size;
  // Deleted artifacts leave garbage in blob files; compaction relocates live blobs out of the
  // oldest files so the space comes back.
  cas_options.enable_blob_garbage_collection = true;

  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
      {kCasColumnFamily, cas_options},
      {kAcColumnFamily, PointLookupOptions()},
      {kLruColumnFamily, rocksdb::ColumnFamilyOptions()},
      {kGraphColumnFamily, rocksdb::ColumnFamilyOptions()},
  };
  if (options.write_buffer_bytes > 0) {
    // RocksDB recovers from a full disk only once this much is free again.
    for (auto& d : descriptors) d.options.write_buffer_size = options.write_buffer_bytes;
  }
  // RocksDB refuses to open a database without naming every family in it. Families of other
  // format versions are opened with defaults and never read: a newer binary's data survives a
  // rollback, an older one's waits for an explicit migration.
  std::vector<std::string> existing;
  if (rocksdb::DB::ListColumnFamilies(db_options, options.path, &existing).ok()) {
    for (const std::string& name : existing) {
      const bool known = std::any_of(descriptors.begin(), descriptors.end(),
                                     [&](const auto& d) { return d.name == name; });
      if (!known) {
        spdlog::warn("store {}: leaving column family '{}' (not this format version) untouched",
                     options.path, name);
        descriptors.push_back({name, rocksdb::ColumnFamilyOptions()});
      }
    }
  }

  std::error_code ignored;  // Open reports a directory it cannot use
  std::filesystem::create_directories(options.path, ignored);
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  KILN_RETURN_IF_ERROR(
      FromRocks(rocksdb::DB::Open(db_options, options.path, descriptors, &handles, &db),
                absl::StrCat("open ", options.path)));
  std::unique_ptr<RocksDbStore> store(new RocksDbStore(options, db, std::move(handles)));

  KILN_RETURN_IF_ERROR(store->LoadIndex());
  if (options.scrub_on_open) KILN_RETURN_IF_ERROR(store->Scrub());
  {
    // The budget may have shrunk since the last run.
    absl::MutexLock lock(&store->mu_);
    KILN_RETURN_IF_ERROR(store->EvictToBudget(nullptr));
    spdlog::info("store {}: {} entries, {} blobs, {} bytes", options.path, store->entries_.size(),
                 store->blobs_.size(), store->bytes_.load());
  }
  return store;
}

RocksDbStore::RocksDbStore(RocksDbStoreOptions options, rocksdb::DB* db,
                           std::vector<rocksdb::ColumnFamilyHandle*> handles)
    : options_(std::move(options)), db_(db), handles_(std::move(handles)) {
  // Order of the descriptors in Open.
  cas_ = handles_[1];
  ac_ = handles_[2];
  lru_cf_ = handles_[3];
  graphs_cf_ = handles_[4];
  write_options_.sync = options_.sync_writes;
  retry_thread_ = std::thread([this] { RetryLoop(); });
}

RocksDbStore::~RocksDbStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    retry_cv_.Signal();
    if (!unpersisted_.empty()) {
      spdlog::warn("store {}: closing with {} results never written to disk", options_.path,
                   unpersisted_.size());
    }
  }
  retry_thread_.join();
  // Flushing makes the next Open replay no WAL; a failure only costs that replay.
  rocksdb::FlushOptions flush;
  flush.wait = true;
  if (rocksdb::Status s = db_->Flush(flush, handles_); !s.ok()) {
    spdlog::warn("store {}: flush at close failed: {}", options_.path, s.ToString());
  }
  for (rocksdb::ColumnFamilyHandle* handle : handles_) db_->DestroyColumnFamilyHandle(handle);
  if (rocksdb::Status s = db_->Close(); !s.ok()) {
    spdlog::warn("store {}: close failed: {}", options_.path, s.ToString());
  }
  delete db_;
}

absl::Status RocksDbStore::LoadIndex() {
  absl::MutexLock lock(&mu_);
  rocksdb::ReadOptions read;
  read.fill_cache = false;      // one pass over everything; keep the block cache for real reads
  rocksdb::WriteBatch cleanup;  // records this reader cannot use
  uint64_t max_tick = 0;

  absl::flat_hash_map<std::string, uint64_t> access;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read, lru_cf_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (std::optional<uint64_t> tick = DecodeTick(it->value().ToStringView())) {
        access[it->key().ToString()] = *tick;
      } else {
        cleanup.Delete(lru_cf_, it->key());
      }
    }
    KILN_RETURN_IF_ERROR(FromRocks(it->status(), "scan lru.v1"));
  }

  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read, ac_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    std::string key = it->key().ToString();
    const std::string_view value = it->value().ToStringView();
    absl::Status bad;
    Entry entry;
    std::vector<std::pair<std::string, int64_t>> sizes;
    absl::StatusOr<AcRecord> record = DecodeAcRecord(value);
    v1::ActionResult result;
    if (!record.ok()) {
      bad = record.status();
    } else if (!result.ParseFromArray(record->payload.data(),
                                      static_cast<int>(record->payload.size()))) {
      bad = absl::DataLossError("ActionResult does not parse");
    } else {
      for (const v1::Artifact& artifact : result.artifacts()) {
        absl::StatusOr<std::string> raw = DigestFromHex(artifact.digest());
        if (!raw.ok()) {
          bad = absl::DataLossError(raw.status().message());
          break;
        }
        entry.digests.push_back(*raw);
        sizes.emplace_back(*std::move(raw), artifact.size());
      }
    }
    if (!bad.ok()) {
      // Its blobs stay behind unreferenced until a scrub: without a readable record nothing
      // says which they are.
      if (absl::IsDataLoss(bad)) corruptions_.fetch_add(1);
      spdlog::warn("store {}: dropping AC record {}: {}", options_.path, key, bad.ToString());
      cleanup.Delete(ac_, key);
      cleanup.Delete(lru_cf_, key);
      access.erase(key);
      continue;
    }
    SortUnique(entry.digests);
    // PutResult checked every size against its blob, so the AC record knows the CAS sizes
    // without reading the blobs.
    for (const auto& [raw, size] : sizes) {
      auto [blob, inserted] = blobs_.try_emplace(raw);
      if (inserted) blob->second.size = size;
    }
    for (const std::string& raw : entry.digests) ++blobs_[raw].refs;
    entry.write_tick = record->write_tick;
    auto found = access.find(key);
    entry.access_tick = found == access.end() ? entry.write_tick : found->second;
    if (found != access.end()) access.erase(found);
    entry.bytes = EntryBytes(key, value.size());
    max_tick = std::max({max_tick, entry.write_tick, entry.access_tick});
    recency_.emplace(entry.access_tick, key);
    entries_.emplace(std::move(key), std::move(entry));
  }
  KILN_RETURN_IF_ERROR(FromRocks(it->status(), "scan ac.v1"));
  // Recency of entries that are gone (their record was dropped above).
  for (const auto& [key, tick] : access) cleanup.Delete(lru_cf_, key);
  if (cleanup.Count() > 0) {
    KILN_RETURN_IF_ERROR(FromRocks(db_->Write(write_options_, &cleanup), "drop records"));
  }

  int64_t bytes = 0;
  for (const auto& [key, entry] : entries_) bytes += entry.bytes;
  for (const auto& [raw, blob] : blobs_) bytes += BlobBytes(blob.size);
  bytes_.store(bytes);
  entries_count_.store(static_cast<int64_t>(entries_.size()));
  next_tick_ = max_tick + 1;
  return absl::OkStatus();
}

absl::Status RocksDbStore::Scrub() {
  rocksdb::ReadOptions read;
  read.fill_cache = false;
  std::vector<std::pair<std::string, std::string>> bad;  // raw digest, why
  absl::flat_hash_set<std::string> seen;
  rocksdb::WriteBatch orphans;
  {
    absl::ReaderMutexLock lock(&mu_);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read, cas_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      std::string raw = it->key().ToString();
      if (!blobs_.contains(raw)) {
        orphans.Delete(cas_, raw);
        continue;
      }
      KILN_ASSIGN_OR_RETURN(std::string actual, Sha256(it->value().ToStringView()));
      if (actual != raw) bad.emplace_back(raw, "content does not match its digest");
      seen.insert(std::move(raw));
    }
    KILN_RETURN_IF_ERROR(FromRocks(it->status(), "scan cas.v1"));
    for (const auto& [raw, blob] : blobs_) {
      if (!seen.contains(raw)) bad.emplace_back(raw, "referenced but missing");
    }
  }
  if (orphans.Count() > 0) {
    spdlog::warn("store {}: scrub deletes {} unreferenced blobs", options_.path, orphans.Count());
    KILN_RETURN_IF_ERROR(FromRocks(db_->Write(write_options_, &orphans), "delete orphans"));
  }
  for (const auto& [raw, why] : bad) KILN_RETURN_IF_ERROR(HandleCorruptBlob(raw, why));
  return absl::OkStatus();
}

absl::Status RocksDbStore::PutResult(const std::string& key, const v1::ActionResult& result,
                                     const std::vector<std::string>& blobs) {
  if (key.empty()) return absl::InvalidArgumentError("action key is empty");
  if (blobs.size() != static_cast<size_t>(result.artifacts_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(blobs.size(), " blobs for ", result.artifacts_size(), " artifacts"));
  }
  // Hashing happens before the lock: it is the expensive part and needs no shared state.
  v1::ActionResult stored = result;
  std::vector<std::string> raws(blobs.size());
  for (size_t i = 0; i < blobs.size(); ++i) {
    v1::Artifact& artifact = *stored.mutable_artifacts(static_cast<int>(i));
    absl::StatusOr<std::string> raw = DigestFromHex(artifact.digest());
    if (!raw.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("artifact ", i, ": ", raw.status().message()));
    }
    KILN_ASSIGN_OR_RETURN(std::string actual, Sha256(blobs[i]));
    if (actual != *raw) {
      return absl::InvalidArgumentError(absl::StrCat("artifact ", i, ": blob hashes to ",
                                                     DigestToHex(actual), ", not to its digest ",
                                                     artifact.digest()));
    }
    const auto size = static_cast<int64_t>(blobs[i].size());
    if (artifact.size() != 0 && artifact.size() != size) {
      return absl::InvalidArgumentError(absl::StrCat("artifact ", i, ": size ", artifact.size(),
                                                     " but the blob has ", size, " bytes"));
    }
    artifact.set_size(size);  // the index reads blob sizes from here at Open
    raws[i] = *std::move(raw);
  }
  std::string payload;
  if (!stored.SerializeToString(&payload)) {
    return absl::InternalError("ActionResult does not serialize");
  }

  absl::MutexLock lock(&mu_);
  if (suspended_.load() && absl::Now() >= retry_at_) TryResumeLocked();
  if (!suspended_.load()) {
    const absl::Status written = WriteLocked(key, stored, payload, raws, blobs);
    if (written.ok() || !IsWriteFault(written)) return written;
    SuspendLocked(written);
  }
  // The disk refuses writes: keep the result in memory so it is still served and fetchable,
  // and write it out when the disk takes writes again.
  KeepUnpersistedLocked(key, std::move(stored), std::move(raws), blobs);
  unpersisted_puts_.fetch_add(1);
  return absl::OkStatus();
}

absl::Status RocksDbStore::WriteLocked(const std::string& key, const v1::ActionResult& stored,
                                       const std::string& payload,
                                       const std::vector<std::string>& raws,
                                       const std::vector<std::string>& blobs) {
  const uint64_t tick = NextTick();
  const std::string value = EncodeAcRecord(tick, payload);
  Mutation m;
  Entry entry;
  entry.write_tick = tick;
  entry.access_tick = tick;
  entry.bytes = EntryBytes(key, value.size());
  // New references first, then release the replaced entry's: a blob both name never drops
  // to zero references in between, so it is neither deleted nor written again.
  for (size_t i = 0; i < raws.size(); ++i) {
    const std::string& raw = raws[i];
    if (std::find(entry.digests.begin(), entry.digests.end(), raw) != entry.digests.end()) {
      continue;  // the same blob twice in one result holds one reference
    }
    entry.digests.push_back(raw);
    ++m.ref_delta[raw];
    if (!blobs_.contains(raw)) {
      m.batch.Put(cas_, raw, blobs[i]);
      m.new_blobs[raw] = static_cast<int64_t>(blobs[i].size());
      m.bytes_delta += BlobBytes(static_cast<int64_t>(blobs[i].size()));
    }
  }
  SortUnique(entry.digests);
  if (auto old = entries_.find(key); old != entries_.end()) {
    m.bytes_delta -= old->second.bytes;
    PlanRelease(m, old->second);
  }
  m.batch.Put(ac_, key, value);
  m.batch.Put(lru_cf_, key, EncodeTick(tick));
  if (std::string index = GraphIndexKey(stored, key); !index.empty()) {
    m.batch.Put(graphs_cf_, index, "");
  }
  m.bytes_delta += entry.bytes;
  m.put.emplace(key, std::move(entry));
  KILN_RETURN_IF_ERROR(Commit(m));

  // The result is written; a failure to make room is the next write's problem, not this one's.
  if (absl::Status s = EvictToBudget(&key); !s.ok()) {
    spdlog::warn("store {}: eviction failed: {}", options_.path, s.ToString());
  }
  return absl::OkStatus();
}

bool RocksDbStore::IsWriteFault(const absl::Status& status) {
  // InvalidArgument and Internal are our bugs, not the disk's; everything else a write can
  // return (no space, I/O error, read-only file system, a background error) is the disk's.
  return !absl::IsInvalidArgument(status) && !absl::IsInternal(status);
}

void RocksDbStore::SuspendLocked(const absl::Status& why) {
  write_errors_.fetch_add(1);
  retry_at_ = absl::Now() + options_.write_retry_interval;
  if (!suspended_.exchange(true)) {
    spdlog::error(
        "store {}: writes suspended, results are kept in memory until the disk takes "
        "writes again: {}",
        options_.path, why.ToString());
    retry_cv_.Signal();
  }
}

void RocksDbStore::KeepUnpersistedLocked(const std::string& key, v1::ActionResult result,
                                         std::vector<std::string> raws,
                                         const std::vector<std::string>& blobs) {
  DropUnpersistedLocked(key);
  Unpersisted u;
  u.result = std::move(result);
  u.raws = std::move(raws);
  u.bytes = static_cast<int64_t>(key.size() + u.result.ByteSizeLong());
  for (size_t i = 0; i < u.raws.size(); ++i) {
    UnpersistedBlob& blob = unpersisted_blobs_[u.raws[i]];
    if (blob.refs++ == 0) blob.bytes = blobs[i];
    u.bytes += static_cast<int64_t>(blobs[i].size());
  }
  unpersisted_bytes_ += u.bytes;
  unpersisted_order_.push_back(key);
  unpersisted_.insert_or_assign(key, std::move(u));
  // Bounded: past the budget the oldest results go (later lookups of them are misses).
  while (unpersisted_bytes_ > options_.max_unpersisted_bytes && unpersisted_.size() > 1) {
    const std::string oldest = unpersisted_order_.front();
    unpersisted_order_.pop_front();
    if (oldest != key) DropUnpersistedLocked(oldest);
  }
}

void RocksDbStore::DropUnpersistedLocked(const std::string& key) {
  auto it = unpersisted_.find(key);
  if (it == unpersisted_.end()) return;
  for (const std::string& raw : it->second.raws) {
    auto blob = unpersisted_blobs_.find(raw);
    if (blob != unpersisted_blobs_.end() && --blob->second.refs == 0) {
      unpersisted_blobs_.erase(blob);
    }
  }
  unpersisted_bytes_ -= it->second.bytes;
  unpersisted_.erase(it);
  // unpersisted_order_ may still name the key; a stale name is skipped when reached.
}

bool RocksDbStore::TryResumeLocked() {
  retry_at_ = absl::Now() + options_.write_retry_interval;
  // A failed write may have put RocksDB itself into a background-error state in which it
  // refuses every write until told to recover; Resume() is a no-op when it is not in one.
  if (rocksdb::Status s = db_->Resume(); !s.ok()) {
    spdlog::debug("store {}: resume refused: {}", options_.path, s.ToString());
    return false;
  }
  // Oldest first, so the order of writes is the order of puts.
  while (!unpersisted_order_.empty()) {
    const std::string key = unpersisted_order_.front();
    auto it = unpersisted_.find(key);
    if (it == unpersisted_.end()) {
      unpersisted_order_.pop_front();
      continue;
    }
    std::string payload;
    it->second.result.SerializeToString(&payload);
    std::vector<std::string> blobs;
    for (const std::string& raw : it->second.raws) blobs.push_back(unpersisted_blobs_[raw].bytes);
    if (absl::Status s = WriteLocked(key, it->second.result, payload, it->second.raws, blobs);
        !s.ok()) {
      if (IsWriteFault(s)) {
        write_errors_.fetch_add(1);
        spdlog::debug("store {}: still cannot write: {}", options_.path, s.ToString());
        return false;
      }
      spdlog::error("store {}: dropping unpersisted result {}: {}", options_.path, key,
                    s.ToString());
    }
    unpersisted_order_.pop_front();
    DropUnpersistedLocked(key);
  }
  suspended_.store(false);
  write_resumes_.fetch_add(1);
  spdlog::warn("store {}: writes resumed", options_.path);
  if (absl::Status s = EvictToBudget(nullptr); !s.ok()) {
    spdlog::warn("store {}: eviction failed: {}", options_.path, s.ToString());
  }
  return true;
}

void RocksDbStore::RetryLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (!suspended_.load()) {
      retry_cv_.Wait(&mu_);
      continue;
    }
    retry_cv_.WaitWithDeadline(&mu_, retry_at_);
    if (!stopping_ && suspended_.load() && absl::Now() >= retry_at_) TryResumeLocked();
  }
}

bool RocksDbStore::IsPersisted(const std::string& key) const {
  absl::ReaderMutexLock lock(&mu_);
  return !unpersisted_.contains(key);
}

absl::StatusOr<std::optional<v1::ActionResult>> RocksDbStore::GetResult(const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("action key is empty");
  uint64_t indexed_tick = 0;  // which write of the key the index holds now
  {
    // The index answers most misses without a read.
    absl::ReaderMutexLock lock(&mu_);
    if (auto kept = unpersisted_.find(key); kept != unpersisted_.end()) {
      hits_.fetch_add(1);
      return kept->second.result;
    }
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      misses_.fetch_add(1);
      return std::nullopt;
    }
    indexed_tick = it->second.write_tick;
  }
  std::string value;
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ac_, key, &value);
  if (s.IsNotFound()) {  // evicted or replaced since the index said otherwise
    misses_.fetch_add(1);
    return std::nullopt;
  }
  if (!s.ok() && !s.IsCorruption()) return FromRocks(s, "read ac.v1");

  absl::StatusOr<AcRecord> record = absl::DataLossError(s.ToString());
  if (s.ok()) record = DecodeAcRecord(value);
  v1::ActionResult result;
  if (record.ok() &&
      !result.ParseFromArray(record->payload.data(), static_cast<int>(record->payload.size()))) {
    record = absl::DataLossError("ActionResult does not parse");
  }
  if (!record.ok()) {
    // A damaged record: drop the entry, unless a put replaced it since the index was
    // consulted (then the damaged bytes may not be that newer write's).
    corruptions_.fetch_add(1);
    misses_.fetch_add(1);
    spdlog::warn("store {}: AC record {} is damaged: {}", options_.path, key,
                 record.status().ToString());
    KILN_RETURN_IF_ERROR(DropEntryIfUnchanged(key, indexed_tick));
    return std::nullopt;
  }

  for (const v1::Artifact& artifact : result.artifacts()) {
    KILN_ASSIGN_OR_RETURN(std::string raw, DigestFromHex(artifact.digest()));
    bool present = false;
    if (options_.verify_blobs_on_result) {
      KILN_ASSIGN_OR_RETURN(std::optional<std::string> blob, ReadVerifiedBlob(raw));
      present = blob.has_value();
    } else {
      absl::ReaderMutexLock lock(&mu_);
      present = blobs_.contains(raw);
    }
    if (!present) {
      // An entry whose blobs are gone can never be served again.
      misses_.fetch_add(1);
      KILN_RETURN_IF_ERROR(DropEntryIfUnchanged(key, record->write_tick));
      return std::nullopt;
    }
  }

  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    // Recency is not worth a write while the disk refuses them.
    if (it != entries_.end() && it->second.write_tick == record->write_tick && !suspended_.load()) {
      const uint64_t tick = NextTick();
      // Recency is a hint: failing to persist it costs eviction order, not this hit.
      const rocksdb::Status put = db_->Put(write_options_, lru_cf_, key, EncodeTick(tick));
      if (put.ok()) {
        recency_.erase({it->second.access_tick, key});
        it->second.access_tick = tick;
        recency_.emplace(tick, key);
      } else {
        spdlog::warn("store {}: recency of {} not saved: {}", options_.path, key, put.ToString());
        if (IsWriteFault(FromRocks(put, "write lru.v1"))) {
          SuspendLocked(FromRocks(put, "write lru.v1"));
        }
      }
    }
  }
  hits_.fetch_add(1);
  return result;
}

absl::StatusOr<std::optional<std::string>> RocksDbStore::GetBlob(const std::string& digest) {
  KILN_ASSIGN_OR_RETURN(std::string raw, DigestFromHex(digest));
  {
    absl::ReaderMutexLock lock(&mu_);
    if (auto kept = unpersisted_blobs_.find(raw); kept != unpersisted_blobs_.end()) {
      return kept->second.bytes;
    }
  }
  return ReadVerifiedBlob(raw);
}

StoreStats RocksDbStore::Stats() const {
  StoreStats stats;
  stats.hits = hits_.load();
  stats.misses = misses_.load();
  stats.bytes = bytes_.load();
  stats.entries = entries_count_.load();
  stats.evictions = evictions_.load();
  stats.corruptions = corruptions_.load();
  stats.capacity_bytes = options_.capacity_bytes;
  stats.writes_suspended = suspended_.load();
  stats.write_errors = write_errors_.load();
  stats.unpersisted_puts = unpersisted_puts_.load();
  stats.write_resumes = write_resumes_.load();
  return stats;
}

absl::StatusOr<std::optional<std::string>> RocksDbStore::ReadVerifiedBlob(const std::string& raw) {
  std::string value;
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cas_, raw, &value);
  if (s.IsNotFound()) {
    bool indexed = false;
    {
      absl::ReaderMutexLock lock(&mu_);
      indexed = blobs_.contains(raw);
    }
    // Absent and unindexed is an ordinary miss; absent but indexed means data was lost.
    if (indexed) KILN_RETURN_IF_ERROR(HandleCorruptBlob(raw, "referenced but missing"));
    return std::nullopt;
  }
  if (s.IsCorruption()) {
    KILN_RETURN_IF_ERROR(HandleCorruptBlob(raw, s.ToString()));
    return std::nullopt;
  }
  KILN_RETURN_IF_ERROR(FromRocks(s, "read cas.v1"));
  KILN_ASSIGN_OR_RETURN(std::string actual, Sha256(value));
  if (actual != raw) {
    KILN_RETURN_IF_ERROR(HandleCorruptBlob(raw, "content does not match its digest"));
    return std::nullopt;
  }
  return value;
}

absl::Status RocksDbStore::HandleCorruptBlob(const std::string& raw, const std::string& why) {
  absl::MutexLock lock(&mu_);
  // Look again under the lock: another reader may have handled this blob already, and a put
  // may have written it afresh since our read.
  std::string value;
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cas_, raw, &value);
  if (s.ok()) {
    KILN_ASSIGN_OR_RETURN(std::string actual, Sha256(value));
    if (actual == raw) return absl::OkStatus();
  } else if (s.IsNotFound()) {
    if (!blobs_.contains(raw)) return absl::OkStatus();
  } else if (!s.IsCorruption()) {
    return FromRocks(s, "re-read cas.v1");
  }

  // Every entry naming the blob goes with it, so the invariant "a blob is present iff an
  // entry references it" holds again. A linear pass: this path is rare.
  Mutation m;
  for (const auto& [key, entry] : entries_) {
    if (std::binary_search(entry.digests.begin(), entry.digests.end(), raw)) {
      PlanRemove(m, key);
    }
  }
  if (m.removed.empty()) m.batch.Delete(cas_, raw);  // unindexed: nothing else deletes it
  KILN_RETURN_IF_ERROR(Commit(m));
  corruptions_.fetch_add(1);
  spdlog::warn("store {}: blob {} is corrupt ({}); deleted, with {} entries naming it",
               options_.path, DigestToHex(raw), why, m.removed.size());
  return absl::OkStatus();
}

absl::Status RocksDbStore::DropEntryIfUnchanged(const std::string& key, uint64_t write_tick) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.write_tick != write_tick) return absl::OkStatus();
  Mutation m;
  PlanRemove(m, key);
  return Commit(m);
}

int64_t RocksDbStore::RefsAfter(const Mutation& m, const std::string& raw) const {
  int64_t refs = 0;
  if (auto it = blobs_.find(raw); it != blobs_.end()) refs = it->second.refs;
  if (auto it = m.ref_delta.find(raw); it != m.ref_delta.end()) refs += it->second;
  return refs;
}

void RocksDbStore::PlanRelease(Mutation& m, const Entry& entry) {
  for (const std::string& raw : entry.digests) {
    --m.ref_delta[raw];
    if (RefsAfter(m, raw) == 0) {
      // Only this mutation's releases lower the count, so it reaches zero once per blob.
      m.batch.Delete(cas_, raw);
      if (auto it = blobs_.find(raw); it != blobs_.end()) {
        m.bytes_delta -= BlobBytes(it->second.size);
      }
    }
  }
}

void RocksDbStore::PlanRemove(Mutation& m, const std::string& key) {
  const Entry& entry = entries_.at(key);
  m.batch.Delete(ac_, key);
  m.batch.Delete(lru_cf_, key);
  m.bytes_delta -= entry.bytes;
  PlanRelease(m, entry);
  m.removed.push_back(key);
}

absl::Status RocksDbStore::Commit(Mutation& m) {
  KILN_RETURN_IF_ERROR(FromRocks(db_->Write(write_options_, &m.batch), "write batch"));
  for (const std::string& key : m.removed) {
    auto it = entries_.find(key);
    recency_.erase({it->second.access_tick, key});
    entries_.erase(it);
  }
  if (m.put) {
    auto& [key, entry] = *m.put;
    if (auto old = entries_.find(key); old != entries_.end()) {
      recency_.erase({old->second.access_tick, key});
    }
    recency_.emplace(entry.access_tick, key);
    entries_.insert_or_assign(key, std::move(entry));
  }
  for (const auto& [raw, delta] : m.ref_delta) {
    Blob& blob = blobs_[raw];
    if (auto it = m.new_blobs.find(raw); it != m.new_blobs.end()) blob.size = it->second;
    blob.refs += delta;
    if (blob.refs <= 0) blobs_.erase(raw);
  }
  bytes_.fetch_add(m.bytes_delta);
  entries_count_.store(static_cast<int64_t>(entries_.size()));
  return absl::OkStatus();
}

absl::Status RocksDbStore::EvictToBudget(const std::string* keep) {
  if (options_.capacity_bytes == 0 || bytes_.load() <= options_.capacity_bytes ||
      suspended_.load()) {
    return absl::OkStatus();
  }
  // Oldest first. The entry just written is spared: if it alone exceeds the budget the store
  // stays over budget by that one entry rather than losing the result it was asked to keep.
  Mutation m;
  for (const auto& [tick, key] : recency_) {
    if (keep != nullptr && key == *keep) continue;
    PlanRemove(m, key);
    if (bytes_.load() + m.bytes_delta <= options_.capacity_bytes) break;
  }
  if (m.removed.empty()) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Commit(m));
  evictions_.fetch_add(static_cast<int64_t>(m.removed.size()));
  spdlog::debug("store {}: evicted {} entries, {} bytes held", options_.path, m.removed.size(),
                bytes_.load());
  return absl::OkStatus();
}

}  // namespace kiln::store
