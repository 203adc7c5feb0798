#include "kernels/codegen/cpu/cpu_lanes.h"

#include <algorithm>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/codegen/c_expr.h"
#include "kernels/codegen/expr_rewrite.h"

namespace kiln::codegen {
namespace {

using lower::Expr;

// Tiles fewer than this go to threads as split reduced loops rather than whole tiles.
constexpr int64_t kMinParallelTiles = 8;

// Reductions that depend on output variable `x`, each with its longest reduced range, and
// whether one of them walks an outer axis (see the header).
struct Found {
  bool outer_walk = false;
  int64_t reduced = 1;
};

Found Scan(const schedule::Program& p, const schedule::Kernel& k, int x) {
  Found f;
  std::set<const Expr*> seen;
  std::function<void(const Expr*)> walk = [&](const Expr* n) {
    if (!seen.insert(n).second) return;
    for (const auto& a : n->args) walk(a.get());
    if (n->kind != Expr::Kind::kReduce) return;
    std::vector<int> fv = n->FreeVars();
    if (!std::count(fv.begin(), fv.end(), x)) return;
    int64_t r = 1;
    for (int rv : n->rvars) r *= k.extents[rv];
    std::set<const Expr*> body_seen;
    std::function<void(const Expr*)> loads = [&](const Expr* m) {
      if (!body_seen.insert(m).second) return;
      for (const auto& a : m->args) loads(a.get());
      if (m->kind != Expr::Kind::kLoad) return;
      lower::Affine addr = FlatAddress(p.buffers[m->buffer], m->index);
      if (Coefficient(addr, x) != 1) return;
      for (int rv : n->rvars)
        if (Coefficient(addr, rv) != 0) {
          f.outer_walk = true;
          f.reduced = std::max(f.reduced, r);
        }
    };
    loads(n->args[0].get());
  };
  for (const auto& o : k.outputs) walk(o.value.get());
  return f;
}

}  // namespace

TransposeTiles PlanTranspose(const schedule::Program& p, const schedule::Kernel& k) {
  TransposeTiles plan;
  if (k.num_loops < 2) return plan;
  const int x = k.num_loops - 1;
  // The loads, and the narrowest type the kernel moves.
  std::vector<const Expr*> loads;
  bool reduces = false;
  int64_t narrowest = 8;
  for (const auto& o : k.outputs) {
    narrowest = std::min<int64_t>(narrowest, ir::DTypeSize(p.buffers[o.buffer].dtype));
    for (const Expr* n : Nodes(o.value)) {
      reduces = reduces || n->kind == Expr::Kind::kReduce;
      if (n->kind != Expr::Kind::kLoad) continue;
      loads.push_back(n);
      narrowest = std::min<int64_t>(narrowest, ir::DTypeSize(p.buffers[n->buffer].dtype));
    }
  }
  if (reduces) return plan;
  // A tile's row is one 64-byte vector of the narrowest type, and at least 16 elements: 16 x 16
  // for f32 and f64 (16, 32 and 64 measured within 10% of each other on a transposing copy of
  // f32[2048, 2048]; 16 was the fastest), 64 x 64 for bytes (a u8 transposing copy of
  // [3000, 3001]: 2.6 ms in 16 x 16 tiles).
  const int64_t tile = std::max<int64_t>(16, 64 / std::max<int64_t>(narrowest, 1));
  if (k.extents[x] < tile) return plan;
  for (const Expr* n : loads) {
    const lower::Affine addr = FlatAddress(p.buffers[n->buffer], n->index);
    const int64_t along_x = Coefficient(addr, x);
    if (along_x > -tile && along_x < tile) continue;
    for (int v = 0; v < x; ++v) {
      const int64_t c = Coefficient(addr, v);
      if ((c == 1 || c == -1) && k.extents[v] >= tile) {
        plan.p = v;
        plan.tile = tile;
        return plan;
      }
    }
  }
  return plan;
}

LanePlan PlanLanes(const schedule::Program& p, const schedule::Kernel& k, int64_t min_parallel_work,
                   const CpuVariant& variant) {
  LanePlan plan;
  plan.max_unroll = variant.max_unroll;
  const int64_t max_lanes = variant.max_lanes;
  if (k.num_loops == 0) return plan;
  const int x = k.num_loops - 1;
  const int64_t extent = k.extents[x];
  Found f = Scan(p, k, x);
  if (!f.outer_walk || extent < 2) return plan;
  // Balanced tiles of at most max_lanes, a multiple of 16 lanes (whole vectors) when wider.
  // While sampling a symbolic graph, full tiles of max_lanes: a balanced width is a quotient of
  // the extent, which no expression of the sizes gives.
  const int64_t tiles = (extent + max_lanes - 1) / max_lanes;
  int64_t lanes =
      InSymbolicSample() && extent > max_lanes ? max_lanes : (extent + tiles - 1) / tiles;
  if (lanes > 16) lanes = (lanes + 15) / 16 * 16;
  plan.lanes = std::min(lanes, extent);
  if (k.num_loops == 1 && extent * f.reduced >= min_parallel_work) {
    if (tiles >= kMinParallelTiles || (variant.prefer_tiles && tiles > 1))
      plan.parallel_tiles = true;
    else
      plan.split_rows = true;
  }
  return plan;
}

std::vector<std::string> LaneTileLoop(const std::vector<std::string>& body, int64_t extent,
                                      const LanePlan& plan, bool parallel) {
  std::vector<std::string> loop;
  if (parallel) loop.push_back("#pragma omp parallel for num_threads(nt) schedule(static)");
  loop.push_back(absl::StrCat("for (int64_t kb = 0; kb < ", extent, "; kb += ", plan.lanes, ") {"));
  if (extent % plan.lanes == 0 && !InSymbolicSample()) {
    loop.push_back(absl::StrCat("  const int64_t kn = ", plan.lanes, ";"));
  } else {
    loop.push_back(absl::StrCat("  const int64_t kn = kb + ", plan.lanes, " <= ", extent, " ? ",
                                plan.lanes, " : ", extent, " - kb;"));
  }
  for (const std::string& s : body) loop.push_back("  " + s);
  loop.push_back("}");
  return loop;
}

}  // namespace kiln::codegen
