#include "kernels/passes/rewrite.h"

#include "kernels/util/status_macros.h"

namespace kiln::passes {

absl::StatusOr<ir::Graph> Rewrite(const ir::Graph& g, const RewriteRule& rule) {
  ir::Builder b(g);
  std::vector<ir::ValueId> map(g.num_values());
  for (int i = 0; i < g.num_inputs(); ++i) map[i] = i;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const ir::Node& n = g.nodes[k];
    std::vector<ir::ValueId> ins;
    for (ir::ValueId v : n.inputs) ins.push_back(map[v]);
    KILN_ASSIGN_OR_RETURN(std::optional<ir::ValueId> r, rule(b, n, ins));
    if (!r) {
      KILN_ASSIGN_OR_RETURN(r, b.Add(n.op, ins, n.attrs, n.name));
    }
    map[g.num_inputs() + k] = *r;
  }
  std::vector<ir::ValueId> outs;
  for (ir::ValueId v : g.outputs) outs.push_back(map[v]);
  return b.Finish(std::move(outs));
}

}  // namespace kiln::passes
