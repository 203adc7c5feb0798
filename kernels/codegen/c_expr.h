// C-family expression text shared by the CPU and CUDA code generators.
//
// Generated code calls overloaded helpers named kiln_<op> (kiln_exp, kiln_floordiv, ...),
// which each backend's runtime header defines (kernels/runtime/): the CPU header maps them to
// glibc's vector math so loops vectorise, the CUDA header to CUDA's device math.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "kernels/ir/dtype.h"
#include "kernels/ir/symbols.h"
#include "kernels/lower/expr.h"
#include "kernels/schedule/program.h"

namespace kiln::codegen {

// Storage type of a buffer element: "float", "_Float16"/"__half" (f16), "kiln_bf16", "int8_t"...
// The C name of a program buffer in generated code (in0, out1, tmp2, kconst3): both code
// generators name parameters and arrays so.
std::string BufferName(const schedule::Buffer& b);

std::string StorageType(ir::DType t, bool cuda);
// Type expressions compute in: f16 and bf16 compute in float.
std::string ComputeTypeName(ir::DType t);
// Converts a loaded storage value to the compute type, and a computed value to storage.
std::string LoadConvert(ir::DType t, const std::string& x);
std::string StoreConvert(ir::DType t, const std::string& x);

// A literal of dtype t's compute type.
std::string Literal(ir::DType t, double f, int64_t i);
// The symbolic-sample flag (kernels/ir/symbols.h, ScopedSymbolicSample): while it is set,
// single-precision literals print all 17 digits of the double they came from, so exact values
// (a 1/N of a mean) can be read back out of the text.
using ir::InSymbolicSample;
using ir::ScopedSymbolicSample;

// Text of a pointwise node (kUnary, kBinary, kWhere, kCast, kClamp, kIndexLess, kIndex,
// kRandom, kConst) given its operands' texts. `index_text` is the printed index[0] where used.
std::string PointwiseText(const lower::Expr& e, const std::vector<std::string>& args,
                          const std::string& index_text);

// Identity element and combine statement for a reduction accumulating into `acc`.
std::string ReduceInit(const std::string& op, ir::DType acc_type);
// The OpenMP reduction operator of a reduction op ("sum" -> "+", "max" -> "max", ...).
std::string ReduceClauseOp(const std::string& op);
std::string ReduceCombine(const std::string& op, const std::string& acc, const std::string& v,
                          ir::DType t);

}  // namespace kiln::codegen
