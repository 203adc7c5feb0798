// Generated CUDA kernels run in emulation (cuda_emulation.h) against the CPU backend, one
// test per strategy and per family of ops. Shapes are chosen to hit each path: vector and
// scalar lanes, unrolled and looped rows, rows packed into a block, cached rows, column
// tiles, and whole-tensor partials.
#include "tests/unit/kernels/cuda_test_util.h"

namespace kiln {
namespace {

using ir::DType;
using ir::ValueId;
using namespace kiln::testing;  // NOLINT: test helpers

ir::Graph Binary(const char* op, std::vector<ir::TensorType> in) {
  return Make(std::move(in), [&](ir::Builder& b) {
    return std::vector<ValueId>{*b.Add(op, {0, 1})};
  });
}

// out = f(a, b) with NumPy broadcasting, in double on the host: a reference that shares no
// code with either backend.
Reference BroadcastReference(ir::Shape a, ir::Shape b, std::function<double(double, double)> f) {
  return [a, b, f](const std::vector<HostTensor>& in, std::vector<HostTensor>* out) {
    const size_t rank = std::max(a.size(), b.size());
    ir::Shape pa(rank - a.size(), 1), pb(rank - b.size(), 1), o(rank);
    pa.insert(pa.end(), a.begin(), a.end());
    pb.insert(pb.end(), b.begin(), b.end());
    for (size_t k = 0; k < rank; ++k) o[k] = std::max(pa[k], pb[k]);
    for (int64_t i = 0; i < (*out)[0].elements; ++i) {
      int64_t rest = i, ia = 0, ib = 0, sa = 1, sb = 1;
      for (size_t k = rank; k-- > 0;) {
        const int64_t at = rest % o[k];
        rest /= o[k];
        if (pa[k] != 1) ia += at * sa;
        if (pb[k] != 1) ib += at * sb;
        sa *= pa[k];
        sb *= pb[k];
      }
      (*out)[0].Set(i, f(in[0].At(ia), in[1].At(ib)));
    }
  };
}

double Plus(double x, double y) { return x + y; }
double Minus(double x, double y) { return x - y; }
double Times(double x, double y) { return x * y; }

ir::Graph Reduce(const char* op, ir::TensorType in, ir::AttrMap attrs) {
  return Make({std::move(in)},
              [&](ir::Builder& b) { return std::vector<ValueId>{*b.Add(op, {0}, attrs)}; });
}

// Checked against host references, not the CPU backend, so that a bug in code both backends
// share (expression printing, lowering, scheduling) fails here too.
TEST(CudaEmulation, Pointwise) {
  ExpectMatchesCpu(Binary("add", {Ty(DType::kF32, {1000}), Ty(DType::kF32, {1000})}),
                   nullptr,  // vectors of 4
                   BroadcastReference({1000}, {1000}, Plus));
  ExpectMatchesCpu(Binary("add", {Ty(DType::kF32, {37, 129}), Ty(DType::kF32, {37, 129})}),
                   nullptr,  // scalar lanes
                   BroadcastReference({37, 129}, {37, 129}, Plus));
  ExpectMatchesCpu(Binary("mul", {Ty(DType::kF32, {64, 48}), Ty(DType::kF32, {48})}),
                   nullptr,  // row broadcast
                   BroadcastReference({64, 48}, {48}, Times));
  ExpectMatchesCpu(Binary("sub", {Ty(DType::kF64, {64, 48}), Ty(DType::kF64, {64, 1})}),
                   nullptr,  // column broadcast
                   BroadcastReference({64, 48}, {64, 1}, Minus));
  ExpectMatchesCpu(Binary("add", {Ty(DType::kI8, {256}), Ty(DType::kF16, {256})}),
                   nullptr,  // mixed types
                   BroadcastReference({256}, {256}, Plus));
  ExpectMatchesCpu(SinCos(1024), nullptr, SinCosReference);
}

TEST(CudaEmulation, Views) {
  // Transposed and sliced reads (no vector loads), concat, iota, strided input.
  ExpectMatchesCpu(
      Make({Ty(DType::kF32, {24, 16})},
           [](ir::Builder& b) {
             auto t = *b.Add("permute", {0}, {{"dims", ir::IntList{1, 0}}});
             auto s = *b.Add("slice", {t},
                             {{"axes", ir::IntList{1}},
                              {"starts", ir::IntList{20}},
                              {"stops", ir::IntList{2}},
                              {"steps", ir::IntList{-3}}});
             auto c = *b.Add("concat", {s, s}, {{"axis", int64_t{0}}});
             auto i = *b.Add(
                 "iota", {},
                 {{"shape", ir::IntList{32, 6}}, {"axis", int64_t{1}}, {"dtype", DType::kF32}});
             return std::vector<ValueId>{*b.Add("add", {c, i})};
           }),
      nullptr, [](const std::vector<HostTensor>& in, std::vector<HostTensor>* out) {
        // t = x^T [16, 24]; s[r][j] = t[r][20 - 3j]; c = s stacked twice; + column index.
        for (int64_t r = 0; r < 32; ++r)
          for (int64_t j = 0; j < 6; ++j)
            (*out)[0].Set(r * 6 + j, in[0].At((20 - 3 * j) * 16 + r % 16) + static_cast<double>(j));
      });
  ir::TensorType strided = Ty(DType::kF32, {16, 24});
  strided.strides = {1, 16};
  ExpectMatchesCpu(Make({strided, Ty(DType::kF16, {24})},
                        [](ir::Builder& b) {
                          return std::vector<ValueId>{*b.Add("mul", {0, 1})};
                        }),
                   nullptr, [](const std::vector<HostTensor>& in, std::vector<HostTensor>* out) {
                     // Element (i, j) of the input lies at i * 1 + j * 16.
                     for (int64_t i = 0; i < 16; ++i)
                       for (int64_t j = 0; j < 24; ++j)
                         (*out)[0].Set(i * 24 + j, in[0].At(i + 16 * j) * in[1].At(j));
                   });
}

// A concatenation at the root of an output computes only the piece each vector lies in
// (an if/else chain): along the vector axis with piece boundaries on vector boundaries, along
// an outer axis, with more pieces than a chain of selections holds (a tree), and with
// boundaries that split vectors (the select expression, every piece computed).
TEST(CudaEmulation, ConcatenatedPieces) {
  auto pieces = [](int64_t w0, int64_t w1, int64_t axis, DType out) {
    return Make({Ty(DType::kF32, {16, 64}), Ty(DType::kF32, {16, w0}), Ty(DType::kF32, {16, w1})},
                [=](ir::Builder& b) {
                  auto a = *b.Add("slice", {0},
                                  {{"axes", ir::IntList{1}},
                                   {"starts", ir::IntList{8}},
                                   {"stops", ir::IntList{8 + w0}}});
                  auto s = *b.Add("sigmoid", {a});
                  auto e = *b.Add("mul", {*b.Add("exp", {1}), a});
                  auto t = *b.Add("tanh", {2});
                  ValueId c = *b.Add("concat", {s, e, t}, {{"axis", axis}});
                  return std::vector<ValueId>{*b.Add("cast", {c}, {{"dtype", out}})};
                });
  };
  auto reference = [](int64_t w0, int64_t w1) {
    return [=](const std::vector<HostTensor>& in, std::vector<HostTensor>* out) {
      const int64_t W = 2 * w0 + w1;
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t j = 0; j < W; ++j) {
          double v;
          if (j < w0) {
            v = 1.0 / (1.0 + std::exp(-in[0].At(r * 64 + 8 + j)));
          } else if (j < 2 * w0) {
            v = std::exp(in[1].At(r * w0 + j - w0)) * in[0].At(r * 64 + 8 + j - w0);
          } else {
            v = std::tanh(in[2].At(r * w1 + j - 2 * w0));
          }
          (*out)[0].Set(r * W + j, v);
        }
    };
  };
  ExpectMatchesCpu(pieces(32, 64, 1, DType::kF32), nullptr, reference(32, 64));  // vectors of 4
  ExpectMatchesCpu(pieces(8, 16, 1, DType::kF16), nullptr, reference(8, 16));    // vectors of 8
  ExpectMatchesCpu(pieces(6, 10, 1, DType::kF32), nullptr, reference(6, 10));    // vectors of 2
  ExpectMatchesCpu(pieces(6, 4, 1, DType::kF32), nullptr,
                   reference(6, 4));  // boundaries inside vectors
  // Along the rows: [16, 8] pieces stacked, then a tree of 20 pieces along the columns.
  ExpectMatchesCpu(Make({Ty(DType::kF32, {16, 8}), Ty(DType::kF32, {16, 8})}, [](ir::Builder& b) {
    return std::vector<ValueId>{
        *b.Add("concat", {*b.Add("exp", {0}), *b.Add("neg", {1}), 0}, {{"axis", int64_t{0}}})};
  }));
  ExpectMatchesCpu(Make({Ty(DType::kF32, {8, 4})}, [](ir::Builder& b) {
    std::vector<ValueId> parts;
    for (int k = 0; k < 20; ++k) parts.push_back(k % 2 ? *b.Add("exp", {0}) : *b.Add("neg", {0}));
    return std::vector<ValueId>{*b.Add("concat", parts, {{"axis", int64_t{1}}})};
  }));
}

// Gathers (positions held in a tensor; the random integers include negative and out-of-range
// ones, which wrap and clamp): an embedding lookup read through inserted size-1 axes with a
// layer_norm of the rows, take_along_axis in f16 along the rows, and rows gathered from a
// computed source (stored first) feeding a row sum and an argmax.
TEST(CudaEmulation, Gather) {
  ExpectMatchesCpu(Make({Ty(DType::kF32, {64, 96}), Ty(DType::kI64, {5, 12})}, [](ir::Builder& b) {
    auto table = *b.Add("unsqueeze", {0}, {{"axes", ir::IntList{1}}});
    auto ids = *b.Add("unsqueeze", {1}, {{"axes", ir::IntList{2}}});
    auto rows = *b.Add("gather", {table, ids}, {{"axis", int64_t{0}}});
    return std::vector<ValueId>{rows, *b.Add("layer_norm", {rows})};
  }));
  ExpectMatchesCpu(Make({Ty(DType::kF16, {37, 50}), Ty(DType::kI32, {37, 9})}, [](ir::Builder& b) {
    return std::vector<ValueId>{*b.Add("gather", {0, 1}, {{"axis", int64_t{1}}})};
  }));
  ExpectMatchesCpu(Make({Ty(DType::kF32, {30, 200}), Ty(DType::kI32, {64, 1})}, [](ir::Builder& b) {
    auto rows = *b.Add("gather", {*b.Add("exp", {0}), 1}, {{"axis", int64_t{0}}});
    return std::vector<ValueId>{*b.Add("sum", {rows}, {{"axes", ir::IntList{1}}}),
                                *b.Add("argmax", {rows}, {{"axis", int64_t{1}}})};
  }));
}

// Counter-based random numbers: the CUDA kernels (vector lanes, row kernels, a transposed draw)
// draw the numbers the CPU backend draws, bit for bit, as a dropout, a mask, row sums of an f16
// draw and a layer_norm of a noisy input.
TEST(CudaEmulation, Uniform) {
  ExpectMatchesCpu(
      Make({Ty(DType::kI64, {}), Ty(DType::kF32, {64, 300}), Ty(DType::kF16, {33, 130})},
           [](ir::Builder& b) {
             auto scalar = [&](double v) {
               return *b.Add("full", {},
                             {{"shape", ir::IntList{}}, {"value", v}, {"dtype", DType::kF32}});
             };
             auto u = *b.Add("uniform", {0, 1}, {{"stream", int64_t{1}}});
             auto keep =
                 *b.Add("ge", {*b.Add("uniform", {0, 1}, {{"stream", int64_t{2}}}), scalar(0.1)});
             auto dropped = *b.Add("where", {keep, *b.Add("mul", {1, scalar(1 / 0.9)}), scalar(0)});
             auto u16 = *b.Add("uniform", {0, 2}, {{"stream", int64_t{3}}, {"dtype", DType::kF16}});
             const ir::IntList swap = {1, 0};
             auto xt = *b.Add("permute", {1}, {{"dims", swap}});
             auto t = *b.Add("permute", {*b.Add("uniform", {0, xt})}, {{"dims", swap}});
             auto noisy = *b.Add("add", {1, u});
             return std::vector<ValueId>{u,       keep,
                                         dropped, *b.Add("sum", {u16}, {{"axes", ir::IntList{1}}}),
                                         t,       *b.Add("layer_norm", {noisy})};
           }));
}

// A pointwise result that a column sum reads (a gelu-like backward and its bias gradient; a
// dropout backward and the sum before it, over a 3-D activation; a split column reduction and
// a short one): the reduction kernel computes and stores the values itself, one launch fewer,
// every element of the pointwise result written (a later kernel reading it too sees them all).
// Half types, row sums and concatenations keep their own kernel.
TEST(CudaEmulation, PointwiseStoredFromColumnReduction) {
  auto scalar = [](ir::Builder& b, double v) {
    return *b.Add("full", {}, {{"shape", ir::IntList{}}, {"value", v}, {"dtype", DType::kF32}});
  };
  std::vector<ir::Graph> cases;
  for (int64_t rows : {int64_t{2048}, int64_t{100}}) {
    cases.push_back(
        Make({Ty(DType::kF32, {rows, 96}), Ty(DType::kF32, {rows, 96})}, [&](ir::Builder& b) {
          auto slope =
              *b.Add("where", {*b.Add("gt", {1, scalar(b, 0)}), scalar(b, 1.0), scalar(b, 0.1)});
          auto v = *b.Add("mul", {0, slope});
          return std::vector<ValueId>{v, *b.Add("sum", {v}, {{"axes", ir::IntList{0}}})};
        }));
  }
  cases.push_back(
      Make({Ty(DType::kF32, {16, 40, 64}), Ty(DType::kBool, {16, 40, 64})}, [&](ir::Builder& b) {
        auto v = *b.Add("where", {1, *b.Add("mul", {0, scalar(b, 1.25)}), scalar(b, 0)});
        auto sq = *b.Add("mul", {v, v});
        return std::vector<ValueId>{*b.Add("sum", {v}, {{"axes", ir::IntList{0, 1}}}),
                                    *b.Add("sum", {sq}, {{"axes", ir::IntList{0, 1}}}), v};
      }));
  for (const ir::Graph& c : cases) {
    ExpectMatchesCpu(c);
    auto gen = SharedPipeline().Generate(c, CudaTarget(90), CompileOptions{});
    ASSERT_TRUE(gen.ok()) << gen.status();
    EXPECT_NE(gen->fusion_report.find("is stored from"), std::string::npos) << gen->fusion_report;
  }
  // Read again by a later kernel: the reduction kernel stores every element before it runs.
  cases.clear();
  cases.push_back(Make({Ty(DType::kF32, {2048, 96})}, [&](ir::Builder& b) {
    auto v = *b.Add("exp", {0});
    auto s = *b.Add("sum", {v}, {{"axes", ir::IntList{0}}});
    return std::vector<ValueId>{v, s, *b.Add("add", {v, s})};
  }));
  // f16: the sums would read values that the stored ones round; kept apart.
  cases.push_back(Make({Ty(DType::kF16, {2048, 96})}, [&](ir::Builder& b) {
    auto v = *b.Add("exp", {0});
    return std::vector<ValueId>{v, *b.Add("sum", {v}, {{"axes", ir::IntList{0}}})};
  }));
  // A row sum (its strategy goes by what it reads contiguously) and concatenated pieces (their
  // kernel branches per piece): kept apart.
  cases.push_back(Make({Ty(DType::kF32, {2048, 96})}, [&](ir::Builder& b) {
    auto v = *b.Add("exp", {0});
    return std::vector<ValueId>{v, *b.Add("sum", {v}, {{"axes", ir::IntList{1}}})};
  }));
  cases.push_back(Make({Ty(DType::kF32, {2048, 32}), Ty(DType::kF32, {2048, 64})}, [&](ir::Builder&
                                                                                           b) {
    auto v = *b.Add("concat", {*b.Add("exp", {0}), *b.Add("sigmoid", {1})}, {{"axis", int64_t{1}}});
    return std::vector<ValueId>{v, *b.Add("sum", {v}, {{"axes", ir::IntList{0}}})};
  }));
  for (size_t i = 0; i < cases.size(); ++i) {
    ExpectMatchesCpu(cases[i]);
    auto gen = SharedPipeline().Generate(cases[i], CudaTarget(90), CompileOptions{});
    ASSERT_TRUE(gen.ok()) << gen.status();
    EXPECT_EQ(gen->fusion_report.find("is stored from") != std::string::npos, i == 0)
        << gen->fusion_report;
  }
}

TEST(CudaEmulation, UnaryOpsEveryDtype) {
  for (DType t : kAllTypes) {
    SCOPED_TRACE(ir::DTypeName(t));
    ExpectMatchesCpu(AllElementwise(t, {3, 40}, false));
  }
}

TEST(CudaEmulation, BinaryOpsEveryDtype) {
  for (DType t : kAllTypes) {
    SCOPED_TRACE(ir::DTypeName(t));
    ExpectMatchesCpu(AllElementwise(t, {3, 40}, true));
  }
}

TEST(CudaEmulation, ReductionsEveryDtype) {
  for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kI8,
                  DType::kBool}) {
    SCOPED_TRACE(ir::DTypeName(t));
    ExpectMatchesCpu(AllReductions(t, {37, 129}));
  }
}

TEST(CudaEmulation, RowKernels) {
  ExpectMatchesCpu(Softmax(37, 129));                // 32 threads per row, 4 rows per block, cached
  ExpectMatchesCpu(Softmax(6, 4096));                // 512 threads per row, shared memory, vectors
  ExpectMatchesCpu(Softmax(3, 50000, DType::kF32));  // looped row
  ExpectMatchesCpu(Softmax(50, 7, DType::kF16));     // short rows
  ExpectMatchesCpu(LayerNormGelu(64, 256));
  ExpectMatchesCpu(LayerNormGelu(16, 200, DType::kBF16));
  // Normalizing over the last two axes, with weight and bias.
  ExpectMatchesCpu(
      Make({Ty(DType::kF32, {4, 6, 10}), Ty(DType::kF32, {6, 10}), Ty(DType::kF32, {6, 10})},
           [](ir::Builder& b) {
             return std::vector<ValueId>{
                 *b.Add("layer_norm", {0, 1, 2}, {{"axes", ir::IntList{-2, -1}}})};
           }));
  // A row reduction over a small per-element reduction: z = sum(x, 2); z - max(z, 1).
  ExpectMatchesCpu(Make({Ty(DType::kF32, {20, 64, 3})}, [](ir::Builder& b) {
    auto z = *b.Add("sum", {0}, {{"axes", ir::IntList{2}}});
    auto m = *b.Add("max", {z}, {{"axes", ir::IntList{1}}, {"keepdim", true}});
    return std::vector<ValueId>{*b.Add("sub", {z, m})};
  }));
  // A row reduction feeding a row op, and a row sum stored beside it (two outputs).
  ExpectMatchesCpu(Make({Ty(DType::kF64, {20, 300})}, [](ir::Builder& b) {
    auto s = *b.Add("sum", {0}, {{"axes", ir::IntList{1}}, {"keepdim", true}});
    return std::vector<ValueId>{*b.Add("div", {0, s}), s};
  }));
}

// Chunked statistics, then a consumer over every element that combines each sample's chunks
// (a group norm after its first pass): the few samples would be a few long rows, so the row
// kernel splits deeper (a row per sample and channel), each row recomputing the short combine.
ir::Graph ChunkedNormalize(int64_t n, int64_t c, int64_t hw, int64_t chunks) {
  return Make({Ty(DType::kF32, {n, c, hw})}, [=](ir::Builder& b) {
    auto parts = *b.Add("reshape", {0}, {{"shape", ir::IntList{n, chunks, c * hw / chunks}}});
    auto m = *b.Add("mean", {parts}, {{"axes", ir::IntList{2}}});
    auto mean = *b.Add("mean", {m}, {{"axes", ir::IntList{1}}});
    auto column = *b.Add("reshape", {mean}, {{"shape", ir::IntList{n, 1, 1}}});
    auto centred = *b.Add("sub", {0, column});
    return std::vector<ValueId>{*b.Add("mul", {centred, centred})};
  });
}

TEST(CudaEmulation, FewLongRowsSplitDeeper) {
  const ir::Graph g = ChunkedNormalize(4, 32, 1024, 8);
  auto gen = testing::SharedPipeline().Generate(g, CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(gen.ok()) << gen.status();
  EXPECT_NE(gen->fusion_report.find("row: 128 row(s) of 1024,"), std::string::npos)
      << gen->fusion_report;
  ExpectMatchesCpu(g);
  // Rows enough already: one row per sample.
  const ir::Graph many = ChunkedNormalize(600, 4, 256, 8);
  auto wide = testing::SharedPipeline().Generate(many, CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_NE(wide->fusion_report.find("row: 600 row(s) of 1024"), std::string::npos)
      << wide->fusion_report;
}

TEST(CudaEmulation, PerOutputReductions) {
  ExpectMatchesCpu(KMeans(1001, 5, DType::kF64));
  ExpectMatchesCpu(KMeans(1000, 8, DType::kF32));
  ExpectMatchesCpu(
      Reduce("sum", Ty(DType::kF32, {300, 700}), {{"axes", ir::IntList{1}}}));  // block per output
  ExpectMatchesCpu(Reduce("max", Ty(DType::kF32, {40, 300}), {{"axes", ir::IntList{1}}}),
                   [](int, HostTensor* t) {  // NaN in some rows
                     float* p = reinterpret_cast<float*>(t->data.get());
                     for (int r = 0; r < 40; r += 3) p[r * 300 + r] = NAN;
                   });
  auto ties = [](int, HostTensor* t) {  // constant rows, NaN rows, repeated maxima
    float* p = reinterpret_cast<float*>(t->data.get());
    for (int c = 0; c < 300; ++c) p[0 * 300 + c] = 1.0f;
    p[1 * 300 + 7] = NAN;
    p[1 * 300 + 200] = NAN;
    p[2 * 300 + 5] = 100;
    p[2 * 300 + 250] = 100;
    p[3 * 300 + 5] = -100;
    p[3 * 300 + 250] = -100;
  };
  ExpectMatchesCpu(Reduce("argmax", Ty(DType::kF32, {50, 300}), {{"axis", int64_t{1}}}), ties);
  ExpectMatchesCpu(Reduce("argmin", Ty(DType::kF32, {50, 300}), {{"axis", int64_t{1}}}), ties);
}

TEST(CudaEmulation, OuterProductSums) {
  ExpectMatchesCpu(OuterProductSum(1024, 64, nullptr));
  ExpectMatchesCpu(OuterProductSum(1024, 64, "sin"));
  ExpectMatchesCpu(OuterProductSum(600, 40, "exp"));  // 1600 per row: a loop with a bound check
}

TEST(CudaEmulation, ColumnTiles) {
  ExpectMatchesCpu(Reduce("sum", Ty(DType::kF32, {2000, 48}), {{"axes", ir::IntList{0}}}));
  ExpectMatchesCpu(Reduce("var", Ty(DType::kF64, {1500, 40}), {{"axes", ir::IntList{0}}}));
  ExpectMatchesCpu(Reduce("argmin", Ty(DType::kI32, {3000, 40}), {{"axis", int64_t{0}}}));
  ExpectMatchesCpu(
      Reduce("max", Ty(DType::kF32, {2000, 33}), {{"axes", ir::IntList{0}}}),
      [](int, HostTensor* t) { reinterpret_cast<float*>(t->data.get())[1999 * 33 + 4] = NAN; });
}

// Column sums of a matrix times a per-row vector (a layer_norm backward's weight gradient):
// the vector is contiguous along the reduced rows, the matrix is not. The matrix decides:
// a column tile (coalesced across columns), not a row of threads striding down one column.
TEST(CudaEmulation, ColumnSumsBesideAPerRowVector) {
  REQUIRE_NVRTC();
  ir::Graph g = Make({Ty(DType::kF32, {3000, 96}), Ty(DType::kF32, {3000, 1})}, [](ir::Builder& b) {
    auto prod = *b.Add("mul", {0, 1});
    return std::vector<ValueId>{*b.Add("sum", {prod}, {{"axes", ir::IntList{0}}}),
                                *b.Add("sum", {0}, {{"axes", ir::IntList{0}}})};
  });
  // Multiples of 1/8: every partial sum is exact in float, so any summation order agrees.
  ExpectMatchesCpu(g, [](int, HostTensor* t) {
    float* p = reinterpret_cast<float*>(t->data.get());
    for (int64_t k = 0; k < t->elements; ++k) p[k] = std::round(p[k] * 8) / 8;
  });
  auto gen = SharedPipeline().Generate(g, CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(gen.ok()) << gen.status();
  EXPECT_NE(gen->fusion_report.find("column tile"), std::string::npos) << gen->fusion_report;
}

// Column reductions with few outputs over long ranges (bias gradients: [8192, 768] -> [768]):
// the range is split into chunks whose partials a second launch combines. Row counts that no
// chunk size divides, reductions over two axes, NaN, bool and f16 inputs, an epilogue after
// the reduction, and two reductions of one launch.
TEST(CudaEmulation, SplitColumnReductions) {
  REQUIRE_NVRTC();
  auto split = [](const ir::Graph& g) {
    auto gen = SharedPipeline().Generate(g, CudaTarget(90), CompileOptions{});
    ASSERT_TRUE(gen.ok()) << gen.status();
    EXPECT_NE(gen->fusion_report.find("column partials"), std::string::npos) << gen->fusion_report;
  };
  // Multiples of 1/8: every partial sum is exact, so any summation order agrees.
  auto eighths = [](int, HostTensor* t) {
    for (int64_t k = 0; k < t->elements; ++k) t->Set(k, std::round(t->At(k) * 8) / 8);
  };
  ir::Graph sum = Reduce("sum", Ty(DType::kF32, {5003, 40}), {{"axes", ir::IntList{0}}});
  split(sum);
  ExpectMatchesCpu(sum, eighths);
  ir::Graph two_axes = Reduce("sum", Ty(DType::kF64, {7, 611, 24}), {{"axes", ir::IntList{0, 1}}});
  split(two_axes);
  ExpectMatchesCpu(two_axes, eighths);
  ir::Graph max = Reduce("max", Ty(DType::kF32, {4000, 33}), {{"axes", ir::IntList{0}}});
  split(max);
  ExpectMatchesCpu(max, [](int, HostTensor* t) {
    reinterpret_cast<float*>(t->data.get())[3999 * 33 + 4] = NAN;
  });
  ir::Graph any = Reduce("any", Ty(DType::kBool, {4000, 20}), {{"axes", ir::IntList{0}}});
  split(any);
  ExpectMatchesCpu(any, [](int, HostTensor* t) {
    std::memset(t->data.get(), 0, t->bytes());
    t->data.get()[3001 * 20 + 7] = 1;  // one true, deep in one chunk of one column
  });
  ExpectMatchesCpu(Reduce("sum", Ty(DType::kF16, {4096, 48}), {{"axes", ir::IntList{0}}}), eighths);
  // A layer_norm backward's weight and bias gradients, scaled afterwards.
  ir::Graph ln =
      Make({Ty(DType::kF32, {6000, 96}), Ty(DType::kF32, {6000, 1})}, [](ir::Builder& b) {
        auto prod = *b.Add("mul", {0, 1});
        auto wsum = *b.Add("sum", {prod}, {{"axes", ir::IntList{0}}});
        auto two =
            *b.Add("full", {}, {{"shape", ir::IntList{}}, {"value", 2.0}, {"dtype", DType::kF32}});
        return std::vector<ValueId>{*b.Add("mul", {wsum, two}),
                                    *b.Add("sum", {0}, {{"axes", ir::IntList{0}}})};
      });
  split(ln);
  ExpectMatchesCpu(ln, eighths);
  // A variance: its sum of squared deviations reads the mean, so it is split in a second
  // partials launch that reads the first's partials (it was a column tile of 2 blocks). Values
  // in quarters around a mean of 0.5 keep every partial exact.
  ir::Graph var = Reduce("var", Ty(DType::kF32, {8000, 64}), {{"axes", ir::IntList{0}}});
  auto var_gen = SharedPipeline().Generate(var, CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(var_gen.ok()) << var_gen.status();
  EXPECT_NE(var_gen->fusion_report.find("k0_c1: column partials"), std::string::npos)
      << var_gen->fusion_report;
  ExpectMatchesCpu(var, [](int, HostTensor* t) {
    for (int64_t k = 0; k < t->elements; ++k)
      t->Set(k, 0.5 + static_cast<double>((k * 7) % 5 - 2) / 4);
  });
}

// Outputs with the kernel's elements in another shape (a reshape, and a permute of it) are
// stored by the same kernel, each at the flat position of the domain's element.
TEST(CudaEmulation, OutputsOfAnotherShapeShareTheKernel) {
  REQUIRE_NVRTC();
  ir::Graph g = Make({Ty(DType::kF32, {96, 40}), Ty(DType::kF32, {96, 40})}, [](ir::Builder& b) {
    auto sum = *b.Add("add", {0, 1});
    auto r = *b.Add("reshape", {sum}, {{"shape", ir::IntList{40, 96}}});
    auto t = *b.Add("permute", {*b.Add("exp", {r})}, {{"dims", ir::IntList{1, 0}}});
    return std::vector<ValueId>{sum, *b.Add("mul", {r, r}), t};
  });
  ExpectMatchesCpu(g, nullptr, [](const std::vector<HostTensor>& in, std::vector<HostTensor>* out) {
    for (int64_t f = 0; f < 96 * 40; ++f) {
      const double s = in[0].At(f) + in[1].At(f);
      (*out)[0].Set(f, s);
      (*out)[1].Set(f, s * s);
      // t[i][j] = exp(r[j][i]), r the [40, 96] view of the sum: r[j][i] is the sum's element
      // j*96+i.
      const int64_t i = f / 40, j = f % 40;
      (*out)[2].Set(f, std::exp(in[0].At(j * 96 + i) + in[1].At(j * 96 + i)));
    }
  });
  auto gen = SharedPipeline().Generate(g, CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(gen.ok()) << gen.status();
  EXPECT_EQ(gen->fusion_report.find("kernel k1"), std::string::npos) << gen->fusion_report;
}

TEST(CudaEmulation, WholeTensorReductions) {
  // Small: one block, one launch.
  ExpectMatchesCpu(Reduce("sum", Ty(DType::kF32, {1000}), {}));
  ExpectMatchesCpu(Reduce("var", Ty(DType::kF64, {70, 70}), {}));
  ExpectMatchesCpu(Softmax(1, 3000));
  // Large: partials in the workspace, then the consumer.
  ExpectMatchesCpu(Reduce("sum", Ty(DType::kF32, {300000}), {}));
  // Two levels (the mean, then squares about it), checked on the host in double.
  ExpectMatchesCpu(Reduce("var", Ty(DType::kF32, {100000}), {}), nullptr,
                   [](const std::vector<HostTensor>& in, std::vector<HostTensor>* out) {
                     double mean = 0, ss = 0;
                     for (int64_t i = 0; i < 100000; ++i) mean += in[0].At(i);
                     mean /= 100000;
                     for (int64_t i = 0; i < 100000; ++i)
                       ss += (in[0].At(i) - mean) * (in[0].At(i) - mean);
                     *reinterpret_cast<float*>((*out)[0].data.get()) =
                         static_cast<float>(ss / 100000);
                   });
  ExpectMatchesCpu(Reduce("argmin", Ty(DType::kF32, {100000}), {}), [](int, HostTensor* t) {
    float* p = reinterpret_cast<float*>(t->data.get());
    p[70000] = -1000;
    p[90000] = -1000;  // a tie: the first wins
  });
  ExpectMatchesCpu(Reduce("any", Ty(DType::kBool, {100000}), {}), [](int, HostTensor* t) {
    std::memset(t->data.get(), 0, 100000);
    t->data.get()[77777] = 1;
  });
  // A whole-tensor reduction feeding every element (x - max(x)).
  ExpectMatchesCpu(Make({Ty(DType::kF32, {100000})}, [](ir::Builder& b) {
    return std::vector<ValueId>{*b.Add("sub", {0, *b.Add("max", {0})})};
  }));
}

TEST(CudaEmulation, MultiKernelWithTemps) {
  // x / sum(x, axis=0): the column sum is stored, then read by a second kernel.
  ExpectMatchesCpu(Make({Ty(DType::kF32, {64, 16})}, [](ir::Builder& b) {
    auto s = *b.Add("sum", {0}, {{"axes", ir::IntList{0}}, {"keepdim", true}});
    return std::vector<ValueId>{*b.Add("div", {0, s})};
  }));
}

}  // namespace
}  // namespace kiln
