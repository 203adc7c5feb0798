#include "client/cpp/kiln.h"

#include <utility>

#include "absl/strings/str_cat.h"
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

const v1::Artifact* FindArtifact(const v1::CompileResponse& response, v1::ArtifactKind kind) {
  for (const v1::Artifact& artifact : response.result().artifacts()) {
    if (artifact.kind() == kind) return &artifact;
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<Session>> Session::Create(SessionOptions options) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                        Client::Create(std::move(options.client)));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ArtifactCache> cache,
                        ArtifactCache::Open(options.cache_dir));
  return std::make_unique<Session>(std::move(client), std::move(cache));
}

absl::StatusOr<std::string> Session::FetchArtifact(const v1::Artifact& artifact,
                                                   absl::Time deadline) {
  return cache_->GetOrFetch(artifact.digest(), [&](const std::string& digest) {
    return client_->FetchArtifact(digest, deadline);
  });
}

absl::StatusOr<LoadedKernel> Session::Load(v1::CompileResponse response, absl::Time deadline) {
  const v1::Artifact* library = FindArtifact(response, v1::SHARED_OBJECT);
  if (library == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the result for ", response.handle(),
        " has no CPU shared object (a CUDA result: fetch its CUBIN and use the CUDA loader)"));
  }
  KILN_ASSIGN_OR_RETURN(std::string path, FetchArtifact(*library, deadline));
  KILN_ASSIGN_OR_RETURN(CpuKernel kernel, CpuKernel::Load(path, response.result().plan()));
  return LoadedKernel(std::move(response), std::move(kernel));
}

absl::StatusOr<LoadedKernel> Session::CompileAndLoad(const v1::Graph& graph,
                                                     const v1::Target& target,
                                                     const v1::CompileOptions& options,
                                                     absl::Time deadline) {
  if (!target.has_cpu()) {
    return absl::FailedPreconditionError(
        "CompileAndLoad runs CPU targets; compile CUDA targets with Client::Compile and "
        "launch them through the CUDA loader");
  }
  KILN_ASSIGN_OR_RETURN(v1::CompileResponse response,
                        client_->Compile(graph, target, options, deadline));
  return Load(std::move(response), deadline);
}

absl::StatusOr<LoadedKernel> Session::LoadHandle(const std::string& handle, absl::Time deadline) {
  KILN_ASSIGN_OR_RETURN(v1::CompileResponse response, client_->GetResult(handle, deadline));
  return Load(std::move(response), deadline);
}

}  // namespace kiln::client
