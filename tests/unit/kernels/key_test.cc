// The action key: stable across how a graph was built, different for any semantic change; and
// the SHA-256 digests that name it and every artifact.
#include "kernels/key/key.h"

#include "gtest/gtest.h"
#include "kernels/ir/op_registry.h"
#include "kernels/key/digest.h"
#include "tests/unit/kernels/test_util.h"

namespace kiln {
namespace {

using ir::DType;
using testing::Ty;

// (x + y) * exp(x) with the independent nodes appended in either order, names optional.
ir::Graph Build(bool swap, bool named, double scale = 2.0, DType t = DType::kF32, int64_t n = 8) {
  ir::Graph g;
  g.inputs = {Ty(t, {n}), Ty(t, {n})};
  g.input_names = {named ? "x" : "", named ? "y" : ""};
  ir::ValueId add, ex;
  if (!swap) {
    add = g.Add("add", {0, 1});
    ex = g.Add("exp", {0});
  } else {
    ex = g.Add("exp", {0});
    add = g.Add("add", {0, 1});
  }
  ir::Constant c;
  c.dtype = t;
  c.f = {scale};
  ir::ValueId k = g.Add("constant", {}, {{"value", c}});
  ir::ValueId m = g.Add("mul", {add, ex});
  ir::ValueId r = g.Add("mul", {m, k});
  if (named)
    for (auto& node : g.nodes) node.name = "n_" + node.op;
  g.outputs = {r};
  EXPECT_TRUE(ir::VerifyAndInfer(g).ok());
  return g;
}

std::string KeyOf(const ir::Graph& g, const std::string& isa = "x86-64-v3", int opt = 3) {
  Target t;
  t.isa = isa;
  CompileOptions o;
  o.opt_level = opt;
  return key::ComputeKey(g, t, o, "toolchain-1").digest;
}

TEST(Key, IndependentOfNodeOrderAndNames) {
  std::string k = KeyOf(Build(false, false));
  EXPECT_EQ(k, KeyOf(Build(true, false)));
  EXPECT_EQ(k, KeyOf(Build(false, true)));
  EXPECT_EQ(k, KeyOf(Build(true, true)));
  EXPECT_EQ(key::CanonicalBytes(Build(false, false)), key::CanonicalBytes(Build(true, true)));
}

TEST(Key, ChangesWithEverySemanticChange) {
  std::string k = KeyOf(Build(false, false));
  EXPECT_NE(k, KeyOf(Build(false, false, 3.0)));                  // a constant
  EXPECT_NE(k, KeyOf(Build(false, false, 2.0, DType::kF64)));     // a dtype
  EXPECT_NE(k, KeyOf(Build(false, false, 2.0, DType::kF32, 9)));  // a shape
  EXPECT_NE(k, KeyOf(Build(false, false), "x86-64-v4"));          // the target
  EXPECT_NE(k, KeyOf(Build(false, false), "x86-64-v3", 2));       // an option
  Target t;
  EXPECT_NE(k, key::ComputeKey(Build(false, false), t, CompileOptions{}, "toolchain-2").digest);
}

TEST(Key, AttributeOrderDoesNotMatter) {
  ir::Graph a, b;
  for (ir::Graph* g : {&a, &b}) {
    g->inputs = {Ty(DType::kF32, {4, 5})};
    g->input_names = {""};
  }
  a.Add("sum", {0}, {{"axes", ir::IntList{1}}, {"keepdim", true}});
  ir::AttrMap m;
  m.emplace("keepdim", true);
  m.emplace("axes", ir::IntList{1});
  b.Add("sum", {0}, m);
  a.outputs = b.outputs = {1};
  ASSERT_TRUE(ir::VerifyAndInfer(a).ok());
  ASSERT_TRUE(ir::VerifyAndInfer(b).ok());
  EXPECT_EQ(KeyOf(a), KeyOf(b));
}

TEST(Key, DebugStringIsLabelled) {
  Target t;
  auto k = key::ComputeKey(Build(false, false), t, CompileOptions{}, "toolchain-1");
  std::string s = k.DebugString();
  for (const char* label : {"key_format:", "graph:", "target: cpu:x86-64-v3",
                            "options:", "toolchain: toolchain-1", "digest:"})
    EXPECT_NE(s.find(label), std::string::npos) << label << "\n" << s;
  EXPECT_EQ(k.digest.size(), 64u);
}

// sha256.h is the one SHA-256 of kiln, the client core's too (tests/python/test_core.py checks
// the core's export against hashlib).
// The canonical bytes are a format: integers 8 bytes little-endian on every host, strings and
// lists length-prefixed. A change to them re-keys every cache, so the layout is pinned here.
TEST(Key, CanonicalBytesKeepTheirFormat) {
  auto le = [](int64_t v) {
    std::string b;
    for (int i = 0; i < 8; ++i)
      b.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
    return b;
  };
  const std::string bytes = key::CanonicalBytes(Build(false, false));
  const std::string head = le(13) + "kiln.graph.v1" + le(2) +                       // two inputs:
                           le(static_cast<int64_t>(DType::kF32)) + le(1) + le(8) +  // f32 [8]
                           le(0);                                                   // no strides
  ASSERT_GE(bytes.size(), head.size());
  EXPECT_EQ(bytes.substr(0, head.size()), head);
  EXPECT_EQ(key::Sha256Hex(bytes),
            "db55ff68f94b0fa67963718670bb3602d4d9c3f31663e379a2adf032a021bbd1");
}

TEST(Digest, Sha256MatchesTheStandardVectors) {
  EXPECT_EQ(key::Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(key::Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string raw = key::Sha256Raw("abc");
  EXPECT_EQ(raw.size(), key::kDigestBytes);
  EXPECT_EQ(key::DigestToHex(raw), key::Sha256Hex("abc"));
  auto back = key::DigestFromHex(key::Sha256Hex("abc"));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, raw);
}

TEST(Digest, IsDigestTakesOnly64LowercaseHexDigits) {
  EXPECT_TRUE(key::IsDigest(key::Sha256Hex("x")));
  EXPECT_FALSE(key::IsDigest(""));
  EXPECT_FALSE(key::IsDigest(std::string(63, 'a')));
  EXPECT_FALSE(key::IsDigest(std::string(64, 'A')));
  EXPECT_FALSE(key::IsDigest(std::string(62, 'a') + "/."));
  EXPECT_FALSE(key::DigestFromHex("../../etc/passwd").ok());
}

}  // namespace
}  // namespace kiln
