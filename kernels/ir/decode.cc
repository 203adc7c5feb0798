#include "kernels/ir/decode.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "kernels/ir/symbols.h"
#include "kernels/util/status_macros.h"

namespace kiln::ir {
namespace {

using absl::InvalidArgumentError;

absl::StatusOr<DType> DecodeDType(int wire, const std::string& where) {
  auto t = DTypeFromWire(wire);
  if (!t) return InvalidArgumentError(absl::StrCat(where, ": unknown or unset dtype ", wire));
  return *t;
}

absl::StatusOr<AttrValue> DecodeAttr(const v1::AttrValue& a, const std::string& where) {
  switch (a.value_case()) {
    case v1::AttrValue::kI:
      return AttrValue(int64_t{a.i()});
    case v1::AttrValue::kF:
      return AttrValue(a.f());
    case v1::AttrValue::kS:
      return AttrValue(a.s());
    case v1::AttrValue::kB:
      return AttrValue(a.b());
    case v1::AttrValue::kDtype: {
      KILN_ASSIGN_OR_RETURN(DType t, DecodeDType(a.dtype(), where));
      return AttrValue(t);
    }
    case v1::AttrValue::kInts:
      return AttrValue(IntList(a.ints().values().begin(), a.ints().values().end()));
    case v1::AttrValue::kFloats:
      return AttrValue(FloatList(a.floats().values().begin(), a.floats().values().end()));
    case v1::AttrValue::kTensor: {
      Constant c;
      KILN_ASSIGN_OR_RETURN(c.dtype, DecodeDType(a.tensor().dtype(), where));
      c.shape.assign(a.tensor().shape().begin(), a.tensor().shape().end());
      int64_t count = 1;
      for (int64_t d : c.shape) {
        if (d < 0 || d > (1 << 20))
          return InvalidArgumentError(absl::StrCat(where, ": bad constant shape"));
        count *= d;  // at most 2^20 per step, so it cannot overflow before the check below
        if (count > (1 << 20))
          return absl::ResourceExhaustedError(
              absl::StrCat(where, ": constant has more than 2^20 elements"));
      }
      if (IsFloat(c.dtype)) {
        c.f.assign(a.tensor().float_values().begin(), a.tensor().float_values().end());
        for (int64_t v : a.tensor().int_values()) c.f.push_back(static_cast<double>(v));
      } else {
        c.i.assign(a.tensor().int_values().begin(), a.tensor().int_values().end());
        // Float values of an integer constant are truncated toward zero (NumPy's cast);
        // ones no integer holds are refused here, before any conversion.
        for (double v : a.tensor().float_values()) {
          if (!(v > -0x1p63 && v < 0x1p63))
            return InvalidArgumentError(
                absl::StrCat(where, ": value ", v, " does not fit ", DTypeName(c.dtype),
                             " (rule: integer constants must fit their dtype)"));
          c.i.push_back(static_cast<int64_t>(v));
        }
        if (IsBool(c.dtype))
          for (int64_t& v : c.i) v = v != 0;
      }
      return AttrValue(std::move(c));
    }
    case v1::AttrValue::VALUE_NOT_SET:
      break;
  }
  return InvalidArgumentError(absl::StrCat(where, ": attribute has no value"));
}

// Symbol names of one input -> ids in `g.symbols` (numbered by first appearance).
absl::Status DecodeSymbols(const v1::TensorType& wire, const std::string& where, TensorType& t,
                           Graph& g) {
  if (wire.dim_symbols_size() == 0) return absl::OkStatus();
  if (wire.dim_symbols_size() != wire.shape_size())
    return InvalidArgumentError(absl::StrCat(where, ": ", wire.dim_symbols_size(),
                                             " dim_symbols for rank ", wire.shape_size(),
                                             " (rule: one entry per dimension)"));
  bool any = false;
  for (const std::string& name : wire.dim_symbols()) {
    if (name.empty()) {
      t.dim_symbols.push_back(-1);
      continue;
    }
    const bool ok_name =
        name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/';
        });
    if (!ok_name)
      return InvalidArgumentError(
          absl::StrCat(where, ": bad symbol name '", name.substr(0, 64),
                       "' (rule: letters, digits, _ . /, at most 64 characters)"));
    auto it = std::find(g.symbols.begin(), g.symbols.end(), name);
    if (it == g.symbols.end()) {
      if (static_cast<int>(g.symbols.size()) == kMaxSymbols)
        return InvalidArgumentError(absl::StrCat(where, ": symbol '", name,
                                                 "' is one too many (rule: at most ", kMaxSymbols,
                                                 " distinct symbolic sizes per graph)"));
      g.symbols.push_back(name);
      it = g.symbols.end() - 1;
    }
    t.dim_symbols.push_back(static_cast<int32_t>(it - g.symbols.begin()));
    any = true;
  }
  if (!any) {
    t.dim_symbols.clear();
    return absl::OkStatus();
  }
  if (!t.strides.empty())
    return InvalidArgumentError(
        absl::StrCat(where, ": declared strides on an input with symbolic dimensions",
                     " (rule: symbolic inputs are contiguous)"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Graph> DecodeGraph(const v1::Graph& wire, const Limits& limits) {
  if (wire.nodes_size() > limits.max_nodes)
    return absl::ResourceExhaustedError(absl::StrCat("graph has ", wire.nodes_size(),
                                                     " nodes, over the limit of ", limits.max_nodes,
                                                     " (max_nodes)"));
  if (wire.nodes_size() == 0 && wire.outputs_size() == 0)
    return InvalidArgumentError("empty graph: no nodes and no outputs");
  Graph g;
  for (int i = 0; i < wire.inputs_size(); ++i) {
    const v1::Input& in = wire.inputs(i);
    TensorType t;
    std::string where =
        absl::StrCat("input ", i, in.name().empty() ? "" : absl::StrCat(" ('", in.name(), "')"));
    KILN_ASSIGN_OR_RETURN(t.dtype, DecodeDType(in.type().dtype(), where));
    t.shape.assign(in.type().shape().begin(), in.type().shape().end());
    t.strides.assign(in.type().strides().begin(), in.type().strides().end());
    KILN_RETURN_IF_ERROR(DecodeSymbols(in.type(), where, t, g));
    g.inputs.push_back(std::move(t));
    g.input_names.push_back(in.name());
  }
  for (int k = 0; k < wire.nodes_size(); ++k) {
    const v1::Node& wn = wire.nodes(k);
    Node n;
    n.op = wn.op();
    n.name = wn.name();
    n.inputs.assign(wn.inputs().begin(), wn.inputs().end());
    std::string where =
        absl::StrCat("node ", k, " (", wn.op(),
                     wn.name().empty() ? "" : absl::StrCat(" '", wn.name(), "'"), ")");
    for (const auto& [key, val] : wn.attrs()) {
      auto a = DecodeAttr(val, absl::StrCat(where, " attribute '", key, "'"));
      if (!a.ok()) return a.status();
      n.attrs.emplace(key, *std::move(a));
    }
    g.nodes.push_back(std::move(n));
  }
  g.outputs.assign(wire.outputs().begin(), wire.outputs().end());
  if (!g.is_symbolic()) {
    KILN_RETURN_IF_ERROR(VerifyAndInfer(g, limits));
    return g;
  }
  // Verified at the first sample; a rule that fails names the symbol, not the sample value.
  SetSymbolSizes(g, FirstSample(g));
  absl::Status st = VerifyAndInfer(g, SymbolicLimits(limits));
  if (!st.ok()) return absl::Status(st.code(), NameSymbols(st.message(), g));
  return g;
}

namespace {
const char* const kIsaLevels[] = {"x86-64-v2", "x86-64-v3", "x86-64-v4"};
const char* const kKnownFeatures[] = {
    "sse4.1",   "sse4.2",   "popcnt",     "avx",        "avx2",      "fma",      "bmi",
    "bmi2",     "f16c",     "lzcnt",      "movbe",      "avx512f",   "avx512bw", "avx512dq",
    "avx512vl", "avx512cd", "avx512vnni", "avx512bf16", "avx512fp16"};
const int kKnownSms[] = {50, 52, 53, 60, 61,  62,  70,  72,  75, 80,
                         86, 87, 89, 90, 100, 103, 110, 120, 121};
}  // namespace

absl::StatusOr<Target> DecodeTarget(const v1::Target& wire) {
  Target t;
  switch (wire.kind_case()) {
    case v1::Target::kCpu: {
      t.kind = Target::Kind::kCpu;
      t.isa = wire.cpu().isa();
      t.features.assign(wire.cpu().features().begin(), wire.cpu().features().end());
      std::sort(t.features.begin(), t.features.end());
      t.features.erase(std::unique(t.features.begin(), t.features.end()), t.features.end());
      if (t.isa.empty() && t.features.empty()) t.isa = "x86-64-v2";
      if (!t.isa.empty() && !t.features.empty())
        return InvalidArgumentError(
            "target: give either a cpu isa level or a feature list, not both");
      if (!t.isa.empty() &&
          std::find(std::begin(kIsaLevels), std::end(kIsaLevels), t.isa) == std::end(kIsaLevels))
        return InvalidArgumentError(absl::StrCat("target: unknown cpu isa '", t.isa,
                                                 "' (known: x86-64-v2, x86-64-v3, x86-64-v4)"));
      for (const std::string& f : t.features)
        if (std::find(std::begin(kKnownFeatures), std::end(kKnownFeatures), f) ==
            std::end(kKnownFeatures))
          return InvalidArgumentError(absl::StrCat("target: unknown cpu feature '", f, "'"));
      return t;
    }
    case v1::Target::kCuda: {
      t.kind = Target::Kind::kCuda;
      t.isa.clear();
      t.sm = wire.cuda().sm();
      if (std::find(std::begin(kKnownSms), std::end(kKnownSms), t.sm) == std::end(kKnownSms))
        return InvalidArgumentError(absl::StrCat("target: unknown cuda arch sm_", t.sm));
      return t;
    }
    case v1::Target::KIND_NOT_SET:
      break;
  }
  return InvalidArgumentError("target: not set (cpu or cuda)");
}

CompileOptions DecodeOptions(const v1::CompileOptions& wire) {
  CompileOptions o;
  if (wire.opt_level_set()) o.opt_level = std::clamp(wire.opt_level(), 0, 3);
  o.vector_math = !wire.disable_vector_math();
  o.algebraic_rewrites = !wire.disable_algebraic_rewrites();
  o.variant = std::max(wire.variant(), 0);
  return o;
}

v1::Graph EncodeGraph(const Graph& g) {
  v1::Graph w;
  for (int i = 0; i < g.num_inputs(); ++i) {
    v1::Input* in = w.add_inputs();
    if (i < static_cast<int>(g.input_names.size())) in->set_name(g.input_names[i]);
    in->mutable_type()->set_dtype(static_cast<v1::DType>(g.inputs[i].dtype));
    for (int64_t d : g.inputs[i].shape) in->mutable_type()->add_shape(d);
    for (int64_t s : g.inputs[i].strides) in->mutable_type()->add_strides(s);
    for (int32_t k : g.inputs[i].dim_symbols)
      in->mutable_type()->add_dim_symbols(k >= 0 ? g.symbols[k] : "");
  }
  for (const Node& n : g.nodes) {
    v1::Node* wn = w.add_nodes();
    wn->set_op(n.op);
    wn->set_name(n.name);
    for (ValueId v : n.inputs) wn->add_inputs(v);
    for (const auto& [key, val] : n.attrs) {
      v1::AttrValue& a = (*wn->mutable_attrs())[key];
      if (auto* p = std::get_if<int64_t>(&val))
        a.set_i(*p);
      else if (auto* p = std::get_if<double>(&val))
        a.set_f(*p);
      else if (auto* p = std::get_if<std::string>(&val))
        a.set_s(*p);
      else if (auto* p = std::get_if<bool>(&val))
        a.set_b(*p);
      else if (auto* p = std::get_if<DType>(&val))
        a.set_dtype(static_cast<v1::DType>(*p));
      else if (auto* p = std::get_if<IntList>(&val)) {
        v1::IntList* l = a.mutable_ints();  // set even when empty: an empty list is a value
        for (int64_t x : *p) l->add_values(x);
      } else if (auto* p = std::get_if<FloatList>(&val)) {
        v1::FloatList* l = a.mutable_floats();
        for (double x : *p) l->add_values(x);
      } else if (auto* p = std::get_if<Constant>(&val)) {
        v1::TensorValue* t = a.mutable_tensor();
        t->set_dtype(static_cast<v1::DType>(p->dtype));
        for (int64_t d : p->shape) t->add_shape(d);
        for (double x : p->f) t->add_float_values(x);
        for (int64_t x : p->i) t->add_int_values(x);
      }
    }
  }
  for (ValueId v : g.outputs) w.add_outputs(v);
  return w;
}

v1::Target EncodeTarget(const Target& t) {
  v1::Target w;
  if (t.is_cuda()) {
    w.mutable_cuda()->set_sm(t.sm);
  } else {
    w.mutable_cpu()->set_isa(t.isa);
    for (const std::string& f : t.features) w.mutable_cpu()->add_features(f);
  }
  return w;
}

}  // namespace kiln::ir
