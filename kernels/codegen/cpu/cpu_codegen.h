// CPU backend, codegen half: a scheduled Program -> one C++ translation unit using OpenMP
// (threads across the outermost loop) and SIMD (innermost loops; vector math through
// kernels/runtime/kiln_cpu.h). The unit exports the ABI of kernels/codegen/ABI.md.
// Knows no compiler: kernels/toolchain builds the text.
// Thread-safety: pure function.
#pragma once

#include <string>

#include "kernels/schedule/program.h"
#include "kernels/target.h"

namespace kiln::codegen {

// 3: row reductions vectorised along the row, blocked float sums, two-loop argmax, transposing
// tiles, a loop per concatenated piece, byte accumulators for any/all, short inner loops unrolled.
// 4: arrays on the stack declared 64-byte aligned (cpu_emitter.cc, kStackArray).
inline constexpr int kCpuCodegenVersion = 4;
inline constexpr uint32_t kCpuAbiVersion = 1;
// Artifacts of graphs with symbolic sizes (ABI.md, version 2).
inline constexpr uint32_t kCpuSymbolicAbiVersion = 2;

// The generated source includes "kiln_cpu.h" (codegen/runtime_headers.h).
// `num_symbols` > 0: the program is a sample of a symbolic graph; the unit exports ABI
// version 2, every function reads the sizes as `kiln_s<k>`, and temps are laid out at run
// time (kernels/codegen/symbolic.h turns the sample's numbers into expressions of them).
std::string GenerateCpu(const schedule::Program& program, const CompileOptions& options,
                        int num_symbols = 0);

}  // namespace kiln::codegen
