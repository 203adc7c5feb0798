// The verification half of signed results (wire.h) over protobuf messages: the canonical bytes
// and their check are result_bytes.h's and ed25519.h's, which read the serialized record, so
// that kilnd, the C++ client and the Python client (through the client core) share one
// implementation of each. kilnd's signing key is in server/auth; clients link only this.
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/util/status_macros.h"
#include "wire/openssl.h"
#include "wire/result_bytes.h"
#include "wire/wire.h"

namespace kiln::wire {
namespace {

std::string_view Std(absl::string_view s) { return {s.data(), s.size()}; }

absl::Status ToStatus(const TrustStatus& s) {
  switch (s.outcome) {
    case TrustOutcome::kOk:
      return absl::OkStatus();
    case TrustOutcome::kKeyUnreadable:
      return absl::NotFoundError(s.message);
    case TrustOutcome::kKeyNotPem:
    case TrustOutcome::kKeyNotEd25519:
    case TrustOutcome::kMalformed:
      return absl::InvalidArgumentError(s.message);
    case TrustOutcome::kUnsigned:
    case TrustOutcome::kOtherAlgorithm:
    case TrustOutcome::kUntrustedKey:
      return absl::FailedPreconditionError(s.message);
    case TrustOutcome::kMismatch:
      return absl::DataLossError(s.message);
  }
  return absl::InternalError(s.message);
}

}  // namespace

namespace internal {

absl::StatusOr<std::string> RawPublicKey(EVP_PKEY* pkey, const std::string& path) {
  std::string raw;
  if (!RawEd25519PublicKey(pkey, &raw)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not an Ed25519 key"));
  }
  return raw;
}

}  // namespace internal

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the ", what, " ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Serialized, then encoded from the serialization: the one encoding every language uses (the
// Python client hands the core its own serialization), instead of a second one over the parsed
// message that would have to be kept byte for byte the same.
std::string CanonicalResultBytes(absl::string_view handle, const v1::ActionResult& result) {
  std::string error;
  std::optional<SignedResult> decoded =
      DecodeSignedResult(Std(handle), DeterministicBytes(result), &error);
  // protobuf's own serialization always decodes, so this is a bug in result_bytes.cc. The text
  // returned lacks the domain prefix: no result that decodes has these bytes.
  if (!decoded.has_value()) return "kiln: cannot encode a result: " + error;
  return std::move(decoded->bytes);
}

// ---------------------------------------------------------------------------- TrustedKeys

absl::StatusOr<TrustedKeys> TrustedKeys::FromPemFiles(const std::vector<std::string>& paths) {
  TrustedKeys keys;
  for (const std::string& path : paths) KILN_RETURN_IF_ERROR(keys.AddPemFile(path));
  return keys;
}

absl::Status TrustedKeys::AddPemFile(const std::string& path) {
  return ToStatus(ring_.AddPemFile(path));
}

absl::Status TrustedKeys::AddRawPublicKey(absl::string_view raw_public_key) {
  return ToStatus(ring_.AddRawPublicKey(Std(raw_public_key)));
}

absl::Status TrustedKeys::VerifyResult(absl::string_view handle,
                                       const v1::ActionResult& result) const {
  return ToStatus(ring_.VerifyResult(Std(handle), DeterministicBytes(result)));
}

}  // namespace kiln::wire
