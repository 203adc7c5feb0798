#include "client/cpp/kiln.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/core/answers.h"
#include "kernels/key/digest.h"
#include "kernels/util/status_macros.h"

namespace kiln::client {

v1::Target HostCpuTarget() {
  v1::Target target;
  std::string isa = "x86-64-v2";
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("bmi2")) {
    isa = "x86-64-v3";
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
      isa = "x86-64-v4";
    }
  }
#endif
  target.mutable_cpu()->set_isa(isa);
  return target;
}

v1::Target CudaTarget(int sm) {
  v1::Target target;
  target.mutable_cuda()->set_sm(sm);
  return target;
}

const v1::Artifact* FindArtifact(const v1::CompileResponse& response, v1::ArtifactKind kind) {
  for (const v1::Artifact& artifact : response.result().artifacts()) {
    if (artifact.kind() == kind) return &artifact;
  }
  return nullptr;
}

namespace {

// Results one Session keeps by request key (each a loaded kernel and a few KB of metadata).
constexpr size_t kKnownResults = 4096;

// The bytes of the local artifact at `path`, checked against `digest` at load time: the
// artifact directory is shared with other processes, so what was verified when it was fetched
// may have changed since.
absl::StatusOr<std::string> ReadVerified(const std::string& digest, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  std::ostringstream bytes;
  bytes << f.rdbuf();
  std::string data = bytes.str();
  if (key::Sha256Hex(data) != digest) {
    return absl::DataLossError(absl::StrCat("local artifact ", path, " does not match its digest ",
                                            digest.substr(0, 12),
                                            " at load time: refusing to load it"));
  }
  return data;
}

CudaSizeExpr ToCudaSizeExpr(const v1::SizeExpr& wire) {
  CudaSizeExpr e;
  for (const v1::SizeTerm& t : wire.terms()) {
    CudaSizeExpr::Term& out = e.terms.emplace_back();
    out.coeff = t.coeff();
    for (int k = 0; k < t.exponents_size(); ++k)
      for (int j = 0; j < t.exponents(k); ++j) out.symbols.push_back(k);
  }
  return e;
}

}  // namespace

CudaPlan CudaPlanFromWire(const v1::LaunchPlan& wire) {
  CudaPlan plan;
  plan.abi_version = wire.abi_version();
  plan.workspace_bytes = wire.workspace_bytes();
  for (const v1::PlanSymbol& s : wire.symbols())
    plan.symbols.push_back({s.name(), s.input(), s.axis()});
  plan.index_bound = ToCudaSizeExpr(wire.index_bound());
  for (const v1::PlanBuffer& b : wire.buffers()) {
    CudaPlan::Buffer& out = plan.buffers.emplace_back();
    out.role = b.role() == v1::INPUT    ? CudaPlan::Role::kInput
               : b.role() == v1::OUTPUT ? CudaPlan::Role::kOutput
                                        : CudaPlan::Role::kTemp;
    out.index = b.index();
    out.dtype = v1::DType_Name(b.dtype());
    out.shape.assign(b.shape().begin(), b.shape().end());
    out.bytes = b.bytes();
    out.offset = b.offset();
    for (const v1::SizeExpr& d : b.shape_exprs()) out.shape_exprs.push_back(ToCudaSizeExpr(d));
    out.bytes_expr = ToCudaSizeExpr(b.bytes_expr());
  }
  for (const v1::PlanStep& s : wire.steps()) {
    CudaPlan::Step& out = plan.steps.emplace_back();
    out.kernel = s.kernel();
    for (int i = 0; i < 3; ++i) {
      if (i < s.grid_size()) out.grid[i] = s.grid(i);
      if (i < s.block_size()) out.block[i] = s.block(i);
    }
    out.shared_bytes = s.shared_bytes();
    out.args.assign(s.args().begin(), s.args().end());
    out.grid_work = ToCudaSizeExpr(s.grid_work());
    out.grid_per_block = s.grid_per_block();
    out.guard = ToCudaSizeExpr(s.guard());
    out.guard_min = s.guard_min();
    out.guard_max = s.guard_max();
  }
  return plan;
}

namespace {

// Digest -> the in-memory file its verified bytes were loaded from, process-wide.
struct Images {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::string> paths ABSL_GUARDED_BY(mu);
};

Images& LoadedImages() {
  static auto* images = new Images();
  return *images;
}

// The bytes of the local artifact at `path`, hashed here against `digest` and copied into an
// anonymous in-memory file, whose /proc/self/fd path is returned: dlopen then maps exactly the
// bytes that were checked, whatever happens to the artifact directory meanwhile. One file per
// digest per process; its descriptor stays open, since the dynamic loader knows a library by
// its name and a reused descriptor number would name another library.
absl::StatusOr<std::string> VerifiedImage(const std::string& digest, const std::string& path) {
  Images& images = LoadedImages();
  absl::MutexLock lock(&images.mu);
  if (auto it = images.paths.find(digest); it != images.paths.end()) return it->second;
  KILN_ASSIGN_OR_RETURN(const std::string data, ReadVerified(digest, path));
  const int fd = memfd_create(("kiln-" + digest.substr(0, 12)).c_str(), MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n <= 0) {
      close(fd);
      return absl::InternalError(
          absl::StrCat("writing the in-memory image: ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  std::string image = absl::StrCat("/proc/self/fd/", fd);
  images.paths.emplace(digest, image);
  return image;
}

}  // namespace

struct TrustPolicy::Memo {
  static constexpr size_t kEntries = 4096;
  absl::Mutex mu;
  absl::flat_hash_set<std::string> verified ABSL_GUARDED_BY(mu);
  std::deque<std::string> order ABSL_GUARDED_BY(mu);  // oldest first, for eviction
};

absl::StatusOr<TrustPolicy> TrustPolicy::Create(std::vector<std::string> trusted_key_files,
                                                std::optional<bool> allow_unsigned) {
  if (trusted_key_files.empty()) {
    if (const char* env = std::getenv("KILN_TRUSTED_KEYS"); env != nullptr) {
      trusted_key_files = std::vector<std::string>(absl::StrSplit(env, ',', absl::SkipEmpty()));
    }
  }
  if (!allow_unsigned.has_value()) {
    if (const char* env = std::getenv("KILN_ALLOW_UNSIGNED"); env != nullptr && *env != '\0') {
      allow_unsigned = std::string_view(env) == "1" || absl::EqualsIgnoreCase(env, "true");
    }
  }
  TrustPolicy policy;
  KILN_ASSIGN_OR_RETURN(policy.keys_, wire::TrustedKeys::FromPemFiles(trusted_key_files));
  policy.allow_unsigned_ = allow_unsigned.value_or(policy.keys_.empty());
  policy.memo_ = std::make_shared<Memo>();
  if (policy.keys_.empty() && !policy.allow_unsigned_) {
    return absl::InvalidArgumentError(
        "refusing unsigned results needs at least one trusted key (KILN_TRUSTED_KEYS)");
  }
  return policy;
}

absl::Status TrustPolicy::Check(const v1::CompileResponse& response) const {
  if (keys_.empty()) return absl::OkStatus();  // allow_unsigned_ holds: nothing to check with
  if (!response.result().has_signature() && allow_unsigned_) return absl::OkStatus();
  std::string record = response.handle();
  record.push_back('\0');
  response.result().AppendToString(&record);
  const std::string memo = key::Sha256Hex(record);
  if (memo_ != nullptr) {
    absl::MutexLock lock(&memo_->mu);
    if (memo_->verified.contains(memo)) return absl::OkStatus();
  }
  KILN_RETURN_IF_ERROR(keys_.VerifyResult(response.handle(), response.result()));
  if (memo_ != nullptr) {
    absl::MutexLock lock(&memo_->mu);
    if (memo_->verified.insert(memo).second) memo_->order.push_back(memo);
    if (memo_->order.size() > Memo::kEntries) {
      memo_->verified.erase(memo_->order.front());
      memo_->order.pop_front();
    }
  }
  return absl::OkStatus();
}

bool TrustPolicy::Vouched(const v1::CompileResponse& response) const {
  if (keys_.empty()) return true;
  if (!response.result().has_signature()) return false;
  const v1::ResultSignature& sig = response.result().signature();
  return sig.algorithm() == wire::kSignatureAlgorithm && keys_.Trusts(sig.key_id());
}

absl::StatusOr<absl::Duration> AnswerTtlFromEnv() {
  const char* env = std::getenv("KILN_ANSWER_TTL");
  const std::string raw = env != nullptr ? env : "";
  if (absl::StripAsciiWhitespace(raw).empty()) return kDefaultAnswerTtl;
  double seconds = 0;
  if (!absl::SimpleAtod(raw, &seconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KILN_ANSWER_TTL='", raw, "': expected seconds (0 turns the answer tier off)"));
  }
  return seconds > 0 ? absl::Seconds(seconds) : absl::ZeroDuration();  // NaN too is zero
}

absl::StatusOr<std::unique_ptr<Session>> Session::Create(SessionOptions options) {
  KILN_ASSIGN_OR_RETURN(TrustPolicy trust, TrustPolicy::Create(std::move(options.trusted_keys),
                                                               options.allow_unsigned));
  absl::Duration answer_ttl;
  if (options.answer_ttl.has_value()) {
    answer_ttl = *options.answer_ttl;
  } else {
    KILN_ASSIGN_OR_RETURN(answer_ttl, AnswerTtlFromEnv());
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Create(std::move(options.client)));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ArtifactCache> cache,
                        ArtifactCache::Open(options.cache_dir));
  return std::make_unique<Session>(std::move(client), std::move(cache), std::move(trust),
                                   answer_ttl);
}

absl::StatusOr<std::string> Session::FetchArtifact(const v1::Artifact& artifact,
                                                   absl::Time deadline) {
  // The client checks what it fetched against the digest; the cache need not hash it again.
  return cache_->GetOrFetchVerified(artifact.digest(), [&](const std::string& digest) {
    return client_->FetchArtifact(digest, deadline);
  });
}

absl::StatusOr<LoadedKernel> Session::Load(v1::CompileResponse response, absl::Time deadline) {
  KILN_RETURN_IF_ERROR(Verify(response));
  return LoadChecked(std::move(response), deadline);
}

absl::StatusOr<LoadedKernel> Session::LoadChecked(v1::CompileResponse response,
                                                  absl::Time deadline) {
  if (FindArtifact(response, v1::CUBIN) != nullptr || FindArtifact(response, v1::PTX) != nullptr) {
    return LoadCuda(std::move(response), deadline);
  }
  const v1::Artifact* library = FindArtifact(response, v1::SHARED_OBJECT);
  if (library == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the result for ", response.handle(), " has neither a .so nor a cubin"));
  }
  KILN_ASSIGN_OR_RETURN(std::string path, FetchArtifact(*library, deadline));
  KILN_ASSIGN_OR_RETURN(std::string image, VerifiedImage(library->digest(), path));
  KILN_ASSIGN_OR_RETURN(CpuKernel kernel, CpuKernel::Load(image, response.result().plan()));
  return LoadedKernel(std::move(response), std::move(kernel));
}

std::string Session::AnswerName(const std::string& request_key) const {
  return core::AnswerName(client_->address(), request_key);
}

std::optional<LoadedKernel> Session::MachineAnswer(const std::string& name, absl::Time deadline) {
  absl::StatusOr<std::optional<core::AnswerFolder::Answer>> answer =
      cache_->LoadAnswer(name, answer_ttl_);
  if (!answer.ok() || !answer->has_value()) return std::nullopt;
  v1::CompileResponse response;
  if (!response.ParseFromString((*answer)->response)) {  // an intact file of another format
    cache_->DropAnswer(name).IgnoreError();
    return std::nullopt;
  }
  if (response.handle().empty()) return std::nullopt;
  response.set_cache_hit(true);
  response.set_server_ms(0);
  if (!((*answer)->is_private && trust_.Vouched(response)) && !trust_.Check(response).ok()) {
    cache_->DropAnswer(name).IgnoreError();
    return std::nullopt;
  }
  // A load that fails (an artifact kilnd no longer has, say) leaves the answer to kilnd's next
  // one, which replaces it.
  absl::StatusOr<LoadedKernel> kernel = LoadChecked(std::move(response), deadline);
  if (!kernel.ok()) return std::nullopt;
  return *std::move(kernel);
}

absl::StatusOr<LoadedKernel> Session::CompileAndLoad(const v1::Graph& graph,
                                                     const v1::Target& target,
                                                     const v1::CompileOptions& options,
                                                     absl::Time deadline) {
  const std::string request_key = wire::RequestKey(graph, target, options);
  {
    absl::MutexLock lock(&known_mu_);
    auto it = known_.find(request_key);
    if (it != known_.end()) {
      ++local_hits_;
      return it->second.AsCacheHit();
    }
  }
  const bool machine_tier = answer_ttl_ > absl::ZeroDuration();
  const std::string answer_name = machine_tier ? AnswerName(request_key) : "";
  if (machine_tier) {
    if (std::optional<LoadedKernel> kernel = MachineAnswer(answer_name, deadline)) {
      Remember(request_key, *kernel);
      absl::MutexLock lock(&known_mu_);
      ++machine_hits_;
      return *std::move(kernel);
    }
  }
  std::optional<v1::CompileResponse> response;
  if (by_key_.load(std::memory_order_relaxed)) {
    absl::StatusOr<std::optional<v1::CompileResponse>> found =
        client_->LookupByKey(request_key, deadline);
    if (absl::IsInvalidArgument(found.status())) {
      by_key_.store(false, std::memory_order_relaxed);  // a daemon from before request keys
    } else if (!found.ok()) {
      return found.status();
    } else if (found->has_value()) {
      response = **std::move(found);
    }
  }
  const bool by_key = response.has_value();
  if (!by_key) {
    KILN_ASSIGN_OR_RETURN(response, client_->Compile(graph, target, options, deadline));
  }
  KILN_ASSIGN_OR_RETURN(LoadedKernel kernel, Load(*std::move(response), deadline));
  // Kept for the machine's other processes only once the trust policy passed it (in Load).
  if (machine_tier) {
    cache_->SaveAnswer(answer_name, kernel.response().SerializeAsString()).IgnoreError();
  }
  Remember(request_key, kernel);
  if (by_key) {
    absl::MutexLock lock(&known_mu_);
    ++key_hits_;
  }
  return kernel;
}

void Session::Remember(const std::string& request_key, const LoadedKernel& kernel) {
  absl::MutexLock lock(&known_mu_);
  if (known_.emplace(request_key, kernel).second) {
    known_order_.push_back(request_key);
    if (known_order_.size() > kKnownResults) {
      known_.erase(known_order_.front());
      known_order_.pop_front();
    }
  }
}

int64_t Session::local_hits() const {
  absl::MutexLock lock(&known_mu_);
  return local_hits_;
}

int64_t Session::machine_hits() const {
  absl::MutexLock lock(&known_mu_);
  return machine_hits_;
}

int64_t Session::key_hits() const {
  absl::MutexLock lock(&known_mu_);
  return key_hits_;
}

absl::StatusOr<LoadedKernel> Session::LoadCuda(v1::CompileResponse response, absl::Time deadline) {
  std::string cubin;
  std::string ptx;
  if (const v1::Artifact* a = FindArtifact(response, v1::CUBIN); a != nullptr) {
    KILN_ASSIGN_OR_RETURN(std::string path, FetchArtifact(*a, deadline));
    KILN_ASSIGN_OR_RETURN(cubin, ReadVerified(a->digest(), path));
  }
  if (const v1::Artifact* a = FindArtifact(response, v1::PTX); a != nullptr) {
    KILN_ASSIGN_OR_RETURN(std::string path, FetchArtifact(*a, deadline));
    KILN_ASSIGN_OR_RETURN(ptx, ReadVerified(a->digest(), path));
  }
  std::string error;
  std::unique_ptr<CudaModule> module =
      CudaModule::Load(cubin, ptx, CudaPlanFromWire(response.result().plan()), &error);
  if (module == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("loading the CUDA result ", response.handle(), ": ", error));
  }
  return LoadedKernel(std::move(response), std::shared_ptr<CudaModule>(std::move(module)));
}

absl::Status LoadedKernel::Run(absl::Span<const ConstBuffer> inputs,
                               absl::Span<const MutableBuffer> outputs, int num_threads) const {
  if (!is_cuda()) return cpu_->Run(inputs, outputs, num_threads);
  const CudaPlan& plan = cuda_->plan();
  if (inputs.size() != static_cast<size_t>(plan.num_inputs()) ||
      outputs.size() != static_cast<size_t>(plan.num_outputs())) {
    return absl::InvalidArgumentError(
        absl::StrCat("the kernel takes ", plan.num_inputs(), " inputs and ", plan.num_outputs(),
                     " outputs; got ", inputs.size(), " and ", outputs.size()));
  }
  std::vector<const void*> in;
  std::vector<void*> out;
  for (const CudaPlan::Buffer& b : plan.buffers) {
    const bool is_input = b.role == CudaPlan::Role::kInput;
    if (!is_input && b.role != CudaPlan::Role::kOutput) continue;
    const size_t given = is_input ? inputs[b.index].bytes : outputs[b.index].bytes;
    if (given < static_cast<size_t>(b.bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(is_input ? "input " : "output ", b.index,
                                                     " has ", given, " bytes; the plan needs ",
                                                     b.bytes));
    }
  }
  for (const ConstBuffer& b : inputs) in.push_back(b.data);
  for (const MutableBuffer& b : outputs) out.push_back(b.data);
  std::string error;
  if (!cuda_->RunHost(in.data(), out.data(), &error)) {
    return absl::InternalError(absl::StrCat("running ", handle(), " on the GPU: ", error));
  }
  return absl::OkStatus();
}

absl::Status LoadedKernel::RunOnDevice(void* const* buffers, void* stream, void* workspace,
                                       absl::Span<const int64_t> sizes) const {
  if (!is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat(handle(), " is a CPU kernel: run it on host buffers with Run"));
  }
  std::string error;
  if (!cuda_->RunSized(buffers, workspace, stream, sizes.data(), sizes.size(), &error)) {
    return absl::InternalError(absl::StrCat("launching ", handle(), ": ", error));
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedKernel> Session::LoadHandle(const std::string& handle, absl::Time deadline) {
  KILN_ASSIGN_OR_RETURN(v1::CompileResponse response, client_->GetResult(handle, deadline));
  return Load(std::move(response), deadline);
}

}  // namespace kiln::client
