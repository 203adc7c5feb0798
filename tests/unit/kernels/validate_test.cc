// Validation at the door: every bad graph is rejected with the node, the op and the rule.
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "kernels/ir/decode.h"

namespace kiln {
namespace {

absl::Status Decode(const std::string& text, ir::Limits limits = {}) {
  v1::Graph g;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &g)) << text;
  return ir::DecodeGraph(g, limits).status();
}

void ExpectError(const std::string& text, absl::StatusCode code, std::vector<std::string> needles) {
  absl::Status s = Decode(text);
  EXPECT_EQ(s.code(), code) << s;
  for (const std::string& n : needles)
    EXPECT_NE(s.message().find(n), std::string::npos) << "'" << n << "' not in: " << s.message();
}

constexpr char kX[] = "inputs { name: 'x' type { dtype: F32 shape: 4 shape: 3 } } ";

TEST(Validate, AcceptsGoodGraph) {
  EXPECT_TRUE(Decode(std::string(kX) + "nodes { op: 'exp' inputs: 0 } outputs: 1").ok());
}

TEST(Validate, RejectsBadGraphsNamingNodeOpAndRule) {
  using C = absl::StatusCode;
  ExpectError("", C::kInvalidArgument, {"empty graph"});
  ExpectError(
      std::string(kX) +
          "nodes { op: 'exp' inputs: 2 name: 'loop' } nodes { op: 'exp' inputs: 1 } outputs: 2",
      C::kInvalidArgument, {"node 0", "exp", "loop", "before it is defined", "cycles"});
  ExpectError(std::string(kX) + "nodes { op: 'exp' inputs: 7 } outputs: 1", C::kInvalidArgument,
              {"node 0", "undefined value 7"});
  ExpectError(std::string(kX) + "nodes { op: 'frobnicate' inputs: 0 } outputs: 1",
              C::kInvalidArgument, {"node 0", "unknown op 'frobnicate'"});
  ExpectError(std::string(kX) + "nodes { op: 'add' inputs: 0 } outputs: 1", C::kInvalidArgument,
              {"node 0 (add)", "wrong arity", "takes 2"});
  ExpectError(
      std::string(kX) +
          "nodes { op: 'sum' inputs: 0 attrs { key: 'axes' value { s: 'one' } } } outputs: 1",
      C::kInvalidArgument, {"node 0 (sum)", "attribute 'axes'"});
  ExpectError(std::string(kX) +
                  "nodes { op: 'sum' inputs: 0 attrs { key: 'axes' value { ints { values: 5 } } } "
                  "} outputs: 1",
              C::kInvalidArgument, {"node 0 (sum)", "axis 5 out of range"});
  ExpectError(
      "inputs { type { dtype: DTYPE_UNSPECIFIED shape: 4 } } nodes { op: 'exp' inputs: 0 } "
      "outputs: 1",
      C::kInvalidArgument, {"input 0", "dtype"});
  ExpectError(std::string(kX) +
                  "inputs { name: 'y' type { dtype: F32 shape: 5 } } nodes { op: 'add' inputs: 0 "
                  "inputs: 1 } outputs: 2",
              C::kInvalidArgument, {"node 0 (add)", "broadcast mismatch", "[4,3]", "[5]"});
  ExpectError(
      "inputs { name: 'n' type { dtype: F32 shape: -3 } } nodes { op: 'exp' inputs: 0 } outputs: 1",
      C::kInvalidArgument, {"input 0 ('n')", "negative dimension"});
  ExpectError(
      "inputs { type { dtype: F32 shape: 4611686018427387904 shape: 8 } } nodes { op: 'exp' "
      "inputs: 0 } outputs: 1",
      C::kInvalidArgument, {"input 0", "overflows"});
  ExpectError(std::string(kX) + "nodes { op: 'bitwise_and' inputs: 0 inputs: 0 } outputs: 1",
              C::kInvalidArgument, {"node 0 (bitwise_and)", "integer or bool"});
  ExpectError(std::string(kX) +
                  "nodes { op: 'reshape' inputs: 0 attrs { key: 'shape' value { ints { values: 5 } "
                  "} } } outputs: 1",
              C::kInvalidArgument, {"node 0 (reshape)", "element count"});
  ExpectError(std::string(kX) + "nodes { op: 'exp' inputs: 0 } outputs: 9", C::kInvalidArgument,
              {"output", "undefined value 9"});
}

TEST(Validate, LimitsAreResourceExhausted) {
  std::string text = kX;
  for (int i = 0; i < 20; ++i) text += "nodes { op: 'exp' inputs: 0 } ";
  text += "outputs: 1";
  ir::Limits lim;
  lim.max_nodes = 10;
  EXPECT_EQ(Decode(text, lim).code(), absl::StatusCode::kResourceExhausted);
  ir::Limits small;
  small.max_elements = 10;
  absl::Status s = Decode(std::string(kX) + "nodes { op: 'exp' inputs: 0 } outputs: 1", small);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(Validate, BadTargets) {
  v1::Target t;
  t.mutable_cpu()->set_isa("pentium");
  EXPECT_EQ(ir::DecodeTarget(t).status().code(), absl::StatusCode::kInvalidArgument);
  t.mutable_cuda()->set_sm(13);
  auto s = ir::DecodeTarget(t).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sm_13"), std::string::npos);
  v1::Target none;
  EXPECT_EQ(ir::DecodeTarget(none).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
