// Runtime helpers shared by the CPU and CUDA runtime headers: the ops whose NumPy semantics
// take more than one expression (NaN-propagating maximum/minimum, Python-style floor division
// and modulo, integer powers). Each backend header defines, before including this one:
//   KILN_FN                       the qualifiers of a helper (inline; __device__ for CUDA)
//   kiln_fmod, kiln_floor, kiln_copysign   for float and double
#pragma once

// maximum/minimum propagate NaN from either side.
KILN_FN float kiln_maximum(float a, float b) { return (a > b || a != a) ? a : b; }
KILN_FN double kiln_maximum(double a, double b) { return (a > b || a != a) ? a : b; }
KILN_FN float kiln_minimum(float a, float b) { return (a < b || a != a) ? a : b; }
KILN_FN double kiln_minimum(double a, double b) { return (a < b || a != a) ? a : b; }
template <typename T> KILN_FN T kiln_maximum(T a, T b) { return a > b ? a : b; }
template <typename T> KILN_FN T kiln_minimum(T a, T b) { return a < b ? a : b; }

template <typename T> KILN_FN T kiln_clamp(T x, T lo, T hi) { return x < lo ? lo : (x > hi ? hi : x); }
KILN_FN int64_t kiln_clampi(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Python's floor division and modulo on floats, computed as NumPy's divmod does.
template <typename T> KILN_FN T kiln_float_floordiv(T a, T b) {
  if (b == 0) return a / b;
  T mod = kiln_fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
  if (div == 0) return kiln_copysign(T(0), a / b);
  T fl = kiln_floor(div);
  if (div - fl > T(0.5)) fl += T(1);
  return fl;
}
template <typename T> KILN_FN T kiln_float_remainder(T a, T b) {
  if (b == 0) return kiln_fmod(a, b);
  T mod = kiln_fmod(a, b);
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) mod += b;
  } else {
    mod = kiln_copysign(T(0), b);
  }
  return mod;
}
KILN_FN float kiln_floordiv(float a, float b) { return kiln_float_floordiv(a, b); }
KILN_FN double kiln_floordiv(double a, double b) { return kiln_float_floordiv(a, b); }
KILN_FN float kiln_remainder(float a, float b) { return kiln_float_remainder(a, b); }
KILN_FN double kiln_remainder(double a, double b) { return kiln_float_remainder(a, b); }
// Integers: division by zero gives 0 (NumPy warns and gives 0); no trap on MIN / -1.
template <typename T> KILN_FN T kiln_floordiv(T a, T b) {
  if (b == 0) return T(0);
  if (b == T(-1)) return T(-a);
  T q = T(a / b);
  if ((a % b != 0) && ((a < 0) != (b < 0))) q = T(q - 1);
  return q;
}
template <typename T> KILN_FN T kiln_remainder(T a, T b) {
  if (b == 0 || b == T(-1)) return T(0);
  T r = T(a % b);
  if (r != 0 && ((r < 0) != (b < 0))) r = T(r + b);
  return r;
}
template <typename T> KILN_FN T kiln_pow(T a, T b) {
  if (b < 0) return a == 1 ? T(1) : (a == T(-1) ? T((b % 2) ? -1 : 1) : T(0));
  T r = 1;
  while (b) {
    if (b & 1) r = T(r * a);
    a = T(a * a);
    b = T(b >> 1);
  }
  return r;
}
KILN_FN bool kiln_pow(bool a, bool b) { return a || !b; }

// Counter-based random numbers: Philox4x32 with 10 rounds (Salmon, Moraes, Dror and Shaw,
// "Parallel random numbers: as easy as 1, 2, 3", SC'11). The number at an element is a pure
// function of (seed, the element's position, stream): any thread or SIMD lane computes any
// element without shared state, a kernel that recomputes an element gets the same number, and
// a part compiled for one layout or one fusion draws what another would. Key: the seed's two
// words; counter: the position's two words, the stream, 0. The first two output words are
// returned.
struct kiln_philox_words {
  uint32_t x, y;
};
KILN_FN kiln_philox_words kiln_philox(uint64_t seed, uint64_t position, uint32_t stream) {
  uint32_t c0 = (uint32_t)position, c1 = (uint32_t)(position >> 32), c2 = stream, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  kiln_philox_words w = {c0, c1};
  return w;
}
// Uniform in [0, 1) on a grid of 2^-bits (bits <= 24: every value exact in float, and a value
// converted to a narrower float type never rounds up to 1).
KILN_FN float kiln_uniform_f32(int64_t seed, int64_t position, uint32_t stream, int bits) {
  const uint32_t x = kiln_philox((uint64_t)seed, (uint64_t)position, stream).x;
  return (float)(x >> (32 - bits)) * (1.0f / (float)(1u << bits));
}
// Uniform in [0, 1) on a grid of 2^-53: the first two words' top 53 bits.
KILN_FN double kiln_uniform_f64(int64_t seed, int64_t position, uint32_t stream) {
  const kiln_philox_words w = kiln_philox((uint64_t)seed, (uint64_t)position, stream);
  return (double)(((uint64_t)w.x << 21) | (w.y >> 11)) * (1.0 / 9007199254740992.0);
}
