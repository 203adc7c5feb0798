#include "server/service.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/compile/result_convert.h"
#include "spdlog/spdlog.h"
#include "wire/wire.h"

namespace kiln::server {
namespace {

using compile::CompileReply;

absl::Time DeadlineOf(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

double MsSince(absl::Time start) { return absl::ToDoubleMilliseconds(absl::Now() - start); }

std::string_view Outcome(const CompileReply& r) {
  if (!r.status.ok()) return r.negative_hit ? "failed(cached)" : "error";
  if (r.cache_hit) return "hit";
  return r.joined ? "joined" : "miss";
}

// One line per request; the first line of an error message is enough to find it in the log.
// The trailer that tells clients an overload is worth retrying, and after how long
// (client/RETRY.md); from the status payload the compile service sets on a full queue.
inline constexpr char kRetryAfterTrailer[] = "kiln-retry-after-ms";

void AddRetryAfter(const absl::Status& status, grpc::CallbackServerContext* context) {
  if (auto ms = status.GetPayload(compile::kRetryAfterPayload); ms.has_value()) {
    context->AddTrailingMetadata(kRetryAfterTrailer, std::string(*ms));
  }
}

// `caller` is the token's name, never the token.
void LogReply(std::string_view method, std::string_view caller, const CompileReply& r, double ms) {
  const std::string_view prefix =
      r.handle.empty() ? std::string_view("-") : std::string_view(r.handle).substr(0, 12);
  if (r.status.ok()) {
    spdlog::info("{} {} {} {} {:.3f} ms", method, caller, prefix, Outcome(r), ms);
    return;
  }
  const absl::string_view full = r.status.message();
  const std::string message(full.substr(0, std::min(full.find('\n'), size_t{300})));
  spdlog::info("{} {} {} {} {} {:.3f} ms: {}", method, caller, prefix, Outcome(r),
               absl::StatusCodeToString(r.status.code()), ms, message);
}

// Starts a compile for `caller` within its in-flight limit. A caller at its limit is still
// answered from the cache; a miss then gets ResourceExhausted. `done` runs exactly once, as
// for CompileService::Compile; the returned Withdraw is the compile's (a no-op when none
// started).
// When `reply` has a result: remembers the request's key for lookups by key, and sets it on
// the reply.
void RememberRequest(compile::CompileService* compile, std::string request_key,
                     CompileReply* reply) {
  if (reply->status.ok() && reply->result != nullptr) {
    compile->RememberRequest(request_key, reply->handle);
    reply->request_key = std::move(request_key);
  }
}

// `done`, after RememberRequest.
compile::CompileCallback RememberingRequest(compile::CompileService* compile,
                                            std::string request_key,
                                            compile::CompileCallback done) {
  return [compile, request_key = std::move(request_key),
          done = std::move(done)](CompileReply reply) mutable {
    RememberRequest(compile, std::move(request_key), &reply);
    done(std::move(reply));
  };
}

compile::Withdraw CompileWithinLimit(compile::CompileService* compile, const auth::Caller& caller,
                                     const v1::CompileRequest& request, compile::Priority priority,
                                     absl::Time deadline, compile::CompileCallback done) {
  done = RememberingRequest(compile,
                            wire::RequestKey(request.graph(), request.target(), request.options()),
                            std::move(done));
  std::shared_ptr<auth::CompileSlot> slot = auth::Authorizer::TryAcquireCompile(caller);
  if (slot == nullptr) {
    v1::LookupRequest lookup;
    *lookup.mutable_graph() = request.graph();
    *lookup.mutable_target() = request.target();
    *lookup.mutable_options() = request.options();
    CompileReply reply = compile->Lookup(lookup);
    if (absl::IsNotFound(reply.status)) {
      reply.status = absl::ResourceExhaustedError(
          absl::StrCat("token '", caller.name, "' already has ", caller.max_compiles,
                       " compiles in flight (its limit); retry when one has finished"));
    }
    done(std::move(reply));
    return [] {};
  }
  // The slot is held while the compile runs, and given back before the reply goes out: a
  // caller at its limit that got its answer may send its next compile at once (holding the
  // slot until the callback was destroyed refused that one, now and then, once the compile
  // service dropped its callback after the reply had left).
  return compile->Compile(
      request, priority, deadline,
      [slot = std::move(slot), done = std::move(done)](CompileReply reply) mutable {
        slot.reset();
        done(std::move(reply));
      });
}

// The Withdraw of one Compile call, handed from the handler (which learns it when Compile
// returns) to OnCancel (which may come first, or after the reactor is gone).
class WithdrawSlot {
 public:
  void Set(compile::Withdraw withdraw) {
    {
      absl::MutexLock lock(&mu_);
      if (!cancelled_) {
        withdraw_ = std::move(withdraw);
        return;
      }
    }
    withdraw();
  }
  void Cancel() {
    compile::Withdraw withdraw;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      withdraw.swap(withdraw_);
    }
    if (withdraw) withdraw();
  }

 private:
  absl::Mutex mu_;
  compile::Withdraw withdraw_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// A unary Compile call that tells the compile service when its client goes away (cancelled,
// disconnected or past its deadline), so a compile nobody waits for can stop.
class CompileReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit CompileReactor(std::shared_ptr<WithdrawSlot> withdraw)
      : withdraw_(std::move(withdraw)) {}
  void OnCancel() override { withdraw_->Cancel(); }
  void OnDone() override { delete this; }

 private:
  const std::shared_ptr<WithdrawSlot> withdraw_;
};

void FillResponse(const CompileReply& r, absl::Time start, v1::CompileResponse* response) {
  response->set_handle(r.handle);
  if (r.result != nullptr) *response->mutable_result() = *r.result;
  response->set_cache_hit(r.cache_hit);
  response->set_not_persisted(r.not_persisted);
  response->set_request_key(r.request_key);
  response->set_server_ms(MsSince(start));
}

// Streams one verified blob in chunks, one write in flight at a time.
class FetchReactor final : public grpc::ServerWriteReactor<v1::ArtifactChunk> {
 public:
  FetchReactor(std::string blob, size_t chunk_bytes)
      : blob_(std::move(blob)), chunk_bytes_(std::max<size_t>(1, chunk_bytes)) {
    WriteNext();
  }
  explicit FetchReactor(const absl::Status& error) { Finish(wire::ToGrpcStatus(error)); }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    // An empty blob still gets one chunk, so the client learns total_size.
    if (offset_ >= blob_.size() && sent_any_) {
      Finish(grpc::Status::OK);
      return;
    }
    const size_t n = std::min(chunk_bytes_, blob_.size() - offset_);
    chunk_.mutable_data()->assign(blob_, offset_, n);
    chunk_.set_offset(static_cast<int64_t>(offset_));
    chunk_.set_total_size(static_cast<int64_t>(blob_.size()));
    offset_ += n;
    sent_any_ = true;
    StartWrite(&chunk_);
  }

  std::string blob_;
  size_t chunk_bytes_ = 1;
  size_t offset_ = 0;
  bool sent_any_ = false;
  v1::ArtifactChunk chunk_;
};

// Reads compile requests and answers each with a PrewarmEvent, keeping at most `limit`
// compiles of this stream in flight: reading pauses at the limit, so a client streaming a
// thousand graphs cannot flood the queue. Events go out in completion order, each naming the
// index of its request.
//
// State changes happen under mu_; the gRPC operations they call for (StartRead, StartWrite,
// Finish) are started after mu_ is released, since gRPC may run a reaction inline.
class PrewarmReactor final : public grpc::ServerBidiReactor<v1::CompileRequest, v1::PrewarmEvent> {
 public:
  PrewarmReactor(compile::CompileService* compile, auth::Caller caller, int limit,
                 absl::Time deadline)
      : compile_(compile),
        caller_(std::move(caller)),
        limit_(std::max(1, limit)),
        deadline_(deadline) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    int index = -1;
    Actions next;
    {
      absl::MutexLock lock(&mu_);
      if (ok && !write_failed_) {
        index = next_index_++;
        ++outstanding_;
      } else {
        reads_done_ = true;  // the client half-closed, or is gone
        next = MaybeFinishLocked();
      }
    }
    if (index < 0) {
      Apply(next);
      return;
    }
    const absl::Time start = absl::Now();
    // The service decodes the request before it returns, so request_ may be reused after.
    CompileWithinLimit(
        compile_, caller_, request_, compile::Priority::kPrewarm, deadline_,
        [this, index, start](CompileReply reply) { OnCompiled(index, start, std::move(reply)); });
    {
      absl::MutexLock lock(&mu_);
      if (outstanding_ < limit_) {
        next.read = true;
      } else {
        read_paused_ = true;
      }
    }
    Apply(next);
  }

  void OnWriteDone(bool ok) override {
    Actions next;
    {
      absl::MutexLock lock(&mu_);
      events_.pop_front();
      if (!ok) {
        // The client is gone: stop writing, wait for the compiles still running, then finish.
        write_failed_ = true;
        events_.clear();
      }
      if (!events_.empty()) {
        next.write = &events_.front();
      } else {
        writing_ = false;
        next = MaybeFinishLocked();
      }
    }
    Apply(next);
  }

  void OnDone() override { delete this; }

 private:
  struct Actions {
    bool read = false;
    v1::PrewarmEvent* write = nullptr;
    bool finish = false;
    grpc::Status status;
  };

  void Apply(const Actions& a) {
    if (a.write != nullptr) StartWrite(a.write);
    if (a.read) StartRead(&request_);
    if (a.finish) Finish(a.status);
  }

  void OnCompiled(int index, absl::Time start, CompileReply reply) {
    const double ms = MsSince(start);
    LogReply("Prewarm", caller_.name, reply, ms);
    Actions next;
    {
      absl::MutexLock lock(&mu_);
      --outstanding_;
      if (!write_failed_) {
        v1::PrewarmEvent& event = events_.emplace_back();
        event.set_index(index);
        event.set_handle(reply.handle);
        event.set_cache_hit(reply.cache_hit);
        event.set_code(wire::WireCode(reply.status));
        event.set_message(wire::ToGrpcStatus(reply.status).error_message());
        event.set_ms(ms);
        if (!writing_) {
          writing_ = true;
          next.write = &events_.front();
        }
      }
      if (read_paused_ && outstanding_ < limit_) {
        read_paused_ = false;
        next.read = true;
      }
      if (next.write == nullptr && !next.read) {
        Actions fin = MaybeFinishLocked();
        next.finish = fin.finish;
        next.status = fin.status;
      }
    }
    Apply(next);
  }

  // Finishes once no request can arrive, no compile is running and nothing is being written.
  Actions MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Actions a;
    if (finished_ || !reads_done_ || outstanding_ > 0 || writing_) return a;
    finished_ = true;
    a.finish = true;
    a.status = write_failed_ ? grpc::Status(grpc::StatusCode::CANCELLED, "the client went away")
                             : grpc::Status::OK;
    return a;
  }

  // Immutable after construction.
  compile::CompileService* const compile_;
  const auth::Caller caller_;
  const int limit_;
  const absl::Time deadline_;

  // At most one read is ever pending. It is filled by gRPC, read by OnReadDone, and a new read
  // is started either there or (after a pause) in OnCompiled, never both.
  v1::CompileRequest request_;

  absl::Mutex mu_;
  std::deque<v1::PrewarmEvent> events_ ABSL_GUARDED_BY(mu_);  // front is being written
  int next_index_ ABSL_GUARDED_BY(mu_) = 0;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// Finishes `reactor` with a refused authorization, logging the method and why.
grpc::ServerUnaryReactor* Refuse(grpc::ServerUnaryReactor* reactor, std::string_view method,
                                 const absl::Status& status) {
  spdlog::info("{} refused: {} {}", method, absl::StatusCodeToString(status.code()),
               std::string(status.message()));
  reactor->Finish(wire::ToGrpcStatus(status));
  return reactor;
}

}  // namespace

KilnService::KilnService(compile::CompileService* compile, store::ArtifactStore* store,
                         const ServiceOptions& options)
    : compile_(compile), store_(store), options_(options) {}

absl::StatusOr<auth::Caller> KilnService::Authorize(grpc::CallbackServerContext* context,
                                                    auth::Role needed,
                                                    std::string_view method) const {
  if (options_.authorizer == nullptr) {
    static const auto* const kOpen = new auth::Caller{"anonymous", auth::Role::kAdmin, 0,
                                                      std::make_shared<auth::TokenCounters>()};
    return *kOpen;
  }
  return options_.authorizer->Authorize(*context, needed,
                                        absl::string_view(method.data(), method.size()));
}

grpc::ServerUnaryReactor* KilnService::Compile(grpc::CallbackServerContext* context,
                                               const v1::CompileRequest* request,
                                               v1::CompileResponse* response) {
  auto withdraw = std::make_shared<WithdrawSlot>();
  auto* reactor = new CompileReactor(withdraw);
  const absl::Time start = absl::Now();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kCompile, "Compile");
  if (!caller.ok()) return Refuse(reactor, "Compile", caller.status());
  // The callback runs inline for a hit or a rejection, or later on a worker thread; both may
  // finish the call, and the response outlives it until Finish.
  withdraw->Set(CompileWithinLimit(
      compile_, *caller, *request, compile::PriorityFromWire(request->priority()),
      DeadlineOf(context),
      [context, reactor, response, start, name = caller->name](CompileReply reply) {
        FillResponse(reply, start, response);
        LogReply("Compile", name, reply, MsSince(start));
        AddRetryAfter(reply.status, context);
        reactor->Finish(wire::ToGrpcStatus(reply.status));
      }));
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::Lookup(grpc::CallbackServerContext* context,
                                              const v1::LookupRequest* request,
                                              v1::CompileResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kRead, "Lookup");
  if (!caller.ok()) return Refuse(reactor, "Lookup", caller.status());
  CompileReply reply = compile_->Lookup(*request);
  if (request->request_key().empty() || request->has_graph()) {
    RememberRequest(compile_,
                    wire::RequestKey(request->graph(), request->target(), request->options()),
                    &reply);
  }
  FillResponse(reply, start, response);
  spdlog::debug("Lookup {} {} {} {:.3f} ms", caller->name, reply.handle.substr(0, 12),
                reply.status.ok() ? "hit" : absl::StatusCodeToString(reply.status.code()),
                MsSince(start));
  reactor->Finish(wire::ToGrpcStatus(reply.status));
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::Explain(grpc::CallbackServerContext* context,
                                               const v1::ExplainRequest* request,
                                               v1::ExplainResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kRead, "Explain");
  if (!caller.ok()) return Refuse(reactor, "Explain", caller.status());
  absl::StatusOr<v1::ExplainResponse> explained = compile_->Explain(*request);
  if (explained.ok()) *response = *std::move(explained);
  reactor->Finish(wire::ToGrpcStatus(explained.status()));
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::RecordTuning(grpc::CallbackServerContext* context,
                                                    const v1::TuningRequest* request,
                                                    v1::TuningResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kCompile, "RecordTuning");
  if (!caller.ok()) return Refuse(reactor, "RecordTuning", caller.status());
  absl::StatusOr<v1::TuningResponse> recorded = compile_->RecordTuning(*request);
  if (recorded.ok()) {
    *response = *std::move(recorded);
    spdlog::info("RecordTuning {} {} on '{}': variant {}", caller->name,
                 response->handle().substr(0, 12), request->device(), response->variant());
  }
  reactor->Finish(wire::ToGrpcStatus(recorded.status()));
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::LookupTuning(grpc::CallbackServerContext* context,
                                                    const v1::TuningRequest* request,
                                                    v1::TuningResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kRead, "LookupTuning");
  if (!caller.ok()) return Refuse(reactor, "LookupTuning", caller.status());
  absl::StatusOr<v1::TuningResponse> found = compile_->LookupTuning(*request);
  if (found.ok()) *response = *std::move(found);
  reactor->Finish(wire::ToGrpcStatus(found.status()));
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::PutModel(grpc::CallbackServerContext* context,
                                                const v1::PutModelRequest* request,
                                                v1::PutModelResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kCompile, "PutModel");
  if (!caller.ok()) return Refuse(reactor, "PutModel", caller.status());
  absl::StatusOr<v1::PutModelResponse> put = compile_->PutModel(*request);
  if (put.ok()) {
    *response = *std::move(put);
    spdlog::info("PutModel {} {} ({}, {} parts, {} bytes)", caller->name,
                 request->model_key().substr(0, 12), request->format(), request->parts_size(),
                 request->record().size());
  }
  reactor->Finish(wire::ToGrpcStatus(put.status()));
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::GetModel(grpc::CallbackServerContext* context,
                                                const v1::GetModelRequest* request,
                                                v1::GetModelResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kRead, "GetModel");
  if (!caller.ok()) return Refuse(reactor, "GetModel", caller.status());
  absl::StatusOr<v1::GetModelResponse> got = compile_->GetModel(*request);
  if (got.ok()) *response = *std::move(got);
  spdlog::debug("GetModel {} {} {} {:.3f} ms", caller->name, request->model_key().substr(0, 12),
                got.ok() ? "hit" : absl::StatusCodeToString(got.status().code()), MsSince(start));
  reactor->Finish(wire::ToGrpcStatus(got.status()));
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::GetBlobs(grpc::CallbackServerContext* context,
                                                const v1::GetBlobsRequest* request,
                                                v1::GetBlobsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kRead, "GetBlobs");
  if (!caller.ok()) return Refuse(reactor, "GetBlobs", caller.status());
  size_t bytes = 0;
  for (const std::string& digest : request->digests()) {
    absl::StatusOr<std::optional<std::string>> blob = store_->GetBlob(digest);
    absl::Status status = blob.status();
    if (status.ok() && !blob->has_value())
      status = absl::NotFoundError(absl::StrCat("artifact ", digest, " is not in the cache"));
    if (!status.ok()) {
      reactor->Finish(wire::ToGrpcStatus(status));
      return reactor;
    }
    if (response->blobs_size() > 0 && bytes + (*blob)->size() > options_.blobs_reply_bytes) break;
    bytes += (*blob)->size();
    response->add_blobs(**std::move(blob));
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::ExportEntries(grpc::CallbackServerContext* context,
                                                     const v1::ExportEntriesRequest* request,
                                                     v1::ExportEntriesResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kAdmin, "ExportEntries");
  if (!caller.ok()) return Refuse(reactor, "ExportEntries", caller.status());
  absl::StatusOr<v1::ExportEntriesResponse> page =
      compile_->ExportEntries(*request, options_.blobs_reply_bytes);
  if (page.ok()) *response = *std::move(page);
  reactor->Finish(wire::ToGrpcStatus(page.status()));
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::ImportEntries(grpc::CallbackServerContext* context,
                                                     const v1::ImportEntriesRequest* request,
                                                     v1::ImportEntriesResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kAdmin, "ImportEntries");
  if (!caller.ok()) return Refuse(reactor, "ImportEntries", caller.status());
  absl::StatusOr<v1::ImportEntriesResponse> done = compile_->ImportEntries(*request);
  if (done.ok()) {
    *response = *std::move(done);
    spdlog::info("ImportEntries {}: {} entries, {} stored, {} already present{}", caller->name,
                 request->entries_size(), response->stored(), response->present(),
                 request->resign() ? ", signed again" : "");
  } else {
    spdlog::warn("ImportEntries {}: refused: {}", caller->name, done.status().ToString());
  }
  reactor->Finish(wire::ToGrpcStatus(done.status()));
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::GetResult(grpc::CallbackServerContext* context,
                                                 const v1::GetResultRequest* request,
                                                 v1::CompileResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kRead, "GetResult");
  if (!caller.ok()) return Refuse(reactor, "GetResult", caller.status());
  absl::StatusOr<std::shared_ptr<const v1::ActionResult>> result =
      compile_->GetResult(request->handle());
  if (result.ok()) {
    response->set_handle(request->handle());
    *response->mutable_result() = **result;
    response->set_cache_hit(true);
    response->set_server_ms(MsSince(start));
  }
  reactor->Finish(wire::ToGrpcStatus(result.status()));
  return reactor;
}

grpc::ServerWriteReactor<v1::ArtifactChunk>* KilnService::FetchArtifact(
    grpc::CallbackServerContext* context, const v1::FetchArtifactRequest* request) {
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kRead, "FetchArtifact");
  if (!caller.ok()) {
    spdlog::info("FetchArtifact refused: {}", std::string(caller.status().message()));
    return new FetchReactor(caller.status());
  }
  absl::StatusOr<std::optional<std::string>> blob = store_->GetBlob(request->digest());
  if (!blob.ok()) return new FetchReactor(blob.status());
  if (!blob->has_value()) {
    return new FetchReactor(
        absl::NotFoundError(absl::StrCat("artifact ", request->digest(), " is not in the cache")));
  }
  spdlog::debug("FetchArtifact {} {} bytes", request->digest().substr(0, 12), (*blob)->size());
  return new FetchReactor(**std::move(blob), options_.fetch_chunk_bytes);
}

grpc::ServerUnaryReactor* KilnService::GetSource(grpc::CallbackServerContext* context,
                                                 const v1::GetSourceRequest* request,
                                                 v1::GetSourceResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kRead, "GetSource");
  if (!caller.ok()) return Refuse(reactor, "GetSource", caller.status());
  auto finish = [&](const absl::Status& status) {
    reactor->Finish(wire::ToGrpcStatus(status));
    return reactor;
  };
  absl::StatusOr<std::shared_ptr<const v1::ActionResult>> result =
      compile_->GetResult(request->handle());
  if (!result.ok()) return finish(result.status());
  const v1::ActionResult& r = **result;

  // Reads the bytes of the artifact of `kind` into `out`; a missing one is an error only when
  // `required`.
  auto read = [&](v1::ArtifactKind kind, bool required, std::string* out) -> absl::Status {
    const v1::Artifact* artifact = compile::FindArtifact(r, kind);
    if (artifact == nullptr) {
      if (!required) return absl::OkStatus();
      return absl::NotFoundError(absl::StrCat("the result for ", request->handle(), " has no ",
                                              v1::ArtifactKind_Name(kind), " artifact"));
    }
    absl::StatusOr<std::optional<std::string>> blob = store_->GetBlob(artifact->digest());
    if (!blob.ok()) return blob.status();
    if (!blob->has_value()) {
      return absl::NotFoundError(absl::StrCat(v1::ArtifactKind_Name(kind), " artifact ",
                                              artifact->digest(), " is no longer cached"));
    }
    *out = **std::move(blob);
    return absl::OkStatus();
  };
  if (absl::Status s = read(v1::SOURCE, true, response->mutable_source()); !s.ok()) {
    return finish(s);
  }
  if (absl::Status s = read(v1::FUSION_REPORT, false, response->mutable_fusion_report()); !s.ok()) {
    return finish(s);
  }
  response->set_language(r.target().has_cuda() ? "cuda" : "c++");
  return finish(absl::OkStatus());
}

grpc::ServerBidiReactor<v1::CompileRequest, v1::PrewarmEvent>* KilnService::Prewarm(
    grpc::CallbackServerContext* context) {
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kCompile, "Prewarm");
  if (!caller.ok()) {
    // Refused before any request is read: a reactor that only finishes.
    class Refused final : public grpc::ServerBidiReactor<v1::CompileRequest, v1::PrewarmEvent> {
     public:
      explicit Refused(const absl::Status& status) { Finish(wire::ToGrpcStatus(status)); }
      void OnDone() override { delete this; }
    };
    spdlog::info("Prewarm refused: {}", std::string(caller.status().message()));
    return new Refused(caller.status());
  }
  return new PrewarmReactor(compile_, *std::move(caller), options_.prewarm_concurrency,
                            DeadlineOf(context));
}

grpc::ServerUnaryReactor* KilnService::GetStats(grpc::CallbackServerContext* context,
                                                const v1::GetStatsRequest* /*request*/,
                                                v1::GetStatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kRead, "GetStats");
  if (!caller.ok()) return Refuse(reactor, "GetStats", caller.status());
  *response = compile_->Stats();
  if (options_.authorizer != nullptr) options_.authorizer->AddStats(response);
  if (options_.ext != nullptr) options_.ext->AddStats(response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

// ---- Custom kernels (server/ext/ext.h): blobs in, a module or a cubin out.

namespace {

const absl::Status kNoExt =
    absl::UnimplementedError("custom kernel builds are not enabled on this server");

void LogExt(std::string_view method, std::string_view caller, const std::string& handle,
            const absl::Status& status, std::string_view outcome, absl::Time start) {
  const std::string_view prefix =
      handle.empty() ? std::string_view("-") : std::string_view(handle).substr(0, 12);
  if (status.ok()) {
    spdlog::info("{} {} {} {} {:.3f} ms", method, caller, prefix, outcome, MsSince(start));
  } else {
    const std::string_view m(status.message().data(), status.message().size());
    spdlog::info("{} {} {} error {}: {} {:.3f} ms", method, caller, prefix,
                 absl::StatusCodeToString(status.code()), m.substr(0, m.find('\n')),
                 MsSince(start));
  }
}

}  // namespace

grpc::ServerUnaryReactor* KilnService::FindMissingBlobs(grpc::CallbackServerContext* context,
                                                        const v1::FindMissingBlobsRequest* request,
                                                        v1::FindMissingBlobsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<auth::Caller> caller =
      Authorize(context, auth::Role::kCompile, "FindMissingBlobs");
  if (!caller.ok()) return Refuse(reactor, "FindMissingBlobs", caller.status());
  if (options_.ext == nullptr) return Refuse(reactor, "FindMissingBlobs", kNoExt);
  *response = options_.ext->FindMissing(*request);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::UploadBlobs(grpc::CallbackServerContext* context,
                                                   const v1::UploadBlobsRequest* request,
                                                   v1::UploadBlobsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kCompile, "UploadBlobs");
  if (!caller.ok()) return Refuse(reactor, "UploadBlobs", caller.status());
  if (options_.ext == nullptr) return Refuse(reactor, "UploadBlobs", kNoExt);
  absl::StatusOr<v1::UploadBlobsResponse> stored = options_.ext->Upload(*request);
  if (stored.ok()) *response = *std::move(stored);
  reactor->Finish(wire::ToGrpcStatus(stored.status()));
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::BuildExtension(grpc::CallbackServerContext* context,
                                                      const v1::BuildExtensionRequest* request,
                                                      v1::BuildExtensionResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  absl::StatusOr<auth::Caller> caller = Authorize(context, auth::Role::kCompile, "BuildExtension");
  if (!caller.ok()) return Refuse(reactor, "BuildExtension", caller.status());
  if (options_.ext == nullptr) return Refuse(reactor, "BuildExtension", kNoExt);
  // Runs inline (a hit, a refusal, missing inputs) or later on a build thread.
  options_.ext->Build(*request, [reactor, response, start, name = caller->name](
                                    absl::Status status, v1::BuildExtensionResponse reply) {
    LogExt("BuildExtension", name, reply.handle(), status,
           reply.missing_size() > 0 ? "missing-inputs"
           : reply.cache_hit()      ? "hit"
                                    : "built",
           start);
    if (status.ok()) *response = std::move(reply);
    reactor->Finish(wire::ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::CompileRawKernel(grpc::CallbackServerContext* context,
                                                        const v1::CompileRawKernelRequest* request,
                                                        v1::CompileRawKernelResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  absl::StatusOr<auth::Caller> caller =
      Authorize(context, auth::Role::kCompile, "CompileRawKernel");
  if (!caller.ok()) return Refuse(reactor, "CompileRawKernel", caller.status());
  if (options_.ext == nullptr) return Refuse(reactor, "CompileRawKernel", kNoExt);
  options_.ext->CompileRaw(*request, [reactor, response, start, name = caller->name](
                                         absl::Status status, v1::CompileRawKernelResponse reply) {
    LogExt("CompileRawKernel", name, reply.handle(), status, reply.cache_hit() ? "hit" : "built",
           start);
    if (status.ok()) *response = std::move(reply);
    reactor->Finish(wire::ToGrpcStatus(status));
  });
  return reactor;
}

}  // namespace kiln::server
