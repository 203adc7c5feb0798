// The verification half of signed results (wire.h): the canonical bytes a signature covers
// (FORMAT.md), key ids, trusted keys, and reading key files. kilnd's signing key is in
// server/auth; clients link only this.
#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/key/digest.h"
#include "kernels/util/status_macros.h"
#include "openssl/err.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "wire/openssl.h"
#include "wire/wire.h"

namespace kiln::wire {
namespace {

constexpr char kDomain[] = "kiln-result-signature-v1\n";

using internal::BioDeleter;
using internal::PkeyDeleter;
using internal::PkeyPtr;
using MdCtxDeleter = internal::OpenSslFree<EVP_MD_CTX_free>;

// The canonical encoding (FORMAT.md): integers as 8 bytes little-endian two's complement,
// strings as their length (an integer) then their bytes, lists as their length then items.
class Encoder {
 public:
  void Int(int64_t v) {
    uint64_t u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  void Str(absl::string_view s) {
    Int(static_cast<int64_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  template <typename List>
  void Ints(const List& list) {
    Int(list.size());
    for (auto v : list) Int(static_cast<int64_t>(v));
  }
  void Raw(absl::string_view s) { out_.append(s.data(), s.size()); }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

bool VerifyEd25519(EVP_PKEY* pkey, absl::string_view message, absl::string_view signature) {
  if (signature.size() != internal::kEd25519SignatureBytes) return false;
  std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  if (ctx == nullptr) return false;
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pkey) != 1) return false;
  const int ok = EVP_DigestVerify(
      ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
      reinterpret_cast<const unsigned char*>(message.data()), message.size());
  ERR_clear_error();
  return ok == 1;
}

}  // namespace

namespace internal {

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "unknown OpenSSL error";
  char buffer[256];
  ERR_error_string_n(e, buffer, sizeof(buffer));
  ERR_clear_error();
  return buffer;
}

absl::StatusOr<std::string> RawPublicKey(EVP_PKEY* pkey, const std::string& path) {
  if (EVP_PKEY_id(pkey) != EVP_PKEY_ED25519) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not an Ed25519 key"));
  }
  std::string raw(internal::kEd25519PublicKeyBytes, '\0');
  size_t len = raw.size();
  if (EVP_PKEY_get_raw_public_key(pkey, reinterpret_cast<unsigned char*>(raw.data()), &len) != 1 ||
      len != internal::kEd25519PublicKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot read the public key: ", OpenSslError()));
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

std::string CanonicalResultBytes(absl::string_view handle, const v1::ActionResult& result) {
  Encoder e;
  e.Raw(kDomain);
  e.Str(handle);
  const v1::Target& target = result.target();
  if (target.has_cpu()) {
    e.Int(1);
    e.Str(target.cpu().isa());
    e.Int(target.cpu().features_size());
    for (const std::string& f : target.cpu().features()) e.Str(f);
  } else if (target.has_cuda()) {
    e.Int(2);
    e.Int(target.cuda().sm());
  } else {
    e.Int(0);
  }
  e.Int(result.artifacts_size());
  for (const v1::Artifact& a : result.artifacts()) {
    e.Int(a.kind());
    e.Str(a.digest());
    e.Int(a.size());
  }
  const v1::LaunchPlan& plan = result.plan();
  e.Int(plan.buffers_size());
  for (const v1::PlanBuffer& b : plan.buffers()) {
    e.Int(b.role());
    e.Int(b.index());
    e.Int(b.dtype());
    e.Ints(b.shape());
    e.Int(b.bytes());
    e.Int(b.offset());
  }
  e.Int(plan.steps_size());
  for (const v1::PlanStep& s : plan.steps()) {
    e.Str(s.kernel());
    e.Ints(s.grid());
    e.Ints(s.block());
    e.Int(s.shared_bytes());
    e.Ints(s.args());
  }
  e.Int(plan.workspace_bytes());
  e.Int(plan.abi_version());
  if (plan.symbols_size() > 0) {  // symbolic plans only, so every other record signs as before
    auto expr = [&e](const v1::SizeExpr& x) {
      e.Int(x.terms_size());
      for (const v1::SizeTerm& t : x.terms()) {
        e.Int(t.coeff());
        e.Ints(t.exponents());
      }
    };
    e.Int(plan.symbols_size());
    for (const v1::PlanSymbol& s : plan.symbols()) {
      e.Str(s.name());
      e.Int(s.input());
      e.Int(s.axis());
    }
    for (const v1::PlanBuffer& b : plan.buffers()) {
      e.Int(b.shape_exprs_size());
      for (const v1::SizeExpr& x : b.shape_exprs()) expr(x);
      expr(b.bytes_expr());
    }
    // Symbolic CUDA plans (launches sized at run time) only: CPU ones sign as before.
    const bool sized_launches =
        std::any_of(plan.steps().begin(), plan.steps().end(),
                    [](const v1::PlanStep& s) { return s.grid_per_block() > 0; });
    if (sized_launches) {
      for (const v1::PlanStep& s : plan.steps()) {
        expr(s.grid_work());
        e.Int(s.grid_per_block());
      }
      expr(plan.index_bound());
      // Launch-time choices among kernels: plans that have them only (older ones sign as before).
      const bool guarded =
          std::any_of(plan.steps().begin(), plan.steps().end(),
                      [](const v1::PlanStep& s) { return s.guard_min() > 0 || s.guard_max() > 0; });
      if (guarded) {
        for (const v1::PlanStep& s : plan.steps()) {
          expr(s.guard());
          e.Int(s.guard_min());
          e.Int(s.guard_max());
        }
      }
    }
  }
  e.Str(result.key_debug());
  e.Int(result.key_fields_size());
  for (const v1::KeyField& f : result.key_fields()) {
    e.Str(f.label());
    e.Str(f.value());
  }
  return e.Take();
}

std::string KeyIdOf(absl::string_view raw_public_key) {
  return key::Sha256Hex(std::string_view(raw_public_key.data(), raw_public_key.size()))
      .substr(0, 16);
}

// ---------------------------------------------------------------------------- TrustedKeys

absl::StatusOr<TrustedKeys> TrustedKeys::FromPemFiles(const std::vector<std::string>& paths) {
  TrustedKeys keys;
  for (const std::string& path : paths) KILN_RETURN_IF_ERROR(keys.AddPemFile(path));
  return keys;
}

absl::Status TrustedKeys::AddPemFile(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string pem, ReadSecretFile(path, "public key"));
  std::unique_ptr<BIO, BioDeleter> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  PkeyPtr pkey(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds no PEM public key: ", internal::OpenSslError()));
  }
  KILN_ASSIGN_OR_RETURN(std::string raw, internal::RawPublicKey(pkey.get(), path));
  return AddRawPublicKey(raw);
}

absl::Status TrustedKeys::AddRawPublicKey(absl::string_view raw_public_key) {
  if (raw_public_key.size() != internal::kEd25519PublicKeyBytes) {
    return absl::InvalidArgumentError("an Ed25519 public key has 32 bytes");
  }
  std::shared_ptr<EVP_PKEY> pkey(
      EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr,
                                  reinterpret_cast<const unsigned char*>(raw_public_key.data()),
                                  raw_public_key.size()),
      PkeyDeleter());
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad Ed25519 public key: ", internal::OpenSslError()));
  }
  keys_.insert_or_assign(KeyIdOf(raw_public_key), std::move(pkey));
  return absl::OkStatus();
}

absl::Status TrustedKeys::VerifyResult(absl::string_view handle,
                                       const v1::ActionResult& result) const {
  const std::string prefix(handle.substr(0, 12));
  if (!result.has_signature() || result.signature().signature().empty()) {
    return absl::FailedPreconditionError(absl::StrCat("the result for ", prefix, " is not signed"));
  }
  const v1::ResultSignature& sig = result.signature();
  if (sig.algorithm() != kSignatureAlgorithm) {
    return absl::FailedPreconditionError(
        absl::StrCat("the result for ", prefix, " is signed with '", sig.algorithm().substr(0, 32),
                     "', not ", kSignatureAlgorithm));
  }
  auto it = keys_.find(sig.key_id());
  if (it == keys_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the result for ", prefix, " is signed by key ", sig.key_id().substr(0, 32),
                     ", which is not trusted here"));
  }
  if (!VerifyEd25519(it->second.get(), CanonicalResultBytes(handle, result), sig.signature())) {
    return absl::DataLossError(absl::StrCat("the signature of the result for ", prefix, " (key ",
                                            sig.key_id(), ") does not match its contents"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::wire
