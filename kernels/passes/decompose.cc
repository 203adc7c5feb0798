// Decompose: rewrites composite ops into primitives the lowering understands. The forms are
// chosen for numerics first (max-subtracted softmax, two-pass variance) and fuse into one
// kernel per row: every reduction here reduces the same axes its consumer broadcasts over.
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "kernels/ir/op_registry.h"
#include "kernels/passes/passes.h"
#include "kernels/passes/rewrite.h"
#include "kernels/util/status_macros.h"

namespace kiln::passes {
namespace {

using ir::AttrMap;
using ir::Builder;
using ir::DType;
using ir::ValueId;

class Decomposer {
 public:
  Decomposer(Builder& b, const ir::Node& n) : b_(b), n_(n) {}

  absl::StatusOr<ValueId> Op(const std::string& op, std::vector<ValueId> in, AttrMap attrs = {}) {
    return b_.Add(op, std::move(in), std::move(attrs), n_.name);
  }
  absl::StatusOr<ValueId> Bin(const std::string& op, ValueId a, ValueId c) {
    return Op(op, {a, c});
  }
  absl::StatusOr<ValueId> Scalar(double v, ValueId like) {
    return b_.Scalar(b_.Type(like).dtype, v);
  }
  absl::StatusOr<ValueId> ToFloat(ValueId x) {
    DType t = ir::FloatResult(b_.Type(x).dtype);
    if (t == b_.Type(x).dtype) return x;
    return Op("cast", {x}, {{"dtype", t}});
  }
  absl::StatusOr<ValueId> Reduce(const std::string& op, ValueId x, const ir::IntList& axes,
                                 bool keep) {
    return Op(op, {x}, {{"axes", axes}, {"keepdim", keep}});
  }
  absl::StatusOr<ValueId> Mul(ValueId a, double s) {
    KILN_ASSIGN_OR_RETURN(ValueId c, Scalar(s, a));
    return Bin("mul", a, c);
  }
  int64_t CountOf(ValueId x, const ir::IntList& axes_raw) {
    auto axes = *ir::NormalizeAxes(axes_raw, b_.Type(x).Rank(), true);
    int64_t n = 1;
    for (int64_t a : axes) n *= b_.Type(x).shape[a];
    return n;
  }
  // Removes reduced axes that a keepdim=true result still has.
  absl::StatusOr<ValueId> DropKept(ValueId x, ValueId kept, const ir::IntList& axes, bool keep) {
    if (keep) return kept;
    KILN_ASSIGN_OR_RETURN(auto norm, ir::NormalizeAxes(axes, b_.Type(x).Rank(), true));
    ir::IntList shape;
    for (int64_t i = 0; i < b_.Type(x).Rank(); ++i)
      if (!std::binary_search(norm.begin(), norm.end(), i)) shape.push_back(b_.Type(x).shape[i]);
    return Op("reshape", {kept}, {{"shape", shape}});
  }

  // f16 and bf16 means and variances are computed in f32 and rounded once, as NumPy and torch
  // do: the sum of a large tensor in the type overflows (f16 past 65504), a constant N in the
  // type is inexact past 2048 (bf16: 256) and inf past 65504, and a constant 1/N rounded to it
  // (1/3 -> 0.33325, 1/768 off by 2.4e-4) biases every mean, a constant row's layer_norm by
  // far more. Kernels compute these types in f32 anyway, so the casts cost nothing.
  bool Half(ValueId x) { return ir::DTypeSize(b_.Type(x).dtype) < 4; }  // f16, bf16 (after ToFloat)
  absl::StatusOr<ValueId> InF32(ValueId x,
                                const std::function<absl::StatusOr<ValueId>(ValueId)>& f) {
    const DType t = b_.Type(x).dtype;
    KILN_ASSIGN_OR_RETURN(ValueId wide, Op("cast", {x}, {{"dtype", DType::kF32}}));
    KILN_ASSIGN_OR_RETURN(ValueId r, f(wide));
    return Op("cast", {r}, {{"dtype", t}});
  }
  absl::StatusOr<ValueId> Mean(ValueId x, const ir::IntList& axes, bool keep) {
    KILN_ASSIGN_OR_RETURN(x, ToFloat(x));
    if (Half(x)) return InF32(x, [&](ValueId w) { return Mean(w, axes, keep); });
    KILN_ASSIGN_OR_RETURN(ValueId s, Reduce("sum", x, axes, keep));
    const int64_t count = std::max<int64_t>(CountOf(x, axes), 0);
    return Mul(s, 1.0 / static_cast<double>(count));
  }
  absl::StatusOr<ValueId> Var(ValueId x, const ir::IntList& axes, bool keep, double correction) {
    KILN_ASSIGN_OR_RETURN(x, ToFloat(x));
    if (Half(x)) return InF32(x, [&](ValueId w) { return Var(w, axes, keep, correction); });
    KILN_ASSIGN_OR_RETURN(ValueId mu, Mean(x, axes, true));
    KILN_ASSIGN_OR_RETURN(ValueId d, Bin("sub", x, mu));
    KILN_ASSIGN_OR_RETURN(ValueId d2, Bin("mul", d, d));
    KILN_ASSIGN_OR_RETURN(ValueId s, Reduce("sum", d2, axes, keep));
    double dof = static_cast<double>(CountOf(x, axes)) - correction;
    KILN_ASSIGN_OR_RETURN(ValueId den, Scalar(std::max(dof, 0.0), s));
    return Bin("div", s, den);
  }

  absl::StatusOr<ValueId> Full(double value) {
    return Op("full", {},
              {{"shape", ir::IntList(n_.type.shape)}, {"value", value}, {"dtype", n_.type.dtype}});
  }

  absl::StatusOr<ValueId> Run(const std::vector<ValueId>& in) {
    const std::string& op = n_.op;
    ValueId x = in[0];
    ir::IntList axes = n_.Ints("axes");
    bool keep = n_.Bool("keepdim");
    // An empty result has nothing to compute (softmax over a zero-size axis among them): the
    // forms below would reduce empty axes with max, which has no identity.
    if (n_.type.NumElements() == 0) return Full(0);
    // log(sum(exp(nothing))) = log(0), as scipy.special.logsumexp gives.
    if (op == "logsumexp" && CountOf(x, axes) == 0) return Full(-INFINITY);
    if (op == "mean") return Mean(x, axes, keep);
    if (op == "var") return Var(x, axes, keep, n_.Float("correction", 0));
    if (op == "std") {
      auto stdev = [&](ValueId w) -> absl::StatusOr<ValueId> {
        KILN_ASSIGN_OR_RETURN(ValueId v, Var(w, axes, keep, n_.Float("correction", 0)));
        return Op("sqrt", {v});
      };
      KILN_ASSIGN_OR_RETURN(x, ToFloat(x));
      return Half(x) ? InF32(x, stdev) : stdev(x);
    }
    if (op == "softmax" || op == "log_softmax") {
      ir::IntList ax = {n_.Int("axis", -1)};
      KILN_ASSIGN_OR_RETURN(x, ToFloat(x));
      KILN_ASSIGN_OR_RETURN(ValueId m, Reduce("max", x, ax, true));
      KILN_ASSIGN_OR_RETURN(ValueId sh, Bin("sub", x, m));
      KILN_ASSIGN_OR_RETURN(ValueId e, Op("exp", {sh}));
      KILN_ASSIGN_OR_RETURN(ValueId s, Reduce("sum", e, ax, true));
      if (op == "softmax") return Bin("div", e, s);
      KILN_ASSIGN_OR_RETURN(ValueId ls, Op("log", {s}));
      return Bin("sub", sh, ls);
    }
    if (op == "logsumexp") {
      KILN_ASSIGN_OR_RETURN(x, ToFloat(x));
      KILN_ASSIGN_OR_RETURN(ValueId m, Reduce("max", x, axes, true));
      // An all -inf (or +inf) slice would give inf - inf: shift by 0 there instead.
      KILN_ASSIGN_OR_RETURN(ValueId inf, Op("isinf", {m}));
      KILN_ASSIGN_OR_RETURN(ValueId zero, Scalar(0, m));
      KILN_ASSIGN_OR_RETURN(ValueId ms, Op("where", {inf, zero, m}));
      KILN_ASSIGN_OR_RETURN(ValueId sh, Bin("sub", x, ms));
      KILN_ASSIGN_OR_RETURN(ValueId e, Op("exp", {sh}));
      KILN_ASSIGN_OR_RETURN(ValueId s, Reduce("sum", e, axes, true));
      KILN_ASSIGN_OR_RETURN(ValueId l, Op("log", {s}));
      KILN_ASSIGN_OR_RETURN(ValueId r, Bin("add", l, ms));
      return DropKept(x, r, axes, keep);
    }
    if (op == "norm") {
      KILN_ASSIGN_OR_RETURN(x, ToFloat(x));
      double p = n_.Float("ord", 2);
      if (p == 2) {
        KILN_ASSIGN_OR_RETURN(ValueId sq, Bin("mul", x, x));
        KILN_ASSIGN_OR_RETURN(ValueId s, Reduce("sum", sq, axes, keep));
        return Op("sqrt", {s});
      }
      KILN_ASSIGN_OR_RETURN(ValueId a, Op("abs", {x}));
      return Reduce(p == 1 ? "sum" : p > 0 ? "max" : "min", a, axes, keep);
    }
    if (op == "layer_norm") {
      KILN_ASSIGN_OR_RETURN(x, ToFloat(x));
      // f16/bf16: normalized in f32, rounded once at the end (below), as torch does.
      if (Half(x)) {
        KILN_ASSIGN_OR_RETURN(x, Op("cast", {x}, {{"dtype", DType::kF32}}));
      }
      ir::IntList ax = n_.Ints("axes", {-1});
      KILN_ASSIGN_OR_RETURN(ValueId mu, Mean(x, ax, true));
      KILN_ASSIGN_OR_RETURN(ValueId d, Bin("sub", x, mu));
      KILN_ASSIGN_OR_RETURN(ValueId d2, Bin("mul", d, d));
      KILN_ASSIGN_OR_RETURN(ValueId var, Mean(d2, ax, true));
      KILN_ASSIGN_OR_RETURN(ValueId eps, Scalar(n_.Float("eps", 1e-5), var));
      KILN_ASSIGN_OR_RETURN(ValueId ve, Bin("add", var, eps));
      KILN_ASSIGN_OR_RETURN(ValueId rs, Op("rsqrt", {ve}));
      KILN_ASSIGN_OR_RETURN(ValueId y, Bin("mul", d, rs));
      // weight and bias have the normalized axes' shape: give them the full rank.
      auto norm = *ir::NormalizeAxes(ax, b_.Type(x).Rank(), false);
      ir::IntList full;
      for (int64_t i = 0; i < b_.Type(x).Rank(); ++i)
        full.push_back(std::binary_search(norm.begin(), norm.end(), i) ? b_.Type(x).shape[i] : 1);
      for (size_t k = 1; k < in.size(); ++k) {
        KILN_ASSIGN_OR_RETURN(ValueId p, Op("reshape", {in[k]}, {{"shape", full}}));
        KILN_ASSIGN_OR_RETURN(y, Bin(k == 1 ? "mul" : "add", y, p));
      }
      DType want = n_.type.dtype;
      if (b_.Type(y).dtype != want) return Op("cast", {y}, {{"dtype", want}});
      return y;
    }
    if (op == "gelu") {
      KILN_ASSIGN_OR_RETURN(x, ToFloat(x));
      KILN_ASSIGN_OR_RETURN(ValueId half, Mul(x, 0.5));
      KILN_ASSIGN_OR_RETURN(ValueId one, Scalar(1, x));
      ValueId inner;
      if (n_.Str("approximate", "none") == "tanh") {
        KILN_ASSIGN_OR_RETURN(ValueId x2, Bin("mul", x, x));
        KILN_ASSIGN_OR_RETURN(ValueId x3, Bin("mul", x2, x));
        KILN_ASSIGN_OR_RETURN(ValueId c3, Mul(x3, 0.044715));
        KILN_ASSIGN_OR_RETURN(ValueId s, Bin("add", x, c3));
        KILN_ASSIGN_OR_RETURN(ValueId t, Mul(s, std::sqrt(2.0 / M_PI)));
        KILN_ASSIGN_OR_RETURN(inner, Op("tanh", {t}));
      } else {
        KILN_ASSIGN_OR_RETURN(ValueId t, Mul(x, M_SQRT1_2));
        KILN_ASSIGN_OR_RETURN(inner, Op("erf", {t}));
      }
      KILN_ASSIGN_OR_RETURN(ValueId s, Bin("add", one, inner));
      return Bin("mul", half, s);
    }
    if (op == "silu") {
      KILN_ASSIGN_OR_RETURN(x, ToFloat(x));
      KILN_ASSIGN_OR_RETURN(ValueId s, Op("sigmoid", {x}));
      return Bin("mul", x, s);
    }
    if (op == "relu") {
      KILN_ASSIGN_OR_RETURN(ValueId z, Scalar(0, x));
      return Bin("maximum", x, z);
    }
    if (op == "elu" || op == "leaky_relu") {
      KILN_ASSIGN_OR_RETURN(x, ToFloat(x));
      KILN_ASSIGN_OR_RETURN(ValueId z, Scalar(0, x));
      KILN_ASSIGN_OR_RETURN(ValueId pos, Bin("gt", x, z));
      ValueId neg;
      if (op == "elu") {
        KILN_ASSIGN_OR_RETURN(ValueId em, Op("expm1", {x}));
        KILN_ASSIGN_OR_RETURN(neg, Mul(em, n_.Float("alpha", 1.0)));
      } else {
        KILN_ASSIGN_OR_RETURN(neg, Mul(x, n_.Float("negative_slope", 0.01)));
      }
      return Op("where", {pos, x, neg});
    }
    if (op == "hardtanh")
      return Op("clamp", {x}, {{"min", n_.Float("min_val", -1)}, {"max", n_.Float("max_val", 1)}});
    if (op == "clip") {
      AttrMap a;
      if (n_.Has("min")) a["min"] = n_.Float("min");
      if (n_.Has("max")) a["max"] = n_.Float("max");
      return Op("clamp", {x}, a);
    }
    if (op == "softplus") {
      KILN_ASSIGN_OR_RETURN(x, ToFloat(x));
      double beta = n_.Float("beta", 1), threshold = n_.Float("threshold", 20);
      KILN_ASSIGN_OR_RETURN(ValueId bx, Mul(x, beta));
      KILN_ASSIGN_OR_RETURN(ValueId th, Scalar(threshold, x));
      KILN_ASSIGN_OR_RETURN(ValueId big, Bin("gt", bx, th));
      KILN_ASSIGN_OR_RETURN(ValueId e, Op("exp", {bx}));
      KILN_ASSIGN_OR_RETURN(ValueId l, Op("log1p", {e}));
      KILN_ASSIGN_OR_RETURN(ValueId soft, Mul(l, 1.0 / beta));
      return Op("where", {big, x, soft});
    }
    return absl::InternalError(absl::StrCat("no decomposition for composite op ", op));
  }

 private:
  Builder& b_;
  const ir::Node& n_;
};

}  // namespace

absl::StatusOr<ir::Graph> Decompose(const ir::Graph& graph) {
  return Rewrite(
      graph,
      [](Builder& b, const ir::Node& n,
         const std::vector<ValueId>& in) -> absl::StatusOr<std::optional<ValueId>> {
        if (ir::FindOp(n.op)->kind != ir::OpKind::kComposite) return std::nullopt;
        KILN_ASSIGN_OR_RETURN(ValueId v, Decomposer(b, n).Run(in));
        // The decomposition must give what the composite's type rule promised.
        if (b.Type(v).dtype != n.type.dtype) {
          KILN_ASSIGN_OR_RETURN(v, b.Add("cast", {v}, {{"dtype", n.type.dtype}}, n.name));
        }
        return v;
      });
}

}  // namespace kiln::passes
