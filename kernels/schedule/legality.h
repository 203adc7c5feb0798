// Fusion legality: what the compiler *can* compile and fuse, regardless of speed.
// Thread-safety: pure functions.
#pragma once

#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "kernels/ir/graph.h"

namespace kiln::schedule {

// Every node must be a primitive (composites decomposed, no externs). InvalidArgument names
// the node otherwise.
absl::Status CheckLowerable(const ir::Graph& graph);

// Whether `value` may join a kernel that already stores `kernel_values`: it must not read any
// of them through a buffer (a kernel cannot consume its own outputs).
bool CanJoinKernel(const std::vector<int>& loaded_buffers,
                   const std::unordered_set<int>& kernel_buffers);

}  // namespace kiln::schedule
