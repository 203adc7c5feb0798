// The scheduled program: buffers and an ordered list of fused kernels, each a loop nest over
// its output domain whose element values are lowered expressions. Backend-neutral: the CPU
// and CUDA code generators both print a Program.
// Thread-safety: a plain value; immutable once Schedule returns it.
#pragma once

#include <string>
#include <vector>

#include "kernels/ir/graph.h"
#include "kernels/lower/expr.h"

namespace kiln::schedule {

struct Buffer {
  enum class Role { kInput, kOutput, kTemp, kConst };
  Role role;
  int index = 0;  // input/output position; temp or constant number
  ir::DType dtype;
  ir::Shape shape;
  std::vector<int64_t> strides;  // elements; contiguous except for strided inputs
  int64_t bytes = 0;
  int64_t offset = 0;  // temps: byte offset in the workspace
  ir::Constant value;  // kConst only
};

struct KernelOutput {
  int buffer;
  lower::ExprPtr value;
  ir::ValueId graph_value;
};

struct Kernel {
  std::string name;  // "k0", "k1", ...
  ir::Shape domain;  // the outputs' shape
  // Output loops: variables 0..num_loops-1, one per dimension of `domain` larger than 1, in
  // order (size-1 dimensions get no loop). `out_index` is the index each output is stored at.
  int num_loops = 0;
  std::vector<lower::Affine> out_index;
  lower::VarExtents extents;  // every loop variable's extent (output loops first)
  // Each holds `domain`'s number of elements, stored contiguously at the flat position of the
  // domain's element (an output may have another shape with the same elements: a view).
  std::vector<KernelOutput> outputs;
  std::vector<ir::ValueId> fused_values;  // graph values computed inside this kernel
};

struct Program {
  std::vector<Buffer> buffers;
  std::vector<Kernel> kernels;
  int64_t workspace_bytes = 0;
  int num_inputs = 0;
  int num_outputs = 0;
  std::string report;  // the fusion report: kernels, their nodes, and why values were stored
};

}  // namespace kiln::schedule
