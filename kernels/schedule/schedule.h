// Scheduling: decides which values get buffers, groups stored values into fused kernels, and
// plans the workspace. Input: a verified, decomposed graph. Output: schedule::Program.
// Thread-safety: pure function.
#pragma once

#include "absl/status/statusor.h"
#include "kernels/ir/graph.h"
#include "kernels/schedule/program.h"

namespace kiln::schedule {

absl::StatusOr<Program> Schedule(const ir::Graph& graph);

}  // namespace kiln::schedule
