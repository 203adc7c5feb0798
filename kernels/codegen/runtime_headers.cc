#include "kernels/codegen/runtime_headers.h"

#include "kernels/runtime/kiln_common_header.h"
#include "kernels/runtime/kiln_cpu_header.h"
#include "kernels/runtime/kiln_cuda_header.h"

namespace kiln::codegen {

const std::string& CpuRuntimeHeader() {
  static const std::string* h = new std::string(runtime::kKilnCpuHeader);
  return *h;
}

const std::string& CudaRuntimeHeader() {
  static const std::string* h = new std::string(runtime::kKilnCudaHeader);
  return *h;
}

const std::string& CommonRuntimeHeader() {
  static const std::string* h = new std::string(runtime::kKilnCommonHeader);
  return *h;
}

const std::vector<std::pair<std::string, std::string>>& RuntimeHeaders(bool cuda) {
  static const auto* cpu = new std::vector<std::pair<std::string, std::string>>{
      {"kiln_cpu.h", CpuRuntimeHeader()}, {"kiln_common.h", CommonRuntimeHeader()}};
  static const auto* gpu = new std::vector<std::pair<std::string, std::string>>{
      {"kiln_cuda.h", CudaRuntimeHeader()}, {"kiln_common.h", CommonRuntimeHeader()}};
  return cuda ? *gpu : *cpu;
}

}  // namespace kiln::codegen
