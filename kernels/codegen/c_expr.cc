#include "kernels/codegen/c_expr.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kiln::codegen {

std::string BufferName(const schedule::Buffer& b) {
  switch (b.role) {
    case schedule::Buffer::Role::kInput:
      return absl::StrCat("in", b.index);
    case schedule::Buffer::Role::kOutput:
      return absl::StrCat("out", b.index);
    case schedule::Buffer::Role::kTemp:
      return absl::StrCat("tmp", b.index);
    case schedule::Buffer::Role::kConst:
      return absl::StrCat("kconst", b.index);
  }
  return absl::StrCat("b", b.index);
}

using ir::DType;

std::string StorageType(DType t, bool cuda) {
  switch (t) {
    case DType::kF16:
      return cuda ? "__half" : "_Float16";
    case DType::kBF16:
      return cuda ? "__nv_bfloat16" : "kiln_bf16";
    case DType::kF32:
      return "float";
    case DType::kF64:
      return "double";
    case DType::kI8:
      return "int8_t";
    case DType::kI16:
      return "int16_t";
    case DType::kI32:
      return "int32_t";
    case DType::kI64:
      return "int64_t";
    case DType::kU8:
      return "uint8_t";
    case DType::kBool:
      return "bool";
  }
  return "void";
}

std::string ComputeTypeName(DType t) {
  if (t == DType::kF16 || t == DType::kBF16) return "float";
  return StorageType(t, false);
}

std::string LoadConvert(DType t, const std::string& x) {
  if (t == DType::kF16 || t == DType::kBF16) return absl::StrCat("kiln_to_float(", x, ")");
  return x;
}

std::string StoreConvert(DType t, const std::string& x) {
  switch (t) {
    case DType::kF16:
      return absl::StrCat("kiln_to_f16(", x, ")");
    case DType::kBF16:
      return absl::StrCat("kiln_to_bf16(", x, ")");
    default:
      return x;
  }
}

std::string Literal(DType t, double f, int64_t i) {
  if (ir::IsFloat(t)) {
    bool single = t != DType::kF64;
    // A literal beyond float's range would not compile on every backend (NVRTC rejects it):
    // it is the infinity a cast to float gives.
    if (single && std::fabs(f) > std::numeric_limits<float>::max())
      f = ir::RoundToFloatDType(f, DType::kF32);
    if (std::isnan(f)) return single ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")";
    if (std::isinf(f)) {
      std::string s = single ? "__builtin_inff()" : "__builtin_inf()";
      return f < 0 ? "(-" + s + ")" : s;
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, single && !InSymbolicSample() ? "%.9g" : "%.17g", f);
    std::string s = buf;
    if (s.find_first_of(".en") == std::string::npos) s += ".0";
    return single ? "(" + s + "f)" : "(" + s + ")";
  }
  if (t == DType::kBool) return i ? "true" : "false";
  if (i == std::numeric_limits<int64_t>::min()) return "((int64_t)(-9223372036854775807LL - 1))";
  return absl::StrCat("((", StorageType(t, false), ")", i, "LL)");
}

namespace {

// Narrow integer results back to their dtype, so i8 arithmetic wraps as NumPy's does.
std::string Typed(DType t, const std::string& x) {
  if (ir::IsFloat(t)) return x;
  return absl::StrCat("((", StorageType(t, false), ")(", x, "))");
}

std::string UnaryText(const std::string& op, DType t, DType operand, const std::string& a) {
  bool fl = ir::IsFloat(t);
  bool operand_float = ir::IsFloat(operand);
  if (op == "neg") return Typed(t, "-" + a);
  if (op == "logical_not") return absl::StrCat("(!", a, ")");
  if (op == "bitwise_not")
    return t == DType::kBool ? absl::StrCat("(!", a, ")") : Typed(t, "~" + a);
  if (op == "isnan") return operand_float ? absl::StrCat("(", a, " != ", a, ")") : "false";
  if (op == "isinf") return operand_float ? absl::StrCat("kiln_isinf(", a, ")") : "false";
  if (!fl && (op == "floor" || op == "ceil" || op == "round" || op == "trunc")) return a;
  if (op == "abs" || op == "sign") return Typed(t, absl::StrCat("kiln_", op, "(", a, ")"));
  return absl::StrCat("kiln_", op, "(", a, ")");
}

std::string BinaryText(const std::string& op, DType result, DType operand, const std::string& a,
                       const std::string& b) {
  auto infix = [&](const char* o) { return absl::StrCat("(", a, " ", o, " ", b, ")"); };
  if (op == "add") return Typed(result, infix("+"));
  if (op == "sub") return Typed(result, infix("-"));
  if (op == "mul") return Typed(result, infix("*"));
  if (op == "div") return infix("/");
  if (op == "eq") return infix("==");
  if (op == "ne") return infix("!=");
  if (op == "lt") return infix("<");
  if (op == "le") return infix("<=");
  if (op == "gt") return infix(">");
  if (op == "ge") return infix(">=");
  if (op == "logical_and") return infix("&");
  if (op == "logical_or") return infix("|");
  if (op == "logical_xor") return infix("!=");
  if (op == "bitwise_and") return Typed(result, infix("&"));
  if (op == "bitwise_or") return Typed(result, infix("|"));
  if (op == "bitwise_xor") return Typed(result, infix("^"));
  (void)operand;
  // floordiv remainder pow maximum minimum atan2: overloaded helpers.
  return Typed(result, absl::StrCat("kiln_", op, "(", a, ", ", b, ")"));
}

}  // namespace

std::string PointwiseText(const lower::Expr& e, const std::vector<std::string>& args,
                          const std::string& index_text) {
  using K = lower::Expr::Kind;
  switch (e.kind) {
    case K::kConst:
      return Literal(e.dtype, e.fvalue, e.ivalue);
    case K::kIndex:
      return absl::StrCat("((int64_t)(", index_text, "))");
    case K::kUnary:
      return UnaryText(e.op, e.dtype, e.args[0]->dtype, args[0]);
    case K::kBinary:
      return BinaryText(e.op, e.dtype, e.args[0]->dtype, args[0], args[1]);
    case K::kWhere:
      return absl::StrCat("(", args[0], " ? ", args[1], " : ", args[2], ")");
    case K::kIndexLess:
      return absl::StrCat("((", index_text, ") < ", e.ivalue, " ? ", args[0], " : ", args[1], ")");
    case K::kCast:
      if (e.dtype == DType::kBool) return absl::StrCat("(", args[0], " != 0)");
      if (ir::IsFloat(e.args[0]->dtype) && !ir::IsFloat(e.dtype) && ir::DTypeSize(e.dtype) < 8) {
        // Float to a narrow integer through int64: truncation toward zero, then the type's
        // wrap-around (NumPy's -1.6 -> uint8 255). Converted directly, a value out of the
        // type's range is undefined in C and CUDA, and the compiler kept -1 in a register that
        // a later float op read.
        return absl::StrCat("((", ComputeTypeName(e.dtype), ")(int64_t)(", args[0], "))");
      }
      return absl::StrCat("((", ComputeTypeName(e.dtype), ")(", args[0], "))");
    case K::kClamp: {
      std::string x = args[0];
      // Integer bounds beyond the dtype's range bound nothing: saturate them to it.
      auto bound = [&](double b) {
        if (ir::IsFloat(e.dtype) || std::isnan(b)) return int64_t{0};
        double lo_t = static_cast<double>(ir::MinOf(e.dtype)),
               hi_t = static_cast<double>(ir::MaxOf(e.dtype));
        return b <= lo_t   ? ir::MinOf(e.dtype)
               : b >= hi_t ? ir::MaxOf(e.dtype)
                           : static_cast<int64_t>(b);
      };
      std::string lo = Literal(e.dtype, e.lo, bound(std::ceil(e.lo)));
      std::string hi = Literal(e.dtype, e.hi, bound(std::floor(e.hi)));
      if (e.has_lo && e.has_hi) return absl::StrCat("kiln_clamp(", x, ", ", lo, ", ", hi, ")");
      if (e.has_lo) return absl::StrCat("(", x, " < ", lo, " ? ", lo, " : ", x, ")");
      if (e.has_hi) return absl::StrCat("(", x, " > ", hi, " ? ", hi, " : ", x, ")");
      return x;
    }
    case K::kRandom:
      // Only as many bits as the dtype's significand holds, so a value never rounds up to 1.
      if (e.dtype == DType::kF64)
        return absl::StrCat("kiln_uniform_f64(", args[0], ", ", args[1], ", ", e.ivalue, "u)");
      return absl::StrCat("kiln_uniform_f32(", args[0], ", ", args[1], ", ", e.ivalue, "u, ",
                          e.dtype == DType::kF16    ? 11
                          : e.dtype == DType::kBF16 ? 8
                                                    : 24,
                          ")");
    case K::kLoad:
    case K::kGather:
    case K::kStoreAlso:
    case K::kReduce:
      break;
  }
  return "/*unreachable*/0";
}

std::string ReduceInit(const std::string& op, DType t) {
  bool fl = ir::IsFloat(t);
  if (op == "sum") return Literal(t, 0, 0);
  if (op == "prod") return Literal(t, 1, 1);
  if (op == "any") return "0";
  if (op == "all") return "1";
  bool up = op == "max" || op == "argmax";
  if (fl) return Literal(t, up ? -INFINITY : INFINITY, 0);
  if (t == DType::kBool) return up ? "false" : "true";
  return absl::StrCat(up ? "kiln_lowest<" : "kiln_highest<", StorageType(t, false), ">()");
}

std::string ReduceClauseOp(const std::string& op) {
  return op == "sum" ? "+" : op == "prod" ? "*" : op == "any" ? "|" : op == "all" ? "&" : op;
}

std::string ReduceCombine(const std::string& op, const std::string& acc, const std::string& v,
                          DType t) {
  if (op == "sum") return absl::StrCat(acc, " += ", v, ";");
  if (op == "prod") return absl::StrCat(acc, " *= ", v, ";");
  if (op == "any") return absl::StrCat(acc, " |= (int)", v, ";");
  if (op == "all") return absl::StrCat(acc, " &= (int)", v, ";");
  const char* cmp = op == "max" ? ">" : "<";
  std::string s = absl::StrCat(acc, " = ", v, " ", cmp, " ", acc, " ? ", v, " : ", acc, ";");
  if (ir::IsFloat(t)) absl::StrAppend(&s, " ", acc, "_nan |= (int)(", v, " != ", v, ");");
  return s;
}

}  // namespace kiln::codegen
