#include "kernels/codegen/cuda/cuda_codegen.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/codegen/c_expr.h"
#include "kernels/codegen/plan.h"
#include "kernels/codegen/cuda/cuda_kernel.h"
#include "kernels/codegen/variants.h"

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

bool Needs(const std::string& text, const char* what) { return text.find(what) != std::string::npos; }

}  // namespace

int SmCount(int sm) {
  // Reference parts: the data-centre part where there is one, else a common one.
  switch (sm) {
    case 50: return 16;   // GTX 980
    case 52: return 24;   // Tesla M40
    case 53: return 1;    // Jetson Nano
    case 60: return 56;   // Tesla P100
    case 61: return 30;   // Tesla P40
    case 62: return 2;    // Jetson TX2
    case 70: return 80;   // Tesla V100
    case 72: return 8;    // Jetson Xavier
    case 75: return 40;   // Tesla T4
    case 80: return 108;  // A100
    case 86: return 84;   // A40
    case 87: return 16;   // Jetson Orin
    case 89: return 142;  // L40S
    case 90: return 132;  // H100 SXM
    case 100: return 148;  // B200
    case 103: return 148;  // B300
    case 110: return 20;   // Jetson Thor
    case 120: return 188;  // RTX PRO 6000
    case 121: return 48;   // DGX Spark
    default: return 100;
  }
}

absl::StatusOr<CudaUnit> GenerateCuda(const schedule::Program& program, const Target& target,
                                      const CompileOptions& options, int num_symbols) {
  schedule::Program unit = program;
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
    for (const Buffer& b : unit.buffers) index_bound += b.bytes / std::max<int64_t>(ir::DTypeSize(b.dtype), 1);
    for (const schedule::Kernel& k : unit.kernels) {
      // Flat indices run over the output loops, or over the variables of reductions.
      int64_t loops = 1, reduced = 1;
      for (size_t v = 0; v < k.extents.size(); ++v)
        (static_cast<int>(v) < k.num_loops ? loops : reduced) *= std::max<int64_t>(k.extents[v], 1);
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
  out.plan.abi_version = num_symbols > 0 ? kCudaSymbolicAbiVersion : kCudaAbiVersion;
  out.plan.index_bound = index_bound;
  out.plan.workspace_bytes = unit.workspace_bytes;
  std::vector<int> plan_index(unit.buffers.size(), -1);
  out.plan.buffers = MakePlanBuffers(unit.buffers, &plan_index);
  std::string kernels;
  for (const cuda::KernelFunction& f : fns) {
    if (f.grid == 0 || f.grid > 0x7fffffffu)
      return absl::InvalidArgumentError(absl::StrCat("kernel ", f.name, ": ", f.grid, " blocks do not fit one launch"));
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
    absl::StrAppend(&out.report, "cuda ", f.name, ": ", f.strategy, "; grid ", f.grid, ", block ", f.block, "\n");
  }

  std::string& src = out.source;
  absl::StrAppend(&src, "// Generated by kiln for sm_", target.sm, ": ", fns.size(), " launch(es).\n");
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
