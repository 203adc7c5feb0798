// Every kind of bad input against the real kilnd: each gets the right code and a message that
// names the node, the op and the rule; nothing is cached for it; the daemon keeps serving.
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/kilnd_process.h"
#include "tests/integration/wire_graph.h"

namespace kiln::testing {
namespace {

struct BadCase {
  std::string name;
  std::function<v1::CompileRequest()> make;
  grpc::StatusCode code;
  std::vector<std::string> message_has;  // substrings the message must contain
};

v1::CompileRequest WithGraph(const WireGraph& g) { return MakeRequest(g.graph()); }

std::vector<BadCase> Cases() {
  std::vector<BadCase> cases;
  cases.push_back({"empty graph",
                   [] { return MakeRequest(v1::Graph()); },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"empty"}});
  cases.push_back({"cycle (forward reference)",
                   [] {
                     // node 0 = add(x, node 1), node 1 = neg(node 0): a cycle, which in SSA
                     // order shows up as a use before definition.
                     WireGraph g;
                     const int x = g.Input("x", v1::F32, {4});
                     g.Op("add", {x, x + 2}, {}, "loop_a");
                     g.Output(g.Op("neg", {x + 1}, {}, "loop_b"));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"node 0", "add", "loop_a", "before"}});
  cases.push_back({"use of an undefined value",
                   [] {
                     WireGraph g;
                     const int x = g.Input("x", v1::F32, {4});
                     g.Output(g.Op("mul", {x, 99}, {}, "bad_mul"));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"node 0", "mul", "bad_mul", "99"}});
  cases.push_back({"unknown op",
                   [] {
                     WireGraph g;
                     const int x = g.Input("x", v1::F32, {4});
                     g.Output(g.Op("frobnicate", {x}, {}, "mystery"));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"node 0", "frobnicate", "unknown op"}});
  cases.push_back({"wrong arity",
                   [] {
                     WireGraph g;
                     const int x = g.Input("x", v1::F32, {4});
                     g.Output(g.Op("sin", {x, x}, {}, "two_arg_sin"));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"node 0", "sin", "arity"}});
  cases.push_back({"bad attribute",
                   [] {
                     WireGraph g;
                     const int x = g.Input("x", v1::F32, {2, 3});
                     g.Output(g.Op("reshape", {x}, {{"shape", WireGraph::Str("six")}}, "rs"));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"node 0", "reshape", "shape"}});
  cases.push_back({"bad dtype",
                   [] {
                     WireGraph g;
                     const int x = g.Input("x", static_cast<v1::DType>(77), {4});
                     g.Output(g.Op("neg", {x}));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"input 0", "dtype"}});
  cases.push_back({"broadcast mismatch",
                   [] {
                     WireGraph g;
                     const int a = g.Input("a", v1::F32, {3});
                     const int b = g.Input("b", v1::F32, {4});
                     g.Output(g.Op("add", {a, b}, {}, "mismatch"));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"node 0", "add", "broadcast", "[3]"}});
  cases.push_back({"negative dimension",
                   [] {
                     WireGraph g;
                     const int x = g.Input("x", v1::F32, {4, -5});
                     g.Output(g.Op("neg", {x}));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"input 0", "negative"}});
  cases.push_back({"overflowing dimensions",
                   [] {
                     WireGraph g;
                     const int x = g.Input("x", v1::F32, {int64_t{1} << 40, int64_t{1} << 40});
                     g.Output(g.Op("neg", {x}));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"input 0", "overflow"}});
  cases.push_back({"over the node limit",
                   [] {
                     WireGraph g;
                     int v = g.Input("x", v1::F32, {4});
                     for (int i = 0; i < 100001; ++i) v = g.Op("neg", {v}, {}, "n");
                     g.Output(v);
                     return WithGraph(g);
                   },
                   grpc::StatusCode::RESOURCE_EXHAUSTED,
                   {"100001", "limit", "max_nodes"}});
  cases.push_back({"unknown attribute (axis for axes)",
                   [] {
                     WireGraph g;
                     const int x = g.Input("x", v1::F32, {4, 3});
                     g.Output(g.Op("sum", {x}, {{"axis", WireGraph::Int(1)}}, "rowsum"));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"node 0", "sum", "rowsum", "unknown attribute 'axis'", "axes", "rule"}});
  cases.push_back({"attribute of the wrong kind",
                   [] {
                     WireGraph g;
                     const int x = g.Input("x", v1::F32, {4, 3});
                     g.Output(g.Op("concat", {x, x}, {{"axis", WireGraph::Str("0")}}, "cat"));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"node 0", "concat", "'axis'", "must be an int", "rule"}});
  cases.push_back({"integer constant that does not fit its dtype",
                   [] {
                     WireGraph g;
                     const int x = g.Input("x", v1::I8, {4});
                     v1::AttrValue c;
                     c.mutable_tensor()->set_dtype(v1::I8);
                     c.mutable_tensor()->add_int_values(300);
                     const int k = g.Op("constant", {}, {{"value", c}}, "big");
                     g.Output(g.Op("add", {x, k}));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"node 0", "constant", "big", "300", "i8", "rule"}});
  cases.push_back(
      {"full value that does not fit its dtype",
       [] {
         WireGraph g;
         v1::AttrValue value, dtype;
         value.set_f(1e300);
         dtype.set_dtype(v1::I32);
         g.Output(g.Op("full", {},
                       {{"shape", WireGraph::Ints({3})}, {"value", value}, {"dtype", dtype}}, "f"));
         return WithGraph(g);
       },
       grpc::StatusCode::INVALID_ARGUMENT,
       {"node 0", "full", "does not fit i32", "rule"}});
  cases.push_back({"max over an empty axis",
                   [] {
                     WireGraph g;
                     const int x = g.Input("x", v1::F32, {3, 0});
                     g.Output(g.Op("max", {x}, {{"axes", WireGraph::Ints({1})}}, "m"));
                     return WithGraph(g);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"node 0", "max", "empty axis 1", "rule"}});
  cases.push_back(
      {"norm ord=inf over an empty axis",
       [] {
         WireGraph g;
         const int x = g.Input("x", v1::F32, {3, 0});
         v1::AttrValue ord;
         ord.set_f(std::numeric_limits<double>::infinity());
         g.Output(g.Op("norm", {x}, {{"axes", WireGraph::Ints({1})}, {"ord", ord}}, "n"));
         return WithGraph(g);
       },
       grpc::StatusCode::INVALID_ARGUMENT,
       {"node 0", "norm", "empty axis", "rule"}});
  cases.push_back({"unknown cpu isa",
                   [] { return MakeRequest(SinCosGraph(8), CpuTarget("x86-64-v9")); },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"isa", "x86-64-v9"}});
  cases.push_back({"unknown cuda sm",
                   [] {
                     v1::Target t;
                     t.mutable_cuda()->set_sm(42);
                     return MakeRequest(SinCosGraph(8), t);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"sm_42"}});
  cases.push_back({"no target",
                   [] { return MakeRequest(SinCosGraph(8), v1::Target()); },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"target"}});
  return cases;
}

class KilndBadInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-bad-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = new std::string(tmpl);
    kilnd_ = new KilndProcess();
    ASSERT_EQ(kilnd_->Start(*dir_ + "/cache"), "");
  }
  static void TearDownTestSuite() {
    if (kilnd_ != nullptr) {
      EXPECT_EQ(kilnd_->Stop(SIGTERM), 0);
    }
    delete kilnd_;
    kilnd_ = nullptr;
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  static grpc::Status Compile(const v1::CompileRequest& req, v1::CompileResponse* resp) {
    auto stub = kilnd_->Stub();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    return stub->Compile(&ctx, req, resp);
  }

  static v1::GetStatsResponse Stats() {
    auto stub = kilnd_->Stub();
    grpc::ClientContext ctx;
    v1::GetStatsResponse stats;
    EXPECT_TRUE(stub->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
    return stats;
  }

  static std::string* dir_;
  static KilndProcess* kilnd_;
};
std::string* KilndBadInputTest::dir_ = nullptr;
KilndProcess* KilndBadInputTest::kilnd_ = nullptr;

TEST_F(KilndBadInputTest, EachBadInputGetsItsCodeAndANamedRule) {
  ASSERT_NE(kilnd_, nullptr);
  const v1::GetStatsResponse before = Stats();
  for (const BadCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    v1::CompileResponse resp;
    grpc::Status s = Compile(c.make(), &resp);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    for (const std::string& part : c.message_has) {
      EXPECT_NE(s.error_message().find(part), std::string::npos)
          << "message \"" << s.error_message() << "\" does not mention \"" << part << "\"";
    }
    // Asked twice, the answer is the same, and it came from validation, not from a cache.
    grpc::Status again = Compile(c.make(), &resp);
    EXPECT_EQ(again.error_code(), c.code);
  }
  const v1::GetStatsResponse after = Stats();
  EXPECT_EQ(after.compiles(), before.compiles());
  EXPECT_EQ(after.negative_hits(), before.negative_hits());
  EXPECT_EQ(after.store().entries(), before.store().entries());
}

TEST_F(KilndBadInputTest, StillServesAfterwards) {
  ASSERT_NE(kilnd_, nullptr);
  v1::CompileResponse resp;
  grpc::Status s = Compile(MakeRequest(SinCosGraph(64)), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.handle().size(), 64u);
  EXPECT_GE(Stats().store().entries(), 1);
}

// Inputs that once got INTERNAL: they are valid, and compile.
TEST_F(KilndBadInputTest, FormerInternalErrorsCompile) {
  ASSERT_NE(kilnd_, nullptr);
  std::vector<std::pair<std::string, v1::Graph>> graphs;
  {
    WireGraph g;  // softmax over a zero-size axis: an empty result
    const int x = g.Input("x", v1::F32, {3, 0});
    g.Output(g.Op("softmax", {x}, {{"axis", WireGraph::Int(-1)}}, "sm"));
    graphs.push_back({"softmax over an empty axis", g.graph()});
  }
  {
    WireGraph g;  // 1e300 cast to f16 is inf (NumPy's cast), printed in range on every backend
    const int x = g.Input("x", v1::F16, {8});
    v1::AttrValue c, to;
    c.mutable_tensor()->set_dtype(v1::F64);
    c.mutable_tensor()->add_float_values(1e300);
    to.set_dtype(v1::F16);
    const int k = g.Op("cast", {g.Op("constant", {}, {{"value", c}})}, {{"dtype", to}});
    g.Output(g.Op("add", {x, k}));
    graphs.push_back({"1e300 cast to f16", g.graph()});
  }
  for (const auto& [name, graph] : graphs) {
    SCOPED_TRACE(name);
    v1::CompileResponse resp;
    grpc::Status s = Compile(MakeRequest(graph), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    v1::Target cuda;
    cuda.mutable_cuda()->set_sm(90);
    s = Compile(MakeRequest(graph, cuda), &resp);
    // No NVRTC on this host is FAILED_PRECONDITION; with it, the CUDA source must build.
    EXPECT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::FAILED_PRECONDITION)
        << s.error_message();
  }
}

TEST_F(KilndBadInputTest, BadHandlesAndDigests) {
  ASSERT_NE(kilnd_, nullptr);
  auto stub = kilnd_->Stub();
  {
    grpc::ClientContext ctx;
    v1::GetResultRequest req;
    req.set_handle("../../etc/passwd");
    v1::CompileResponse resp;
    EXPECT_EQ(stub->GetResult(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    v1::GetResultRequest req;
    req.set_handle(std::string(64, '0'));
    v1::CompileResponse resp;
    EXPECT_EQ(stub->GetResult(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::FetchArtifactRequest req;
    req.set_digest(std::string(64, 'e'));
    auto reader = stub->FetchArtifact(&ctx, req);
    v1::ArtifactChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::FetchArtifactRequest req;
    req.set_digest("xyz");
    auto reader = stub->FetchArtifact(&ctx, req);
    v1::ArtifactChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    v1::LookupRequest req;
    *req.mutable_graph() = SinCosGraph(12345);
    *req.mutable_target() = CpuTarget();
    v1::CompileResponse resp;
    EXPECT_EQ(stub->Lookup(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

}  // namespace
}  // namespace kiln::testing
