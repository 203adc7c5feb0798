#include "server/compile/compiler.h"

#include <utility>

#include "kernels/util/status_macros.h"

namespace kiln::compile {

absl::StatusOr<std::unique_ptr<PipelineCompiler>> PipelineCompiler::Create(
    const PipelineConfig& config) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> pipeline, Pipeline::Create(config));
  return std::make_unique<PipelineCompiler>(std::move(pipeline));
}

PipelineCompiler::PipelineCompiler(std::unique_ptr<Pipeline> pipeline)
    : pipeline_(std::move(pipeline)) {}

absl::Status PipelineCompiler::CheckTarget(const Target& target) const {
  return pipeline_->CheckTarget(target);
}

std::string PipelineCompiler::Fingerprint(const Target& target) const {
  return pipeline_->Fingerprint(target);
}

absl::StatusOr<CompileResult> PipelineCompiler::Compile(const ir::Graph& graph,
                                                        const Target& target,
                                                        const CompileOptions& options) {
  return pipeline_->Compile(graph, target, options);
}

}  // namespace kiln::compile
