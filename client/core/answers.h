// AnswerFolder: kilnd's answers to requests made from this machine, kept in the local cache
// folder so that a fresh process (Python or C++) can use an answer again without asking kilnd.
// An answer is a serialized kiln.v1.CompileResponse that the asking client's trust policy
// accepted; this class knows nothing of protobuf or signatures: it keeps bytes under a name,
// says how old they are and whether the file could have been written by someone else, and never
// returns bytes that are not what was saved. The file format and the naming rule are in
// FORMAT.md beside this file.
//
// Layout under the cache root (the ArtifactStore's root):
//
//   answers/<n0n1>/<name>       one answer; <name> = AnswerName(address, request_key)
//   answers/<n0n1>/.tmp-XXXXXX  a write in progress (or one a crash left)
//
// A file is written under a temporary name and renamed into place, so a reader sees a whole
// file or none. It is not fsynced: an answer is a cache of what kilnd says, and a file that a
// crash left short or empty fails the integrity check, is removed and counts as a miss. The
// file's modification time is when kilnd last gave the answer; Load refuses one older than the
// caller's TTL.
//
// Thread-safety: thread-safe (no mutable state). Several processes may share one root.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "client/core/error.h"

namespace kiln::core {

// The name of the answer to the request with `request_key` from the daemon at `address`: the
// lowercase hex SHA-256 of address, a NUL byte and the key. Per address, because two daemons
// may answer one request differently (another compiler, another signing key).
std::string AnswerName(std::string_view address, std::string_view request_key);

class AnswerFolder {
 public:
  struct Answer {
    std::string response;  // the bytes given to Save
    // Owned by this process's user and writable by no one else: only this user could have
    // written it, so it holds what this user's client accepted (see the clients' trust rule).
    bool is_private = false;
  };

  // The folder under `root` (the cache root); nothing is created until the first Save.
  explicit AnswerFolder(std::string root);

  // Where the answer `name` lives (whether or not it is there). REQUIRES: key::IsDigest(name).
  std::string PathFor(std::string_view name) const;

  // The answer saved under `name`, when it is there, intact and at most `max_age_s` seconds
  // old (by its modification time). nullopt when absent, older, unreadable or damaged; a
  // damaged file (wrong magic, too short, bytes that do not hash to the recorded SHA-256) is
  // removed. A `max_age_s` of zero or less, or NaN, is always a miss. `error` is set only for a
  // malformed name (INVALID_ARGUMENT), which never becomes a path.
  std::optional<Answer> Load(std::string_view name, double max_age_s, Error* error) const;

  // Saves `response` under `name` atomically, replacing what was there, and so resets its age.
  // False with `error` set when the name is malformed or the file system refuses; callers treat
  // a failed save as a cache that did not fill.
  bool Save(std::string_view name, std::string_view response, Error* error) const;

  // Forgets the answer under `name` (absent already is fine). False only for a malformed name.
  bool Drop(std::string_view name, Error* error) const;

 private:
  const std::string dir_;  // root/answers
};

}  // namespace kiln::core
