// Scheduling: decides which values get buffers, groups stored values into fused kernels, and
// plans the workspace. Input: a verified, decomposed graph. Output: schedule::Program.
// Thread-safety: pure function.
#pragma once

#include "absl/status/statusor.h"
#include "kernels/ir/graph.h"
#include "kernels/schedule/program.h"
#include "kernels/util/budget.h"

namespace kiln::schedule {

struct ScheduleOptions {
  // Deepest inlined expression a kernel may hold, in lower::InlineDepth units along any path
  // of inlined nodes. A value whose expression would be deeper is stored to a buffer and read
  // back by a later kernel, so a long chain of pointwise ops compiles as several kernels and
  // every stage after this one (lowering, codegen) recurses at most this deep.
  int64_t max_expr_depth = 256;
  // Checked once per stored value; null: no time limit.
  const FrontendBudget* budget = nullptr;
};

// Time linear in nodes (times the number of rounds needed to store refused reductions).
// Errors: InvalidArgument for ops that cannot be compiled (externs), ResourceExhausted when
// the budget runs out.
absl::StatusOr<Program> Schedule(const ir::Graph& graph, const ScheduleOptions& options = {});

}  // namespace kiln::schedule
