// FactorReductions: a sum over axes R of a product whose factors split into groups that read
// disjoint subsets of R becomes the product of one smaller sum per group:
//
//   sum_{i,j} a[i] * b[j]           ->  sum_i a[i] * sum_j b[j]        (n*m terms -> n + m)
//   sum_{i,j} c * a[i] * b[j] / d   ->  c * sum_i a[i] * sum_j b[j] / d (c, d read no axis of R)
//   sum_R (t1 + t2 - t3)            ->  sum_R t1 + sum_R t2 - sum_R t3 when a term factors
//
// A term that reads no axis of a reduced dimension is counted, not summed: sum_j a[i] over
// m values of j is m * a[i]. `mean` is a sum times 1/n after Decompose, so it factors too.
//
// Legality. The rewrite holds exactly in real arithmetic; in floating point it reassociates:
// the factored form rounds each group's sum and then one product per group, where the
// original rounds n*m products and n*m - 1 additions. For finite values both errors are
// bounded by (n*m + n + m) * eps * sum|a[i]*b[j]| (= eps times sum|a| * sum|b|); the factored
// form's own bound, (n + m + 1) * eps * sum|a| * sum|b|, is never larger than the original's,
// so the results differ by no more than any two summation orders of the original do (NumPy's
// pairwise order and the kernels' sequential one already differ that much). Non-finite
// values can differ: inf * 0 inside the original sum gives NaN, the factored form gives inf
// when the other group's sum is not zero.
//
// It applies to f32 and f64 sums only, where every factor and term is computed in the sum's
// dtype (a factor of another dtype is cast first, as `mul` itself would); nested `mul`/`div`
// nodes of another dtype (integer products that wrap) stay whole. f16/bf16 sums are left
// alone: rounding each group's sum to 11 or 8 bits would exceed their tolerance. It only
// fires when at least two groups read reduced axes, where it saves work; it is switched off
// with CompileOptions.algebraic_rewrites (which enters the cache key).
#include <algorithm>
#include <functional>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "kernels/ir/op_registry.h"
#include "kernels/passes/passes.h"
#include "kernels/passes/rewrite.h"
#include "kernels/util/status_macros.h"

namespace kiln::passes {
namespace {

using ir::DType;
using ir::ValueId;

struct Factor {
  ValueId v;
  bool inverse = false;  // divides instead of multiplying
};

struct Term {
  std::vector<Factor> factors;
  bool negate = false;
};

class Factorer {
 public:
  Factorer(ir::Builder& b, DType t, const ir::Shape& p, std::vector<bool> reduced)
      : b_(b), t_(t), p_(p), reduced_(std::move(reduced)) {}

  // Splits `v` (of the product's dtype) into the terms of its add/sub chain.
  void Terms(ValueId v, bool negate, std::vector<Term>* out) const {
    const ir::Graph& g = b_.graph();
    if (!g.IsInput(v) && b_.Type(v).dtype == t_) {
      const ir::Node& n = g.NodeOf(v);
      if (n.op == "add" || n.op == "sub") {
        Terms(n.inputs[0], negate, out);
        Terms(n.inputs[1], n.op == "sub" ? !negate : negate, out);
        return;
      }
    }
    Term term;
    term.negate = negate;
    Factors(v, false, &term);
    out->push_back(std::move(term));
  }

  // Groups of factors reading overlapping reduced axes (union-find on shared axes); factors
  // reading no reduced axis go to `free`.
  std::vector<std::vector<Factor>> Groups(const Term& term, std::vector<Factor>* free) const {
    std::vector<std::vector<bool>> reads;
    std::vector<Factor> bound;
    for (const Factor& f : term.factors) {
      std::vector<bool> r = ReducedReads(f.v);
      if (std::find(r.begin(), r.end(), true) == r.end()) {
        free->push_back(f);
      } else {
        bound.push_back(f);
        reads.push_back(std::move(r));
      }
    }
    std::vector<int> parent(bound.size());
    std::iota(parent.begin(), parent.end(), 0);
    std::function<int(int)> root = [&](int x) {
      return parent[x] == x ? x : parent[x] = root(parent[x]);
    };
    for (size_t a = 0; a < bound.size(); ++a)
      for (size_t c = a + 1; c < bound.size(); ++c)
        for (size_t ax = 0; ax < p_.size(); ++ax)
          if (reads[a][ax] && reads[c][ax])
            parent[root(static_cast<int>(c))] = root(static_cast<int>(a));
    std::vector<std::vector<Factor>> groups;
    std::vector<int> slot(bound.size(), -1);
    for (size_t a = 0; a < bound.size(); ++a) {
      int r = root(static_cast<int>(a));
      if (slot[r] < 0) {
        slot[r] = static_cast<int>(groups.size());
        groups.emplace_back();
      }
      groups[slot[r]].push_back(bound[a]);
    }
    return groups;
  }

  // sum over R of the term, keeping every axis (reduced axes become 1).
  absl::StatusOr<ValueId> SumTerm(const Term& term) {
    std::vector<Factor> free;
    std::vector<std::vector<Factor>> groups = Groups(term, &free);
    std::vector<Factor> outer = free;
    std::vector<bool> covered(p_.size(), false);
    for (const std::vector<Factor>& group : groups) {
      KILN_ASSIGN_OR_RETURN(ValueId prod, Product(group));
      std::vector<bool> r = ReducedReads(prod);
      ir::IntList axes;
      for (size_t ax = 0; ax < p_.size(); ++ax)
        if (r[ax]) {
          axes.push_back(static_cast<int64_t>(ax));
          covered[ax] = true;
        }
      KILN_ASSIGN_OR_RETURN(ValueId s, b_.Add("sum", {prod}, {{"axes", axes}, {"keepdim", true}}));
      outer.push_back({s, false});
    }
    // Reduced axes no factor reads: each element is counted that many times.
    double count = 1;
    for (size_t ax = 0; ax < p_.size(); ++ax)
      if (reduced_[ax] && !covered[ax]) count *= static_cast<double>(p_[ax]);
    if (count != 1 || outer.empty()) {
      KILN_ASSIGN_OR_RETURN(ValueId c, b_.Scalar(t_, count));
      outer.push_back({c, false});
    }
    KILN_ASSIGN_OR_RETURN(ValueId v, Product(outer));
    // Reduced axes of extent 1 that no factor spans: the keepdim shape has them as 1 already.
    return v;
  }

  int NumGroups(const Term& term) const {
    std::vector<Factor> free;
    return static_cast<int>(Groups(term, &free).size());
  }

 private:
  void Factors(ValueId v, bool inverse, Term* term) const {
    const ir::Graph& g = b_.graph();
    if (!g.IsInput(v) && b_.Type(v).dtype == t_) {
      const ir::Node& n = g.NodeOf(v);
      if (n.op == "mul" || n.op == "div") {
        Factors(n.inputs[0], inverse, term);
        Factors(n.inputs[1], n.op == "div" ? !inverse : inverse, term);
        return;
      }
      if (n.op == "neg") {
        term->negate = !term->negate;
        Factors(n.inputs[0], inverse, term);
        return;
      }
    }
    term->factors.push_back({v, inverse});
  }

  // Which reduced axes of the product `v` spans (its shape aligned to the right of P's).
  std::vector<bool> ReducedReads(ValueId v) const {
    const ir::Shape& s = b_.Type(v).shape;
    std::vector<bool> r(p_.size(), false);
    size_t off = p_.size() - s.size();
    for (size_t k = 0; k < s.size(); ++k) r[off + k] = reduced_[off + k] && s[k] != 1;
    return r;
  }

  // `v` in the product's dtype, and of P's rank (leading 1s) unless a scalar, so that a
  // group's sum names its axes in P's numbering.
  absl::StatusOr<ValueId> Aligned(ValueId v) {
    if (b_.Type(v).dtype != t_) {
      KILN_ASSIGN_OR_RETURN(v, b_.Add("cast", {v}, {{"dtype", t_}}));
    }
    const ir::Shape& s = b_.Type(v).shape;
    if (s.size() == p_.size() || s.empty()) return v;  // scalars broadcast as they are
    ir::IntList shape(p_.size() - s.size(), 1);
    shape.insert(shape.end(), s.begin(), s.end());
    return b_.Add("reshape", {v}, {{"shape", shape}});
  }

  // The product of the multiplying factors divided by the dividing ones.
  absl::StatusOr<ValueId> Product(const std::vector<Factor>& factors) {
    std::optional<ValueId> num, den;
    for (const Factor& f : factors) {
      KILN_ASSIGN_OR_RETURN(ValueId v, Aligned(f.v));
      std::optional<ValueId>& acc = f.inverse ? den : num;
      if (acc) {
        KILN_ASSIGN_OR_RETURN(v, b_.Add("mul", {*acc, v}));
      }
      acc = v;
    }
    if (!num) {
      KILN_ASSIGN_OR_RETURN(num, b_.Scalar(t_, 1));
      KILN_ASSIGN_OR_RETURN(num, Aligned(*num));
    }
    if (!den) return *num;
    return b_.Add("div", {*num, *den});
  }

  ir::Builder& b_;
  const DType t_;
  const ir::Shape p_;
  const std::vector<bool> reduced_;
};

absl::StatusOr<std::optional<ValueId>> FactorSum(ir::Builder& b, const ir::Node& n, ValueId x) {
  const DType t = n.type.dtype;
  if (t != DType::kF32 && t != DType::kF64) return std::nullopt;
  if (b.Type(x).dtype != t) return std::nullopt;
  const ir::Shape p = b.Type(x).shape;
  std::vector<bool> reduced(p.size(), n.Ints("axes").empty());
  for (int64_t a : n.Ints("axes")) reduced[a < 0 ? a + static_cast<int64_t>(p.size()) : a] = true;

  Factorer f(b, t, p, reduced);
  std::vector<Term> terms;
  f.Terms(x, false, &terms);
  bool gains = false;
  for (const Term& term : terms) gains |= f.NumGroups(term) >= 2;
  if (!gains) return std::nullopt;

  std::optional<ValueId> total;
  for (const Term& term : terms) {
    KILN_ASSIGN_OR_RETURN(ValueId s, f.SumTerm(term));
    if (!total) {
      total = s;
      if (term.negate) {
        KILN_ASSIGN_OR_RETURN(total, b.Add("neg", {s}));
      }
    } else {
      KILN_ASSIGN_OR_RETURN(total, b.Add(term.negate ? "sub" : "add", {*total, s}));
    }
  }
  // Broadcasting the terms together gives P with the reduced axes at 1; the sum's own shape
  // drops them unless it keeps them.
  if (b.Type(*total).shape == n.type.shape) return total;
  return b.Add("reshape", {*total}, {{"shape", ir::IntList(n.type.shape)}});
}

}  // namespace

absl::StatusOr<ir::Graph> FactorReductions(const ir::Graph& graph) {
  return Rewrite(graph,
                 [](ir::Builder& b, const ir::Node& n,
                    const std::vector<ValueId>& in) -> absl::StatusOr<std::optional<ValueId>> {
                   if (n.op != "sum") return std::nullopt;
                   return FactorSum(b, n, in[0]);
                 });
}

}  // namespace kiln::passes
