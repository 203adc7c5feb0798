#include "kernels/schedule/legality.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/ir/op_registry.h"

namespace kiln::schedule {

absl::Status CheckLowerable(const ir::Graph& g) {
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const ir::OpSchema* s = ir::FindOp(g.nodes[k].op);
    ir::ValueId v = g.num_inputs() + static_cast<ir::ValueId>(k);
    if (s->kind == ir::OpKind::kExtern)
      return absl::InvalidArgumentError(
          absl::StrCat(g.Describe(v),
                       ": extern op is a partition boundary; kiln does not compile it (run it in "
                       "the framework between kiln parts)"));
    if (s->kind == ir::OpKind::kComposite)
      return absl::InternalError(
          absl::StrCat(g.Describe(v), ": composite op survived decomposition"));
  }
  return absl::OkStatus();
}

bool CanJoinKernel(const std::vector<int>& loaded, const std::unordered_set<int>& kernel_buffers) {
  for (int b : loaded)
    if (kernel_buffers.count(b)) return false;
  return true;
}

}  // namespace kiln::schedule
