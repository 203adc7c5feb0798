// File helpers of the client core's folders (store.h, answers.h): errno as the core's error,
// checked names, and atomic writes. Internal to the core.
// Thread-safety: free functions without shared state.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "client/core/error.h"

namespace kiln::core {

// Sets `error` for an errno failure `err` of `what` on `path` and returns false. A full,
// read-only or forbidden folder is the environment's problem (UNAVAILABLE, callers may go on
// without the file); anything else is INTERNAL.
bool ErrnoFail(Error* error, const std::string& what, const std::string& path, int err);

// True when `name` is 64 lowercase hex digits (a SHA-256, as every file name of the core's
// folders is); otherwise INVALID_ARGUMENT, so that a hostile name never becomes a path.
bool CheckDigest(std::string_view name, Error* error);

// `dir`/<n0n1>/`name`: where the core's folders keep a file named by a hex digest, under a
// folder named by its first two digits, which keeps folders small.
std::string ShardedPath(std::string_view dir, std::string_view name);

// Creates the folder that will hold `path`.
bool MakeParent(const std::string& path, Error* error);

// Writes `pieces`, one after the other, to `path` through a temporary file in the same folder
// (`temp_prefix` followed by six random characters) and a rename, so that a reader sees the
// old file or the whole new one, never part of it. The file gets mode 0644. `durable`: the
// file is fsynced before the rename and the folder after it (for files that must survive a
// crash; a cache whose readers check integrity may skip it). The temporary is removed on
// failure. REQUIRES: the folder of `path` exists.
bool WriteAtomically(const std::string& path, std::string_view temp_prefix,
                     std::initializer_list<std::string_view> pieces, bool durable, Error* error);

}  // namespace kiln::core
