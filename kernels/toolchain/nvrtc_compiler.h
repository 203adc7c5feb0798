// CUDA toolchain: CUDA C++ source text -> a cubin (SASS for one sm_XX) plus PTX (for GPUs
// newer than the target, which the driver compiles at load time), built in-process by NVRTC.
// Knows no IR; makes no CUDA driver call, so it runs on machines without a GPU and builds
// for any architecture NVRTC supports.
//
// The toolkit is optional at build time: without it, Create returns FailedPrecondition and
// the pipeline reports CUDA targets as unavailable.
// Thread-safety: immutable after Create; Build may run concurrently (NVRTC programs are
// independent objects).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::toolchain {

struct CudaBuildOutput {
  std::string cubin;
  std::string ptx;
  std::string log;  // NVRTC's log (warnings), possibly empty
  double ms = 0;
};

class NvrtcCompiler {
 public:
  // `include_dir`: where cuda_fp16.h and cuda_bf16.h live; empty: the toolkit this was built
  // against (or $CUDA_HOME/include). FailedPrecondition when NVRTC is not built in.
  static absl::StatusOr<std::unique_ptr<NvrtcCompiler>> Create(const std::string& include_dir = "");

  // Whether this build links NVRTC.
  static bool Available();

  // The options passed for `sm`, in order (no file names or include paths).
  std::vector<std::string> Options(int sm) const;
  // NVRTC version + options: what decides the output bytes, besides the source.
  std::string Fingerprint(int sm) const;
  // `headers` are (include name, text) pairs the source may #include.
  // Errors: Internal with NVRTC's log when the source does not compile; FailedPrecondition
  // when it needs the CUDA half headers and none were found.
  absl::StatusOr<CudaBuildOutput> Build(
      const std::string& source, const std::vector<std::pair<std::string, std::string>>& headers,
      int sm) const;
  // Whether NVRTC can build for sm_XX (each release drops old architectures).
  bool Supports(int sm) const;
  const std::string& version() const { return version_; }
  const std::string& include_dir() const { return include_dir_; }

 private:
  NvrtcCompiler(std::string version, std::string include_dir, std::vector<int> archs)
      : version_(std::move(version)),
        include_dir_(std::move(include_dir)),
        archs_(std::move(archs)) {}
  std::string version_;      // "13.0"
  std::string include_dir_;  // empty when the half headers were not found
  std::vector<int> archs_;   // supported sm numbers
};

}  // namespace kiln::toolchain
