// The kiln C++ client in one include: compile a graph on a kiln daemon and run the kernel here,
// on the CPU or on a CUDA GPU, through one call path.
//
//   auto session = kiln::client::Session::Create();          // $KILN_SERVER, $KILN_CACHE_DIR
//   auto kernel = (*session)->CompileAndLoad(graph);         // this machine's CPU by default
//   kernel->Run({{x.data(), x.size() * 4}}, {{y.data(), y.size() * 4}});
//
//   auto gpu = (*session)->CompileAndLoad(graph, CudaTarget(90));   // a cubin for sm_90
//   gpu->Run(...same host buffers...);                    // copies, launches, waits, copies back
//   gpu->RunOnDevice(device_pointers, stream);            // or on the caller's device buffers
//
// A Session joins a Client (the RPCs), an ArtifactCache (the local content-addressed
// directory), the CPU loader and the CUDA loader (cuda_loader.h, which opens the driver only
// when a CUDA result is loaded). A hit takes the shortest way there is: a request the Session
// answered before is answered again from its memory, with no RPC (a result never changes under
// its request key, wire.h); then from the answers kilnd gave any process of this machine, C++
// or Python, in the last answer_ttl (the local directory's answers/, per daemon address), with
// no RPC either; then the daemon is asked by request key, a small RPC without the graph, and
// sent the graph only when it has not seen the request. Loading an artifact this machine has
// seen is a hit in the local directory, so a warm CompileAndLoad in a new process costs no RPC
// within the TTL, one small RPC after it, and no fetch. Past the TTL kilnd is asked again, so a
// result kilnd no longer gives (a new compiler, a purged entry) stops being used within it.
//
// Trust: before anything of a result is fetched or loaded, the Session checks it against its
// TrustPolicy: with trusted keys configured (SessionOptions.trusted_keys, or
// $KILN_TRUSTED_KEYS, comma-separated PEM public keys) the result must carry a valid kilnd
// signature by one of them, which binds the handle, target, plan and every artifact's digest;
// each artifact's bytes are then hashed against that digest when fetched and again, from the
// local directory, right before they are loaded (from an in-memory copy of exactly those
// bytes, so the directory cannot change what is loaded after the check). With no keys configured
// unsigned results are accepted (a local single-user setup); digests are still checked.
// An answer read back from the machine's answers/ is used without verifying its signature
// again only when its file is private to this user (owned by it, writable by no one else) and
// its signing key is still trusted (TrustPolicy::Vouched); any other is checked like an answer
// from kilnd, and forgotten when refused.
//
// Thread-safety: Session is thread-safe. LoadedKernel is immutable; Run may be called from
// many threads at once.
#pragma once

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/core/cuda_loader.h"
#include "client/cpp/artifact_cache.h"
#include "client/cpp/client.h"
#include "client/cpp/cpu_loader.h"
#include "kiln/v1/service.pb.h"
#include "wire/wire.h"

namespace kiln::client {

// The client core's CUDA loader (client/core/cuda_loader.h), under the client's names.
using core::CudaModule;
using core::CudaPlan;
using core::CudaSizeExpr;

// A CPU target for this machine: the best x86-64 ISA level its CPU runs (v4 with AVX-512
// F/BW/DQ/VL, v3 with AVX2/FMA/BMI2, else v2).
v1::Target HostCpuTarget();

// A CUDA target for compute capability `sm` (e.g. 90 for sm_90).
v1::Target CudaTarget(int sm);

// The CUDA loader's form of a launch plan (the loader has no protobuf dependency), symbolic
// sizes and all.
CudaPlan CudaPlanFromWire(const v1::LaunchPlan& wire);

// The artifact of `kind` in a compile result, or null.
const v1::Artifact* FindArtifact(const v1::CompileResponse& response, v1::ArtifactKind kind);

// A compiled kernel, loaded and ready to run: a CPU .so or a CUDA module.
class LoadedKernel {
 public:
  LoadedKernel(v1::CompileResponse response, CpuKernel kernel)
      : response_(std::move(response)), cpu_(std::move(kernel)) {}
  LoadedKernel(v1::CompileResponse response, std::shared_ptr<CudaModule> module)
      : response_(std::move(response)), cuda_(std::move(module)) {}

  const std::string& handle() const { return response_.handle(); }
  // Whether the daemon answered from its cache (no compile ran for this request).
  bool cache_hit() const { return response_.cache_hit(); }
  const v1::CompileResponse& response() const { return response_; }
  // This kernel, answered again without the daemon: marked as a cache hit.
  LoadedKernel AsCacheHit() const {
    LoadedKernel again = *this;
    again.response_.set_cache_hit(true);
    again.response_.set_server_ms(0);
    return again;
  }
  const v1::LaunchPlan& plan() const { return response_.result().plan(); }
  bool is_cuda() const { return cuda_ != nullptr; }
  // Where the .so was loaded from: an in-memory copy (/proc/self/fd/N) of the bytes that were
  // hashed against the signed digest right before the load. REQUIRES: !is_cuda().
  const std::string& library_path() const { return cpu_->path(); }
  // REQUIRES: !is_cuda().
  const CpuKernel& kernel() const { return *cpu_; }

  // Runs on host buffers, either target: inputs in graph order, outputs in the graph's output
  // order, each at least the plan's bytes (InvalidArgument otherwise, naming which). A CPU
  // kernel runs here on `num_threads` (<= 0: kernels/runtime/kiln_threads.h's rule); a CUDA
  // one is copied to the device, run, waited for and copied back (`num_threads` unused;
  // FailedPrecondition when the driver or a device is missing, Internal when a launch fails).
  absl::Status Run(absl::Span<const ConstBuffer> inputs, absl::Span<const MutableBuffer> outputs,
                   int num_threads = 0) const;

  // CUDA only: launches on device pointers (inputs then outputs) on `stream` (a CUstream;
  // null: the legacy default stream) and returns without waiting. `workspace`: a device
  // buffer of plan().workspace_bytes(), or null for one the module owns (then runs must not
  // overlap in time). FailedPrecondition for a CPU kernel. A plan with symbolic sizes takes
  // `sizes` (one per plan().symbols(), the buffers' shapes at those sizes; `workspace` then
  // holds CudaModule::WorkspaceBytes(sizes) bytes); a static one none.
  absl::Status RunOnDevice(void* const* buffers, void* stream = nullptr, void* workspace = nullptr,
                           absl::Span<const int64_t> sizes = {}) const;

 private:
  v1::CompileResponse response_;
  std::optional<CpuKernel> cpu_;
  std::shared_ptr<CudaModule> cuda_;  // shared: LoadedKernel stays copyable
};

// Which results a Session accepts. Records that verified are remembered by the SHA-256 of
// (handle, serialized result), so a hot handle's repeats cost a hash, not an Ed25519
// verification; equal bytes are an equal record, so the shortcut accepts nothing the full check
// would refuse. Thread-safe.
class TrustPolicy {
 public:
  // `trusted_key_files` empty: $KILN_TRUSTED_KEYS. `allow_unsigned` unset: $KILN_ALLOW_UNSIGNED
  // ("1" or "true"), else true exactly when no key is configured. InvalidArgument for a key file
  // that is not an Ed25519 public key, or for refusing unsigned results with no key to check.
  static absl::StatusOr<TrustPolicy> Create(std::vector<std::string> trusted_key_files = {},
                                            std::optional<bool> allow_unsigned = std::nullopt);

  // OK when `response` may be loaded: signed by a trusted key (FailedPrecondition for an
  // untrusted key or, unless allowed, no signature; DataLoss for a signature that does not
  // match), or unsigned while that is allowed.
  absl::Status Check(const v1::CompileResponse& response) const;

  // Whether `response`, read back from where this user's clients keep the answers they
  // accepted (a private file of the machine's answers/), may be used without checking its
  // signature again: when no key is configured, or when it is signed by a key that is still
  // trusted (taking a key out of the trusted set revokes what it signed). Says nothing about
  // bytes anyone else could have written: those go through Check.
  bool Vouched(const v1::CompileResponse& response) const;

  size_t num_keys() const { return keys_.size(); }
  bool allow_unsigned() const { return allow_unsigned_; }

 private:
  struct Memo;
  wire::TrustedKeys keys_;
  bool allow_unsigned_ = true;
  std::shared_ptr<Memo> memo_;
};

// How long an answer kilnd gave this machine is used again without asking kilnd, by default.
inline constexpr absl::Duration kDefaultAnswerTtl = absl::Seconds(300);

// $KILN_ANSWER_TTL in seconds (a negative or NaN value is zero, "inf" forever), else
// kDefaultAnswerTtl; InvalidArgument naming the variable for a value that is not a number. The
// Python client reads the variable by the same rule.
absl::StatusOr<absl::Duration> AnswerTtlFromEnv();

struct SessionOptions {
  ClientOptions client;
  // Root of the local artifact directory; empty means ArtifactCache::DefaultRoot().
  std::string cache_dir;
  // See TrustPolicy::Create.
  std::vector<std::string> trusted_keys;
  std::optional<bool> allow_unsigned;
  // How long an answer kilnd gave any process of this machine is used again, from the local
  // directory, without asking kilnd (see Session); zero turns that off. Unset:
  // AnswerTtlFromEnv().
  std::optional<absl::Duration> answer_ttl;
};

class Session {
 public:
  static absl::StatusOr<std::unique_ptr<Session>> Create(SessionOptions options = {});
  // A Session of parts; it uses this machine's answers only when given an `answer_ttl`.
  Session(std::unique_ptr<Client> client, std::unique_ptr<ArtifactCache> cache,
          TrustPolicy trust = {}, absl::Duration answer_ttl = absl::ZeroDuration())
      : client_(std::move(client)),
        cache_(std::move(cache)),
        trust_(std::move(trust)),
        answer_ttl_(std::max(answer_ttl, absl::ZeroDuration())) {}

  // The trust check Load runs first; callers that fetch artifacts themselves (CUDA) run it
  // before using anything of the response.
  absl::Status Verify(const v1::CompileResponse& response) const { return trust_.Check(response); }

  // Compiles (or finds) `graph` for `target` on the daemon, fetches the artifact (the .so, or
  // the cubin and PTX) unless the local directory has it, verifies and loads it. Loading a
  // CUDA result needs the NVIDIA driver (FailedPrecondition without one). The deadline covers
  // the compile and the fetch.
  absl::StatusOr<LoadedKernel> CompileAndLoad(const v1::Graph& graph,
                                              const v1::Target& target = HostCpuTarget(),
                                              const v1::CompileOptions& options = {},
                                              absl::Time deadline = Client::kDefaultDeadline);

  // Requests answered from this Session's memory, from this machine's answers (no RPC), and
  // by request key from the daemon's memory.
  int64_t local_hits() const;
  int64_t machine_hits() const;
  int64_t key_hits() const;
  absl::Duration answer_ttl() const { return answer_ttl_; }

  // Loads a result the daemon already holds, by handle (GetResult, then as above).
  absl::StatusOr<LoadedKernel> LoadHandle(const std::string& handle,
                                          absl::Time deadline = Client::kDefaultDeadline);

  // Loads the kernel (CPU or CUDA) of a compile result the caller already has, after Verify.
  absl::StatusOr<LoadedKernel> Load(v1::CompileResponse response,
                                    absl::Time deadline = Client::kDefaultDeadline);

  // The local path of `artifact`, fetched from the daemon only when the directory lacks a
  // verified copy. For any kind: the source for a reader, a cubin for a loader of one's own.
  absl::StatusOr<std::string> FetchArtifact(const v1::Artifact& artifact,
                                            absl::Time deadline = Client::kDefaultDeadline);

  Client& client() { return *client_; }
  ArtifactCache& cache() { return *cache_; }

  // The name of the answer to `request_key` in this machine's answers/: per daemon address.
  std::string AnswerName(const std::string& request_key) const;

 private:
  // Load without the trust check, for a response that passed it (or was vouched for).
  absl::StatusOr<LoadedKernel> LoadChecked(v1::CompileResponse response, absl::Time deadline);
  absl::StatusOr<LoadedKernel> LoadCuda(v1::CompileResponse response, absl::Time deadline);
  // The answer kilnd gave this machine under `name` within the TTL, loaded; nullopt when there
  // is none or it cannot be used (one the trust policy refuses, or that does not parse, is
  // forgotten).
  std::optional<LoadedKernel> MachineAnswer(const std::string& name, absl::Time deadline);
  void Remember(const std::string& request_key, const LoadedKernel& kernel);

  // Immutable after construction; Client and ArtifactCache are thread-safe.
  const std::unique_ptr<Client> client_;
  const std::unique_ptr<ArtifactCache> cache_;
  const TrustPolicy trust_;
  const absl::Duration answer_ttl_;  // zero: no machine answers

  // Results by request key, oldest first in `known_order_` (bounded).
  mutable absl::Mutex known_mu_;
  absl::flat_hash_map<std::string, LoadedKernel> known_ ABSL_GUARDED_BY(known_mu_);
  std::deque<std::string> known_order_ ABSL_GUARDED_BY(known_mu_);
  int64_t local_hits_ ABSL_GUARDED_BY(known_mu_) = 0;
  int64_t machine_hits_ ABSL_GUARDED_BY(known_mu_) = 0;
  int64_t key_hits_ ABSL_GUARDED_BY(known_mu_) = 0;
  std::atomic<bool> by_key_{true};  // off after a daemon that does not know lookups by key
};

}  // namespace kiln::client
