// The runtime headers generated code includes (kernels/runtime/), embedded in the compiler so
// a build needs no files beside the binary. Toolchains place them beside the source.
// Thread-safety: immutable data.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kiln::codegen {

const std::string& CpuRuntimeHeader();
const std::string& CudaRuntimeHeader();
const std::string& CommonRuntimeHeader();

// (include name, text) of every header a CPU or CUDA unit may include.
const std::vector<std::pair<std::string, std::string>>& RuntimeHeaders(bool cuda);

}  // namespace kiln::codegen
