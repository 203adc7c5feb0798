// Runtime support included by every generated CPU translation unit.
//
// Generated code names math as overloaded kiln_<op> helpers; here they map onto glibc's
// libmvec (declared with the simd attribute, so `#pragma omp simd` loops call the vector
// variants) and onto GCC builtins that vectorise inline. No <cmath>: its declarations would
// lack the simd attribute. Defining KILN_NO_VECTOR_MATH keeps every call scalar.
#pragma once

#include <stdint.h>

#include <limits>

#ifdef KILN_NO_VECTOR_MATH
#define KILN_VEC __attribute__((const, nothrow))
#else
#define KILN_VEC __attribute__((simd("notinbranch"), const, nothrow))
#endif
#define KILN_INLINE static inline __attribute__((always_inline))

extern "C" {
#define KILN_DECLARE(name)            \
  KILN_VEC float name##f(float);      \
  KILN_VEC double name(double);
KILN_DECLARE(exp) KILN_DECLARE(exp2) KILN_DECLARE(expm1) KILN_DECLARE(log) KILN_DECLARE(log2)
KILN_DECLARE(log1p) KILN_DECLARE(sin) KILN_DECLARE(cos) KILN_DECLARE(tan) KILN_DECLARE(tanh)
KILN_DECLARE(asin) KILN_DECLARE(acos) KILN_DECLARE(atan) KILN_DECLARE(sinh) KILN_DECLARE(cosh)
KILN_DECLARE(erf)
KILN_VEC float powf(float, float);
KILN_VEC double pow(double, double);
KILN_VEC float atan2f(float, float);
KILN_VEC double atan2(double, double);
float fmodf(float, float) __attribute__((nothrow));
double fmod(double, double) __attribute__((nothrow));
#undef KILN_DECLARE
}

typedef uint16_t kiln_bf16;

#define KILN_UNARY(name)                                          \
  KILN_INLINE float kiln_##name(float x) { return name##f(x); }   \
  KILN_INLINE double kiln_##name(double x) { return name(x); }
KILN_UNARY(exp) KILN_UNARY(exp2) KILN_UNARY(expm1) KILN_UNARY(log) KILN_UNARY(log2)
KILN_UNARY(log1p) KILN_UNARY(sin) KILN_UNARY(cos) KILN_UNARY(tan) KILN_UNARY(tanh)
KILN_UNARY(asin) KILN_UNARY(acos) KILN_UNARY(atan) KILN_UNARY(sinh) KILN_UNARY(cosh)
KILN_UNARY(erf)
#undef KILN_UNARY

#define KILN_BUILTIN(name, fn)                                              \
  KILN_INLINE float kiln_##name(float x) { return __builtin_##fn##f(x); }   \
  KILN_INLINE double kiln_##name(double x) { return __builtin_##fn(x); }
KILN_BUILTIN(sqrt, sqrt) KILN_BUILTIN(floor, floor) KILN_BUILTIN(ceil, ceil)
KILN_BUILTIN(trunc, trunc) KILN_BUILTIN(round, roundeven)
#undef KILN_BUILTIN

KILN_INLINE float kiln_pow(float a, float b) { return powf(a, b); }
KILN_INLINE double kiln_pow(double a, double b) { return pow(a, b); }
KILN_INLINE float kiln_atan2(float a, float b) { return atan2f(a, b); }
KILN_INLINE double kiln_atan2(double a, double b) { return atan2(a, b); }

template <typename T> KILN_INLINE T kiln_rsqrt(T x) { return T(1) / kiln_sqrt(x); }
template <typename T> KILN_INLINE T kiln_reciprocal(T x) { return T(1) / x; }
template <typename T> KILN_INLINE T kiln_sigmoid(T x) { return T(1) / (T(1) + kiln_exp(-x)); }
KILN_INLINE float kiln_abs(float x) { return __builtin_fabsf(x); }
KILN_INLINE double kiln_abs(double x) { return __builtin_fabs(x); }
template <typename T> KILN_INLINE T kiln_abs(T x) { return x < 0 ? T(-x) : x; }
KILN_INLINE bool kiln_abs(bool x) { return x; }
// NaN and signed zero pass through, as in NumPy.
KILN_INLINE float kiln_sign(float x) { return x > 0 ? 1.0f : (x < 0 ? -1.0f : x); }
KILN_INLINE double kiln_sign(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : x); }
template <typename T> KILN_INLINE T kiln_sign(T x) { return T((x > 0) - (x < 0)); }
KILN_INLINE bool kiln_isinf(float x) { return __builtin_fabsf(x) == __builtin_inff(); }
KILN_INLINE bool kiln_isinf(double x) { return __builtin_fabs(x) == __builtin_inf(); }

KILN_INLINE float kiln_fmod(float a, float b) { return fmodf(a, b); }
KILN_INLINE double kiln_fmod(double a, double b) { return fmod(a, b); }
KILN_INLINE float kiln_copysign(float a, float b) { return __builtin_copysignf(a, b); }
KILN_INLINE double kiln_copysign(double a, double b) { return __builtin_copysign(a, b); }
#define KILN_FN KILN_INLINE
#include "kiln_common.h"

template <typename T> KILN_INLINE T kiln_lowest() { return std::numeric_limits<T>::lowest(); }
template <typename T> KILN_INLINE T kiln_highest() { return std::numeric_limits<T>::max(); }

// Half types are stored as such and computed in float.
KILN_INLINE float kiln_to_float(float x) { return x; }  // half constants are kept as float
KILN_INLINE float kiln_to_float(_Float16 x) { return (float)x; }
KILN_INLINE _Float16 kiln_to_f16(float x) { return (_Float16)x; }
KILN_INLINE float kiln_to_float(kiln_bf16 x) {
  uint32_t u = (uint32_t)x << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
KILN_INLINE kiln_bf16 kiln_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (kiln_bf16)((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1);  // round to nearest even
  return (kiln_bf16)(u >> 16);
}

extern "C" int omp_get_max_threads(void);
