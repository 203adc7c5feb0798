#include "tests/fuzz/frontend_check.h"

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "kernels/ir/decode.h"
#include "kernels/key/key.h"

namespace kiln::fuzz {
namespace {

// Small limits keep each input fast; they are part of what is checked (ResourceExhausted).
ir::Limits FuzzLimits() {
  ir::Limits limits;
  limits.max_nodes = 512;
  limits.max_elements = int64_t{1} << 32;
  return limits;
}

Target CpuTarget() {
  Target t;
  t.kind = Target::Kind::kCpu;
  t.isa = "x86-64-v3";
  return t;
}

Target CudaTarget() {
  Target t;
  t.kind = Target::Kind::kCuda;
  t.isa.clear();
  t.sm = 80;
  return t;
}

}  // namespace

FrontendChecker::FrontendChecker(std::unique_ptr<Pipeline> pipeline)
    : pipeline_(std::move(pipeline)), cuda_status_(pipeline_->CheckTarget(CudaTarget())) {}

bool FrontendChecker::ReportCudaCoverage(const char* who) const {
  if (checks_cuda()) {
    std::fprintf(stderr, "%s: checking the CPU and CUDA targets\n", who);
    return true;
  }
  const char* require = std::getenv("KILN_REQUIRE_NVRTC");
  const bool required = require != nullptr && std::string_view(require) == "1";
  std::fprintf(stderr, "%s: %s: the CUDA target is not checked, the CPU target only (%s)\n", who,
               required ? "ERROR (KILN_REQUIRE_NVRTC=1)" : "note", cuda_status_.ToString().c_str());
  return !required;
}

std::unique_ptr<FrontendChecker> FrontendChecker::Create() {
  PipelineConfig config;
  config.max_expr_depth = 64;     // small, so inputs exercise the depth cuts
  config.max_frontend_ms = 5000;  // a slow input is a finding of its own (libFuzzer -timeout)
  auto pipeline = Pipeline::Create(config);
  if (!pipeline.ok()) {
    std::fprintf(stderr, "cannot set up the pipeline: %s\n", pipeline.status().ToString().c_str());
    std::abort();
  }
  return std::unique_ptr<FrontendChecker>(new FrontendChecker(*std::move(pipeline)));
}

absl::Status FrontendChecker::CheckFrontendInput(std::string_view bytes) const {
  v1::Graph wire;
  if (!wire.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return absl::OkStatus();
  absl::StatusOr<ir::Graph> graph = ir::DecodeGraph(wire, FuzzLimits());
  if (!graph.ok()) {
    if (graph.status().code() == absl::StatusCode::kInternal)
      return absl::InternalError(absl::StrCat("decode: ", graph.status().ToString()));
    return absl::OkStatus();
  }
  std::string canonical = key::CanonicalBytes(*graph);
  if (canonical.empty()) return absl::InternalError("key: empty canonical bytes");
  std::vector<Target> targets = {CpuTarget()};
  if (checks_cuda()) targets.push_back(CudaTarget());
  for (const Target& target : targets) {
    auto generated = pipeline_->Generate(*graph, target, CompileOptions{});
    if (!generated.ok() && generated.status().code() == absl::StatusCode::kInternal)
      return absl::InternalError(absl::StrCat("frontend for ", target.ToString(), ": ",
                                              generated.status().ToString(), "\ngraph:\n",
                                              graph->ToString()));
    if (generated.ok() && generated->source.empty())
      return absl::InternalError(
          absl::StrCat("frontend for ", target.ToString(), ": empty source"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::fuzz
