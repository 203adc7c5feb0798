// The CUDA kernel strategies: pointwise, row, column tile, and a split column reduction's
// partials (see cuda_kernel.h for when each is chosen). Each builds one function: thread
// indices and bounds first (Fn::head), then the emitter's scopes, outermost first, as
// straight-line code.
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/codegen/c_expr.h"
#include "kernels/codegen/cuda/kernel_gen.h"
#include "kernels/lower/lower.h"

namespace kiln::codegen::cuda::internal {
namespace {

// Every variable bound by a reduction in `trees`: never available to hoisted vector loads.
void AddReductionVars(const std::vector<ExprPtr>& trees, CudaEmitter* em) {
  for (const ExprPtr& t : trees)
    for (const Expr* n : Nodes(t))
      for (int rv : n->rvars) em->rvars.insert(rv);
}

int64_t WidestOutput(const schedule::Program& p, const schedule::Kernel& k) {
  int64_t w = 1;
  for (const auto& o : k.outputs) w = std::max(w, ir::DTypeSize(p.buffers[o.buffer].dtype));
  return w;
}

// Stores the lane values `vals` of an output at flat index `at` (lane 0), one vector store
// when there are several.
void StoreLanes(CudaEmitter& em, const std::string& bname, const Buffer& b,
                const std::vector<std::string>& vals, const std::string& at,
                const std::string& guard, int* counter,
                const std::function<std::string(const std::string&)>& conv,
                const std::string& count = "") {
  std::string pre = guard.empty() ? "" : absl::StrCat("if (", guard, ") ");
  if (vals.size() == 1) {
    em.AddStatement(absl::StrCat(pre, bname, "[", at, "] = ", conv(vals[0]), ";"));
    return;
  }
  std::vector<std::string> conv_vals;
  for (const std::string& v : vals) conv_vals.push_back(conv(v));
  std::string arr = absl::StrCat("ko", (*counter)++);
  em.AddStatement(absl::StrCat("__align__(16) ", StorageType(b.dtype, true), " ", arr, "[",
                               vals.size(), "] = {", absl::StrJoin(conv_vals, ", "), "};"));
  if (!count.empty()) {  // the last vector of a ragged range: only `count` elements are left
    em.AddStatement(absl::StrCat(pre, "kiln_vstore_n<", vals.size(), ">(", bname, " + (", at, "), ",
                                 arr, ", ", count, ");"));
    return;
  }
  em.AddStatement(
      absl::StrCat(pre, "kiln_vstore<", vals.size(), ">(", bname, " + (", at, "), ", arr, ");"));
}

// Pops `n` scopes; returns their statements, outermost scope first.
std::vector<std::vector<std::string>> PopScopes(CudaEmitter& em, size_t n) {
  std::vector<std::vector<std::string>> parts(n);
  for (size_t i = n; i-- > 0;) parts[i] = em.PopScope();
  return parts;
}

void Append(std::vector<std::string>* out, const std::vector<std::string>& lines,
            const std::string& pad = "") {
  for (const std::string& l : lines) out->push_back(pad + l);
}

// Reductions whose free variables all lie in `allowed` (output variables), found in `trees`
// and, transitively, in the bodies `body_of` gives for them.
std::vector<const Expr*> FindReductions(const std::vector<ExprPtr>& trees,
                                        const std::set<int>& allowed, bool allow_empty,
                                        const std::unordered_map<const Expr*, int>& skip,
                                        const std::function<ExprPtr(const Expr*)>& body_of) {
  std::vector<const Expr*> found;
  std::vector<ExprPtr> work = trees;
  FreeVarMap fv;
  while (!work.empty()) {
    ExprPtr t = work.back();
    work.pop_back();
    AddFreeVars(t, &fv);
    for (const Expr* n : Nodes(t)) {
      if (n->kind != Expr::Kind::kReduce || skip.count(n)) continue;
      if (std::find(found.begin(), found.end(), n) != found.end()) continue;
      const std::vector<int>& vs = fv.at(n);
      if (vs.empty() && !allow_empty) continue;
      bool inside = true;
      for (int v : vs) inside &= allowed.count(v) > 0;
      if (!inside) continue;
      found.push_back(n);
      work.push_back(body_of(n));
    }
  }
  return found;
}

// Whether a load in `trees` walks memory along flat variable `var` (unit stride, no atoms).
bool StreamsAlong(const std::vector<ExprPtr>& trees, int var, const schedule::Program& prog) {
  if (var < 0) return false;
  for (const ExprPtr& t : trees)
    for (const Expr* n : Nodes(t)) {
      if (n->kind != Expr::Kind::kLoad) continue;
      const Buffer& b = prog.buffers[n->buffer];
      Affine addr = FlatAddress(b, n->index);
      if (Coefficient(addr, var) == 1 && !UsesVarInAtom(addr, var)) return true;
    }
  return false;
}

}  // namespace

// One thread per vector of V outputs along the innermost dimension.
void KernelGen::Pointwise() {
  std::unique_ptr<Fn> fn = NewFn();
  CudaEmitter& em = *fn->em;
  const int rank = static_cast<int>(loops_.size());
  const int x = rank - 1;
  const int64_t C = loops_[x];
  const int64_t N = Product(loops_, 0, rank);
  std::vector<ExprPtr> trees;
  for (const auto& o : kern_.outputs) trees.push_back(o.value);
  // The vector width from the loads too that concatenated pieces make along x (unclamped in
  // their branches, below).
  std::vector<Concat> concats;
  std::vector<ExprPtr> widths = trees;
  for (const ExprPtr& t : trees) {
    concats.push_back(ConcatPieces(t, loops_, &pool_));
    for (const Piece& piece : concats.back().pieces) widths.push_back(piece.value);
  }
  int V = PickV(widths, x, C, WidestOutput(fn->prog, kern_), fn->prog);
  // A flat range whose length varies with the sizes: vectors whatever the length, the last
  // one partial. Vector loads along it read only the elements left (kiln_vload_n), scalar
  // ones (strided, inside reductions) read at lanes clamped to the last element
  // (LaneGroup::MakeRagged), and kiln_vstore_n stores only the elements left, so any tree
  // qualifies. Only a rank-1 range: along an inner dimension of varying length the rows'
  // starts need not be aligned for vectors.
  std::string ragged;
  if (rank == 1 && Varies(C) && V == 1) {
    const int W = PickV(trees, x, int64_t{1} << 30, WidestOutput(fn->prog, kern_), fn->prog);
    if (W > 1) {
      V = W;
      ragged = absl::StrCat(C, " - ", V, " * kv");
    }
  }
  const int64_t NV = ragged.empty() ? N / V : CeilDiv(N, V);
  const std::string nv_text = ragged.empty() ? absl::StrCat(NV) : CeilDivText(N, V);
  int B = cfg_.pointwise_block;
  if (NV < B && !Varies(NV)) B = static_cast<int>(std::max<int64_t>(32, Pow2Ceil(NV)));
  em.kt_var = em.NewVar(B, "kt");
  em.threads_per_row = B;
  int xq = em.NewVar(NV / Product(loops_, 0, rank - 1), "ixq");
  RegisterPartialReductions(*fn, trees, B);
  AddReductionVars(trees, &em);

  em.PushScope(-1);
  std::vector<int> vars;
  for (int d = 0; d < rank - 1; ++d) {
    em.PushScope(d);
    vars.push_back(d);
  }
  em.PushScope(xq);
  vars.push_back(xq);
  CudaEmitter::LaneGroup g(&em, x, lower::Scale(Affine::Var(xq), V), V, xq, -1);
  // Lane 0 of a thread that runs lies inside the range (kv < nv); the others may not.
  std::vector<int> lane_vars;
  if (!ragged.empty()) lane_vars = g.MakeRagged(absl::StrCat(C), ragged);
  for (int v : lane_vars) em.PushScope(v);
  std::vector<std::vector<std::string>> vals(trees.size());
  // An output that concatenates pieces along an output variable, where no vector straddles
  // two pieces: an if/else chain computes only the piece the vector lies in. As one expression
  // each thread would compute, and load, every piece's value and keep one.
  int counter = 0;
  std::vector<bool> branched(trees.size(), false);
  for (size_t j = 0; j < trees.size() && ragged.empty(); ++j) {
    const std::vector<Piece>& pieces = concats[j].pieces;
    const int var = concats[j].var;
    if (pieces.empty() || concats[j].Splits(x, V) ||
        (var != x && std::find(vars.begin(), vars.end(), var) == vars.end()))
      continue;
    const std::string at =
        var == x ? em.Text(lower::Scale(Affine::Var(xq), V)) : em.var_names()[var];
    const std::string arr = absl::StrCat("kb", counter++);
    em.AddStatement(absl::StrCat(ComputeTypeName(trees[j]->dtype), " ", arr, "[", V, "];"));
    std::vector<std::string> chain;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const ExprPtr& value = pieces[k].value;
      em.PushScope(xq);  // the piece's own scope: what it computes stays inside its branch
      CudaEmitter::LaneGroup gk(&em, x, lower::Scale(Affine::Var(xq), V), V, xq, -1);
      for (int u = 0; u < V; ++u)
        em.AddStatement(absl::StrCat(arr, "[", u, "] = ", em.Emit(gk.Lane(value, u)), ";"));
      std::vector<std::string> stmts = em.PopScope();
      const bool last = k + 1 == pieces.size();
      chain.push_back(k == 0 ? absl::StrCat("if (", at, " < ", pieces[k].hi, ") {")
                      : last ? "} else {"
                             : absl::StrCat("} else if (", at, " < ", pieces[k].hi, ") {"));
      Append(&chain, gk.fills(), "  ");
      Append(&chain, stmts, "  ");
    }
    chain.push_back("}");
    for (std::string& l : chain) em.AddStatement(std::move(l));
    for (int u = 0; u < V; ++u) vals[j].push_back(absl::StrCat(arr, "[", u, "]"));
    branched[j] = true;
  }
  for (int u = 0; u < V; ++u)
    for (size_t j = 0; j < trees.size(); ++j)
      if (!branched[j]) vals[j].push_back(em.Emit(g.Lane(trees[j], u)));
  for (size_t j = 0; j < trees.size(); ++j) {
    const Buffer& b = fn->prog.buffers[kern_.outputs[j].buffer];
    fn->written.push_back(kern_.outputs[j].buffer);
    StoreLanes(
        em, BufferName(b), b, vals[j], V == 1 ? "kv" : absl::StrCat(V, " * kv"), "", &counter,
        [&](const std::string& v) { return StoreText(b, v); }, ragged);
  }
  auto parts = PopScopes(em, vars.size() + 1 + lane_vars.size());
  if (!em.coop.empty())
    fn->head.push_back(absl::StrCat("const ", cfg_.index_type, " kt = threadIdx.x;"));
  // The prologue runs in every thread of the block: it may hold block-wide reductions.
  std::vector<std::string> body = parts[0];
  body.push_back(
      absl::StrCat("const ", cfg_.index_type, " kv = blockIdx.x * ", B, " + threadIdx.x;"));
  body.push_back(absl::StrCat("if (kv < ", nv_text, ") {"));
  Append(&body, DefineVars(*fn, vars, "kv"), "  ");
  Append(&body, g.fills(), "  ");
  for (size_t i = 1; i < parts.size(); ++i) Append(&body, parts[i], "  ");
  body.push_back("}");
  std::string strategy = absl::StrCat("pointwise: ", NV, " threads x ", V, " element(s)",
                                      ragged.empty() ? "" : " (the last partial)", ", block ", B);
  if (ragged.empty())
    fns_.push_back(Finish(*fn, kern_.name, body, NV, B, B, strategy));
  else  // ceil(N / (V B)) blocks, which is ceil(ceil(N / V) / B), with N the generalised number
    fns_.push_back(Finish(*fn, kern_.name, body, N, int64_t{V} * B, B, strategy));
}

// TR threads per outer index (a row of L elements, flattened); reductions over the row are
// cooperative; short rows pack several rows into a block. Rows of varying length that are
// many get a kernel per band of lengths (kVaryingRowBands), chosen at launch.
void KernelGen::Row(int p) {
  int64_t rows = 0, work = 0;
  KernelFunction one = RowFn(p, 0, kern_.name, &rows, &work);
  if (!Varies(work) || !(Varies(rows) || rows >= int64_t{4} * cfg_.sm_count)) {
    fns_.push_back(std::move(one));
    return;
  }
  int64_t lo = 0;
  for (const RowBand& band : kVaryingRowBands) {
    const std::string name = absl::StrCat(kern_.name, "_t", band.threads);
    KernelFunction f = RowFn(p, band.threads, name, &rows, &work);
    // Rows whose length is a multiple of the vector width (and so start aligned) read and
    // write them in vectors: a second body in the same function, chosen by that test.
    std::string aligned_if;
    KernelFunction v = RowFn(p, band.threads, name + "_v", &rows, &work, true, &aligned_if);
    if (!aligned_if.empty() && v.params == f.params && v.block == f.block &&
        v.grid_per_block == f.grid_per_block)
      f = AlignedOr(v, f, aligned_if, name);
    f.guard_value = work;
    f.guard_min = lo;
    f.guard_max = band.max_length;
    absl::StrAppend(&f.strategy, "; runs for rows of ", lo,
                    band.max_length ? absl::StrCat("..", band.max_length) : "+");
    fns_.push_back(std::move(f));
    lo = band.max_length + 1;
  }
}

// One function `name` running `aligned`'s body where `condition` holds and `general`'s
// elsewhere (the same launch shape and parameters): each body becomes a device function.
KernelFunction KernelGen::AlignedOr(const KernelFunction& aligned, const KernelFunction& general,
                                    const std::string& condition, const std::string& name) {
  auto as_device = [](const KernelFunction& f, const std::string& device_name) {
    const std::string head = absl::StrCat("__launch_bounds__(", f.block, ") ", f.name, "(");
    const size_t at = f.text.find(head);
    return absl::StrCat("static __device__ __forceinline__ void ", device_name, "(",
                        f.text.substr(at + head.size()));
  };
  std::vector<std::string> args;
  for (const std::string& p : general.params) args.push_back(p.substr(p.find_last_of(' ') + 1));
  const std::string call = absl::StrCat("(", absl::StrJoin(args, ", "), ");");
  KernelFunction f = general;
  f.name = name;
  f.text = absl::StrCat(as_device(aligned, name + "_v"), as_device(general, name + "_g"),
                        "extern \"C\" __global__ void __launch_bounds__(", general.block, ") ",
                        name, "(", absl::StrJoin(general.params, ", "), ") {\n  if (", condition,
                        ") ", name, "_v", call, "\n  else ", name, "_g", call, "\n}\n");
  f.strategy = absl::StrCat(general.strategy, "; where ", condition, ": ",
                            aligned.strategy.substr(aligned.strategy.find(", ") + 2));
  return f;
}

KernelFunction KernelGen::RowFn(int p, int64_t threads, const std::string& name, int64_t* rows_out,
                                int64_t* work_out, bool aligned, std::string* aligned_if) {
  std::unique_ptr<Fn> fn = NewFn();
  std::optional<AssumedMultiples> assumed;
  if (aligned) assumed.emplace();
  CudaEmitter& em = *fn->em;
  const int rank = static_cast<int>(loops_.size());
  const int64_t rows = Product(loops_, 0, p + 1);
  const int64_t L = Product(loops_, p + 1, rank);
  std::vector<int> outer, row_vars;
  for (int d = 0; d <= p; ++d) outer.push_back(d);
  for (int d = p + 1; d < rank; ++d) row_vars.push_back(d);
  std::vector<ExprPtr> trees;
  for (const auto& o : kern_.outputs) trees.push_back(o.value);
  int E = -1;
  if (L > 1) {
    E = em.NewVar(L, absl::StrCat("e", em.extents().size()));
    RewriteRules flat;
    flat.affine = [&](const Affine& a) { return FlattenAffine(a, row_vars, E, em.extents()); };
    for (ExprPtr& t : trees) t = Rewrite(t, flat, &pool_);
  }

  // Cooperative reductions: those reading only outer variables. A reduction over exactly a
  // row shares the row's flat variable, so its loads and the outputs' can be matched.
  std::set<int> allowed(outer.begin(), outer.end());
  std::unordered_map<const Expr*, CoopReduce> found;
  auto body_of = [&](const Expr* n) {
    int64_t R = ReduceExtent(*n, em.extents());
    CoopReduce r;
    r.var = (E >= 0 && R == L) ? E : em.NewVar(R, absl::StrCat("e", em.extents().size()));
    std::vector<int> rv = n->rvars;
    int var = r.var;
    RewriteRules flat;
    flat.affine = [&](const Affine& a) { return FlattenAffine(a, rv, var, em.extents()); };
    r.body = Rewrite(n->args[0], flat, &pool_);
    r.split.extent = R;
    found[n] = r;
    return r.body;
  };
  std::vector<const Expr*> coops = FindReductions(trees, allowed, p < 0, partial_index_, body_of);

  // Threads per row from the longest range a row walks.
  int64_t work = L;
  for (const Expr* n : coops) work = std::max(work, found[n].split.extent);
  if (rows == 1)  // the block has nothing else to do: spread the partials too
    for (const ExprPtr& t : trees)
      for (const Expr* n : Nodes(t))
        if (partial_index_.count(n)) work = std::max(work, em.extents()[n->rvars[0]]);
  int64_t TR =
      std::clamp<int64_t>(Pow2Ceil(CeilDiv(work, kRowElementsPerThread)), rows == 1 ? 32 : 1, 1024);
  // A row whose length varies with the sizes: four warps walk it in a loop when the rows vary
  // too (many rows: each block short), a whole block when they are few and fixed.
  const bool varying_row = Varies(work);
  if (varying_row)
    TR = threads > 0                                          ? threads
         : Varies(rows) || rows >= int64_t{4} * cfg_.sm_count ? kVaryingRowThreads
                                                              : 1024;
  *rows_out = rows;
  *work_out = work;
  // Rows that stream no memory of their own along the row (an outer product reduced, every
  // element a product of re-read operands) are bound by arithmetic and by the combine, not by
  // loads in flight: when the rows alone fill the GPU, a few warps per row with more elements
  // each finish sooner than a block-wide tree.
  std::vector<ExprPtr> row_bodies = trees;
  for (const Expr* n : coops) row_bodies.push_back(found[n].body);
  if (!varying_row && rows >= int64_t{4} * cfg_.sm_count &&
      !StreamsAlong(row_bodies, E, fn->prog) &&
      std::none_of(coops.begin(), coops.end(), [&](const Expr* n) {
        return StreamsAlong({found[n].body}, found[n].var, fn->prog);
      }))
    TR = std::min(TR, std::max<int64_t>(32, Pow2Ceil(CeilDiv(work, kComputeRowElementsPerThread))));
  if (cfg_.row_threads_shift > 0) TR = std::min<int64_t>(TR << cfg_.row_threads_shift, 1024);
  if (cfg_.row_threads_shift < 0)
    TR = std::max<int64_t>(TR >> -cfg_.row_threads_shift, rows == 1 ? 32 : 1);
  const int64_t RPB = TR <= 32 && rows > 1 ? 128 / TR : 1;
  const int64_t block = TR * RPB;
  em.kt_var = em.NewVar(TR, "kt");
  em.threads_per_row = static_cast<int>(TR);

  RowSplit row;
  row.extent = L;
  if (L > 1) {
    std::vector<ExprPtr> shared = trees;
    for (const Expr* n : coops)
      if (found[n].var == E) shared.push_back(found[n].body);
    row.V = PickV(shared, E, L, WidestOutput(fn->prog, kern_), fn->prog);
  }
  row.TR = static_cast<int>(TR);
  row.Q = CeilDiv(L, row.V * TR);
  row.unrolled = row.Q <= kMaxUnrolledVectors && row.Q * row.V <= kMaxUnrolledElements;
  if (Varies(L)) {
    // A row of varying length: the first kVaryingRowVectors elements of each thread are
    // unrolled (and cached in registers when reused), the rest of a longer row loops. The
    // aligned variant reads them in vectors (its length a multiple of the width, checked at
    // launch: the outputs' row stride is the length).
    if (aligned && L > 1) {
      std::vector<ExprPtr> shared = trees;
      for (const Expr* n : coops)
        if (found[n].var == E) shared.push_back(found[n].body);
      row.V = PickV(shared, E, int64_t{1} << 30, WidestOutput(fn->prog, kern_), fn->prog);
      if (row.V > 1) assumed->Record(L, row.V);
    }
    row.Q = std::max<int64_t>(1, kVaryingRowVectors / row.V);
    row.unrolled = true;
    row.tail = true;
    row.q_text = CeilDivText(L, row.V * TR);
  }

  // The row cache: loads of the row that two or more users (the outputs, each reduction over
  // the row) read, while the registers last.
  RowCache cache;
  cache.var = E;
  std::vector<std::string> cached_names;
  if (L > 1 && row.unrolled) {
    std::map<std::string, std::pair<std::set<int>, const Expr*>> users;
    auto scan = [&](const ExprPtr& t, int user) {
      for (const Expr* n : Nodes(t)) {
        if (n->kind != Expr::Kind::kLoad) continue;
        const Buffer& b = fn->prog.buffers[n->buffer];
        if (b.role == Buffer::Role::kConst || b.index < 0) continue;
        Affine addr = FlatAddress(b, n->index);
        if (!addr.Uses(E)) continue;
        bool ok = true;
        for (int v : VarsOf(addr)) ok &= v == E || allowed.count(v);
        if (!ok) continue;
        auto& u = users[LoadKey(n->buffer, addr)];
        u.first.insert(user);
        u.second = n;
      }
    };
    for (const ExprPtr& t : trees) scan(t, 0);
    for (size_t i = 0; i < coops.size(); ++i)
      if (found[coops[i]].var == E) scan(found[coops[i]].body, static_cast<int>(i) + 1);
    int64_t words = 0;
    for (auto& [key, u] : users) {
      if (u.first.size() < 2) continue;
      const Buffer b =
          fn->prog.buffers[u.second->buffer];  // a copy: AddRegisterArray grows buffers
      int64_t w = row.Q * row.V * std::max<int64_t>(1, ir::DTypeSize(b.dtype) / 4);
      if (words + w > kCacheBudgetWords) continue;
      words += w;
      RowCache::Entry e;
      e.name = absl::StrCat("kc", cache.entries.size());
      e.buffer = u.second->buffer;
      e.addr = FlatAddress(b, u.second->index);
      e.dtype = b.dtype;
      e.reg_buffer = em.AddRegisterArray(b.dtype, row.Q * row.V, e.name);
      cache.entries[key] = e;
      cached_names.push_back(BufferName(b));
    }
  }
  if (!cache.entries.empty()) em.cache = &cache;

  for (const Expr* n : coops) {
    CoopReduce& r = found[n];
    if (r.var == E) {
      r.split = row;
      r.use_cache = !cache.entries.empty();
    } else {
      r.split.V = PickV({r.body}, r.var, r.split.extent, 0, fn->prog);
      r.split.TR = static_cast<int>(TR);
      r.split.Q = CeilDiv(r.split.extent, r.split.V * TR);
      r.split.unrolled = r.split.Q <= kMaxUnrolledVectors &&
                         r.split.Q * r.split.V <= kMaxUnrolledElements && !Varies(r.split.extent);
      if (Varies(r.split.extent)) r.split.q_text = CeilDivText(r.split.extent, r.split.V * TR);
    }
    em.coop[n] = r;
  }
  RegisterPartialReductions(*fn, trees, static_cast<int>(TR));
  AddReductionVars(trees, &em);
  for (const Expr* n : coops) AddReductionVars({found[n].body}, &em);

  // Thread and row indices. Rows past the end (a partly filled last block) compute a copy of
  // the last row, so every thread takes part in the shuffles, and store nothing.
  const std::string& it = cfg_.index_type;
  fn->head.push_back(RPB == 1 ? absl::StrCat("const ", it, " kt = threadIdx.x;")
                              : absl::StrCat("const ", it, " kt = threadIdx.x % ", TR, ";"));
  std::string kr_raw =
      RPB == 1 ? "blockIdx.x" : absl::StrCat("blockIdx.x * ", RPB, " + threadIdx.x / ", TR);
  std::string row_ok;
  if (ir::StaticFactor(rows) % RPB == 0) {
    fn->head.push_back(absl::StrCat("const ", it, " kr = ", kr_raw, ";"));
  } else {
    fn->head.push_back(absl::StrCat("const ", it, " kr_raw = ", kr_raw, ";"));
    fn->head.push_back(absl::StrCat("const bool kr_ok = kr_raw < ", rows, ";"));
    fn->head.push_back(absl::StrCat("const ", it, " kr = kr_ok ? kr_raw : ", rows - 1, ";"));
    row_ok = "kr_ok";
  }
  for (const std::string& l : DefineVars(*fn, outer, "kr")) fn->head.push_back(l);
  for (const auto& [key, e] : cache.entries) {
    std::string t = StorageType(e.dtype, true);
    const std::string bname = BufferName(fn->prog.buffers[e.buffer]);
    fn->head.push_back(absl::StrCat("__align__(16) ", t, " ", e.name, "[", row.Q * row.V, "];"));
    bool vec = row.V > 1 && VectorContiguous(e.addr, E, row.V);
    for (int64_t q = 0; q < row.Q; ++q) {
      Affine first = lower::AddConst(lower::Scale(Affine::Var(em.kt_var), row.V), row.V * TR * q);
      std::string e0 = em.Text(first);
      std::vector<std::string> load, zero;
      if (vec) {
        load.push_back(
            absl::StrCat("kiln_vload<", row.V, ">(", e.name, " + ", q * row.V, ", ", bname, " + (",
                         em.Text(lower::Substitute(e.addr, E, first, em.extents())), "));"));
      }
      for (int u = 0; u < row.V; ++u) {
        std::string at =
            em.Text(lower::Substitute(e.addr, E, lower::AddConst(first, u), em.extents()));
        if (!vec)
          load.push_back(absl::StrCat(e.name, "[", q * row.V + u, "] = ", bname, "[", at, "];"));
        zero.push_back(absl::StrCat(e.name, "[", q * row.V + u, "] = ", t, "();"));
      }
      if (row.V * TR * (q + 1) <= L && !row.tail) {
        Append(&fn->head, load);
      } else {
        fn->head.push_back(absl::StrCat("if (", e0, " < ", L, ") {"));
        Append(&fn->head, load, "  ");
        fn->head.push_back("} else {");
        Append(&fn->head, zero, "  ");
        fn->head.push_back("}");
      }
    }
  }

  em.PushScope(-1);
  for (int d : outer) em.PushScope(d);
  int counter = 0;
  if (L > 1) {
    std::vector<std::vector<std::string>> vals(trees.size());
    em.EmitRowLoop(
        row, E, !cache.entries.empty(), row_ok,
        [&](CudaEmitter::LaneGroup& g, int u) {
          if (u == 0)
            for (auto& v : vals) v.clear();
          for (size_t j = 0; j < trees.size(); ++j) vals[j].push_back(em.Emit(g.Lane(trees[j], u)));
        },
        [&](CudaEmitter::LaneGroup&, const std::string& e0) {
          for (size_t j = 0; j < trees.size(); ++j) {
            const Buffer& b = fn->prog.buffers[kern_.outputs[j].buffer];
            StoreLanes(em, BufferName(b), b, vals[j], absl::StrCat(L, " * kr + ", e0), "", &counter,
                       [&](const std::string& v) { return StoreText(b, v); });
          }
        });
  } else {
    std::string guard = row_ok.empty() ? "kt == 0" : absl::StrCat("kt == 0 && ", row_ok);
    for (size_t j = 0; j < trees.size(); ++j) {
      std::string v = em.Emit(trees[j]);  // first: emitting may add register arrays to buffers
      const Buffer& b = fn->prog.buffers[kern_.outputs[j].buffer];
      StoreLanes(em, BufferName(b), b, {v}, "kr", guard, &counter,
                 [&](const std::string& s) { return StoreText(b, s); });
    }
  }
  for (const auto& o : kern_.outputs) fn->written.push_back(o.buffer);
  std::vector<std::string> body;
  for (auto& part : PopScopes(em, outer.size() + 1)) Append(&body, part);
  std::string strategy = absl::StrCat(
      "row: ", rows, " row(s) of ", L, ", ", TR, " thread(s) per row, ", RPB, " row(s) per block, ",
      row.Q, " x ", row.V, " element(s) per thread", row.unrolled ? "" : " (looped)", ", ",
      coops.size(), " cooperative reduction(s)");
  if (!cached_names.empty())
    absl::StrAppend(&strategy, ", registers hold ", absl::StrJoin(cached_names, " "));
  if (aligned_if != nullptr) *aligned_if = row.V > 1 ? assumed->Condition() : "";
  return Finish(*fn, name, body, rows, RPB, static_cast<int>(block), strategy);
}

namespace {

// A reduction `n` of a column tile of `y` y-groups, its body flattened onto the range's
// variable `var`.
CoopReduce ColumnReduce(const Expr& n, int var, int y, CudaEmitter& em, ExprPool* pool) {
  CoopReduce r;
  r.var = var;
  std::vector<int> rv = n.rvars;
  RewriteRules flat;
  flat.affine = [&](const Affine& a) { return FlattenAffine(a, rv, var, em.extents()); };
  r.body = Rewrite(n.args[0], flat, pool);
  r.y_groups = y;
  return r;
}

}  // namespace

void KernelGen::ColumnHead(Fn& fn, int y, const std::string& column_block) {
  CudaEmitter& em = *fn.em;
  const int rank = static_cast<int>(loops_.size());
  const int64_t N = Product(loops_, 0, rank);
  em.kt_var = em.NewVar(32 * y, "kt");
  em.ky_var = em.NewVar(y, "ky");
  em.threads_per_row = 32 * y;
  const std::string& it = cfg_.index_type;
  fn.head.push_back(absl::StrCat("const ", it, " kt = threadIdx.x;"));
  fn.head.push_back(absl::StrCat("const ", it, " ky = threadIdx.x >> 5;"));
  fn.head.push_back(
      absl::StrCat("const ", it, " kc_raw = ", column_block, " * 32 + (threadIdx.x & 31);"));
  fn.head.push_back(absl::StrCat("const bool kc_ok = kc_raw < ", N, ";"));
  fn.head.push_back(absl::StrCat("const ", it, " kc = kc_ok ? kc_raw : ", N - 1, ";"));
  std::vector<int> vars;
  for (int d = 0; d < rank; ++d) vars.push_back(d);
  for (const std::string& l : DefineVars(fn, vars, "kc")) fn.head.push_back(l);
}

// 32 outputs per block; the y-groups of the block split each reduction's range and combine
// in shared memory.
void KernelGen::ColumnTile(int y) {
  std::unique_ptr<Fn> fn = NewFn();
  CudaEmitter& em = *fn->em;
  const int rank = static_cast<int>(loops_.size());
  const int64_t N = Product(loops_, 0, rank);
  const int block = 32 * y;
  std::vector<ExprPtr> trees;
  for (const auto& o : kern_.outputs) trees.push_back(o.value);
  ColumnHead(*fn, y, "blockIdx.x");
  std::vector<int> vars;
  for (int d = 0; d < rank; ++d) vars.push_back(d);
  std::set<int> allowed(vars.begin(), vars.end());
  std::unordered_map<const Expr*, CoopReduce> found;
  auto body_of = [&](const Expr* n) {
    const int var =
        em.NewVar(ReduceExtent(*n, em.extents()), absl::StrCat("e", em.extents().size()));
    found[n] = ColumnReduce(*n, var, y, em, &pool_);
    return found[n].body;
  };
  std::vector<const Expr*> coops = FindReductions(trees, allowed, false, partial_index_, body_of);
  for (const Expr* n : coops) em.coop[n] = found[n];
  RegisterPartialReductions(*fn, trees, block);
  AddReductionVars(trees, &em);

  em.PushScope(-1);
  for (int d : vars) em.PushScope(d);
  int counter = 0;
  for (size_t j = 0; j < trees.size(); ++j) {
    std::string v = em.Emit(trees[j]);  // first: emitting may add register arrays to buffers
    const Buffer& b = fn->prog.buffers[kern_.outputs[j].buffer];
    fn->written.push_back(kern_.outputs[j].buffer);
    StoreLanes(em, BufferName(b), b, {v}, "kc", "ky == 0 && kc_ok", &counter,
               [&](const std::string& s) { return StoreText(b, s); });
  }
  std::vector<std::string> body;
  for (auto& part : PopScopes(em, vars.size() + 1)) Append(&body, part);
  std::string strategy = absl::StrCat("column tile: ", N, " output(s), 32 per block, ", y,
                                      " y-group(s), ", coops.size(), " split reduction(s)");
  fns_.push_back(Finish(*fn, kern_.name, body, N, 32, block, strategy));
}

// The partials of a split column reduction (KernelGen::SplitColumns): block b takes columns
// b % (N / 32) and chunk kg = b / (N / 32) of each range; reductions over ranges of one length
// share one loop.
void KernelGen::ColumnPartials(const std::vector<ExprPtr>& items, const std::vector<int>& vals,
                               int64_t G, int y, int level) {
  std::unique_ptr<Fn> fn = NewFn();
  CudaEmitter& em = *fn->em;
  const int rank = static_cast<int>(loops_.size());
  const int64_t N = Product(loops_, 0, rank);
  const int64_t cols = CeilDiv(N, 32);
  fn->head.push_back(absl::StrCat("const ", cfg_.index_type, " kg = blockIdx.x / ", cols, ";"));
  ColumnHead(*fn, y, absl::StrCat("(blockIdx.x % ", cols, ")"));
  std::string strategy = absl::StrCat("column partials: ", N, " output(s), 32 per block, ", y,
                                      " y-group(s), ", G, " chunk(s) of");
  std::map<int64_t, int> var_of_extent;  // reductions of one length walk one variable (one loop)
  for (size_t j = 0; j < items.size(); ++j) {
    const int64_t R = ReduceExtent(*items[j], em.extents());
    auto [at, fresh] = var_of_extent.emplace(R, -1);
    if (fresh) at->second = em.NewVar(R, absl::StrCat("e", em.extents().size()));
    CoopReduce r = ColumnReduce(*items[j], at->second, y, em, &pool_);
    const std::string S = Varies(R) ? CeilDivText(R, G) : absl::StrCat(CeilDiv(R, G));
    r.col_begin = absl::StrCat(S, " * kg");
    r.col_end =
        absl::StrCat("(", S, " * kg + ", S, " < ", R, " ? ", S, " * kg + ", S, " : ", R, ")");
    em.coop[items[j].get()] = r;
    absl::StrAppend(&strategy, j ? "," : "", " ", S, " of ", R);
  }
  AddReductionVars(items, &em);
  em.PushScope(-1);
  for (int d = 0; d < rank; ++d) em.PushScope(d);
  for (const auto& [R, var] : var_of_extent) {
    std::vector<const Expr*> group;
    for (const ExprPtr& item : items)
      if (em.coop.at(item.get()).var == var) group.push_back(item.get());
    em.EmitColumnGroup(group);  // else each loops on its own below
  }
  for (size_t j = 0; j < items.size(); ++j) {
    std::string v = em.Emit(items[j]);
    fn->written.push_back(vals[j]);
    em.AddStatement(absl::StrCat("if (ky == 0 && kc_ok) ", BufferName(fn->prog.buffers[vals[j]]),
                                 "[kg * ", N, " + kc] = ", v, ";"));
  }
  std::vector<std::string> body;
  for (auto& part : PopScopes(em, rank + 1)) Append(&body, part);
  fns_.push_back(Finish(
      *fn, level == 0 ? absl::StrCat(kern_.name, "_c") : absl::StrCat(kern_.name, "_c", level),
      body, cols * G * 32, 32, 32 * y, strategy));
}

}  // namespace kiln::codegen::cuda::internal
