// Lowering: a graph value at an index -> an element expression (lower/expr.h).
//
// Values that are materialized (graph inputs, and whatever the scheduler decided to store)
// become loads; everything else is inlined: pointwise ops nest, views become index arithmetic,
// reductions become kReduce nodes with fresh loop variables. Each inlined reduction is
// reported with the number of times the consuming kernel would evaluate it, so the scheduler
// can refuse to inline one that would be recomputed.
// Thread-safety: a Lowerer is used by one thread; the graph it reads must outlive it.
#pragma once

#include <map>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kernels/ir/graph.h"
#include "kernels/lower/expr.h"

namespace kiln::lower {

struct InlinedReduction {
  ir::ValueId value;
  int64_t evaluations;  // times the kernel evaluates it (product of enclosing loop extents)
  int64_t elements;     // distinct elements of the reduction's result
};

class Lowerer {
 public:
  // `buffer_of[v]` is the buffer holding value v, or -1 when v is inlined.
  // `const_buffer_of[v]` is the buffer of a non-scalar constant node, or -1.
  // Both must outlive the Lowerer.
  Lowerer(const ir::Graph& graph, const std::vector<int>& buffer_of,
          const std::vector<int>& const_buffer_of);

  // Starts a kernel over `domain` and returns the output index: loop variables 0..L-1 stand
  // for the dimensions larger than 1, in order; size-1 dimensions are the constant 0.
  std::vector<Affine> BeginKernel(const ir::Shape& domain);

  // The element of `v` at `index` (one Affine per dimension of v). `root` values are lowered
  // from their definition even when materialized (the kernel that stores them).
  ExprPtr Lower(ir::ValueId v, const std::vector<Affine>& index, bool root = false);

  // Values this kernel stores itself: later outputs of the same kernel recompute them from
  // their definitions (sharing the stored expression) instead of reading them back.
  void MarkStoredHere(ir::ValueId v) { stored_here_.insert(v); }

  const VarExtents& extents() const { return extents_; }
  // The index into a tensor of shape `in` of the element at row-major position `index` of
  // shape `out` (a reshape; contiguous merges and splits stay affine).
  std::vector<Affine> ReshapeIndex(const std::vector<Affine>& index, const ir::Shape& out,
                                   const ir::Shape& in) const;
  const std::vector<InlinedReduction>& inlined() const { return inlined_; }
  // Values whose definitions this kernel inlined (for the fusion report).
  const std::vector<ir::ValueId>& fused_values() const { return fused_; }
  // Forgets the values inlined after the first `n` (a value that did not join the kernel after
  // all): the report then lists only what the kernel computes.
  void ForgetFusedAfter(size_t n) {
    for (size_t i = n; i < fused_.size(); ++i) fused_set_.erase(fused_[i]);
    if (n < fused_.size()) fused_.resize(n);
  }

 private:
  ExprPtr LowerNode(ir::ValueId v, const std::vector<Affine>& index);
  ExprPtr LowerReduction(ir::ValueId v, const std::vector<Affine>& index);
  // A gather reads its source from the source's buffer: REQUIRES the source be a graph input
  // or materialized (the scheduler stores every computed gather source).
  ExprPtr LowerGather(ir::ValueId v, const std::vector<Affine>& index);
  std::vector<Affine> BroadcastIndex(const std::vector<Affine>& index, const ir::Shape& out,
                                     const ir::Shape& in) const;
  int NewVar(int64_t extent);

  const ir::Graph& graph_;
  const std::vector<int>& buffer_of_;
  const std::vector<int>& const_buffer_of_;
  VarExtents extents_;
  std::vector<int> scope_;  // loop variables enclosing the point being lowered, outermost first
  std::map<std::pair<ir::ValueId, std::vector<Affine>>, ExprPtr> memo_;
  std::vector<InlinedReduction> inlined_;
  std::vector<ir::ValueId> fused_;
  std::unordered_set<ir::ValueId> fused_set_;
  std::unordered_set<ir::ValueId> stored_here_;
};

// The value a gather reads from its buffer: its source, or what views of it that keep the
// gathered axis expand (a broadcast along other axes, inserted size-1 axes: a dimension of 1
// is read at 0 by the gather itself, so a broadcast table or an unsqueezed embedding table is
// not copied out first). `dims[d]`: the gather's dimension that source dimension d follows;
// `axis`: the gathered axis among the source's.
struct GatherView {
  ir::ValueId value = -1;
  int64_t axis = 0;
  std::vector<int> dims;
};
GatherView GatherSource(const ir::Graph& g, const ir::Node& gather);

// Helpers shared with the scheduler and backends.
// A constant of dtype t: floats rounded to t (inf beyond its range), integers saturated.
ExprPtr MakeConst(ir::DType t, double v);
ExprPtr MakeIntConst(ir::DType t, int64_t v);
ExprPtr MakeCast(ExprPtr e, ir::DType t);
std::vector<int64_t> ContiguousStrides(const ir::Shape& shape);
// How deep inlining `node` nests its operands' expressions: 1 for most ops, the selection
// depth for concat. Each unit is at most two expression levels (the op and a cast) and one
// level of lowering recursion; the scheduler bounds the sum along every inlined path.
int64_t InlineDepth(const ir::Node& node);
// Whether lowering `node` wraps its operand's index in division/modulo/clamp atoms (reshape,
// squeeze, unsqueeze, concat), which nest inside each other along a path.
bool NestsIndex(const ir::Node& node);

}  // namespace kiln::lower
