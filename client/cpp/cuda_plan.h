// CudaPlan: a CUDA launch plan (kernels/codegen/PLAN.md) as the CUDA loader uses it, and a
// reader for its JSON form (plan.json, as kilnc writes it).
//
// Plain C++ with no dependency beyond the standard library, so the loader's shared build
// (for ctypes) needs nothing but libc. Callers holding a kiln.v1.LaunchPlan fill the struct
// field by field.
// Thread-safety: plain values and a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::client {

struct CudaPlan {
  enum class Role { kInput, kOutput, kTemp };
  struct Buffer {
    Role role = Role::kInput;
    int index = 0;
    std::string dtype;
    std::vector<int64_t> shape;
    int64_t bytes = 0;
    int64_t offset = 0;
  };
  struct Step {
    std::string kernel;
    unsigned grid[3] = {1, 1, 1};
    unsigned block[3] = {1, 1, 1};
    unsigned shared_bytes = 0;
    std::vector<int> args;  // positions in `buffers`
  };
  uint32_t abi_version = 0;
  int64_t workspace_bytes = 0;
  std::vector<Buffer> buffers;
  std::vector<Step> steps;

  int num_inputs() const;
  int num_outputs() const;
};

// Parses plan.json. Returns false and says why in `*error` when the text is not JSON, a
// field is missing or has the wrong type, or an index is out of range.
bool ParseCudaPlan(std::string_view json, CudaPlan* plan, std::string* error);

}  // namespace kiln::client
