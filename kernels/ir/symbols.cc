#include "kernels/ir/symbols.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace kiln::ir {
namespace {

// Between 2^14 and 2^15, in bands 5000 apart: above the CPU backend's largest size-dependent
// threshold (16384 elements: threads, invariant tables), below the next power of two, so no
// threshold lies between two samples. Odd and even, and of different residues modulo 4, 8
// and 16: a choice that rests on a size's divisibility flips between samples and is refused
// rather than taken for every size.
constexpr int64_t kSamples[kMaxSymbols][kSamplePoints] = {
    {17011, 17508, 18013, 18502},
    {22003, 22506, 23001, 23510},
    {27011, 27502, 28005, 28514},
};

}  // namespace

namespace {
thread_local bool symbolic_sample = false;
thread_local std::vector<int64_t> current_sample;
}  // namespace

ScopedSymbolicSample::ScopedSymbolicSample() : previous_(symbolic_sample) {
  symbolic_sample = true;
}
ScopedSymbolicSample::~ScopedSymbolicSample() {
  symbolic_sample = previous_;
  if (!previous_) current_sample.clear();
}
bool InSymbolicSample() { return symbolic_sample; }

void SetCurrentSample(const std::vector<int64_t>& values) { current_sample = values; }

int64_t StaticFactor(int64_t extent) {
  if (!symbolic_sample || extent == 0) return extent;
  for (int64_t v : current_sample)
    while (v > 1 && extent % v == 0) extent /= v;
  return extent;
}

bool VariesWithSizes(int64_t extent) { return StaticFactor(extent) != extent; }

int64_t SampleValue(int symbol, int point) { return kSamples[symbol][point]; }

void SetSymbolSizes(Graph& graph, const std::vector<int64_t>& values) {
  for (TensorType& t : graph.inputs)
    for (size_t d = 0; d < t.dim_symbols.size(); ++d)
      if (t.dim_symbols[d] >= 0) t.shape[d] = values[t.dim_symbols[d]];
}

std::vector<int64_t> FirstSample(const Graph& graph) {
  std::vector<int64_t> v;
  for (size_t k = 0; k < graph.symbols.size(); ++k)
    v.push_back(SampleValue(static_cast<int>(k), 0));
  return v;
}

std::string NameSymbols(absl::string_view message, const Graph& graph) {
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    const bool starts = std::isdigit(static_cast<unsigned char>(message[i])) &&
                        (i == 0 || !(std::isalnum(static_cast<unsigned char>(message[i - 1])) ||
                                     message[i - 1] == '_'));
    if (!starts) {
      out += message[i++];
      continue;
    }
    size_t j = i;
    while (j < message.size() && std::isdigit(static_cast<unsigned char>(message[j]))) ++j;
    const absl::string_view number = message.substr(i, j - i);
    std::string replaced(number);
    for (size_t k = 0; k < graph.symbols.size() && k < static_cast<size_t>(kMaxSymbols); ++k)
      for (int p = 0; p < kSamplePoints; ++p)
        if (number == absl::StrCat(SampleValue(static_cast<int>(k), p)))
          replaced = absl::StrCat("'", graph.symbols[k], "'");
    out += replaced;
    i = j;
  }
  return out;
}

Limits SymbolicLimits(const Limits& limits) {
  Limits l = limits;
  l.max_elements = int64_t{1} << 62;
  return l;
}

}  // namespace kiln::ir
