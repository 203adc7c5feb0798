// Compiler: the seam between the compile service and the kernel compiler.
//
// The service asks one question of it per job: turn a verified graph into a CompileResult.
// PipelineCompiler is the real adapter over kiln::Pipeline; unit tests inject fakes that
// count calls, sleep or fail, so scheduling can be tested without a toolchain.
// Thread-safety: every method may be called concurrently from many worker threads.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ir/graph.h"
#include "kernels/pipeline.h"
#include "kernels/target.h"

namespace kiln::compile {

class Compiler {
 public:
  virtual ~Compiler() = default;

  // InvalidArgument for a target kiln does not know; FailedPrecondition when this host cannot
  // build for it. Cheap enough to call once per distinct target (the service memoizes it).
  virtual absl::Status CheckTarget(const Target& target) const = 0;

  // Everything about the toolchain that changes the bytes produced for `target`.
  // REQUIRES: CheckTarget(target).ok().
  virtual std::string Fingerprint(const Target& target) const = 0;

  // REQUIRES: `graph` came out of ir::DecodeGraph (verified, types inferred).
  virtual absl::StatusOr<CompileResult> Compile(const ir::Graph& graph, const Target& target,
                                                const CompileOptions& options) = 0;
};

// The production Compiler: forwards to a kiln::Pipeline it owns.
class PipelineCompiler final : public Compiler {
 public:
  static absl::StatusOr<std::unique_ptr<PipelineCompiler>> Create(const PipelineConfig& config);
  explicit PipelineCompiler(std::unique_ptr<Pipeline> pipeline);

  absl::Status CheckTarget(const Target& target) const override;
  std::string Fingerprint(const Target& target) const override;
  absl::StatusOr<CompileResult> Compile(const ir::Graph& graph, const Target& target,
                                        const CompileOptions& options) override;

 private:
  std::unique_ptr<Pipeline> pipeline_;  // immutable after construction; itself thread-safe
};

}  // namespace kiln::compile
