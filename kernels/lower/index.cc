#include "kernels/lower/index.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kiln::lower {

bool Term::operator<(const Term& o) const {
  if (kind != o.kind) return kind < o.kind;
  if (var != o.var) return var < o.var;
  if (d != o.d) return d < o.d;
  if (hi != o.hi) return hi < o.hi;
  if (!arg || !o.arg) return static_cast<bool>(o.arg);
  return *arg < *o.arg;
}

bool Term::operator==(const Term& o) const { return !(*this < o) && !(o < *this); }

bool Affine::operator<(const Affine& o) const {
  if (constant != o.constant) return constant < o.constant;
  return terms < o.terms;
}

Affine Affine::Const(int64_t c) {
  Affine a;
  a.constant = c;
  return a;
}

Affine Affine::Var(int v) {
  Affine a;
  Term t;
  t.var = v;
  a.terms[t] = 1;
  return a;
}

void Affine::CollectVars(std::vector<int>* out) const {
  for (const auto& [t, c] : terms) {
    if (t.kind == Term::Kind::kVar)
      out->push_back(t.var);
    else
      t.arg->CollectVars(out);
  }
}

bool Affine::Uses(int var) const {
  std::vector<int> vs;
  CollectVars(&vs);
  return std::find(vs.begin(), vs.end(), var) != vs.end();
}

// Coefficients wrap (two's complement) rather than overflow (undefined behaviour): an index a
// kernel evaluates stays inside its buffer, so only a term no loop reaches with a nonzero value
// (a slice's huge step on an axis of one element, found by fuzzing) can leave int64.
static int64_t WrapMul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
static int64_t WrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

Affine Add(const Affine& a, const Affine& b) {
  Affine r = a;
  r.constant = WrapAdd(r.constant, b.constant);
  for (const auto& [t, c] : b.terms) {
    int64_t& slot = r.terms[t];
    slot = WrapAdd(slot, c);
    if (slot == 0) r.terms.erase(t);
  }
  return r;
}

Affine Scale(const Affine& a, int64_t k) {
  if (k == 0) return Affine::Const(0);
  Affine r;
  r.constant = WrapMul(a.constant, k);
  for (const auto& [t, c] : a.terms) {
    const int64_t v = WrapMul(c, k);
    if (v != 0) r.terms[t] = v;
  }
  return r;
}

Affine AddConst(const Affine& a, int64_t c) {
  Affine r = a;
  r.constant = WrapAdd(r.constant, c);
  return r;
}

namespace {

std::pair<int64_t, int64_t> TermRange(const Term& t, const VarExtents& ext) {
  switch (t.kind) {
    case Term::Kind::kVar:
      return {0, std::max<int64_t>(ext[t.var] - 1, 0)};
    case Term::Kind::kDiv: {
      auto [lo, hi] = Range(*t.arg, ext);
      auto fdiv = [&](int64_t x) { return x >= 0 ? x / t.d : -((-x + t.d - 1) / t.d); };
      return {fdiv(lo), fdiv(hi)};
    }
    case Term::Kind::kMod:
      return {0, t.d - 1};
    case Term::Kind::kClamp:
      return {t.d, t.hi};
  }
  return {0, 0};
}

int64_t FloorDivInt(int64_t x, int64_t d) { return x >= 0 ? x / d : -((-x + d - 1) / d); }

Affine Atom(Term::Kind kind, const Affine& a, int64_t d, int64_t hi = 0) {
  Term t;
  t.kind = kind;
  t.arg = std::make_shared<Affine>(a);
  t.d = d;
  t.hi = hi;
  Affine r;
  r.terms[t] = 1;
  return r;
}

// Splits a into (multiple-of-d part / d, remainder part) with the remainder's constant in [0, d).
void SplitBy(const Affine& a, int64_t d, Affine* quot, Affine* rem) {
  *quot = Affine::Const(FloorDivInt(a.constant, d));
  *rem = Affine::Const(a.constant - quot->constant * d);
  for (const auto& [t, c] : a.terms) {
    if (c % d == 0)
      quot->terms[t] = c / d;
    else
      rem->terms[t] = c;
  }
}

}  // namespace

std::pair<int64_t, int64_t> Range(const Affine& a, const VarExtents& ext) {
  int64_t lo = a.constant, hi = a.constant;
  for (const auto& [t, c] : a.terms) {
    auto [tl, th] = TermRange(t, ext);
    if (c >= 0) {
      lo += c * tl;
      hi += c * th;
    } else {
      lo += c * th;
      hi += c * tl;
    }
  }
  return {lo, hi};
}

Affine FloorDiv(const Affine& a, int64_t d, const VarExtents& ext) {
  if (d == 1) return a;
  // A divisor of 0 comes from an extent of 0: the index belongs to a loop that never runs.
  if (d <= 0) return Affine::Const(0);
  Affine q, r;
  SplitBy(a, d, &q, &r);
  auto [lo, hi] = Range(r, ext);
  if (lo >= 0 && hi < d) return q;  // the remainder never carries into the quotient
  // C's division truncates: the atom is a floor only for a non-negative argument. `a` is one
  // (REQUIRES); the remainder part is not when a term left in it has a negative coefficient
  // (a reversed view of a flattened tensor), so then `a` is divided whole.
  if (lo < 0) return Atom(Term::Kind::kDiv, a, d);
  if (q.IsConst() && q.constant == 0) return Atom(Term::Kind::kDiv, r, d);
  return Add(q, Atom(Term::Kind::kDiv, r, d));
}

Affine Mod(const Affine& a, int64_t d, const VarExtents& ext) {
  if (d == 1 || d <= 0) return Affine::Const(0);  // d <= 0: see FloorDiv
  auto [lo, hi] = Range(a, ext);
  if (lo >= 0 && hi < d) return a;
  Affine q, r;
  SplitBy(a, d, &q, &r);  // q*d vanishes modulo d
  auto [rlo, rhi] = Range(r, ext);
  if (rlo >= 0 && rhi < d) return r;
  // As in FloorDiv: C's % of a negative argument is not the modulo; `a` is non-negative.
  if (rlo < 0) return Atom(Term::Kind::kMod, a, d);
  return Atom(Term::Kind::kMod, r, d);
}

Affine Clamp(const Affine& a, int64_t lo, int64_t hi, const VarExtents& ext) {
  auto [alo, ahi] = Range(a, ext);
  if (alo >= lo && ahi <= hi) return a;
  if (ahi <= lo) return Affine::Const(lo);
  if (alo >= hi) return Affine::Const(hi);
  return Atom(Term::Kind::kClamp, a, lo, hi);
}

Affine Substitute(const Affine& a, int v, const Affine& by, const VarExtents& ext) {
  Affine r = Affine::Const(a.constant);
  for (const auto& [t, c] : a.terms) {
    Affine piece;
    switch (t.kind) {
      case Term::Kind::kVar:
        piece = t.var == v ? by : Affine::Var(t.var);
        break;
      case Term::Kind::kDiv:
        piece = FloorDiv(Substitute(*t.arg, v, by, ext), t.d, ext);
        break;
      case Term::Kind::kMod:
        piece = Mod(Substitute(*t.arg, v, by, ext), t.d, ext);
        break;
      case Term::Kind::kClamp:
        piece = Clamp(Substitute(*t.arg, v, by, ext), t.d, t.hi, ext);
        break;
    }
    r = Add(r, Scale(piece, c));
  }
  return r;
}

std::string ToC(const Affine& a, const std::vector<std::string>& names) {
  std::string s;
  for (const auto& [t, c] : a.terms) {
    std::string atom;
    switch (t.kind) {
      case Term::Kind::kVar:
        atom = names[t.var];
        break;
      case Term::Kind::kDiv:
        atom = absl::StrCat("((", ToC(*t.arg, names), ") / ", t.d, ")");
        break;
      case Term::Kind::kMod:
        atom = absl::StrCat("((", ToC(*t.arg, names), ") % ", t.d, ")");
        break;
      case Term::Kind::kClamp:
        atom = absl::StrCat("kiln_clampi(", ToC(*t.arg, names), ", ", t.d, ", ", t.hi, ")");
        break;
    }
    if (!s.empty())
      s += c < 0 ? " - " : " + ";
    else if (c < 0)
      s += "-";
    int64_t m = c < 0 ? -c : c;
    s += m == 1 ? atom : absl::StrCat(m, " * ", atom);
  }
  if (s.empty()) return absl::StrCat(a.constant);
  if (a.constant > 0) absl::StrAppend(&s, " + ", a.constant);
  if (a.constant < 0) absl::StrAppend(&s, " - ", -a.constant);
  return s;
}

}  // namespace kiln::lower
