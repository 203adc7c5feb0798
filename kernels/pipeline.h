// The compiler's front door: graph + target + options -> artifacts and a launch plan.
//
// Pipeline owns the registered backends (codegen + toolchain per target kind) and runs the
// stages in order: passes -> lower -> schedule -> codegen -> toolchain. It knows nothing of
// gRPC or the cache. Thread-safety: Compile() and Fingerprint() may be called concurrently.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/ir/graph.h"
#include "kernels/target.h"
#include "kernels/util/budget.h"

namespace kiln {

struct PipelineConfig {
  std::string host_compiler = "g++";  // CPU toolchain
  double compile_timeout_s = 60;      // per toolchain invocation
  bool trace = false;                 // log the IR after each stage
  // Frontend limits (ResourceExhausted naming the limit when exceeded; see
  // schedule::ScheduleOptions for how a deep expression is split instead of refused).
  int64_t max_expr_depth = 256;    // deepest inlined expression per kernel
  double max_frontend_ms = 10000;  // wall time of passes + schedule + codegen; <= 0: none
};

class Pipeline {
 public:
  static absl::StatusOr<std::unique_ptr<Pipeline>> Create(const PipelineConfig& config);
  ~Pipeline();

  // InvalidArgument for an unknown ISA / sm; FailedPrecondition when this host cannot build
  // for the target (e.g. no NVRTC).
  absl::Status CheckTarget(const Target& target) const;

  // Everything about the toolchain that changes the bytes it makes for `target`: compiler
  // version, flags, ABI and codegen versions. Enters the cache key.
  std::string Fingerprint(const Target& target) const;

  // REQUIRES: `graph` passed ir::VerifyAndInfer. Errors: InvalidArgument for graphs the
  // compiler cannot take (extern ops), Internal when generated code fails to build (with the
  // compiler's log), DeadlineExceeded when the toolchain runs past its timeout.
  absl::StatusOr<CompileResult> Compile(const ir::Graph& graph, const Target& target,
                                        const CompileOptions& options) const;

  // The frontend alone (no toolchain): source text and fusion report. For tests and tools.
  struct Generated {
    std::string source;
    std::string fusion_report;
    LaunchPlan plan;
    int num_kernels = 0;
    int num_nodes = 0;  // after the passes
  };
  absl::StatusOr<Generated> Generate(const ir::Graph& graph, const Target& target,
                                     const CompileOptions& options) const;

 private:
  struct Impl;
  explicit Pipeline(std::unique_ptr<Impl> impl);
  // Generate for a graph of static shapes (`num_symbols` > 0: one sample of a symbolic graph).
  absl::StatusOr<Generated> GenerateAt(const ir::Graph& graph, const Target& target,
                                       const CompileOptions& options, const FrontendBudget& budget,
                                       int num_symbols) const;
  absl::StatusOr<Generated> GenerateSymbolic(const ir::Graph& graph, const Target& target,
                                             const CompileOptions& options,
                                             const FrontendBudget& budget) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
