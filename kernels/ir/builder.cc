#include "kernels/ir/builder.h"

#include "absl/strings/str_cat.h"
#include "kernels/ir/op_registry.h"

namespace kiln::ir {

Builder::Builder(const Graph& like) {
  graph_.inputs = like.inputs;
  graph_.input_names = like.input_names;
}

absl::StatusOr<ValueId> Builder::Add(const std::string& op, std::vector<ValueId> inputs,
                                     AttrMap attrs, const std::string& name) {
  const OpSchema* s = FindOp(op);
  if (!s) return absl::InternalError(absl::StrCat("builder: unknown op ", op));
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.name = name;
  std::vector<TensorType> in;
  for (ValueId v : n.inputs) in.push_back(graph_.TypeOf(v));
  auto t = s->infer(n, in);
  if (!t.ok())
    return absl::InternalError(absl::StrCat("builder: ", op, ": ", t.status().message()));
  n.type = *std::move(t);
  graph_.nodes.push_back(std::move(n));
  return graph_.num_values() - 1;
}

absl::StatusOr<ValueId> Builder::Scalar(DType t, double v) {
  Constant c;
  c.dtype = t;
  if (IsFloat(t))
    c.f = {v};
  else
    c.i = {IsBool(t) ? (v != 0) : static_cast<int64_t>(v)};
  return Add("constant", {}, {{"value", c}});
}

Graph Builder::Finish(std::vector<ValueId> outputs) {
  graph_.outputs = std::move(outputs);
  return std::move(graph_);
}

}  // namespace kiln::ir
