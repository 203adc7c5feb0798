// Fusion policy: whether an inlinable value *should* be inlined (speed). Correctness lives in
// schedule/legality.h. The policy's version enters the cache key: change it when a decision
// changes.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::schedule {

// 2: a same-domain output that would recompute a reduction its kernel stores starts a new kernel.
inline constexpr int kFusionPolicyVersion = 2;

// A reduction inlined into a consumer is evaluated `evaluations` times for `elements`
// distinct results. Inline when it is not recomputed; otherwise store it. On refusal, `why`
// says so in words for the fusion report.
bool ShouldInlineReduction(int64_t evaluations, int64_t elements, std::string* why);

}  // namespace kiln::schedule
