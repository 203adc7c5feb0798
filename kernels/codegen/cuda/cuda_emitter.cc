#include "kernels/codegen/cuda/cuda_emitter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/codegen/c_expr.h"

namespace kiln::codegen::cuda {

using lower::Affine;
using lower::Expr;
using lower::ExprPtr;

std::string LoadKey(int buffer, const Affine& addr) {
  return absl::StrCat(buffer, "@", AffineKey(addr));
}

CudaEmitter::CudaEmitter(schedule::Program* program, schedule::Kernel* kernel,
                         std::vector<std::string> var_names, std::vector<std::string> buffer_names,
                         ExprPool* pool, std::string index_type)
    : ScopedEmitter(*program, *kernel, std::move(var_names), std::move(buffer_names)),
      program_(program),
      kernel_ext_(kernel),
      pool_(pool),
      index_type_(std::move(index_type)) {}

int CudaEmitter::NewVar(int64_t extent, const std::string& name) {
  kernel_ext_->extents.push_back(extent);
  var_names_.push_back(name);
  return static_cast<int>(kernel_ext_->extents.size()) - 1;
}

int CudaEmitter::AddRegisterArray(ir::DType t, int64_t n, const std::string& name) {
  // Shape [2, n] with a zero stride first: a register read's index names the variable it
  // depends on (which keeps it inside its block) without that variable entering the address.
  schedule::Buffer b;
  b.role = schedule::Buffer::Role::kTemp;
  b.index = -1;
  b.dtype = t;
  b.shape = {2, n};
  b.strides = {0, 1};
  program_->buffers.push_back(std::move(b));
  buffer_names_.push_back(name);
  return static_cast<int>(program_->buffers.size()) - 1;
}

ExprPtr CudaEmitter::RegisterRead(int reg_buffer, ir::DType t, int64_t element, int dep_var) {
  Expr e;
  e.kind = Expr::Kind::kLoad;
  e.dtype = t;
  e.buffer = reg_buffer;
  e.index = {dep_var >= 0 ? Affine::Var(dep_var) : Affine::Const(0), Affine::Const(element)};
  return pool_->Intern(std::move(e));
}

// ---- Lane groups.

CudaEmitter::LaneGroup::LaneGroup(CudaEmitter* em, int var, Affine first, int V, int dep_var,
                                  int64_t cache_offset)
    : em_(em),
      var_(var),
      first_(std::move(first)),
      V_(V),
      dep_var_(dep_var),
      cache_offset_(cache_offset) {}

ExprPtr CudaEmitter::LaneGroup::Lane(const ExprPtr& tree, int u) {
  const lower::VarExtents& ext = em_->extents();
  for (const Expr* n : Nodes(tree))
    for (int rv : n->rvars) em_->rvars.insert(rv);
  auto clamped = clamped_.find(u);
  const bool clamp = clamped != clamped_.end();
  Affine at = clamp ? Affine::Var(clamped->second.first) : lower::AddConst(first_, u);
  RewriteRules rules;
  rules.affine = [&](const Affine& a) {
    if (!a.Uses(var_)) return a;
    if (clamp && !clamped->second.second.empty()) {  // defined once, where first read
      fills_.push_back(std::move(clamped->second.second));
      clamped->second.second.clear();
    }
    return lower::Substitute(a, var_, at, ext);
  };
  rules.shadowed_by_reduce = {var_};
  rules.load = [&](const Expr& load) -> ExprPtr {
    const schedule::Buffer& b = em_->program().buffers[load.buffer];
    if (b.role == schedule::Buffer::Role::kConst || b.index < 0) return nullptr;
    Affine addr = FlatAddress(b, load.index);
    if (!addr.Uses(var_)) return nullptr;
    if (cache_offset_ >= 0 && em_->cache && em_->cache->var == var_) {
      auto it = em_->cache->entries.find(LoadKey(load.buffer, addr));
      if (it != em_->cache->entries.end())
        return em_->RegisterRead(it->second.reg_buffer, load.dtype, cache_offset_ + u, -1);
    }
    // A vector access is at most 16 bytes (kiln_vload): wider lanes of this type read scalars.
    if (V_ > 1 && V_ * ir::DTypeSize(b.dtype) <= 16 && VectorContiguous(addr, var_, V_)) {
      bool free_of_rvars = true;
      for (int v : VarsOf(addr)) free_of_rvars &= v == var_ || !em_->rvars.count(v);
      if (free_of_rvars) return VectorRead(load, addr, u);
    }
    return nullptr;
  };
  return Rewrite(tree, rules, em_->pool());
}

std::vector<int> CudaEmitter::LaneGroup::MakeRagged(const std::string& end,
                                                    const std::string& count) {
  count_ = count;
  std::vector<int> vars;
  for (int u = 1; u < V_; ++u) {
    const std::string name = absl::StrCat("kl", u);
    const int v = em_->NewVar(em_->extents()[var_], name);  // the range's values, as `var` has
    const std::string at = em_->Text(lower::AddConst(first_, u));
    // A ternary, not min(): `at` and `end` may differ in width (int index, 64-bit sizes).
    clamped_[u] = {v, absl::StrCat("const ", em_->index_type(), " ", name, " = (", at, " < ", end,
                                   ") ? ", at, " : ", end, " - 1;")};
    vars.push_back(v);
  }
  return vars;
}

ExprPtr CudaEmitter::LaneGroup::VectorRead(const Expr& load, const Affine& addr, int u) {
  std::string key = LoadKey(load.buffer, addr);
  auto it = vectors_.find(key);
  if (it == vectors_.end()) {
    const ir::DType dtype =
        em_->program().buffers[load.buffer].dtype;  // copied: the next line grows buffers
    std::string name = absl::StrCat("kv", em_->next_temp_++);
    int reg = em_->AddRegisterArray(dtype, V_, name);
    Affine start = lower::Substitute(addr, var_, first_, em_->extents());
    fills_.push_back(
        absl::StrCat("__align__(16) ", StorageType(dtype, true), " ", name, "[", V_, "];"));
    if (count_.empty())
      fills_.push_back(absl::StrCat("kiln_vload<", V_, ">(", name, ", ",
                                    em_->buffer_names_[load.buffer], " + (", em_->Text(start),
                                    "));"));
    else
      fills_.push_back(absl::StrCat("kiln_vload_n<", V_, ">(", name, ", ",
                                    em_->buffer_names_[load.buffer], " + (", em_->Text(start),
                                    "), ", count_, ");"));
    it = vectors_.emplace(key, reg).first;
  }
  return em_->RegisterRead(it->second, load.dtype, u, dep_var_);
}

void CudaEmitter::EmitRowLoop(const RowSplit& s, int var, bool use_cache,
                              const std::string& extra_guard,
                              const std::function<void(LaneGroup&, int)>& lane,
                              const std::function<void(LaneGroup&, const std::string&)>& after) {
  const int64_t step = static_cast<int64_t>(s.V) * s.TR;
  std::string end = s.end.empty() ? absl::StrCat(s.extent) : s.end;
  bool whole = s.base.IsConst() && s.base.constant == 0 && s.end.empty();
  auto block = [&](const std::string& cond, const std::vector<std::string>& fills,
                   const std::vector<std::string>& stmts, std::vector<std::string>* out) {
    out->push_back(cond.empty() ? "{" : absl::StrCat("if (", cond, ") {"));
    for (const std::string& f : fills) out->push_back("  " + f);
    for (const std::string& st : stmts) out->push_back("  " + st);
    out->push_back("}");
  };
  auto join = [](const std::string& a, const std::string& b) {
    if (a.empty()) return b;
    if (b.empty()) return a;
    return absl::StrCat(a, " && ", b);
  };
  if (s.unrolled) {
    for (int64_t q = 0; q < s.Q; ++q) {
      Affine first =
          lower::Add(s.base, lower::AddConst(lower::Scale(Affine::Var(kt_var), s.V), step * q));
      std::string e0 = Text(first);
      bool guard = s.tail || !(whole && step * (q + 1) <= s.extent);
      PushScope(kt_var);
      LaneGroup g(this, var, first, s.V, kt_var, use_cache ? q * s.V : -1);
      for (int u = 0; u < s.V; ++u) lane(g, u);
      after(g, e0);
      std::vector<std::string> stmts = PopScope();
      std::vector<std::string> out;
      block(join(guard ? absl::StrCat(e0, " < ", end) : "", extra_guard), g.fills(), stmts, &out);
      for (std::string& l : out) AddStatement(std::move(l));
    }
    if (!s.tail) return;
  }
  // The loop: every q (looped), or the q past the unrolled ones (a tail).
  const std::string from = s.tail ? absl::StrCat(s.Q) : "0";
  int kq = NewVar(s.Q, absl::StrCat("kq", next_temp_++));
  Affine first = lower::Add(s.base, lower::Add(lower::Scale(Affine::Var(kt_var), s.V),
                                               lower::Scale(Affine::Var(kq), step)));
  std::string e0 = Text(first);
  PushScope(kq);
  LaneGroup g(this, var, first, s.V, kq, -1);
  for (int u = 0; u < s.V; ++u) lane(g, u);
  after(g, e0);
  std::vector<std::string> stmts = PopScope();
  std::vector<std::string> out;
  const std::string trips = s.q_text.empty() ? absl::StrCat(s.Q) : s.q_text;
  out.push_back(absl::StrCat("for (", index_type_, " ", var_names_[kq], " = ", from, "; ",
                             var_names_[kq], " < ", trips, "; ++", var_names_[kq], ") {"));
  std::vector<std::string> inner;
  block(join(absl::StrCat(e0, " < ", end), extra_guard), g.fills(), stmts, &inner);
  for (std::string& l : inner) out.push_back("  " + l);
  out.push_back("}");
  for (std::string& l : out) AddStatement(std::move(l));
}

// ---- Reductions.

namespace {

struct ReduceText {
  bool arg, nan_flag, boolean;
  ir::DType vt;
  std::string acc, ctype, op_struct;
};

ReduceText Describe(const Expr& e, const std::string& result) {
  ReduceText t;
  const std::string& op = e.op;
  t.arg = op == "argmax" || op == "argmin";
  t.vt = t.arg ? e.args[0]->dtype : e.dtype;
  t.boolean = op == "any" || op == "all";
  t.nan_flag = (op == "max" || op == "min") && ir::IsFloat(t.vt);
  t.acc = result + "_acc";
  t.ctype = t.boolean ? "int" : ComputeTypeName(t.vt);
  t.op_struct = op == "sum"    ? "kiln_op_sum"
                : op == "prod" ? "kiln_op_prod"
                : op == "max"  ? "kiln_op_max"
                : op == "min"  ? "kiln_op_min"
                : op == "any"  ? "kiln_op_or"
                               : "kiln_op_and";
  return t;
}

std::vector<std::string> Prelude(const ReduceText& t, const std::string& op,
                                 const std::string& result) {
  std::vector<std::string> pre = {
      absl::StrCat(t.ctype, " ", t.acc, " = ", ReduceInit(op, t.vt), ";")};
  if (t.nan_flag) pre.push_back(absl::StrCat("int ", t.acc, "_nan = 0;"));
  if (t.arg) pre.push_back(absl::StrCat("long long ", result, "_idx = 0;"));
  return pre;
}

// Folds a value (and its index) into the accumulator, keeping the first of equal values and
// letting the first NaN win, like the sequential loops.
std::string Combine(const ReduceText& t, const std::string& op, const std::string& result,
                    const std::string& v, const std::string& idx) {
  if (!t.arg) return ReduceCombine(op, t.acc, v, t.vt);
  const char* cmp = op == "argmax" ? ">" : "<";
  std::string better = absl::StrCat(v, " ", cmp, " ", t.acc);
  if (ir::IsFloat(t.vt))
    better = absl::StrCat("(", better, ") || (", v, " != ", v, " && ", t.acc, " == ", t.acc, ")");
  return absl::StrCat("if (", better, ") { ", t.acc, " = ", v, "; ", result, "_idx = ", idx, "; }");
}

// The reduction's value once the accumulators hold the whole result.
std::vector<std::string> Finish(const ReduceText& t, const Expr& e, const std::string& result) {
  std::string value = t.arg ? absl::StrCat(result, "_idx") : t.acc;
  if (t.boolean) value = absl::StrCat("(", t.acc, " != 0)");
  std::vector<std::string> out = {
      absl::StrCat("const ", ComputeTypeName(e.dtype), " ", result, " = ", value, ";")};
  if (t.arg) out.push_back(absl::StrCat("const ", t.ctype, " ", result, "_v = ", t.acc, ";"));
  return out;
}

}  // namespace

void CudaEmitter::EmitReduce(const Expr& e, const std::string& result, size_t target) {
  auto it = coop.find(&e);
  if (it == coop.end()) {
    for (int rv : e.rvars) rvars.insert(rv);
    ScopedEmitter::EmitReduce(e, result, target);
    return;
  }
  if (it->second.y_groups > 0) {
    EmitColumnReduces({&e}, {result}, target);
  } else {
    EmitCoopReduce(e, it->second, result, target);
  }
}

void CudaEmitter::EmitCoopReduce(const Expr& e, const CoopReduce& r, const std::string& result,
                                 size_t target) {
  std::vector<Scope> saved(scopes_.begin() + target + 1, scopes_.end());
  scopes_.resize(target + 1);
  const std::string& op = e.op;
  ReduceText t = Describe(e, result);
  for (std::string& s : Prelude(t, op, result)) AddStatement(std::move(s));
  ExprPtr idx_tree;
  if (t.arg) {
    Expr ix;
    if (r.index_buffer >= 0) {
      ix.kind = Expr::Kind::kLoad;
      ix.buffer = r.index_buffer;
    } else {
      ix.kind = Expr::Kind::kIndex;
    }
    ix.dtype = ir::DType::kI64;
    ix.index = {Affine::Var(r.var)};
    idx_tree = pool_->Intern(std::move(ix));
  }
  EmitRowLoop(
      r.split, r.var, r.use_cache, "",
      [&](LaneGroup& g, int u) {
        std::string v = Emit(g.Lane(r.body, u));
        std::string i = t.arg ? Emit(g.Lane(idx_tree, u)) : "";
        AddStatement(Combine(t, op, result, v, i));
      },
      [](LaneGroup&, const std::string&) {});
  const int TR = r.split.TR;
  if (TR > 32) smem_bytes = std::max(smem_bytes, 512);
  std::string smem = TR > 32 ? "kiln_smem" : "nullptr";
  if (t.nan_flag)
    AddStatement(absl::StrCat(t.acc, " = ", t.acc, "_nan ? ", Literal(t.vt, __builtin_nan(""), 0),
                              " : ", t.acc, ";"));
  if (t.arg) {
    AddStatement(absl::StrCat("kiln_row_arg<", TR, ", ", op == "argmax" ? "true" : "false", ">(",
                              t.acc, ", ", result, "_idx, ", smem, ");"));
  } else {
    AddStatement(absl::StrCat(t.acc, " = kiln_row_reduce<", TR, ", ", t.op_struct, ">(", t.acc,
                              ", ", smem, ");"));
  }
  for (std::string& s : Finish(t, e, result)) AddStatement(std::move(s));
  scopes_.insert(scopes_.end(), saved.begin(), saved.end());
}

bool CudaEmitter::EmitColumnGroup(const std::vector<const Expr*>& nodes) {
  if (nodes.empty()) return false;
  const CoopReduce& r0 = coop.at(nodes[0]);
  const size_t target = TargetScope(*nodes[0]);
  for (const Expr* e : nodes) {
    const CoopReduce& r = coop.at(e);
    if (r.y_groups <= 0 || r.var != r0.var || r.y_groups != r0.y_groups ||
        r.col_begin != r0.col_begin || r.col_end != r0.col_end || TargetScope(*e) != target)
      return false;
    for (size_t i = 0; i <= target; ++i)
      if (scopes_[i].cache.count(e)) return false;  // emitted already
  }
  std::vector<std::string> results;
  for (size_t j = 0; j < nodes.size(); ++j) results.push_back(NewTemp());
  EmitColumnReduces(nodes, results, target);
  for (size_t j = 0; j < nodes.size(); ++j) scopes_[target].cache[nodes[j]] = results[j];
  return true;
}

void CudaEmitter::EmitColumnReduces(const std::vector<const Expr*>& nodes,
                                    const std::vector<std::string>& results, size_t target) {
  std::vector<Scope> saved(scopes_.begin() + target + 1, scopes_.end());
  scopes_.resize(target + 1);
  const CoopReduce& r = coop.at(nodes[0]);
  std::vector<ReduceText> texts;
  for (size_t j = 0; j < nodes.size(); ++j) {
    texts.push_back(Describe(*nodes[j], results[j]));
    for (std::string& s : Prelude(texts[j], nodes[j]->op, results[j])) AddStatement(std::move(s));
  }
  rvars.insert(r.var);
  const std::string& ev = var_names_[r.var];
  PushScope(r.var);
  for (size_t j = 0; j < nodes.size(); ++j) {
    std::string v = Emit(coop.at(nodes[j]).body);  // loads the bodies share are read once
    AddStatement(Combine(texts[j], nodes[j]->op, results[j], v, absl::StrCat("(long long)", ev)));
  }
  std::vector<std::string> stmts = PopScope();
  const std::string first = r.col_begin.empty()
                                ? var_names_[ky_var]
                                : absl::StrCat(r.col_begin, " + ", var_names_[ky_var]);
  const std::string end = r.col_end.empty() ? absl::StrCat(extents()[r.var]) : r.col_end;
  AddStatement(absl::StrCat("for (", index_type_, " ", ev, " = ", first, "; ", ev, " < ", end, "; ",
                            ev, " += ", r.y_groups, ") {"));
  for (std::string& s : stmts) AddStatement("  " + s);
  AddStatement("}");
  smem_bytes = std::max(smem_bytes, r.y_groups * 32 * 16);
  for (size_t j = 0; j < nodes.size(); ++j) {
    const ReduceText& t = texts[j];
    const std::string& op = nodes[j]->op;
    if (t.nan_flag)
      AddStatement(absl::StrCat(t.acc, " = ", t.acc, "_nan ? ", Literal(t.vt, __builtin_nan(""), 0),
                                " : ", t.acc, ";"));
    if (t.arg) {
      AddStatement(absl::StrCat("kiln_col_arg<", r.y_groups, ", ",
                                op == "argmax" ? "true" : "false", ">(", t.acc, ", ", results[j],
                                "_idx, kiln_smem);"));
    } else {
      AddStatement(absl::StrCat(t.acc, " = kiln_col_reduce<", r.y_groups, ", ", t.op_struct, ">(",
                                t.acc, ", kiln_smem);"));
    }
    for (std::string& s : Finish(t, *nodes[j], results[j])) AddStatement(std::move(s));
  }
  scopes_.insert(scopes_.end(), saved.begin(), saved.end());
}

}  // namespace kiln::codegen::cuda
