#include "client/cpp/cpu_loader.h"

#include <cstdlib>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/core/cpu_library.h"
#include "client/cpp/core_status.h"
#include "kernels/runtime/kiln_threads.h"
#include "kernels/util/status_macros.h"

namespace kiln::client {
namespace {

constexpr size_t kWorkspaceAlignment = 64;

// The client core's registry of opened libraries (client/core/cpu_library.h).
absl::StatusOr<const core::CpuLibrary*> OpenLibrary(const std::string& path) {
  core::Error error;
  const core::CpuLibrary* library = core::OpenCpuLibrary(path, &error);
  if (library == nullptr) return ToStatus(error);
  return library;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

int64_t Evaluate(const v1::SizeExpr& e, absl::Span<const int64_t> sizes) {
  int64_t sum = 0;
  for (const v1::SizeTerm& t : e.terms()) {
    int64_t v = t.coeff();
    for (int k = 0; k < t.exponents_size() && k < static_cast<int>(sizes.size()); ++k)
      for (int j = 0; j < t.exponents(k); ++j) v *= sizes[k];
    sum += v;
  }
  return sum;
}

const v1::PlanBuffer* FindBuffer(const v1::LaunchPlan& plan, v1::BufferRole role, int index) {
  for (const v1::PlanBuffer& b : plan.buffers())
    if (b.role() == role && b.index() == index) return &b;
  return nullptr;
}

}  // namespace

CpuKernel::CpuKernel(std::string path, RunFn run, RunSizedFn run_sized, WorkspaceFn workspace,
                     v1::LaunchPlan plan, std::vector<int64_t> input_bytes,
                     std::vector<int64_t> output_bytes)
    : path_(std::move(path)),
      run_(run),
      run_sized_(run_sized),
      workspace_(workspace),
      plan_(std::move(plan)),
      input_bytes_(std::move(input_bytes)),
      output_bytes_(std::move(output_bytes)) {}

absl::StatusOr<uint32_t> CpuKernel::AbiVersion(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(const core::CpuLibrary* library, OpenLibrary(path));
  return library->abi_version;
}

absl::StatusOr<CpuKernel> CpuKernel::Load(const std::string& path, const v1::LaunchPlan& plan) {
  // Read the plan's inputs and outputs first: a plan that does not describe a 0..n-1
  // numbering of each cannot be run safely, whatever the library says.
  std::vector<int64_t> inputs, outputs;
  constexpr int64_t kUnseen = -2;  // a symbolic buffer's plan bytes are -1
  for (const v1::PlanBuffer& buffer : plan.buffers()) {
    std::vector<int64_t>* list = buffer.role() == v1::INPUT    ? &inputs
                                 : buffer.role() == v1::OUTPUT ? &outputs
                                                               : nullptr;
    if (list == nullptr) continue;
    if (buffer.index() < 0 || buffer.index() >= plan.buffers_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("launch plan: ", v1::BufferRole_Name(buffer.role()), " buffer index ",
                       buffer.index(), " out of range"));
    }
    if (list->size() <= static_cast<size_t>(buffer.index()))
      list->resize(buffer.index() + 1, kUnseen);
    if ((*list)[buffer.index()] != kUnseen) {
      return absl::InvalidArgumentError(absl::StrCat("launch plan: two ",
                                                     v1::BufferRole_Name(buffer.role()),
                                                     " buffers numbered ", buffer.index()));
    }
    (*list)[buffer.index()] = buffer.bytes();
  }
  for (const std::vector<int64_t>* list : {&inputs, &outputs}) {
    for (size_t i = 0; i < list->size(); ++i) {
      if ((*list)[i] == kUnseen) {
        return absl::InvalidArgumentError(absl::StrCat(
            "launch plan: no ", list == &inputs ? "input" : "output", " buffer numbered ", i));
      }
    }
  }
  if (plan.workspace_bytes() < 0) {
    return absl::InvalidArgumentError("launch plan: negative workspace size");
  }

  KILN_ASSIGN_OR_RETURN(const core::CpuLibrary* found, OpenLibrary(path));
  const core::CpuLibrary& library = *found;
  if (library.abi_version != plan.abi_version()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " implements kernel ABI version ", library.abi_version,
                     " but its launch plan is for version ", plan.abi_version()));
  }
  if ((plan.symbols_size() > 0) != (library.abi_version == 2)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": ABI version ", library.abi_version,
                                                      " with a plan of ", plan.symbols_size(),
                                                      " symbols"));
  }
  return CpuKernel(path, library.run, library.run_sized, library.workspace, plan, std::move(inputs),
                   std::move(outputs));
}

absl::Status CpuKernel::Run(absl::Span<const ConstBuffer> inputs,
                            absl::Span<const MutableBuffer> outputs, int num_threads) const {
  if (is_symbolic()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, " has symbolic sizes: run it with RunSized (the sizes of its ",
                     plan_.symbols_size(), " symbols first)"));
  }
  if (inputs.size() != input_bytes_.size() || outputs.size() != output_bytes_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the kernel takes ", input_bytes_.size(), " inputs and ", output_bytes_.size(),
                     " outputs; got ", inputs.size(), " and ", outputs.size()));
  }
  std::vector<void*> args;
  args.reserve(inputs.size() + outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int64_t need = input_bytes_[i];
    if (inputs[i].bytes < static_cast<size_t>(need) || (need > 0 && inputs[i].data == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", i, " holds ", inputs[i].bytes, " bytes; the kernel reads ", need));
    }
    // The ABI's pointers are non-const for uniformity; inputs are only read.
    args.push_back(const_cast<void*>(inputs[i].data));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const int64_t need = output_bytes_[i];
    if (outputs[i].bytes < static_cast<size_t>(need) || (need > 0 && outputs[i].data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("output ", i, " holds ", outputs[i].bytes,
                                                     " bytes; the kernel writes ", need));
    }
    args.push_back(outputs[i].data);
  }
  return RunUnchecked(args, num_threads);
}

absl::Status CpuKernel::RunUnchecked(absl::Span<void* const> args, int num_threads) const {
  if (args.size() != input_bytes_.size() + output_bytes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the kernel takes ",
                                                   input_bytes_.size() + output_bytes_.size(),
                                                   " buffers; got ", args.size()));
  }
  if (is_symbolic()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, " has symbolic sizes: run it with RunSized"));
  }
  return Launch(args.data(), nullptr, plan_.workspace_bytes(), num_threads);
}

absl::StatusOr<std::vector<int64_t>> CpuKernel::Shape(v1::BufferRole role, int index,
                                                      absl::Span<const int64_t> sizes) const {
  const v1::PlanBuffer* b = FindBuffer(plan_, role, index);
  if (b == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("no ", v1::BufferRole_Name(role), " ", index));
  if (!is_symbolic()) return std::vector<int64_t>(b->shape().begin(), b->shape().end());
  std::vector<int64_t> shape;
  for (const v1::SizeExpr& e : b->shape_exprs()) shape.push_back(Evaluate(e, sizes));
  return shape;
}

absl::Status CpuKernel::RunSized(absl::Span<const int64_t> sizes,
                                 absl::Span<const ConstBuffer> inputs,
                                 absl::Span<const MutableBuffer> outputs, int num_threads) const {
  if (!is_symbolic())
    return absl::FailedPreconditionError(
        absl::StrCat(path_, " has static shapes: run it with Run"));
  if (sizes.size() != static_cast<size_t>(plan_.symbols_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the kernel has ", plan_.symbols_size(), " symbolic sizes; got ", sizes.size(), " values"));
  }
  for (size_t k = 0; k < sizes.size(); ++k)
    if (sizes[k] < 0)
      return absl::InvalidArgumentError(absl::StrCat("symbol '",
                                                     plan_.symbols(static_cast<int>(k)).name(),
                                                     "' given a negative size ", sizes[k]));
  if (inputs.size() != input_bytes_.size() || outputs.size() != output_bytes_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the kernel takes ", input_bytes_.size(), " inputs and ", output_bytes_.size(),
                     " outputs; got ", inputs.size(), " and ", outputs.size()));
  }
  std::vector<void*> args;
  auto need = [&](v1::BufferRole role, size_t i) {
    const v1::PlanBuffer* b = FindBuffer(plan_, role, static_cast<int>(i));
    return b == nullptr ? int64_t{0} : Evaluate(b->bytes_expr(), sizes);
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int64_t bytes = need(v1::INPUT, i);
    if (inputs[i].bytes < static_cast<size_t>(bytes) || (bytes > 0 && inputs[i].data == nullptr))
      return absl::InvalidArgumentError(absl::StrCat("input ", i, " holds ", inputs[i].bytes,
                                                     " bytes; the kernel reads ", bytes,
                                                     " at these sizes"));
    args.push_back(const_cast<void*>(inputs[i].data));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const int64_t bytes = need(v1::OUTPUT, i);
    if (outputs[i].bytes < static_cast<size_t>(bytes) || (bytes > 0 && outputs[i].data == nullptr))
      return absl::InvalidArgumentError(absl::StrCat("output ", i, " holds ", outputs[i].bytes,
                                                     " bytes; the kernel writes ", bytes,
                                                     " at these sizes"));
    args.push_back(outputs[i].data);
  }
  return Launch(args.data(), sizes.data(), workspace_(sizes.data()), num_threads);
}

absl::Status CpuKernel::Launch(void* const* args, const int64_t* sizes, int64_t workspace_bytes,
                               int num_threads) const {
  std::unique_ptr<void, FreeDeleter> workspace;
  if (const int64_t bytes = workspace_bytes; bytes > 0) {
    // aligned_alloc wants a size that is a multiple of the alignment.
    const size_t rounded = (static_cast<size_t>(bytes) + kWorkspaceAlignment - 1) /
                           kWorkspaceAlignment * kWorkspaceAlignment;
    workspace.reset(std::aligned_alloc(kWorkspaceAlignment, rounded));
    if (workspace == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate a ", bytes, "-byte kernel workspace"));
    }
  }
  if (num_threads <= 0) num_threads = runtime::DefaultNumThreads();
  const int rc = sizes != nullptr ? run_sized_(args, sizes, workspace.get(), num_threads)
                                  : run_(args, workspace.get(), num_threads);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("kiln_run in ", path_, " returned ", rc));
  }
  return absl::OkStatus();
}

}  // namespace kiln::client
