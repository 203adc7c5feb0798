// The CUDA backend's statement emitter: the shared ScopedEmitter (hoisting, CSE) plus what
// GPU kernels need on top of it.
//
//  - Lane groups: a thread computes V neighbouring elements at once. A loop variable is
//    split into a per-thread part and a lane u < V; trees are rebuilt per lane, and loads
//    that read V consecutive, aligned elements become one 16-byte (or narrower) vector load
//    into registers that the lanes then read.
//  - Row splits: the threads of a row (TR consecutive threads of the block) share a flat
//    index space; thread kt owns e = base + V*(kt + TR*q) + u. Rows that fit are unrolled
//    (q a literal) and, when the same loads feed several reductions and the outputs, kept in
//    registers (a row cache) so memory is read once.
//  - Reductions: cooperative over a row (per-thread partials, then warp shuffles and shared
//    memory, see kiln_cuda.h), split across the y-groups of a column tile, or sequential in
//    one thread (the shared emitter's loops).
//
// Variables the kernel did not have (flat indices, thread and lane parts) are added with
// NewVar; register arrays are added as buffers of the emitter's program copy.
// Thread-safety: one emitter per kernel, used by one thread.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/codegen/emitter.h"
#include "kernels/codegen/expr_rewrite.h"

namespace kiln::codegen::cuda {

// How the threads of a row cover a flat index range.
struct RowSplit {
  int64_t extent = 1;    // elements in the range (a whole row, or the total of a slice set)
  int V = 1;             // lanes per vector; extent % V == 0
  int TR = 1;            // threads per row (a power of two)
  int64_t Q = 1;         // vectors per thread
  bool unrolled = true;  // q is a literal (Q small) or a loop variable
  lower::Affine base;    // first index (a multiple of V): 0, or a slice start
  std::string end;       // C text of the end bound; empty: `extent`
  std::string q_text;    // looped: C text of the trip count when not the literal Q
  // Unrolled with a tail: q < Q are unrolled (guarded, and read from the row cache when there
  // is one), then a loop takes q from Q to q_text. For rows whose length varies with the sizes:
  // a row that fits in Q vectors per thread is read once, a longer one loops over the rest.
  bool tail = false;
};

// Loads of a row held in registers for the whole kernel.
struct RowCache {
  struct Entry {
    std::string name;    // register array
    int buffer;          // the buffer read
    lower::Affine addr;  // flat address in the row variable
    ir::DType dtype;
    int reg_buffer;  // the register array as a buffer of the emitter's program
  };
  int var = -1;                          // the row's flat variable
  std::map<std::string, Entry> entries;  // key: LoadKey()
};
std::string LoadKey(int buffer, const lower::Affine& addr);

// A reduction computed cooperatively by the threads of a row (or of a column tile).
struct CoopReduce {
  lower::ExprPtr body;  // in terms of `var`, the flat reduction index
  int var = -1;
  RowSplit split;          // row mode
  bool use_cache = false;  // body loads may come from the row cache (same split as it)
  int index_buffer = -1;   // argmin/argmax over partial results: their indices
  int y_groups = 0;  // > 0: column-tile mode: y-group ky of y_groups takes e = ky + y_groups*j
  // Column-tile mode over a chunk of the range (a split column reduction's partials): C text
  // of the chunk's first index and end bound; empty: the whole range.
  std::string col_begin, col_end;
};

class CudaEmitter : public ScopedEmitter {
 public:
  // `program` and `kernel` are private copies this emitter may extend (new variables,
  // register arrays); they must outlive it.
  CudaEmitter(schedule::Program* program, schedule::Kernel* kernel,
              std::vector<std::string> var_names, std::vector<std::string> buffer_names,
              ExprPool* pool, std::string index_type);

  int NewVar(int64_t extent, const std::string& name);
  // A register array of `n` elements of `t` the emitter's loads can name.
  int AddRegisterArray(ir::DType t, int64_t n, const std::string& name);
  const std::string& index_type() const { return index_type_; }
  ExprPool* pool() { return pool_; }
  schedule::Program& program() { return *program_; }
  lower::VarExtents& extents() { return kernel_ext_->extents; }
  // A canonical kLoad of a register array element (see RegisterRead in the .cc).
  lower::ExprPtr RegisterRead(int reg_buffer, ir::DType t, int64_t element, int dep_var);

  // Thread variables, set by the kernel generator before emitting.
  int kt_var = -1;          // thread within the row
  int ky_var = -1;          // column-tile y-group
  int threads_per_row = 1;  // TR of cooperative reductions (template argument)
  const RowCache* cache = nullptr;
  std::map<const lower::Expr*, CoopReduce> coop;  // reductions not run sequentially
  int smem_bytes = 0;                             // shared scratch the cooperative reductions need

  // One C block of lanes: rebuilds trees per lane and collects the vector loads they share.
  class LaneGroup {
   public:
    // `var` takes the value `first + u` in lane u; register reads depend on `dep_var` so
    // they stay inside the block. `cache_offset`: the cache element of lane 0, or -1.
    LaneGroup(CudaEmitter* em, int var, lower::Affine first, int V, int dep_var,
              int64_t cache_offset);
    lower::ExprPtr Lane(const lower::ExprPtr& tree, int u);
    const std::vector<std::string>& fills() const { return fills_; }
    // Makes this the group of a ragged range of `end` elements (C text), whose last vector
    // is partial: `count` (C text) elements are left from `first`. Vector loads read at most
    // that many (kiln_vload_n, from the unclamped first index); lane u > 0 reads its scalar
    // elements at a new variable, `first + u` clamped to `end - 1` (in fills() once read), so a
    // lane past the end recomputes the last element (its result is never stored) rather than
    // reading out of bounds. Returns those variables, lanes 1.., which the caller binds with
    // scopes inside the group's so the statements reading them stay there.
    // REQUIRES: lane 0 lies inside the range; called before Lane().
    std::vector<int> MakeRagged(const std::string& end, const std::string& count);

   private:
    lower::ExprPtr VectorRead(const lower::Expr& load, const lower::Affine& addr, int u);
    CudaEmitter* em_;
    int var_;
    lower::Affine first_;
    int V_;
    int dep_var_;
    int64_t cache_offset_;
    std::map<std::string, int> vectors_;  // load key -> register array buffer
    std::string count_;                   // ragged: elements left from first_ (C text)
    // Ragged: lane -> its clamped variable and, until a scalar access reads it, its definition.
    std::map<int, std::pair<int, std::string>> clamped_;
    std::vector<std::string> fills_;
  };

  // Emits a row loop over `split` into the innermost scope: for each lane group, `lane(g, u)`
  // emits lane u's work. The group's statements are guarded by the range check (and by
  // `extra_guard` when not empty). `var` is the flat variable the trees use.
  void EmitRowLoop(const RowSplit& split, int var, bool use_cache, const std::string& extra_guard,
                   const std::function<void(LaneGroup&, int)>& lane,
                   const std::function<void(LaneGroup&, const std::string& e0)>& after);

  // Column-tile reductions over the same range (one flat variable, chunk and y-groups, all
  // landing in one scope) in one loop, so that what their bodies share (a matrix several of
  // them read) is loaded once per element; Emit then returns their values. False, emitting
  // nothing, when they do not qualify. Call with the output scopes open.
  bool EmitColumnGroup(const std::vector<const lower::Expr*>& nodes);

  // The C text of an affine in this kernel's variable names.
  std::string Text(const lower::Affine& a) const { return lower::ToC(a, var_names_); }
  std::set<int> rvars;  // variables bound by reductions (never available to vector fills)

 protected:
  void EmitReduce(const lower::Expr& e, const std::string& result, size_t target) override;
  std::string ReducePragma(const lower::Expr&, const std::string&) const override { return ""; }
  bool PairsSinCos() const override { return true; }  // kiln_cuda.h's kiln_sincos

 private:
  void EmitCoopReduce(const lower::Expr& e, const CoopReduce& r, const std::string& result,
                      size_t target);
  void EmitColumnReduces(const std::vector<const lower::Expr*>& nodes,
                         const std::vector<std::string>& results, size_t target);

  schedule::Program* program_;
  schedule::Kernel* kernel_ext_;
  ExprPool* pool_;
  std::string index_type_;
};

}  // namespace kiln::codegen::cuda
