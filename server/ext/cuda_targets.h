// The CUDA architectures of an extension build: what a BuildExtensionRequest asks for (its
// plain cuda_archs and its cuda_arch_list with TORCH_CUDA_ARCH_LIST's "a" and "+PTX" variants),
// checked, merged into one canonical list for the key, and turned into nvcc's -gencode flags.
// Thread-safety: free functions of their arguments only.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/v1/service.pb.h"

namespace kiln::ext {

struct CudaTarget {
  int sm = 0;                  // major * 10 + minor
  bool arch_specific = false;  // sm_90a rather than sm_90
  bool ptx = false;            // compute_<sm> PTX as well as the sm_<sm> binary
};

// The request's architectures, merged and sorted: one per sm and variant, with PTX when any
// entry asked for it ("9.0;9.0+PTX" is "9.0+PTX"). InvalidArgument naming the field and the
// value for an architecture kilnd does not build for (sm outside 50..199, an "a" before 9.0, more
// than 16 entries). Empty when the request names none.
absl::StatusOr<std::vector<CudaTarget>> CudaTargets(const v1::BuildExtensionRequest& request);

// Replaces the request's architectures by `targets` (CudaTargets' result) in one canonical
// form, for the build key: plain ones alone go in cuda_archs (the form older clients sent, so
// their keys stay), any variant puts all of them in cuda_arch_list.
void SetCanonicalTargets(const std::vector<CudaTarget>& targets,
                         v1::BuildExtensionRequest* request);

// "80,90a+PTX": the targets as a key field prints them.
std::string TargetsLabel(const std::vector<CudaTarget>& targets);

// nvcc's flags for `targets`: "-gencode" "arch=compute_90a,code=sm_90a", and for PTX
// "-gencode" "arch=compute_90a,code=compute_90a", as cpp_extension generates them.
std::vector<std::string> GencodeFlags(const std::vector<CudaTarget>& targets);

// How many code objects GencodeFlags makes (each one a job for nvcc's --threads).
int GencodeCount(const std::vector<CudaTarget>& targets);

}  // namespace kiln::ext
