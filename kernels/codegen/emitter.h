// Scoped expression emitter shared by the C-family backends.
//
// Prints a kernel's element expressions as statements placed in the outermost loop scope
// where all the loop variables they read are bound: a reduction over a row is computed once
// per row, not once per element (loop-invariant hoisting), and a value used twice in a scope
// is computed once (common subexpressions). Scopes form a chain: the prologue (no variable),
// then one scope per loop, outermost first. Reductions open loops of their own.
// Thread-safety: one emitter per kernel, used by one thread.
#pragma once

#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/lower/expr.h"
#include "kernels/schedule/program.h"

namespace kiln::codegen {

// The line before a block loop of a reduction that keeps it rolled (see EmitReduce).
inline constexpr char kNoUnroll[] = "#pragma GCC unroll 1";

class ScopedEmitter {
 public:
  // `names[v]` is the C name of loop variable v; `buffer_names[b]` the pointer of buffer b.
  ScopedEmitter(const schedule::Program& program, const schedule::Kernel& kernel,
                std::vector<std::string> var_names, std::vector<std::string> buffer_names);
  virtual ~ScopedEmitter() = default;

  // Opens a scope binding loop variable `var` (-1 for the prologue).
  void PushScope(int var);
  // Closes the innermost scope and returns its statements.
  std::vector<std::string> PopScope();
  // Emits `e` (and what it needs) and returns a C expression naming its value.
  std::string Emit(const lower::ExprPtr& e);
  // Adds a statement to the innermost scope.
  void AddStatement(std::string s) { scopes_.back().stmts.push_back(std::move(s)); }
  // Scopes at or below this index run inside a vectorised loop: reductions placed there get
  // no simd pragma of their own (OpenMP forbids nesting simd regions). -1: none.
  void set_simd_scope(int index) { simd_scope_ = index; }
  // Floating-point sums whose innermost reduced range is longer than `n` run it in blocks of
  // `n`: each block sums into a fresh accumulator (vectorised), and the blocks' sums are
  // added in double. One accumulator over the whole range adds every element to a partial
  // sum that keeps growing, so its rounding error grows with the length (1e-5 relative on a
  // float row of 2e5 elements, where NumPy's pairwise sum is 1e-7); in blocks it grows with
  // the block's length per lane and not at all across blocks. 0: no blocks (the default).
  void set_sum_block(int64_t n) { sum_block_ = n; }
  // argmax/argmin over one reduced loop run in blocks of `n` as two vector loops each: the
  // block's extreme value (and whether it holds a NaN); then, only for a block that beats the
  // earlier ones, the least index in it holding that value (the first NaN, which ends the
  // search). The block is still in the first-level cache for the second loop. The one-loop
  // form compares and branches per element and does not vectorise. 0: the one-loop form.
  void set_two_pass_arg(int64_t n) { arg_block_ = n; }

  // Buffers written by kStoreAlso nodes emitted so far (a kernel's parameters must not be const).
  const std::vector<int>& stored_also() const { return stored_also_; }
  // The flat address text of buffer `b` at `index` (its strides applied).
  std::string Address(int buffer, const std::vector<lower::Affine>& index) const;
  const std::vector<std::string>& var_names() const { return var_names_; }

 protected:
  struct Scope {
    int var = -1;
    std::vector<std::string> stmts;
    std::map<const lower::Expr*, std::string> cache;
    // Backends that pair sin and cos (PairsSinCos): argument text -> (sin, cos) temporaries.
    std::map<std::string, std::pair<std::string, std::string>> sincos;
  };
  // Whether sin and cos of one value come from one kiln_sincos(x, &s, &c) call: where both
  // are needed they share the argument's reduction (compilers do not merge two library calls
  // that each branch to a slow path); where one is, the other half is dead code.
  virtual bool PairsSinCos() const { return false; }
  // Prints the loop(s) of a reduction whose value lands in `result`. The default runs the
  // reduction sequentially with an OpenMP simd hint on the innermost loop; `scope_index` is
  // where the statements go. Backends may override.
  virtual void EmitReduce(const lower::Expr& e, const std::string& result, size_t scope_index);
  // Pragma placed before the innermost loop of a reduction (empty: none).
  virtual std::string ReducePragma(const lower::Expr& e, const std::string& acc) const;
  // Backend hooks around one value placed in scope `target`. Hoist: computes `e` elsewhere
  // (e.g. once, into a table) and sets `ref` to the text reading it; false: emit as usual.
  // Define: the statement(s) defining `name` = `text`; returns the text naming the value.
  // ValueRef: the text naming a reduction's result `name`.
  virtual bool Hoist(const lower::ExprPtr&, size_t, std::string*) { return false; }
  virtual std::string Define(size_t target, const lower::Expr& e, const std::string& name,
                             const std::string& text);
  virtual std::string ValueRef(size_t, const std::string& name) { return name; }

  // StrCat, not "t" + std::to_string(): GCC 12 at -O3 warns falsely (-Wrestrict) inside
  // std::string's operator+ (GCC bug 105651).
  std::string NewTemp() { return absl::StrCat("t", next_temp_++); }
  // Index of the scope where `e` belongs: the deepest scope binding one of its free vars.
  size_t TargetScope(const lower::Expr& e);
  // The row-major flat position over reduction `e`'s reduced loops (an argmax's index), the
  // innermost loop's variable read as `inner` (its own name when empty).
  std::string FlatReducedIndex(const lower::Expr& e, const std::string& inner = "") const;

  const schedule::Program& program_;
  const schedule::Kernel& kernel_;
  std::vector<std::string> var_names_;
  std::vector<std::string> buffer_names_;
  std::vector<Scope> scopes_;
  std::map<const lower::Expr*, std::vector<int>> free_vars_;
  int next_temp_ = 0;
  int simd_scope_ = -1;
  int64_t sum_block_ = 0;
  int64_t arg_block_ = 0;
  std::vector<int> stored_also_;

 private:
  void EmitTwoPassArg(const lower::Expr& e, const std::string& result, size_t target);
};

// Joins statements with indentation.
std::string Indent(const std::vector<std::string>& lines, int depth);

// The head of a loop over blocks of `step` along a range of `extent` (the last block partial):
// "for (int64_t START = 0; START < extent; START += step) {" and, indented inside it,
// "const int64_t END = <START + step, or extent for the last block>;". The body runs the
// blocked variable from START to END. `also`: a further condition for going on ("" for none).
std::vector<std::string> BlockLoopHead(const std::string& start, const std::string& end,
                                       int64_t extent, int64_t step, const std::string& also = "");

// The identifiers in C text, in one pass: what a kernel mentions, so that choosing its
// parameters costs one scan of its text rather than one search per buffer of the program.
// `followed_by`: only identifiers directly followed by that character (0: all).
std::unordered_set<std::string> IdentifiersIn(const std::string& text, char followed_by = 0);

}  // namespace kiln::codegen
