#include "kernels/codegen/expr_rewrite.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/ir/symbols.h"
#include "kernels/lower/lower.h"

namespace kiln::codegen {

using lower::Affine;
using lower::Expr;
using lower::ExprPtr;
using lower::Term;

std::string AffineKey(const Affine& a) {
  std::string s = absl::StrCat(a.constant);
  for (const auto& [t, c] : a.terms) {
    absl::StrAppend(&s, "+", c, "*");
    switch (t.kind) {
      case Term::Kind::kVar:
        absl::StrAppend(&s, "v", t.var);
        break;
      case Term::Kind::kDiv:
        absl::StrAppend(&s, "div(", AffineKey(*t.arg), ",", t.d, ")");
        break;
      case Term::Kind::kMod:
        absl::StrAppend(&s, "mod(", AffineKey(*t.arg), ",", t.d, ")");
        break;
      case Term::Kind::kClamp:
        absl::StrAppend(&s, "clamp(", AffineKey(*t.arg), ",", t.d, ",", t.hi, ")");
        break;
    }
  }
  return s;
}

std::vector<int> VarsOf(const Affine& a) {
  std::vector<int> v;
  a.CollectVars(&v);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

bool UsesVarInAtom(const Affine& a, int var) {
  for (const auto& [t, c] : a.terms)
    if (t.kind != Term::Kind::kVar && t.arg->Uses(var)) return true;
  return false;
}

int64_t Coefficient(const Affine& a, int var) {
  Term t;
  t.var = var;
  auto it = a.terms.find(t);
  return it == a.terms.end() ? 0 : it->second;
}

ExprPtr ExprPool::Intern(Expr e) {
  uint64_t fbits;
  std::memcpy(&fbits, &e.fvalue, sizeof fbits);
  std::string key = absl::StrCat(static_cast<int>(e.kind), "|", static_cast<int>(e.dtype), "|",
                                 e.op, "|", e.buffer, "|", e.ivalue, "|", fbits, "|", e.lo, "|",
                                 e.hi, "|", e.has_lo, e.has_hi, "|");
  for (int r : e.rvars) absl::StrAppend(&key, "r", r, ",");
  for (const ExprPtr& a : e.args)
    absl::StrAppend(&key, "a", reinterpret_cast<uintptr_t>(a.get()), ",");
  for (const Affine& a : e.index) absl::StrAppend(&key, "[", AffineKey(a), "]");
  auto it = nodes_.find(key);
  if (it != nodes_.end()) return it->second;
  ExprPtr p = lower::NewExpr(std::move(e));
  nodes_.emplace(std::move(key), p);
  return p;
}

ExprPtr ExprPool::InternTree(const ExprPtr& e) {
  auto it = trees_.find(e.get());
  if (it != trees_.end()) return it->second;
  Expr copy = *e;
  for (ExprPtr& a : copy.args) a = InternTree(a);
  ExprPtr out = Intern(std::move(copy));
  trees_.emplace(e.get(), out);
  trees_.emplace(out.get(), out);
  return out;
}

namespace {

class Rewriter {
 public:
  Rewriter(const RewriteRules& rules, ExprPool* pool) : rules_(rules), pool_(pool) {}

  ExprPtr Visit(const ExprPtr& e) {
    auto it = memo_.find(e.get());
    if (it != memo_.end()) return it->second;
    ExprPtr out = Build(e);
    memo_.emplace(e.get(), out);
    return out;
  }

 private:
  ExprPtr Build(const ExprPtr& ep) {
    const Expr& e = *ep;
    if (rules_.node) {
      if (ExprPtr r = rules_.node(ep)) return r;
    }
    if (e.kind == Expr::Kind::kReduce) {
      for (int rv : e.rvars)
        if (std::count(rules_.shadowed_by_reduce.begin(), rules_.shadowed_by_reduce.end(), rv))
          return ep;
    }
    if (e.kind == Expr::Kind::kLoad && rules_.load) {
      if (ExprPtr r = rules_.load(e)) return r;
    }
    Expr copy = e;
    for (ExprPtr& a : copy.args) a = Visit(a);
    if (rules_.affine)
      for (Affine& a : copy.index) a = rules_.affine(a);
    return pool_->Intern(std::move(copy));
  }

  const RewriteRules& rules_;
  ExprPool* pool_;
  std::unordered_map<const Expr*, ExprPtr> memo_;
};

}  // namespace

ExprPtr Rewrite(const ExprPtr& e, const RewriteRules& rules, ExprPool* pool) {
  Rewriter r(rules, pool);
  return r.Visit(e);
}

std::vector<const Expr*> Nodes(const ExprPtr& root) {
  std::vector<const Expr*> out;
  std::set<const Expr*> seen;
  std::vector<std::pair<const Expr*, size_t>> stack = {{root.get(), 0}};
  seen.insert(root.get());
  while (!stack.empty()) {
    auto& [e, next] = stack.back();
    if (next < e->args.size()) {
      const Expr* c = e->args[next++].get();
      if (seen.insert(c).second) stack.push_back({c, 0});
      continue;
    }
    out.push_back(e);
    stack.pop_back();
  }
  return out;
}

Affine FlatAddress(const schedule::Buffer& b, const std::vector<Affine>& index) {
  Affine addr = Affine::Const(0);
  for (size_t k = 0; k < index.size(); ++k)
    if (b.shape[k] != 1) addr = lower::Add(addr, lower::Scale(index[k], b.strides[k]));
  return addr;
}

Affine FlattenAffine(const Affine& a, const std::vector<int>& vars, int flat,
                     const lower::VarExtents& ext) {
  bool any = false, atoms = false;
  for (int v : vars) {
    any |= a.Uses(v);
    atoms |= UsesVarInAtom(a, v);
  }
  if (!any) return a;
  std::vector<int64_t> strides(vars.size(), 1);
  for (int k = static_cast<int>(vars.size()) - 2; k >= 0; --k)
    strides[k] = strides[k + 1] * ext[vars[k + 1]];
  if (!atoms) {
    int64_t alpha = Coefficient(a, vars.back());
    bool run = true;
    for (size_t k = 0; k < vars.size(); ++k) run &= Coefficient(a, vars[k]) == alpha * strides[k];
    if (run) {
      Affine r = a;
      for (int v : vars) {
        Term t;
        t.var = v;
        r.terms.erase(t);
      }
      return lower::Add(r, lower::Scale(Affine::Var(flat), alpha));
    }
  }
  Affine r = a;
  for (size_t k = 0; k < vars.size(); ++k) {
    Affine piece = lower::FloorDiv(lower::Mod(Affine::Var(flat), strides[k] * ext[vars[k]], ext),
                                   strides[k], ext);
    r = lower::Substitute(r, vars[k], piece, ext);
  }
  return r;
}

namespace {
thread_local AssumedMultiples* assumed = nullptr;
}  // namespace

AssumedMultiples::AssumedMultiples() : outer_(assumed) { assumed = this; }
AssumedMultiples::~AssumedMultiples() { assumed = outer_; }
AssumedMultiples* AssumedMultiples::Current() { return assumed; }

std::string AssumedMultiples::Condition() const {
  std::string out;
  for (const auto& [v, m] : values_)
    absl::StrAppend(&out, out.empty() ? "" : " && ", "(", v, " % ", m, " == 0)");
  return out;
}

bool VectorContiguous(const Affine& a, int var, int V) {
  if (UsesVarInAtom(a, var) || Coefficient(a, var) != 1) return false;
  if (a.constant % V != 0) return false;
  for (const auto& [t, c] : a.terms) {
    if (t.kind == Term::Kind::kVar && t.var == var) continue;
    if (assumed != nullptr && ir::VariesWithSizes(c)) {  // every sample alike, whatever its residue
      assumed->Record(c, V);
      continue;
    }
    if (c % V != 0) return false;
  }
  return true;
}

int PlainVar(const Affine& a) {
  if (a.constant != 0 || a.terms.size() != 1) return -1;
  const auto& [t, c] = *a.terms.begin();
  return t.kind == lower::Term::Kind::kVar && c == 1 ? t.var : -1;
}

namespace {

// `a` with the clamps a concatenation put on its pieces' indices (var - lo clamped to
// [0, hi - lo - 1]) taken off: inside the piece's branch, var lies in [lo, hi) and the clamp
// is the identity; without it, loads along `var` can be vectors.
Affine DropPieceClamp(const Affine& a, int var, int64_t lo, int64_t hi) {
  Affine out = Affine::Const(a.constant);
  for (const auto& [t, c] : a.terms) {
    Affine term;
    const bool piece = t.kind == lower::Term::Kind::kClamp && t.d == 0 && t.hi == hi - lo - 1 &&
                       t.arg && t.arg->constant == -lo &&
                       PlainVar(lower::AddConst(*t.arg, lo)) == var;
    if (piece) {
      term = lower::Scale(*t.arg, c);
    } else {
      term.terms[t] = c;
    }
    out = lower::Add(out, term);
  }
  return out;
}

}  // namespace

bool Concat::Splits(int x, int V) const {
  if (var != x) return false;
  for (size_t k = 0; k + 1 < pieces.size(); ++k)
    if (ir::StaticFactor(pieces[k].hi) % V != 0) return true;
  return false;
}

Concat ConcatPieces(const ExprPtr& tree, const ir::Shape& loops, ExprPool* pool) {
  Concat c;
  std::vector<Piece>& pieces = c.pieces;
  std::function<void(const ExprPtr&, int64_t)> walk = [&](const ExprPtr& e, int64_t hi) {
    const int v =
        e->kind == Expr::Kind::kIndexLess && e->index.size() == 1 ? PlainVar(e->index[0]) : -1;
    if (v < 0 || (c.var >= 0 && v != c.var)) {
      pieces.push_back({e, 0, hi});  // hi 0: the last piece, bounded by the loop
      return;
    }
    c.var = v;
    walk(e->args[0], e->ivalue);
    walk(e->args[1], hi);
  };
  // A cast of the concatenation (to the output's type): each piece cast.
  const bool cast =
      tree->kind == Expr::Kind::kCast && tree->args[0]->kind == Expr::Kind::kIndexLess;
  const ExprPtr& root = cast ? tree->args[0] : tree;
  if (root->kind != Expr::Kind::kIndexLess) return {};
  walk(root, 0);
  if (pieces.size() < 2) return {};
  for (size_t k = 0; k < pieces.size(); ++k) {
    Piece& p = pieces[k];
    p.lo = k == 0 ? 0 : pieces[k - 1].hi;
    if (p.hi == 0) p.hi = loops[c.var];
    RewriteRules unclamp;
    unclamp.affine = [&](const Affine& a) { return DropPieceClamp(a, c.var, p.lo, p.hi); };
    p.value = pool->InternTree(
        Rewrite(cast ? lower::MakeCast(p.value, tree->dtype) : p.value, unclamp, pool));
  }
  return c;
}

}  // namespace kiln::codegen
