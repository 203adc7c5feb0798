// The CPU backend's expression emitter: the shared ScopedEmitter plus what only the CPU
// strategies do.
//
//   invariant tables   a value that does not depend on some loop enclosing it (a cast of a
//                      small broadcast tensor, arithmetic on per-column statistics) is computed
//                      once before the kernel's loops into a local table indexed by the
//                      variables it does depend on, and read from there (loop-invariant code
//                      motion across loop levels, which the scopes alone cannot do);
//   lane tiles         the innermost output loop becomes tiles of `lanes` consecutive indices:
//                      its values are arrays over the tile and each reduction placed there
//                      walks its reduced range once per tile, updating all the tile's
//                      accumulators per step in a vector loop, so a reduction over an outer
//                      axis reads memory in order; sums take 2 or 4 rows per step, added
//                      pairwise before the accumulator (kernels/codegen/cpu/cpu_lanes.h says
//                      when tiles are used);
//   parallel reduce    whole-tensor reductions, or a tile's reductions when the kept extent
//                      is small, run their outermost reduced loop across threads with
//                      per-thread partials merged by OpenMP.
// Thread-safety: one emitter per kernel, used by one thread.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kernels/codegen/emitter.h"

namespace kiln::codegen {

class CpuKernelEmitter : public ScopedEmitter {
 public:
  using ScopedEmitter::ScopedEmitter;

  // Whole-tensor reductions (a kernel with no output loops) run their outermost loop across
  // threads with per-thread partials, merged by OpenMP.
  bool parallel_top_reduce = false;

  // Tables for invariant values: at most this many elements each.
  static constexpr int64_t kMaxTableElements = 16384;
  void enable_invariant_tables() { tables_ = true; }

  // Lane tiles over scope `scope` (binding output variable `var`): values placed there are
  // arrays of `lanes` elements indexed by `kl`; `var` is `kb + kl` inside lane loops, with
  // `kn` lanes in the current tile. `split_rows`: reductions there run their outermost
  // reduced loop across threads (array partials).
  struct Lanes {
    size_t scope = 0;
    int var = -1;
    int64_t lanes = 0;
    bool split_rows = false;
    int max_unroll = 4;
  };
  void set_lanes(const Lanes& lanes) { lanes_ = lanes; }

  // Statements of a lane-tiled scope: runs of lane statements (marked by kLaneMark) become
  // one vector loop over the tile's lanes.
  static constexpr char kLaneMark = '\x01';
  std::vector<std::string> AssembleLanes(const std::vector<std::string>& stmts) const;

 protected:
  void EmitReduce(const lower::Expr& e, const std::string& result, size_t target) override;
  bool Hoist(const lower::ExprPtr& e, size_t target, std::string* ref) override;
  std::string Define(size_t target, const lower::Expr& e, const std::string& name,
                     const std::string& text) override;
  std::string ValueRef(size_t target, const std::string& name) override;

 private:
  // The lane scope is identified by its depth and the variable it binds: a reduction placed
  // above the tile (a whole-tensor mean in the prologue) has loop scopes of the same depth.
  bool InLanes(size_t target) const {
    return lanes_.lanes > 0 && target == lanes_.scope && target < scopes_.size() &&
           scopes_[target].var == lanes_.var;
  }
  void EmitLaneReduce(const lower::Expr& e, const std::string& result, size_t target);
  void ParallelizeTopReduce(const lower::Expr& e, const std::string& result, size_t target);
  // "for (int64_t kl = 0; kl < kn; ++kl) {" with the lane's variable defined, as lines.
  std::vector<std::string> LaneLoop(const std::vector<std::string>& body, bool simd) const;

  bool tables_ = false;
  bool hoisting_ = false;  // emitting a table's body: no tables inside tables
  int next_table_ = 0;
  std::map<const lower::Expr*, std::string> table_of_;  // hoisted expressions -> their table
  // Loop variables renamed while a reduction's unrolled rows are emitted ("(i2 + 1)"): their
  // own names, which the loops that fill tables declare.
  std::map<int, std::string> renamed_;
  Lanes lanes_;
};

}  // namespace kiln::codegen
