#include "kernels/ir/graph.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::ir {
namespace {

int64_t Product(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string AttrToString(const AttrValue& v) {
  struct Visitor {
    std::string operator()(int64_t x) const { return absl::StrCat(x); }
    std::string operator()(double x) const { return absl::StrCat(x); }
    std::string operator()(const std::string& x) const { return absl::StrCat("\"", x, "\""); }
    std::string operator()(bool x) const { return x ? "true" : "false"; }
    std::string operator()(DType x) const { return std::string(DTypeName(x)); }
    std::string operator()(const IntList& x) const {
      return absl::StrCat("[", absl::StrJoin(x, ","), "]");
    }
    std::string operator()(const FloatList& x) const {
      return absl::StrCat("[", absl::StrJoin(x, ","), "]");
    }
    std::string operator()(const Constant& c) const {
      std::string s = absl::StrCat(DTypeName(c.dtype), "[", absl::StrJoin(c.shape, ","), "]{");
      int64_t n = c.NumElements();
      for (int64_t k = 0; k < n && k < 8; ++k) absl::StrAppend(&s, k ? "," : "", c.AsDouble(k));
      if (n > 8) absl::StrAppend(&s, ",...");
      return s + "}";
    }
  };
  return std::visit(Visitor{}, v);
}

}  // namespace

int64_t TensorType::NumElements() const { return Product(shape); }

std::string TensorType::ToString() const {
  std::vector<std::string> dims;
  for (size_t d = 0; d < shape.size(); ++d)
    dims.push_back(d < dim_symbols.size() && dim_symbols[d] >= 0 ? absl::StrCat("$", dim_symbols[d])
                                                                 : absl::StrCat(shape[d]));
  std::string s = absl::StrCat(DTypeName(dtype), "[", absl::StrJoin(dims, ","), "]");
  if (!strides.empty()) absl::StrAppend(&s, "{", absl::StrJoin(strides, ","), "}");
  return s;
}

int64_t Constant::NumElements() const { return Product(shape); }

int64_t Node::Int(const std::string& key, int64_t dflt) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return dflt;
  if (auto* p = std::get_if<int64_t>(&it->second)) return *p;
  if (auto* p = std::get_if<double>(&it->second)) return static_cast<int64_t>(*p);
  if (auto* p = std::get_if<bool>(&it->second)) return *p;
  return dflt;
}

double Node::Float(const std::string& key, double dflt) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return dflt;
  if (auto* p = std::get_if<double>(&it->second)) return *p;
  if (auto* p = std::get_if<int64_t>(&it->second)) return static_cast<double>(*p);
  return dflt;
}

bool Node::Bool(const std::string& key, bool dflt) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return dflt;
  if (auto* p = std::get_if<bool>(&it->second)) return *p;
  if (auto* p = std::get_if<int64_t>(&it->second)) return *p != 0;
  return dflt;
}

std::string Node::Str(const std::string& key, const std::string& dflt) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return dflt;
  if (auto* p = std::get_if<std::string>(&it->second)) return *p;
  return dflt;
}

IntList Node::Ints(const std::string& key, const IntList& dflt) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return dflt;
  if (auto* p = std::get_if<IntList>(&it->second)) return *p;
  if (auto* p = std::get_if<int64_t>(&it->second)) return {*p};
  return dflt;
}

DType Node::Dtype(const std::string& key, DType dflt) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return dflt;
  if (auto* p = std::get_if<DType>(&it->second)) return *p;
  return dflt;
}

const Constant* Node::Tensor(const std::string& key) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return nullptr;
  return std::get_if<Constant>(&it->second);
}

ValueId Graph::Add(std::string op, std::vector<ValueId> ins, AttrMap attrs) {
  Node n;
  n.op = std::move(op);
  n.inputs = std::move(ins);
  n.attrs = std::move(attrs);
  nodes.push_back(std::move(n));
  return num_values() - 1;
}

std::string Graph::Describe(ValueId v) const {
  if (v >= 0 && v < num_inputs()) {
    std::string name = v < static_cast<ValueId>(input_names.size()) ? input_names[v] : "";
    return name.empty() ? absl::StrCat("input ", v) : absl::StrCat("input ", v, " ('", name, "')");
  }
  if (v < 0 || v >= num_values()) return absl::StrCat("value ", v);
  const Node& n = NodeOf(v);
  int idx = v - num_inputs();
  if (n.name.empty()) return absl::StrCat("node ", idx, " (", n.op, ")");
  return absl::StrCat("node ", idx, " (", n.op, " '", n.name, "')");
}

std::string Graph::ToString() const {
  std::string s;
  for (int i = 0; i < num_inputs(); ++i)
    absl::StrAppend(&s, "%", i, " = input ", inputs[i].ToString(), "\n");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    absl::StrAppend(&s, "%", num_inputs() + i, " = ", n.op, "(");
    for (size_t k = 0; k < n.inputs.size(); ++k)
      absl::StrAppend(&s, k ? ", " : "", "%", n.inputs[k]);
    absl::StrAppend(&s, ")");
    for (const auto& [key, val] : n.attrs) absl::StrAppend(&s, " ", key, "=", AttrToString(val));
    absl::StrAppend(&s, " : ", n.type.ToString(), "\n");
  }
  absl::StrAppend(&s, "return ");
  for (size_t k = 0; k < outputs.size(); ++k) absl::StrAppend(&s, k ? ", " : "", "%", outputs[k]);
  return s + "\n";
}

}  // namespace kiln::ir
