// One scheduled kernel -> one or more CUDA kernel functions, with the strategy chosen from
// the kernel's shape:
//
//   pointwise     no reductions left: one thread per vector of V outputs (16-byte accesses
//                 where contiguity and alignment allow), an exact grid;
//   row           reductions hoisted above the innermost output loops (softmax, layer_norm):
//                 TR threads per outer index cooperate over the row, reductions combine
//                 through warp shuffles and shared memory, and a row that fits is unrolled and
//                 kept in registers so memory is read once; threads per row follow the shape
//                 (rows x reduced extent): about 8 elements per thread for rows that stream
//                 memory (short rows: a few threads, several rows per block, shuffles only),
//                 32 per thread (at least a warp) for rows bound by arithmetic on re-read
//                 operands when the rows alone fill the GPU (a reduced outer product);
//                 rows too few to fill the GPU whose reductions are short (a group norm's
//                 chunked statistics combined per sample) split at a deeper loop, each row
//                 recomputing the short reductions;
//   per-output    reductions inside the innermost loop: one thread per output with sequential
//                 loops (small reductions, e.g. k-means' argmin over the centres), or a row of
//                 threads per output when the reduction is long and contiguous;
//   column tile   long strided reductions with few outputs (reducing a non-innermost axis):
//                 32 outputs per block, the reduced range split across y-groups, combined in
//                 shared memory in a fixed order;
//   whole tensor  reductions with no output index left: a first launch reduces slices to
//                 per-block partials in the workspace, consumers reduce the partials (two
//                 stages, never atomics, so results are deterministic).
//
// Thread-safety: pure function of its inputs.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/schedule/program.h"

namespace kiln::codegen::cuda {

struct KernelConfig {
  int sm_count = 132;
  std::string index_type = "int";  // "int" when every index fits in 31 bits, else "int64_t"
  // Tuning knobs (CompileOptions.variant, kernels/codegen/variants.h).
  int pointwise_block = 256;
  int row_threads_shift = 0;
  // A symbolic graph's sample (codegen/symbolic.h): every function takes the sizes as
  // trailing `const int kiln_s<k>` parameters, and grids are ceil-divisions of extents.
  int num_symbols = 0;
};

struct KernelFunction {
  std::string name;
  std::string text;  // the function definition
  uint32_t grid = 1;
  uint32_t block = 1;
  // grid == ceil(grid_work / grid_per_block): what a symbolic plan's launcher evaluates.
  int64_t grid_work = 1;
  int64_t grid_per_block = 1;
  // A launch-time choice (PlanStep.guard): runs when guard_min <= guard_value <= guard_max
  // (guard_max 0: unbounded); both 0: always.
  int64_t guard_value = 0;
  int64_t guard_min = 0;
  int64_t guard_max = 0;
  std::vector<int> buffers;         // program buffers it takes, in parameter order
  std::vector<std::string> params;  // its parameter declarations ("const float* __restrict__ in0")
  std::string strategy;             // one line for the fusion report
};

// Generates the functions of `unit->kernels[index]`, in launch order. Partial-result
// buffers it needs are appended to `unit->buffers` as temps (workspace grows).
absl::StatusOr<std::vector<KernelFunction>> GenerateKernel(schedule::Program* unit, int index,
                                                           const KernelConfig& config);

}  // namespace kiln::codegen::cuda
