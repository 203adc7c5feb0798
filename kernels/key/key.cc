#include "kernels/key/key.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "kernels/key/byte_writer.h"

namespace kiln::key {
namespace {

void WriteAttr(ByteWriter& w, const ir::AttrValue& a) {
  w.Int(static_cast<int64_t>(a.index()));
  if (auto* p = std::get_if<int64_t>(&a))
    w.Int(*p);
  else if (auto* p = std::get_if<double>(&a))
    w.Double(*p);  // the exact bits: -0.0 vs 0.0 and NaN payloads are the client's business
  else if (auto* p = std::get_if<std::string>(&a))
    w.Str(*p);
  else if (auto* p = std::get_if<bool>(&a))
    w.Int(*p);
  else if (auto* p = std::get_if<ir::DType>(&a))
    w.Int(static_cast<int64_t>(*p));
  else if (auto* p = std::get_if<ir::IntList>(&a))
    w.Ints(*p);
  else if (auto* p = std::get_if<ir::FloatList>(&a))
    w.Doubles(*p);
  else if (auto* p = std::get_if<ir::Constant>(&a)) {
    w.Int(static_cast<int64_t>(p->dtype));
    w.Ints(p->shape);
    w.Doubles(p->f);
    w.Ints(p->i);
  }
}

}  // namespace

std::string CanonicalBytes(const ir::Graph& g) {
  // Renumber values in the depth-first post-order reached from the outputs (operands in
  // order). That order is fixed by the computation's structure alone, so it does not depend
  // on the order in which a client appended independent nodes; unreachable nodes drop out.
  std::vector<int32_t> canon(g.num_values(), -1);
  std::vector<ir::ValueId> order;
  int32_t next = g.num_inputs();
  for (int i = 0; i < g.num_inputs(); ++i) canon[i] = i;  // inputs keep their positions
  std::vector<std::pair<ir::ValueId, size_t>> stack;
  for (ir::ValueId root : g.outputs) {
    if (canon[root] >= 0) continue;
    stack.push_back({root, 0});
    while (!stack.empty()) {
      auto& [v, k] = stack.back();
      const ir::Node& n = g.NodeOf(v);
      if (k < n.inputs.size()) {
        ir::ValueId u = n.inputs[k++];
        if (canon[u] < 0) stack.push_back({u, 0});
        continue;
      }
      canon[v] = next++;
      order.push_back(v);
      stack.pop_back();
    }
  }
  ByteWriter w;
  w.Str("kiln.graph.v1");
  w.Int(g.num_inputs());
  for (const ir::TensorType& t : g.inputs) {
    w.Int(static_cast<int64_t>(t.dtype));
    if (t.dim_symbols.empty()) {
      w.Ints(t.shape);
    } else {  // a symbolic dimension enters as -1 - its id: the symbol, never its sample value
      ir::Shape shape = t.shape;
      for (size_t d = 0; d < shape.size(); ++d)
        if (t.dim_symbols[d] >= 0) shape[d] = -1 - t.dim_symbols[d];
      w.Ints(shape);
    }
    w.Ints(t.strides);
  }
  w.Int(static_cast<int64_t>(order.size()));
  for (ir::ValueId v : order) {
    const ir::Node& n = g.NodeOf(v);
    w.Str(n.op);
    w.Int(static_cast<int64_t>(n.inputs.size()));
    for (ir::ValueId u : n.inputs) w.Int(canon[u]);
    w.Int(static_cast<int64_t>(n.attrs.size()));
    for (const auto& [k, a] : n.attrs) {  // std::map: sorted by name
      w.Str(k);
      WriteAttr(w, a);
    }
  }
  w.Int(static_cast<int64_t>(g.outputs.size()));
  for (ir::ValueId v : g.outputs) w.Int(canon[v]);
  return w.Take();
}

std::string ActionKey::DebugString() const {
  std::string s;
  for (const auto& [label, value] : fields) absl::StrAppend(&s, label, ": ", value, "\n");
  absl::StrAppend(&s, "digest: ", digest, "\n");
  return s;
}

ActionKey ComputeKey(const ir::Graph& graph, const Target& target, const CompileOptions& options,
                     const std::string& toolchain_fingerprint) {
  ActionKey k;
  std::string canonical = CanonicalBytes(graph);
  k.fields = {
      {"key_format", absl::StrCat(kKeyFormatVersion)},
      {"graph", Sha256Hex(canonical)},
      {"target", target.ToString()},
      {"options", options.ToString()},
      {"toolchain", toolchain_fingerprint},
  };
  ByteWriter w;
  for (const auto& [label, value] : k.fields) {
    w.Str(label);
    w.Str(value);
  }
  k.digest = Sha256Hex(w.Take());
  return k;
}

}  // namespace kiln::key
