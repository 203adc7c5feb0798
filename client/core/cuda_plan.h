// CudaPlan: a CUDA launch plan (kernels/codegen/PLAN.md) as the CUDA loader uses it, and a
// reader for its JSON form (plan.json, as kilnc writes it), static plans (ABI version 1) and
// plans with symbolic sizes (version 2: "Symbolic CUDA plans").
//
// Plain C++ with no dependency beyond the standard library, so the loader's shared build
// (for ctypes) needs nothing but libc. Callers holding a kiln.v1.LaunchPlan fill the struct
// field by field.
// Thread-safety: plain values and a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::core {

// A size of a symbolic plan (kiln.v1.SizeExpr): a sum of terms, each an integer coefficient
// times a product of the plan's symbols (a symbol listed twice is squared).
struct CudaSizeExpr {
  struct Term {
    int64_t coeff = 0;
    std::vector<int> symbols;  // positions in CudaPlan::symbols
  };
  std::vector<Term> terms;

  // The value at `sizes` (one per symbol). INT64_MAX when it overflows.
  int64_t Eval(const int64_t* sizes) const;
};

// Parses an expression as plan.json writes it ("3*N*T + -2*N + 1": terms joined by " + ",
// factors by '*', each an integer or one of `symbols`). False, and why in `*error`, otherwise.
bool ParseCudaSizeExpr(std::string_view text, const std::vector<std::string>& symbols,
                       CudaSizeExpr* out, std::string* error);

struct CudaPlan {
  enum class Role { kInput, kOutput, kTemp };
  struct Buffer {
    Role role = Role::kInput;
    int index = 0;
    std::string dtype;
    std::vector<int64_t> shape;
    int64_t bytes = 0;
    int64_t offset = 0;
    // Symbolic plans: the shape and byte size at run time (shape and bytes hold -1 there,
    // and a temp's offset is laid out at launch).
    std::vector<CudaSizeExpr> shape_exprs;
    CudaSizeExpr bytes_expr;
  };
  struct Step {
    std::string kernel;
    unsigned grid[3] = {1, 1, 1};
    unsigned block[3] = {1, 1, 1};
    unsigned shared_bytes = 0;
    std::vector<int> args;  // positions in `buffers`
    // Symbolic plans: grid x is ceil(grid_work / grid_per_block) at the run's sizes.
    CudaSizeExpr grid_work;
    int64_t grid_per_block = 0;
    // A launch-time choice (symbolic plans): runs only when guard_min <= guard <= guard_max
    // at the run's sizes (guard_max 0: unbounded); both 0: always.
    CudaSizeExpr guard;
    int64_t guard_min = 0;
    int64_t guard_max = 0;
    bool guarded() const { return guard_min > 0 || guard_max > 0; }
    bool Runs(const int64_t* sizes) const {
      if (!guarded()) return true;
      const int64_t v = guard.Eval(sizes);
      return v >= guard_min && (guard_max <= 0 || v <= guard_max);
    }
  };
  // A symbol of a symbolic plan (ABI version 2): its value is dimension `axis` of input `input`.
  struct Symbol {
    std::string name;
    int input = 0;
    int axis = 0;
  };
  uint32_t abi_version = 0;
  int64_t workspace_bytes = 0;
  std::vector<Buffer> buffers;
  std::vector<Step> steps;
  std::vector<Symbol> symbols;
  // Symbolic plans: every index the kernels compute is below this (they use 32-bit ints).
  CudaSizeExpr index_bound;

  int num_inputs() const;
  int num_outputs() const;
  bool symbolic() const { return !symbols.empty(); }
};

// Parses plan.json. Returns false and says why in `*error` when the text is not JSON, a
// field is missing or has the wrong type, an index is out of range, or CheckCudaPlan refuses
// the plan.
bool ParseCudaPlan(std::string_view json, CudaPlan* plan, std::string* error);

// What a launcher relies on beyond the fields' types, for a plan parsed or filled in by a
// caller: every symbol names a dimension of an input buffer, and every step of a symbolic plan
// has a positive grid_per_block. Returns false and says why in `*error`.
bool CheckCudaPlan(const CudaPlan& plan, std::string* error);

}  // namespace kiln::core
