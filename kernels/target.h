// What a compile is for (target) and how (options), and what it gives back (result).
// Plain value types shared by the compiler stages and the server; no gRPC or protobuf here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ir/dtype.h"

namespace kiln {

struct Target {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  std::string isa = "x86-64-v3";      // CPU: an ISA level, or "" when features are given
  std::vector<std::string> features;  // CPU: the client's feature list, sorted
  int sm = 0;                         // CUDA: e.g. 80, 90

  bool is_cpu() const { return kind == Kind::kCpu; }
  bool is_cuda() const { return kind == Kind::kCuda; }
  std::string ToString() const;  // "cpu:x86-64-v3", "cpu:+avx2+fma", "cuda:sm_90"
};

struct CompileOptions {
  int opt_level = 3;
  bool vector_math = true;
  // Rewrites that reassociate floating point within the op suite's tolerance
  // (passes/factor_reductions.cc says which and how far).
  bool algebraic_rewrites = true;
  // Kernel variant for tuning (0: the default choice; see kernels/codegen/variants.h).
  int variant = 0;
  std::string ToString() const;
};

// Numbers match kiln.v1.ArtifactKind.
enum class ArtifactKind { kSharedObject = 1, kCubin = 2, kPtx = 3, kSource = 4, kFusionReport = 5 };

struct Artifact {
  ArtifactKind kind;
  std::string bytes;
};

// A polynomial with integer coefficients over a plan's symbols (kiln.v1.SizeExpr):
// the sum of coeff * prod(symbol[k] ** exponents[k]).
struct SizeTerm {
  int64_t coeff = 0;
  std::vector<int32_t> exponents;
};
struct SizeExpr {
  std::vector<SizeTerm> terms;
};
// Where a symbol's value is read: dimension `axis` of graph input `input`.
struct PlanSymbol {
  std::string name;
  int32_t input = 0;
  int32_t axis = 0;
};

// The launch plan: see kernels/codegen/PLAN.md for the format.
enum class BufferRole { kInput = 1, kOutput = 2, kTemp = 3 };
struct PlanBuffer {
  BufferRole role;
  int32_t index = 0;  // input/output position, or temp number
  ir::DType dtype;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  int64_t offset = 0;  // temps: offset in the workspace
  // Symbolic plans only: shape and size as polynomials of the symbols.
  std::vector<SizeExpr> shape_exprs;
  SizeExpr bytes_expr;
};
struct PlanStep {
  std::string kernel;
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t shared_bytes = 0;
  std::vector<int32_t> args;  // indices into buffers
  // Symbolic CUDA plans: grid[0] is ceil(grid_work / grid_per_block) at the run's sizes
  // (grid_per_block > 0; 0 in every other plan, whose grid is as given). While a sample is
  // generated, grid_work holds its value there; the generalised plan has grid_work_expr.
  int64_t grid_work = 0;
  int64_t grid_per_block = 0;
  SizeExpr grid_work_expr;
  // A launch-time choice among kernels (symbolic CUDA plans): a step with a guard runs only
  // when guard_min <= guard <= guard_max at the run's sizes (guard_max 0: no upper bound);
  // a step without one (both 0) always runs. Each guarded kernel is correct at any size, so
  // the guards choose for speed: the steps of one choice cover every value exactly once.
  // While a sample is generated, `guard` holds its value there; the plan has guard_expr.
  int64_t guard = 0;
  int64_t guard_min = 0;
  int64_t guard_max = 0;
  SizeExpr guard_expr;
  bool guarded() const { return guard_min > 0 || guard_max > 0; }
};
struct LaunchPlan {
  std::vector<PlanBuffer> buffers;
  std::vector<PlanStep> steps;
  int64_t workspace_bytes = 0;
  uint32_t abi_version = 1;
  std::vector<PlanSymbol> symbols;  // non-empty: a symbolic plan (ABI.md, version 2)
  // Symbolic CUDA plans: the kernels index with 32-bit integers, which holds while this
  // polynomial of the sizes (a bound on every index) stays below 2^30; launchers refuse
  // larger sizes. `index_bound` is its value at a sample while one is generated.
  int64_t index_bound = 0;
  SizeExpr index_bound_expr;
};

struct CompileStats {
  int32_t num_kernels = 0;
  int32_t num_nodes_in = 0;
  int32_t num_nodes_lowered = 0;
  double frontend_ms = 0;
  double toolchain_ms = 0;
  double total_ms = 0;
};

struct CompileResult {
  std::vector<Artifact> artifacts;  // the binary first, then source and fusion report
  LaunchPlan plan;
  std::string log;  // compiler output, if any
  CompileStats stats;
};

}  // namespace kiln
