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

#include "kernels/codegen/variants.h"
#include "kernels/schedule/program.h"

namespace kiln::codegen {

struct LanePlan {
  int64_t lanes = 0;  // 0: no lane tiles
  bool parallel_tiles = false;
  bool split_rows = false;
  int max_unroll = 4;  // rows a sum takes per step
};

// `variant` sets the widest tile (by default 4096 lanes: whole rows of common widths, so each
// step reads a row in order while the arrays a reduction touches per step, its accumulators
// and the statistics it reads, stay in the first- or second-level cache), the unrolling and
// the thread split.
LanePlan PlanLanes(const schedule::Program& p, const schedule::Kernel& k, int64_t min_parallel_work,
                   const CpuVariant& variant);

// Transposing kernels: the output is written along its innermost loop `x`, while a load
// reads along another output loop `p` (stride 1) and jumps a whole row at each step of `x`
// (a transpose, `a + a.T`, a permute of the last axis). Run in order, every load of a row
// touches a new cache line and page. Instead the (p, x) plane runs in square tiles of
// `tile` x `tile`: a tile's source rows stay in the first-level cache while its rows are
// written. Only for kernels without reductions (a value placed in p's loop would be computed
// again for every tile along x). `p` = -1: no tiles.
struct TransposeTiles {
  int p = -1;
  int64_t tile = 0;
};
TransposeTiles PlanTranspose(const schedule::Program& p, const schedule::Kernel& k);

// The tile loop over an output loop of `extent` (its variable is defined per lane inside
// `body`, see CpuKernelEmitter::AssembleLanes).
std::vector<std::string> LaneTileLoop(const std::vector<std::string>& body, int64_t extent,
                                      const LanePlan& plan, bool parallel);

}  // namespace kiln::codegen
