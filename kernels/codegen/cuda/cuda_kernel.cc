#include "kernels/codegen/cuda/cuda_kernel.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/codegen/c_expr.h"
#include "kernels/codegen/cuda/kernel_gen.h"
#include "kernels/lower/lower.h"

namespace kiln::codegen::cuda {
namespace internal {

// A row kernel's rows are its outer indices 0..d_outer, the deepest the hoisted reductions
// read. When those are few (a group norm's samples: 16 rows of 200,704 elements, one block
// each on a GPU of 132 SMs) and the reductions short (the statistics already reduced to a few
// dozen chunks per sample by an earlier kernel), deeper outer variables make more rows, each
// recomputing the short reductions: a row per sample and channel. Stops once the rows fill
// the GPU, before a row gets shorter than a block's worth, and while the recomputed
// reductions stay under a quarter of the kernel's elements.
int KernelGen::RowSplitPoint(int d_outer, const FreeVarMap& fv) const {
  const int rank = static_cast<int>(loops_.size());
  for (int d = 0; d < rank; ++d)
    if (Varies(loops_[d])) return d_outer;
  int64_t reduced = 0;  // per row: every hoisted reduction's range
  for (const auto& [n, vars] : fv) {
    if (n->kind == Expr::Kind::kReduce && !vars.empty() && vars.back() < rank)
      reduced += ReduceExtent(*n, kern_.extents);
  }
  const int64_t elements = Product(loops_, 0, rank);
  int p = d_outer;
  while (p + 2 < rank && Product(loops_, 0, p + 1) < int64_t{4} * cfg_.sm_count) {
    const int64_t rows = Product(loops_, 0, p + 2);
    if (Product(loops_, p + 2, rank) < kRowSplitMinLength || rows * reduced * 4 > elements) break;
    ++p;
  }
  return p;
}

absl::StatusOr<std::vector<KernelFunction>> KernelGen::Run() {
  for (schedule::KernelOutput& o : kern_.outputs) o.value = pool_.InternTree(o.value);
  if (Product(loops_, 0, loops_.size()) == 0) return fns_;  // nothing to compute
  bool direct = false;
  SplitGlobals(&direct);
  const int rank = static_cast<int>(loops_.size());
  if (direct || rank == 0) {
    Row(-1);
    return fns_;
  }
  // Where do the reductions left land? Depth = the deepest output variable they read. Any
  // landing above the innermost loop makes a row kernel (so each is computed once per row);
  // otherwise the innermost ones decide between a thread, a row of threads or a column tile
  // per output.
  FreeVarMap fv;
  for (const auto& o : kern_.outputs) AddFreeVars(o.value, &fv);
  int d_outer = -1;
  bool inner = false, contiguous = false;
  int64_t r_inner = 0;
  for (const auto& [n, vars] : fv) {
    if (n->kind != Expr::Kind::kReduce || vars.empty()) continue;
    if (vars.back() >= rank) continue;  // nested inside another reduction
    if (vars.back() < rank - 1) {
      d_outer = std::max(d_outer, vars.back());
      continue;
    }
    inner = true;
    r_inner = std::max(r_inner, ReduceExtent(*n, kern_.extents));
    // Contiguous when the reduction's largest operand is read along the reduced axis: a
    // per-row vector (the mean and rstd of a layer_norm backward's column sums) is contiguous
    // in the row index too, but the matrix read beside it decides how memory is walked.
    int64_t largest = 0;
    bool largest_contiguous = false;
    for (const Expr* m : Nodes(n->args[0])) {
      if (m->kind != Expr::Kind::kLoad || m->buffer < 0) continue;
      const Buffer& b = unit_->buffers[m->buffer];
      const bool along = Coefficient(FlatAddress(b, m->index), n->rvars.back()) == 1;
      if (b.bytes > largest) {
        largest = b.bytes;
        largest_contiguous = along;
      } else if (b.bytes == largest) {
        largest_contiguous = largest_contiguous || along;
      }
    }
    contiguous = contiguous || largest_contiguous;
  }
  int64_t n_out = Product(loops_, 0, rank);
  if (d_outer >= 0) {
    Row(RowSplitPoint(d_outer, fv));
  } else if (!inner) {
    Pointwise();
  } else if (r_inner >= 64 && contiguous) {
    Row(rank - 1);
  } else if (r_inner < 64 || n_out >= int64_t{8} * cfg_.sm_count * kPointwiseBlock ||
             Varies(n_out)) {
    // A number of outputs that varies with the sizes is taken to be large (one thread each).
    Pointwise();
  } else {
    int64_t y =
        Pow2Floor(std::max<int64_t>(1, int64_t{8} * cfg_.sm_count * kPointwiseBlock / n_out));
    y = std::clamp<int64_t>(std::min(y, Pow2Floor(r_inner)), 2, 32);
    // Split into chunks, the kernel then reduces each output's partials as a column tile too
    // (a y-group per partial: a few loads per thread, not a loop over all of them).
    const int64_t chunks = SplitColumns(static_cast<int>(y));
    ColumnTile(static_cast<int>(chunks > 0 ? std::clamp<int64_t>(Pow2Floor(chunks), 2, 32) : y));
  }
  return fns_;
}

std::unique_ptr<Fn> KernelGen::NewFn() {
  auto fn = std::make_unique<Fn>();
  fn->prog.buffers = unit_->buffers;
  for (Buffer& b : fn->prog.buffers) b.value = ir::Constant{};  // the emitter never reads values
  fn->real_buffers = fn->prog.buffers.size();
  fn->kern = kern_;
  std::vector<std::string> vars, bufs;
  for (size_t v = 0; v < kern_.extents.size(); ++v) vars.push_back(absl::StrCat("i", v));
  for (const Buffer& b : fn->prog.buffers) bufs.push_back(BufferName(b));
  fn->em = std::make_unique<CudaEmitter>(&fn->prog, &fn->kern, vars, bufs, &pool_, cfg_.index_type);
  return fn;
}

std::vector<std::string> KernelGen::DefineVars(Fn& fn, const std::vector<int>& vars,
                                               const std::string& flat) {
  std::vector<std::string> out;
  const lower::VarExtents& ext = fn.em->extents();
  int64_t inner = 1;
  for (int k = static_cast<int>(vars.size()) - 1; k >= 0; --k) {
    std::string v = inner == 1 ? flat : absl::StrCat("(", flat, ") / ", inner);
    if (k > 0) v = absl::StrCat("(", v, ") % ", ext[vars[k]]);
    out.push_back(
        absl::StrCat("const ", cfg_.index_type, " ", fn.em->var_names()[vars[k]], " = ", v, ";"));
    inner *= ext[vars[k]];
  }
  return out;
}

void KernelGen::RegisterPartialReductions(Fn& fn, const std::vector<ExprPtr>& trees, int tr) {
  for (const ExprPtr& t : trees)
    for (const Expr* n : Nodes(t)) {
      auto it = partial_index_.find(n);
      if (it == partial_index_.end()) continue;
      CoopReduce r;
      r.body = n->args[0];
      r.var = n->rvars[0];
      int64_t g = fn.em->extents()[r.var];
      r.split.extent = g;
      r.split.V =
          PickV({r.body}, r.var, g, it->second >= 0 ? 8 : 0, fn.prog);  // indices are 8 bytes
      r.split.TR = tr;
      r.split.Q = CeilDiv(g, int64_t{r.split.V} * tr);
      r.split.unrolled = r.split.Q <= kMaxUnrolledVectors;
      r.index_buffer = it->second;
      fn.em->coop[n] = r;
    }
}

KernelFunction KernelGen::Finish(Fn& fn, const std::string& name,
                                 const std::vector<std::string>& body, int64_t work,
                                 int64_t per_block, int block, std::string strategy) {
  std::string lines;
  for (const std::string& l : fn.head) absl::StrAppend(&lines, "  ", l, "\n");
  for (const std::string& l : body) absl::StrAppend(&lines, "  ", l, "\n");
  KernelFunction f;
  f.name = name;
  const int64_t grid = CeilDiv(work, per_block);
  f.grid =
      grid > 0xffffffffLL ? 0xffffffffu : static_cast<uint32_t>(grid);  // GenerateCuda refuses it
  f.grid_work = work;
  f.grid_per_block = per_block;
  f.block = static_cast<uint32_t>(block);
  f.strategy = std::move(strategy);
  std::vector<std::string> params;
  const std::unordered_set<std::string> mentioned = IdentifiersIn(lines);
  for (size_t b = 0; b < fn.real_buffers; ++b) {
    const Buffer& buf = fn.prog.buffers[b];
    if (buf.role == Buffer::Role::kConst || !mentioned.count(BufferName(buf))) continue;
    const std::vector<int>& also = fn.em->stored_also();
    bool w = std::count(fn.written.begin(), fn.written.end(), static_cast<int>(b)) > 0 ||
             std::count(also.begin(), also.end(), static_cast<int>(b)) > 0;
    params.push_back(absl::StrCat(w ? "" : "const ", StorageType(buf.dtype, true),
                                  "* __restrict__ ", BufferName(buf)));
    f.buffers.push_back(static_cast<int>(b));
  }
  for (int k = 0; k < cfg_.num_symbols; ++k) params.push_back(absl::StrCat("const int kiln_s", k));
  f.params = params;
  f.text = absl::StrCat("extern \"C\" __global__ void __launch_bounds__(", block, ") ", name, "(",
                        absl::StrJoin(params, ", "), ") {\n");
  if (fn.em->smem_bytes > 0)
    absl::StrAppend(&f.text, "  __shared__ __align__(16) char kiln_smem[", fn.em->smem_bytes,
                    "];\n");
  absl::StrAppend(&f.text, lines, "}\n");
  return f;
}

std::string KernelGen::StoreText(const Buffer& b, const std::string& v) {
  std::string stored =
      b.dtype == ir::DType::kBool ? v : absl::StrCat("(", ComputeTypeName(b.dtype), ")(", v, ")");
  return StoreConvert(b.dtype, stored);
}

// ---- Whole-tensor reductions: slices -> partials in the workspace -> consumers.

void KernelGen::SplitGlobals(bool* direct) {
  FreeVarMap fv;
  std::vector<const Expr*> globals;
  for (const auto& o : kern_.outputs) {
    AddFreeVars(o.value, &fv);
    for (const Expr* n : Nodes(o.value))
      if (n->kind == Expr::Kind::kReduce && fv[n].empty() &&
          std::find(globals.begin(), globals.end(), n) == globals.end())
        globals.push_back(n);
  }
  if (globals.empty()) return;
  int64_t rmax = 0;
  for (const Expr* g : globals) rmax = std::max(rmax, ReduceExtent(*g, kern_.extents));
  // Extents that vary with the sizes are taken to be large: one block would serve a small
  // size well but a large one badly, and partials serve both.
  const int64_t n_out = Product(loops_, 0, loops_.size());
  if (n_out <= kDirectLimit && rmax <= kDirectLimit && !Varies(n_out) && !Varies(rmax)) {
    *direct = true;
    return;
  }
  // Levels: a reduction whose body reads another whole-tensor reduction waits for it.
  std::unordered_map<const Expr*, int> level;
  int max_level = 0;
  for (const Expr* g : globals) {  // Nodes() order: bodies before their users
    int l = 0;
    for (const Expr* n : Nodes(g->args[0]))
      if (level.count(n)) l = std::max(l, level[n] + 1);
    level[g] = l;
    max_level = std::max(max_level, l);
  }
  int64_t G = Varies(rmax) ? int64_t{4} * cfg_.sm_count
                           : std::clamp<int64_t>(CeilDiv(rmax, int64_t{kPartialBlock} * 4), 1,
                                                 int64_t{4} * cfg_.sm_count);
  if (G > 4) G = CeilDiv(G, 4) * 4;
  std::unordered_map<const Expr*, ExprPtr> replaced;
  RewriteRules swap;
  swap.node = [&](const ExprPtr& e) -> ExprPtr {
    auto it = replaced.find(e.get());
    return it == replaced.end() ? nullptr : it->second;
  };
  for (int l = 0; l <= max_level; ++l) {
    std::vector<ExprPtr> items;
    std::vector<int> vals, idxs;
    std::vector<const Expr*> originals;
    for (const Expr* g : globals) {
      if (level[g] != l) continue;
      ExprPtr self = pool_.Intern(Expr(*g));  // the canonical node itself
      items.push_back(Rewrite(self, swap, &pool_));
      bool arg = g->op == "argmax" || g->op == "argmin";
      bool boolean = g->op == "any" || g->op == "all";
      ir::DType vt =
          boolean ? ir::DType::kBool : ir::ComputeType(arg ? g->args[0]->dtype : g->dtype);
      vals.push_back(AddTemp(vt, {G}));
      idxs.push_back(arg ? AddTemp(ir::DType::kI64, {G}) : -1);
      originals.push_back(g);
    }
    Partials(items, vals, idxs, G, l);
    for (size_t j = 0; j < originals.size(); ++j) {
      ExprPtr pr = ReduceOverPartials(*originals[j], vals[j], G, {});
      partial_index_[pr.get()] = idxs[j];
      replaced[originals[j]] = pr;
    }
  }
  for (schedule::KernelOutput& o : kern_.outputs) o.value = Rewrite(o.value, swap, &pool_);
}

void KernelGen::Partials(const std::vector<ExprPtr>& items, const std::vector<int>& vals,
                         const std::vector<int>& idxs, int64_t G, int level) {
  std::unique_ptr<Fn> fn = NewFn();
  CudaEmitter& em = *fn->em;
  const int B = kPartialBlock;
  em.kt_var = em.NewVar(B, "kt");
  int kb = em.NewVar(G, "kb");
  em.threads_per_row = B;
  fn->head = {absl::StrCat("const ", cfg_.index_type, " kt = threadIdx.x;"),
              absl::StrCat("const ", cfg_.index_type, " kb = blockIdx.x;")};
  std::string strategy =
      absl::StrCat("whole-tensor partials, level ", level, ": ", G, " blocks of ", B);
  for (size_t j = 0; j < items.size(); ++j) {
    const Expr& g = *items[j];
    int64_t R = ReduceExtent(g, em.extents());
    int var = em.NewVar(R, absl::StrCat("e", em.extents().size()));
    std::vector<int> rv = g.rvars;
    RewriteRules flat;
    flat.affine = [&](const Affine& a) { return FlattenAffine(a, rv, var, em.extents()); };
    CoopReduce r;
    r.body = Rewrite(g.args[0], flat, &pool_);
    r.var = var;
    int V = PickV({r.body}, var, R, 0, fn->prog);
    int64_t S = CeilDiv(CeilDiv(R, G), V) * V;  // elements per block, a multiple of V
    std::string end = absl::StrCat("kend", j);
    r.split.extent = R;
    r.split.V = V;
    r.split.TR = B;
    r.split.Q = CeilDiv(S, int64_t{V} * B);
    r.split.unrolled = false;
    r.split.end = end;
    if (Varies(R)) {
      // S depends on R: block kb starts at V * kbq<j>, kbq<j> = ceil(R / (G V)) * kb, a
      // variable of its own so that the start stays a multiple of V in the affine algebra.
      const std::string sq = CeilDivText(R, G * V);
      const std::string kbq = absl::StrCat("kbq", j);
      int bq = em.NewVar(R, kbq);
      fn->head.push_back(absl::StrCat("const ", cfg_.index_type, " ", kbq, " = ", sq, " * kb;"));
      fn->head.push_back(absl::StrCat("const ", cfg_.index_type, " ", end, " = ", V, " * (", kbq,
                                      " + ", sq, ") < ", R, " ? ", V, " * (", kbq, " + ", sq,
                                      ") : ", R, ";"));
      r.split.base = lower::Scale(Affine::Var(bq), V);
      r.split.q_text = absl::StrCat("((", sq, " + ", B - 1, ") / ", B, ")");
    } else {
      fn->head.push_back(absl::StrCat("const ", cfg_.index_type, " ", end, " = ", S, " * kb + ", S,
                                      " < ", R, " ? ", S, " * kb + ", S, " : ", R, ";"));
      r.split.base = lower::Scale(Affine::Var(kb), S);
    }
    em.coop[items[j].get()] = r;
    absl::StrAppend(&strategy, j ? "," : "", " ", g.op, " of ", R, " (V=", V, ")");
  }
  RegisterPartialReductions(*fn, items, B);
  em.PushScope(-1);
  std::vector<std::string> stores;
  for (size_t j = 0; j < items.size(); ++j) {
    std::string name = em.Emit(items[j]);
    bool arg = idxs[j] >= 0;
    const Buffer& vb = fn->prog.buffers[vals[j]];
    stores.push_back(absl::StrCat("  ", BufferName(vb), "[kb] = ", arg ? name + "_v" : name, ";"));
    fn->written.push_back(vals[j]);
    if (arg) {
      stores.push_back(
          absl::StrCat("  ", BufferName(fn->prog.buffers[idxs[j]]), "[kb] = ", name, ";"));
      fn->written.push_back(idxs[j]);
    }
  }
  std::vector<std::string> body = em.PopScope();
  body.push_back("if (kt == 0) {");
  body.insert(body.end(), stores.begin(), stores.end());
  body.push_back("}");
  fns_.push_back(Finish(*fn, absl::StrCat(kern_.name, "_p", level), body, G, 1, B, strategy));
}

int KernelGen::AddTemp(ir::DType t, ir::Shape shape) {
  Buffer b;
  b.role = Buffer::Role::kTemp;
  b.index = static_cast<int>(
      std::count_if(unit_->buffers.begin(), unit_->buffers.end(),
                    [](const Buffer& o) { return o.role == Buffer::Role::kTemp; }));
  b.dtype = t;
  b.strides = lower::ContiguousStrides(shape);
  b.bytes = Product(shape, 0, shape.size()) * ir::DTypeSize(t);
  b.shape = std::move(shape);
  b.offset = CeilDiv(unit_->workspace_bytes, 256) * 256;
  unit_->workspace_bytes = b.offset + b.bytes;
  unit_->buffers.push_back(std::move(b));
  return static_cast<int>(unit_->buffers.size()) - 1;
}

ExprPtr KernelGen::ReduceOverPartials(const Expr& original, int buffer, int64_t G,
                                      std::vector<Affine> inner) {
  kern_.extents.push_back(G);
  const int pg = static_cast<int>(kern_.extents.size()) - 1;
  Expr ld;
  ld.kind = Expr::Kind::kLoad;
  ld.dtype = unit_->buffers[buffer].dtype;
  ld.buffer = buffer;
  ld.index = {Affine::Var(pg)};
  ld.index.insert(ld.index.end(), inner.begin(), inner.end());
  Expr red;
  red.kind = Expr::Kind::kReduce;
  red.dtype = original.dtype;
  red.op = original.op;
  red.args = {pool_.Intern(std::move(ld))};
  red.rvars = {pg};
  return pool_.Intern(std::move(red));
}

// ---- Column reductions: chunks of the range -> partials per output in the workspace.
//
// A column tile gives each block 32 outputs, so N outputs make N / 32 blocks however long the
// reduced range is: the bias gradients of a [8192, 768] activation are 24 blocks on a device of
// 132 SMs, each walking 8192 rows. Here the range is cut into G chunks (block b takes columns
// b % (N / 32) and chunk b / (N / 32)), each block leaves one partial per output in a [G, N]
// workspace buffer, and the kernel itself reduces an output's G partials in one thread. This is
// the split a reduction over a non-contiguous axis needs on a GPU (Inductor splits such
// reductions too); the partials cost G * N elements of traffic, small beside the range.
int64_t KernelGen::SplitColumns(int y) {
  const int rank = static_cast<int>(loops_.size());
  const int64_t N = Product(loops_, 0, rank);
  if (Varies(N) || N <= 0) return 0;
  const int64_t cols = CeilDiv(N, 32);
  // Enough blocks of 32 * y threads for every SM to hold a few (a 1024-thread block fills half
  // of an SM), and at least this many rows per thread of a chunk, so a partial is worth its store.
  constexpr int64_t kBlocksPerSm = 8;
  constexpr int64_t kMinRowsPerThread = 8;
  // The final kernel reduces an output's partials with 32 y-groups (a few loads per thread), and
  // a later level's threads each sum an earlier level's partials: 128 keeps both short, and gives
  // a few columns (a [1M, 3] sum: 1 column block) enough blocks to fill the device.
  constexpr int64_t kMaxChunks = 128;
  if (cols >= kBlocksPerSm * cfg_.sm_count / 2) return 0;
  // Reductions over partials made at an earlier level: cheap (G loads per thread), so a body
  // reading them may be split.
  std::set<const Expr*> over_partials;
  int64_t G = 0;
  for (int level = 0;; ++level) {
    FreeVarMap fv;
    std::vector<ExprPtr> items;
    int64_t r_min = 0;
    bool deferred = false;
    for (const auto& o : kern_.outputs) {
      AddFreeVars(o.value, &fv);
      for (const Expr* n : Nodes(o.value)) {
        if (n->kind != Expr::Kind::kReduce || over_partials.count(n)) continue;
        if (partial_index_.count(n))
          return G;  // whole-tensor partials read here: keep to one scheme
        const std::vector<int>& vs = fv.at(n);
        if (vs.empty() || vs.back() >= rank)
          continue;  // nested in another reduction: runs in its loop
        if (n->op == "argmax" || n->op == "argmin") return G;
        ExprPtr self = pool_.Intern(Expr(*n));
        if (std::find(items.begin(), items.end(), self) != items.end()) continue;
        // A reduction whose body reads another column reduction not yet split waits for a
        // later level (run in this launch, the inner one would be reduced per chunk).
        bool waits = false;
        for (const Expr* m : Nodes(n->args[0]))
          waits = waits || (m->kind == Expr::Kind::kReduce && !over_partials.count(m) &&
                            fv.count(m) && !fv.at(m).empty() && fv.at(m).back() < rank);
        if (waits) {
          deferred = true;
          continue;
        }
        // A range that varies with the sizes is taken to be long (as SplitGlobals does): its
        // chunks are ceil(R / G) long at run time, and empty past a short range's end.
        const int64_t R = ReduceExtent(*n, kern_.extents);
        if (!Varies(R)) r_min = r_min == 0 ? R : std::min(r_min, R);
        items.push_back(std::move(self));
      }
    }
    if (items.empty()) return G;
    if (level == 0) {
      G = std::min(CeilDiv(kBlocksPerSm * cfg_.sm_count, cols), kMaxChunks);
      if (r_min > 0) G = std::min(G, r_min / (kMinRowsPerThread * y));
      if (G < 2) return 0;
    }
    // Partials [G, outputs...]: chunk g of output i at g * N + i, i the output's flat index.
    ir::Shape shape = {G};
    shape.insert(shape.end(), loops_.begin(), loops_.end());
    std::vector<int> vals;
    for (const ExprPtr& item : items)
      vals.push_back(AddTemp(
          item->op == "any" || item->op == "all" ? ir::DType::kBool : ir::ComputeType(item->dtype),
          shape));
    ColumnPartials(items, vals, G, y, level);
    // The reductions become reductions over their G partials.
    std::vector<Affine> at;
    for (int d = 0; d < rank; ++d) at.push_back(Affine::Var(d));
    std::unordered_map<const Expr*, ExprPtr> replaced;
    for (size_t j = 0; j < items.size(); ++j) {
      replaced[items[j].get()] = ReduceOverPartials(*items[j], vals[j], G, at);
      over_partials.insert(replaced[items[j].get()].get());
    }
    RewriteRules swap;
    swap.node = [&](const ExprPtr& e) -> ExprPtr {
      auto it = replaced.find(e.get());
      return it == replaced.end() ? nullptr : it->second;
    };
    for (schedule::KernelOutput& o : kern_.outputs) o.value = Rewrite(o.value, swap, &pool_);
    if (!deferred) return G;
  }
}

}  // namespace internal

absl::StatusOr<std::vector<KernelFunction>> GenerateKernel(schedule::Program* unit, int index,
                                                           const KernelConfig& config) {
  internal::KernelGen gen(unit, index, config);
  return gen.Run();
}

}  // namespace kiln::codegen::cuda
