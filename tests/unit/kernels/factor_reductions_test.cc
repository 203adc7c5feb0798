// passes/factor_reductions.cc: which sums it rewrites, which it leaves, and that the compiled
// results agree with the unfactored ones (options on and off) on real kernels.
#include <cmath>
#include <random>

#include "kernels/key/key.h"
#include "kernels/passes/passes.h"
#include "tests/unit/kernels/test_util.h"

namespace kiln {
namespace {

using ir::DType;
using testing::Ty;

// Decompose, factor, drop what is left unused: the graph the later stages would see.
ir::Graph Factored(ir::Graph g) {
  EXPECT_TRUE(ir::VerifyAndInfer(g).ok());
  auto d = passes::Decompose(g);
  EXPECT_TRUE(d.ok()) << d.status();
  auto f = passes::FactorReductions(*d);
  EXPECT_TRUE(f.ok()) << f.status();
  auto out = passes::EliminateDeadCode(*f);
  EXPECT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(ir::VerifyAndInfer(*out).ok());
  return *out;
}

// The reduced-axis counts of every sum node, in node order.
std::vector<size_t> SumAxes(const ir::Graph& g) {
  std::vector<size_t> out;
  for (const ir::Node& n : g.nodes)
    if (n.op == "sum")
      out.push_back(n.Ints("axes").empty() ? n.type.Rank() : n.Ints("axes").size());
  return out;
}

// sum(x[:, :, None] * y[:, None, :], axes=(-2, -1)), as NumPy traces it.
ir::Graph OuterProductSum(DType t, int64_t n, int64_t d) {
  ir::Graph in;
  in.inputs = {Ty(t, {n, d}), Ty(t, {n, d})};
  ir::Builder b(in);
  auto xe = *b.Add("unsqueeze", {0}, {{"axes", ir::IntList{2}}});
  auto ye = *b.Add("unsqueeze", {1}, {{"axes", ir::IntList{1}}});
  auto p = *b.Add("mul", {xe, ye});
  auto s = *b.Add("sum", {p}, {{"axes", ir::IntList{-2, -1}}});
  return b.Finish({s});
}

CompileResult CompileWith(const ir::Graph& g, bool rewrites) {
  ir::Graph copy = g;
  EXPECT_TRUE(ir::VerifyAndInfer(copy).ok());
  Target t;
  t.isa = "x86-64-v3";
  CompileOptions o;
  o.algebraic_rewrites = rewrites;
  auto r = testing::SharedPipeline().Compile(copy, t, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

TEST(FactorReductions, OuterProductSumBecomesProductOfRowSums) {
  ir::Graph g = Factored(OuterProductSum(DType::kF32, 7, 5));
  EXPECT_EQ(SumAxes(g), (std::vector<size_t>{1, 1})) << g.ToString();
  EXPECT_EQ(g.TypeOf(g.outputs[0]).shape, (ir::Shape{7}));
}

TEST(FactorReductions, LeavesWhatDoesNotSplit) {
  // One group (both factors read both axes), an integer product, and a half-precision sum.
  ir::Graph in;
  in.inputs = {Ty(DType::kF32, {4, 6}), Ty(DType::kF32, {4, 6})};
  ir::Builder b(in);
  auto p = *b.Add("mul", {0, 1});
  auto s = *b.Add("sum", {p}, {{"axes", ir::IntList{0, 1}}});
  ir::Graph same_axes = b.Finish({s});
  EXPECT_EQ(SumAxes(Factored(same_axes)), (std::vector<size_t>{2}));
  EXPECT_EQ(SumAxes(Factored(OuterProductSum(DType::kI32, 4, 3))), (std::vector<size_t>{2}));
  EXPECT_EQ(SumAxes(Factored(OuterProductSum(DType::kF16, 4, 3))), (std::vector<size_t>{2}));
}

TEST(FactorReductions, TermsConstantsMeanAndCounts) {
  // mean over (1, 2) of  -2 * x[i,j] * y[i,k] / w[i]  +  x[i,j]  -  z[i,k] * 3
  const int64_t n = 9, d = 6;
  ir::Graph in;
  in.inputs = {Ty(DType::kF64, {n, d}), Ty(DType::kF64, {n, d}), Ty(DType::kF64, {n, 1}),
               Ty(DType::kF64, {n, d})};
  ir::Builder b(in);
  auto xe = *b.Add("unsqueeze", {0}, {{"axes", ir::IntList{2}}});
  auto ye = *b.Add("unsqueeze", {1}, {{"axes", ir::IntList{1}}});
  auto ze = *b.Add("unsqueeze", {3}, {{"axes", ir::IntList{1}}});
  auto we = *b.Add("unsqueeze", {2}, {{"axes", ir::IntList{2}}});
  auto two = *b.Scalar(DType::kF64, -2);
  auto three = *b.Scalar(DType::kF64, 3);
  auto t1 = *b.Add("div", {*b.Add("mul", {*b.Add("mul", {two, xe}), ye}), we});
  auto t3 = *b.Add("mul", {ze, three});
  auto body = *b.Add("sub", {*b.Add("add", {t1, xe}), t3});
  auto m = *b.Add("mean", {body}, {{"axes", ir::IntList{1, 2}}});
  ir::Graph g = b.Finish({m});
  ir::Graph f = Factored(g);
  ASSERT_FALSE(SumAxes(f).empty());
  for (size_t axes : SumAxes(f)) EXPECT_EQ(axes, 1u) << f.ToString();
  if (getenv("KILN_TEST_TRACE")) printf("%s", f.ToString().c_str());

  std::mt19937 rng(5);
  std::normal_distribution<double> dist;
  std::vector<double> x(n * d), y(n * d), w(n), z(n * d);
  for (auto* v : {&x, &y, &w, &z})
    for (double& e : *v) e = dist(rng);
  std::vector<double> on(n), off(n);
  testing::Loaded k_on(CompileWith(g, true)), k_off(CompileWith(g, false));
  ASSERT_EQ(k_on.Run({x.data(), y.data(), w.data(), z.data(), on.data()}), 0);
  ASSERT_EQ(k_off.Run({x.data(), y.data(), w.data(), z.data(), off.data()}), 0);
  for (int64_t i = 0; i < n; ++i) {
    long double want = 0;
    for (int64_t j = 0; j < d; ++j)
      for (int64_t q = 0; q < d; ++q)
        want += -2.0L * x[i * d + j] * y[i * d + q] / w[i] + x[i * d + j] - z[i * d + q] * 3.0L;
    want /= d * d;
    EXPECT_NEAR(on[i], static_cast<double>(want), 1e-12) << i;
    EXPECT_NEAR(off[i], static_cast<double>(want), 1e-12) << i;
  }
}

TEST(FactorReductions, CompiledResultsMatchWithRewriteOnAndOff) {
  const int64_t n = 33, d = 17;
  ir::Graph g = OuterProductSum(DType::kF32, n, d);
  CompileResult on = CompileWith(g, true), off = CompileWith(g, false);
  // Off: one reduction over both axes in the source; on: two over one axis each.
  EXPECT_NE(on.artifacts[2].bytes, off.artifacts[2].bytes);
  std::mt19937 rng(6);
  std::normal_distribution<float> dist;
  std::vector<float> x(n * d), y(n * d), r_on(n), r_off(n);
  for (float& e : x) e = dist(rng);
  for (float& e : y) e = dist(rng);
  testing::Loaded k_on(on), k_off(off);
  ASSERT_EQ(k_on.Run({x.data(), y.data(), r_on.data()}), 0);
  ASSERT_EQ(k_off.Run({x.data(), y.data(), r_off.data()}), 0);
  for (int64_t i = 0; i < n; ++i) {
    double sx = 0, sy = 0, sabs = 0, ax = 0, ay = 0;
    for (int64_t j = 0; j < d; ++j) {
      sx += x[i * d + j];
      sy += y[i * d + j];
      ax += std::fabs(x[i * d + j]);
      ay += std::fabs(y[i * d + j]);
    }
    sabs = ax * ay;
    // The documented bound: (n*m + n + m) eps sum|a| sum|b| for either form.
    double bound = (d * d + 2 * d + 1) * 6e-8 * sabs;
    EXPECT_NEAR(r_on[i], sx * sy, bound) << i;
    EXPECT_NEAR(r_off[i], sx * sy, bound) << i;
  }
}

TEST(FactorReductions, OptionEntersTheKey) {
  ir::Graph g = OuterProductSum(DType::kF32, 4, 3);
  ASSERT_TRUE(ir::VerifyAndInfer(g).ok());
  Target t;
  CompileOptions on, off;
  off.algebraic_rewrites = false;
  EXPECT_NE(key::ComputeKey(g, t, on, "tc").digest, key::ComputeKey(g, t, off, "tc").digest);
}

}  // namespace
}  // namespace kiln
