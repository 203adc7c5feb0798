#include "kernels/schedule/policy.h"

#include "absl/strings/str_cat.h"

namespace kiln::schedule {

bool ShouldInlineReduction(int64_t evaluations, int64_t elements, std::string* why) {
  // Recomputing a reduction multiplies its whole input traffic, so no recomputation at all is
  // tolerated: the consumer must visit each of the reduction's results once (row-persistent
  // softmax / layer_norm, or a reduction feeding a reduction over its own outer axes).
  if (evaluations <= elements) return true;
  *why = absl::StrCat("inlining would evaluate it ", evaluations, " times for ", elements,
                      " results (consumer loops over axes it does not depend on)");
  return false;
}

}  // namespace kiln::schedule
