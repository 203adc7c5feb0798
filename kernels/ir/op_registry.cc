#include "kernels/ir/op_registry.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/ir/symbols.h"
#include "kernels/util/status_macros.h"

namespace kiln::ir {
namespace {

using absl::InvalidArgumentError;
using Types = std::vector<TensorType>;
using InferFn = std::function<absl::StatusOr<TensorType>(const Node&, const Types&)>;

std::string ShapeStr(const Shape& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

// Attribute readers that check the attribute's kind; `required` ones must be present.
absl::StatusOr<std::optional<IntList>> IntsAttr(const Node& n, const std::string& key) {
  auto it = n.attrs.find(key);
  if (it == n.attrs.end()) return std::optional<IntList>();
  if (auto* p = std::get_if<IntList>(&it->second)) return std::optional<IntList>(*p);
  if (auto* p = std::get_if<int64_t>(&it->second)) return std::optional<IntList>(IntList{*p});
  return InvalidArgumentError(absl::StrCat("attribute '", key, "' must be a list of ints"));
}
absl::StatusOr<IntList> RequiredInts(const Node& n, const std::string& key) {
  KILN_ASSIGN_OR_RETURN(auto v, IntsAttr(n, key));
  if (!v) return InvalidArgumentError(absl::StrCat("missing attribute '", key, "'"));
  return *v;
}
absl::Status CheckKind(const Node& n, const std::string& key, bool numeric, bool is_bool,
                       bool is_str, bool is_dtype) {
  auto it = n.attrs.find(key);
  if (it == n.attrs.end()) return absl::OkStatus();
  const AttrValue& v = it->second;
  bool ok =
      (numeric && (std::holds_alternative<int64_t>(v) || std::holds_alternative<double>(v))) ||
      (is_bool && (std::holds_alternative<bool>(v) || std::holds_alternative<int64_t>(v))) ||
      (is_str && std::holds_alternative<std::string>(v)) ||
      (is_dtype && std::holds_alternative<DType>(v));
  if (ok) return absl::OkStatus();
  const char* want = numeric ? "a number" : is_bool ? "a bool" : is_str ? "a string" : "a dtype";
  return InvalidArgumentError(absl::StrCat("attribute '", key, "' must be ", want));
}
absl::Status NumberAttrs(const Node& n, std::initializer_list<const char*> keys) {
  for (const char* k : keys) KILN_RETURN_IF_ERROR(CheckKind(n, k, true, false, false, false));
  return absl::OkStatus();
}

// "value 300 does not fit i8 (range -128..127; rule: ...)"; floats never fail (they become
// +-inf beyond their range, as NumPy's cast gives).
std::string DoesNotFit(double v, DType t) {
  return absl::StrCat("value ", v, " does not fit ", DTypeName(t), " (range ", MinOf(t), "..",
                      MaxOf(t), "; rule: integer constants must fit their dtype)");
}

absl::Status CheckShape(const Shape& s) {
  for (int64_t d : s)
    if (d < 0)
      return InvalidArgumentError(absl::StrCat("negative dimension in shape ", ShapeStr(s)));
  return absl::OkStatus();
}

TensorType Make(DType t, Shape s) {
  TensorType r;
  r.dtype = t;
  r.shape = std::move(s);
  return r;
}

absl::StatusOr<Shape> BroadcastAll(const Types& in) {
  Shape s = in[0].shape;
  for (size_t i = 1; i < in.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(s, BroadcastShapes(s, in[i].shape));
  }
  return s;
}

// ---- elementwise ----
enum class UnaryRule { kFloat, kSame, kBoolOut, kIntOrBool, kSigned };

InferFn Unary(UnaryRule rule) {
  return [rule](const Node& n, const Types& in) -> absl::StatusOr<TensorType> {
    DType t = in[0].dtype;
    switch (rule) {
      case UnaryRule::kFloat:
        return Make(FloatResult(t), in[0].shape);
      case UnaryRule::kSame:
        return Make(t, in[0].shape);
      case UnaryRule::kBoolOut:
        return Make(DType::kBool, in[0].shape);
      case UnaryRule::kIntOrBool:
        if (IsFloat(t))
          return InvalidArgumentError(
              absl::StrCat(n.op, " takes integer or bool inputs, got ", DTypeName(t)));
        return Make(t, in[0].shape);
      case UnaryRule::kSigned:
        if (IsBool(t)) return InvalidArgumentError(absl::StrCat(n.op, " is not defined for bool"));
        return Make(t, in[0].shape);
    }
    return InvalidArgumentError("bad unary rule");
  };
}

enum class BinaryRule { kPromote, kFloat, kTrueDiv, kBoolOut, kIntOrBool, kNumeric };

InferFn Binary(BinaryRule rule) {
  return [rule](const Node& n, const Types& in) -> absl::StatusOr<TensorType> {
    auto shape = BroadcastShapes(in[0].shape, in[1].shape);
    if (!shape.ok()) return shape.status();
    DType t = Promote(in[0].dtype, in[1].dtype);
    switch (rule) {
      case BinaryRule::kPromote:
        return Make(t, *shape);
      case BinaryRule::kNumeric:
        if (IsBool(t))
          return InvalidArgumentError(absl::StrCat(n.op, " is not defined for bool inputs"));
        return Make(t, *shape);
      case BinaryRule::kFloat:
        return Make(FloatResult(t), *shape);
      // NumPy's true division of integers (and bools) is always float64.
      case BinaryRule::kTrueDiv:
        return Make(IsFloat(t) ? t : DType::kF64, *shape);
      case BinaryRule::kBoolOut:
        return Make(DType::kBool, *shape);
      case BinaryRule::kIntOrBool:
        if (IsFloat(t))
          return InvalidArgumentError(
              absl::StrCat(n.op, " takes integer or bool inputs, got ", DTypeName(t)));
        return Make(t, *shape);
    }
    return InvalidArgumentError("bad binary rule");
  };
}

absl::StatusOr<TensorType> InferWhere(const Node&, const Types& in) {
  if (!IsBool(in[0].dtype))
    return InvalidArgumentError(
        absl::StrCat("where: condition must be bool, got ", DTypeName(in[0].dtype)));
  KILN_ASSIGN_OR_RETURN(Shape s, BroadcastAll(in));
  return Make(Promote(in[1].dtype, in[2].dtype), s);
}

absl::StatusOr<TensorType> InferClamp(const Node& n, const Types& in) {
  KILN_RETURN_IF_ERROR(NumberAttrs(n, {"min", "max"}));
  return Make(in[0].dtype, in[0].shape);
}

absl::StatusOr<TensorType> InferCast(const Node& n, const Types& in) {
  KILN_RETURN_IF_ERROR(CheckKind(n, "dtype", false, false, false, true));
  if (!n.Has("dtype")) return InvalidArgumentError("missing attribute 'dtype'");
  return Make(n.Dtype("dtype", DType::kF32), in[0].shape);
}

// ---- layout ----
absl::StatusOr<TensorType> InferBroadcastTo(const Node& n, const Types& in) {
  KILN_ASSIGN_OR_RETURN(IntList shape, RequiredInts(n, "shape"));
  KILN_RETURN_IF_ERROR(CheckShape(shape));
  auto b = BroadcastShapes(in[0].shape, shape);
  if (!b.ok() || *b != shape)
    return InvalidArgumentError(
        absl::StrCat("cannot broadcast ", ShapeStr(in[0].shape), " to ", ShapeStr(shape)));
  return Make(in[0].dtype, shape);
}

absl::StatusOr<TensorType> InferReshape(const Node& n, const Types& in) {
  KILN_ASSIGN_OR_RETURN(IntList shape, RequiredInts(n, "shape"));
  int64_t total = in[0].NumElements(), known = 1;
  int infer_at = -1;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer_at >= 0) return InvalidArgumentError("reshape: more than one -1 in shape");
      infer_at = static_cast<int>(i);
    } else if (shape[i] < 0) {
      return InvalidArgumentError(absl::StrCat("reshape: negative dimension in ", ShapeStr(shape)));
    } else {
      overflow |= __builtin_mul_overflow(known, shape[i], &known);
    }
  }
  if (overflow)
    return InvalidArgumentError(
        absl::StrCat("reshape: element count of ", ShapeStr(shape), " overflows int64"));
  if (infer_at >= 0) {
    if (known == 0 || total % known != 0)
      return InvalidArgumentError(absl::StrCat("reshape: cannot infer -1 for ",
                                               ShapeStr(in[0].shape), " -> ", ShapeStr(shape)));
    shape[infer_at] = total / known;
    known = total;
  }
  if (known != total)
    return InvalidArgumentError(absl::StrCat(
        "reshape: element count differs: ", ShapeStr(in[0].shape), " -> ", ShapeStr(shape)));
  return Make(in[0].dtype, shape);
}

absl::StatusOr<TensorType> InferPermute(const Node& n, const Types& in) {
  KILN_ASSIGN_OR_RETURN(IntList dims, RequiredInts(n, "dims"));
  int64_t r = in[0].Rank();
  if (static_cast<int64_t>(dims.size()) != r)
    return InvalidArgumentError(
        absl::StrCat("permute: dims ", ShapeStr(dims), " do not match rank ", r));
  std::vector<bool> seen(r, false);
  Shape out;
  for (int64_t d : dims) {
    int64_t a = d < 0 ? d + r : d;
    if (a < 0 || a >= r || seen[a])
      return InvalidArgumentError(
          absl::StrCat("permute: dims ", ShapeStr(dims), " is not a permutation"));
    seen[a] = true;
    out.push_back(in[0].shape[a]);
  }
  return Make(in[0].dtype, out);
}

absl::StatusOr<TensorType> InferSqueeze(const Node& n, const Types& in) {
  KILN_ASSIGN_OR_RETURN(auto axes_opt, IntsAttr(n, "axes"));
  int64_t r = in[0].Rank();
  std::set<int64_t> drop;
  if (!axes_opt || axes_opt->empty()) {
    for (int64_t i = 0; i < r; ++i)
      if (in[0].shape[i] == 1) drop.insert(i);
  } else {
    KILN_ASSIGN_OR_RETURN(auto axes, NormalizeAxes(*axes_opt, r, false));
    for (int64_t a : axes) {
      if (in[0].shape[a] != 1)
        return InvalidArgumentError(
            absl::StrCat("squeeze: axis ", a, " has size ", in[0].shape[a], ", not 1"));
      drop.insert(a);
    }
  }
  Shape out;
  for (int64_t i = 0; i < r; ++i)
    if (!drop.count(i)) out.push_back(in[0].shape[i]);
  return Make(in[0].dtype, out);
}

absl::StatusOr<TensorType> InferUnsqueeze(const Node& n, const Types& in) {
  KILN_ASSIGN_OR_RETURN(IntList axes_raw, RequiredInts(n, "axes"));
  int64_t r = in[0].Rank() + static_cast<int64_t>(axes_raw.size());
  KILN_ASSIGN_OR_RETURN(auto axes, NormalizeAxes(axes_raw, r, false));
  if (axes.size() != axes_raw.size()) return InvalidArgumentError("unsqueeze: repeated axis");
  Shape out;
  size_t k = 0, a = 0;
  for (int64_t i = 0; i < r; ++i) {
    if (a < axes.size() && axes[a] == i) {
      out.push_back(1);
      ++a;
    } else {
      out.push_back(in[0].shape[k++]);
    }
  }
  return Make(in[0].dtype, out);
}

}  // namespace

// Python slice normalisation: returns (start, length) for a given step.
absl::StatusOr<std::pair<int64_t, int64_t>> NormalizeSlice(int64_t dim, int64_t start, int64_t stop,
                                                           int64_t step) {
  if (step == 0) return InvalidArgumentError("slice: step 0");
  // Beyond +-dim a step takes one element at most; clamping keeps the arithmetic in range.
  step = std::clamp<int64_t>(step, -std::max<int64_t>(dim, 1), std::max<int64_t>(dim, 1));
  auto clamp = [&](int64_t v, int64_t lo, int64_t hi) { return std::min(std::max(v, lo), hi); };
  if (step > 0) {
    start = start < 0 ? clamp(start + dim, 0, dim) : clamp(start, 0, dim);
    stop = stop < 0 ? clamp(stop + dim, 0, dim) : clamp(stop, 0, dim);
    int64_t len = stop > start ? (stop - start + step - 1) / step : 0;
    return std::make_pair(start, len);
  }
  start = start < 0 ? clamp(start + dim, -1, dim - 1) : clamp(start, -1, dim - 1);
  stop = stop < 0 ? clamp(stop + dim, -1, dim - 1) : clamp(stop, -1, dim - 1);
  int64_t len = start > stop ? (start - stop + (-step) - 1) / (-step) : 0;
  return std::make_pair(start, len);
}

namespace {

absl::StatusOr<TensorType> InferSlice(const Node& n, const Types& in) {
  KILN_ASSIGN_OR_RETURN(IntList axes, RequiredInts(n, "axes"));
  KILN_ASSIGN_OR_RETURN(IntList starts, RequiredInts(n, "starts"));
  KILN_ASSIGN_OR_RETURN(IntList stops, RequiredInts(n, "stops"));
  KILN_ASSIGN_OR_RETURN(auto steps_opt, IntsAttr(n, "steps"));
  IntList steps = steps_opt ? *steps_opt : IntList(axes.size(), 1);
  if (starts.size() != axes.size() || stops.size() != axes.size() || steps.size() != axes.size())
    return InvalidArgumentError("slice: axes, starts, stops and steps differ in length");
  int64_t r = in[0].Rank();
  Shape out = in[0].shape;
  std::set<int64_t> seen;
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + r : axes[i];
    if (a < 0 || a >= r)
      return InvalidArgumentError(
          absl::StrCat("slice: axis ", axes[i], " out of range for rank ", r));
    if (!seen.insert(a).second)
      return InvalidArgumentError(absl::StrCat("slice: axis ", a, " repeated"));
    KILN_ASSIGN_OR_RETURN(auto sl, NormalizeSlice(in[0].shape[a], starts[i], stops[i], steps[i]));
    out[a] = sl.second;
  }
  return Make(in[0].dtype, out);
}

absl::StatusOr<TensorType> InferConcat(const Node& n, const Types& in) {
  if (!n.Has("axis")) return InvalidArgumentError("missing attribute 'axis'");
  KILN_RETURN_IF_ERROR(NumberAttrs(n, {"axis"}));
  int64_t r = in[0].Rank();
  int64_t axis = n.Int("axis");
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r)
    return InvalidArgumentError(
        absl::StrCat("concat: axis ", n.Int("axis"), " out of range for rank ", r));
  Shape out = in[0].shape;
  DType t = in[0].dtype;
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i].Rank() != r)
      return InvalidArgumentError(
          absl::StrCat("concat: input ", i, " has rank ", in[i].Rank(), ", expected ", r));
    for (int64_t d = 0; d < r; ++d) {
      if (d != axis && in[i].shape[d] != out[d])
        return InvalidArgumentError(absl::StrCat("concat: input ", i, " shape ",
                                                 ShapeStr(in[i].shape), " differs from ",
                                                 ShapeStr(in[0].shape), " off axis ", axis));
    }
    out[axis] += in[i].shape[axis];
    t = Promote(t, in[i].dtype);
  }
  return Make(t, out);
}

// gather(x, index): NumPy's take_along_axis (see OPS.md).
absl::StatusOr<TensorType> InferGather(const Node& n, const Types& in) {
  if (!n.Has("axis")) return InvalidArgumentError("missing attribute 'axis'");
  KILN_RETURN_IF_ERROR(NumberAttrs(n, {"axis"}));
  const TensorType &x = in[0], &idx = in[1];
  if (!IsInteger(idx.dtype))
    return InvalidArgumentError(
        absl::StrCat("gather: index has dtype ", DTypeName(idx.dtype),
                     " (rule: the index of a gather is an integer tensor)"));
  const int64_t r = x.Rank();
  if (idx.Rank() != r)
    return InvalidArgumentError(absl::StrCat("gather: index has rank ", idx.Rank(), ", x rank ", r,
                                             " (rule: index and x have the same rank)"));
  int64_t axis = n.Int("axis");
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r)
    return InvalidArgumentError(
        absl::StrCat("gather: axis ", n.Int("axis"), " out of range for rank ", r));
  Shape out = idx.shape;
  for (int64_t d = 0; d < r; ++d) {
    if (d == axis || x.shape[d] == idx.shape[d] || x.shape[d] == 1) continue;
    if (idx.shape[d] == 1) {
      out[d] = x.shape[d];
      continue;
    }
    return InvalidArgumentError(absl::StrCat("gather: x ", ShapeStr(x.shape), " and index ",
                                             ShapeStr(idx.shape), " off axis ", axis,
                                             " (rule: off the axis, x and index broadcast)"));
  }
  const bool empty = std::count(out.begin(), out.end(), 0) > 0;
  if (x.shape[axis] == 0 && !empty)
    return InvalidArgumentError(absl::StrCat("gather: axis ", axis, " of x ", ShapeStr(x.shape),
                                             " is empty (rule: there must be an element to read)"));
  return Make(x.dtype, out);
}

// ---- sources ----
absl::StatusOr<TensorType> InferConstant(const Node& n, const Types&) {
  const Constant* c = n.Tensor("value");
  if (!c) return InvalidArgumentError("missing tensor attribute 'value'");
  KILN_RETURN_IF_ERROR(CheckShape(c->shape));
  int64_t want = c->NumElements();
  int64_t have = static_cast<int64_t>(c->f.size() + c->i.size());
  if (have != want || (!c->f.empty() && !c->i.empty()))
    return InvalidArgumentError(
        absl::StrCat("constant: ", have, " values for shape ", ShapeStr(c->shape)));
  if (want > (1 << 20)) return absl::ResourceExhaustedError("constant: more than 2^20 elements");
  for (int64_t v : c->i)
    if (!FitsIntDType(v, c->dtype))
      return InvalidArgumentError(DoesNotFit(static_cast<double>(v), c->dtype));
  return Make(c->dtype, c->shape);
}

absl::StatusOr<TensorType> InferFull(const Node& n, const Types&) {
  KILN_ASSIGN_OR_RETURN(IntList shape, RequiredInts(n, "shape"));
  KILN_RETURN_IF_ERROR(CheckShape(shape));
  KILN_RETURN_IF_ERROR(NumberAttrs(n, {"value"}));
  KILN_RETURN_IF_ERROR(CheckKind(n, "dtype", false, false, false, true));
  DType t = n.Dtype("dtype", DType::kF32);
  if (!IsFloat(t) && !IsBool(t)) {
    // Float values are truncated toward zero (NumPy's cast); the result must fit the dtype.
    double v = std::trunc(n.Float("value"));
    if (!(v >= static_cast<double>(MinOf(t)) && v <= static_cast<double>(MaxOf(t))))
      return InvalidArgumentError(absl::StrCat("full: ", DoesNotFit(n.Float("value"), t)));
  }
  return Make(t, shape);
}

// iota(): `shape` ints; iota(like): `like`'s shape (symbolic sizes follow it; its values are
// never read).
absl::StatusOr<TensorType> InferIota(const Node& n, const Types& in) {
  IntList shape;
  if (in.empty()) {
    KILN_ASSIGN_OR_RETURN(shape, RequiredInts(n, "shape"));
    KILN_RETURN_IF_ERROR(CheckShape(shape));
  } else if (n.Has("shape")) {
    return InvalidArgumentError(
        "iota: both an input and a 'shape' (rule: the shape comes from one of them)");
  } else {
    shape = in[0].shape;
  }
  KILN_RETURN_IF_ERROR(NumberAttrs(n, {"axis"}));
  int64_t r = static_cast<int64_t>(shape.size());
  int64_t axis = n.Int("axis", 0);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r)
    return InvalidArgumentError(
        absl::StrCat("iota: axis ", n.Int("axis"), " out of range for rank ", r));
  return Make(n.Dtype("dtype", DType::kI64), shape);
}

// uniform(seed, like): counter-based random numbers in [0, 1), the shape of `like` (see OPS.md).
absl::StatusOr<TensorType> InferUniform(const Node& n, const Types& in) {
  KILN_RETURN_IF_ERROR(NumberAttrs(n, {"stream"}));
  const TensorType& seed = in[0];
  if (!IsInteger(seed.dtype) || seed.NumElements() != 1)
    return InvalidArgumentError(
        absl::StrCat("uniform: seed is ", DTypeName(seed.dtype), ShapeStr(seed.shape),
                     " (rule: the seed is an integer tensor of one element)"));
  const DType t = n.Dtype("dtype", DType::kF32);
  if (!IsFloat(t))
    return InvalidArgumentError(
        absl::StrCat("uniform: dtype ", DTypeName(t), " (rule: uniform numbers are floats)"));
  const int64_t stream = n.Int("stream", 0);
  if (stream < 0 || stream > 0xFFFFFFFFll)
    return InvalidArgumentError(
        absl::StrCat("uniform: stream ", stream, " (rule: a stream is in [0, 2^32))"));
  return Make(t, in[1].shape);
}

// ---- reductions ----
absl::StatusOr<Shape> ReducedShape(const Node& n, const TensorType& x,
                                   std::vector<int64_t>* axes_out) {
  KILN_ASSIGN_OR_RETURN(auto axes_opt, IntsAttr(n, "axes"));
  KILN_RETURN_IF_ERROR(CheckKind(n, "keepdim", false, true, false, false));
  KILN_ASSIGN_OR_RETURN(auto axes, NormalizeAxes(axes_opt ? *axes_opt : IntList{}, x.Rank(), true));
  bool keep = n.Bool("keepdim");
  Shape out;
  for (int64_t i = 0; i < x.Rank(); ++i) {
    bool red = std::binary_search(axes.begin(), axes.end(), i);
    if (!red)
      out.push_back(x.shape[i]);
    else if (keep)
      out.push_back(1);
  }
  if (axes_out) *axes_out = axes;
  return out;
}

enum class ReduceRule { kSum, kFloat, kBool, kExtremum };
InferFn Reduce(ReduceRule rule) {
  return [rule](const Node& n, const Types& in) -> absl::StatusOr<TensorType> {
    std::vector<int64_t> axes;
    KILN_ASSIGN_OR_RETURN(Shape s, ReducedShape(n, in[0], &axes));
    KILN_RETURN_IF_ERROR(NumberAttrs(n, {"correction"}));
    DType t = in[0].dtype;
    switch (rule) {
      case ReduceRule::kSum:
        return Make(SumResult(t), s);
      case ReduceRule::kFloat:
        return Make(FloatResult(t), s);
      case ReduceRule::kBool:
        return Make(DType::kBool, s);
      case ReduceRule::kExtremum:
        for (int64_t a : axes)
          if (in[0].shape[a] == 0)
            return InvalidArgumentError(
                absl::StrCat(n.op, ": reduction over empty axis ", a,
                             " (rule: max/min of an empty axis is undefined, as in NumPy)"));
        return Make(t, s);
    }
    return InvalidArgumentError("bad reduce rule");
  };
}

absl::StatusOr<TensorType> InferArgReduce(const Node& n, const Types& in) {
  KILN_RETURN_IF_ERROR(NumberAttrs(n, {"axis"}));
  KILN_RETURN_IF_ERROR(CheckKind(n, "keepdim", false, true, false, false));
  const TensorType& x = in[0];
  bool keep = n.Bool("keepdim");
  if (!n.Has("axis")) {
    if (x.NumElements() == 0) return InvalidArgumentError(absl::StrCat(n.op, ": empty input"));
    return Make(DType::kI64, keep ? Shape(x.Rank(), 1) : Shape{});
  }
  int64_t axis = n.Int("axis");
  if (axis < 0) axis += x.Rank();
  if (axis < 0 || axis >= x.Rank())
    return InvalidArgumentError(
        absl::StrCat(n.op, ": axis ", n.Int("axis"), " out of range for rank ", x.Rank()));
  if (x.shape[axis] == 0)
    return InvalidArgumentError(
        absl::StrCat(n.op, ": reduction over empty axis ", axis,
                     " (rule: argmax/argmin of an empty axis is undefined, as in NumPy)"));
  Shape out;
  for (int64_t i = 0; i < x.Rank(); ++i) {
    if (i != axis)
      out.push_back(x.shape[i]);
    else if (keep)
      out.push_back(1);
  }
  return Make(DType::kI64, out);
}

// ---- composites ----
absl::StatusOr<TensorType> InferAxisFloat(const Node& n, const Types& in) {
  KILN_RETURN_IF_ERROR(NumberAttrs(n, {"axis"}));
  int64_t r = in[0].Rank();
  int64_t axis = n.Int("axis", -1);
  if (axis < -r || axis >= r || r == 0)
    return InvalidArgumentError(absl::StrCat(n.op, ": axis ", axis, " out of range for rank ", r));
  return Make(FloatResult(in[0].dtype), in[0].shape);
}

absl::StatusOr<TensorType> InferFloatSame(const Node& n, const Types& in) {
  KILN_RETURN_IF_ERROR(NumberAttrs(
      n, {"alpha", "beta", "threshold", "negative_slope", "min_val", "max_val", "min", "max"}));
  if (n.op == "gelu") {
    KILN_RETURN_IF_ERROR(CheckKind(n, "approximate", false, false, true, false));
    std::string a = n.Str("approximate", "none");
    if (a != "none" && a != "tanh")
      return InvalidArgumentError(
          absl::StrCat("gelu: approximate must be 'none' or 'tanh', got '", a, "'"));
  }
  return Make(FloatResult(in[0].dtype), in[0].shape);
}

absl::StatusOr<TensorType> InferLayerNorm(const Node& n, const Types& in) {
  KILN_RETURN_IF_ERROR(NumberAttrs(n, {"eps"}));
  KILN_ASSIGN_OR_RETURN(auto axes_opt, IntsAttr(n, "axes"));
  KILN_ASSIGN_OR_RETURN(auto axes,
                        NormalizeAxes(axes_opt ? *axes_opt : IntList{-1}, in[0].Rank(), false));
  if (axes.empty()) return InvalidArgumentError("layer_norm: no axes");
  Shape norm_shape;
  for (int64_t a : axes) norm_shape.push_back(in[0].shape[a]);
  DType t = in[0].dtype;
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i].shape != norm_shape)
      return InvalidArgumentError(absl::StrCat("layer_norm: ", i == 1 ? "weight" : "bias",
                                               " shape ", ShapeStr(in[i].shape), " must be ",
                                               ShapeStr(norm_shape)));
    t = Promote(t, in[i].dtype);
  }
  return Make(FloatResult(t), in[0].shape);
}

absl::StatusOr<TensorType> InferReduceFloat(const Node& n, const Types& in) {
  KILN_RETURN_IF_ERROR(NumberAttrs(n, {"ord"}));
  if (n.op == "norm") {
    double p = n.Float("ord", 2);
    if (p != 1 && p != 2 && !std::isinf(p))
      return InvalidArgumentError(absl::StrCat("norm: ord must be 1, 2 or inf, got ", p));
  }
  std::vector<int64_t> axes;
  KILN_ASSIGN_OR_RETURN(Shape s, ReducedShape(n, in[0], &axes));
  if (n.op == "norm" && std::isinf(n.Float("ord", 2)))
    for (int64_t a : axes)
      if (in[0].shape[a] == 0)
        return InvalidArgumentError(
            absl::StrCat("norm: ord=inf over empty axis ", a,
                         " (rule: max/min of an empty axis is undefined, as in NumPy)"));
  return Make(FloatResult(in[0].dtype), s);
}

absl::StatusOr<TensorType> InferMatmul(const Node&, const Types& in) {
  const Shape &a = in[0].shape, &b = in[1].shape;
  if (a.size() < 2 || b.size() < 2)
    return InvalidArgumentError("matmul: inputs must have rank >= 2");
  if (a.back() != b[b.size() - 2])
    return InvalidArgumentError(
        absl::StrCat("matmul: inner dimensions differ: ", ShapeStr(a), " @ ", ShapeStr(b)));
  KILN_ASSIGN_OR_RETURN(
      Shape batch, BroadcastShapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2)));
  batch.push_back(a[a.size() - 2]);
  batch.push_back(b.back());
  return Make(Promote(in[0].dtype, in[1].dtype), batch);
}

absl::StatusOr<TensorType> InferConv2d(const Node&, const Types& in) {
  const Shape &x = in[0].shape, &w = in[1].shape;
  if (x.size() != 4 || w.size() != 4 || x[1] != w[1] || x[2] < w[2] || x[3] < w[3])
    return InvalidArgumentError(
        "conv2d: expects NCHW input and OIHW weight with matching channels");
  return Make(Promote(in[0].dtype, in[1].dtype), {x[0], w[0], x[2] - w[2] + 1, x[3] - w[3] + 1});
}

// The attributes of every op (OPS.md documents them); ops not listed take none.
void SetAttributes(std::unordered_map<std::string, OpSchema>* r) {
  using A = AttrKind;
  struct Entry {
    std::vector<const char*> ops;
    std::vector<AttrSpec> attrs;
  };
  const std::vector<AttrSpec> reduce = {{"axes", A::kInts}, {"keepdim", A::kBool}};
  const Entry table[] = {
      {{"clamp", "clip"}, {{"min", A::kFloat}, {"max", A::kFloat}}},
      {{"cast"}, {{"dtype", A::kDType}}},
      {{"broadcast_to", "reshape"}, {{"shape", A::kInts}}},
      {{"permute"}, {{"dims", A::kInts}}},
      {{"squeeze", "unsqueeze"}, {{"axes", A::kInts}}},
      {{"slice"},
       {{"axes", A::kInts}, {"starts", A::kInts}, {"stops", A::kInts}, {"steps", A::kInts}}},
      {{"concat", "gather"}, {{"axis", A::kInt}}},
      {{"constant"}, {{"value", A::kTensor}}},
      {{"full"}, {{"shape", A::kInts}, {"value", A::kFloat}, {"dtype", A::kDType}}},
      {{"iota"}, {{"shape", A::kInts}, {"axis", A::kInt}, {"dtype", A::kDType}}},
      {{"uniform"}, {{"dtype", A::kDType}, {"stream", A::kInt}}},
      {{"sum", "prod", "max", "min", "any", "all", "mean", "logsumexp"}, reduce},
      {{"var", "std"}, {{"axes", A::kInts}, {"keepdim", A::kBool}, {"correction", A::kFloat}}},
      {{"norm"}, {{"axes", A::kInts}, {"keepdim", A::kBool}, {"ord", A::kFloat}}},
      {{"argmax", "argmin"}, {{"axis", A::kInt}, {"keepdim", A::kBool}}},
      {{"softmax", "log_softmax"}, {{"axis", A::kInt}}},
      {{"layer_norm"}, {{"axes", A::kInts}, {"eps", A::kFloat}}},
      {{"gelu"}, {{"approximate", A::kStr}}},
      {{"elu"}, {{"alpha", A::kFloat}}},
      {{"softplus"}, {{"beta", A::kFloat}, {"threshold", A::kFloat}}},
      {{"leaky_relu"}, {{"negative_slope", A::kFloat}}},
      {{"hardtanh"}, {{"min_val", A::kFloat}, {"max_val", A::kFloat}}},
  };
  for (const Entry& e : table)
    for (const char* op : e.ops) r->at(op).attrs = e.attrs;
}

bool HoldsKind(const AttrValue& v, AttrKind kind) {
  switch (kind) {
    case AttrKind::kInt:
      return std::holds_alternative<int64_t>(v);
    case AttrKind::kFloat:
      return std::holds_alternative<int64_t>(v) || std::holds_alternative<double>(v);
    case AttrKind::kBool:
      return std::holds_alternative<bool>(v) || std::holds_alternative<int64_t>(v);
    case AttrKind::kStr:
      return std::holds_alternative<std::string>(v);
    case AttrKind::kDType:
      return std::holds_alternative<DType>(v);
    case AttrKind::kInts:
      return std::holds_alternative<IntList>(v) || std::holds_alternative<int64_t>(v);
    case AttrKind::kTensor:
      return std::holds_alternative<Constant>(v);
  }
  return false;
}

// Unknown attributes and attributes of the wrong kind, before the op's type rule reads them.
absl::Status CheckAttributes(const Node& n, const OpSchema& schema) {
  for (const auto& [key, value] : n.attrs) {
    const AttrSpec* spec = nullptr;
    for (const AttrSpec& a : schema.attrs)
      if (a.name == key) spec = &a;
    if (!spec) {
      std::vector<std::string> known;
      for (const AttrSpec& a : schema.attrs) known.push_back(a.name);
      return InvalidArgumentError(absl::StrCat(
          "unknown attribute '", key, "' for op '", n.op, "' (rule: only documented attributes; ",
          known.empty() ? std::string("it takes none")
                        : absl::StrCat("it takes: ", absl::StrJoin(known, ", ")),
          ")"));
    }
    if (!HoldsKind(value, spec->kind))
      return InvalidArgumentError(absl::StrCat("attribute '", key, "' of op '", n.op, "' must be ",
                                               AttrKindName(spec->kind),
                                               " (rule: attribute kind)"));
  }
  return absl::OkStatus();
}

std::unordered_map<std::string, OpSchema> BuildRegistry() {
  std::unordered_map<std::string, OpSchema> r;
  auto add = [&](const std::string& name, OpKind kind, int lo, int hi, InferFn fn) {
    r[name] = OpSchema{name, kind, lo, hi, {}, std::move(fn)};
  };
  using K = OpKind;
  // The elementwise ops and reductions whose type is a rule of the table (op_table.def).
#define KILN_UNARY(name, rule) add(#name, K::kElementwise, 1, 1, Unary(UnaryRule::k##rule));
#define KILN_BINARY(name, rule) add(#name, K::kElementwise, 2, 2, Binary(BinaryRule::k##rule));
#define KILN_REDUCTION(name, kind, rule) add(#name, K::k##kind, 1, 1, Reduce(ReduceRule::k##rule));
#include "kernels/ir/op_table.def"
  add("where", K::kElementwise, 3, 3, InferWhere);
  add("clamp", K::kElementwise, 1, 1, InferClamp);
  add("cast", K::kElementwise, 1, 1, InferCast);

  add("broadcast_to", K::kLayout, 1, 1, InferBroadcastTo);
  add("reshape", K::kLayout, 1, 1, InferReshape);
  add("permute", K::kLayout, 1, 1, InferPermute);
  add("squeeze", K::kLayout, 1, 1, InferSqueeze);
  add("unsqueeze", K::kLayout, 1, 1, InferUnsqueeze);
  add("slice", K::kLayout, 1, 1, InferSlice);
  add("concat", K::kLayout, 1, -1, InferConcat);
  add("gather", K::kLayout, 2, 2, InferGather);

  add("constant", K::kSource, 0, 0, InferConstant);
  add("full", K::kSource, 0, 0, InferFull);
  add("iota", K::kSource, 0, 1, InferIota);
  add("uniform", K::kSource, 2, 2, InferUniform);

  for (const char* op : {"argmax", "argmin"}) add(op, K::kReduction, 1, 1, InferArgReduce);

  for (const char* op : {"softmax", "log_softmax"}) add(op, K::kComposite, 1, 1, InferAxisFloat);
  for (const char* op : {"logsumexp", "norm"}) add(op, K::kComposite, 1, 1, InferReduceFloat);
  add("layer_norm", K::kComposite, 1, 3, InferLayerNorm);
  for (const char* op : {"gelu", "elu", "silu", "softplus"})
    add(op, K::kComposite, 1, 1, InferFloatSame);
  for (const char* op : {"relu", "leaky_relu", "hardtanh", "clip"})
    add(op, K::kComposite, 1, 1, [](const Node& n, const Types& in) -> absl::StatusOr<TensorType> {
      KILN_RETURN_IF_ERROR(NumberAttrs(n, {"negative_slope", "min_val", "max_val", "min", "max"}));
      if (n.op == "leaky_relu" && !IsFloat(in[0].dtype))
        return Make(FloatResult(in[0].dtype), in[0].shape);
      return Make(in[0].dtype, in[0].shape);
    });

  add("matmul", K::kExtern, 2, 2, InferMatmul);
  add("conv2d", K::kExtern, 2, 2, InferConv2d);
  SetAttributes(&r);
  return r;
}

const std::unordered_map<std::string, OpSchema>& Registry() {
  static const auto* registry = new std::unordered_map<std::string, OpSchema>(BuildRegistry());
  return *registry;
}

absl::Status CheckTensorType(const TensorType& t, const Limits& limits, std::string* why) {
  if (t.Rank() > limits.max_rank) {
    *why =
        absl::StrCat("rank ", t.Rank(), " exceeds the limit of ", limits.max_rank, " (max_rank)");
    return absl::ResourceExhaustedError("");
  }
  int64_t n = 1;
  for (int64_t d : t.shape) {
    if (d < 0) {
      *why = absl::StrCat("negative dimension in shape ", ShapeStr(t.shape));
      return InvalidArgumentError("");
    }
    if (__builtin_mul_overflow(n, d, &n)) {
      *why = absl::StrCat("element count of shape ", ShapeStr(t.shape), " overflows int64");
      return InvalidArgumentError("");
    }
  }
  // An empty tensor's other dimensions are bounded too: sums and products of dimensions
  // (concat, reshape, loop trip counts) must not overflow.
  for (int64_t d : t.shape)
    if (n == 0 && d > limits.max_elements) {
      *why = absl::StrCat("dimension ", d, " of shape ", ShapeStr(t.shape),
                          " is over the limit of ", limits.max_elements, " (max_elements)");
      return absl::ResourceExhaustedError("");
    }
  if (n > limits.max_elements) {
    *why = absl::StrCat("shape ", ShapeStr(t.shape), " has ", n, " elements, over the limit of ",
                        limits.max_elements, " (max_elements)");
    return absl::ResourceExhaustedError("");
  }
  if (!t.strides.empty() && t.strides.size() != t.shape.size()) {
    *why = absl::StrCat("strides ", ShapeStr(t.strides), " do not match rank ", t.Rank());
    return InvalidArgumentError("");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      return InvalidArgumentError(
          absl::StrCat("broadcast mismatch: ", ShapeStr(a), " vs ", ShapeStr(b)));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> NormalizeAxes(const IntList& axes, int64_t rank,
                                                   bool empty_means_all) {
  std::vector<int64_t> out;
  if (axes.empty() && empty_means_all) {
    out.resize(rank);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  for (int64_t a : axes) {
    int64_t x = a < 0 ? a + rank : a;
    if (x < 0 || x >= rank)
      return InvalidArgumentError(absl::StrCat("axis ", a, " out of range for rank ", rank));
    out.push_back(x);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

const char* AttrKindName(AttrKind kind) {
  switch (kind) {
    case AttrKind::kInt:
      return "an int";
    case AttrKind::kFloat:
      return "a number";
    case AttrKind::kBool:
      return "a bool";
    case AttrKind::kStr:
      return "a string";
    case AttrKind::kDType:
      return "a dtype";
    case AttrKind::kInts:
      return "a list of ints";
    case AttrKind::kTensor:
      return "a tensor";
  }
  return "?";
}

const OpSchema* FindOp(const std::string& name) {
  auto it = Registry().find(name);
  return it == Registry().end() ? nullptr : &it->second;
}

std::vector<std::string> AllOps() {
  std::vector<std::string> v;
  for (const auto& [k, _] : Registry()) v.push_back(k);
  std::sort(v.begin(), v.end());
  return v;
}

absl::Status VerifyAndInfer(Graph& g, const Limits& limits) {
  if (static_cast<int64_t>(g.nodes.size()) > limits.max_nodes)
    return absl::ResourceExhaustedError(absl::StrCat("graph has ", g.nodes.size(),
                                                     " nodes, over the limit of ", limits.max_nodes,
                                                     " (max_nodes)"));
  if (g.outputs.empty()) return InvalidArgumentError("graph has no outputs");
  g.input_names.resize(g.inputs.size());
  std::string why;
  for (int i = 0; i < g.num_inputs(); ++i) {
    absl::Status s = CheckTensorType(g.inputs[i], limits, &why);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(g.Describe(i), ": ", why));
  }
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    Node& n = g.nodes[k];
    ValueId self = g.num_inputs() + static_cast<ValueId>(k);
    auto fail = [&](absl::StatusCode code, const std::string& msg) {
      return absl::Status(code, absl::StrCat(g.Describe(self), ": ", msg));
    };
    const OpSchema* schema = FindOp(n.op);
    if (!schema)
      return fail(absl::StatusCode::kInvalidArgument, absl::StrCat("unknown op '", n.op, "'"));
    int argc = static_cast<int>(n.inputs.size());
    if (argc < schema->min_inputs || (schema->max_inputs >= 0 && argc > schema->max_inputs)) {
      std::string want = schema->max_inputs < 0 ? absl::StrCat("at least ", schema->min_inputs)
                         : schema->min_inputs == schema->max_inputs
                             ? absl::StrCat(schema->min_inputs)
                             : absl::StrCat(schema->min_inputs, " to ", schema->max_inputs);
      return fail(absl::StatusCode::kInvalidArgument,
                  absl::StrCat("wrong arity: takes ", want, " inputs, got ", argc));
    }
    Types in;
    for (ValueId v : n.inputs) {
      if (v < 0 || v >= g.num_values())
        return fail(absl::StatusCode::kInvalidArgument, absl::StrCat("uses undefined value ", v));
      if (v >= self)
        return fail(absl::StatusCode::kInvalidArgument,
                    absl::StrCat("uses value ", v,
                                 " before it is defined (nodes must be in topological order; "
                                 "cycles are not allowed)"));
      in.push_back(g.TypeOf(v));
    }
    if (absl::Status a = CheckAttributes(n, *schema); !a.ok())
      return fail(a.code(), std::string(a.message()));
    auto t = schema->infer(n, in);
    if (!t.ok()) return fail(t.status().code(), std::string(t.status().message()));
    absl::Status s = CheckTensorType(*t, limits, &why);
    if (!s.ok()) return fail(s.code(), why);
    n.type = *std::move(t);
  }
  for (ValueId v : g.outputs)
    if (v < 0 || v >= g.num_values())
      return InvalidArgumentError(absl::StrCat("graph output names undefined value ", v));
  return absl::OkStatus();
}

}  // namespace kiln::ir
