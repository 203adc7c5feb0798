// RocksDbStore's scans that serve no request path: the graphs.v1 family (which action keys
// were stored for a graph, so that a miss can be explained against its nearest stored
// neighbours; FORMAT.md, "graphs.v1") and the listing of ac.v1 that a bundle export pages
// through.
//
// Index records are written in the same batch as the AC entry they name and never read on the
// serving path. They are not deleted with the entry: a reader finds the entry gone and deletes
// the record then, which keeps eviction (rocksdb_store.cc) unaware of the index.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/store/records.h"
#include "server/store/rocksdb_store.h"
#include "spdlog/spdlog.h"

namespace kiln::store {
namespace {

constexpr size_t kHexDigest = 2 * kDigestBytes;

bool IsHexDigest(const std::string& s) {
  if (s.size() != kHexDigest) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string GraphIndexKey(const v1::ActionResult& result, const std::string& action_key) {
  for (const v1::KeyField& field : result.key_fields()) {
    if (field.label() == "graph" && IsHexDigest(field.value())) {
      return absl::StrCat(field.value(), action_key);
    }
  }
  return "";
}

absl::StatusOr<std::vector<std::pair<std::string, v1::ActionResult>>> RocksDbStore::ResultsForGraph(
    const std::string& graph_digest, size_t limit) {
  if (!IsHexDigest(graph_digest)) {
    return absl::InvalidArgumentError(
        absl::StrCat("graph digest must be 64 lowercase hex digits, got '", graph_digest, "'"));
  }
  std::vector<std::pair<std::string, v1::ActionResult>> out;
  std::vector<std::string> stale;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), graphs_cf_));
  for (it->Seek(graph_digest); it->Valid() && out.size() < limit; it->Next()) {
    const rocksdb::Slice index = it->key();
    if (!index.starts_with(graph_digest)) break;
    std::string key(index.data() + kHexDigest, index.size() - kHexDigest);
    std::string value;
    const rocksdb::Status get = db_->Get(rocksdb::ReadOptions(), ac_, key, &value);
    if (get.IsNotFound()) {
      stale.push_back(index.ToString());
      continue;
    }
    if (!get.ok()) return absl::UnavailableError(absl::StrCat("read ", key, ": ", get.ToString()));
    absl::StatusOr<AcRecord> record = DecodeAcRecord(value);
    v1::ActionResult result;
    if (!record.ok() ||
        !result.ParseFromArray(record->payload.data(), static_cast<int>(record->payload.size()))) {
      continue;  // a damaged entry is GetResult's to drop; it explains nothing
    }
    out.emplace_back(std::move(key), std::move(result));
  }
  if (!it->status().ok()) {
    return absl::UnavailableError(absl::StrCat("scan graphs.v1: ", it->status().ToString()));
  }
  for (const std::string& index : stale) {
    // Best effort: a record left behind is found stale again next time.
    if (const rocksdb::Status del = db_->Delete(write_options_, graphs_cf_, index); !del.ok()) {
      spdlog::debug("store {}: stale graph index record not deleted: {}", options_.path,
                    del.ToString());
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, v1::ActionResult>>> RocksDbStore::ListResults(
    const std::string& after_key, size_t limit) {
  std::vector<std::pair<std::string, v1::ActionResult>> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), ac_));
  if (after_key.empty()) {
    it->SeekToFirst();
  } else {
    it->Seek(after_key);
    if (it->Valid() && it->key() == rocksdb::Slice(after_key)) it->Next();
  }
  for (; it->Valid() && out.size() < limit; it->Next()) {
    const std::string value = it->value().ToString();  // the record's payload views into it
    absl::StatusOr<AcRecord> record = DecodeAcRecord(value);
    v1::ActionResult result;
    if (!record.ok() ||
        !result.ParseFromArray(record->payload.data(), static_cast<int>(record->payload.size()))) {
      continue;  // a damaged entry is GetResult's to drop; a bundle does not carry it
    }
    out.emplace_back(it->key().ToString(), std::move(result));
  }
  if (!it->status().ok()) {
    return absl::UnavailableError(absl::StrCat("scan ac.v1: ", it->status().ToString()));
  }
  return out;
}

}  // namespace kiln::store
