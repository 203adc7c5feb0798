// Compiler: the seam between the compile service and the kernel compiler.
//
// The service asks one question of it per job: turn a verified graph into a CompileResult.
// PipelineCompiler is the in-process adapter over kiln::Pipeline (tools, unit tests and
// `kilnd --compile-in-process`); kilnd's default is worker::WorkerProcessCompiler
// (server/worker/), which runs the same pipeline in supervised child processes. Unit tests
// inject fakes that count calls, sleep or fail, so scheduling can be tested without a toolchain.
// Thread-safety: every method may be called concurrently from many worker threads.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ir/graph.h"
#include "kernels/pipeline.h"
#include "kernels/target.h"
#include "kiln/v1/service.pb.h"

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

  // Compile(), abandoned early once `cancel` turns true (nobody waits for the result any
  // more): then Cancelled. A compiler that cannot stop midway finishes (the default).
  virtual absl::StatusOr<CompileResult> CompileCancellable(const ir::Graph& graph,
                                                           const Target& target,
                                                           const CompileOptions& options,
                                                           const std::atomic<bool>& cancel) {
    (void)cancel;
    return Compile(graph, target, options);
  }

  // Adds the compiler's own counters (e.g. worker crashes) to a stats snapshot.
  virtual void AddStats(v1::GetStatsResponse* stats) const { (void)stats; }
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
