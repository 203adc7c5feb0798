// EliminateCommonSubexpressions: nodes with the same op, inputs and attributes are computed
// once. Nodes are keyed after their inputs were mapped, so chains of duplicates collapse in
// one pass.
#include <map>
#include <tuple>

#include "kernels/passes/passes.h"
#include "kernels/passes/rewrite.h"

namespace kiln::passes {

absl::StatusOr<ir::Graph> EliminateCommonSubexpressions(const ir::Graph& graph) {
  using Key = std::tuple<std::string, std::vector<ir::ValueId>, std::string>;
  std::map<Key, ir::ValueId> seen;
  return Rewrite(graph, [&seen](ir::Builder& b, const ir::Node& n, const std::vector<ir::ValueId>& in)
                            -> absl::StatusOr<std::optional<ir::ValueId>> {
    // Attributes enter through the printed graph line, which is exact for every kind.
    ir::Graph one;
    one.nodes.push_back(n);
    one.nodes.back().inputs.clear();
    one.nodes.back().name.clear();
    Key key{n.op, in, one.ToString()};
    auto it = seen.find(key);
    if (it != seen.end()) return it->second;
    auto v = b.Add(n.op, in, n.attrs, n.name);
    if (!v.ok()) return v.status();
    seen[key] = *v;
    return *v;
  });
}

}  // namespace kiln::passes
