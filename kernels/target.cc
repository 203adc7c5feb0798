#include "kernels/target.h"

#include "absl/strings/str_cat.h"

namespace kiln {

std::string Target::ToString() const {
  if (is_cuda()) return absl::StrCat("cuda:sm_", sm);
  if (!isa.empty()) return absl::StrCat("cpu:", isa);
  std::string s = "cpu:";
  for (const std::string& f : features) absl::StrAppend(&s, "+", f);
  return s;
}

std::string CompileOptions::ToString() const {
  return absl::StrCat("opt_level=", opt_level, ";vector_math=", vector_math ? 1 : 0,
                      ";algebraic_rewrites=", algebraic_rewrites ? 1 : 0, ";variant=", variant);
}

}  // namespace kiln
