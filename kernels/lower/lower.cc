#include "kernels/lower/lower.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "kernels/ir/op_registry.h"
#include "kernels/ir/symbols.h"

namespace kiln::lower {
namespace {

using ir::DType;

bool IsComparison(const std::string& op) {
  static const std::set<std::string> k = {"eq", "ne", "lt", "le", "gt", "ge"};
  return k.count(op) > 0;
}
bool IsLogical(const std::string& op) {
  return op == "logical_and" || op == "logical_or" || op == "logical_xor" || op == "logical_not";
}

ExprPtr Make(Expr e) { return NewExpr(std::move(e)); }

// Concats of up to this many non-empty parts lower to a chain of selections; more parts
// lower to a balanced tree.
constexpr size_t kConcatChainParts = 16;

}  // namespace

ExprPtr MakeConst(DType t, double v) {
  Expr e;
  e.kind = Expr::Kind::kConst;
  e.dtype = t;
  if (ir::IsFloat(t)) {
    // f32 literals are rounded by the compiler alike; f16/bf16 compute in float, so their
    // constants are rounded to the dtype here (NumPy's cast: inf beyond the range).
    // While sampling a symbolic graph (ir/symbols.h) f16/bf16 constants stay exact.
    const bool exact = t == DType::kF32 || ir::InSymbolicSample();
    e.fvalue = exact && std::fabs(v) <= std::numeric_limits<float>::max()
                   ? v
                   : ir::RoundToFloatDType(v, t);
  } else if (ir::IsBool(t)) {
    e.ivalue = v != 0;
  } else {
    // Callers pass values that fit (the verifier checks constants and `full`); saturate
    // rather than invoke undefined behaviour should one not.
    e.ivalue = std::isnan(v)  ? 0
               : v <= -0x1p63 ? std::numeric_limits<int64_t>::min()
               : v >= 0x1p63  ? std::numeric_limits<int64_t>::max()
                              : static_cast<int64_t>(v);
  }
  return Make(std::move(e));
}

ExprPtr MakeIntConst(DType t, int64_t v) {
  Expr e;
  e.kind = Expr::Kind::kConst;
  e.dtype = t;
  e.ivalue = ir::IsBool(t) ? (v != 0) : v;
  return Make(std::move(e));
}

ExprPtr MakeCast(ExprPtr e, DType t) {
  if (e->dtype == t) return e;
  if (e->kind == Expr::Kind::kConst) {
    // Integer to integer keeps all 64 bits (the literal's C cast wraps as NumPy's does).
    if (!ir::IsFloat(e->dtype) && !ir::IsFloat(t)) return MakeIntConst(t, e->ivalue);
    double v = ir::IsFloat(e->dtype) ? e->fvalue : static_cast<double>(e->ivalue);
    if (ir::IsFloat(t)) return MakeConst(t, v);
  }
  Expr c;
  c.kind = Expr::Kind::kCast;
  c.dtype = t;
  c.args = {std::move(e)};
  return Make(std::move(c));
}

int64_t InlineDepth(const ir::Node& node) {
  if (node.op != "concat") return 1;
  size_t parts = node.inputs.size();
  if (parts <= kConcatChainParts) return static_cast<int64_t>(parts);
  int64_t levels = 1;
  while ((size_t{1} << levels) < parts) ++levels;
  return levels + 1;
}

bool NestsIndex(const ir::Node& node) {
  return node.op == "reshape" || node.op == "squeeze" || node.op == "unsqueeze" ||
         node.op == "concat";
}

std::vector<int64_t> ContiguousStrides(const ir::Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

Lowerer::Lowerer(const ir::Graph& graph, const std::vector<int>& buffer_of,
                 const std::vector<int>& const_buffer_of)
    : graph_(graph), buffer_of_(buffer_of), const_buffer_of_(const_buffer_of) {}

std::vector<Affine> Lowerer::BeginKernel(const ir::Shape& domain) {
  extents_.clear();
  scope_.clear();
  memo_.clear();
  inlined_.clear();
  fused_.clear();
  fused_set_.clear();
  stored_here_.clear();
  std::vector<Affine> idx;
  for (int64_t d : domain) {
    if (d == 1) {
      idx.push_back(Affine::Const(0));
      continue;
    }
    int v = NewVar(d);
    scope_.push_back(v);
    idx.push_back(Affine::Var(v));
  }
  return idx;
}

int Lowerer::NewVar(int64_t extent) {
  extents_.push_back(extent);
  return static_cast<int>(extents_.size()) - 1;
}

std::vector<Affine> Lowerer::BroadcastIndex(const std::vector<Affine>& index, const ir::Shape& out,
                                            const ir::Shape& in) const {
  std::vector<Affine> r(in.size());
  size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) r[i] = in[i] == 1 ? Affine::Const(0) : index[i + off];
  return r;
}

std::vector<Affine> Lowerer::ReshapeIndex(const std::vector<Affine>& index, const ir::Shape& out,
                                          const ir::Shape& in) const {
  // A tensor with no elements is never indexed: any index will do (and a zero extent would
  // be a division by zero below).
  if (std::count(in.begin(), in.end(), 0) || std::count(out.begin(), out.end(), 0))
    return std::vector<Affine>(in.size(), Affine::Const(0));
  std::vector<int64_t> so = ContiguousStrides(out), si = ContiguousStrides(in);
  Affine linear = Affine::Const(0);
  for (size_t i = 0; i < out.size(); ++i) linear = Add(linear, Scale(index[i], so[i]));
  std::vector<Affine> r(in.size());
  for (size_t j = 0; j < in.size(); ++j) {
    Affine q = FloorDiv(linear, si[j], extents_);
    r[j] = j == 0 ? q : Mod(q, in[j], extents_);
  }
  return r;
}

ExprPtr Lowerer::Lower(ir::ValueId v, const std::vector<Affine>& index, bool root) {
  bool here = stored_here_.count(v) != 0;
  if (graph_.IsInput(v) || (!root && !here && buffer_of_[v] >= 0)) {
    Expr e;
    e.kind = Expr::Kind::kLoad;
    e.dtype = graph_.TypeOf(v).dtype;
    e.buffer = buffer_of_[v];
    e.index = index;
    return Make(std::move(e));
  }
  auto key = std::make_pair(v, index);
  auto it = memo_.find(key);
  if (it != memo_.end()) return it->second;
  if (fused_set_.insert(v).second) fused_.push_back(v);
  ExprPtr e = LowerNode(v, index);
  memo_[key] = e;
  return e;
}

ExprPtr Lowerer::LowerNode(ir::ValueId v, const std::vector<Affine>& index) {
  const ir::Node& n = graph_.NodeOf(v);
  const ir::TensorType& out = n.type;
  const ir::OpSchema* schema = ir::FindOp(n.op);
  auto in_type = [&](int k) -> const ir::TensorType& { return graph_.TypeOf(n.inputs[k]); };
  auto operand = [&](int k) {
    return Lower(n.inputs[k], BroadcastIndex(index, out.shape, in_type(k).shape));
  };

  switch (schema->kind) {
    case ir::OpKind::kElementwise: {
      Expr e;
      e.dtype = out.dtype;
      e.op = n.op;
      if (n.op == "cast") return MakeCast(operand(0), out.dtype);
      if (n.op == "where") {
        e.kind = Expr::Kind::kWhere;
        e.args = {operand(0), MakeCast(operand(1), out.dtype), MakeCast(operand(2), out.dtype)};
        return Make(std::move(e));
      }
      if (n.op == "clamp") {
        e.kind = Expr::Kind::kClamp;
        e.has_lo = n.Has("min");
        e.has_hi = n.Has("max");
        e.lo = n.Float("min");
        e.hi = n.Float("max");
        e.args = {operand(0)};
        return Make(std::move(e));
      }
      if (n.inputs.size() == 1) {
        e.kind = Expr::Kind::kUnary;
        ExprPtr a = operand(0);
        if (IsLogical(n.op))
          a = MakeCast(a, DType::kBool);
        else if (n.op != "isnan" && n.op != "isinf")
          a = MakeCast(a, out.dtype);
        e.args = {a};
        return Make(std::move(e));
      }
      e.kind = Expr::Kind::kBinary;
      DType operand_type = out.dtype;
      if (IsComparison(n.op)) operand_type = ir::Promote(in_type(0).dtype, in_type(1).dtype);
      if (IsLogical(n.op)) operand_type = DType::kBool;
      e.args = {MakeCast(operand(0), operand_type), MakeCast(operand(1), operand_type)};
      return Make(std::move(e));
    }
    case ir::OpKind::kLayout: {
      const ir::Shape& in = in_type(0).shape;
      if (n.op == "broadcast_to") return Lower(n.inputs[0], BroadcastIndex(index, out.shape, in));
      if (n.op == "reshape" || n.op == "squeeze" || n.op == "unsqueeze")
        return Lower(n.inputs[0], ReshapeIndex(index, out.shape, in));
      if (n.op == "permute") {
        std::vector<Affine> r(in.size());
        ir::IntList dims = n.Ints("dims");
        int64_t rank = static_cast<int64_t>(in.size());
        for (size_t i = 0; i < dims.size(); ++i)
          r[dims[i] < 0 ? dims[i] + rank : dims[i]] = index[i];
        return Lower(n.inputs[0], r);
      }
      if (n.op == "slice") {
        std::vector<Affine> r = index;
        ir::IntList axes = n.Ints("axes"), starts = n.Ints("starts"), stops = n.Ints("stops");
        ir::IntList steps = n.Ints("steps", ir::IntList(axes.size(), 1));
        int64_t rank = static_cast<int64_t>(in.size());
        for (size_t i = 0; i < axes.size(); ++i) {
          int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
          auto sl = ir::NormalizeSlice(in[a], starts[i], stops[i], steps[i]);
          r[a] = AddConst(Scale(index[a], steps[i]), sl->first);
        }
        return Lower(n.inputs[0], r);
      }
      if (n.op == "concat") {
        int64_t axis = n.Int("axis");
        if (axis < 0) axis += out.Rank();
        std::vector<int64_t> offsets;
        int64_t off = 0;
        for (size_t k = 0; k < n.inputs.size(); ++k) {
          offsets.push_back(off);
          off += in_type(static_cast<int>(k)).shape[axis];
        }
        // Parts in order (empty inputs contribute nothing), each reading its input shifted.
        struct Part {
          ExprPtr value;
          int64_t end;  // offset of the part's end along `axis`
        };
        std::vector<Part> parts;
        // Lowered last part first: the order fixes loop-variable numbering in generated code.
        for (int k = static_cast<int>(n.inputs.size()) - 1; k >= 0; --k) {
          int64_t size = in_type(k).shape[axis];
          if (size == 0) continue;
          std::vector<Affine> r = index;
          r[axis] = Clamp(AddConst(index[axis], -offsets[k]), 0, size - 1, extents_);
          parts.push_back({MakeCast(Lower(n.inputs[k], r), out.dtype), offsets[k] + size});
        }
        std::reverse(parts.begin(), parts.end());
        auto select = [&](ExprPtr below, int64_t bound, ExprPtr rest) {
          Expr sel;
          sel.kind = Expr::Kind::kIndexLess;
          sel.dtype = out.dtype;
          sel.index = {index[axis]};
          sel.ivalue = bound;
          sel.args = {std::move(below), std::move(rest)};
          return Make(std::move(sel));
        };
        ExprPtr acc;
        if (parts.size() <= kConcatChainParts) {
          // A chain of selections, the last part first.
          for (auto it = parts.rbegin(); it != parts.rend(); ++it)
            acc = acc ? select(it->value, it->end, acc) : it->value;
        } else {
          // Many parts: a balanced tree of selections, so the expression's depth grows with
          // log2(parts) rather than with the number of parts. Built bottom-up, level by level.
          std::vector<std::pair<ExprPtr, int64_t>> level;  // (value, end of its last part)
          for (const Part& p : parts) level.push_back({p.value, p.end});
          while (level.size() > 1) {
            std::vector<std::pair<ExprPtr, int64_t>> next;
            for (size_t i = 0; i + 1 < level.size(); i += 2)
              next.push_back({select(level[i].first, level[i].second, level[i + 1].first),
                              level[i + 1].second});
            if (level.size() % 2) next.push_back(level.back());
            level = std::move(next);
          }
          acc = level.empty() ? nullptr : level[0].first;
        }
        return acc ? acc : MakeConst(out.dtype, 0);
      }
      if (n.op == "gather") return LowerGather(v, index);
      break;
    }
    case ir::OpKind::kSource: {
      if (n.op == "full") return MakeConst(out.dtype, n.Float("value"));
      if (n.op == "iota") {
        int64_t axis = n.Int("axis", 0);
        if (axis < 0) axis += out.Rank();
        Expr e;
        e.kind = Expr::Kind::kIndex;
        e.dtype = DType::kI64;
        e.index = {index[axis]};
        return MakeCast(Make(std::move(e)), out.dtype);
      }
      if (n.op == "uniform") {
        // The counter is the element's row-major position in the node's own shape, so views
        // and fusion around it never change which number an element gets.
        const ir::TensorType& seed_type = in_type(0);
        ExprPtr seed = MakeCast(
            Lower(n.inputs[0], std::vector<Affine>(seed_type.shape.size(), Affine::Const(0))),
            DType::kI64);
        const std::vector<int64_t> strides = ContiguousStrides(out.shape);
        Affine linear = Affine::Const(0);
        for (size_t d = 0; d < out.shape.size(); ++d)
          linear = Add(linear, Scale(index[d], strides[d]));
        Expr position;
        position.kind = Expr::Kind::kIndex;
        position.dtype = DType::kI64;
        position.index = {linear};
        Expr e;
        e.kind = Expr::Kind::kRandom;
        e.dtype = out.dtype;
        e.ivalue = n.Int("stream", 0);
        e.args = {std::move(seed), Make(std::move(position))};
        return Make(std::move(e));
      }
      if (n.op == "constant") {
        const ir::Constant* c = n.Tensor("value");
        if (c->NumElements() == 0) return MakeConst(out.dtype, 0);  // never read: no elements
        if (c->NumElements() == 1)
          return c->f.empty() ? MakeIntConst(out.dtype, c->i[0]) : MakeConst(out.dtype, c->f[0]);
        Expr e;
        e.kind = Expr::Kind::kLoad;
        e.dtype = out.dtype;
        e.buffer = const_buffer_of_[v];
        e.index = index;
        return Make(std::move(e));
      }
      break;
    }
    case ir::OpKind::kReduction:
      return LowerReduction(v, index);
    case ir::OpKind::kComposite:
    case ir::OpKind::kExtern:
      break;
  }
  // Unreachable for verified, decomposed graphs: the scheduler checks op kinds first.
  return MakeConst(out.dtype, 0);
}

GatherView GatherSource(const ir::Graph& g, const ir::Node& gather) {
  GatherView view;
  const int64_t rank = g.TypeOf(gather.inputs[0]).Rank();
  view.axis = gather.Int("axis");
  if (view.axis < 0) view.axis += rank;
  view.value = gather.inputs[0];
  for (int64_t d = 0; d < rank; ++d) view.dims.push_back(static_cast<int>(d));
  while (!g.IsInput(view.value)) {
    const ir::Node& b = g.NodeOf(view.value);
    const ir::Shape& in = g.TypeOf(b.inputs[0]).shape;
    if (b.op == "broadcast_to") {
      // Same rank, the gathered axis kept: a broadcast dimension is read at 0 by the gather.
      if (in.size() != b.type.shape.size() || in[view.axis] != b.type.shape[view.axis]) break;
    } else if (b.op == "unsqueeze") {
      // Inserted size-1 axes (not the gathered one) are dropped from the mapping.
      std::vector<bool> inserted(b.type.shape.size(), false);
      for (int64_t a : b.Ints("axes"))
        inserted[a < 0 ? a + static_cast<int64_t>(b.type.shape.size()) : a] = true;
      if (inserted[view.axis]) break;
      std::vector<int> dims;
      int64_t axis = 0;
      for (size_t d = 0; d < inserted.size(); ++d) {
        if (inserted[d]) continue;
        if (static_cast<int64_t>(d) == view.axis) axis = static_cast<int64_t>(dims.size());
        dims.push_back(view.dims[d]);
      }
      view.dims = std::move(dims);
      view.axis = axis;
    } else {
      break;
    }
    view.value = b.inputs[0];
  }
  return view;
}

ExprPtr Lowerer::LowerGather(ir::ValueId v, const std::vector<Affine>& index) {
  const ir::Node& n = graph_.NodeOf(v);
  const GatherView src = GatherSource(graph_, n);
  const ir::Shape& xs = graph_.TypeOf(src.value).shape;
  const int64_t rank = static_cast<int64_t>(xs.size());
  const int64_t axis = src.axis;
  // The position along `axis`: NumPy's negative positions count from the end, and anything
  // still outside [0, n) reads the nearest end (never outside the buffer). The index
  // broadcasts against x off the axis (NumPy's take_along_axis).
  const int64_t extent = xs[axis];
  ExprPtr at = MakeCast(
      Lower(n.inputs[1], BroadcastIndex(index, n.type.shape, graph_.TypeOf(n.inputs[1]).shape)),
      DType::kI64);
  Expr neg;
  neg.kind = Expr::Kind::kBinary;
  neg.op = "lt";
  neg.dtype = DType::kBool;
  neg.args = {at, MakeIntConst(DType::kI64, 0)};
  Expr wrapped;
  wrapped.kind = Expr::Kind::kBinary;
  wrapped.op = "add";
  wrapped.dtype = DType::kI64;
  wrapped.args = {at, MakeIntConst(DType::kI64, extent)};
  Expr pick;
  pick.kind = Expr::Kind::kWhere;
  pick.dtype = DType::kI64;
  pick.args = {Make(std::move(neg)), Make(std::move(wrapped)), at};
  Expr clamp;
  clamp.kind = Expr::Kind::kClamp;
  clamp.dtype = DType::kI64;
  clamp.has_lo = clamp.has_hi = true;
  clamp.lo = 0;
  clamp.hi = static_cast<double>(extent - 1);
  clamp.args = {Make(std::move(pick))};
  // The source is read from its buffer (the scheduler stores a computed source first); off the
  // axis a dimension of 1 is read at 0.
  Expr e;
  e.kind = Expr::Kind::kGather;
  e.dtype = graph_.TypeOf(src.value).dtype;
  e.buffer = buffer_of_[src.value];
  e.ivalue = axis;
  e.args = {Make(std::move(clamp))};
  for (int64_t d = 0; d < rank; ++d)
    e.index.push_back(d == axis || xs[d] == 1 ? Affine::Const(0) : index[src.dims[d]]);
  return Make(std::move(e));
}

ExprPtr Lowerer::LowerReduction(ir::ValueId v, const std::vector<Affine>& index) {
  const ir::Node& n = graph_.NodeOf(v);
  const ir::TensorType& in = graph_.TypeOf(n.inputs[0]);
  std::vector<int64_t> axes;
  bool keep = n.Bool("keepdim");
  if (n.op == "argmax" || n.op == "argmin") {
    if (n.Has("axis")) {
      int64_t a = n.Int("axis");
      axes = {a < 0 ? a + in.Rank() : a};
    } else {
      for (int64_t i = 0; i < in.Rank(); ++i) axes.push_back(i);
    }
  } else {
    axes = *ir::NormalizeAxes(n.Ints("axes"), in.Rank(), true);
  }
  Expr e;
  e.kind = Expr::Kind::kReduce;
  e.op = n.op;
  e.dtype = n.type.dtype;
  std::vector<Affine> in_idx(in.Rank());
  size_t k = 0;
  bool flat_arg = (n.op == "argmax" || n.op == "argmin") && !n.Has("axis");
  for (int64_t i = 0; i < in.Rank(); ++i) {
    if (std::binary_search(axes.begin(), axes.end(), i)) {
      int rv = NewVar(in.shape[i]);
      e.rvars.push_back(rv);
      in_idx[i] = Affine::Var(rv);
      if (keep && !flat_arg) ++k;
    } else {
      in_idx[i] = index[k++];
    }
  }
  // Where does the consuming kernel evaluate this reduction? At the innermost enclosing loop
  // it depends on; every loop outside that point multiplies its evaluations.
  size_t outer = scope_.size();
  for (int rv : e.rvars) scope_.push_back(rv);
  ExprPtr body = Lower(n.inputs[0], in_idx);
  scope_.resize(outer);
  if (n.op == "sum" || n.op == "prod") body = MakeCast(body, n.type.dtype);
  if (n.op == "any" || n.op == "all") body = MakeCast(body, DType::kBool);
  // Reducing no axes (a rank-0 input) reduces one element: the element itself, index 0.
  if (e.rvars.empty())
    return n.op == "argmax" || n.op == "argmin" ? MakeIntConst(DType::kI64, 0)
                                                : MakeCast(body, n.type.dtype);
  e.args = {body};
  ExprPtr r = Make(std::move(e));
  std::vector<int> free = r->FreeVars();
  int64_t evaluations = 1;
  int deepest = -1;
  for (size_t i = 0; i < scope_.size(); ++i)
    if (std::count(free.begin(), free.end(), scope_[i])) deepest = static_cast<int>(i);
  for (int i = 0; i <= deepest; ++i)
    if (__builtin_mul_overflow(evaluations, std::max<int64_t>(extents_[scope_[i]], 1),
                               &evaluations))
      evaluations = std::numeric_limits<int64_t>::max();
  inlined_.push_back({v, evaluations, std::max<int64_t>(n.type.NumElements(), 1)});
  return r;
}

}  // namespace kiln::lower
