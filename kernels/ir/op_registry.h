// The op registry: every op kiln knows, its kind, arity, attributes and type rule. The
// elementwise ops and reductions and their type rules are listed in op_table.def, which the
// Python graph builder reads too (client/python/kiln/op_table.py is generated from it).
// Thread-safety: the registry is built once on first use and immutable afterwards.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ir/graph.h"

namespace kiln::ir {

enum class OpKind {
  kElementwise,  // unary/binary/ternary with broadcasting, cast
  kLayout,       // views and data movement: broadcast_to, reshape, permute, slice, concat...
  kSource,       // constant, iota, full: no tensor inputs (iota may take a tensor whose shape it
                 // takes); uniform: a seed, and that shape tensor (values of neither read)
  kReduction,    // sum, max, argmin, ...: reduces `axes`
  kComposite,    // decomposed by passes/decompose before lowering
  kExtern,       // matmul, conv: a partition boundary, not compiled by kiln
};

// What an attribute holds. kInt accepts an int; kFloat an int or a float; kBool a bool or an
// int; kInts a list of ints or one int.
enum class AttrKind { kInt, kFloat, kBool, kStr, kDType, kInts, kTensor };
const char* AttrKindName(AttrKind kind);

struct AttrSpec {
  std::string name;
  AttrKind kind;
};

struct OpSchema {
  std::string name;
  OpKind kind;
  int min_inputs = 0;
  int max_inputs = 0;  // -1: any number (concat)
  // Every attribute the op reads; any other is rejected (a misspelt `axis` for `axes` must not
  // silently reduce over everything).
  std::vector<AttrSpec> attrs;
  // Infers the output type from the input types and attributes, or says which rule failed.
  // The message names the rule only; the caller prefixes the node.
  std::function<absl::StatusOr<TensorType>(const Node&, const std::vector<TensorType>&)> infer;
};

// nullptr for an unknown op.
const OpSchema* FindOp(const std::string& name);
std::vector<std::string> AllOps();

// Checks structure (value ids in range and defined before use, outputs valid) and infers every
// node's type in place. Errors are InvalidArgument naming node, op and rule.
struct Limits {
  int64_t max_nodes = 100000;
  int64_t max_elements = int64_t{1} << 40;  // per tensor
  int64_t max_rank = 8;
};
absl::Status VerifyAndInfer(Graph& graph, const Limits& limits = {});

// NumPy broadcasting of two shapes; an error string names both shapes.
absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b);
// Normalizes possibly-negative axes against `rank`; empty `axes` means all axes when
// `empty_means_all`. Sorted, deduplicated.
absl::StatusOr<std::vector<int64_t>> NormalizeAxes(const IntList& axes, int64_t rank,
                                                   bool empty_means_all);

// Python slice semantics for one axis of size `dim`: (first index, length).
absl::StatusOr<std::pair<int64_t, int64_t>> NormalizeSlice(int64_t dim, int64_t start, int64_t stop,
                                                           int64_t step);

}  // namespace kiln::ir
