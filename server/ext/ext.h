// Custom kernels: extension modules and raw CUDA kernels built by kilnd from the caller's own
// sources, cached in the artifact store like compiled graphs.
//
// Contract.
// - Inputs are content-addressed blobs in an InputStore (input_store.h): callers ask which
//   digests are missing (FindMissing), upload those (Upload), then ask for a build naming
//   trees by digest. A build whose inputs are incomplete answers with the missing digests and
//   builds nothing. With a shared tier (ExtOptions::shared_inputs), inputs uploaded to one
//   replica serve builds on every replica.
// - The action key is the SHA-256 of the request (priority aside: sources and trees by digest,
//   flags, archs, Python tag, the caller's ABI facts) and of the toolchain's identity (the host
//   compiler's and nvcc's or NVRTC's versions). A hit answers from the store without looking
//   at the inputs; the result is one artifact (a SHARED_OBJECT module or a CUBIN) and the
//   build output in compile_log.
// - Builds run in the sandbox (sandbox.h), inside a private folder: sources at /src, include
//   trees at /inc/<n>, output at /out. A build compiles its translation units several at once
//   (build_jobs.h), then links; nvcc builds a .cu file's architectures on threads of its own.
//   Flags that load code into the toolchain (-fplugin, -specs, -B, -wrapper, -fuse-ld, -ccbin,
//   response files, ...) are refused with InvalidArgument naming the flag, before anything runs.
// - .cu sources are built for the request's architectures (cuda_targets.h: TORCH_CUDA_ARCH_LIST's
//   "9.0a" and "+PTX" among them) by the nvcc FindCudaToolkit finds (cuda_toolkit.h), run by its
//   real path; the sandbox holds its toolkit and the symlinks that name it.
// - A failed build answers InvalidArgument with the compiler's diagnostics (paths inside the
//   sandbox only); a build past a limit answers ResourceExhausted naming the limit. Both are
//   remembered for `negative_ttl` (a retry gets the same answer without building), never stored.
// - Identical builds in flight run once; builds run on their own bounded pool, off the gRPC
//   threads, so a slow build never holds up graph compiles or cache hits.
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/call_once.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/toolchain/subprocess.h"
#include "kiln/v1/service.pb.h"
#include "server/compile/result_cache.h"
#include "server/compile/worker_pool.h"
#include "server/ext/build_jobs.h"
#include "server/ext/cuda_targets.h"
#include "server/ext/input_store.h"
#include "server/ext/sandbox.h"
#include "server/store/artifact_store.h"

namespace kiln::ext {

struct ExtOptions {
  std::string dir;  // the InputStore's folder (blobs kept across restarts)
  // Where trees are materialized and builds run: it must be on a path the sandbox's identity
  // can traverse. Empty: a private folder under $TMPDIR (mode 0711), removed at exit.
  std::string scratch_dir;
  int64_t input_capacity_bytes = int64_t{4} << 30;  // inputs kept, LRU beyond it
  int workers = 2;                                  // builds at once
  int64_t queue_size = 64;
  absl::Duration negative_ttl = absl::Seconds(30);
  int64_t max_artifact_bytes = int64_t{256} << 20;
  int64_t max_upload_bytes = int64_t{64} << 20;  // one UploadBlobs call
  SandboxOptions sandbox;
  std::string cxx = "g++";  // host compiler and linker (found on PATH at Create)
  // For .cu sources (optional): a path or a name on PATH; empty: found as PyTorch's
  // cpp_extension finds it (FindCudaToolkit).
  std::string nvcc;
  // Sandboxed commands running at once, all builds together; one build alone may use them all.
  // 0: the host's cores, and at least `workers`.
  int jobs = 0;
  std::string nvrtc_tool;  // the kiln-nvrtc program for raw kernels; optional
  // Signs a result before it is stored (the handle is its key), as for graph compiles.
  std::function<absl::Status(const std::string& key, v1::ActionResult* result)> sign;
  // The cluster's shared tier for input blobs (input_store.h); empty: inputs stay per replica.
  SharedInputs shared_inputs;
};

struct ExtStats {
  int64_t builds = 0;
  int64_t failures = 0;
  int64_t cache_hits = 0;
  int64_t input_blobs = 0;
  int64_t input_bytes = 0;
};

class ExtensionBuilder {
 public:
  // Checks the sandbox (FailedPrecondition when it cannot run: builds are then refused with
  // that reason, everything else still works) and finds the toolchain.
  static absl::StatusOr<std::unique_ptr<ExtensionBuilder>> Create(const ExtOptions& options,
                                                                  store::ArtifactStore* store);
  ~ExtensionBuilder();

  v1::FindMissingBlobsResponse FindMissing(const v1::FindMissingBlobsRequest& request);
  absl::StatusOr<v1::UploadBlobsResponse> Upload(const v1::UploadBlobsRequest& request);

  using BuildCallback = std::function<void(absl::Status, v1::BuildExtensionResponse)>;
  using RawCallback = std::function<void(absl::Status, v1::CompileRawKernelResponse)>;
  // `done` runs exactly once: inline for a hit, a refusal or missing inputs, else on a build
  // thread.
  void Build(const v1::BuildExtensionRequest& request, BuildCallback done);
  void CompileRaw(const v1::CompileRawKernelRequest& request, RawCallback done);

  ExtStats Stats() const;
  // Adds the custom-build counters to a GetStats reply (and so to /metrics).
  void AddStats(v1::GetStatsResponse* response) const;
  // Why builds are refused on this host (empty when they run).
  const std::string& unavailable() const { return unavailable_; }

 private:
  struct Job;
  struct Outcome {
    absl::Status status;
    std::shared_ptr<const v1::ActionResult> result;
    bool cache_hit = false;
  };
  ExtensionBuilder(ExtOptions options, store::ArtifactStore* store);

  // Looks up `key`, else runs `build` once for all identical requests; `done` gets the outcome.
  void GetOrBuild(const std::string& key, compile::Priority priority,
                  std::function<absl::StatusOr<v1::ActionResult>()> build,
                  std::function<void(Outcome)> done);
  // Fills `response` from the store; true on a hit.
  template <typename Response>
  bool ServeStored(const std::string& key, Response* response);
  // The GetOrBuild callback that answers `done` with `response` and the build's result.
  template <typename Response>
  std::function<void(Outcome)> Answer(Response response,
                                      std::function<void(absl::Status, Response)> done,
                                      std::chrono::steady_clock::time_point start);
  absl::StatusOr<v1::ActionResult> RunBuild(const v1::BuildExtensionRequest& request,
                                            const std::vector<CudaTarget>& targets,
                                            const std::string& key);
  absl::StatusOr<v1::ActionResult> RunRaw(const v1::CompileRawKernelRequest& request,
                                          const std::string& key);
  std::string Fingerprint(bool cuda);
  void ReadVersions();

  const ExtOptions options_;
  store::ArtifactStore* const store_;
  std::unique_ptr<toolchain::TempDir> scratch_;  // when options_.scratch_dir was empty
  std::string scratch_path_;
  std::string nvrtc_in_scratch_;
  std::unique_ptr<InputStore> inputs_;
  std::string unavailable_;
  std::string nvcc_search_;  // where Create looked for nvcc, for the refusal without one
  absl::once_flag versions_once_;
  std::string cxx_version_, nvcc_version_, nvrtc_version_;  // set once by ReadVersions
  compile::FailureCache failures_;
  JobSlots slots_;  // the sandboxed commands of all builds

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<std::function<void(Outcome)>>> in_flight_
      ABSL_GUARDED_BY(mu_);

  std::atomic<int64_t> builds_{0}, failures_count_{0}, hits_{0};
  compile::WorkerPool pool_;  // last: joined first
};

// The flag `flag` (one argv element of cflags, cuda_cflags or ldflags) if it may load code into
// the toolchain or escape the sandbox's layout: the reason, else empty.
std::string ForbiddenFlagReason(const std::string& flag);

}  // namespace kiln::ext
