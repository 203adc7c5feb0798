// Index arithmetic for lowered kernels: affine combinations of loop variables and of a few
// non-affine atoms (floor division, modulo, clamp) that reshape and concat produce.
//
// Expressions are simplified as they are built, using the loop variables' ranges: a contiguous
// reshape folds back to plain affine indexing, so views cost no divisions in generated code.
// Thread-safety: immutable values once built.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln::lower {

struct Affine;

// A non-constant building block of an affine index.
struct Term {
  enum class Kind { kVar, kDiv, kMod, kClamp };
  Kind kind = Kind::kVar;
  int var = -1;                       // kVar
  std::shared_ptr<const Affine> arg;  // kDiv, kMod, kClamp
  int64_t d = 1;                      // divisor/modulus; kClamp: lower bound
  int64_t hi = 0;                     // kClamp: upper bound
  bool operator<(const Term& o) const;
  bool operator==(const Term& o) const;
};

struct Affine {
  std::map<Term, int64_t> terms;  // term -> coefficient (never 0)
  int64_t constant = 0;

  static Affine Const(int64_t c);
  static Affine Var(int v);
  bool IsConst() const { return terms.empty(); }
  bool operator==(const Affine& o) const { return terms == o.terms && constant == o.constant; }
  bool operator<(const Affine& o) const;
  // Loop variables this expression reads (through atoms too).
  void CollectVars(std::vector<int>* out) const;
  bool Uses(int var) const;
};

// Variable extents: var id -> number of iterations (values 0..extent-1).
using VarExtents = std::vector<int64_t>;

Affine Add(const Affine& a, const Affine& b);
Affine Scale(const Affine& a, int64_t k);
Affine AddConst(const Affine& a, int64_t c);
// REQUIRES: `a` non-negative over the variables' ranges. A divisor d <= 0 (from a zero extent:
// the loop never runs) gives 0.
Affine FloorDiv(const Affine& a, int64_t d, const VarExtents& ext);
Affine Mod(const Affine& a, int64_t d, const VarExtents& ext);
Affine Clamp(const Affine& a, int64_t lo, int64_t hi, const VarExtents& ext);
// Replaces var `v` by `by` everywhere (used to merge loop dimensions).
Affine Substitute(const Affine& a, int v, const Affine& by, const VarExtents& ext);

// Smallest and largest values over the variables' ranges (conservative).
std::pair<int64_t, int64_t> Range(const Affine& a, const VarExtents& ext);

// C expression text; `var_name(v)` names loop variables.
std::string ToC(const Affine& a, const std::vector<std::string>& var_names);

}  // namespace kiln::lower
