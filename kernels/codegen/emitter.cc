#include "kernels/codegen/emitter.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/codegen/c_expr.h"

namespace kiln::codegen {

using lower::Expr;

ScopedEmitter::ScopedEmitter(const schedule::Program& program, const schedule::Kernel& kernel,
                             std::vector<std::string> var_names,
                             std::vector<std::string> buffer_names)
    : program_(program),
      kernel_(kernel),
      var_names_(std::move(var_names)),
      buffer_names_(std::move(buffer_names)) {}

void ScopedEmitter::PushScope(int var) {
  Scope s;
  s.var = var;
  scopes_.push_back(std::move(s));
}

std::vector<std::string> ScopedEmitter::PopScope() {
  std::vector<std::string> out = std::move(scopes_.back().stmts);
  scopes_.pop_back();
  return out;
}

std::string ScopedEmitter::Address(int buffer, const std::vector<lower::Affine>& index) const {
  const schedule::Buffer& b = program_.buffers[buffer];
  lower::Affine addr = lower::Affine::Const(0);
  for (size_t k = 0; k < index.size(); ++k)
    if (b.shape[k] != 1) addr = lower::Add(addr, lower::Scale(index[k], b.strides[k]));
  return lower::ToC(addr, var_names_);
}

size_t ScopedEmitter::TargetScope(const Expr& e) {
  auto it = free_vars_.find(&e);
  if (it == free_vars_.end()) it = free_vars_.emplace(&e, e.FreeVars()).first;
  size_t target = 0;
  for (size_t i = 0; i < scopes_.size(); ++i)
    if (scopes_[i].var >= 0 && std::count(it->second.begin(), it->second.end(), scopes_[i].var))
      target = i;
  return target;
}

std::string ScopedEmitter::FlatReducedIndex(const Expr& e, const std::string& inner) const {
  std::string lin;
  int64_t stride = 1;
  for (size_t k = e.rvars.size(); k-- > 0;) {
    const std::string& name =
        k + 1 == e.rvars.size() && !inner.empty() ? inner : var_names_[e.rvars[k]];
    std::string term = stride == 1 ? name : absl::StrCat(stride, " * ", name);
    lin = lin.empty() ? term : absl::StrCat(term, " + ", lin);
    stride *= kernel_.extents[e.rvars[k]];
  }
  return lin;
}

std::string ScopedEmitter::Emit(const lower::ExprPtr& ep) {
  const Expr& e = *ep;
  if (e.kind == Expr::Kind::kConst) return Literal(e.dtype, e.fvalue, e.ivalue);
  size_t target = TargetScope(e);
  for (size_t i = 0; i <= target; ++i) {
    auto hit = scopes_[i].cache.find(&e);
    if (hit != scopes_[i].cache.end()) return hit->second;
  }
  if (e.kind == Expr::Kind::kStoreAlso) {
    // The value, then its store in the scope that computes it (the innermost one binding the
    // stored element's index).
    const std::string v = Emit(e.args[0]);
    const schedule::Buffer& b = program_.buffers[e.buffer];
    const std::string typed =
        b.dtype == ir::DType::kBool ? v : absl::StrCat("(", ComputeTypeName(b.dtype), ")(", v, ")");
    scopes_[target].stmts.push_back(absl::StrCat(buffer_names_[e.buffer], "[",
                                                 Address(e.buffer, e.index),
                                                 "] = ", StoreConvert(b.dtype, typed), ";"));
    if (!std::count(stored_also_.begin(), stored_also_.end(), e.buffer))
      stored_also_.push_back(e.buffer);
    scopes_[target].cache[&e] = v;
    return v;
  }
  std::string ref;
  if (Hoist(ep, target, &ref)) {
    scopes_[target].cache[&e] = ref;
    return ref;
  }
  std::string name = NewTemp();
  if (e.kind == Expr::Kind::kReduce) {
    EmitReduce(e, name, target);
    ref = ValueRef(target, name);
  } else {
    std::string text;
    if (e.kind == Expr::Kind::kLoad) {
      text = LoadConvert(
          e.dtype, absl::StrCat(buffer_names_[e.buffer], "[", Address(e.buffer, e.index), "]"));
    } else if (e.kind == Expr::Kind::kGather) {
      // The position along the gathered axis is a value (already in range), scaled by that
      // axis's stride; the rest of the address is the affine part.
      const std::string at = Emit(e.args[0]);
      const int64_t stride = program_.buffers[e.buffer].strides[e.ivalue];
      text = LoadConvert(
          e.dtype, absl::StrCat(buffer_names_[e.buffer], "[", Address(e.buffer, e.index), " + ",
                                stride, " * ", at, "]"));
    } else if (e.kind == Expr::Kind::kUnary && (e.op == "sin" || e.op == "cos") &&
               ir::IsFloat(e.dtype) && PairsSinCos()) {
      const std::string arg = Emit(e.args[0]);
      auto [pair, fresh] = scopes_[target].sincos.try_emplace(arg);
      if (fresh) {
        pair->second = {name, NewTemp()};
        scopes_[target].stmts.push_back(
            absl::StrCat(ComputeTypeName(e.dtype), " ", name, ", ", pair->second.second,
                         "; kiln_sincos(", arg, ", &", name, ", &", pair->second.second, ");"));
      }
      ref = e.op == "sin" ? pair->second.first : pair->second.second;
      scopes_[target].cache[&e] = ref;
      return ref;
    } else {
      std::vector<std::string> args;
      for (const lower::ExprPtr& a : e.args) args.push_back(Emit(a));
      std::string index_text = e.index.empty() ? "" : lower::ToC(e.index[0], var_names_);
      text = PointwiseText(e, args, index_text);
    }
    ref = Define(target, e, name, text);
  }
  scopes_[target].cache[&e] = ref;
  return ref;
}

std::string ScopedEmitter::Define(size_t target, const Expr& e, const std::string& name,
                                  const std::string& text) {
  scopes_[target].stmts.push_back(
      absl::StrCat("const ", ComputeTypeName(e.dtype), " ", name, " = ", text, ";"));
  return name;
}

std::string ScopedEmitter::ReducePragma(const Expr& e, const std::string& acc) const {
  const std::string& op = e.op;
  if (op == "argmax" || op == "argmin") return "";
  std::string s = absl::StrCat("#pragma omp simd reduction(", ReduceClauseOp(op), ":", acc, ")");
  if ((op == "max" || op == "min") && ir::IsFloat(e.dtype))
    absl::StrAppend(&s, " reduction(|:", acc, "_nan)");
  return s;
}

void ScopedEmitter::EmitTwoPassArg(const Expr& e, const std::string& result, size_t target) {
  std::vector<Scope> saved(scopes_.begin() + target + 1, scopes_.end());
  scopes_.resize(target + 1);
  const ir::DType vt = e.args[0]->dtype;
  const std::string ctype = ComputeTypeName(vt);
  const bool fl = ir::IsFloat(vt);
  const std::string extreme = e.op == "argmax" ? "max" : "min";
  const std::string best = result + "_best", found = result + "_found", idx = result + "_idx";
  const std::string acc = result + "_acc", nan = acc + "_nan", bidx = result + "_bidx";
  // Blocks run along the innermost reduced loop; the others are plain loops around them, and
  // an index is the flat position over all of them (row-major, as NumPy's).
  const int rv = e.rvars.back();
  const std::string& iv = var_names_[rv];
  const std::string start = iv + "_b", end = iv + "_e";
  const int64_t extent = kernel_.extents[rv];
  int64_t total = 1;
  for (int r : e.rvars) total *= kernel_.extents[r];
  const std::string head =
      absl::StrCat("for (int64_t ", iv, " = ", start, "; ", iv, " < ", end, "; ++", iv, ") {");
  // As in EmitReduce, the loops are built apart and placed after whatever the body's values
  // put into the enclosing scopes (a value used again after the reduction stays in scope).
  std::vector<std::string> pre = {
      absl::StrCat(ctype, " ", best, " = ", ReduceInit(extreme, vt), ";")};
  if (fl) pre.push_back(absl::StrCat("int ", found, " = 0;"));
  pre.push_back(absl::StrCat("int64_t ", idx, " = ", total, ";"));
  for (size_t k = 0; k + 1 < e.rvars.size(); ++k) PushScope(e.rvars[k]);
  // Pass 1's body: the block's extreme value, NaNs flagged.
  PushScope(rv);
  AddStatement(ReduceCombine(extreme, acc, Emit(e.args[0]), vt));
  const std::vector<std::string> pass1 = PopScope();
  // Pass 2's body: the least index in the block holding its extreme (or a NaN).
  PushScope(rv);
  const std::string v = Emit(e.args[0]);
  // Masks, not `nan ? v != v : v == acc`: GCC vectorises that select three times slower.
  const std::string hit = fl ? absl::StrCat("(((", v, " == ", acc, ") & !", nan, ") | ((", v,
                                            " != ", v, ") & (", nan, " != 0)))")
                             : absl::StrCat("(", v, " == ", acc, ")");
  AddStatement(absl::StrCat("const int64_t ", bidx, "_c = ", hit, " ? ", iv, " : ", end, ";"));
  AddStatement(absl::StrCat(bidx, " = ", bidx, "_c < ", bidx, " ? ", bidx, "_c : ", bidx, ";"));
  const std::vector<std::string> pass2 = PopScope();
  // The first NaN ends the search: no later block runs.
  std::vector<std::string> loop =
      BlockLoopHead(start, end, extent, arg_block_, fl ? "!" + found : "");
  loop.insert(loop.begin(), kNoUnroll);  // see EmitReduce
  loop.push_back(absl::StrCat("  ", ctype, " ", acc, " = ", ReduceInit(extreme, vt), ";"));
  if (fl) loop.push_back(absl::StrCat("  int ", nan, " = 0;"));
  loop.push_back(absl::StrCat("#pragma omp simd reduction(", extreme, ":", acc, ")",
                              fl ? absl::StrCat(" reduction(|:", nan, ")") : ""));
  loop.push_back("  " + head);
  for (const std::string& line : pass1) loop.push_back("    " + line);
  loop.push_back("  }");
  // Pass 2 runs only for a block that beats the earlier ones (strictly: the first index wins
  // ties) or holds the first NaN, which ends the search.
  loop.push_back(absl::StrCat("  if (", fl ? absl::StrCat(nan, " || ") : "", acc,
                              e.op == "argmax" ? " > " : " < ", best, ") {"));
  loop.push_back(absl::StrCat("    int64_t ", bidx, " = ", end, ";"));
  loop.push_back(absl::StrCat("#pragma omp simd reduction(min:", bidx, ")"));
  loop.push_back("    " + head);
  for (const std::string& line : pass2) loop.push_back("      " + line);
  loop.push_back("    }");
  loop.push_back(absl::StrCat("    ", best, " = ", acc, ";"));
  loop.push_back(absl::StrCat("    ", idx, " = ", FlatReducedIndex(e, bidx), ";"));
  if (fl) loop.push_back(absl::StrCat("    ", found, " = ", nan, ";"));
  loop.push_back("  }");
  loop.push_back("}");
  // The outer reduced loops around it, innermost first, each after its own scope's values.
  for (size_t k = e.rvars.size() - 1; k-- > 0;) {
    std::vector<std::string> stmts = PopScope();
    stmts.insert(stmts.end(), loop.begin(), loop.end());
    const std::string& ov = var_names_[e.rvars[k]];
    loop = {absl::StrCat("for (int64_t ", ov, " = 0; ", ov, " < ", kernel_.extents[e.rvars[k]],
                         "; ++", ov, ") {")};
    for (std::string& line : stmts) loop.push_back("  " + line);
    loop.push_back("}");
  }
  std::vector<std::string>& out = scopes_[target].stmts;
  out.insert(out.end(), pre.begin(), pre.end());
  out.insert(out.end(), loop.begin(), loop.end());
  // No block beat the initial value (an empty range, or every element equal to it): 0.
  out.push_back(absl::StrCat("const ", ComputeTypeName(e.dtype), " ", result, " = ", idx,
                             " == ", total, " ? 0 : ", idx, ";"));
  scopes_.insert(scopes_.end(), saved.begin(), saved.end());
}

void ScopedEmitter::EmitReduce(const Expr& e, const std::string& result, size_t target) {
  const std::string& op = e.op;
  bool arg = op == "argmax" || op == "argmin";
  ir::DType vt = arg ? e.args[0]->dtype : e.dtype;
  // Inside a vectorised loop (k-means: the argmin over 8 means, vectorised across points) the
  // one-loop form stays: it is the vector loop's body.
  const bool in_vector_loop = simd_scope_ >= 0 && static_cast<int>(target) >= simd_scope_;
  if (arg && arg_block_ > 0 && vt != ir::DType::kBool && !in_vector_loop) {
    EmitTwoPassArg(e, result, target);
    return;
  }
  // The body sees the scopes up to `target`, then the reduction's own loops.
  std::vector<Scope> saved(scopes_.begin() + target + 1, scopes_.end());
  scopes_.resize(target + 1);
  std::string acc = result + "_acc";
  // any/all: a byte, the width of the bools they read (an int accumulator made GCC widen every
  // byte to 32 bits: a row `any` of 3000 x 3001 bools took 1.08 ms, with a byte 0.15).
  std::string ctype = (op == "any" || op == "all") ? "unsigned char" : ComputeTypeName(vt);
  const int64_t inner_extent = kernel_.extents[e.rvars.back()];
  const bool blocked =
      sum_block_ > 0 && op == "sum" && ir::IsFloat(vt) && inner_extent > sum_block_;
  // Blocked: `acc` is the double total, `block` the block's partial in the element type.
  const std::string block = blocked ? result + "_blk" : acc;
  std::vector<std::string> pre = {
      blocked ? absl::StrCat("double ", acc, " = 0.0;")
              : absl::StrCat(ctype, " ", acc, " = ", ReduceInit(op, vt), ";")};
  bool nan_flag = (op == "max" || op == "min") && ir::IsFloat(vt);
  if (nan_flag) pre.push_back(absl::StrCat("int ", acc, "_nan = 0;"));
  if (arg) pre.push_back(absl::StrCat("int64_t ", result, "_idx = 0;"));
  for (int rv : e.rvars) PushScope(rv);
  std::string v = Emit(e.args[0]);
  std::string combine;
  if (arg) {
    // First index wins ties; the first NaN wins over numbers (NumPy).
    const std::string lin = FlatReducedIndex(e);
    const char* cmp = op == "argmax" ? ">" : "<";
    std::string better = absl::StrCat(v, " ", cmp, " ", acc);
    if (ir::IsFloat(vt))
      better = absl::StrCat("(", better, ") || (", v, " != ", v, " && ", acc, " == ", acc, ")");
    combine =
        absl::StrCat("if (", better, ") { ", acc, " = ", v, "; ", result, "_idx = ", lin, "; }");
  } else {
    combine = ReduceCombine(op, block, v, vt);
  }
  AddStatement(combine);
  // Close the loops innermost first, wrapping each body in its for statement.
  std::vector<std::string> body;
  for (int k = static_cast<int>(e.rvars.size()) - 1; k >= 0; --k) {
    std::vector<std::string> stmts = PopScope();
    stmts.insert(stmts.end(), body.begin(), body.end());
    const std::string& iv = var_names_[e.rvars[k]];
    std::vector<std::string> loop;
    bool inside_simd = simd_scope_ >= 0 && static_cast<int>(target) >= simd_scope_;
    const bool innermost = k == static_cast<int>(e.rvars.size()) - 1;
    if (innermost && !inside_simd) {
      std::string pragma = ReducePragma(e, block);
      if (!pragma.empty()) loop.push_back(pragma);
    }
    const int64_t extent = kernel_.extents[e.rvars[k]];
    if (innermost && blocked) {
      // for (iv_b = 0; iv_b < n; iv_b += B) { block = 0; for (iv = iv_b; iv < end; ++iv) ...; acc
      // += block; }
      const std::string start = iv + "_b", end = iv + "_e";
      loop.push_back(
          absl::StrCat("for (int64_t ", iv, " = ", start, "; ", iv, " < ", end, "; ++", iv, ") {"));
      for (std::string& s : stmts) loop.push_back("  " + s);
      loop.push_back("}");
      // Not unrolled: GCC 12 unrolls a block loop of constant trip count completely and then
      // does not vectorise the simd reductions in the copies (a row sum of 2048: 1.97 ms
      // scalar against 0.58 vectorised).
      std::vector<std::string> outer = BlockLoopHead(start, end, extent, sum_block_);
      outer.insert(outer.begin(), kNoUnroll);
      outer.push_back(absl::StrCat("  ", ctype, " ", block, " = ", ReduceInit(op, vt), ";"));
      for (std::string& s : loop) outer.push_back("  " + s);
      outer.push_back(absl::StrCat("  ", acc, " += ", block, ";"));
      outer.push_back("}");
      body = std::move(outer);
      continue;
    }
    loop.push_back(
        absl::StrCat("for (int64_t ", iv, " = 0; ", iv, " < ", extent, "; ++", iv, ") {"));
    for (std::string& s : stmts) loop.push_back("  " + s);
    loop.push_back("}");
    body = std::move(loop);
  }
  std::vector<std::string>& out = scopes_[target].stmts;
  out.insert(out.end(), pre.begin(), pre.end());
  out.insert(out.end(), body.begin(), body.end());
  std::string value = arg ? absl::StrCat(result, "_idx") : acc;
  if (blocked) value = absl::StrCat("(", ctype, ")", acc);
  if (nan_flag)
    value = absl::StrCat("(", acc, "_nan ? ", Literal(vt, __builtin_nan(""), 0), " : ", acc, ")");
  if (op == "any" || op == "all") value = absl::StrCat("(", acc, " != 0)");
  out.push_back(absl::StrCat("const ", ComputeTypeName(e.dtype), " ", result, " = ", value, ";"));
  scopes_.insert(scopes_.end(), saved.begin(), saved.end());
}

std::unordered_set<std::string> IdentifiersIn(const std::string& text, char followed_by) {
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::unordered_set<std::string> out;
  for (size_t i = 0; i < text.size();) {
    if (!ident(text[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && ident(text[j])) ++j;
    if (followed_by == 0 || (j < text.size() && text[j] == followed_by))
      out.insert(text.substr(i, j - i));
    i = j;
  }
  return out;
}

std::vector<std::string> BlockLoopHead(const std::string& start, const std::string& end,
                                       int64_t extent, int64_t step, const std::string& also) {
  return {absl::StrCat("for (int64_t ", start, " = 0; ", start, " < ", extent,
                       also.empty() ? "" : " && ", also, "; ", start, " += ", step, ") {"),
          absl::StrCat("  const int64_t ", end, " = ", extent, " - ", start, " < ", step, " ? ",
                       extent, " : ", start, " + ", step, ";")};
}

std::string Indent(const std::vector<std::string>& lines, int depth) {
  std::string pad(2 * depth, ' ');
  std::string s;
  for (const std::string& l : lines)
    absl::StrAppend(&s, l.rfind("#pragma", 0) == 0 ? "" : pad, l, "\n");
  return s;
}

}  // namespace kiln::codegen
