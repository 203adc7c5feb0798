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

inline constexpr int kCpuCodegenVersion = 2;
inline constexpr uint32_t kCpuAbiVersion = 1;

// The generated source includes "kiln_cpu.h" (codegen/runtime_headers.h).
std::string GenerateCpu(const schedule::Program& program, const CompileOptions& options);

}  // namespace kiln::codegen
