#include "kernels/codegen/cuda/cuda_codegen.h"

#include <algorithm>
#include <functional>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/codegen/c_expr.h"
#include "kernels/codegen/cuda/cuda_kernel.h"
#include "kernels/codegen/expr_rewrite.h"
#include "kernels/codegen/plan.h"
#include "kernels/codegen/variants.h"
#include "kernels/lower/lower.h"

namespace kiln::codegen {
namespace {

using schedule::Buffer;

// Constants live in device global memory (cached); half constants are kept as float, as
// the CPU backend does, and converted on load.
std::string ConstArray(const Buffer& b) {
  int64_t n = b.value.NumElements();
  bool half = b.dtype == ir::DType::kF16 || b.dtype == ir::DType::kBF16;
  std::vector<std::string> vals;
  for (int64_t k = 0; k < n; ++k) {
    if (half) {
      vals.push_back(Literal(ir::DType::kF32, b.value.AsDouble(k), 0));
      continue;
    }
    double f = b.value.f.empty() ? static_cast<double>(b.value.i[k]) : b.value.f[k];
    int64_t i = b.value.i.empty() ? 0 : b.value.i[k];  // float constants: unused (see cpu_codegen)
    vals.push_back(Literal(b.dtype, f, i));
  }
  std::string type = half ? "float" : StorageType(b.dtype, true);
  return absl::StrCat("__device__ const __align__(16) ", type, " kconst", b.index, "[", n, "] = {",
                      absl::StrJoin(vals, ", "), "};");
}

bool Needs(const std::string& text, const char* what) {
  return text.find(what) != std::string::npos;
}

// ---- A pointwise kernel stored from the reduction loop of the kernel after it.
//
// A gelu's backward and the bias gradient summed from it over the rows, a dropout's backward and
// the bias gradient of the linear layer before it: the scheduler makes the pointwise value a
// kernel that stores it (it is a result, or read again later) and the column sums a kernel that
// reads it back. When every output of a pointwise kernel is read only by the next kernel's
// reductions, each element exactly once (plain loop variables over the whole buffer), that
// kernel computes the values from their inputs where its reductions read them and stores them
// there (lower::Expr::Kind::kStoreAlso): one write and no read back of the values, and one
// launch fewer. Inductor's reduction kernels store such pointwise results the same way. Half
// types are left alone (the reductions would read the unrounded value). CUDA only: the CPU's
// column sums walk the columns as vectors in a loop nest this does not describe.

bool Overlaps(const Buffer& a, const Buffer& b) {
  return a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

// The buffers a kernel's trees read.
std::set<int> ReadBuffers(const schedule::Kernel& k) {
  std::set<int> out;
  for (const schedule::KernelOutput& o : k.outputs)
    for (const lower::Expr* n : Nodes(o.value))
      if ((n->kind == lower::Expr::Kind::kLoad || n->kind == lower::Expr::Kind::kGather) &&
          n->buffer >= 0)
        out.insert(n->buffer);
  return out;
}

// Whether every load of a buffer in `stored` lies inside a reduction's body, reads the whole
// buffer through plain loop variables (one per dimension larger than 1, its extent that
// dimension's) across the reduced loop (the innermost reduced variable is not the buffer's
// contiguous one: a column sum, which the code generator walks as column tiles; a row
// reduction's strategy is chosen by the contiguity of what it reads, which inlining changes),
// and nothing reads it outside a reduction.
bool ReadOnlyInReductions(const lower::ExprPtr& root, const std::set<int>& stored,
                          const std::vector<Buffer>& buffers, const lower::VarExtents& ext) {
  std::set<std::pair<const lower::Expr*, const lower::Expr*>> seen;
  bool ok = true;
  std::function<void(const lower::Expr*, const lower::Expr*)> walk = [&](const lower::Expr* n,
                                                                         const lower::Expr* in) {
    if (!ok || !seen.insert({n, in}).second) return;
    if ((n->kind == lower::Expr::Kind::kLoad || n->kind == lower::Expr::Kind::kGather) &&
        stored.count(n->buffer)) {
      if (!in || n->kind == lower::Expr::Kind::kGather ||
          Coefficient(FlatAddress(buffers[n->buffer], n->index), in->rvars.back()) == 1) {
        ok = false;
        return;
      }
      const Buffer& b = buffers[n->buffer];
      std::set<int> vars;
      for (size_t d = 0; d < b.shape.size(); ++d) {
        if (b.shape[d] == 1) continue;
        const int v = PlainVar(n->index[d]);
        if (v < 0 || v >= static_cast<int>(ext.size()) || ext[v] != b.shape[d] ||
            !vars.insert(v).second) {
          ok = false;
          return;
        }
      }
    }
    for (const lower::ExprPtr& a : n->args)
      walk(a.get(), n->kind == lower::Expr::Kind::kReduce && !n->rvars.empty() ? n : in);
  };
  walk(root.get(), nullptr);
  return ok;
}

// Fuses kernel i into kernel i + 1 when the rule above allows; returns whether it did.
bool FuseIntoNextReduction(schedule::Program* unit, size_t i, ExprPool* pool, std::string* report) {
  const schedule::Kernel& a = unit->kernels[i];
  schedule::Kernel& b = unit->kernels[i + 1];
  if (a.extents.size() != static_cast<size_t>(a.num_loops) || a.outputs.empty()) return false;
  std::set<int> stored;
  for (const schedule::KernelOutput& o : a.outputs) {
    const Buffer& buf = unit->buffers[o.buffer];
    if (buf.dtype == ir::DType::kF16 || buf.dtype == ir::DType::kBF16 || buf.shape != a.domain)
      return false;
    // Concatenated pieces stay in their pointwise kernel, which branches to one piece per
    // vector; a reduction loop would compute every piece for every element.
    for (const lower::Expr* n : Nodes(o.value))
      if (n->kind == lower::Expr::Kind::kReduce || n->kind == lower::Expr::Kind::kStoreAlso ||
          n->kind == lower::Expr::Kind::kIndexLess)
        return false;
    stored.insert(o.buffer);
  }
  // Stored where each domain dimension larger than 1 is its own loop variable, in order.
  int loop = 0;
  for (size_t d = 0; d < a.domain.size(); ++d) {
    if (a.domain[d] == 1) continue;
    if (d >= a.out_index.size() || PlainVar(a.out_index[d]) != loop) return false;
    ++loop;
  }
  // The next kernel reads them in its reductions only, each element once, and reads every one
  // (an output the reductions do not read would never be stored).
  for (const schedule::KernelOutput& o : b.outputs)
    if (!ReadOnlyInReductions(o.value, stored, unit->buffers, b.extents)) return false;
  const std::set<int> loaded = ReadBuffers(b);
  for (int s : stored)
    if (!loaded.count(s)) return false;
  // The pointwise kernel's inputs now live until the reduction kernel runs: none may share
  // workspace with what that kernel writes. (At a sample of a symbolic graph, offsets depend on
  // the sample's sizes, and the choice must be the same at every sample: any two temps count.)
  for (int r : ReadBuffers(a)) {
    if (unit->buffers[r].role != Buffer::Role::kTemp) continue;
    for (const schedule::KernelOutput& o : b.outputs)
      if (unit->buffers[o.buffer].role == Buffer::Role::kTemp &&
          (InSymbolicSample() || Overlaps(unit->buffers[r], unit->buffers[o.buffer])))
        return false;
  }
  // The pointwise values over the reduction kernel's variables: the pointwise kernel's loop
  // variable k (domain dimension d) becomes the variable the load reads dimension d with. The
  // variables are first moved past both kernels' so that renaming never meets a name in use.
  const int shift = static_cast<int>(std::max(a.extents.size(), b.extents.size()));
  lower::VarExtents moved(shift + a.extents.size(), 1);
  for (size_t k = 0; k < a.extents.size(); ++k) moved[k] = moved[shift + k] = a.extents[k];
  RewriteRules away;
  away.affine = [&](const lower::Affine& x) {
    lower::Affine y = x;
    for (size_t k = 0; k < a.extents.size(); ++k)
      y = lower::Substitute(y, static_cast<int>(k), lower::Affine::Var(shift + static_cast<int>(k)),
                            moved);
    return y;
  };
  std::unordered_map<int, lower::ExprPtr> value_of;
  for (const schedule::KernelOutput& o : a.outputs)
    value_of[o.buffer] =
        Rewrite(lower::MakeCast(o.value, unit->buffers[o.buffer].dtype), away, pool);
  lower::VarExtents into(shift + a.extents.size(),
                         1);  // the reduction kernel's, then the moved ones
  for (size_t v = 0; v < b.extents.size(); ++v) into[v] = b.extents[v];
  for (size_t k = 0; k < a.extents.size(); ++k) into[shift + k] = a.extents[k];
  RewriteRules swap;
  swap.load = [&](const lower::Expr& ld) -> lower::ExprPtr {
    auto it = value_of.find(ld.buffer);
    if (it == value_of.end()) return nullptr;
    const Buffer& buf = unit->buffers[ld.buffer];
    std::vector<std::pair<int, lower::Affine>> to;
    int k = 0;
    for (size_t d = 0; d < buf.shape.size(); ++d)
      if (buf.shape[d] != 1) to.push_back({shift + k++, ld.index[d]});
    RewriteRules in;
    in.affine = [&](const lower::Affine& x) {
      lower::Affine y = x;
      for (const auto& [from, by] : to) y = lower::Substitute(y, from, by, into);
      return y;
    };
    lower::Expr tee;
    tee.kind = lower::Expr::Kind::kStoreAlso;
    tee.dtype = buf.dtype;
    tee.buffer = ld.buffer;
    tee.index = ld.index;
    tee.args = {Rewrite(it->second, in, pool)};
    return pool->Intern(std::move(tee));
  };
  for (schedule::KernelOutput& o : b.outputs) o.value = Rewrite(o.value, swap, pool);
  b.fused_values.insert(b.fused_values.begin(), a.fused_values.begin(), a.fused_values.end());
  absl::StrAppend(report, "cuda: ", a.name, " is stored from ", b.name, "'s reduction loop (",
                  b.name, " computes its values where it reads them)\n");
  unit->kernels.erase(unit->kernels.begin() + static_cast<long>(i));
  return true;
}

// Returns a line per fused kernel, for the fusion report.
std::string FuseStoresIntoReductions(schedule::Program* unit) {
  ExprPool pool;
  std::string report;
  for (size_t i = 0; i + 1 < unit->kernels.size();)
    if (!FuseIntoNextReduction(unit, i, &pool, &report)) ++i;
  return report;
}

}  // namespace

int SmCount(int sm) {
  // Reference parts: the data-centre part where there is one, else a common one.
  switch (sm) {
    case 50:
      return 16;  // GTX 980
    case 52:
      return 24;  // Tesla M40
    case 53:
      return 1;  // Jetson Nano
    case 60:
      return 56;  // Tesla P100
    case 61:
      return 30;  // Tesla P40
    case 62:
      return 2;  // Jetson TX2
    case 70:
      return 80;  // Tesla V100
    case 72:
      return 8;  // Jetson Xavier
    case 75:
      return 40;  // Tesla T4
    case 80:
      return 108;  // A100
    case 86:
      return 84;  // A40
    case 87:
      return 16;  // Jetson Orin
    case 89:
      return 142;  // L40S
    case 90:
      return 132;  // H100 SXM
    case 100:
      return 148;  // B200
    case 103:
      return 148;  // B300
    case 110:
      return 20;  // Jetson Thor
    case 120:
      return 188;  // RTX PRO 6000
    case 121:
      return 48;  // DGX Spark
    default:
      return 100;
  }
}

absl::StatusOr<CudaUnit> GenerateCuda(const schedule::Program& program, const Target& target,
                                      const CompileOptions& options, int num_symbols) {
  schedule::Program unit = program;
  const std::string fused = FuseStoresIntoReductions(&unit);
  cuda::KernelConfig cfg;
  cfg.sm_count = SmCount(target.sm);
  cfg.pointwise_block = CudaVariantOf(options.variant).pointwise_block;
  cfg.row_threads_shift = CudaVariantOf(options.variant).row_threads_shift;
  // 32-bit index arithmetic is cheaper; take it when every index fits with room for the
  // lanes a row split runs past its end (they are guarded, but their indices are computed).
  int64_t largest = 0;
  for (const Buffer& b : unit.buffers) largest = std::max(largest, b.bytes);
  for (const schedule::Kernel& k : unit.kernels)
    for (int64_t e : k.extents) largest = std::max(largest, e);
  cfg.index_type = largest < kCudaIndexLimit ? "int" : "int64_t";
  // A symbolic graph's kernels use 32-bit indices at every size; the plan carries a bound on
  // every index (a sum, so that it stays a polynomial where a maximum would not) for the
  // launcher to check.
  int64_t index_bound = 0;
  if (num_symbols > 0) {
    cfg.index_type = "int";
    cfg.num_symbols = num_symbols;
    // Indices count elements (pointers are typed), so element counts bound them.
    for (const Buffer& b : unit.buffers)
      index_bound += b.bytes / std::max<int64_t>(ir::DTypeSize(b.dtype), 1);
    for (const schedule::Kernel& k : unit.kernels) {
      // Flat indices run over the output loops, or over one reduction's variables: each
      // reduction is flattened on its own (a fused softmax with a mask check reduces three
      // times over a row, which is three ranges of the row's length, not their product).
      int64_t loops = 1, reduced = 1;
      for (int v = 0; v < k.num_loops && v < static_cast<int>(k.extents.size()); ++v)
        loops *= std::max<int64_t>(k.extents[v], 1);
      std::set<const lower::Expr*> seen;
      for (const schedule::KernelOutput& o : k.outputs)
        for (const lower::Expr* n : Nodes(o.value))
          if (n->kind == lower::Expr::Kind::kReduce && seen.insert(n).second) {
            int64_t range = 1;
            for (int v : n->rvars) range *= std::max<int64_t>(k.extents[v], 1);
            reduced += range;
          }
      index_bound += loops + reduced;
    }
  }

  std::vector<cuda::KernelFunction> fns;
  for (size_t k = 0; k < unit.kernels.size(); ++k) {
    auto made = cuda::GenerateKernel(&unit, static_cast<int>(k), cfg);
    if (!made.ok()) return made.status();
    for (cuda::KernelFunction& f : *made) fns.push_back(std::move(f));
  }

  CudaUnit out;
  out.report = fused;
  out.plan.abi_version = num_symbols > 0 ? kCudaSymbolicAbiVersion : kCudaAbiVersion;
  out.plan.index_bound = index_bound;
  out.plan.workspace_bytes = unit.workspace_bytes;
  std::vector<int> plan_index(unit.buffers.size(), -1);
  out.plan.buffers = MakePlanBuffers(unit.buffers, &plan_index);
  std::string kernels;
  for (const cuda::KernelFunction& f : fns) {
    // A symbolic plan's grid is evaluated at launch from the run's sizes, and the loader
    // refuses a launch that does not fit then; the count at a sample (sizes near 2^14 to 2^15
    // each) says nothing about the sizes a run has.
    if (num_symbols == 0 && (f.grid == 0 || f.grid > 0x7fffffffu))
      return absl::InvalidArgumentError(
          absl::StrCat("kernel ", f.name, ": ", f.grid, " blocks do not fit one launch"));
    PlanStep step;
    step.kernel = f.name;
    step.grid[0] = f.grid;
    step.block[0] = f.block;
    if (num_symbols > 0) {
      step.grid_work = f.grid_work;
      step.grid_per_block = f.grid_per_block;
      step.guard = f.guard_value;
      step.guard_min = f.guard_min;
      step.guard_max = f.guard_max;
    }
    for (int b : f.buffers) step.args.push_back(plan_index[b]);
    out.plan.steps.push_back(std::move(step));
    absl::StrAppend(&kernels, "\n", f.text);
    absl::StrAppend(&out.report, "cuda ", f.name, ": ", f.strategy, "; grid ", f.grid, ", block ",
                    f.block, "\n");
  }

  std::string& src = out.source;
  absl::StrAppend(&src, "// Generated by kiln for sm_", target.sm, ": ", fns.size(),
                  " launch(es).\n");
  std::string consts;
  for (const Buffer& b : unit.buffers)
    if (b.role == Buffer::Role::kConst) absl::StrAppend(&consts, ConstArray(b), "\n");
  bool bf16 = Needs(kernels, "__nv_bfloat16") || Needs(kernels, "kiln_to_bf16");
  bool fp16 = bf16 || Needs(kernels, "__half") || Needs(kernels, "kiln_to_f16");
  if (fp16) absl::StrAppend(&src, "#define KILN_NEED_FP16 1\n");
  if (bf16) absl::StrAppend(&src, "#define KILN_NEED_BF16 1\n");
  absl::StrAppend(&src, "#include \"kiln_cuda.h\"\n");
  if (!consts.empty()) absl::StrAppend(&src, "\n", consts);
  absl::StrAppend(&src, kernels);
  return out;
}

}  // namespace kiln::codegen
