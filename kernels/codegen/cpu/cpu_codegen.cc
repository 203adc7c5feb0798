#include "kernels/codegen/cpu/cpu_codegen.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/codegen/c_expr.h"
#include "kernels/codegen/cpu/cpu_emitter.h"
#include "kernels/codegen/cpu/cpu_lanes.h"
#include "kernels/codegen/expr_rewrite.h"
#include "kernels/lower/lower.h"

namespace kiln::codegen {
namespace {

using schedule::Buffer;

// Below this many iterations a loop is not worth a parallel region's fork/join.
constexpr int64_t kMinParallelWork = 1 << 14;

std::string ConstArray(const Buffer& b) {
  std::vector<std::string> vals;
  int64_t n = b.value.NumElements();
  for (int64_t k = 0; k < n; ++k) {
    double f = b.value.f.empty() ? static_cast<double>(b.value.i[k]) : b.value.f[k];
    // Float constants hold no integers (and converting theirs could overflow): 0 is unused.
    int64_t i = b.value.i.empty() ? 0 : b.value.i[k];
    std::string lit = Literal(b.dtype, f, i);
    vals.push_back(StoreConvert(b.dtype, lit));
  }
  std::string type = StorageType(b.dtype, false);
  if (b.dtype == ir::DType::kF16 || b.dtype == ir::DType::kBF16) type = "float";
  if (b.dtype == ir::DType::kF16 || b.dtype == ir::DType::kBF16) {
    vals.clear();
    for (int64_t k = 0; k < n; ++k)
      vals.push_back(Literal(ir::DType::kF32, b.value.AsDouble(k), 0));
  }
  return absl::StrCat("static const ", type, " kconst", b.index, "[", n, "] = {",
                      absl::StrJoin(vals, ", "), "};");
}

// Symbolic sizes (ABI version 2): each function that needs them reads them from `kiln_sz`.
std::string SizePrologue(int num_symbols) {
  std::string s;
  for (int k = 0; k < num_symbols; ++k)
    absl::StrAppend(&s, "  const int64_t kiln_s", k, " = kiln_sz[", k, "];\n  (void)kiln_s", k,
                    ";\n");
  return s;
}

// Float sums longer than this run in blocks of it (ScopedEmitter::set_sum_block), and so do
// argmax/argmin (set_two_pass_arg: a block of floats fits the first-level cache): 1024
// elements are 128 per lane of an 8-wide vector, and one double add per block costs nothing
// beside the block's loads.
constexpr int64_t kSumBlock = 1024;
// A reduction at least this long, placed in the innermost output loop (a row sum whose
// output is one value per row), is the vector loop itself; the output loop stays scalar.
constexpr int64_t kMinVectorReduce = 32;
// An innermost output loop this short is unrolled inside a vector loop over the one outside it,
// when that one is at least kMinVectorLoop long.
constexpr int64_t kMaxUnrolledInner = 8;
constexpr int64_t kMinVectorLoop = 16;

// The longest reduced range of the reductions placed in output loop `var` (those reading it).
int64_t ReducedLengthIn(const schedule::Kernel& k, int var) {
  int64_t longest = 0;
  for (const auto& o : k.outputs)
    for (const lower::Expr* n : Nodes(o.value)) {
      if (n->kind != lower::Expr::Kind::kReduce) continue;
      const std::vector<int> fv = n->FreeVars();
      if (!std::count(fv.begin(), fv.end(), var)) continue;
      int64_t r = 1;
      for (int rv : n->rvars) r *= k.extents[rv];
      longest = std::max(longest, r);
    }
  return longest;
}

// Every output of `k` concatenates pieces along the innermost output loop, at the same
// bounds: their pieces (per output), or none.
std::vector<Concat> ConcatsAlongInnermost(const schedule::Kernel& k, ExprPool* pool) {
  const ir::Shape loops(k.extents.begin(), k.extents.begin() + k.num_loops);
  std::vector<Concat> out;
  for (const schedule::KernelOutput& o : k.outputs) {
    Concat c = ConcatPieces(o.value, loops, pool);
    if (c.pieces.empty() || c.var != k.num_loops - 1) return {};
    if (!out.empty()) {
      if (c.pieces.size() != out[0].pieces.size()) return {};
      for (size_t j = 0; j < c.pieces.size(); ++j)
        if (c.pieces[j].lo != out[0].pieces[j].lo || c.pieces[j].hi != out[0].pieces[j].hi)
          return {};
    }
    out.push_back(std::move(c));
  }
  return out;
}

struct KernelText {
  std::string text;
  std::vector<int> params;  // buffers passed, in order
};

// Kernel parameters: every buffer the kernel touches, read-only ones const.
KernelText KernelFunction(const schedule::Program& p, const schedule::Kernel& k,
                          const CpuVariant& variant, int num_symbols) {
  int nvars = static_cast<int>(k.extents.size());
  std::vector<std::string> var_names;
  for (int v = 0; v < nvars; ++v) var_names.push_back(absl::StrCat("i", v));
  std::vector<std::string> names;
  for (size_t b = 0; b < p.buffers.size(); ++b) names.push_back(BufferName(p.buffers[b]));

  CpuKernelEmitter em(p, k, var_names, names);
  int rank = k.num_loops;
  em.parallel_top_reduce = rank == 0;
  em.enable_invariant_tables();
  em.set_sum_block(kSumBlock);
  em.set_two_pass_arg(kSumBlock);
  // Reductions over an outer axis: the innermost output loop runs in lane tiles.
  const LanePlan lanes = PlanLanes(p, k, kMinParallelWork, variant);
  // Otherwise the innermost output loop is a simd loop, unless a long reduction sits in it:
  // a row sum vectorised across rows walks each row as scalars (and reads rows with gathers).
  const int64_t inner_reduce = rank > 0 && lanes.lanes == 0 ? ReducedLengthIn(k, rank - 1) : 0;
  const bool simd_outputs = inner_reduce < kMinVectorReduce;
  if (lanes.lanes > 0)
    em.set_lanes(
        {static_cast<size_t>(rank), rank - 1, lanes.lanes, lanes.split_rows, lanes.max_unroll});
  // The loops' order, outermost first: the output's dimensions in order, except that a
  // transposing kernel's tiled loop p goes just outside the innermost one (its tile loops
  // go outside both; the loops between them stay outside the tiles).
  const TransposeTiles tiles =
      lanes.lanes == 0 && simd_outputs ? PlanTranspose(p, k) : TransposeTiles{};
  // Outputs that concatenate pieces along the innermost loop: one loop per piece, each
  // computing its piece alone (one select per element computed every piece, its loads
  // clamped into range, which made them gathers).
  ExprPool pool;
  const std::vector<Concat> concats = rank > 0 && tiles.p < 0 && simd_outputs && lanes.lanes == 0
                                          ? ConcatsAlongInnermost(k, &pool)
                                          : std::vector<Concat>{};
  // A short innermost loop (the 3 channels of an HWC image) is unrolled, and the loop outside
  // it is the vector loop: vectorised, 3 lanes of 16 did the work (a u8 HWC image normalised
  // to f32, [1080, 1920, 3]: 4.6 ms, against 1.0 ms unrolled inside a vector loop over pixels).
  const bool short_inner = rank >= 2 && simd_outputs && lanes.lanes == 0 && tiles.p < 0 &&
                           concats.empty() && k.extents[rank - 1] <= kMaxUnrolledInner &&
                           k.extents[rank - 2] >= kMinVectorLoop;
  if (rank > 0 && simd_outputs) em.set_simd_scope(short_inner ? rank - 1 : rank);
  std::vector<int> order;
  for (int d = 0; d < rank; ++d)
    if (d != tiles.p) order.push_back(d);
  if (tiles.p >= 0) order.insert(order.end() - 1, tiles.p);
  em.PushScope(-1);
  for (int d : order) em.PushScope(d);
  const std::vector<lower::Affine>& idx = k.out_index;
  // An output whose shape is not the domain's (same elements) is stored at the flat position.
  lower::Affine flat = lower::Affine::Const(0);
  const std::vector<int64_t> dense = lower::ContiguousStrides(k.domain);
  for (size_t d = 0; d < idx.size(); ++d) flat = lower::Add(flat, lower::Scale(idx[d], dense[d]));
  const size_t num_pieces = concats.empty() ? 1 : concats[0].pieces.size();
  std::vector<std::vector<std::string>> piece_stmts;  // each piece's loop body but the last's
  for (size_t j = 0; j < num_pieces; ++j) {
    if (j > 0) em.PushScope(rank - 1);
    for (size_t o = 0; o < k.outputs.size(); ++o) {
      const schedule::KernelOutput& out = k.outputs[o];
      std::string v = em.Emit(concats.empty() ? out.value : concats[o].pieces[j].value);
      const Buffer& b = p.buffers[out.buffer];
      const std::string at =
          b.shape == k.domain ? em.Address(out.buffer, idx) : lower::ToC(flat, em.var_names());
      std::string stored = b.dtype == ir::DType::kBool
                               ? v
                               : absl::StrCat("(", ComputeTypeName(b.dtype), ")(", v, ")");
      em.AddStatement(
          absl::StrCat(lanes.lanes > 0 ? std::string(1, CpuKernelEmitter::kLaneMark) : "",
                       names[out.buffer], "[", at, "] = ", StoreConvert(b.dtype, stored), ";"));
    }
    if (j + 1 < num_pieces) piece_stmts.push_back(em.PopScope());
  }
  // Assemble loops from the innermost scope outwards.
  int64_t work = std::max<int64_t>(inner_reduce, 1);
  for (int d = 0; d < rank; ++d) work *= k.extents[d];
  std::vector<std::string> body;
  auto wrap = [](std::vector<std::string> head, std::vector<std::string> inside) {
    for (std::string& s : inside) head.push_back("  " + s);
    head.push_back("}");
    return head;
  };
  // "for (iD = iD_t; iD < iD_e; ++iD)" inside tiles, "for (iD = 0; iD < n; ++iD)" otherwise.
  auto range = [&](int d) {
    const std::string i = absl::StrCat("i", d);
    if (tiles.p < 0 || (d != tiles.p && d != rank - 1))
      return absl::StrCat("for (int64_t ", i, " = 0; ", i, " < ", k.extents[d], "; ++", i, ") {");
    return absl::StrCat("for (int64_t ", i, " = ", i, "_t; ", i, " < ", i, "_e; ++", i, ") {");
  };
  auto tile_loop = [&](int d) {
    const std::string i = absl::StrCat("i", d);
    return BlockLoopHead(i + "_t", i + "_e", k.extents[d], tiles.tile);
  };
  for (int at = rank - 1; at >= 0; --at) {
    const int d = order[at];
    std::vector<std::string> stmts = em.PopScope();
    bool outer = at == 0, inner = at == rank - 1;
    if (inner && lanes.lanes > 0) {
      body =
          LaneTileLoop(em.AssembleLanes(stmts), k.extents[d], lanes, outer && lanes.parallel_tiles);
      continue;
    }
    stmts.insert(stmts.end(), body.begin(), body.end());
    std::vector<std::string> loop;
    const bool parallel = outer && work >= kMinParallelWork;
    if (inner && !concats.empty()) {
      // One loop per piece over its range [lo, hi), in order.
      piece_stmts.push_back(std::move(stmts));
      body.clear();
      const std::string i = absl::StrCat("i", d);
      for (size_t j = 0; j < num_pieces; ++j) {
        const Piece& piece = concats[0].pieces[j];
        std::vector<std::string> head = {
            parallel ? "#pragma omp parallel for simd num_threads(nt) schedule(static)"
                     : "#pragma omp simd",
            absl::StrCat("for (int64_t ", i, " = ", piece.lo, "; ", i, " < ", piece.hi, "; ++", i,
                         ") {")};
        std::vector<std::string> piece_loop = wrap(std::move(head), std::move(piece_stmts[j]));
        body.insert(body.end(), piece_loop.begin(), piece_loop.end());
      }
      continue;
    }
    const bool vector_loop = simd_outputs && (short_inner ? at == rank - 2 : inner);
    if (parallel && tiles.p != d) {
      loop.push_back(absl::StrCat("#pragma omp parallel for", vector_loop ? " simd" : "",
                                  " num_threads(nt) schedule(static)"));
    } else if (vector_loop) {
      loop.push_back("#pragma omp simd");
    } else if (inner && short_inner) {
      loop.push_back(absl::StrCat("#pragma GCC unroll ", k.extents[d]));
    }
    loop.push_back(range(d));
    body = wrap(std::move(loop), std::move(stmts));
    if (d == tiles.p) {
      // The tile loops: p's outside x's; the outermost takes the threads.
      std::vector<std::string> x_tiles = tile_loop(rank - 1);
      body = wrap(std::move(x_tiles), std::move(body));
      std::vector<std::string> p_tiles = tile_loop(d);
      if (parallel)
        p_tiles.insert(p_tiles.begin(),
                       "#pragma omp parallel for num_threads(nt) schedule(static)");
      body = wrap(std::move(p_tiles), std::move(body));
    }
  }
  std::vector<std::string> all = em.PopScope();
  all.insert(all.end(), body.begin(), body.end());

  // Parameters: the buffers this kernel reads or writes.
  KernelText out;
  std::string text = absl::StrCat("static void ", k.name, "(");
  std::vector<std::string> params;
  const std::unordered_set<std::string> indexed = IdentifiersIn(absl::StrJoin(all, "\n"), '[');
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    const Buffer& buf = p.buffers[b];
    if (buf.role == Buffer::Role::kConst) continue;
    if (!indexed.count(names[b])) continue;
    bool written = false;
    for (const auto& o : k.outputs) written |= o.buffer == static_cast<int>(b);
    params.push_back(absl::StrCat(written ? "" : "const ", StorageType(buf.dtype, false),
                                  "* __restrict ", names[b]));
    out.params.push_back(static_cast<int>(b));
  }
  if (num_symbols > 0) params.push_back("const int64_t* __restrict kiln_sz");
  params.push_back("int nt");
  absl::StrAppend(&text, absl::StrJoin(params, ", "), ") {\n", SizePrologue(num_symbols));
  absl::StrAppend(&text, "  (void)nt;\n", Indent(all, 1), "}\n");
  out.text = std::move(text);
  return out;
}

}  // namespace

std::string GenerateCpu(const schedule::Program& p, const CompileOptions& options,
                        int num_symbols) {
  const bool symbolic = num_symbols > 0;
  std::string src;
  absl::StrAppend(&src, "// Generated by kiln: ", p.kernels.size(), " kernel(s).\n");
  if (!options.vector_math) absl::StrAppend(&src, "#define KILN_NO_VECTOR_MATH 1\n");
  absl::StrAppend(&src, "#include \"kiln_cpu.h\"\n\n");
  for (const Buffer& b : p.buffers)
    if (b.role == Buffer::Role::kConst) absl::StrAppend(&src, ConstArray(b), "\n");
  std::vector<KernelText> kernels;
  for (const schedule::Kernel& k : p.kernels) {
    kernels.push_back(KernelFunction(p, k, CpuVariantOf(options.variant), num_symbols));
    absl::StrAppend(&src, "\n", kernels.back().text);
  }

  const char* const kExport = "extern \"C\" __attribute__((visibility(\"default\")))";
  absl::StrAppend(&src, "\n", kExport, " uint32_t kiln_abi_version(void) { return ",
                  symbolic ? kCpuSymbolicAbiVersion : kCpuAbiVersion, "; }\n\n");
  if (symbolic) {
    // The workspace layout is the artifact's own: each temp at the next multiple of 64 bytes.
    absl::StrAppend(&src, kExport, " int64_t kiln_workspace_bytes(const int64_t* kiln_sz) {\n",
                    SizePrologue(num_symbols), "  int64_t kiln_ws = 0;\n");
    for (const Buffer& b : p.buffers)
      if (b.role == Buffer::Role::kTemp)
        absl::StrAppend(&src, "  kiln_ws += (((int64_t)", b.bytes, "LL) + 63) / 64 * 64;\n");
    absl::StrAppend(&src, "  return kiln_ws;\n}\n\n");
    absl::StrAppend(
        &src, kExport,
        " int kiln_run(void* const* args, const int64_t* kiln_sz, void* workspace, int nt) {\n");
    absl::StrAppend(&src, "  for (int k = 0; k < ", num_symbols,
                    "; ++k)\n    if (kiln_sz[k] < 0) return 1;\n", SizePrologue(num_symbols),
                    "  int64_t kiln_ws = 0;\n  (void)kiln_ws;\n");
  } else {
    absl::StrAppend(&src, kExport, " int kiln_run(void* const* args, void* workspace, int nt) {\n");
  }
  absl::StrAppend(&src, "  if (nt <= 0) nt = omp_get_max_threads();\n  (void)workspace;\n");
  std::vector<std::string> names;
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    const Buffer& buf = p.buffers[b];
    names.push_back(BufferName(buf));
    std::string t = StorageType(buf.dtype, false);
    switch (buf.role) {
      case Buffer::Role::kInput:
        absl::StrAppend(&src, "  const ", t, "* ", names[b], " = (const ", t, "*)args[", buf.index,
                        "];\n");
        break;
      case Buffer::Role::kOutput:
        absl::StrAppend(&src, "  ", t, "* ", names[b], " = (", t, "*)args[",
                        p.num_inputs + buf.index, "];\n");
        break;
      case Buffer::Role::kTemp:
        if (symbolic) {
          absl::StrAppend(&src, "  ", t, "* ", names[b], " = (", t,
                          "*)((char*)workspace + kiln_ws);\n", "  kiln_ws += (((int64_t)",
                          buf.bytes, "LL) + 63) / 64 * 64;\n");
        } else {
          absl::StrAppend(&src, "  ", t, "* ", names[b], " = (", t, "*)((char*)workspace + ",
                          buf.offset, ");\n");
        }
        break;
      case Buffer::Role::kConst:
        break;
    }
  }
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    std::vector<std::string> args;
    for (int b : kernels[i].params) args.push_back(names[b]);
    if (symbolic) args.push_back("kiln_sz");
    args.push_back("nt");
    absl::StrAppend(&src, "  ", p.kernels[i].name, "(", absl::StrJoin(args, ", "), ");\n");
  }
  absl::StrAppend(&src, "  return 0;\n}\n");
  return src;
}

}  // namespace kiln::codegen
