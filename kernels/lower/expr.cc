#include "kernels/lower/expr.h"

#include <algorithm>
#include <functional>
#include <set>

namespace kiln::lower {

namespace {

std::vector<int> ComputeFreeVars(const Expr& e) {
  std::vector<int> vs;
  for (const Affine& a : e.index) a.CollectVars(&vs);
  for (const ExprPtr& c : e.args) {
    std::vector<int> cv = c->FreeVars();
    vs.insert(vs.end(), cv.begin(), cv.end());
  }
  std::sort(vs.begin(), vs.end());
  vs.erase(std::unique(vs.begin(), vs.end()), vs.end());
  if (!e.rvars.empty())
    vs.erase(
        std::remove_if(vs.begin(), vs.end(),
                       [&](int v) { return std::count(e.rvars.begin(), e.rvars.end(), v) > 0; }),
        vs.end());
  return vs;
}

}  // namespace

std::vector<int> Expr::FreeVars() const {
  return free_vars_ready ? free_vars_cache : ComputeFreeVars(*this);
}

ExprPtr NewExpr(Expr e) {
  e.free_vars_cache = ComputeFreeVars(e);
  e.free_vars_ready = true;
  return std::make_shared<const Expr>(std::move(e));
}

int Expr::CountNodes(const ExprPtr& root) {
  std::set<const Expr*> seen;
  std::function<void(const Expr*)> walk = [&](const Expr* e) {
    if (!seen.insert(e).second) return;
    for (const ExprPtr& c : e->args) walk(c.get());
  };
  walk(root.get());
  return static_cast<int>(seen.size());
}

}  // namespace kiln::lower
