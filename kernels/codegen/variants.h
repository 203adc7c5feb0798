// Kernel variants: the knobs CompileOptions.variant selects, per backend, for tuning on a
// device (a client times the variants of a graph and keeps the fastest). Variant 0 is always
// the compiler's default choice; an index past the table's end means the default.
// Thread-safety: constants.
#pragma once

#include <cstdint>

namespace kiln::codegen {

struct CpuVariant {
  int64_t max_lanes;  // widest lane tile of an outer-axis reduction
  int max_unroll;     // rows a lane-tiled sum takes per step (1, 2 or 4)
  bool prefer_tiles;  // give whole tiles to threads even when there are few
};
inline constexpr CpuVariant kCpuVariants[] = {
    {4096, 4, false},
    {1024, 4, false},
    {4096, 1, false},
    {512, 2, true},
};

struct CudaVariant {
  int pointwise_block;    // threads per block of pointwise kernels
  int row_threads_shift;  // threads per row of row kernels, times 2^shift (clamped)
};
// The last two widen row kernels by 8x and 16x: a row whose length is symbolic gets one warp by
// default (kVaryingRowThreads), which long rows outgrow; tuning on the real lengths can pick a
// block per row instead.
inline constexpr CudaVariant kCudaVariants[] = {
    {256, 0}, {128, 0}, {512, 0}, {256, -1}, {256, 1}, {256, 3}, {256, 4},
};

inline constexpr int kNumCpuVariants = sizeof(kCpuVariants) / sizeof(kCpuVariants[0]);
inline constexpr int kNumCudaVariants = sizeof(kCudaVariants) / sizeof(kCudaVariants[0]);

inline const CpuVariant& CpuVariantOf(int v) {
  return kCpuVariants[v > 0 && v < kNumCpuVariants ? v : 0];
}
inline const CudaVariant& CudaVariantOf(int v) {
  return kCudaVariants[v > 0 && v < kNumCudaVariants ? v : 0];
}

}  // namespace kiln::codegen
