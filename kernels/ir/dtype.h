// Element types of kiln tensors and NumPy-style type promotion.
// Thread-safety: pure functions and constants only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::ir {

// The numeric values match kiln.v1.DType on the wire.
enum class DType : uint8_t {
  kF16 = 1,
  kBF16 = 2,
  kF32 = 3,
  kF64 = 4,
  kI8 = 5,
  kI16 = 6,
  kI32 = 7,
  kI64 = 8,
  kU8 = 9,
  kBool = 10,
};

const char* DTypeName(DType t);  // "f32", "i64", "bool", ...
std::optional<DType> DTypeFromName(std::string_view name);
std::optional<DType> DTypeFromWire(int wire);  // nullopt for 0 and unknown values
int64_t DTypeSize(DType t);
bool IsFloat(DType t);    // f16 bf16 f32 f64
bool IsInteger(DType t);  // signed and unsigned integers, not bool
bool IsSigned(DType t);   // floats and signed integers
bool IsBool(DType t);

// Result type of a binary arithmetic op on two tensors, as NumPy's promotion table gives it
// (np.result_type on arrays): bool < integers < floats; mixing signed and unsigned widens
// (u8 with i8 gives i16); an integer with f16 gives f16 for i8/u8, f32 for i16 and f64 for
// i32/i64, where NumPy promotes to the float wide enough to hold the integer exactly.
// bf16 (not in NumPy) promotes like f16, and f16 with bf16 gives f32, as PyTorch does.
// PyTorch differs for integer+float: it keeps the float type (i64 + f16 -> f16).
DType Promote(DType a, DType b);

// The type a float-only op (exp, sin, div, mean...) computes in for an input of type t:
// floats keep their type; bool, i8, u8 -> f16... kiln follows NumPy: small integers go to the
// smallest float holding them exactly (i8/u8/bool -> f16, i16 -> f32, i32/i64 -> f64).
DType FloatResult(DType t);

// The accumulator type used by sum/prod on t: NumPy accumulates integers and bool in i64
// (u8 in u64, which kiln maps to i64) and keeps float types.
DType SumResult(DType t);

// The C++/CUDA scalar type kernels compute in for t: f16 and bf16 are computed in float.
DType ComputeType(DType t);

// NumPy's cast of a double to float dtype t: rounded to nearest (ties to even) at t's
// precision, subnormals included; beyond t's range it becomes +-inf; NaN stays NaN.
// REQUIRES: IsFloat(t).
double RoundToFloatDType(double v, DType t);

// Whether an integer value is representable in t (bool: every value; it means v != 0).
// REQUIRES: !IsFloat(t).
bool FitsIntDType(int64_t v, DType t);
// The smallest and largest values of integer or bool dtype t.
int64_t MinOf(DType t);
int64_t MaxOf(DType t);

}  // namespace kiln::ir
