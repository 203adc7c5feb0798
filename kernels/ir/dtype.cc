#include "kernels/ir/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace kiln::ir {
namespace {

struct Info {
  DType t;
  const char* name;
  int64_t size;
};
constexpr std::array<Info, 10> kInfos = {{
    {DType::kF16, "f16", 2},
    {DType::kBF16, "bf16", 2},
    {DType::kF32, "f32", 4},
    {DType::kF64, "f64", 8},
    {DType::kI8, "i8", 1},
    {DType::kI16, "i16", 2},
    {DType::kI32, "i32", 4},
    {DType::kI64, "i64", 8},
    {DType::kU8, "u8", 1},
    {DType::kBool, "bool", 1},
}};

const Info& InfoOf(DType t) { return kInfos[static_cast<int>(t) - 1]; }

// Smallest signed integer type holding both a signed type of `bits` and u8.
int IntBits(DType t) { return static_cast<int>(DTypeSize(t)) * 8; }

DType SignedOfBits(int bits) {
  switch (bits) {
    case 8:
      return DType::kI8;
    case 16:
      return DType::kI16;
    case 32:
      return DType::kI32;
    default:
      return DType::kI64;
  }
}

}  // namespace

const char* DTypeName(DType t) { return InfoOf(t).name; }

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const Info& i : kInfos)
    if (name == i.name) return i.t;
  return std::nullopt;
}

std::optional<DType> DTypeFromWire(int wire) {
  if (wire < 1 || wire > 10) return std::nullopt;
  return static_cast<DType>(wire);
}

int64_t DTypeSize(DType t) { return InfoOf(t).size; }
bool IsFloat(DType t) {
  return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32 || t == DType::kF64;
}
bool IsInteger(DType t) { return !IsFloat(t) && t != DType::kBool; }
bool IsSigned(DType t) { return IsFloat(t) || (IsInteger(t) && t != DType::kU8); }
bool IsBool(DType t) { return t == DType::kBool; }

DType FloatResult(DType t) {
  if (IsFloat(t)) return t;
  switch (t) {
    case DType::kBool:
    case DType::kI8:
    case DType::kU8:
      return DType::kF16;
    case DType::kI16:
      return DType::kF32;
    default:
      return DType::kF64;
  }
}

DType Promote(DType a, DType b) {
  if (a == b) return a;
  if (IsBool(a)) return b;
  if (IsBool(b)) return a;
  if (IsFloat(a) && IsFloat(b)) {
    if ((a == DType::kF16 && b == DType::kBF16) || (a == DType::kBF16 && b == DType::kF16))
      return DType::kF32;
    return DTypeSize(a) >= DTypeSize(b) ? a : b;
  }
  if (IsFloat(a) || IsFloat(b)) {
    DType f = IsFloat(a) ? a : b;
    DType i = IsFloat(a) ? b : a;
    DType need = FloatResult(i);  // the float that holds the integer exactly
    if (need == DType::kF16 && f == DType::kBF16) return DType::kBF16;
    if (f == DType::kBF16 && need != DType::kF16) return need;
    return DTypeSize(f) >= DTypeSize(need) ? f : need;
  }
  // Both integers.
  bool ua = a == DType::kU8, ub = b == DType::kU8;
  if (!ua && !ub) return DTypeSize(a) >= DTypeSize(b) ? a : b;
  DType s = ua ? b : a;  // the signed one (both unsigned handled by a == b)
  return SignedOfBits(std::max(IntBits(s), 16));
}

DType SumResult(DType t) {
  if (IsFloat(t)) return t;
  return DType::kI64;
}

DType ComputeType(DType t) {
  if (t == DType::kF16 || t == DType::kBF16) return DType::kF32;
  return t;
}

double RoundToFloatDType(double v, DType t) {
  if (t == DType::kF64 || v == 0 || !std::isfinite(v)) return v;
  // Fraction bits, smallest normal exponent and largest finite value of the format.
  int fraction_bits = 23, min_exp = -126;
  double max_finite = std::numeric_limits<float>::max();
  if (t == DType::kF16) {
    fraction_bits = 10;
    min_exp = -14;
    max_finite = 65504.0;
  } else if (t == DType::kBF16) {
    fraction_bits = 7;
    max_finite = std::ldexp(255.0, 120);  // 0x1.fep127
  }
  int e = 0;
  std::frexp(v, &e);  // v = m * 2^e with 0.5 <= |m| < 1
  int quantum_exp = std::max(e - 1, min_exp) - fraction_bits;
  double r = std::ldexp(std::nearbyint(std::ldexp(v, -quantum_exp)), quantum_exp);
  if (std::fabs(r) > max_finite) return std::copysign(std::numeric_limits<double>::infinity(), v);
  return r;
}

int64_t MinOf(DType t) {
  switch (t) {
    case DType::kI8:
      return std::numeric_limits<int8_t>::min();
    case DType::kI16:
      return std::numeric_limits<int16_t>::min();
    case DType::kI32:
      return std::numeric_limits<int32_t>::min();
    case DType::kU8:
    case DType::kBool:
      return 0;
    default:
      return std::numeric_limits<int64_t>::min();
  }
}

int64_t MaxOf(DType t) {
  switch (t) {
    case DType::kI8:
      return std::numeric_limits<int8_t>::max();
    case DType::kI16:
      return std::numeric_limits<int16_t>::max();
    case DType::kI32:
      return std::numeric_limits<int32_t>::max();
    case DType::kU8:
      return std::numeric_limits<uint8_t>::max();
    case DType::kBool:
      return 1;
    default:
      return std::numeric_limits<int64_t>::max();
  }
}

bool FitsIntDType(int64_t v, DType t) {
  return t == DType::kBool || (v >= MinOf(t) && v <= MaxOf(t));
}

}  // namespace kiln::ir
