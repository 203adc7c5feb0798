// Symbolic sizes in the IR: a dimension of a graph input may stand for a size known only at
// run time (proto/kiln/v1/graph.proto, TensorType.dim_symbols).
//
// The compiler's stages work on numbers. A symbolic graph therefore always carries *sample
// values* in its symbolic dimensions: large numbers, a band of its own per symbol, so that two
// symbols never coincide and every size-dependent choice (a loop worth threads, a table too big
// to keep) comes out the same for all samples, while their residues differ, so that a choice
// resting on divisibility does not. Verification at a sample holds for every size exactly when its
// rules compare shapes structurally (equal symbols, a symbol against 1); a rule that needs a number
// (a reshape by a fixed factor, broadcasting a symbol against a fixed size other than 1) fails at
// the sample and is reported with the symbol's name. kernels/codegen/symbolic.h turns code
// generated at several samples into code for every size.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/ir/graph.h"
#include "kernels/ir/op_registry.h"

namespace kiln::ir {

// At most this many distinct symbols per graph (each costs a factor of 3 in generation).
inline constexpr int kMaxSymbols = 3;
// Sample points per symbol: three for interpolation (degree <= 2 in each symbol), then one to
// check against.
inline constexpr int kSamplePoints = 4;

// Sample value `point` (0..kSamplePoints-1) of symbol `symbol`.
int64_t SampleValue(int symbol, int point);

// Writes `values[k]` into every input dimension standing for symbol k.
void SetSymbolSizes(Graph& graph, const std::vector<int64_t>& values);
// The sample-0 values of the graph's symbols.
std::vector<int64_t> FirstSample(const Graph& graph);

// `message` with every number equal to a sample value of a symbol (any point) replaced by that
// symbol's name in quotes: what a rule failing at a sample says about the graph.
std::string NameSymbols(absl::string_view message, const Graph& graph);

// While one lives on this thread, the pipeline is generating code at a sample of a symbolic
// graph (kernels/codegen/symbolic.h). Stages then avoid choices that hold at the sample but
// not at every size, and keep the numbers the generaliser reads back exact: no choice rests on
// an extent's divisibility (an unrolled loop without a remainder), single-precision literals
// print all 17 digits of their double, and f16/bf16 constants are not rounded to their type
// (a 1/N rounded to f16 is no longer one over a count; computing in f32 with the exact value
// is as accurate).
class ScopedSymbolicSample {
 public:
  ScopedSymbolicSample();
  ~ScopedSymbolicSample();
  ScopedSymbolicSample(const ScopedSymbolicSample&) = delete;
  ScopedSymbolicSample& operator=(const ScopedSymbolicSample&) = delete;

 private:
  bool previous_;
};
bool InSymbolicSample();

// The sample point being generated (one value per symbol), set by the pipeline for the
// thread while a ScopedSymbolicSample lives; empty otherwise.
void SetCurrentSample(const std::vector<int64_t>& values);
// `extent` with every factor equal to a value of the current sample divided out: the part of
// an extent (a product of static dimensions and symbols) that is the same at every size.
// A choice resting on divisibility (a vector width, rows per block dividing the rows) that is
// made on this part holds for every size. `extent` itself outside a sample.
int64_t StaticFactor(int64_t extent);
// Whether `extent` varies with the sizes (the current sample divides it); false outside one.
bool VariesWithSizes(int64_t extent);

// Limits for verifying a symbolic graph at its samples: element counts are the client's
// business at run time, and a product of samples may exceed a static graph's limit.
Limits SymbolicLimits(const Limits& limits);

}  // namespace kiln::ir
