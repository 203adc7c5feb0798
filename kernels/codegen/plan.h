// The launch plan of a scheduled program (format: kernels/codegen/PLAN.md).
// Thread-safety: pure function.
#pragma once

#include "kernels/schedule/program.h"
#include "kernels/target.h"

namespace kiln::codegen {

// Buffers: inputs, outputs and temps (with workspace offsets), in the program's order,
// constants left out (they live in the binary). One step per kernel, args naming plan buffers.
// CPU steps carry no grid; backends that launch kernels fill grid and block themselves.
LaunchPlan MakePlan(const schedule::Program& program, uint32_t abi_version);

// The plan's buffers alone (everything but constants), for backends that build their own
// steps. `plan_index[b]` becomes the plan position of program buffer b, or -1.
std::vector<PlanBuffer> MakePlanBuffers(const std::vector<schedule::Buffer>& buffers,
                                        std::vector<int>* plan_index);

}  // namespace kiln::codegen
