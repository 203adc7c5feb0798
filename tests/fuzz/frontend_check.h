// The frontend's robustness contract, as one check shared by the libFuzzer target and the
// regression test: for ANY bytes, decoding them as a kiln.v1.Graph and running decode ->
// verify -> key -> passes -> schedule -> codegen for a CPU and a CUDA target (no toolchain)
// either succeeds or fails with a client error (InvalidArgument, ResourceExhausted...).
// Internal, a crash, a sanitizer report or a hang is a kiln bug.
// Thread-safety: CheckFrontendInput may be called concurrently on one FrontendChecker.
#pragma once

#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "kernels/pipeline.h"

namespace kiln::fuzz {

class FrontendChecker {
 public:
  // REQUIRES: the host has a C++ compiler named g++ (only looked up, never run).
  static std::unique_ptr<FrontendChecker> Create();

  // OK when the frontend handled `bytes` as the contract says; otherwise an error whose
  // message names the stage, target and the Internal status that came out of it.
  absl::Status CheckFrontendInput(std::string_view bytes) const;

  // Whether the CUDA backend is checked too (needs NVRTC on this host), and why not.
  bool checks_cuda() const { return cuda_status_.ok(); }
  const absl::Status& cuda_status() const { return cuda_status_; }

  // Says on stderr whether the CUDA target is checked (and why not). Where it is not and
  // $KILN_REQUIRE_NVRTC is 1 (a machine with the CUDA toolkit: deploy/test.sh), returns false:
  // the caller fails instead of checking the CPU target alone.
  bool ReportCudaCoverage(const char* who) const;

 private:
  explicit FrontendChecker(std::unique_ptr<Pipeline> pipeline);
  std::unique_ptr<Pipeline> pipeline_;
  absl::Status cuda_status_;  // immutable after construction
};

}  // namespace kiln::fuzz
