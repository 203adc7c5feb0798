// Runtime support included by every generated CUDA translation unit (compiled by NVRTC).
//
// Generated code names math as overloaded kiln_<op> helpers (kernels/codegen/c_expr.h); here
// they map onto CUDA's device math library with IEEE semantics (the unit is compiled without
// fast-math, so division and sqrt are correctly rounded and denormals are kept), matching the
// CPU backend's numerics contract. Also here: half/bfloat16 conversions, 16-byte vector loads
// and stores, and block reductions built from warp shuffles.
//
// The generated unit defines KILN_NEED_FP16 / KILN_NEED_BF16 before including this header
// when it uses those types, so units without them skip parsing the large CUDA half headers.
// A test build may define KILN_CUDA_EMULATION to compile the same text as host C++ against a
// software model of the CUDA built-ins.
#pragma once

#ifndef KILN_CUDA_EMULATION
#ifndef __CUDACC_RTC__
#include <stdint.h>  // nvcc (a benchmark, an extension build) has the C library
#else
// NVRTC has no C library headers; these are the LP64 widths CUDA uses.
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#endif
#if defined(KILN_NEED_FP16) || defined(KILN_NEED_BF16)
#include <cuda_fp16.h>
#endif
#ifdef KILN_NEED_BF16
#include <cuda_bf16.h>
#endif
#endif

// Infinity and NaN literals the shared expression printer writes as GCC built-ins, which
// NVRTC lacks. Constant-folded, so they also work in static initializers.
#ifndef KILN_CUDA_EMULATION
#define __builtin_inff() (1.0f / 0.0f)
#define __builtin_inf() (1.0 / 0.0)
#define __builtin_nanf(s) (0.0f / 0.0f)
#define __builtin_nan(s) (0.0 / 0.0)
#endif

#define KILN_D static __device__ __forceinline__

#define KILN_UNARY(name)                                          \
  KILN_D float kiln_##name(float x) { return name##f(x); }        \
  KILN_D double kiln_##name(double x) { return name(x); }
KILN_UNARY(exp) KILN_UNARY(exp2) KILN_UNARY(expm1) KILN_UNARY(log) KILN_UNARY(log2)
KILN_UNARY(log1p) KILN_UNARY(tan) KILN_UNARY(tanh)
KILN_UNARY(asin) KILN_UNARY(acos) KILN_UNARY(atan) KILN_UNARY(sinh) KILN_UNARY(cosh)
KILN_UNARY(erf) KILN_UNARY(sqrt) KILN_UNARY(floor) KILN_UNARY(ceil) KILN_UNARY(trunc)
#undef KILN_UNARY

// ---- sin and cos of one argument, computed together.
//
// A memory-bound kernel with sin and cos (a rotary embedding, sin(x)^2 + cos(x)^2) runs out of
// arithmetic before bandwidth on a GPU whose memory is fast for its SM count (H200: 4.8 TB/s on
// 132 SMs). sinf and cosf called apart each reduce the argument; sincosf reduces it once. On an
// H200, sin(x)^2 + cos(x)^2 over 64M floats ran at 86% of the copy rate with sinf and cosf and
// at 95% with sincosf, at equal accuracy (tests/bench/gpu/transcendentals.cu). Generated code
// calls kiln_sincos for every sin and cos, one call per argument (ScopedEmitter::PairsSinCos);
// where only one half is used the compiler drops the other (a lone sin compiles to about the
// same PTX as sinf).
KILN_D void kiln_sincos(float x, float* s, float* c) { sincosf(x, s, c); }
KILN_D void kiln_sincos(double x, double* s, double* c) { sincos(x, s, c); }
KILN_D float kiln_sin(float x) { return sinf(x); }
KILN_D double kiln_sin(double x) { return sin(x); }
KILN_D float kiln_cos(float x) { return cosf(x); }
KILN_D double kiln_cos(double x) { return cos(x); }

// Round half to even, as NumPy does: rint in the default rounding mode.
KILN_D float kiln_round(float x) { return rintf(x); }
KILN_D double kiln_round(double x) { return rint(x); }
KILN_D float kiln_pow(float a, float b) { return powf(a, b); }
KILN_D double kiln_pow(double a, double b) { return pow(a, b); }
KILN_D float kiln_atan2(float a, float b) { return atan2f(a, b); }
KILN_D double kiln_atan2(double a, double b) { return atan2(a, b); }
KILN_D float kiln_fmod(float a, float b) { return fmodf(a, b); }
KILN_D double kiln_fmod(double a, double b) { return fmod(a, b); }
KILN_D float kiln_copysign(float a, float b) { return copysignf(a, b); }
KILN_D double kiln_copysign(double a, double b) { return copysign(a, b); }

// rsqrt as 1/sqrt (both correctly rounded) rather than the approximate rsqrtf, so results
// agree with the CPU backend.
template <typename T> KILN_D T kiln_rsqrt(T x) { return T(1) / kiln_sqrt(x); }
template <typename T> KILN_D T kiln_reciprocal(T x) { return T(1) / x; }
template <typename T> KILN_D T kiln_sigmoid(T x) { return T(1) / (T(1) + kiln_exp(-x)); }
KILN_D float kiln_abs(float x) { return fabsf(x); }
KILN_D double kiln_abs(double x) { return fabs(x); }
template <typename T> KILN_D T kiln_abs(T x) { return x < 0 ? T(-x) : x; }
KILN_D bool kiln_abs(bool x) { return x; }
// NaN and signed zero pass through, as in NumPy.
KILN_D float kiln_sign(float x) { return x > 0 ? 1.0f : (x < 0 ? -1.0f : x); }
KILN_D double kiln_sign(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : x); }
template <typename T> KILN_D T kiln_sign(T x) { return T((x > 0) - (x < 0)); }
KILN_D bool kiln_isinf(float x) { return isinf(x); }
KILN_D bool kiln_isinf(double x) { return isinf(x); }

#define KILN_FN KILN_D
#include "kiln_common.h"

// Extremes of the integer types (reduction identities); NVRTC has no <limits>.
template <typename T> struct kiln_limits;
#define KILN_LIMITS(T, lo_, hi_)                         \
  template <> struct kiln_limits<T> {                    \
    static constexpr T lo = lo_;                         \
    static constexpr T hi = hi_;                         \
  };
KILN_LIMITS(int8_t, -128, 127)
KILN_LIMITS(int16_t, -32768, 32767)
KILN_LIMITS(int32_t, -2147483647 - 1, 2147483647)
KILN_LIMITS(int64_t, -9223372036854775807LL - 1, 9223372036854775807LL)
KILN_LIMITS(uint8_t, 0, 255)
KILN_LIMITS(bool, false, true)
#undef KILN_LIMITS
template <typename T> KILN_D T kiln_lowest() { return kiln_limits<T>::lo; }
template <typename T> KILN_D T kiln_highest() { return kiln_limits<T>::hi; }

// Half types are stored as such and computed in float; half constants are kept as float.
KILN_D float kiln_to_float(float x) { return x; }
#if defined(KILN_NEED_FP16) || defined(KILN_NEED_BF16)
KILN_D float kiln_to_float(__half x) { return __half2float(x); }
KILN_D __half kiln_to_f16(float x) { return __float2half_rn(x); }
#endif
#ifdef KILN_NEED_BF16
KILN_D float kiln_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
KILN_D __nv_bfloat16 kiln_to_bf16(float x) { return __float2bfloat16_rn(x); }
#endif

// ---- Vector memory access. REQUIRES: `p` aligned to N * sizeof(T) bytes (the launch plan's
// alignment contract), `r` a local array declared __align__(16).
template <int kBytes> struct kiln_vec_bytes;
template <> struct kiln_vec_bytes<16> { typedef uint4 type; };
template <> struct kiln_vec_bytes<8> { typedef uint2 type; };
template <> struct kiln_vec_bytes<4> { typedef unsigned int type; };
template <> struct kiln_vec_bytes<2> { typedef unsigned short type; };
template <> struct kiln_vec_bytes<1> { typedef unsigned char type; };
// The CPU emulation of the tests (KILN_EMULATION) traps on a misaligned one, as a GPU faults.
#ifdef KILN_EMULATION
#define KILN_CHECK_ALIGNED(p, bytes) \
  if (reinterpret_cast<unsigned long long>(p) % (bytes) != 0) __builtin_trap()
#else
#define KILN_CHECK_ALIGNED(p, bytes)
#endif
template <int N, typename T> KILN_D void kiln_vload(T* r, const T* p) {
  typedef typename kiln_vec_bytes<N * sizeof(T)>::type V;
  KILN_CHECK_ALIGNED(p, N * sizeof(T));
  *reinterpret_cast<V*>(r) = *reinterpret_cast<const V*>(p);
}
template <int N, typename T> KILN_D void kiln_vstore(T* p, const T* r) {
  typedef typename kiln_vec_bytes<N * sizeof(T)>::type V;
  KILN_CHECK_ALIGNED(p, N * sizeof(T));
  *reinterpret_cast<V*>(p) = *reinterpret_cast<const V*>(r);
}
// The same for the last vector of a range whose length no vector width divides: `n` elements
// are left (n >= N: a whole vector); the lanes past them read as zero and are not written.
template <int N, typename T> KILN_D void kiln_vload_n(T* r, const T* p, int n) {
  if (n >= N) {
    kiln_vload<N>(r, p);
    return;
  }
#pragma unroll
  for (int i = 0; i < N; ++i) r[i] = i < n ? p[i] : T();
}
template <int N, typename T> KILN_D void kiln_vstore_n(T* p, const T* r, int n) {
  if (n >= N) {
    kiln_vstore<N>(p, r);
    return;
  }
  // A loop bounded by N, not n: fully unrolled, so `r` stays in registers (indexing it with a
  // run-time bound would put the array in local memory, for every thread).
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (i < n) p[i] = r[i];
}

// ---- Reductions across the threads that share a row. A row is TR consecutive threads of
// the block (TR a power of two): TR <= 32 stays inside a warp; TR > 32 is the whole block and
// goes through shared memory (`smem`: 512 bytes, 16-byte aligned). Every thread of the block
// must call these the same number of times (they contain barriers and full-warp shuffles),
// and all threads of a row get the same result: each butterfly step combines a pair of
// values in both lanes with a commutative operation, so the order is fixed and the result
// deterministic.
KILN_D float kiln_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
KILN_D double kiln_shfl_xor(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
KILN_D int kiln_shfl_xor(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
KILN_D long long kiln_shfl_xor(long long v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
template <typename T> KILN_D T kiln_shfl_xor(T v, int m) {  // other integers and bool
  if constexpr (sizeof(T) == 8) {
    return (T)__shfl_xor_sync(0xffffffffu, (long long)v, m);
  } else {
    return (T)__shfl_xor_sync(0xffffffffu, (int)v, m);
  }
}

struct kiln_op_sum {
  template <typename T> KILN_D T apply(T a, T b) { return T(a + b); }
};
struct kiln_op_prod {
  template <typename T> KILN_D T apply(T a, T b) { return T(a * b); }
};
struct kiln_op_max {
  template <typename T> KILN_D T apply(T a, T b) { return kiln_maximum(a, b); }
};
struct kiln_op_min {
  template <typename T> KILN_D T apply(T a, T b) { return kiln_minimum(a, b); }
};
struct kiln_op_or {
  template <typename T> KILN_D T apply(T a, T b) { return T(a | b); }
};
struct kiln_op_and {
  template <typename T> KILN_D T apply(T a, T b) { return T(a & b); }
};

template <int TR, typename Op, typename T> KILN_D T kiln_row_reduce(T v, void* smem) {
  constexpr int kW = TR < 32 ? TR : 32;
  for (int m = kW / 2; m > 0; m >>= 1) v = Op::apply(v, kiln_shfl_xor(v, m));
  if constexpr (TR > 32) {
    constexpr int kWarps = TR / 32;
    T* s = static_cast<T*>(smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // readers of an earlier reduction's partials are done
    if (lane == 0) s[warp] = v;
    __syncthreads();
    v = s[lane & (kWarps - 1)];
    for (int m = kWarps / 2; m > 0; m >>= 1) v = Op::apply(v, kiln_shfl_xor(v, m));
  }
  return v;
}

// Whether (v, i) beats (a, j) for argmax (kMax) or argmin: the better value, then the lower
// index; NaN beats numbers (NumPy's rule).
template <bool kMax> KILN_D bool kiln_arg_better(float v, long long i, float a, long long j) {
  bool vn = v != v, an = a != a;
  if (vn || an) return vn && (!an || i < j);
  if (kMax ? v > a : v < a) return true;
  return v == a && i < j;
}
template <bool kMax> KILN_D bool kiln_arg_better(double v, long long i, double a, long long j) {
  bool vn = v != v, an = a != a;
  if (vn || an) return vn && (!an || i < j);
  if (kMax ? v > a : v < a) return true;
  return v == a && i < j;
}
template <bool kMax, typename T> KILN_D bool kiln_arg_better(T v, long long i, T a, long long j) {
  if (kMax ? v > a : v < a) return true;
  return v == a && i < j;
}

template <int TR, bool kMax, typename T> KILN_D void kiln_row_arg(T& v, long long& i, void* smem) {
  constexpr int kW = TR < 32 ? TR : 32;
  for (int m = kW / 2; m > 0; m >>= 1) {
    T ov = kiln_shfl_xor(v, m);
    long long oi = kiln_shfl_xor(i, m);
    if (kiln_arg_better<kMax>(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
  if constexpr (TR > 32) {
    constexpr int kWarps = TR / 32;
    T* sv = static_cast<T*>(smem);
    long long* si = reinterpret_cast<long long*>(static_cast<char*>(smem) + 256);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) {
      sv[warp] = v;
      si[warp] = i;
    }
    __syncthreads();
    v = sv[lane & (kWarps - 1)];
    i = si[lane & (kWarps - 1)];
    for (int m = kWarps / 2; m > 0; m >>= 1) {
      T ov = kiln_shfl_xor(v, m);
      long long oi = kiln_shfl_xor(i, m);
      if (kiln_arg_better<kMax>(ov, oi, v, i)) {
        v = ov;
        i = oi;
      }
    }
  }
}

// ---- Reductions across the y-groups of a column tile: the block is 32 x Y threads, lane =
// column, warp = y-group; each thread gets its column's total, combined in y order (fixed,
// so deterministic). `smem`: Y * 32 * 16 bytes, 16-byte aligned. Every thread of the block
// must call these the same number of times.
template <int Y, typename Op, typename T> KILN_D T kiln_col_reduce(T v, void* smem) {
  T* s = static_cast<T*>(smem);
  __syncthreads();
  s[threadIdx.x] = v;
  __syncthreads();
  const int c = threadIdx.x & 31;
  T r = s[c];
  for (int y = 1; y < Y; ++y) r = Op::apply(r, s[y * 32 + c]);
  return r;
}

template <int Y, bool kMax, typename T> KILN_D void kiln_col_arg(T& v, long long& i, void* smem) {
  T* sv = static_cast<T*>(smem);
  long long* si = reinterpret_cast<long long*>(static_cast<char*>(smem) + Y * 32 * 8);
  __syncthreads();
  sv[threadIdx.x] = v;
  si[threadIdx.x] = i;
  __syncthreads();
  const int c = threadIdx.x & 31;
  v = sv[c];
  i = si[c];
  for (int y = 1; y < Y; ++y) {
    if (kiln_arg_better<kMax>(sv[y * 32 + c], si[y * 32 + c], v, i)) {
      v = sv[y * 32 + c];
      i = si[y * 32 + c];
    }
  }
}
