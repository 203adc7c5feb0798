#include "kernels/codegen/cpu/cpu_emitter.h"

#include <algorithm>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "kernels/codegen/c_expr.h"

namespace kiln::codegen {
namespace {

using lower::Expr;

// Below this many iterations a loop is not worth a parallel region's fork/join.
constexpr int64_t kMinParallelWork = 1 << 14;
// Lane-tile declarations are moved to the top of the tile's body, so that runs of lane
// statements stay together.
constexpr char kDeclMark = '\x02';
// Every array the generated code keeps on the stack (hoisted tables, lane accumulators) is
// declared 64-byte aligned. GCC 12 at -O3 with -mprefer-vector-width=512 vectorises the
// stores into such an array with aligned 256-bit moves while laying the array out at an
// address only 16-byte aligned: a hoisted table of 24-float rows (avg_pool2d's divisors over a
// 48x48 input) made `vmovaps` fault on every call. An explicit alignment makes the compiler
// realign the frame itself (pipeline_test.cc, Codegen.StackTableRunsUnderAnyFrameAlignment).
constexpr char kStackArray[] = "alignas(64) ";

bool HasReduction(const Expr& e) {
  std::set<const Expr*> seen;
  std::function<bool(const Expr*)> walk = [&](const Expr* n) {
    if (!seen.insert(n).second) return false;
    if (n->kind == Expr::Kind::kReduce) return true;
    for (const auto& a : n->args)
      if (walk(a.get())) return true;
    return false;
  };
  return walk(&e);
}

}  // namespace

void CpuKernelEmitter::EmitReduce(const Expr& e, const std::string& result, size_t target) {
  if (InLanes(target)) {
    EmitLaneReduce(e, result, target);
    return;
  }
  ScopedEmitter::EmitReduce(e, result, target);
  if (parallel_top_reduce && target == 0 && !hoisting_) ParallelizeTopReduce(e, result, target);
}

void CpuKernelEmitter::ParallelizeTopReduce(const Expr& e, const std::string& result,
                                            size_t target) {
  if (e.op == "argmax" || e.op == "argmin") return;
  int64_t work = 1;
  for (int rv : e.rvars) work *= kernel_.extents[rv];
  if (work < kMinParallelWork) return;
  // Turn this reduction's outermost loop into a parallel one. Its statements were appended
  // last: accumulator declarations, then the loop (after any reduction its body needed,
  // which came first and must not be touched).
  auto& stmts = scopes_[target].stmts;
  const std::string decl = " " + result + "_acc = ";
  size_t i = stmts.size();
  // Declarations are the unindented lines (the combine step of max/min, `acc = v > acc ? ...`,
  // also holds `decl`, but inside the loop, indented).
  while (i > 0 && (stmts[i - 1].find(decl) == std::string::npos || stmts[i - 1].rfind(" ", 0) == 0))
    --i;
  while (i < stmts.size() && stmts[i].rfind("for (", 0) != 0 && stmts[i].rfind("#pragma", 0) != 0)
    ++i;
  if (i == stmts.size()) return;
  // A block loop's no-unroll line may not stand between `omp parallel for` and its loop (and
  // a loop run across threads is not unrolled).
  if (stmts[i] == kNoUnroll) stmts.erase(stmts.begin() + static_cast<long>(i));
  const std::string simd = "#pragma omp simd";
  if (stmts[i].rfind(simd, 0) == 0) {
    // A single loop: parallel and simd together.
    stmts[i].replace(0, simd.size(), "#pragma omp parallel for simd num_threads(nt)");
  } else {
    std::string clause = ScopedEmitter::ReducePragma(e, result + "_acc");
    clause.replace(0, simd.size(), "#pragma omp parallel for num_threads(nt)");
    stmts.insert(stmts.begin() + static_cast<long>(i), clause);
  }
}

bool CpuKernelEmitter::Hoist(const lower::ExprPtr& ep, size_t target, std::string* ref) {
  const Expr& e = *ep;
  if (!tables_ || hoisting_) return false;
  if (e.kind == Expr::Kind::kLoad || e.kind == Expr::Kind::kConst || e.kind == Expr::Kind::kIndex)
    return false;
  const std::vector<int> fv = e.FreeVars();
  if (fv.empty()) return false;  // the prologue computes it once already
  // The variables it reads, in the order of the scopes binding them; and whether a loop
  // enclosing its place leaves it unchanged.
  std::vector<int> order;
  bool invariant = false;
  int64_t elements = 1;
  for (size_t i = 1; i <= target; ++i) {
    int v = scopes_[i].var;
    if (v < 0) continue;
    if (std::count(fv.begin(), fv.end(), v)) {
      order.push_back(v);
      elements *= kernel_.extents[v];
    } else {
      invariant = true;
    }
  }
  if (!invariant || order.size() != fv.size() || elements > kMaxTableElements || HasReduction(e))
    return false;

  lower::Affine idx = lower::Affine::Const(0);
  int64_t stride = 1;
  for (size_t k = order.size(); k-- > 0;) {
    idx = lower::Add(idx, lower::Scale(lower::Affine::Var(order[k]), stride));
    stride *= kernel_.extents[order[k]];
  }
  // Read at the current names (an unrolled row reads "(i2 + 1)"); one table per expression,
  // whichever row of an unrolled reduction reaches it first.
  auto known = table_of_.find(&e);
  if (known != table_of_.end()) {
    *ref = absl::StrCat(known->second, "[", lower::ToC(idx, var_names_), "]");
    return true;
  }
  const std::string table = absl::StrCat("kh", next_table_++);
  table_of_[&e] = table;
  const std::string at = absl::StrCat(table, "[", lower::ToC(idx, var_names_), "]");
  // Compute it in loops of its own in the prologue, before everything that reads it, over the
  // variables' own names.
  const std::vector<std::string> reading_names = var_names_;
  for (const auto& [v, name] : renamed_) var_names_[v] = name;
  std::vector<Scope> saved(scopes_.begin() + 1, scopes_.end());
  scopes_.resize(1);
  hoisting_ = true;
  for (int v : order) PushScope(v);
  std::string value = Emit(ep);
  AddStatement(absl::StrCat(at, " = ", value, ";"));
  std::vector<std::string> body;
  for (size_t k = order.size(); k-- > 0;) {
    std::vector<std::string> stmts = PopScope();
    stmts.insert(stmts.end(), body.begin(), body.end());
    const std::string& iv = var_names_[order[k]];
    std::vector<std::string> loop;
    if (k + 1 == order.size()) loop.push_back("#pragma omp simd");
    loop.push_back(absl::StrCat("for (int64_t ", iv, " = 0; ", iv, " < ", kernel_.extents[order[k]],
                                "; ++", iv, ") {"));
    for (std::string& s : stmts) loop.push_back("  " + s);
    loop.push_back("}");
    body = std::move(loop);
  }
  hoisting_ = false;
  var_names_ = reading_names;
  std::vector<std::string>& pro = scopes_[0].stmts;
  pro.push_back(
      absl::StrCat(kStackArray, ComputeTypeName(e.dtype), " ", table, "[", elements, "];"));
  pro.insert(pro.end(), body.begin(), body.end());
  scopes_.insert(scopes_.end(), saved.begin(), saved.end());
  *ref = at;
  return true;
}

std::string CpuKernelEmitter::Define(size_t target, const Expr& e, const std::string& name,
                                     const std::string& text) {
  if (!InLanes(target) || hoisting_) return ScopedEmitter::Define(target, e, name, text);
  auto& stmts = scopes_[target].stmts;
  stmts.push_back(absl::StrCat(std::string(1, kDeclMark), ComputeTypeName(e.dtype), " ", name, "[",
                               lanes_.lanes, "];"));
  stmts.push_back(absl::StrCat(std::string(1, kLaneMark), name, "[kl] = ", text, ";"));
  return name + "[kl]";
}

std::string CpuKernelEmitter::ValueRef(size_t target, const std::string& name) {
  return InLanes(target) && !hoisting_ ? name + "[kl]" : name;
}

std::vector<std::string> CpuKernelEmitter::LaneLoop(const std::vector<std::string>& body,
                                                    bool simd) const {
  std::vector<std::string> loop;
  if (simd) loop.push_back("#pragma omp simd");
  loop.push_back("for (int64_t kl = 0; kl < kn; ++kl) {");
  loop.push_back(absl::StrCat("  const int64_t ", var_names_[lanes_.var], " = kb + kl;"));
  for (const std::string& s : body) loop.push_back("  " + s);
  loop.push_back("}");
  return loop;
}

std::vector<std::string> CpuKernelEmitter::AssembleLanes(
    const std::vector<std::string>& stmts) const {
  std::vector<std::string> decls, out, run;
  auto flush = [&] {
    if (run.empty()) return;
    std::vector<std::string> loop = LaneLoop(run, true);
    out.insert(out.end(), loop.begin(), loop.end());
    run.clear();
  };
  for (const std::string& s : stmts) {
    if (!s.empty() && s[0] == kDeclMark) {
      decls.push_back(kStackArray + s.substr(1));
    } else if (!s.empty() && s[0] == kLaneMark) {
      run.push_back(s.substr(1));
    } else {
      flush();
      out.push_back(s);
    }
  }
  flush();
  decls.insert(decls.end(), out.begin(), out.end());
  return decls;
}

void CpuKernelEmitter::EmitLaneReduce(const Expr& e, const std::string& result, size_t target) {
  // The body sees the scopes up to `target`, then the reduction's own loops.
  std::vector<Scope> saved(scopes_.begin() + target + 1, scopes_.end());
  scopes_.resize(target + 1);
  const std::string& op = e.op;
  const bool arg = op == "argmax" || op == "argmin";
  const ir::DType vt = arg ? e.args[0]->dtype : e.dtype;
  const bool nan_flag = (op == "max" || op == "min") && ir::IsFloat(vt);
  const std::string acc = result + "_acc";
  const std::string ctype =
      (op == "any" || op == "all") ? "unsigned char" : ComputeTypeName(vt);  // see EmitReduce
  const std::string dims = absl::StrCat("[", lanes_.lanes, "]");
  const std::string decl(1, kDeclMark), lane(1, kLaneMark);
  // Float sums over a long innermost reduced loop run it in blocks (see set_sum_block): each
  // block sums into `blk` per lane, added into the double totals `acc` after the block. A
  // lane adds one value per row, where a row sum's vector lane adds one per 8 or 16 elements:
  // blocks of an eighth of the row sums' length keep the additions per accumulator alike.
  const int inner = e.rvars.back();
  const int64_t block_rows = sum_block_ / 8;
  const bool blocked =
      block_rows > 0 && op == "sum" && ir::IsFloat(vt) && kernel_.extents[inner] > block_rows;
  const std::string blk = blocked ? result + "_blk" : acc;
  std::vector<std::string> pre = {
      absl::StrCat(decl, blocked ? "double" : ctype, " ", acc, dims, ";"),
      absl::StrCat(lane, acc, "[kl] = ", blocked ? "0.0" : ReduceInit(op, vt), ";")};
  if (nan_flag) {
    pre.push_back(absl::StrCat(decl, "int ", acc, "_nan", dims, ";"));
    pre.push_back(absl::StrCat(lane, acc, "_nan[kl] = 0;"));
  }
  if (arg) {
    pre.push_back(absl::StrCat(decl, "int64_t ", result, "_idx", dims, ";"));
    pre.push_back(absl::StrCat(lane, result, "_idx[kl] = 0;"));
  }
  // Sums step the innermost reduced loop by `unroll` rows, adding the rows' values together
  // before the accumulator: a quarter of the accumulator traffic. (Blocks hold a multiple of
  // 4 rows, 128, so a block ends on a step.)
  int unroll = 1;
  if (op == "sum" && !InSymbolicSample())
    for (int u : {4, 2})
      if (u <= lanes_.max_unroll && kernel_.extents[inner] % u == 0 &&
          kernel_.extents[inner] >= 2 * u) {
        unroll = u;
        break;
      }
  for (size_t k = 0; k + 1 < e.rvars.size(); ++k) PushScope(e.rvars[k]);
  std::vector<std::string> rows, row_values;
  const std::string inner_name = var_names_[inner];
  renamed_[inner] = inner_name;
  for (int u = 0; u < unroll; ++u) {
    var_names_[inner] = u == 0 ? inner_name : absl::StrCat("(", inner_name, " + ", u, ")");
    PushScope(inner);
    row_values.push_back(Emit(e.args[0]));
    std::vector<std::string> stmts = PopScope();
    rows.insert(rows.end(), stmts.begin(), stmts.end());
  }
  var_names_[inner] = inner_name;
  renamed_.erase(inner);
  PushScope(inner);
  for (std::string& r : rows) AddStatement(std::move(r));
  std::string v = row_values[0];
  if (unroll == 2) v = absl::StrCat("(", row_values[0], " + ", row_values[1], ")");
  if (unroll == 4)
    v = absl::StrCat("((", row_values[0], " + ", row_values[1], ") + (", row_values[2], " + ",
                     row_values[3], "))");
  std::string combine;
  if (arg) {
    // First index wins ties; the first NaN wins over numbers (NumPy).
    const std::string lin = FlatReducedIndex(e);
    const std::string a = acc + "[kl]";
    std::string better = absl::StrCat(v, op == "argmax" ? " > " : " < ", a);
    if (ir::IsFloat(vt))
      better = absl::StrCat("(", better, ") || (", v, " != ", v, " && ", a, " == ", a, ")");
    combine =
        absl::StrCat("if (", better, ") { ", a, " = ", v, "; ", result, "_idx[kl] = ", lin, "; }");
  } else {
    combine = absl::StrReplaceAll(ReduceCombine(op, "KILN_ACC", v, vt),
                                  {{"KILN_ACC_nan", acc + "_nan[kl]"}, {"KILN_ACC", blk + "[kl]"}});
  }
  AddStatement(combine);
  // Every statement of the body runs per lane, innermost: the reduced loops step through
  // memory in order and the lane loop reads consecutive elements.
  std::vector<std::vector<std::string>> parts(e.rvars.size());
  for (size_t k = e.rvars.size(); k-- > 0;) parts[k] = PopScope();
  std::vector<std::string> body;
  for (const auto& p : parts) body.insert(body.end(), p.begin(), p.end());
  std::vector<std::string> loop = LaneLoop(body, true);
  for (size_t k = e.rvars.size(); k-- > 0;) {
    const std::string& iv = var_names_[e.rvars[k]];
    std::vector<std::string> wrapped;
    if (k == 0 && lanes_.split_rows && !arg) {
      std::string clause =
          absl::StrCat("#pragma omp parallel for num_threads(nt) schedule(static) reduction(",
                       ReduceClauseOp(op), ":", acc, "[:", lanes_.lanes, "])");
      if (nan_flag) absl::StrAppend(&clause, " reduction(|:", acc, "_nan[:", lanes_.lanes, "])");
      wrapped.push_back(clause);
    }
    const std::string step =
        k + 1 == e.rvars.size() && unroll > 1 ? absl::StrCat(" += ", unroll) : "";
    const int64_t extent = kernel_.extents[e.rvars[k]];
    if (blocked && k + 1 == e.rvars.size()) {
      // for (iv_b ...) { blk = 0; for (iv = iv_b; iv < iv_e; ...) {lanes}; acc += blk; }
      const std::string start = iv + "_b", end = iv + "_e";
      if (wrapped.empty()) wrapped.push_back(kNoUnroll);  // see ScopedEmitter::EmitReduce
      std::vector<std::string> head = BlockLoopHead(start, end, extent, block_rows);
      wrapped.push_back(head[0]);
      std::vector<std::string> block = {head[1].substr(2),
                                        absl::StrCat(kStackArray, ctype, " ", blk, dims, ";")};
      for (std::string& s : LaneLoop({absl::StrCat(blk, "[kl] = ", ReduceInit(op, vt), ";")}, true))
        block.push_back(s);
      block.push_back(absl::StrCat("for (int64_t ", iv, " = ", start, "; ", iv, " < ", end, "; ",
                                   step.empty() ? "++" + iv : iv + step, ") {"));
      for (std::string& s : loop) block.push_back("  " + s);
      block.push_back("}");
      for (std::string& s : LaneLoop({absl::StrCat(acc, "[kl] += ", blk, "[kl];")}, true))
        block.push_back(s);
      for (std::string& s : block) wrapped.push_back("  " + s);
      wrapped.push_back("}");
      loop = std::move(wrapped);
      continue;
    }
    wrapped.push_back(absl::StrCat("for (int64_t ", iv, " = 0; ", iv, " < ", extent, "; ",
                                   step.empty() ? "++" + iv : iv + step, ") {"));
    for (std::string& s : loop) wrapped.push_back("  " + s);
    wrapped.push_back("}");
    loop = std::move(wrapped);
  }
  std::string value = arg ? absl::StrCat(result, "_idx[kl]") : acc + "[kl]";
  if (blocked) value = absl::StrCat("(", ctype, ")", acc, "[kl]");
  if (nan_flag)
    value = absl::StrCat("(", acc, "_nan[kl] ? ", Literal(vt, __builtin_nan(""), 0), " : ", acc,
                         "[kl])");
  if (op == "any" || op == "all") value = absl::StrCat("(", acc, "[kl] != 0)");
  std::vector<std::string>& out = scopes_[target].stmts;
  out.insert(out.end(), pre.begin(), pre.end());
  out.insert(out.end(), loop.begin(), loop.end());
  out.push_back(absl::StrCat(decl, ComputeTypeName(e.dtype), " ", result, dims, ";"));
  out.push_back(absl::StrCat(lane, result, "[kl] = ", value, ";"));
  scopes_.insert(scopes_.end(), saved.begin(), saved.end());
}

}  // namespace kiln::codegen
