// CUDA backend, codegen half: a scheduled Program -> one CUDA C++ translation unit and its
// launch plan (format: kernels/codegen/PLAN.md).
//
// Each scheduled kernel becomes an `extern "C" __global__` function named like it (k0,
// k1, ...); a kernel with whole-tensor reductions first launches k<i>_p<level> functions that
// leave per-block partial results in the workspace. Launch shapes come from the tensor shapes
// and the target's SM count (see cuda_kernel.h for the strategies). The unit includes
// "kiln_cuda.h" (codegen/runtime_headers.h). Knows no compiler: kernels/toolchain builds the text.
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "kernels/schedule/program.h"
#include "kernels/target.h"

namespace kiln::codegen {

// 3: launch-time choices (step guards); 4: a column reduction reading another is split in a
// second partials launch, up to 128 chunks; 6: sin and cos of one value share one kiln_sincos.
inline constexpr int kCudaCodegenVersion = 6;
inline constexpr uint32_t kCudaAbiVersion = 1;
// Symbolic plans: every kernel takes the sizes as trailing `int` parameters, grids are
// ceil-divisions of size polynomials, temps are laid out by the launcher (PLAN.md).
inline constexpr uint32_t kCudaSymbolicAbiVersion = 2;
// The bound a symbolic plan's index_bound_expr must stay below (32-bit indices with room).
inline constexpr int64_t kCudaIndexLimit = int64_t{1} << 30;

struct CudaUnit {
  std::string source;
  LaunchPlan plan;
  std::string report;  // one line per launch: its strategy and shape
};

// REQUIRES: target.is_cuda(). InvalidArgument when a tensor is too large for the launch
// shapes used (more than 2^31 - 1 blocks).
// `num_symbols` > 0: the program is a sample of a symbolic graph (codegen/symbolic.h).
absl::StatusOr<CudaUnit> GenerateCuda(const schedule::Program& program, const Target& target,
                                      const CompileOptions& options, int num_symbols = 0);

// Streaming multiprocessors of the reference part of an architecture (e.g. sm_90: H100 SXM,
// 132). Used only to size grids; any part of the architecture runs the code correctly.
int SmCount(int sm);

}  // namespace kiln::codegen
