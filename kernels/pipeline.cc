// The compiler pipeline: the one place that knows the order of the stages.
//
//   Decompose        composites -> primitives; first, so every later pass sees primitives only
//   FoldConstants    scalar arithmetic on constants (decompositions make some)
//   Simplify         identities (x*1, cast round trips...), after folding made the constants
//   FactorReductions sums of products over disjoint axes -> products of sums (when the
//                    options allow reassociation); after Simplify, whose x*1 would split factors
//   CSE              after Simplify, which can make distinct nodes identical
//   DCE              last: drops what the passes above left unused
//   Schedule         lowering + fusion + buffer plan (backend-neutral)
//   Codegen          per backend: CPU C++ or CUDA C++
//   Toolchain        per backend: host compiler -> .so, NVRTC -> cubin
#include "kernels/pipeline.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/codegen/c_expr.h"
#include "kernels/codegen/cpu/cpu_codegen.h"
#include "kernels/codegen/cuda/cuda_codegen.h"
#include "kernels/codegen/plan.h"
#include "kernels/codegen/runtime_headers.h"
#include "kernels/codegen/symbolic.h"
#include "kernels/ir/op_registry.h"
#include "kernels/ir/symbols.h"
#include "kernels/key/key.h"
#include "kernels/passes/passes.h"
#include "kernels/schedule/policy.h"
#include "kernels/schedule/schedule.h"
#include "kernels/toolchain/host_compiler.h"
#include "kernels/toolchain/nvrtc_compiler.h"
#include "kernels/util/status_macros.h"

namespace kiln {
namespace {

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

struct Pipeline::Impl {
  PipelineConfig config;
  std::unique_ptr<toolchain::HostCompiler> host;
  std::string cpu_header_digest;
  // CUDA: absent when this build or host has no NVRTC (`nvrtc_missing` says why).
  std::unique_ptr<toolchain::NvrtcCompiler> nvrtc;
  std::string nvrtc_missing;
  std::string cuda_header_digest;
};

Pipeline::Pipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pipeline::~Pipeline() = default;

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::Create(const PipelineConfig& config) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  KILN_ASSIGN_OR_RETURN(
      impl->host, toolchain::HostCompiler::Create(config.host_compiler, config.compile_timeout_s));
  impl->cpu_header_digest =
      key::Sha256Hex(codegen::CpuRuntimeHeader() + codegen::CommonRuntimeHeader());
  // A host without the CUDA toolkit still serves CPU targets.
  auto nvrtc = toolchain::NvrtcCompiler::Create();
  if (nvrtc.ok()) {
    impl->nvrtc = std::move(*nvrtc);
  } else {
    impl->nvrtc_missing = std::string(nvrtc.status().message());
  }
  impl->cuda_header_digest =
      key::Sha256Hex(codegen::CudaRuntimeHeader() + codegen::CommonRuntimeHeader());
  return std::unique_ptr<Pipeline>(new Pipeline(std::move(impl)));
}

absl::Status Pipeline::CheckTarget(const Target& target) const {
  if (target.is_cuda()) {
    if (!impl_->nvrtc) return absl::FailedPreconditionError(impl_->nvrtc_missing);
    if (!impl_->nvrtc->Supports(target.sm))
      return absl::FailedPreconditionError(
          absl::StrCat("NVRTC ", impl_->nvrtc->version(), " cannot build for sm_", target.sm));
  }
  return absl::OkStatus();
}

std::string Pipeline::Fingerprint(const Target& target) const {
  std::string common = absl::StrCat("fusion_policy=", schedule::kFusionPolicyVersion);
  if (target.is_cpu())
    return absl::StrCat(common, ";cpu_codegen=", codegen::kCpuCodegenVersion,
                        ";abi=", codegen::kCpuAbiVersion,
                        ";runtime=", impl_->cpu_header_digest.substr(0, 16),
                        ";cc=", impl_->host->Fingerprint(target, CompileOptions{}));
  if (target.is_cuda())
    return absl::StrCat(common, ";cuda_codegen=", codegen::kCudaCodegenVersion,
                        ";abi=", codegen::kCudaAbiVersion,
                        ";runtime=", impl_->cuda_header_digest.substr(0, 16),
                        ";cc=", impl_->nvrtc ? impl_->nvrtc->Fingerprint(target.sm) : "none");
  return common;
}

namespace {

absl::StatusOr<ir::Graph> RunPasses(const ir::Graph& graph, const CompileOptions& options,
                                    bool trace, const FrontendBudget& budget) {
  ir::Graph g = graph;
  struct Stage {
    const char* name;
    absl::StatusOr<ir::Graph> (*fn)(const ir::Graph&);
    bool on;
  };
  const Stage stages[] = {
      {"decompose", passes::Decompose, true},
      {"fold_constants", passes::FoldConstants, true},
      {"simplify", passes::Simplify, true},
      {"factor_reductions", passes::FactorReductions, options.algebraic_rewrites},
      {"cse", passes::EliminateCommonSubexpressions, true},
      {"dce", passes::EliminateDeadCode, true},
  };
  for (const Stage& s : stages) {
    if (!s.on) continue;
    KILN_ASSIGN_OR_RETURN(g, s.fn(g));
    KILN_RETURN_IF_ERROR(budget.Check(s.name));
#ifndef NDEBUG
    // Re-verified between stages in debug builds (sample sizes of a symbolic graph may exceed
    // a static graph's element limit).
    KILN_RETURN_IF_ERROR(ir::VerifyAndInfer(g, ir::SymbolicLimits({})));
#endif
    if (trace) fprintf(stderr, "=== after %s\n%s", s.name, g.ToString().c_str());
  }
  return g;
}

// Rules a symbolic graph must follow beyond what verification at one sample checks: a choice
// that the verifier makes from a size and that would come out differently for a small size.
// A slice clamps its bounds to the axis, so along a symbolic axis only whole-axis slices
// (and reversals) have the same meaning for every size; a squeeze without axes removes the
// dimensions that are 1, which a symbolic one may be at run time, so it must name its axes.
absl::Status CheckSymbolicRules(const ir::Graph& graph) {
  ir::Graph a = graph, b = graph;
  const std::vector<std::vector<int64_t>> points =
      codegen::SymbolicSamplePoints(static_cast<int>(graph.symbols.size()));
  ir::SetSymbolSizes(a, points.front());
  ir::SetSymbolSizes(b, points.back());
  KILN_RETURN_IF_ERROR(ir::VerifyAndInfer(a, ir::SymbolicLimits({})));
  KILN_RETURN_IF_ERROR(ir::VerifyAndInfer(b, ir::SymbolicLimits({})));
  for (size_t k = 0; k < a.nodes.size(); ++k) {
    const ir::Node& n = a.nodes[k];
    const ir::ValueId v = a.num_inputs() + static_cast<ir::ValueId>(k);
    if (n.op == "squeeze" && !n.Has("axes") &&
        a.TypeOf(n.inputs[0]).shape != b.TypeOf(n.inputs[0]).shape)
      return absl::InvalidArgumentError(absl::StrCat(
          graph.Describe(v),
          ": squeeze without axes of a tensor with symbolic sizes (rule: name the axes, since ",
          "a symbolic size may be 1 at run time and the kernel's rank cannot follow it)"));
    if (n.op != "slice") continue;
    const ir::Shape& in_a = a.TypeOf(n.inputs[0]).shape;
    const ir::Shape& in_b = b.TypeOf(n.inputs[0]).shape;
    const ir::IntList axes = n.Ints("axes"), steps = n.Ints("steps");
    for (size_t i = 0; i < axes.size(); ++i) {
      const int64_t ax = axes[i] < 0 ? axes[i] + static_cast<int64_t>(in_a.size()) : axes[i];
      if (ax < 0 || ax >= static_cast<int64_t>(in_a.size()) || in_a[ax] == in_b[ax]) continue;
      const int64_t step = i < steps.size() ? steps[i] : 1;
      const bool whole = (step == 1 || step == -1) && n.type.shape[ax] == in_a[ax] &&
                         b.NodeOf(v).type.shape[ax] == in_b[ax];
      if (!whole)
        return absl::InvalidArgumentError(
            absl::StrCat(graph.Describe(v), ": slices axis ", ax, " of symbolic size ", in_a[ax],
                         " (rule: along a symbolic dimension only whole-axis slices and reversals, "
                         "since a slice's bounds are "
                         "clamped to the size)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Pipeline::Generated> Pipeline::Generate(const ir::Graph& graph, const Target& target,
                                                       const CompileOptions& options) const {
  KILN_RETURN_IF_ERROR(CheckTarget(target));
  const FrontendBudget budget(impl_->config.max_frontend_ms);
  if (graph.is_symbolic()) {
    auto out = GenerateSymbolic(graph, target, options, budget);
    if (!out.ok())
      return absl::Status(out.status().code(), ir::NameSymbols(out.status().message(), graph));
    return out;
  }
  return GenerateAt(graph, target, options, budget, 0);
}

// One graph with symbolic sizes -> one unit for every size: the frontend runs at each sample
// point and codegen/symbolic.h generalises the texts (why that is sound is written there).
absl::StatusOr<Pipeline::Generated> Pipeline::GenerateSymbolic(const ir::Graph& graph,
                                                               const Target& target,
                                                               const CompileOptions& options,
                                                               const FrontendBudget& budget) const {
  std::vector<std::string> names = graph.symbols;
  const int r = static_cast<int>(names.size());
  KILN_RETURN_IF_ERROR(CheckSymbolicRules(graph));
  codegen::ScopedSymbolicSample sampling;
  std::vector<codegen::SymbolicSample> samples;
  Generated first;
  for (const std::vector<int64_t>& point : codegen::SymbolicSamplePoints(r)) {
    ir::Graph g = graph;
    ir::SetSymbolSizes(g, point);
    ir::SetCurrentSample(point);
    KILN_RETURN_IF_ERROR(ir::VerifyAndInfer(g, ir::SymbolicLimits({})));
    KILN_ASSIGN_OR_RETURN(Generated gen, GenerateAt(g, target, options, budget, r));
    if (samples.empty()) first = gen;
    samples.push_back({std::move(gen.source), std::move(gen.plan)});
  }
  KILN_ASSIGN_OR_RETURN(codegen::SymbolicUnit unit,
                        codegen::Generalise(samples, names, target.is_cuda()));
  Generated out = std::move(first);
  out.source = std::move(unit.source);
  out.plan = std::move(unit.plan);
  for (int k = 0; k < r; ++k) {
    PlanSymbol sym{names[k], -1, -1};
    for (int i = 0; i < graph.num_inputs() && sym.input < 0; ++i) {
      const std::vector<int32_t>& ds = graph.inputs[i].dim_symbols;
      for (size_t d = 0; d < ds.size(); ++d)
        if (ds[d] == k) {
          sym = {names[k], i, static_cast<int32_t>(d)};
          break;
        }
    }
    out.plan.symbols.push_back(std::move(sym));
  }
  out.fusion_report =
      absl::StrCat("symbolic sizes: ", absl::StrJoin(names, ", "),
                   " (numbers below are one sample)\n", ir::NameSymbols(out.fusion_report, graph));
  return out;
}

absl::StatusOr<Pipeline::Generated> Pipeline::GenerateAt(const ir::Graph& graph,
                                                         const Target& target,
                                                         const CompileOptions& options,
                                                         const FrontendBudget& budget,
                                                         int num_symbols) const {
  KILN_ASSIGN_OR_RETURN(ir::Graph g, RunPasses(graph, options, impl_->config.trace, budget));
  schedule::ScheduleOptions schedule_options;
  schedule_options.max_expr_depth = impl_->config.max_expr_depth;
  schedule_options.budget = &budget;
  KILN_ASSIGN_OR_RETURN(schedule::Program program, schedule::Schedule(g, schedule_options));
  Generated out;
  out.fusion_report = program.report;
  out.num_kernels = static_cast<int>(program.kernels.size());
  out.num_nodes = static_cast<int>(g.nodes.size());
  if (target.is_cuda()) {
    KILN_ASSIGN_OR_RETURN(codegen::CudaUnit unit,
                          codegen::GenerateCuda(program, target, options, num_symbols));
    out.source = std::move(unit.source);
    out.plan = std::move(unit.plan);
    out.fusion_report += unit.report;
    KILN_RETURN_IF_ERROR(budget.Check("codegen"));
    return out;
  }
  out.source = codegen::GenerateCpu(program, options, num_symbols);
  out.plan = codegen::MakePlan(
      program, num_symbols > 0 ? codegen::kCpuSymbolicAbiVersion : codegen::kCpuAbiVersion);
  KILN_RETURN_IF_ERROR(budget.Check("codegen"));
  return out;
}

absl::StatusOr<CompileResult> Pipeline::Compile(const ir::Graph& graph, const Target& target,
                                                const CompileOptions& options) const {
  auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(Generated gen, Generate(graph, target, options));
  CompileResult r;
  r.stats.frontend_ms = MsSince(t0);
  if (target.is_cuda()) {
    // Cubin first (what a client loads), then PTX for GPUs newer than the target.
    auto cu = impl_->nvrtc->Build(gen.source, codegen::RuntimeHeaders(/*cuda=*/true), target.sm);
    if (!cu.ok()) return cu.status();
    r.stats.toolchain_ms = cu->ms;
    r.log = std::move(cu->log);
    r.artifacts.push_back({ArtifactKind::kCubin, std::move(cu->cubin)});
    r.artifacts.push_back({ArtifactKind::kPtx, std::move(cu->ptx)});
  } else {
    auto built =
        impl_->host->Build(gen.source, codegen::RuntimeHeaders(/*cuda=*/false), target, options);
    if (!built.ok()) return built.status();
    r.stats.toolchain_ms = built->ms;
    r.log = built->log;
    r.artifacts.push_back({ArtifactKind::kSharedObject, std::move(built->binary)});
  }
  r.artifacts.push_back({ArtifactKind::kSource, std::move(gen.source)});
  r.artifacts.push_back({ArtifactKind::kFusionReport, std::move(gen.fusion_report)});
  r.plan = std::move(gen.plan);
  r.stats.num_kernels = gen.num_kernels;
  r.stats.num_nodes_in = static_cast<int32_t>(graph.nodes.size());
  r.stats.num_nodes_lowered = gen.num_nodes;
  r.stats.total_ms = MsSince(t0);
  return r;
}

}  // namespace kiln
