// Graph-to-graph passes, run in the order kernels/pipeline.cc gives. Each takes a verified
// graph and returns a verified graph computing the same outputs.
// Thread-safety: pure functions.
#pragma once

#include "absl/status/statusor.h"
#include "kernels/ir/graph.h"

namespace kiln::passes {

// passes/decompose.cc: composites (softmax, layer_norm, gelu, mean, var...) into primitives.
absl::StatusOr<ir::Graph> Decompose(const ir::Graph& graph);
// passes/fold_constants.cc: elementwise ops on scalar constants become constants.
absl::StatusOr<ir::Graph> FoldConstants(const ir::Graph& graph);
// passes/simplify.cc: x*1, x+0, x-0, x/1, neg(neg(x)), cast to the same type, lossless
// cast round trips, single-use views of views stay as they are (lowering folds them).
absl::StatusOr<ir::Graph> Simplify(const ir::Graph& graph);
// passes/factor_reductions.cc: sums of products of factors over disjoint reduced axes become
// products of smaller sums (reassociates floating point; legality in the file).
absl::StatusOr<ir::Graph> FactorReductions(const ir::Graph& graph);
// passes/cse.cc: identical nodes (op, inputs, attributes) computed once.
absl::StatusOr<ir::Graph> EliminateCommonSubexpressions(const ir::Graph& graph);
// passes/dce.cc: nodes no output depends on are dropped.
absl::StatusOr<ir::Graph> EliminateDeadCode(const ir::Graph& graph);

}  // namespace kiln::passes
