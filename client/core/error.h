// The core's error: a class (kiln_core.h's enum kiln_core_error) and a message. The core
// depends on nothing but libc and libcrypto, so it carries this instead of absl::Status; the
// C++ client maps it with ToStatus (client/cpp/core_status.h).
#pragma once

#include <string>
#include <utility>

#include "client/core/kiln_core.h"

namespace kiln::core {

struct Error {
  kiln_core_error code = KILN_CORE_OK;
  std::string message;

  bool ok() const { return code == KILN_CORE_OK; }
  // Sets the error and returns false, for `return error->Fail(...)`.
  bool Fail(kiln_core_error c, std::string m) {
    code = c;
    message = std::move(m);
    return false;
  }
};

}  // namespace kiln::core
