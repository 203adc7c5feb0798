#include "kernels/codegen/plan.h"

#include <algorithm>
#include <set>

namespace kiln::codegen {

std::vector<PlanBuffer> MakePlanBuffers(const std::vector<schedule::Buffer>& buffers,
                                        std::vector<int>* plan_index) {
  std::vector<PlanBuffer> out;
  plan_index->assign(buffers.size(), -1);
  for (size_t b = 0; b < buffers.size(); ++b) {
    const schedule::Buffer& buf = buffers[b];
    if (buf.role == schedule::Buffer::Role::kConst) continue;
    PlanBuffer pb;
    pb.role = buf.role == schedule::Buffer::Role::kInput    ? BufferRole::kInput
              : buf.role == schedule::Buffer::Role::kOutput ? BufferRole::kOutput
                                                            : BufferRole::kTemp;
    pb.index = buf.index;
    pb.dtype = buf.dtype;
    pb.shape = buf.shape;
    pb.bytes = buf.bytes;
    pb.offset = buf.offset;
    (*plan_index)[b] = static_cast<int>(out.size());
    out.push_back(std::move(pb));
  }
  return out;
}

LaunchPlan MakePlan(const schedule::Program& p, uint32_t abi_version) {
  LaunchPlan plan;
  plan.abi_version = abi_version;
  plan.workspace_bytes = p.workspace_bytes;
  std::vector<int> plan_index;
  plan.buffers = MakePlanBuffers(p.buffers, &plan_index);
  for (const schedule::Kernel& k : p.kernels) {
    PlanStep step;
    step.kernel = k.name;
    std::set<int> used;
    for (const schedule::KernelOutput& o : k.outputs) used.insert(o.buffer);
    for (int b : used)
      if (plan_index[b] >= 0) step.args.push_back(plan_index[b]);
    plan.steps.push_back(std::move(step));
  }
  return plan;
}

}  // namespace kiln::codegen
