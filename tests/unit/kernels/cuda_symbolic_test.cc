// CUDA kernels for symbolic sizes (kernels/codegen/symbolic.h, PLAN.md ABI 2): each graph is
// generated once with symbols, then run in emulation (cuda_emulation.h) at several sizes,
// 0, 1, primes and sizes that no vector width divides among them, against the CPU backend
// compiled for the same graph at each static size. The shapes cover every strategy whose
// choices change with a size: pointwise, rows whose length varies (looped, fixed threads),
// rows whose count varies (packed rows), column tiles, per-output loops and whole-tensor
// partials. Inputs end at an inaccessible page there, so a read past their end faults.
#include <sys/mman.h>
#include <unistd.h>

#include <set>

#include "absl/strings/str_join.h"
#include "kernels/codegen/cuda/cuda_codegen.h"
#include "kernels/codegen/symbolic.h"
#include "kernels/ir/symbols.h"
#include "tests/unit/kernels/cuda_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;  // NOLINT: test helpers

// A dimension: a size, or kSym - k for symbol k.
constexpr int64_t kSym = -1;

struct Input {
  DType dtype;
  std::vector<int64_t> dims;
  // The emulated kernels read every input from memory an inaccessible page follows, so a read
  // past the end faults. It starts there at the last byte of this input when `exact_end`, else
  // at the next multiple of 16 bytes (a vector load needs its start aligned, so only inputs no
  // vector load reads may end exactly).
  bool exact_end = false;
};
using Body = std::function<std::vector<ValueId>(ir::Builder&)>;

// The graph with `values` in its symbolic dimensions; with `symbolic`, the dimensions are
// marked as the symbols `names` (values then being the first sample).
ir::Graph Build(const std::vector<Input>& inputs, const Body& body,
                const std::vector<std::string>& names, const std::vector<int64_t>& values,
                bool symbolic) {
  ir::Graph in;
  for (const Input& i : inputs) {
    ir::TensorType t;
    t.dtype = i.dtype;
    for (int64_t d : i.dims) {
      const bool sym = d < 0;
      t.shape.push_back(sym ? values[kSym - d] : d);
      t.dim_symbols.push_back(sym && symbolic ? static_cast<int32_t>(kSym - d) : -1);
    }
    if (!symbolic) t.dim_symbols.clear();
    in.inputs.push_back(std::move(t));
  }
  if (symbolic) in.symbols = names;
  ir::Builder b(in);
  std::vector<ValueId> outs = body(b);
  ir::Graph g = b.Finish(outs);
  if (symbolic) g.symbols = names;
  auto st = ir::VerifyAndInfer(g, symbolic ? ir::SymbolicLimits({}) : ir::Limits{});
  EXPECT_TRUE(st.ok()) << st;
  return g;
}

// A copy of `t` followed by an inaccessible page (see Input::exact_end).
HostTensor Guarded(const HostTensor& t, bool exact_end) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = static_cast<size_t>(t.bytes());
  const size_t span = exact_end ? bytes : (bytes + 15) / 16 * 16;
  const size_t data = (span + page - 1) / page * page;
  void* base =
      mmap(nullptr, data + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) std::abort();
  char* mem = static_cast<char*>(base);
  if (mprotect(mem + data, page, PROT_NONE) != 0) std::abort();
  char* start = mem + data - span;
  std::memset(mem, 0xff, data);
  std::memcpy(start, t.data.get(), bytes);
  HostTensor g = t;
  g.data = std::shared_ptr<char>(start, [mem, size = data + page](char*) { munmap(mem, size); });
  return g;
}

// Runs a symbolic plan in emulation at `sizes` as a launcher does (PLAN.md): temps laid out in
// plan order at multiples of 256 bytes, grids evaluated, sizes appended to every launch, a
// guarded step only where its guard holds. `choice` >= 0 overrides the guards: the guarded
// steps whose guard_min is the choice-th smallest run whatever the sizes (every kernel of a
// launch-time choice must be right at any size, not only in its band).
absl::Status RunSized(EmulatedUnit& emu, const LaunchPlan& plan,
                      const std::vector<HostTensor>& tensors, int num_inputs,
                      const std::vector<int64_t>& sizes, unsigned char poison, int choice = -1) {
  std::set<int64_t> mins;
  for (const PlanStep& s : plan.steps)
    if (s.guarded()) mins.insert(s.guard_min);
  auto runs = [&](const PlanStep& s) {
    if (!s.guarded()) return true;
    if (choice >= 0) return s.guard_min == *std::next(mins.begin(), choice);
    const int64_t v = codegen::EvaluateSizeExpr(s.guard_expr, sizes);
    return v >= s.guard_min && (s.guard_max <= 0 || v <= s.guard_max);
  };
  int64_t end = 0;
  std::vector<int64_t> offsets;
  for (const PlanBuffer& b : plan.buffers) {
    if (b.role != BufferRole::kTemp) continue;
    end = (end + 255) / 256 * 256;
    offsets.push_back(end);
    end += codegen::EvaluateSizeExpr(b.bytes_expr, sizes);
  }
  HostTensor ws = HostTensor::Make(DType::kU8, std::max<int64_t>(end, 1), poison);
  std::vector<void*> ptrs;
  size_t temp = 0;
  for (const PlanBuffer& b : plan.buffers) {
    switch (b.role) {
      case BufferRole::kInput:
        ptrs.push_back(tensors[b.index].data.get());
        break;
      case BufferRole::kOutput:
        ptrs.push_back(tensors[num_inputs + b.index].data.get());
        break;
      case BufferRole::kTemp:
        ptrs.push_back(ws.data.get() + offsets[temp++]);
        break;
    }
  }
  auto* launch = reinterpret_cast<int (*)(void*, unsigned, unsigned, void**, int)>(
      dlsym(emu.handle(), "kiln_emu_launch"));
  for (const PlanStep& s : plan.steps) {
    if (s.grid_per_block <= 0) return absl::InternalError("a symbolic step without grid_per_block");
    if (!runs(s)) continue;
    const int64_t work = codegen::EvaluateSizeExpr(s.grid_work_expr, sizes);
    const int64_t grid = (work + s.grid_per_block - 1) / s.grid_per_block;
    if (grid == 0) continue;
    void* fn = dlsym(emu.handle(), s.kernel.c_str());
    if (!fn) return absl::InternalError("no kernel " + s.kernel);
    std::vector<void*> args;
    for (int a : s.args) args.push_back(ptrs[a]);
    // The emulator calls with pointer-sized arguments; an int parameter reads the low half.
    for (int64_t v : sizes) args.push_back(reinterpret_cast<void*>(static_cast<intptr_t>(v)));
    launch(fn, static_cast<unsigned>(grid), s.block[0], args.data(), static_cast<int>(args.size()));
  }
  return absl::OkStatus();
}

// Generates `body` once for the symbols `names` and checks it at every size set in `runs`.
void ExpectSymbolicMatchesCpu(const std::vector<Input>& inputs, const Body& body,
                              const std::vector<std::string>& names,
                              const std::vector<std::vector<int64_t>>& runs) {
  std::vector<int64_t> first;
  for (size_t k = 0; k < names.size(); ++k)
    first.push_back(ir::SampleValue(static_cast<int>(k), 0));
  ir::Graph sym = Build(inputs, body, names, first, true);
  auto gen = SharedPipeline().Generate(sym, CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(gen.ok()) << gen.status();
  ASSERT_EQ(gen->plan.abi_version, codegen::kCudaSymbolicAbiVersion);
  ASSERT_EQ(gen->plan.symbols.size(), names.size());
  if (std::getenv("KILN_TEST_DUMP") != nullptr)
    std::fprintf(stderr, "%s\n%s", gen->fusion_report.c_str(), gen->source.c_str());
  auto emu = EmulatedUnit::Build(gen->source);
  ASSERT_TRUE(emu.ok()) << emu.status() << "\n" << gen->source;
  for (const std::vector<int64_t>& sizes : runs) {
    SCOPED_TRACE(::testing::Message() << "sizes " << absl::StrJoin(sizes, ", "));
    ir::Graph g = Build(inputs, body, names, sizes, false);
    std::mt19937 rng(static_cast<unsigned>(sizes[0] + 7));
    std::vector<HostTensor> ins, want, got, again;
    for (const ir::TensorType& t : g.inputs)
      ins.push_back(RandomTensor(t.dtype, Elements(t.shape), &rng));
    for (size_t o = 0; o < g.outputs.size(); ++o) {
      const ir::TensorType& t = g.TypeOf(g.outputs[o]);
      // The plan's output shapes at these sizes are the static graph's.
      std::vector<int64_t> shape;
      for (const SizeExpr& e : gen->plan.buffers[g.num_inputs() + o].shape_exprs)
        shape.push_back(codegen::EvaluateSizeExpr(e, sizes));
      EXPECT_EQ(shape, t.shape) << "output " << o;
      want.push_back(HostTensor::Make(t.dtype, Elements(t.shape)));
      got.push_back(HostTensor::Make(t.dtype, Elements(t.shape), kPoisonA));
      again.push_back(HostTensor::Make(t.dtype, Elements(t.shape), kPoisonB));
    }
    auto cpu = SharedPipeline().Compile(g, CpuTarget(), CompileOptions{});
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    Loaded lib(*cpu);
    std::vector<void*> args;
    for (const HostTensor& t : ins) args.push_back(t.data.get());
    for (const HostTensor& t : want) args.push_back(t.data.get());
    ASSERT_EQ(lib.Run(args, 1), 0);
    std::vector<HostTensor> guarded;
    for (size_t i = 0; i < ins.size(); ++i) guarded.push_back(Guarded(ins[i], inputs[i].exact_end));
    for (auto [outs, poison] : {std::pair{&got, kPoisonA}, std::pair{&again, kPoisonB}}) {
      std::vector<HostTensor> all = guarded;
      all.insert(all.end(), outs->begin(), outs->end());
      ASSERT_TRUE(RunSized(**emu, gen->plan, all, g.num_inputs(), sizes, poison).ok());
    }
    // Every kernel of a launch-time choice, each alone, at these sizes too.
    std::set<int64_t> choices;
    for (const PlanStep& s : gen->plan.steps)
      if (s.guarded()) choices.insert(s.guard_min);
    for (int c = 0; c < static_cast<int>(choices.size()); ++c) {
      std::vector<HostTensor> forced = guarded;
      for (const HostTensor& w : want)
        forced.push_back(HostTensor::Make(w.dtype, w.elements, kPoisonA));
      ASSERT_TRUE(RunSized(**emu, gen->plan, forced, g.num_inputs(), sizes, kPoisonA, c).ok());
      for (size_t o = 0; o < want.size(); ++o)
        for (int64_t i = 0; i < want[o].elements; ++i)
          if (!forced[ins.size() + o].SameBits(got[o], i) &&
              !Close(want[o].dtype, forced[ins.size() + o].At(i), want[o].At(i))) {
            ADD_FAILURE() << "choice " << c << " output " << o << " element " << i << ": cuda "
                          << forced[ins.size() + o].At(i) << ", expected " << want[o].At(i);
            break;
          }
    }
    int failures = 0;
    for (size_t o = 0; o < want.size(); ++o)
      for (int64_t i = 0; i < want[o].elements && failures < 8; ++i) {
        const double w = want[o].At(i), c = got[o].At(i);
        if (!Close(want[o].dtype, c, w) || !got[o].SameBits(again[o], i)) {
          ++failures;
          ADD_FAILURE() << "output " << o << " element " << i << ": cuda " << c << " ("
                        << again[o].At(i) << " with the other poison), expected " << w;
        }
      }
    if (failures) {
      ADD_FAILURE() << gen->fusion_report << gen->source;
      return;
    }
  }
}

const std::vector<std::vector<int64_t>> kOneSymbol = {{1}, {2}, {7}, {37}, {130}, {0}};

TEST(CudaSymbolic, Pointwise) {
  REQUIRE_NVRTC();
  // Vectors of 4 along a static row of 48, rows counted by N; a broadcast row.
  ExpectSymbolicMatchesCpu(
      {{DType::kF32, {kSym, 48}}, {DType::kF32, {48}}},
      [](ir::Builder& b) {
        auto s = *b.Add("mul", {0, 1});
        return std::vector<ValueId>{*b.Add("tanh", {s})};
      },
      {"N"}, kOneSymbol);
  // A flat range of varying length: vectors of 4, the last one partial at sizes no vector
  // width divides (1, 2, 7, 37, 130).
  ExpectSymbolicMatchesCpu(
      {{DType::kF32, {kSym}}, {DType::kF32, {kSym}}},
      [](ir::Builder& b) {
        auto s = *b.Add("sin", {0});
        return std::vector<ValueId>{*b.Add("add", {*b.Add("mul", {s, s}), 1})};
      },
      {"N"}, kOneSymbol);
  // The innermost dimension itself symbolic: scalar lanes.
  ExpectSymbolicMatchesCpu(
      {{DType::kF16, {3, kSym}}, {DType::kF16, {3, 1}}},
      [](ir::Builder& b) {
        return std::vector<ValueId>{*b.Add("add", {0, 1})};
      },
      {"T"}, kOneSymbol);
  // Concatenations: along the rows (pieces of N rows each, a branch per piece chosen by a
  // bound that is a size), and along a row of varying length (pieces of T columns).
  ExpectSymbolicMatchesCpu(
      {{DType::kF32, {kSym, 8}}, {DType::kF32, {kSym, 8}}},
      [](ir::Builder& b) {
        return std::vector<ValueId>{
            *b.Add("concat", {*b.Add("exp", {0}), *b.Add("neg", {1}), 0}, {{"axis", int64_t{0}}})};
      },
      {"N"}, kOneSymbol);
  ExpectSymbolicMatchesCpu(
      {{DType::kF32, {3, kSym}}, {DType::kF32, {3, kSym}}},
      [](ir::Builder& b) {
        return std::vector<ValueId>{
            *b.Add("concat", {*b.Add("tanh", {0}), *b.Add("sin", {1}), 1}, {{"axis", int64_t{1}}})};
      },
      {"T"}, kOneSymbol);
}

// Three symbols times a static width: at the samples (~1.7e4, 2.2e4 and 2.7e4) the tensor has
// ~4e15 elements, more blocks than one launch holds. The grid is evaluated at launch from the
// run's sizes (the loader refuses a launch that does not fit then), so the sample's count is no
// reason to refuse the graph (Sequencer's layer norms at three run-time sizes were).
TEST(CudaSymbolic, ThreeSymbolsWhoseSamplesOverflowOneLaunch) {
  REQUIRE_NVRTC();
  ExpectSymbolicMatchesCpu({{DType::kF32, {kSym, kSym - 1, kSym - 2, 384}}, {DType::kF32, {384}}},
                           [](ir::Builder& b) {
                             return std::vector<ValueId>{*b.Add("tanh", {*b.Add("add", {0, 1})})};
                           },
                           {"B", "H", "W"}, {{1, 2, 3}, {2, 3, 1}, {3, 1, 2}, {0, 2, 2}});
}

TEST(CudaSymbolic, RowsOfVaryingLengthAndCount) {
  REQUIRE_NVRTC();
  // softmax over T of [B, T]: rows vary in length and count.
  ExpectSymbolicMatchesCpu(
      {{DType::kF32, {kSym - 1, kSym}}},
      [](ir::Builder& b) {
        return std::vector<ValueId>{*b.Add("softmax", {0}, {{"axis", int64_t{-1}}})};
      },
      {"T", "B"},
      {{1, 1},
       {5, 3},
       {129, 2},
       {300, 1},
       {0, 2},
       {3, 0},
       {128, 3},
       {64, 9},
       {700, 2},
       {2100, 1},
       {4500, 1}});
  // layer_norm with weight and bias over a varying f16 length: lengths that are multiples of
  // the vector width take the vector body (rows start aligned), the others the scalar one.
  ExpectSymbolicMatchesCpu(
      {{DType::kF16, {kSym - 1, kSym}}, {DType::kF16, {kSym}}, {DType::kF16, {kSym}}},
      [](ir::Builder& b) {
        return std::vector<ValueId>{*b.Add("layer_norm", {0, 1, 2}, {{"axes", ir::IntList{-1}}})};
      },
      {"T", "B"}, {{8, 3}, {13, 2}, {200, 5}, {1, 1}, {600, 2}, {602, 1}, {3000, 1}});
  // layer_norm over a static 64: a varying number of rows, several per block.
  ExpectSymbolicMatchesCpu(
      {{DType::kF32, {kSym, 64}}},
      [](ir::Builder& b) {
        return std::vector<ValueId>{*b.Add("layer_norm", {0}, {{"axes", ir::IntList{-1}}})};
      },
      {"N"}, kOneSymbol);
}

TEST(CudaSymbolic, ColumnsAndWholeTensorReductions) {
  REQUIRE_NVRTC();
  // A sum down a symbolic axis 0 (a few outputs, long strided reductions).
  ExpectSymbolicMatchesCpu(
      {{DType::kF32, {kSym, 40}}},
      [](ir::Builder& b) {
        return std::vector<ValueId>{*b.Add("sum", {0}, {{"axes", ir::IntList{0}}})};
      },
      {"N"}, {{1}, {3}, {100}, {0}});
  // Whole-tensor reductions feeding pointwise work: x - mean(x), and an argmax.
  ExpectSymbolicMatchesCpu(
      {{DType::kF32, {kSym}}},
      [](ir::Builder& b) {
        auto m = *b.Add("mean", {0}, {{"axes", ir::IntList{0}}, {"keepdim", true}});
        auto d = *b.Add("sub", {0, m});
        return std::vector<ValueId>{d, *b.Add("argmax", {0}, {{"axis", int64_t{0}}})};
      },
      {"N"}, {{7}, {300}});
  // A pointwise result and its column sums (a dropout's gradient and a bias gradient) over
  // symbolic rows: stored from the sums' loop (kernels/codegen/cuda/cuda_codegen.cc).
  ExpectSymbolicMatchesCpu(
      {{DType::kF32, {kSym, 96}}, {DType::kBool, {kSym, 96}}},
      [](ir::Builder& b) {
        auto s =
            *b.Add("full", {}, {{"shape", ir::IntList{}}, {"value", 1.25}, {"dtype", DType::kF32}});
        auto z =
            *b.Add("full", {}, {{"shape", ir::IntList{}}, {"value", 0.0}, {"dtype", DType::kF32}});
        auto v = *b.Add("where", {1, *b.Add("mul", {0, s}), z});
        return std::vector<ValueId>{v, *b.Add("sum", {v}, {{"axes", ir::IntList{0}}})};
      },
      {"N"}, {{1}, {5}, {2048}, {0}});
}

// Sizes around the vector widths (2 and 4 lanes): the last vector partial or whole.
const std::vector<std::vector<int64_t>> kRaggedSizes = {{0}, {1}, {2},  {3},   {4},
                                                        {5}, {7}, {37}, {130}, {257}};

// The k-means assignment: the index of the nearest of K = 8 centres for each of N points.
std::vector<ValueId> Assign(ir::Builder& b, ValueId points, ValueId centres) {
  auto c = *b.Add("unsqueeze", {centres}, {{"axes", ir::IntList{1}}});  // [K, 1, 2]
  auto d = *b.Add("sub", {points, c});                                  // [K, N, 2]
  auto dist = *b.Add("sum", {*b.Add("mul", {d, d})}, {{"axes", ir::IntList{2}}});
  return {*b.Add("argmin", {dist}, {{"axis", int64_t{0}}})};
}

TEST(CudaSymbolic, RaggedLanesWithReductionsAndStridedLoads) {
  REQUIRE_NVRTC();
  // A flat range of varying length whose trees hold reductions and loads strided along it:
  // vectors of lanes, the last one partial, lanes past the end clamped to the last element.
  // The strided inputs end at an inaccessible page, so an unclamped lane faults.
  for (DType t : {DType::kF32, DType::kF64}) {
    SCOPED_TRACE(ir::DTypeName(t));
    // k-means with the centres a constant: int64 indices, two per 16-byte store.
    ExpectSymbolicMatchesCpu(
        {{t, {kSym, 2}, true}},
        [t](ir::Builder& b) {
          ir::Constant k;
          k.dtype = t;
          k.shape = {8, 2};
          for (int i = 0; i < 16; ++i) k.f.push_back(0.25 * i - 1.5);
          return Assign(b, 0, *b.Add("constant", {}, {{"value", k}}));
        },
        {"N"}, kRaggedSizes);
    // ... and with the centres an input.
    ExpectSymbolicMatchesCpu(
        {{t, {kSym, 2}, true}, {t, {8, 2}, true}}, [](ir::Builder& b) { return Assign(b, 0, 1); },
        {"N"}, kRaggedSizes);
  }
  // A row sum of a strided [N, 3] times a contiguous [N] (vector loads, 4 lanes), and beside
  // it the row's argmax (int64: 2 lanes).
  ExpectSymbolicMatchesCpu(
      {{DType::kF32, {kSym}}, {DType::kF32, {kSym, 3}, true}},
      [](ir::Builder& b) {
        auto s = *b.Add("sum", {1}, {{"axes", ir::IntList{1}}});
        return std::vector<ValueId>{*b.Add("mul", {0, s})};
      },
      {"N"}, kRaggedSizes);
  ExpectSymbolicMatchesCpu(
      {{DType::kF32, {kSym}}, {DType::kF32, {kSym, 3}, true}},
      [](ir::Builder& b) {
        auto s = *b.Add("sum", {1}, {{"axes", ir::IntList{1}}});
        return std::vector<ValueId>{*b.Add("mul", {0, s}),
                                    *b.Add("argmax", {1}, {{"axis", int64_t{1}}})};
      },
      {"N"}, kRaggedSizes);
}

TEST(CudaSymbolic, RaggedStrategyNamesThePartialVector) {
  REQUIRE_NVRTC();
  ir::Graph g = Build(
      {{DType::kF32, {kSym, 2}}, {DType::kF32, {8, 2}}},
      [](ir::Builder& b) { return Assign(b, 0, 1); }, {"N"}, {ir::SampleValue(0, 0)}, true);
  auto gen = SharedPipeline().Generate(g, CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(gen.ok()) << gen.status();
  EXPECT_NE(gen->fusion_report.find("x 2 element(s) (the last partial)"), std::string::npos)
      << gen->fusion_report;
  EXPECT_NE(gen->source.find("kiln_vstore_n<2>"), std::string::npos) << gen->source;
}

TEST(CudaSymbolic, RefusalsNameTheRule) {
  REQUIRE_NVRTC();
  // A slice inside a symbolic axis means different elements at different sizes: refused with
  // INVALID_ARGUMENT naming the node and the rule, as on the CPU.
  ir::Graph g = Build(
      {{DType::kF32, {kSym, 4}}},
      [](ir::Builder& b) {
        return std::vector<ValueId>{*b.Add(
            "slice", {0},
            {{"axes", ir::IntList{0}}, {"starts", ir::IntList{1}}, {"stops", ir::IntList{3}}})};
      },
      {"N"}, {ir::SampleValue(0, 0)}, true);
  auto gen = SharedPipeline().Generate(g, CudaTarget(90), CompileOptions{});
  ASSERT_FALSE(gen.ok());
  EXPECT_EQ(gen.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gen.status().message().find("slice"), std::string::npos) << gen.status();
  EXPECT_NE(gen.status().message().find("rule:"), std::string::npos) << gen.status();
}

}  // namespace
}  // namespace kiln
