// FoldConstants: an elementwise op whose inputs are all scalar constants becomes a scalar
// constant. Evaluated in double (float results) or int64 (integer results) and then
// converted to the node's dtype, the way the generated code would compute it for f32/f64
// and integer types; f16/bf16 results and ops without an exact host equivalent are left
// for the kernel to compute.
#include <cmath>

#include "kernels/ir/op_registry.h"
#include "kernels/passes/passes.h"
#include "kernels/passes/rewrite.h"

namespace kiln::passes {
namespace {

using ir::ValueId;

std::optional<double> ScalarConst(const ir::Graph& g, ValueId v) {
  if (g.IsInput(v)) return std::nullopt;
  const ir::Node& n = g.NodeOf(v);
  if (n.op == "constant" && n.Tensor("value")->NumElements() == 1 && n.type.shape.empty())
    return n.Tensor("value")->AsDouble(0);
  return std::nullopt;
}

std::optional<double> Eval(const std::string& op, const std::vector<double>& a, ir::DType t) {
  bool fl = ir::IsFloat(t);
  if (a.size() == 1) {
    double x = a[0];
    if (op == "neg") return -x;
    if (op == "abs") return std::fabs(x);
    if (fl && op == "sqrt") return std::sqrt(x);
    if (fl && op == "exp") return std::exp(x);
    if (fl && op == "log") return std::log(x);
    if (fl && op == "reciprocal") return 1.0 / x;
    if (op == "cast") return x;
    return std::nullopt;
  }
  if (a.size() == 2) {
    double x = a[0], y = a[1];
    if (op == "add") return x + y;
    if (op == "sub") return x - y;
    if (op == "mul") return x * y;
    if (fl && op == "div") return x / y;
    if (op == "maximum") return std::isnan(x) || x > y ? x : y;
    if (op == "minimum") return std::isnan(x) || x < y ? x : y;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<ir::Graph> FoldConstants(const ir::Graph& graph) {
  return Rewrite(graph,
                 [](ir::Builder& b, const ir::Node& n,
                    const std::vector<ValueId>& in) -> absl::StatusOr<std::optional<ValueId>> {
                   if (ir::FindOp(n.op)->kind != ir::OpKind::kElementwise || in.empty())
                     return std::nullopt;
                   ir::DType t = n.type.dtype;
                   // Only where the host computes exactly what the kernel would: f32/f64 and 64-bit
                   // ints.
                   if (t != ir::DType::kF32 && t != ir::DType::kF64 && t != ir::DType::kI64)
                     return std::nullopt;
                   std::vector<double> vals;
                   for (ValueId v : in) {
                     auto s = ScalarConst(b.graph(), v);
                     if (!s) return std::nullopt;
                     vals.push_back(*s);
                   }
                   for (ValueId v : in)
                     if (b.Type(v).dtype != t)
                       return std::nullopt;  // mixed types: leave promotion to lowering
                   auto r = Eval(n.op, vals, t);
                   if (!r) return std::nullopt;
                   double v = *r;
                   if (t == ir::DType::kF32) v = ir::RoundToFloatDType(v, t);
                   if (t == ir::DType::kI64 && (std::isnan(v) || std::fabs(v) > 9e15))
                     return std::nullopt;
                   return b.Scalar(t, v);
                 });
}

}  // namespace kiln::passes
