// How fast a memory-bound kernel with transcendentals can run on this GPU, against its copy rate:
// sin(x)^2 + cos(x)^2 over 64M f32 written the ways a code generator could write it, each timed
// side by side with a 16-byte vector copy of the same bytes, and each checked against double
// precision (largest error in ulp over the run's inputs).
//
//   nvcc -O3 -arch=sm_90 [--fmad=false] -o transcendentals tests/bench/gpu/transcendentals.cu
//   ./transcendentals [elements]
//
// Variants: "sinf+cosf" (two calls, two argument reductions), "sincosf" (one call, one
// reduction), "kiln_sincos" (what generated kernels call, kernels/runtime/kiln_cuda.h), and
// "intrinsics" (__sinf/__cosf, the hardware's approximations: shown for scale only, their
// error is far outside kiln's tolerance).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../../../kernels/runtime/kiln_cuda.h"

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

__global__ void Copy(const float4* __restrict__ in, float4* __restrict__ out, long n4) {
  long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i < n4) out[i] = in[i];
}

struct SinCos {
  __device__ static float F(float x) {
    float s = sinf(x), c = cosf(x);
    return s * s + c * c;
  }
};
struct SinCosF {
  __device__ static float F(float x) {
    float s, c;
    sincosf(x, &s, &c);
    return s * s + c * c;
  }
};
struct KilnSinCos {
  __device__ static float F(float x) {
    float s, c;
    kiln_sincos(x, &s, &c);
    return s * s + c * c;
  }
};
struct Intrinsics {
  __device__ static float F(float x) {
    float s = __sinf(x), c = __cosf(x);
    return s * s + c * c;
  }
};

template <class Op>
__global__ void Apply(const float4* __restrict__ in, float4* __restrict__ out, long n4) {
  long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i >= n4) return;
  float4 v = in[i];
  out[i] = make_float4(Op::F(v.x), Op::F(v.y), Op::F(v.z), Op::F(v.w));
}

// sin and cos of each input, for the accuracy check.
template <int Which>
__global__ void Parts(const float* __restrict__ in, float* __restrict__ s_out,
                      float* __restrict__ c_out, long n) {
  long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float x = in[i], s, c;
  if (Which == 0) {
    s = sinf(x);
    c = cosf(x);
  } else if (Which == 1) {
    sincosf(x, &s, &c);
  } else if (Which == 2) {
    kiln_sincos(x, &s, &c);
  } else {
    s = __sinf(x);
    c = __cosf(x);
  }
  s_out[i] = s;
  c_out[i] = c;
}

double UlpError(float got, double want) {
  if (std::isnan(got) || std::isnan(want)) return std::isnan(got) == std::isnan(want) ? 0 : 1e9;
  const float w = static_cast<float>(want);
  const float ulp = std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

template <class F>
float TimeMs(F launch, int iters) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> times;
  for (int r = 0; r < 7; ++r) {
    launch();
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    times.push_back(ms / iters);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 64L << 20;
  const long n4 = n / 4;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  // Inputs as a model's activations are: normal with a spread of a few units, plus a tail of
  // larger magnitudes (past 2^17 the reduction takes its slow path).
  std::vector<float> host(n);
  srand(1);
  for (long i = 0; i < n; ++i) {
    double u1 = (rand() + 1.0) / (RAND_MAX + 2.0), u2 = (rand() + 1.0) / (RAND_MAX + 2.0);
    double g = std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    host[i] = static_cast<float>(i % 4096 == 0 ? g * 1e6 : g * 4);
  }
  float *in, *out, *s_out, *c_out;
  CHECK(cudaMalloc(&in, n * sizeof(float)));
  CHECK(cudaMalloc(&out, n * sizeof(float)));
  CHECK(cudaMalloc(&s_out, n * sizeof(float)));
  CHECK(cudaMalloc(&c_out, n * sizeof(float)));
  CHECK(cudaMemcpy(in, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));

  const int block = 256;
  const unsigned grid = static_cast<unsigned>((n4 + block - 1) / block);
  const float4* in4 = reinterpret_cast<const float4*>(in);
  float4* out4 = reinterpret_cast<float4*>(out);
  const int iters = 50;
  const double bytes = 2.0 * n * sizeof(float);

  struct Row {
    const char* name;
    void (*kernel)(const float4*, float4*, long);
  };
  const Row rows[] = {
      {"copy", Copy},
      {"sinf+cosf", Apply<SinCos>},
      {"sincosf", Apply<SinCosF>},
      {"kiln_sincos", Apply<KilnSinCos>},
      {"intrinsics", Apply<Intrinsics>},
  };
  // Two rounds, interleaved, so that clocks and temperature affect every row alike.
  std::vector<float> best(sizeof rows / sizeof rows[0], 1e9f);
  for (int round = 0; round < 2; ++round)
    for (size_t r = 0; r < best.size(); ++r) {
      auto k = rows[r].kernel;
      best[r] = std::min(best[r], TimeMs([&] { k<<<grid, block>>>(in4, out4, n4); }, iters));
    }
  const double copy_gbs = bytes / (best[0] * 1e-3) / 1e9;
  std::printf("%-12s %9s %9s %9s %5s\n", "variant", "ms", "GB/s", "of copy", "regs");
  for (size_t r = 0; r < best.size(); ++r) {
    cudaFuncAttributes attr;
    CHECK(cudaFuncGetAttributes(&attr, rows[r].kernel));
    const double gbs = bytes / (best[r] * 1e-3) / 1e9;
    std::printf("%-12s %9.4f %9.0f %8.1f%% %5d\n", rows[r].name, best[r], gbs, 100 * gbs / copy_gbs,
                attr.numRegs);
  }

  // Accuracy of sin and cos themselves, against double precision, over every input.
  const char* names[] = {"sinf+cosf", "sincosf", "kiln_sincos", "intrinsics"};
  void (*parts[])(const float*, float*, float*, long) = {Parts<0>, Parts<1>, Parts<2>, Parts<3>};
  std::vector<float> s(n), c(n);
  const unsigned grid1 = static_cast<unsigned>((n + block - 1) / block);
  for (int v = 0; v < 4; ++v) {
    parts[v]<<<grid1, block>>>(in, s_out, c_out, n);
    CHECK(cudaMemcpy(s.data(), s_out, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(c.data(), c_out, n * sizeof(float), cudaMemcpyDeviceToHost));
    double worst_small = 0, worst_large = 0;
    for (long i = 0; i < n; ++i) {
      const double x = host[i];
      const double e = std::max(UlpError(s[i], std::sin(x)), UlpError(c[i], std::cos(x)));
      (std::fabs(x) < 105615 ? worst_small : worst_large) =
          std::max(std::fabs(x) < 105615 ? worst_small : worst_large, e);
    }
    std::printf("%-12s worst error %.2f ulp (|x| < 105615), %.2f ulp (larger)\n", names[v],
                worst_small, worst_large);
  }
  return 0;
}
