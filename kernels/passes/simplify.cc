// Simplify: algebraic identities that hold bit for bit under IEEE arithmetic for the types
// involved. x*1, 1*x, x/1, x+0 (integers only: -0.0 + 0.0 is +0.0), x-0, neg(neg(x)),
// cast to the same type, and cast round trips through a wider type (f32->f64->f32).
// An identity that would change the result's shape (a broadcasting constant) or dtype is
// left alone.
#include "kernels/ir/op_registry.h"
#include "kernels/passes/passes.h"
#include "kernels/passes/rewrite.h"

namespace kiln::passes {
namespace {

using ir::ValueId;

// The scalar value of a constant node, if v is one.
std::optional<double> ScalarOf(const ir::Graph& g, ValueId v) {
  if (g.IsInput(v)) return std::nullopt;
  const ir::Node& n = g.NodeOf(v);
  if (n.op == "constant" && n.Tensor("value")->NumElements() == 1)
    return n.Tensor("value")->AsDouble(0);
  if (n.op == "full" && n.type.NumElements() >= 1) return n.Float("value");
  return std::nullopt;
}

bool Lossless(ir::DType from, ir::DType via) {
  if (from == via) return true;
  if (ir::IsFloat(from) && ir::IsFloat(via))
    return ir::DTypeSize(via) > ir::DTypeSize(from) && via != ir::DType::kBF16;
  if (ir::IsInteger(from) && ir::IsInteger(via)) {
    bool fu = from == ir::DType::kU8, vu = via == ir::DType::kU8;
    return ir::DTypeSize(via) > ir::DTypeSize(from) ||
           (fu == vu && ir::DTypeSize(via) == ir::DTypeSize(from));
  }
  if (ir::IsBool(from)) return true;
  return false;
}

}  // namespace

absl::StatusOr<ir::Graph> Simplify(const ir::Graph& graph) {
  return Rewrite(graph,
                 [](ir::Builder& b, const ir::Node& n,
                    const std::vector<ValueId>& in) -> absl::StatusOr<std::optional<ValueId>> {
                   const ir::Graph& g = b.graph();
                   auto same = [&](ValueId v) { return b.Type(v) == n.type; };
                   auto is = [&](ValueId v, double c) {
                     auto s = ScalarOf(g, v);
                     return s && *s == c;
                   };
                   if (n.op == "mul") {
                     if (is(in[1], 1) && same(in[0])) return in[0];
                     if (is(in[0], 1) && same(in[1])) return in[1];
                   }
                   if (n.op == "div" && is(in[1], 1) && same(in[0])) return in[0];
                   if (n.op == "sub" && is(in[1], 0) && same(in[0])) return in[0];
                   if (n.op == "add" && !ir::IsFloat(n.type.dtype)) {
                     if (is(in[1], 0) && same(in[0])) return in[0];
                     if (is(in[0], 0) && same(in[1])) return in[1];
                   }
                   if (n.op == "neg" && !g.IsInput(in[0]) && g.NodeOf(in[0]).op == "neg") {
                     ValueId x = g.NodeOf(in[0]).inputs[0];
                     if (same(x)) return x;
                   }
                   if (n.op == "cast") {
                     if (same(in[0])) return in[0];
                     if (!g.IsInput(in[0]) && g.NodeOf(in[0]).op == "cast") {
                       ValueId x = g.NodeOf(in[0]).inputs[0];
                       if (same(x) && Lossless(b.Type(x).dtype, b.Type(in[0]).dtype)) return x;
                     }
                   }
                   return std::nullopt;
                 });
}

}  // namespace kiln::passes
