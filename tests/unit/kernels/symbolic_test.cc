// Generalising code generated at sample sizes (kernels/codegen/symbolic.h), on texts made
// here, and the symbolic front door (decode, key, refusals).
#include "kernels/codegen/symbolic.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/ir/decode.h"
#include "kernels/ir/symbols.h"
#include "kernels/key/key.h"

namespace kiln::codegen {
namespace {

using Text = std::function<std::string(const std::vector<int64_t>&)>;

absl::StatusOr<SymbolicUnit> GeneraliseText(const Text& text,
                                            const std::vector<std::string>& names) {
  std::vector<SymbolicSample> samples;
  for (const std::vector<int64_t>& point : SymbolicSamplePoints(static_cast<int>(names.size())))
    samples.push_back({text(point), LaunchPlan{}});
  return Generalise(samples, names);
}

TEST(SymbolicTest, PolynomialsOfTheSizesBecomeExpressions) {
  auto unit = GeneraliseText(
      [](const std::vector<int64_t>& s) {
        return absl::StrCat("for (int64_t i0 = 0; i0 < ", s[0] * s[1], "; ++i0) x[", 768 * s[1],
                            " * i0 + ", s[0] - 1, "] = t3 * (", s[1] * s[1], ".0) + 4;");
      },
      {"B", "T"});
  ASSERT_TRUE(unit.ok()) << unit.status();
  EXPECT_EQ(unit->source,
            "for (int64_t i0 = 0; i0 < (kiln_s0*kiln_s1); ++i0) x[(768LL*kiln_s1) * i0 + (kiln_s0 "
            "+ -1LL)] = "
            "t3 * (((double)(kiln_s1*kiln_s1))) + 4;")
      << "identifiers with digits (i0, t3) and static literals stay";
}

TEST(SymbolicTest, OneOverACountIsRecovered) {
  auto unit = GeneraliseText(
      [](const std::vector<int64_t>& s) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.17g", 1.0 / static_cast<double>(3 * s[0]));
        return absl::StrCat("y = s * (", buf, "f);");
      },
      {"N"});
  ASSERT_TRUE(unit.ok()) << unit.status();
  EXPECT_EQ(unit->source, "y = s * (((float)(1.0 / (double)(3LL*kiln_s0))));");
}

TEST(SymbolicTest, RefusesWhatNoExpressionGives) {
  // A quotient of a size (a balanced tile width), a structure that changes, a stack array.
  auto quotient = GeneraliseText(
      [](const std::vector<int64_t>& s) { return absl::StrCat("n = ", s[0] / 7, ";"); }, {"N"});
  EXPECT_EQ(quotient.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(quotient.status().message().find("no polynomial"), std::string::npos)
      << quotient.status();
  auto structure = GeneraliseText(
      [](const std::vector<int64_t>& s) {
        return s[0] % 2 ? std::string("a;") : std::string("a; b;");
      },
      {"N"});
  EXPECT_NE(structure.status().message().find("structure changes"), std::string::npos)
      << structure.status();
  auto array = GeneraliseText(
      [](const std::vector<int64_t>& s) { return absl::StrCat("  float acc[", s[0], "];"); },
      {"N"});
  EXPECT_NE(array.status().message().find("stack array"), std::string::npos) << array.status();
}

TEST(SymbolicTest, ChecksTheFitAtAPointOffTheGrid) {
  // A literal that a polynomial of the sizes matches at every grid point but not at the check
  // point (as a clamp, a rounding or a tile count can): only evaluating the fit there tells.
  const int64_t check = SymbolicSamplePoints(1).back()[0];
  auto unit = GeneraliseText(
      [&](const std::vector<int64_t>& s) {
        return absl::StrCat("n = ", s[0] * s[0] + (s[0] == check ? 1 : 0), ";");
      },
      {"N"});
  EXPECT_EQ(unit.status().code(), absl::StatusCode::kInvalidArgument)
      << (unit.ok() ? unit->source : "");
  // The same literal, a polynomial at the check point too, generalises.
  auto square = GeneraliseText(
      [](const std::vector<int64_t>& s) { return absl::StrCat("n = ", s[0] * s[0], ";"); }, {"N"});
  ASSERT_TRUE(square.ok()) << square.status();
  EXPECT_EQ(square->source, "n = (kiln_s0*kiln_s0);");
}

TEST(SymbolicTest, KeyHoldsSymbolsNotExampleSizes) {
  auto make = [](int64_t example, const char* symbol) {
    v1::Graph g;
    v1::Input* in = g.add_inputs();
    in->set_name("x");
    in->mutable_type()->set_dtype(v1::F32);
    in->mutable_type()->add_shape(example);
    in->mutable_type()->add_shape(4);
    in->mutable_type()->add_dim_symbols(symbol);
    in->mutable_type()->add_dim_symbols("");
    v1::Node* n = g.add_nodes();
    n->set_op("exp");
    n->add_inputs(0);
    g.add_outputs(1);
    return g;
  };
  auto a = ir::DecodeGraph(make(5, "N")), b = ir::DecodeGraph(make(9, "N")),
       c = ir::DecodeGraph(make(5, ""));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->symbols, std::vector<std::string>{"N"});
  EXPECT_EQ(key::CanonicalBytes(*a), key::CanonicalBytes(*b));
  EXPECT_NE(key::CanonicalBytes(*a), key::CanonicalBytes(*c));
  auto bad = ir::DecodeGraph(make(5, "N;rm"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::codegen
