// CpuKernel: a CPU artifact (the .so of kernels/codegen/ABI.md) loaded into this process,
// bound to its launch plan, ready to run on host buffers.
//
// Libraries are opened once per path through the client core's registry
// (client/core/cpu_library.h) and never closed, for the reasons given there.
//
// Thread-safety: Load is thread-safe. A CpuKernel is immutable; Run may be called from many
// threads at once (each call has its own workspace), as the ABI allows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/core/cpu_library.h"
#include "kiln/v1/service.pb.h"

namespace kiln::client {

// A host buffer handed to a kernel: `bytes` is its size, checked against the plan.
struct ConstBuffer {
  const void* data = nullptr;
  size_t bytes = 0;
};
struct MutableBuffer {
  void* data = nullptr;
  size_t bytes = 0;
};

class CpuKernel {
 public:
  // The entry points of kernels/codegen/ABI.md, as the client core resolves them.
  using RunFn = core::CpuLibrary::RunFn;
  using RunSizedFn = core::CpuLibrary::RunSizedFn;  // ABI version 2 (symbolic sizes)
  using WorkspaceFn = core::CpuLibrary::WorkspaceFn;

  // Loads the library at `path` (or reuses it when this process loaded it before), and
  // checks that its kiln_abi_version() is `plan.abi_version()`: FailedPrecondition on a
  // mismatch or a missing symbol, NotFound when the file is not there, FailedPrecondition when
  // dlopen refuses it (wrong architecture, missing libgomp).
  static absl::StatusOr<CpuKernel> Load(const std::string& path, const v1::LaunchPlan& plan);

  // The library's ABI version, for callers that only want to check one (no plan needed).
  // Same errors as Load.
  static absl::StatusOr<uint32_t> AbiVersion(const std::string& path);

  // Runs the kernels: `inputs` in graph order, then `outputs` in the order of the graph's
  // outputs. Each buffer must hold at least the plan's bytes for it (InvalidArgument
  // otherwise, naming which). A 64-byte aligned workspace of plan.workspace_bytes is allocated
  // per call. `num_threads` <= 0 means kiln::runtime::DefaultNumThreads()
  // ($KILN_NUM_THREADS, $OMP_NUM_THREADS, the affinity mask: kernels/runtime/kiln_threads.h).
  // Internal when the kernel reports failure. REQUIRES: outputs do not overlap inputs or each
  // other; inputs are row-major contiguous unless the graph declared strides (then use
  // RunUnchecked).
  absl::Status Run(absl::Span<const ConstBuffer> inputs, absl::Span<const MutableBuffer> outputs,
                   int num_threads = 0) const;

  // As Run, with bare pointers (inputs then outputs) and no size checks: for inputs with
  // declared (possibly negative) strides, whose extent the plan does not give.
  absl::Status RunUnchecked(absl::Span<void* const> args, int num_threads = 0) const;

  // Symbolic kernels (plan().symbols() not empty): one value per symbol, in the plan's order
  // (`sizes`), then buffers as for Run, each checked against its size at these values.
  // InvalidArgument for a wrong number of sizes or a negative one. Run and RunUnchecked refuse
  // a symbolic kernel (FailedPrecondition), and RunSized a static one.
  absl::Status RunSized(absl::Span<const int64_t> sizes, absl::Span<const ConstBuffer> inputs,
                        absl::Span<const MutableBuffer> outputs, int num_threads = 0) const;
  // The shape of input or output `index` at `sizes` (symbolic or not).
  absl::StatusOr<std::vector<int64_t>> Shape(v1::BufferRole role, int index,
                                             absl::Span<const int64_t> sizes) const;
  bool is_symbolic() const { return plan_.symbols_size() > 0; }

  int num_inputs() const { return static_cast<int>(input_bytes_.size()); }
  int num_outputs() const { return static_cast<int>(output_bytes_.size()); }
  const v1::LaunchPlan& plan() const { return plan_; }
  const std::string& path() const { return path_; }

 private:
  CpuKernel(std::string path, RunFn run, RunSizedFn run_sized, WorkspaceFn workspace,
            v1::LaunchPlan plan, std::vector<int64_t> input_bytes,
            std::vector<int64_t> output_bytes);
  absl::Status Launch(void* const* args, const int64_t* sizes, int64_t workspace_bytes,
                      int num_threads) const;

  std::string path_;
  RunFn run_ = nullptr;
  RunSizedFn run_sized_ = nullptr;
  WorkspaceFn workspace_ = nullptr;
  v1::LaunchPlan plan_;
  // Bytes of each input and output, by graph position, from the plan (static kernels).
  std::vector<int64_t> input_bytes_;
  std::vector<int64_t> output_bytes_;
};

}  // namespace kiln::client
