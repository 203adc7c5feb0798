#include "server/shared/shared_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/key/digest.h"
#include "server/shared/l2_records.h"
#include "spdlog/spdlog.h"

namespace kiln::shared {
namespace {

// Times one shared-tier operation into the histogram, whatever its outcome.
class ScopedLatency {
 public:
  explicit ScopedLatency(LatencyHistogram* h) : histogram_(h), start_(absl::Now()) {}
  ~ScopedLatency() { histogram_->Record(absl::Now() - start_); }

 private:
  LatencyHistogram* histogram_;
  absl::Time start_;
};

}  // namespace

void LatencyHistogram::Record(absl::Duration d) {
  const double s = absl::ToDoubleSeconds(d);
  size_t i = 0;
  while (i < kBoundsS.size() && s > kBoundsS[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_relaxed);
}

void LatencyHistogram::Fill(v1::SharedCacheStats* stats) const {
  stats->clear_latency_bounds_s();
  stats->clear_latency_counts();
  for (double b : kBoundsS) stats->add_latency_bounds_s(b);
  for (const auto& c : counts_) stats->add_latency_counts(c.load(std::memory_order_relaxed));
  stats->set_latency_sum_s(static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9);
}

SharedStore::SharedStore(RedisClient* client, SharedStoreOptions options)
    : client_(client),
      options_(std::move(options)),
      ttl_ms_(options_.ttl > absl::ZeroDuration()
                  ? absl::StrCat(std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.ttl)))
                  : "") {}

absl::Status SharedStore::Set(const std::string& key, absl::string_view value) {
  absl::StatusOr<RedisReply> reply = ttl_ms_.empty()
                                         ? client_->Command({"SET", key, value})
                                         : client_->Command({"SET", key, value, "PX", ttl_ms_});
  if (!reply.ok()) return reply.status();
  bytes_written_.fetch_add(static_cast<int64_t>(value.size()), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status SharedStore::PutBlob(const std::string& digest, const std::string& bytes) {
  ScopedLatency timed(&latency_);
  if (!key::IsDigest(digest) || key::Sha256Hex(bytes) != digest) {
    return absl::InvalidArgumentError("a blob must be stored under its SHA-256");
  }
  return WriteBlob(digest, bytes);
}

absl::StatusOr<bool> SharedStore::HasBlob(const std::string& digest) {
  ScopedLatency timed(&latency_);
  if (!key::IsDigest(digest)) return false;
  absl::StatusOr<RedisReply> exists = client_->Command({"EXISTS", BlobKey(digest)});
  if (!exists.ok()) return exists.status();
  return exists->integer == 1;
}

absl::Status SharedStore::WriteBlob(const std::string& digest, const std::string& bytes) {
  const std::string head_key = BlobKey(digest);
  absl::StatusOr<RedisReply> exists = client_->Command({"EXISTS", head_key});
  if (!exists.ok()) return exists.status();
  if (exists->integer == 1) {
    // Already shared (the same .so for two keys, or another replica's write): keep it, but
    // give it a fresh expiry when keys expire.
    if (!ttl_ms_.empty()) client_->Command({"PEXPIRE", head_key, ttl_ms_}).IgnoreError();
    return absl::OkStatus();
  }
  if (bytes.size() <= options_.chunk_bytes)
    return Set(head_key, EncodeBlobHead(0, bytes.size(), bytes));
  const size_t chunk = options_.chunk_bytes;
  const uint32_t chunks = static_cast<uint32_t>((bytes.size() + chunk - 1) / chunk);
  for (uint32_t i = 0; i < chunks; ++i) {
    const absl::string_view part = absl::string_view(bytes).substr(size_t{i} * chunk, chunk);
    if (absl::Status s = Set(ChunkKey(digest, i), part); !s.ok()) return s;
  }
  return Set(head_key, EncodeBlobHead(chunks, bytes.size(), ""));
}

absl::Status SharedStore::PutResult(const std::string& key, const v1::ActionResult& result,
                                    const std::vector<std::string>& blobs) {
  ScopedLatency timed(&latency_);
  if (key.empty() || blobs.size() != static_cast<size_t>(result.artifacts_size())) {
    return absl::InvalidArgumentError("a result needs a key and one blob per artifact");
  }
  for (int i = 0; i < result.artifacts_size(); ++i) {
    const std::string& digest = result.artifacts(i).digest();
    if (key::Sha256Hex(blobs[i]) != digest) {
      return absl::InvalidArgumentError(
          absl::StrCat("blob ", i, " does not hash to artifact digest ", digest));
    }
  }
  for (int i = 0; i < result.artifacts_size(); ++i) {
    if (absl::Status s = WriteBlob(result.artifacts(i).digest(), blobs[i]); !s.ok()) return s;
  }
  return Set(ActionKey(key), EncodeActionRecord(key, result.SerializeAsString(), options_.auth));
}

void SharedStore::DropCorrupt(const std::string& key, const absl::Status& why) {
  corruptions_.fetch_add(1, std::memory_order_relaxed);
  spdlog::warn("shared cache value {} failed verification, dropped: {}", key, why.ToString());
  client_->Command({"DEL", key}).IgnoreError();
}

absl::StatusOr<std::optional<v1::ActionResult>> SharedStore::GetResult(const std::string& key) {
  ScopedLatency timed(&latency_);
  const std::string record_key = ActionKey(key);
  absl::StatusOr<RedisReply> reply = client_->Command({"GET", record_key});
  if (!reply.ok()) return reply.status();
  if (reply->is_nil()) {
    misses_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  bytes_read_.fetch_add(static_cast<int64_t>(reply->str.size()), std::memory_order_relaxed);
  absl::StatusOr<absl::string_view> payload =
      VerifyL2Record(L2RecordKind::kAction, key, reply->str, options_.auth);
  v1::ActionResult result;
  if (payload.ok() && !result.ParseFromArray(payload->data(), static_cast<int>(payload->size()))) {
    payload = absl::DataLossError("action record payload does not parse");
  }
  for (int i = 0; payload.ok() && i < result.artifacts_size(); ++i) {
    if (!key::IsDigest(result.artifacts(i).digest())) {
      payload = absl::DataLossError(absl::StrCat("artifact ", i, " has a malformed digest"));
    }
  }
  if (payload.ok() && options_.verify) {
    if (absl::Status v = options_.verify(key, result); !v.ok()) payload = v;
  }
  if (!payload.ok()) {
    misses_.fetch_add(1, std::memory_order_relaxed);
    DropCorrupt(record_key, payload.status());
    return std::nullopt;
  }
  // The completeness check: every blob the record names must still be there. One EXISTS
  // counts them all on a standalone server; in a cluster the blobs live in different slots,
  // so each is asked of its own node.
  std::vector<std::string> heads;
  for (const v1::Artifact& a : result.artifacts()) heads.push_back(BlobKey(a.digest()));
  int64_t present = 0;
  for (size_t i = 0; i < heads.size();) {
    const size_t n = client_->cluster() ? 1 : heads.size();
    std::vector<absl::string_view> args = {"EXISTS"};
    args.insert(args.end(), heads.begin() + i, heads.begin() + i + n);
    absl::StatusOr<RedisReply> exists = client_->Command(args);
    if (!exists.ok()) return exists.status();
    present += exists->integer;
    i += n;
  }
  if (present != static_cast<int64_t>(heads.size())) {
    incomplete_.fetch_add(1, std::memory_order_relaxed);
    misses_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  hits_.fetch_add(1, std::memory_order_relaxed);
  return result;
}

absl::StatusOr<std::optional<std::string>> SharedStore::GetBlob(const std::string& digest) {
  ScopedLatency timed(&latency_);
  if (!key::IsDigest(digest)) {
    return absl::InvalidArgumentError(
        absl::StrCat("digest '", digest.substr(0, 80), "' is not 64 lowercase hex digits"));
  }
  const std::string head_key = BlobKey(digest);
  absl::StatusOr<RedisReply> reply = client_->Command({"GET", head_key});
  if (!reply.ok()) return reply.status();
  if (reply->is_nil()) return std::nullopt;
  bytes_read_.fetch_add(static_cast<int64_t>(reply->str.size()), std::memory_order_relaxed);
  absl::StatusOr<BlobHead> head = DecodeBlobHead(reply->str);
  if (!head.ok()) {
    DropCorrupt(head_key, head.status());
    return std::nullopt;
  }
  std::string bytes;
  if (head->chunks == 0) {
    bytes.assign(head->inline_bytes.data(), head->inline_bytes.size());
  } else {
    // Chunks share the head's hash tag, so one MGET reaches them all, in a cluster too.
    std::vector<std::string> names;
    names.reserve(head->chunks + 1);
    for (uint32_t i = 0; i < head->chunks; ++i) names.push_back(ChunkKey(digest, i));
    std::vector<absl::string_view> args = {"MGET"};
    for (const std::string& n : names) args.push_back(n);
    absl::StatusOr<RedisReply> parts = client_->Command(args);
    if (!parts.ok()) return parts.status();
    bytes.reserve(head->size);
    for (const RedisReply& part : parts->elements) {
      if (part.is_nil()) {
        // A chunk was evicted: the blob is gone, not corrupt. Drop the head so the next
        // writer stores it again.
        client_->Command({"DEL", head_key}).IgnoreError();
        return std::nullopt;
      }
      bytes.append(part.str);
    }
    bytes_read_.fetch_add(static_cast<int64_t>(bytes.size()), std::memory_order_relaxed);
  }
  absl::StatusOr<absl::string_view> verified = VerifyL2Record(L2RecordKind::kBlob, digest, bytes);
  if (!verified.ok()) {
    DropCorrupt(head_key, verified.status());
    return std::nullopt;
  }
  return bytes;
}

store::StoreStats SharedStore::Stats() const {
  store::StoreStats s;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  s.corruptions = corruptions_.load(std::memory_order_relaxed);
  return s;
}

void SharedStore::AddTierStats(v1::GetStatsResponse* stats) const {
  v1::SharedCacheStats* s = stats->mutable_shared();
  s->set_enabled(true);
  s->set_available(client_->available());
  s->set_address(client_->description());
  s->set_hits(hits_.load(std::memory_order_relaxed));
  s->set_misses(misses_.load(std::memory_order_relaxed));
  s->set_errors(client_->errors());
  s->set_corruptions(corruptions_.load(std::memory_order_relaxed));
  s->set_incomplete(incomplete_.load(std::memory_order_relaxed));
  s->set_bytes_read(bytes_read_.load(std::memory_order_relaxed));
  s->set_bytes_written(bytes_written_.load(std::memory_order_relaxed));
  s->set_outages(client_->outages());
  s->set_nodes_down(client_->nodes_down());
  latency_.Fill(s);
}

}  // namespace kiln::shared
