// Internals of the CUDA kernel generator (cuda_kernel.h), shared by its two source files:
// cuda_kernel.cc (driver, whole-tensor partials) and cuda_strategies.cc (the strategies).
// Thread-safety: a KernelGen is used by one thread.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/codegen/c_expr.h"
#include "kernels/codegen/cuda/cuda_emitter.h"
#include "kernels/codegen/cuda/cuda_kernel.h"
#include "kernels/codegen/expr_rewrite.h"
#include "kernels/ir/symbols.h"

namespace kiln::codegen::cuda::internal {

using lower::Affine;
using lower::Expr;
using lower::ExprPtr;
using schedule::Buffer;

// Whole-tensor reductions this small (and kernels this small) run in one block, in one launch.
inline constexpr int64_t kDirectLimit = int64_t{1} << 16;
inline constexpr int kPartialBlock = 512;
// The default pointwise block (KernelConfig::pointwise_block), for shape thresholds.
inline constexpr int kPointwiseBlock = 256;
// Rows of up to this many vectors per thread are unrolled (and may be cached in registers).
inline constexpr int64_t kMaxUnrolledVectors = 8;
inline constexpr int64_t kMaxUnrolledElements = 32;
// Rows whose length varies with the sizes (and whose count is large or varies too) get one
// kernel per band of lengths, chosen at launch (PlanStep guards): threads per row as a static
// row of the band's longest length would have (kRowElementsPerThread each), so a short row
// (attention scores over a sequence) packs several rows into a block and combines through
// shuffles alone, and a long one is spread over a block and read from memory once. Every
// band's kernel is correct at any length; the last band's rows past 8 * 1024 loop.
struct RowBand {
  int64_t threads;     // per row
  int64_t max_length;  // the band's longest row (0: unbounded)
};
inline constexpr RowBand kVaryingRowBands[] = {
    {16, 128}, {64, 512}, {256, 2048}, {512, 4096}, {1024, 0}};
// Threads per row where the length varies but one kernel serves (RowBand unused): a warp.
inline constexpr int64_t kVaryingRowThreads = 32;
// Vectors per thread of such a row that are unrolled (and may be kept in registers): rows of up
// to 32 * 8 elements are read from memory once.
inline constexpr int64_t kVaryingRowVectors = 8;
// Registers (32-bit words) per thread a row cache may take.
inline constexpr int64_t kCacheBudgetWords = 48;
// Elements per thread a row aims for: enough loads in flight, few enough registers.
inline constexpr int64_t kRowElementsPerThread = 8;
// Elements per thread for rows bound by arithmetic rather than loads (see KernelGen::Row).
inline constexpr int64_t kComputeRowElementsPerThread = 32;
// The shortest row a row kernel's loops are split into to make more rows (RowSplitPoint).
inline constexpr int64_t kRowSplitMinLength = 256;

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Symbolic graphs (kernels/codegen/symbolic.h): while a sample is generated, an extent that
// varies with the sizes gets code that holds for every value, with the numbers derived from
// it printed as C expressions of it (which the generaliser turns into expressions of the
// sizes) rather than computed here: loops bounded by `(L + step - 1) / step` instead of
// unrolled, divisibility judged on its static factor, grids as ceil-divisions the launcher
// evaluates. Outside a sample both are false and nothing changes.
inline bool Varies(int64_t extent) { return ir::VariesWithSizes(extent); }
// "((L + d - 1) / d)": the ceil-division as C text (`L` stays a literal the generaliser reads).
inline std::string CeilDivText(int64_t a, int64_t d) {
  return d == 1 ? absl::StrCat(a) : absl::StrCat("((", a, " + ", d - 1, ") / ", d, ")");
}
inline int64_t Pow2Ceil(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}
inline int64_t Pow2Floor(int64_t x) {
  int64_t p = 1;
  while (p * 2 <= x) p <<= 1;
  return p;
}
inline int64_t Product(const ir::Shape& s, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t i = from; i < to; ++i) n *= s[i];
  return n;
}

using FreeVarMap = std::unordered_map<const Expr*, std::vector<int>>;

inline void AddFreeVars(const ExprPtr& root, FreeVarMap* fv) {
  for (const Expr* n : Nodes(root)) {
    if (fv->count(n)) continue;
    std::vector<int> vs;
    for (const Affine& a : n->index) a.CollectVars(&vs);
    for (const ExprPtr& c : n->args) {
      const std::vector<int>& cv = fv->at(c.get());
      vs.insert(vs.end(), cv.begin(), cv.end());
    }
    std::sort(vs.begin(), vs.end());
    vs.erase(std::unique(vs.begin(), vs.end()), vs.end());
    vs.erase(
        std::remove_if(vs.begin(), vs.end(),
                       [&](int v) { return std::count(n->rvars.begin(), n->rvars.end(), v) > 0; }),
        vs.end());
    (*fv)[n] = std::move(vs);
  }
}

inline int64_t ReduceExtent(const Expr& e, const lower::VarExtents& ext) {
  int64_t r = 1;
  for (int v : e.rvars) r *= ext[v];
  return r;
}

// Vector width for a flat range: 16 bytes of the widest element among the contiguous loads
// (and `min_bytes`, the outputs' widest), at most 8 lanes, dividing the extent.
inline int PickV(const std::vector<ExprPtr>& trees, int var, int64_t extent, int64_t min_bytes,
                 const schedule::Program& prog) {
  int64_t widest = min_bytes;
  for (const ExprPtr& t : trees)
    for (const Expr* n : Nodes(t)) {
      if (n->kind != Expr::Kind::kLoad) continue;
      const Buffer& b = prog.buffers[n->buffer];
      if (b.role == Buffer::Role::kConst || b.index < 0) continue;
      Affine addr = FlatAddress(b, n->index);
      if (Coefficient(addr, var) == 1 && !UsesVarInAtom(addr, var))
        widest = std::max(widest, ir::DTypeSize(b.dtype));
    }
  if (widest == 0) return 1;
  int V = static_cast<int>(std::min<int64_t>(8, std::max<int64_t>(1, 16 / widest)));
  while (V > 1 && ir::StaticFactor(extent) % V != 0) V /= 2;
  return V;
}

// A function being built: private copies of the program and kernel the emitter may extend.
struct Fn {
  schedule::Program prog;
  schedule::Kernel kern;
  std::unique_ptr<CudaEmitter> em;
  size_t real_buffers = 0;
  std::vector<std::string> head;  // thread indices, bounds, caches: before everything else
  std::vector<int> written;
};

class KernelGen {
 public:
  KernelGen(schedule::Program* unit, int index, const KernelConfig& cfg)
      : unit_(unit),
        cfg_(cfg),
        kern_(unit->kernels[index]),
        loops_(kern_.extents.begin(), kern_.extents.begin() + kern_.num_loops) {}
  absl::StatusOr<std::vector<KernelFunction>> Run();

 private:
  std::unique_ptr<Fn> NewFn();
  // Lines defining `vars` (row-major over their extents) from the flat index text `flat`.
  std::vector<std::string> DefineVars(Fn& fn, const std::vector<int>& vars,
                                      const std::string& flat);
  // Reductions over partial results (left by SplitGlobals) are cooperative over `tr` threads.
  void RegisterPartialReductions(Fn& fn, const std::vector<ExprPtr>& trees, int tr);
  // The function, launched on ceil(work / per_block) blocks of `block` threads.
  KernelFunction Finish(Fn& fn, const std::string& name, const std::vector<std::string>& body,
                        int64_t work, int64_t per_block, int block, std::string strategy);
  std::string StoreText(const Buffer& b, const std::string& v);
  // A temporary of shape `shape` in the workspace (256-byte aligned); returns its buffer.
  int AddTemp(ir::DType t, ir::Shape shape);
  // A column tile's thread indices (kt, ky, the output kc and its variables): y-groups of 32
  // threads, 32 outputs per block from `column_block` * 32 (C text).
  void ColumnHead(Fn& fn, int y, const std::string& column_block);

  // Whole-tensor reductions -> partial launches; `direct` when they are small enough for one
  // block of the main launch.
  void SplitGlobals(bool* direct);
  void Partials(const std::vector<ExprPtr>& items, const std::vector<int>& val_buffers,
                const std::vector<int>& idx_buffers, int64_t G, int level);
  // `original` (a reduction) as the same reduction over G partials in `buffer`, at index
  // [g, inner...] for a new variable g of extent G.
  ExprPtr ReduceOverPartials(const Expr& original, int buffer, int64_t G,
                             std::vector<Affine> inner);
  // Column reductions over long ranges with few outputs: partial launches over chunks of the
  // range, the reductions rewritten to read them; returns the number of chunks, or 0 (nothing
  // changed) where a column tile alone fills the device or the reductions do not qualify.
  // A reduction whose body reads another (a variance's sum of squared deviations reads the
  // mean) is split in a later launch, after the one it reads: its body then reads that one's
  // G partials, which each thread sums itself.
  int64_t SplitColumns(int y);
  // `level`: 0 for the first partials launch, 1 for one that reads the first's, and so on.
  void ColumnPartials(const std::vector<ExprPtr>& items, const std::vector<int>& val_buffers,
                      int64_t G, int y, int level);
  // The strategies (cuda_strategies.cc).
  void Pointwise();
  void Row(int p);  // outer variables 0..p, one row per outer index
  // Where a row kernel whose reductions read outer variables 0..d_outer splits its loops:
  // d_outer, or deeper when that leaves the GPU mostly idle (cuda_kernel.cc).
  int RowSplitPoint(int d_outer, const FreeVarMap& fv) const;
  // One row function named `name`: `threads` per row when the row length varies (0: the
  // default for its shape). Sets `*rows` and `*work` (the longest range a row walks).
  // `aligned` (a row length that varies): vectors along the row as though its length, and
  // every stride that varies, were a multiple of the vector width; `*aligned_if` is then the
  // C condition under which that holds (empty: no vectors came of it).
  KernelFunction RowFn(int p, int64_t threads, const std::string& name, int64_t* rows,
                       int64_t* work, bool aligned = false, std::string* aligned_if = nullptr);
  KernelFunction AlignedOr(const KernelFunction& aligned, const KernelFunction& general,
                           const std::string& condition, const std::string& name);
  void ColumnTile(int y);

  schedule::Program* unit_;
  KernelConfig cfg_;
  schedule::Kernel kern_;
  ir::Shape loops_;  // output loop extents (size-1 dimensions have no loop)
  ExprPool pool_;
  std::unordered_map<const Expr*, int>
      partial_index_;  // reductions over partials -> index buffer (or -1)
  std::vector<KernelFunction> fns_;
};

}  // namespace kiln::codegen::cuda::internal
