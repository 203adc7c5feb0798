// One kernel for every size: turns code generated at sample sizes into code over symbols.
//
// The compiler's stages (passes, lowering, scheduling, codegen) work on numbers. For a graph
// with symbolic dimensions (kernels/ir/symbols.h) the pipeline runs them once per sample
// point: three values per symbol on a grid (3^r points for r symbols), plus one check point
// off the grid. Every sample's generated text must have the same structure: the same text
// once its numeric literals are taken out. Each literal that differs between samples is then
// a function of the sizes, and is recovered as
//
//   an integer polynomial P   (extents, strides, byte counts: degree <= 2 in each symbol,
//                              found by Newton interpolation over the grid, exactly, in
//                              128-bit integers; every division must be exact)
//   a float P                 (a count as a float: the divisor of a var, a sum over N)
//   a float 1 / P             (the 1/N a mean multiplies by)
//
// and must reproduce the check point's literal exactly. It is printed as a C expression of
// the size variables `kiln_s<k>` the generated functions read (cpu_codegen.h). The plan's
// buffer shapes and sizes are recovered the same way, as SizeExpr polynomials.
//
// Why this is sound: the samples are large sizes in bands of their own (ir/symbols.h), so
// every threshold decision the stages make (a loop worth threads, a table too large, a tile
// width) is the one for a large size, and the code for that case handles any size, 0 and 1
// included (loops with remainders, no specialisation on a size of 1). Choices that rest on
// divisibility are switched off while sampling (c_expr.h, ScopedSymbolicSample), and the
// samples' residues differ, so one that remains flips between samples. A decision that flips
// changes the text's structure and is refused; so is a literal that fits none of the forms,
// or a size-dependent array length (a stack array must have a fixed size). Verification rules
// that compare sizes with numbers fail at a sample (ir/symbols.h); a slice along a symbolic
// axis, whose clamping is right at a large size only, is refused unless it takes the whole
// axis (pipeline.cc). Index simplifications made from the ranges of loop variables hold for
// the sampled sizes; the ones that matter (a reshape folding back to affine indexing) compare
// a static extent with a static divisor. The refusals are InvalidArgument: the graph is then
// compiled per shape by its client.
//
// CUDA units work the same way; their launch shapes are numbers too, so the CUDA generator,
// while sampling, keeps every size-dependent number it would compute in the text or the plan
// in a form the generaliser recovers (kernel_gen.h, `Varies`): trip counts as ceil-divisions
// printed in C, grids as ceil(work / per_block) with `work` fitted here like a buffer size.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/target.h"

namespace kiln::codegen {

// The sample points for `num_symbols` symbols: the grid (symbol 0 varying fastest), then the
// check point. Each point holds one value per symbol.
std::vector<std::vector<int64_t>> SymbolicSamplePoints(int num_symbols);

struct SymbolicSample {
  std::string source;
  LaunchPlan plan;
};

struct SymbolicUnit {
  std::string source;
  LaunchPlan plan;  // symbols not filled in: the caller knows where they come from
};

// `samples[i]` was generated at SymbolicSamplePoints(num_symbols)[i]. `symbol_names` name
// the symbols in messages. `cuda`: a CUDA unit, whose sizes are `int` parameters and whose
// plan also carries each launch's grid (PlanStep.grid_work_expr) and the index bound.
absl::StatusOr<SymbolicUnit> Generalise(const std::vector<SymbolicSample>& samples,
                                        const std::vector<std::string>& symbol_names,
                                        bool cuda = false);

// The value of `e` at `sizes`.
int64_t EvaluateSizeExpr(const SizeExpr& e, const std::vector<int64_t>& sizes);
// "768*B*T + 4": for reports and plan.json.
std::string SizeExprToString(const SizeExpr& e, const std::vector<std::string>& symbol_names);

}  // namespace kiln::codegen
