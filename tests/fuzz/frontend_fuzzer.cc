// libFuzzer entry point over the frontend (see frontend_check.h for the contract). Built only
// by tests/fuzz/run.sh, with clang and -fsanitize=fuzzer,address,undefined.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "tests/fuzz/frontend_check.h"

namespace {

const kiln::fuzz::FrontendChecker* Checker() {
  static const auto* checker = kiln::fuzz::FrontendChecker::Create().release();
  return checker;
}

}  // namespace

// Before the first input: says which targets are checked, and stops when CUDA is required
// (KILN_REQUIRE_NVRTC=1) but cannot be checked here.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (!Checker()->ReportCudaCoverage("frontend fuzzer")) std::exit(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* checker = Checker();
  absl::Status s =
      checker->CheckFrontendInput(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!s.ok()) {
    std::fprintf(stderr, "frontend contract broken: %s\n", s.ToString().c_str());
    std::abort();  // libFuzzer saves the input as a crash
  }
  return 0;
}
