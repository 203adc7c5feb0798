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

// maximum/minimum propagate NaN from either side.
KILN_INLINE float kiln_maximum(float a, float b) { return (a > b || a != a) ? a : b; }
KILN_INLINE double kiln_maximum(double a, double b) { return (a > b || a != a) ? a : b; }
KILN_INLINE float kiln_minimum(float a, float b) { return (a < b || a != a) ? a : b; }
KILN_INLINE double kiln_minimum(double a, double b) { return (a < b || a != a) ? a : b; }
template <typename T> KILN_INLINE T kiln_maximum(T a, T b) { return a > b ? a : b; }
template <typename T> KILN_INLINE T kiln_minimum(T a, T b) { return a < b ? a : b; }

template <typename T> KILN_INLINE T kiln_clamp(T x, T lo, T hi) { return x < lo ? lo : (x > hi ? hi : x); }
KILN_INLINE int64_t kiln_clampi(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Python's floor division and modulo on floats, computed as NumPy's divmod does.
KILN_INLINE float kiln_fmod(float a, float b) { return fmodf(a, b); }
KILN_INLINE double kiln_fmod(double a, double b) { return fmod(a, b); }
template <typename T> KILN_INLINE T kiln_float_floordiv(T a, T b) {
  if (b == 0) return a / b;
  T mod = kiln_fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
  if (div == 0) return __builtin_copysign(T(0), a / b);
  T fl = kiln_floor(div);
  if (div - fl > T(0.5)) fl += T(1);
  return fl;
}
template <typename T> KILN_INLINE T kiln_float_remainder(T a, T b) {
  if (b == 0) return kiln_fmod(a, b);
  T mod = kiln_fmod(a, b);
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) mod += b;
  } else {
    mod = __builtin_copysign(T(0), b);
  }
  return mod;
}
KILN_INLINE float kiln_floordiv(float a, float b) { return kiln_float_floordiv(a, b); }
KILN_INLINE double kiln_floordiv(double a, double b) { return kiln_float_floordiv(a, b); }
KILN_INLINE float kiln_remainder(float a, float b) { return kiln_float_remainder(a, b); }
KILN_INLINE double kiln_remainder(double a, double b) { return kiln_float_remainder(a, b); }
// Integers: division by zero gives 0 (NumPy warns and gives 0); no trap on MIN / -1.
template <typename T> KILN_INLINE T kiln_floordiv(T a, T b) {
  if (b == 0) return T(0);
  if (b == T(-1)) return T(-a);
  T q = T(a / b);
  if ((a % b != 0) && ((a < 0) != (b < 0))) q = T(q - 1);
  return q;
}
template <typename T> KILN_INLINE T kiln_remainder(T a, T b) {
  if (b == 0 || b == T(-1)) return T(0);
  T r = T(a % b);
  if (r != 0 && ((r < 0) != (b < 0))) r = T(r + b);
  return r;
}
template <typename T> KILN_INLINE T kiln_pow(T a, T b) {
  if (b < 0) return a == 1 ? T(1) : (a == T(-1) ? T((b % 2) ? -1 : 1) : T(0));
  T r = 1;
  while (b) {
    if (b & 1) r = T(r * a);
    a = T(a * a);
    b = T(b >> 1);
  }
  return r;
}
KILN_INLINE bool kiln_pow(bool a, bool b) { return a || !b; }

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
