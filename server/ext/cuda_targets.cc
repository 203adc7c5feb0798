#include "server/ext/cuda_targets.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::ext {
namespace {

constexpr int kMaxTargets = 16;
// The first architecture with arch-specific features (compute_90a).
constexpr int kFirstArchSpecific = 90;

std::string Name(const CudaTarget& t) { return absl::StrCat(t.sm, t.arch_specific ? "a" : ""); }

absl::Status Check(const CudaTarget& t, const char* field) {
  if (t.sm < 50 || t.sm > 199) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": sm_", t.sm, " is not a CUDA architecture kilnd builds for"));
  }
  if (t.arch_specific && t.sm < kFirstArchSpecific) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": sm_", t.sm, "a does not exist (arch-specific targets begin with sm_90a)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<CudaTarget>> CudaTargets(const v1::BuildExtensionRequest& request) {
  if (request.cuda_archs_size() + request.cuda_arch_list_size() > kMaxTargets) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_archs and cuda_arch_list: more than ", kMaxTargets, " architectures"));
  }
  // (sm, arch_specific) -> ptx: sorted and merged as cpp_extension's set of flags is.
  std::map<std::pair<int, bool>, bool> merged;
  auto add = [&](const CudaTarget& t, const char* field) -> absl::Status {
    if (absl::Status s = Check(t, field); !s.ok()) return s;
    merged[{t.sm, t.arch_specific}] |= t.ptx;
    return absl::OkStatus();
  };
  for (int sm : request.cuda_archs()) {
    if (absl::Status s = add({sm, false, false}, "cuda_archs"); !s.ok()) return s;
  }
  for (const v1::CudaArch& a : request.cuda_arch_list()) {
    if (absl::Status s = add({a.sm(), a.arch_specific(), a.ptx()}, "cuda_arch_list"); !s.ok())
      return s;
  }
  std::vector<CudaTarget> out;
  for (const auto& [arch, ptx] : merged) out.push_back({arch.first, arch.second, ptx});
  return out;
}

void SetCanonicalTargets(const std::vector<CudaTarget>& targets,
                         v1::BuildExtensionRequest* request) {
  request->clear_cuda_archs();
  request->clear_cuda_arch_list();
  const bool plain = std::all_of(targets.begin(), targets.end(),
                                 [](const CudaTarget& t) { return !t.arch_specific && !t.ptx; });
  for (const CudaTarget& t : targets) {
    if (plain) {
      request->add_cuda_archs(t.sm);
    } else {
      v1::CudaArch* a = request->add_cuda_arch_list();
      a->set_sm(t.sm);
      a->set_arch_specific(t.arch_specific);
      a->set_ptx(t.ptx);
    }
  }
}

std::string TargetsLabel(const std::vector<CudaTarget>& targets) {
  return absl::StrJoin(targets, ",", [](std::string* out, const CudaTarget& t) {
    absl::StrAppend(out, Name(t), t.ptx ? "+PTX" : "");
  });
}

std::vector<std::string> GencodeFlags(const std::vector<CudaTarget>& targets) {
  std::vector<std::string> flags;
  for (const CudaTarget& t : targets) {
    const std::string n = Name(t);
    flags.insert(flags.end(), {"-gencode", absl::StrCat("arch=compute_", n, ",code=sm_", n)});
    if (t.ptx) {
      flags.insert(flags.end(),
                   {"-gencode", absl::StrCat("arch=compute_", n, ",code=compute_", n)});
    }
  }
  return flags;
}

int GencodeCount(const std::vector<CudaTarget>& targets) {
  int n = 0;
  for (const CudaTarget& t : targets) n += t.ptx ? 2 : 1;
  return n;
}

}  // namespace kiln::ext
