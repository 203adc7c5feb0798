// KilnService: the kiln.v1.Kiln gRPC service, on the callback API.
//
// Handlers are thin: decode, start or join a job in the CompileService, reply. Nothing
// compiles on a gRPC thread: a cache hit is answered inline, a miss is answered from the
// CompileService's callback on a worker (or deadline timer) thread. Artifact bytes come
// straight from the store, verified by it, and are streamed in chunks.
// Each Compile logs one line: method, caller (token name), key prefix, outcome (hit / miss /
// joined / error), ms.
// Every call is authorized first (auth::Authorizer): Lookup, GetResult, FetchArtifact,
// GetSource, GetStats, LookupTuning, GetModel and GetBlobs need role read; Compile, Prewarm,
// RecordTuning, PutModel and the custom-kernel calls (FindMissingBlobs, UploadBlobs,
// BuildExtension, CompileRawKernel) role compile; ExportEntries and ImportEntries (bundles)
// role admin. Compiles count
// against the caller's in-flight limit; a caller at its limit is still answered from the cache
// and gets RESOURCE_EXHAUSTED for a miss. The health service is not this service: it stays
// open to everyone.
// Thread-safety: gRPC calls the handlers concurrently; the service holds no mutable state of
// its own beyond what its reactors own.
#pragma once

#include <cstddef>
#include <string_view>

#include "kiln/v1/service.grpc.pb.h"
#include "server/auth/auth.h"
#include "server/compile/compile_service.h"
#include "server/ext/ext.h"
#include "server/store/artifact_store.h"

namespace kiln::server {

struct ServiceOptions {
  size_t fetch_chunk_bytes = size_t{1} << 20;  // FetchArtifact chunk size
  size_t blobs_reply_bytes = size_t{32}
                             << 20;  // GetBlobs: bytes of one reply (past its first blob)
  int prewarm_concurrency = 8;       // requests of one Prewarm stream in flight at once
  // Who may call what; null lets everyone call everything. Must outlive the service.
  const auth::Authorizer* authorizer = nullptr;
  // Custom kernels (BuildExtension, CompileRawKernel and their blob calls); null answers them
  // UNIMPLEMENTED. Must outlive the service.
  ext::ExtensionBuilder* ext = nullptr;
};

class KilnService final : public v1::Kiln::CallbackService {
 public:
  // `compile` and `store` must outlive the service (and the gRPC server it is registered in).
  KilnService(compile::CompileService* compile, store::ArtifactStore* store,
              const ServiceOptions& options = {});

  grpc::ServerUnaryReactor* Compile(grpc::CallbackServerContext* context,
                                    const v1::CompileRequest* request,
                                    v1::CompileResponse* response) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context,
                                   const v1::LookupRequest* request,
                                   v1::CompileResponse* response) override;
  grpc::ServerUnaryReactor* GetResult(grpc::CallbackServerContext* context,
                                      const v1::GetResultRequest* request,
                                      v1::CompileResponse* response) override;
  grpc::ServerWriteReactor<v1::ArtifactChunk>* FetchArtifact(
      grpc::CallbackServerContext* context, const v1::FetchArtifactRequest* request) override;
  grpc::ServerUnaryReactor* GetSource(grpc::CallbackServerContext* context,
                                      const v1::GetSourceRequest* request,
                                      v1::GetSourceResponse* response) override;
  grpc::ServerBidiReactor<v1::CompileRequest, v1::PrewarmEvent>* Prewarm(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;
  grpc::ServerUnaryReactor* Explain(grpc::CallbackServerContext* context,
                                    const v1::ExplainRequest* request,
                                    v1::ExplainResponse* response) override;
  grpc::ServerUnaryReactor* FindMissingBlobs(grpc::CallbackServerContext* context,
                                             const v1::FindMissingBlobsRequest* request,
                                             v1::FindMissingBlobsResponse* response) override;
  grpc::ServerUnaryReactor* UploadBlobs(grpc::CallbackServerContext* context,
                                        const v1::UploadBlobsRequest* request,
                                        v1::UploadBlobsResponse* response) override;
  grpc::ServerUnaryReactor* BuildExtension(grpc::CallbackServerContext* context,
                                           const v1::BuildExtensionRequest* request,
                                           v1::BuildExtensionResponse* response) override;
  grpc::ServerUnaryReactor* CompileRawKernel(grpc::CallbackServerContext* context,
                                             const v1::CompileRawKernelRequest* request,
                                             v1::CompileRawKernelResponse* response) override;
  grpc::ServerUnaryReactor* RecordTuning(grpc::CallbackServerContext* context,
                                         const v1::TuningRequest* request,
                                         v1::TuningResponse* response) override;
  grpc::ServerUnaryReactor* LookupTuning(grpc::CallbackServerContext* context,
                                         const v1::TuningRequest* request,
                                         v1::TuningResponse* response) override;
  grpc::ServerUnaryReactor* PutModel(grpc::CallbackServerContext* context,
                                     const v1::PutModelRequest* request,
                                     v1::PutModelResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const v1::GetModelRequest* request,
                                     v1::GetModelResponse* response) override;
  grpc::ServerUnaryReactor* GetBlobs(grpc::CallbackServerContext* context,
                                     const v1::GetBlobsRequest* request,
                                     v1::GetBlobsResponse* response) override;
  grpc::ServerUnaryReactor* ExportEntries(grpc::CallbackServerContext* context,
                                          const v1::ExportEntriesRequest* request,
                                          v1::ExportEntriesResponse* response) override;
  grpc::ServerUnaryReactor* ImportEntries(grpc::CallbackServerContext* context,
                                          const v1::ImportEntriesRequest* request,
                                          v1::ImportEntriesResponse* response) override;

 private:
  // The caller of `context` when it holds `needed`; otherwise the status to finish with.
  absl::StatusOr<auth::Caller> Authorize(grpc::CallbackServerContext* context, auth::Role needed,
                                         std::string_view method) const;

  // Immutable after construction.
  compile::CompileService* const compile_;
  store::ArtifactStore* const store_;
  const ServiceOptions options_;
};

}  // namespace kiln::server
