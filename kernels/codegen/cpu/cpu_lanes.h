// CPU strategy for reductions over an outer axis (column statistics, a sum over the first
// axis of a transposed view): whether a kernel's innermost output loop runs in lane tiles
// (kernels/codegen/cpu/cpu_emitter.h), how wide, and how the work is split over threads.
//
// A kernel qualifies when a reduction placed in its innermost output loop reads, in its body,
// a tensor that is contiguous along that loop and moves with the reduced variable: run one
// output at a time, such a reduction walks a column with a stride of a whole row. In tiles,
// each step of the reduced loop reads `lanes` consecutive elements of a row, and all the
// tile's accumulators advance together in a vector loop.
//
// Threads: tiles go to threads when there are enough of them; otherwise (few kept columns,
// long columns) each reduction's outermost reduced loop is split across threads with
// per-thread partial arrays that OpenMP merges.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/schedule/program.h"

namespace kiln::codegen {

struct LanePlan {
  int64_t lanes = 0;  // 0: no lane tiles
  bool parallel_tiles = false;
  bool split_rows = false;
};

// Most lanes per tile: whole rows of common widths, so each step reads a row in order; the
// arrays a reduction touches per step (its accumulators, the statistics it reads) stay in
// the first- or second-level cache.
inline constexpr int64_t kMaxLanes = 4096;

LanePlan PlanLanes(const schedule::Program& p, const schedule::Kernel& k, int64_t min_parallel_work);

// The tile loop over an output loop of `extent` (its variable is defined per lane inside
// `body`, see CpuKernelEmitter::AssembleLanes).
std::vector<std::string> LaneTileLoop(const std::vector<std::string>& body, int64_t extent, const LanePlan& plan,
                                      bool parallel);

}  // namespace kiln::codegen
