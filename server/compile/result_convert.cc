#include "server/compile/result_convert.h"

#include <utility>

#include "kernels/ir/decode.h"

namespace kiln::compile {
namespace {

void ToWirePlan(const LaunchPlan& plan, bool has_geometry, v1::LaunchPlan* wire) {
  for (const PlanBuffer& b : plan.buffers) {
    v1::PlanBuffer* out = wire->add_buffers();
    // The enum numbers are shared with the wire on purpose (see kernels/target.h).
    out->set_role(static_cast<v1::BufferRole>(b.role));
    out->set_index(b.index);
    out->set_dtype(static_cast<v1::DType>(b.dtype));
    for (int64_t d : b.shape) out->add_shape(d);
    out->set_bytes(b.bytes);
    out->set_offset(b.offset);
  }
  for (const PlanStep& s : plan.steps) {
    v1::PlanStep* out = wire->add_steps();
    out->set_kernel(s.kernel);
    if (has_geometry) {
      for (uint32_t g : s.grid) out->add_grid(g);
      for (uint32_t b : s.block) out->add_block(b);
    }
    out->set_shared_bytes(s.shared_bytes);
    for (int32_t a : s.args) out->add_args(a);
  }
  wire->set_workspace_bytes(plan.workspace_bytes);
  wire->set_abi_version(plan.abi_version);
}

}  // namespace

ConvertedResult ToActionResult(CompileResult compiled, const key::ActionKey& key,
                               const Target& target) {
  ConvertedResult out;
  v1::ActionResult& r = out.result;
  out.blobs.reserve(compiled.artifacts.size());
  for (Artifact& a : compiled.artifacts) {
    v1::Artifact* wire = r.add_artifacts();
    wire->set_kind(static_cast<v1::ArtifactKind>(a.kind));
    wire->set_digest(key::Sha256Hex(a.bytes));
    wire->set_size(static_cast<int64_t>(a.bytes.size()));
    out.blobs.push_back(std::move(a.bytes));
  }
  // CPU steps carry no launch geometry: the .so runs its kernels itself.
  ToWirePlan(compiled.plan, target.is_cuda(), r.mutable_plan());
  r.set_compile_log(std::move(compiled.log));
  v1::CompileStats* stats = r.mutable_stats();
  stats->set_num_kernels(compiled.stats.num_kernels);
  stats->set_num_nodes_in(compiled.stats.num_nodes_in);
  stats->set_num_nodes_lowered(compiled.stats.num_nodes_lowered);
  stats->set_frontend_ms(compiled.stats.frontend_ms);
  stats->set_toolchain_ms(compiled.stats.toolchain_ms);
  stats->set_total_ms(compiled.stats.total_ms);
  r.set_key_debug(key.DebugString());
  for (const auto& [label, value] : key.fields) {
    v1::KeyField* field = r.add_key_fields();
    field->set_label(label);
    field->set_value(value);
  }
  *r.mutable_target() = ir::EncodeTarget(target);
  return out;
}

const v1::Artifact* FindArtifact(const v1::ActionResult& result, v1::ArtifactKind kind) {
  for (const v1::Artifact& a : result.artifacts()) {
    if (a.kind() == kind) return &a;
  }
  return nullptr;
}

}  // namespace kiln::compile
