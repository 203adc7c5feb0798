// End-to-end compiler tests: graph -> passes -> schedule -> C++ -> g++ -> .so -> run.
#include <cmath>
#include <filesystem>
#include <random>

#include "tests/unit/kernels/test_util.h"

namespace kiln {
namespace {

using ir::DType;
using testing::Ty;

absl::StatusOr<CompileResult> CompileGraph(const ir::Graph& g) {
  ir::Graph copy = g;
  auto st = ir::VerifyAndInfer(copy);
  if (!st.ok()) return st;
  Target t;
  t.isa = "x86-64-v3";
  return testing::SharedPipeline().Compile(copy, t, CompileOptions{});
}

// x*sin(x) + cos(x)^2 - sin(x): unlike sin^2 + cos^2, every element's value depends on its own
// input element through every op, so a swapped function, a flipped operator or a wrong index
// changes the result.
TEST(Pipeline, SinCosChainIsOneKernel) {
  ir::Graph in;
  in.inputs = {Ty(DType::kF32, {1000})};
  ir::Builder b(in);
  ir::ValueId x = 0;
  auto s = *b.Add("sin", {x});
  auto c = *b.Add("cos", {x});
  auto xsin = *b.Add("mul", {x, s});
  auto c2 = *b.Add("mul", {c, c});
  auto r = *b.Add("sub", {*b.Add("add", {xsin, c2}), s});
  ir::Graph g = b.Finish({r});
  auto res = CompileGraph(g);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->stats.num_kernels, 1);
  testing::Loaded k(*res);
  EXPECT_EQ(k.abi(), 1u);
  // Load-time dependencies: glibc (libc, libm, libmvec) and libgomp only.
  auto dir = toolchain::TempDir::Create("kiln-needed-");
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(toolchain::WriteFile(dir->path() + "/k.so", res->artifacts[0].bytes).ok());
  auto deps =
      toolchain::RunSandboxed({"readelf", "-d", "k.so"}, dir->path(), toolchain::SandboxLimits{});
  ASSERT_TRUE(deps.ok());
  for (size_t at = deps->output.find("Shared library: ["); at != std::string::npos;
       at = deps->output.find("Shared library: [", at + 1)) {
    std::string lib = deps->output.substr(at + 17, deps->output.find(']', at) - at - 17);
    EXPECT_TRUE(lib == "libc.so.6" || lib == "libm.so.6" || lib == "libmvec.so.1" ||
                lib == "libgomp.so.1")
        << lib;
  }
  std::vector<float> xs(1000), out(1000, -1);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-10, 10);
  for (float& v : xs) v = d(rng);
  ASSERT_EQ(k.Run({xs.data(), out.data()}), 0);
  for (int i = 0; i < 1000; ++i) {
    const double sx = std::sin(static_cast<double>(xs[i])),
                 cx = std::cos(static_cast<double>(xs[i]));
    const double want = xs[i] * sx + cx * cx - sx;
    EXPECT_NEAR(out[i], want, 2e-5 * (1 + std::fabs(want))) << i << " x=" << xs[i];
  }
}

TEST(Pipeline, KMeansAssignmentIsOneKernel) {
  const int64_t n = 1001, kc = 5;
  ir::Graph in;
  in.inputs = {Ty(DType::kF64, {n, 2}), Ty(DType::kF64, {kc, 2})};
  ir::Builder b(in);
  auto m3 = *b.Add("unsqueeze", {1}, {{"axes", ir::IntList{1}}});
  auto diff = *b.Add("sub", {0, m3});
  auto nrm = *b.Add("norm", {diff}, {{"axes", ir::IntList{2}}});
  auto am = *b.Add("argmin", {nrm}, {{"axis", int64_t{0}}});
  ir::Graph g = b.Finish({am});
  auto res = CompileGraph(g);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->stats.num_kernels, 1) << res->artifacts[2].bytes;
  EXPECT_EQ(res->plan.workspace_bytes, 0);
  testing::Loaded k(*res);
  std::vector<double> X(n * 2), M(kc * 2);
  std::mt19937 rng(2);
  std::normal_distribution<double> d;
  for (double& v : X) v = d(rng);
  for (double& v : M) v = d(rng);
  std::vector<int64_t> out(n, -1);
  ASSERT_EQ(k.Run({X.data(), M.data(), out.data()}), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = 0;
    double bd = INFINITY;
    for (int64_t c = 0; c < kc; ++c) {
      double dx = X[i * 2] - M[c * 2], dy = X[i * 2 + 1] - M[c * 2 + 1];
      double dd = std::sqrt(dx * dx + dy * dy);
      if (dd < bd) {
        bd = dd;
        best = c;
      }
    }
    EXPECT_EQ(out[i], best) << i;
  }
}

TEST(Pipeline, RowSoftmaxIsOneKernel) {
  const int64_t r = 37, c = 129;
  ir::Graph in;
  in.inputs = {Ty(DType::kF32, {r, c})};
  ir::Builder b(in);
  auto sm = *b.Add("softmax", {0}, {{"axis", int64_t{-1}}});
  auto res = CompileGraph(b.Finish({sm}));
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->stats.num_kernels, 1) << res->artifacts[2].bytes;
  testing::Loaded k(*res);
  std::vector<float> x(r * c), out(r * c);
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0, 3);
  for (float& v : x) v = d(rng);
  ASSERT_EQ(k.Run({x.data(), out.data()}), 0);
  for (int64_t i = 0; i < r; ++i) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < c; ++j) m = std::max<double>(m, x[i * c + j]);
    for (int64_t j = 0; j < c; ++j) s += std::exp(x[i * c + j] - m);
    for (int64_t j = 0; j < c; ++j)
      EXPECT_NEAR(out[i * c + j], std::exp(x[i * c + j] - m) / s, 1e-6);
  }
}

TEST(Pipeline, ColumnSumFeedingRowOpIsStored) {
  // x / sum(x, axis=0): inlining the column sum into the (row, col) loop would recompute it
  // per row, so the scheduler must store it.
  const int64_t r = 8, c = 16;
  ir::Graph in;
  in.inputs = {Ty(DType::kF32, {r, c})};
  ir::Builder b(in);
  auto s = *b.Add("sum", {0}, {{"axes", ir::IntList{0}}, {"keepdim", true}});
  auto q = *b.Add("div", {0, s});
  auto res = CompileGraph(b.Finish({q}));
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->stats.num_kernels, 2) << res->artifacts[2].bytes;
  EXPECT_NE(res->artifacts[2].bytes.find("not fused"), std::string::npos);
  testing::Loaded k(*res);
  std::vector<float> x(r * c), out(r * c);
  for (int64_t i = 0; i < r * c; ++i) x[i] = static_cast<float>(i % 7 + 1);
  ASSERT_EQ(k.Run({x.data(), out.data()}), 0);
  for (int64_t j = 0; j < c; ++j) {
    float col = 0;
    for (int64_t i = 0; i < r; ++i) col += x[i * c + j];
    for (int64_t i = 0; i < r; ++i) EXPECT_FLOAT_EQ(out[i * c + j], x[i * c + j] / col);
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Threads of this process now.
int ThreadCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

int KernelsOf(const ir::Graph& g) {
  ir::Graph copy = g;
  EXPECT_TRUE(ir::VerifyAndInfer(copy).ok());
  auto gen = testing::SharedPipeline().Generate(copy, Target{}, CompileOptions{});
  EXPECT_TRUE(gen.ok()) << gen.status();
  return gen.ok() ? gen->num_kernels : -1;
}

TEST(Fusion, LayerNormThenGeluIsOneKernel) {
  ir::Graph in;
  in.inputs = {Ty(DType::kF32, {64, 256}), Ty(DType::kF32, {256}), Ty(DType::kF32, {256})};
  ir::Builder b(in);
  auto ln = *b.Add("layer_norm", {0, 1, 2});
  auto ge = *b.Add("gelu", {ln});
  EXPECT_EQ(KernelsOf(b.Finish({ge})), 1);
}

TEST(Fusion, LltmTailIsOneKernelWithTwoOutputs) {
  const int64_t batch = 16, s = 32;
  ir::Graph in;
  in.inputs = {Ty(DType::kF32, {batch, 3 * s}), Ty(DType::kF32, {batch, s})};
  ir::Builder b(in);
  auto part = [&](int k) {
    return *b.Add("slice", {0},
                  {{"axes", ir::IntList{1}},
                   {"starts", ir::IntList{k * s}},
                   {"stops", ir::IntList{(k + 1) * s}}});
  };
  auto ig = *b.Add("sigmoid", {part(0)});
  auto og = *b.Add("sigmoid", {part(1)});
  auto cc = *b.Add("elu", {part(2)});
  auto c_new = *b.Add("add", {1, *b.Add("mul", {cc, ig})});
  auto h_new = *b.Add("mul", {*b.Add("tanh", {c_new}), og});
  ir::Graph g = b.Finish({h_new, c_new});
  EXPECT_EQ(KernelsOf(g), 1);
  auto res = CompileGraph(g);
  ASSERT_TRUE(res.ok()) << res.status();
  testing::Loaded k(*res);
  std::vector<float> gates(batch * 3 * s), c(batch * s), h_out(batch * s), c_out(batch * s);
  std::mt19937 rng(5);
  std::normal_distribution<float> d;
  for (float& v : gates) v = d(rng);
  for (float& v : c) v = d(rng);
  ASSERT_EQ(k.Run({gates.data(), c.data(), h_out.data(), c_out.data()}), 0);
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  for (int64_t i = 0; i < batch; ++i)
    for (int64_t j = 0; j < s; ++j) {
      double gi = sig(gates[i * 3 * s + j]), go = sig(gates[i * 3 * s + s + j]);
      double x = gates[i * 3 * s + 2 * s + j];
      double gc = x > 0 ? x : std::expm1(x);
      double cn = c[i * s + j] + gc * gi;
      EXPECT_NEAR(c_out[i * s + j], cn, 1e-5);
      EXPECT_NEAR(h_out[i * s + j], std::tanh(cn) * go, 1e-5);
    }
}

TEST(Fusion, ExternOpIsRejectedAsPartitionBoundary) {
  ir::Graph in;
  in.inputs = {Ty(DType::kF32, {4, 8}), Ty(DType::kF32, {8, 2})};
  ir::Builder b(in);
  auto mm = *b.Add("matmul", {0, 1});
  ir::Graph g = b.Finish({mm});
  auto gen = testing::SharedPipeline().Generate(g, Target{}, CompileOptions{});
  ASSERT_FALSE(gen.ok());
  EXPECT_EQ(gen.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gen.status().message().find("matmul"), std::string::npos);
}

// A value that depends only on the inner loops (here the divisors of a 2x2 average pool that
// leaves out padding, as nf_regnet_b0's downsampling computes them) is computed once into a
// table on the kernel's stack. With AVX-512 and 24-float rows GCC 12 stores the rows with
// aligned 256-bit moves, which fault unless the table itself is declared aligned (cpu_emitter.cc,
// kStackArray) and the compiler aligns the frame. The kernel runs here under callers whose
// frames differ by 16 bytes, and its results are checked.
__attribute__((noinline)) int RunBelowPad(testing::Loaded& k, std::vector<void*> args, int pad) {
  volatile char* frame = static_cast<volatile char*>(alloca(static_cast<size_t>(pad)));
  frame[0] = 0;
  return k.Run(std::move(args), 2) + frame[0];
}

TEST(Codegen, StackTableRunsUnderAnyFrameAlignment) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "needs an AVX-512 host";
  ir::Graph in;
  in.inputs = {Ty(DType::kF32, {2, 40, 48, 48})};
  ir::Builder b(in);
  // Window counts per output row and column: min(2i + 2, 48) - max(2i, 0), as floats.
  auto counts = [&](int64_t axis) {
    auto i = *b.Add("iota", {},
                    {{"shape", ir::IntList{24, 24}}, {"axis", axis}, {"dtype", DType::kI64}});
    auto lo = *b.Add("mul", {i, *b.Scalar(DType::kI64, 2)});
    auto hi = *b.Add("minimum",
                     {*b.Add("add", {lo, *b.Scalar(DType::kI64, 2)}), *b.Scalar(DType::kI64, 48)});
    return *b.Add("cast", {*b.Add("sub", {hi, *b.Add("maximum", {lo, *b.Scalar(DType::kI64, 0)})})},
                  {{"dtype", DType::kF32}});
  };
  auto divisor = *b.Add("mul", {counts(0), counts(1)});
  auto window = [&](int64_t r, int64_t c) {
    return *b.Add("slice", {0},
                  {{"axes", ir::IntList{2, 3}},
                   {"starts", ir::IntList{r, c}},
                   {"stops", ir::IntList{47 + r, 47 + c}},
                   {"steps", ir::IntList{2, 2}}});
  };
  auto sum = *b.Add("add", {*b.Add("add", {window(0, 0), window(0, 1)}),
                            *b.Add("add", {window(1, 0), window(1, 1)})});
  ir::Graph g = b.Finish({*b.Add("div", {sum, divisor})});
  ASSERT_TRUE(ir::VerifyAndInfer(g).ok());
  Target t;
  t.isa = "x86-64-v4";
  auto res = testing::SharedPipeline().Compile(g, t, CompileOptions{});
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_GE(res->artifacts.size(), 2u);
  ASSERT_NE(res->artifacts[1].bytes.find("float kh0[576];"), std::string::npos)
      << "no table on the stack: " << res->artifacts[1].bytes;
  testing::Loaded k(*res);
  std::vector<float> x(2 * 40 * 48 * 48), out(2 * 40 * 24 * 24, -1);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-1, 1);
  for (float& v : x) v = d(rng);
  for (int pad : {16, 32, 48, 64}) {
    ASSERT_EQ(RunBelowPad(k, {x.data(), out.data()}, pad), 0);
    for (int64_t p = 0; p < 80; ++p)
      for (int64_t r = 0; r < 24; ++r)
        for (int64_t c = 0; c < 24; ++c) {
          const float* w = &x[p * 2304 + 2 * r * 48 + 2 * c];
          const float want = (w[0] + w[1] + w[48] + w[49]) / 4;
          ASSERT_NEAR(out[p * 576 + r * 24 + c], want, 1e-6f) << p << " " << r << " " << c;
        }
  }
}

TEST(Fusion, WholeTensorSumRunsInParallelAndMatches) {
  const int64_t n = 1 << 20;
  ir::Graph in;
  in.inputs = {Ty(DType::kF64, {n})};
  ir::Builder b(in);
  auto s = *b.Add("sum", {0});
  auto res = CompileGraph(b.Finish({s}));
  ASSERT_TRUE(res.ok()) << res.status();
  testing::Loaded k(*res);
  std::vector<double> x(n);
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) ref += (x[i] = static_cast<double>(i % 100) * 0.5);
  // OpenMP keeps the threads of its largest team so far; they are all in `before`. A team
  // larger than that must start new threads, so new threads show the loop ran in parallel.
  const int before = ThreadCount();
  double out = -1;
  ASSERT_EQ(k.Run({x.data(), &out}, before + 4), 0);
  EXPECT_GE(ThreadCount(), before + 2) << "no new threads: the sum did not run in parallel";
  EXPECT_DOUBLE_EQ(out, ref);
  for (int threads : {1, 3}) {
    out = -1;
    ASSERT_EQ(k.Run({x.data(), &out}, threads), 0);
    EXPECT_DOUBLE_EQ(out, ref) << threads << " threads";
  }
}

}  // namespace
}  // namespace kiln
