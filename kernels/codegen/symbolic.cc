#include "kernels/codegen/symbolic.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/ir/symbols.h"

namespace kiln::codegen {
namespace {

using i128 = __int128;
// exponents (one per symbol) -> coefficient
using Poly = std::map<std::vector<int>, i128>;

constexpr char kHole = '\x02';  // where a literal was, in a text's skeleton

size_t Pow3(int r) {
  size_t n = 1;
  for (int k = 0; k < r; ++k) n *= 3;
  return n;
}

// Exact quotient, or false when `den` does not divide `num`.
bool ExactDiv(i128 num, i128 den, i128* q) {
  if (den == 0 || num % den != 0) return false;
  *q = num / den;
  return true;
}

// The polynomial through `values` on the grid of the first `r` symbols (symbol 0 fastest),
// of degree <= 2 in each; false when the values are no integer polynomial.
bool Interpolate(int r, const std::vector<i128>& values, Poly* out) {
  if (r == 0) {
    if (values[0] != 0) (*out)[{}] += values[0];
    return true;
  }
  const int k = r - 1;
  const i128 x0 = ir::SampleValue(k, 0), x1 = ir::SampleValue(k, 1), x2 = ir::SampleValue(k, 2);
  const size_t inner = Pow3(r - 1);
  std::vector<i128> c[3];
  for (auto& v : c) v.resize(inner);
  for (size_t i = 0; i < inner; ++i) {
    const i128 f0 = values[i], f1 = values[i + inner], f2 = values[i + 2 * inner];
    i128 d01, d12, dd;
    if (!ExactDiv(f1 - f0, x1 - x0, &d01) || !ExactDiv(f2 - f1, x2 - x1, &d12) ||
        !ExactDiv(d12 - d01, x2 - x0, &dd))
      return false;
    // Newton form f0 + d01 (x - x0) + dd (x - x0)(x - x1), expanded.
    c[2][i] = dd;
    c[1][i] = d01 - dd * (x0 + x1);
    c[0][i] = f0 - d01 * x0 + dd * x0 * x1;
  }
  for (int j = 0; j < 3; ++j) {
    Poly pj;
    if (!Interpolate(r - 1, c[j], &pj)) return false;
    for (auto& [exps, coeff] : pj) {
      std::vector<int> e = exps;
      e.push_back(j);
      if (coeff != 0) (*out)[e] += coeff;
    }
  }
  return true;
}

i128 Evaluate(const Poly& p, const std::vector<int64_t>& sizes) {
  i128 sum = 0;
  for (const auto& [exps, coeff] : p) {
    i128 t = coeff;
    for (size_t k = 0; k < exps.size(); ++k)
      for (int j = 0; j < exps[k]; ++j) t *= sizes[k];
    sum += t;
  }
  return sum;
}

bool FitsInt64(const Poly& p) {
  for (const auto& [exps, coeff] : p)
    if (coeff > INT64_MAX || coeff < INT64_MIN) return false;
  return true;
}

// C text of `p` over the size variables: "kiln_s0", "(768LL*kiln_s0 + 4LL)"; anything but a
// lone variable or number is parenthesised, since it replaces one literal token (`i / 6144`).
// `suffix` types the numbers: "LL" where sizes are 64-bit (CPU), "" where they are `int`
// (CUDA, whose indices are 32-bit: LaunchPlan.index_bound).
std::string PolyToC(const Poly& p, const char* suffix) {
  if (p.empty()) return absl::StrCat("0", suffix);
  std::vector<std::string> terms;
  int factors_in_all = 0;
  for (auto it = p.rbegin(); it != p.rend(); ++it) {
    std::vector<std::string> factors;
    if (it->second != 1) factors.push_back(absl::StrCat(static_cast<int64_t>(it->second), suffix));
    for (size_t k = 0; k < it->first.size(); ++k)
      for (int j = 0; j < it->first[k]; ++j) factors.push_back(absl::StrCat("kiln_s", k));
    factors_in_all += static_cast<int>(factors.size());
    terms.push_back(factors.empty() ? absl::StrCat("1", suffix) : absl::StrJoin(factors, "*"));
  }
  if (terms.size() == 1 && factors_in_all <= 1) return terms[0];
  return absl::StrCat("(", absl::StrJoin(terms, " + "), ")");
}

SizeExpr PolyToSizeExpr(const Poly& p, int r) {
  SizeExpr e;
  for (const auto& [exps, coeff] : p) {
    SizeTerm t;
    t.coeff = static_cast<int64_t>(coeff);
    t.exponents.assign(exps.begin(), exps.end());
    t.exponents.resize(r, 0);
    e.terms.push_back(std::move(t));
  }
  return e;
}

// Fits `values` (grid, then the check point last) to a polynomial that reproduces all of them.
bool Fit(int r, const std::vector<i128>& values, const std::vector<std::vector<int64_t>>& points,
         Poly* out) {
  const size_t grid = Pow3(r);
  std::vector<i128> g(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(grid));
  Poly p;
  if (!Interpolate(r, g, &p)) return false;
  for (size_t i = 0; i < values.size(); ++i)
    if (Evaluate(p, points[i]) != values[i]) return false;
  if (!FitsInt64(p)) return false;
  *out = std::move(p);
  return true;
}

struct Literal {
  std::string text;
  size_t hole = 0;  // its position in the skeleton
};

// Splits C text into a skeleton (literals replaced by kHole) and its numeric literals.
void Scan(const std::string& s, std::string* skeleton, std::vector<Literal>* literals) {
  auto digit = [&](size_t j) {
    return j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]));
  };
  size_t i = 0;
  while (i < s.size()) {
    const bool starts =
        digit(i) && (i == 0 || !(std::isalnum(static_cast<unsigned char>(s[i - 1])) ||
                                 s[i - 1] == '_' || s[i - 1] == '.'));
    if (!starts) {
      skeleton->push_back(s[i++]);
      continue;
    }
    size_t j = i;
    while (digit(j)) ++j;
    if (j < s.size() && s[j] == '.') {
      ++j;
      while (digit(j)) ++j;
    }
    if (j < s.size() && (s[j] == 'e' || s[j] == 'E') &&
        (digit(j + 1) ||
         (j + 2 < s.size() && (s[j + 1] == '+' || s[j + 1] == '-') && digit(j + 2)))) {
      j += 2;
      while (digit(j)) ++j;
    }
    while (j < s.size() && std::strchr("fFlLuU", s[j]) != nullptr && s[j] != '\0') ++j;
    literals->push_back({s.substr(i, j - i), skeleton->size()});
    skeleton->push_back(kHole);
    i = j;
  }
}

bool IsFloatLiteral(const std::string& t) { return t.find_first_of(".eEfF") != std::string::npos; }

// The C text replacing literal position `pos`, whose texts differ between samples.
absl::StatusOr<std::string> GeneraliseLiteral(const std::vector<std::string>& texts,
                                              const std::vector<std::vector<int64_t>>& points,
                                              int r, const char* suffix) {
  const bool is_float = IsFloatLiteral(texts[0]);
  std::vector<i128> ints;
  Poly p;
  if (!is_float) {
    for (const std::string& t : texts) {
      errno = 0;
      long long v = std::strtoll(t.c_str(), nullptr, 10);
      if (errno != 0) return absl::InvalidArgumentError("an integer beyond 64 bits");
      ints.push_back(v);
    }
    if (!Fit(r, ints, points, &p))
      return absl::InvalidArgumentError("an integer that is no polynomial of the sizes");
    return PolyToC(p, suffix);
  }
  const bool single = texts[0].find_first_of("fF") != std::string::npos;
  const char* cast = single ? "(float)" : "(double)";
  std::vector<double> vals;
  for (const std::string& t : texts) vals.push_back(std::strtod(t.c_str(), nullptr));
  // A count, as a float.
  bool integral = true;
  for (double v : vals) integral &= std::isfinite(v) && std::fabs(v) < 0x1p53 && v == std::floor(v);
  if (integral) {
    for (double v : vals) ints.push_back(static_cast<int64_t>(v));
    if (Fit(r, ints, points, &p)) return absl::StrCat("(", cast, PolyToC(p, suffix), ")");
  }
  // The reciprocal of a count (a mean's 1/N).
  ints.clear();
  bool reciprocal = true;
  for (double v : vals) {
    if (!(v > 0) || !std::isfinite(v) || 1.0 / v >= 0x1p53) {
      reciprocal = false;
      break;
    }
    const int64_t n = std::llround(1.0 / v);
    if (n <= 0 || 1.0 / static_cast<double>(n) != v) {
      reciprocal = false;
      break;
    }
    ints.push_back(n);
  }
  if (reciprocal && Fit(r, ints, points, &p))
    return absl::StrCat("(", cast, "(1.0 / (double)", PolyToC(p, suffix), "))");
  return absl::InvalidArgumentError(
      "a floating-point constant that is neither a count nor one over a count");
}

// The skeleton's text around `at` on one line, literals shown as '#': for messages.
std::string Near(const std::string& skeleton, size_t at) {
  const size_t from = at > 60 ? at - 60 : 0;
  std::string near = skeleton.substr(from, 120);
  std::replace(near.begin(), near.end(), '\n', ' ');
  std::replace(near.begin(), near.end(), kHole, '#');
  return near;
}

// Whether the hole at `pos` of `skeleton` is the length of a declared array ("float t3[").
bool IsArrayLength(const std::string& skeleton, size_t pos) {
  size_t line = skeleton.rfind('\n', pos);
  line = line == std::string::npos ? 0 : line + 1;
  static const std::regex kDecl(
      R"(^\s*(static\s+)?(const\s+)?[A-Za-z_][A-Za-z_0-9:]*\s+[A-Za-z_][A-Za-z_0-9]*\[$)");
  return std::regex_match(skeleton.substr(line, pos - line), kDecl);
}

// The sample points as "(2, 3), (5, 7), ..." (the first three): for messages.
std::string SampleList(const std::vector<std::vector<int64_t>>& points) {
  std::vector<std::string> shown;
  for (size_t i = 0; i < points.size() && i < 3; ++i)
    shown.push_back(absl::StrCat("(", absl::StrJoin(points[i], ", "), ")"));
  return absl::StrCat(absl::StrJoin(shown, ", "), points.size() > 3 ? ", ..." : "");
}

absl::StatusOr<SizeExpr> GeneraliseNumber(const std::vector<int64_t>& values,
                                          const std::vector<std::vector<int64_t>>& points, int r) {
  Poly p;
  std::vector<i128> v(values.begin(), values.end());
  if (!Fit(r, v, points, &p))
    return absl::InvalidArgumentError("a buffer size that is no polynomial of the sizes");
  return PolyToSizeExpr(p, r);
}

}  // namespace

std::vector<std::vector<int64_t>> SymbolicSamplePoints(int num_symbols) {
  std::vector<std::vector<int64_t>> points;
  for (size_t g = 0; g < Pow3(num_symbols); ++g) {
    std::vector<int64_t> p;
    size_t rest = g;
    for (int k = 0; k < num_symbols; ++k, rest /= 3)
      p.push_back(ir::SampleValue(k, static_cast<int>(rest % 3)));
    points.push_back(std::move(p));
  }
  std::vector<int64_t> check;
  for (int k = 0; k < num_symbols; ++k) check.push_back(ir::SampleValue(k, 3));
  points.push_back(std::move(check));
  return points;
}

absl::StatusOr<SymbolicUnit> Generalise(const std::vector<SymbolicSample>& samples,
                                        const std::vector<std::string>& symbol_names, bool cuda) {
  const char* suffix = cuda ? "" : "LL";
  const int r = static_cast<int>(symbol_names.size());
  const std::vector<std::vector<int64_t>> points = SymbolicSamplePoints(r);
  if (samples.size() != points.size())
    return absl::InternalError("symbolic generation: wrong number of samples");
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot compile one kernel for every value of the symbolic sizes (",
                     absl::StrJoin(symbol_names, ", "), "): ", why,
                     " (rule: generated code must depend on the sizes only through extents, "
                     "strides and counts)"));
  };

  // The text: one skeleton, literals generalised position by position.
  std::vector<std::string> skeletons(samples.size());
  std::vector<std::vector<Literal>> literals(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) Scan(samples[i].source, &skeletons[i], &literals[i]);
  for (size_t i = 1; i < samples.size(); ++i)
    if (skeletons[i] != skeletons[0] || literals[i].size() != literals[0].size()) {
      size_t at = 0;  // where the two texts part: shown, since it says which choice flipped
      while (at < skeletons[0].size() && at < skeletons[i].size() &&
             skeletons[0][at] == skeletons[i][at])
        ++at;
      return refuse(absl::StrCat("the kernels' structure changes with the sizes, near `",
                                 Near(skeletons[0], at), "`"));
    }
  std::vector<std::string> replacement(literals[0].size());
  for (size_t pos = 0; pos < literals[0].size(); ++pos) {
    std::vector<std::string> texts;
    bool same = true;
    for (size_t i = 0; i < samples.size(); ++i) {
      texts.push_back(literals[i][pos].text);
      same &= texts.back() == texts[0];
    }
    if (same) {
      replacement[pos] = texts[0];
      continue;
    }
    if (IsArrayLength(skeletons[0], literals[0][pos].hole))
      return refuse("a stack array's length depends on them");
    auto g = GeneraliseLiteral(texts, points, r, suffix);
    if (!g.ok())
      return refuse(absl::StrCat(g.status().message(), " (", texts[0], ", ", texts[1],
                                 ", ... at the samples) in `",
                                 Near(skeletons[0], literals[0][pos].hole), "`"));
    replacement[pos] = *std::move(g);
  }
  SymbolicUnit unit;
  size_t next = 0;
  for (char c : skeletons[0]) {
    if (c == kHole)
      unit.source += replacement[next++];
    else
      unit.source.push_back(c);
  }

  // The plan: buffers' shapes and sizes as polynomials; steps as sampled (the same for all).
  unit.plan = samples[0].plan;
  // Names a buffer and its sampled values in a refusal: which one, and what it did.
  auto buffer_refusal = [&](const PlanBuffer& pb, const std::string& what,
                            const std::vector<int64_t>& values, const absl::Status& s) {
    const char* role = pb.role == BufferRole::kInput    ? "input"
                       : pb.role == BufferRole::kOutput ? "output"
                                                        : "temporary";
    return refuse(absl::StrCat(s.message(), ": ", what, " of ", role, " ", pb.index, " is ",
                               absl::StrJoin(values, ", "), " at the samples ",
                               SampleList(points)));
  };
  unit.plan.workspace_bytes = 0;  // the artifact reports it (kiln_workspace_bytes)
  for (size_t b = 0; b < unit.plan.buffers.size(); ++b) {
    PlanBuffer& pb = unit.plan.buffers[b];
    for (size_t d = 0; d < pb.shape.size(); ++d) {
      std::vector<int64_t> values;
      for (const SymbolicSample& s : samples) values.push_back(s.plan.buffers[b].shape[d]);
      auto e = GeneraliseNumber(values, points, r);
      if (!e.ok()) return buffer_refusal(pb, absl::StrCat("dimension ", d), values, e.status());
      pb.shape_exprs.push_back(*std::move(e));
      if (std::any_of(values.begin(), values.end(), [&](int64_t v) { return v != values[0]; }))
        pb.shape[d] = -1;
    }
    std::vector<int64_t> bytes;
    for (const SymbolicSample& s : samples) bytes.push_back(s.plan.buffers[b].bytes);
    auto e = GeneraliseNumber(bytes, points, r);
    if (!e.ok()) return buffer_refusal(pb, "the byte size", bytes, e.status());
    pb.bytes_expr = *std::move(e);
    if (std::any_of(bytes.begin(), bytes.end(), [&](int64_t v) { return v != bytes[0]; }))
      pb.bytes = -1;
    pb.offset = pb.role == BufferRole::kTemp
                    ? -1
                    : 0;  // the artifact (CPU) or launcher (CUDA) lays temps out
  }
  if (!cuda) return unit;
  // CUDA: each launch's grid as ceil(work / per_block), its guard (a launch-time choice), and
  // the bound on indices. The blocks and guard ranges must be the same in every sample.
  for (size_t k = 0; k < unit.plan.steps.size(); ++k) {
    PlanStep& st = unit.plan.steps[k];
    std::vector<int64_t> works, guards;
    for (const SymbolicSample& s : samples) {
      const PlanStep& at = s.plan.steps[k];
      if (at.grid_per_block != st.grid_per_block || at.kernel != st.kernel ||
          at.guard_min != st.guard_min || at.guard_max != st.guard_max)
        return refuse(
            absl::StrCat("launch ", st.kernel, " changes its blocks or guard with the sizes"));
      works.push_back(at.grid_work);
      guards.push_back(at.guard);
    }
    auto e = GeneraliseNumber(works, points, r);
    auto g =
        st.guarded() ? GeneraliseNumber(guards, points, r) : absl::StatusOr<SizeExpr>(SizeExpr{});
    for (const auto* fit : {&e, &g})
      if (!fit->ok())
        return refuse(absl::StrCat("launch ", st.kernel, ": ", fit->status().message()));
    st.grid_work_expr = *std::move(e);
    st.guard_expr = *std::move(g);
    st.grid[0] = 0;  // evaluated at launch
    st.guard = 0;
  }
  std::vector<int64_t> bounds;
  for (const SymbolicSample& s : samples) bounds.push_back(s.plan.index_bound);
  auto e = GeneraliseNumber(bounds, points, r);
  if (!e.ok())
    return refuse(absl::StrCat("the bound on the kernels' indices is ", absl::StrJoin(bounds, ", "),
                               " at the samples ", SampleList(points)));
  unit.plan.index_bound_expr = *std::move(e);
  unit.plan.index_bound = 0;
  return unit;
}

int64_t EvaluateSizeExpr(const SizeExpr& e, const std::vector<int64_t>& sizes) {
  int64_t sum = 0;
  for (const SizeTerm& t : e.terms) {
    int64_t v = t.coeff;
    for (size_t k = 0; k < t.exponents.size() && k < sizes.size(); ++k)
      for (int j = 0; j < t.exponents[k]; ++j) v *= sizes[k];
    sum += v;
  }
  return sum;
}

std::string SizeExprToString(const SizeExpr& e, const std::vector<std::string>& symbol_names) {
  if (e.terms.empty()) return "0";
  std::vector<std::string> terms;
  for (auto it = e.terms.rbegin(); it != e.terms.rend(); ++it) {
    std::vector<std::string> factors;
    if (it->coeff != 1) factors.push_back(absl::StrCat(it->coeff));
    for (size_t k = 0; k < it->exponents.size(); ++k)
      for (int j = 0; j < it->exponents[k]; ++j)
        factors.push_back(k < symbol_names.size() ? symbol_names[k] : absl::StrCat("s", k));
    terms.push_back(factors.empty() ? "1" : absl::StrJoin(factors, "*"));
  }
  return absl::StrJoin(terms, " + ");
}

}  // namespace kiln::codegen
