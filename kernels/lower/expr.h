// Lowered values: what one element of a tensor is, as an expression over loop variables.
//
// Lowering turns every graph value into such an expression at a given index; views become
// index arithmetic (lower/index.h), pointwise ops nest, and a reduction becomes a kReduce node
// with loop variables of its own. Backends (codegen/cpu, codegen/cuda) print these trees.
// Thread-safety: immutable once built; shared between kernels by pointer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/ir/dtype.h"
#include "kernels/lower/index.h"

namespace kiln::lower {

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    kLoad,       // buffers[buffer][index...]
    kConst,      // fvalue (float dtypes) or ivalue (integer and bool dtypes)
    kIndex,      // the value of index[0] (iota)
    kUnary,      // op(args[0])
    kBinary,     // op(args[0], args[1]); both already of the op's operand type
    kWhere,      // args[0] ? args[1] : args[2]
    kIndexLess,  // index[0] < ivalue ? args[0] : args[1]   (concat)
    kCast,       // (dtype)args[0]
    kClamp,      // clamp args[0] to [lo, hi] where has_lo / has_hi
    kReduce,     // op over rvars of args[0]: sum prod max min any all argmax argmin
    kGather,     // buffers[buffer][index...] with index[ivalue] replaced by args[0] (an i64
                 // already in range for that axis): a load at a position held in a tensor
    kRandom,     // a uniform number in [0, 1) of dtype: Philox of key args[0] (the seed, i64),
                 // counter args[1] (the element's row-major position, i64) and stream ivalue
    kStoreAlso,  // args[0]'s value, also stored at buffers[buffer][index...] where it is computed
                 // (a kernel storing a pointwise value its reductions read: CUDA code generator
                 // only, codegen/cuda/cuda_codegen.cc); every evaluation stores the same value
  };
  Kind kind = Kind::kConst;
  ir::DType dtype = ir::DType::kF32;  // result type
  std::string op;
  std::vector<ExprPtr> args;
  int buffer = -1;
  std::vector<Affine> index;
  double fvalue = 0;
  int64_t ivalue = 0;
  double lo = 0, hi = 0;
  bool has_lo = false, has_hi = false;
  std::vector<int> rvars;  // kReduce: reduced loop variables, outermost first

  // Loop variables the value depends on, excluding variables bound inside it (its rvars),
  // sorted. O(1) for nodes made by NewExpr (cached there); otherwise computed from the
  // operands, which is linear in the tree's paths (exponential on shared DAGs): build nodes
  // with NewExpr.
  std::vector<int> FreeVars() const;
  // Number of nodes in the tree (shared subtrees counted once); for diagnostics.
  static int CountNodes(const ExprPtr& e);

  // Set by NewExpr; copies of a node (to be modified and rebuilt) must go through NewExpr
  // again, which recomputes it.
  std::vector<int> free_vars_cache;
  bool free_vars_ready = false;
};

// The one way to make a shared node: computes its free variables from its operands' cached
// ones (O(operands + index size)), so every later FreeVars() call is O(1).
ExprPtr NewExpr(Expr e);

}  // namespace kiln::lower
