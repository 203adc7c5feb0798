// EliminateDeadCode: keeps only nodes that some output depends on, in their original order.
#include "kernels/ir/builder.h"
#include "kernels/passes/passes.h"
#include "kernels/util/status_macros.h"

namespace kiln::passes {

absl::StatusOr<ir::Graph> EliminateDeadCode(const ir::Graph& g) {
  std::vector<bool> live(g.num_values(), false);
  for (ir::ValueId v : g.outputs) live[v] = true;
  for (int k = static_cast<int>(g.nodes.size()) - 1; k >= 0; --k) {
    if (!live[g.num_inputs() + k]) continue;
    for (ir::ValueId u : g.nodes[k].inputs) live[u] = true;
  }
  ir::Builder b(g);
  std::vector<ir::ValueId> map(g.num_values(), -1);
  for (int i = 0; i < g.num_inputs(); ++i) map[i] = i;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    if (!live[g.num_inputs() + k]) continue;
    const ir::Node& n = g.nodes[k];
    std::vector<ir::ValueId> ins;
    for (ir::ValueId u : n.inputs) ins.push_back(map[u]);
    KILN_ASSIGN_OR_RETURN(map[g.num_inputs() + k], b.Add(n.op, ins, n.attrs, n.name));
  }
  std::vector<ir::ValueId> outs;
  for (ir::ValueId v : g.outputs) outs.push_back(map[v]);
  return b.Finish(std::move(outs));
}

}  // namespace kiln::passes
