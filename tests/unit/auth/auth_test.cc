// server/auth without a daemon: the token file and the Authorizer's decisions, the canonical
// encoding, Ed25519 signing and verification (tampering, untrusted keys, rotation), and keygen.
#include "server/auth/auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/wire/sample_results.h"

namespace kiln::auth {
namespace {

namespace fs = std::filesystem;
using wire::testing::CpuResult;
using wire::testing::kHandle;
using wire::testing::TempDir;

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

struct Keys {
  TempDir dir;
  std::unique_ptr<SigningKey> signer;
  TrustedKeys trusted;
};

std::unique_ptr<Keys> MakeKeys(const std::string& name = "k") {
  auto keys = std::make_unique<Keys>();
  EXPECT_TRUE(WriteKeyPair(keys->dir / name, keys->dir / (name + ".pub")).ok());
  absl::StatusOr<std::unique_ptr<SigningKey>> signer = SigningKey::FromPemFile(keys->dir / name);
  EXPECT_TRUE(signer.ok()) << signer.status();
  keys->signer = *std::move(signer);
  EXPECT_TRUE(keys->trusted.AddPemFile(keys->dir / (name + ".pub")).ok());
  return keys;
}

TEST(TokenFile, ParsesNamesRolesLimitsAndComments) {
  absl::StatusOr<std::vector<TokenEntry>> entries = ParseTokenFile(
      "# tenants\n"
      "ci      compile  ci-token-0123456789 compiles=2\n"
      "\n"
      "viewer\tread\tviewer-token-012345   # trailing comment\n"
      "ops admin ops-token-0123456789\n",
      "tokens.txt");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].name, "ci");
  EXPECT_EQ((*entries)[0].role, Role::kCompile);
  EXPECT_EQ((*entries)[0].max_compiles, 2);
  EXPECT_EQ((*entries)[1].role, Role::kRead);
  EXPECT_EQ((*entries)[2].role, Role::kAdmin);
  EXPECT_EQ((*entries)[2].token_sha256.size(), 32u);
}

TEST(TokenFile, RejectsMalformedLinesNamingFileAndLine) {
  struct Case {
    const char* text;
    const char* rule;
  };
  const Case cases[] = {
      {"a read\n", "NAME ROLE TOKEN"},
      {"a reader tok-0123456789abcdef\n", "unknown role 'reader'"},
      {"a read short\n", "shorter than 16"},
      {"a read tok-0123456789abcdef limit=3\n", "compiles=N"},
      {"a read tok-0123456789abcdef\na read tok-0123456789abcdeg\n", "used twice"},
      {"a read tok-0123456789abcdef\nb read tok-0123456789abcdef\n", "token of 'b' is used twice"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<TokenEntry>> entries = ParseTokenFile(c.text, "t.txt");
    ASSERT_FALSE(entries.ok()) << c.text;
    EXPECT_TRUE(absl::IsInvalidArgument(entries.status()));
    EXPECT_NE(entries.status().message().find("t.txt:"), std::string::npos);
    EXPECT_NE(entries.status().message().find(c.rule), std::string::npos)
        << entries.status().message();
  }
}

TEST(Authorizer, RolesAreOrderedAndRefusalsSayWhy) {
  TempDir dir;
  WriteText(dir / "tokens", "r read read-token-0123456789\nc compile compile-token-012345\n");
  absl::StatusOr<std::unique_ptr<Authorizer>> authz = Authorizer::Create(dir / "tokens");
  ASSERT_TRUE(authz.ok()) << authz.status();
  const Authorizer& a = **authz;

  absl::StatusOr<Caller> none = a.AuthorizeHeader("", Role::kRead, "Lookup");
  EXPECT_TRUE(absl::IsUnauthenticated(none.status()));
  absl::StatusOr<Caller> wrong = a.AuthorizeHeader("Bearer not-a-token-at-all", Role::kRead, "X");
  EXPECT_TRUE(absl::IsUnauthenticated(wrong.status()));
  absl::StatusOr<Caller> no_scheme = a.AuthorizeHeader("read-token-0123456789", Role::kRead, "X");
  EXPECT_TRUE(absl::IsUnauthenticated(no_scheme.status()));

  absl::StatusOr<Caller> reader =
      a.AuthorizeHeader("Bearer read-token-0123456789", Role::kRead, "Lookup");
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->name, "r");
  absl::StatusOr<Caller> denied =
      a.AuthorizeHeader("Bearer read-token-0123456789", Role::kCompile, "Compile");
  EXPECT_TRUE(absl::IsPermissionDenied(denied.status()));
  EXPECT_NE(denied.status().message().find("needs role 'compile'"), std::string::npos);
  EXPECT_EQ(denied.status().message().find("read-token"), std::string::npos)
      << "a refusal must never echo the token";
  EXPECT_TRUE(a.AuthorizeHeader("Bearer compile-token-012345", Role::kCompile, "Compile").ok());
  EXPECT_TRUE(absl::IsPermissionDenied(
      a.AuthorizeHeader("Bearer compile-token-012345", Role::kAdmin, "Admin").status()));

  v1::GetStatsResponse stats;
  a.AddStats(&stats);
  ASSERT_EQ(stats.tokens_size(), 2);
  EXPECT_EQ(stats.unauthenticated(), 3);
  EXPECT_EQ(stats.tokens(0).name(), "r");
  EXPECT_EQ(stats.tokens(0).requests(), 1);
  EXPECT_EQ(stats.tokens(0).denied(), 1);
}

TEST(Authorizer, ReloadSwapsTokensAndKeepsTheOldSetOnError) {
  TempDir dir;
  WriteText(dir / "tokens", "a read token-a-0123456789\n");
  absl::StatusOr<std::unique_ptr<Authorizer>> authz = Authorizer::Create(dir / "tokens");
  ASSERT_TRUE(authz.ok());
  WriteText(dir / "tokens", "b admin token-b-0123456789\n");
  ASSERT_TRUE((*authz)->Reload().ok());
  EXPECT_FALSE((*authz)->AuthorizeHeader("Bearer token-a-0123456789", Role::kRead, "X").ok());
  EXPECT_TRUE((*authz)->AuthorizeHeader("Bearer token-b-0123456789", Role::kAdmin, "X").ok());
  WriteText(dir / "tokens", "broken line\n");
  EXPECT_FALSE((*authz)->Reload().ok());
  EXPECT_TRUE((*authz)->AuthorizeHeader("Bearer token-b-0123456789", Role::kAdmin, "X").ok());
}

TEST(Authorizer, CompileSlotsAreBoundedPerToken) {
  TempDir dir;
  WriteText(dir / "tokens",
            "t compile token-t-0123456789 compiles=2\nu compile token-u-0123456789\n");
  absl::StatusOr<std::unique_ptr<Authorizer>> authz = Authorizer::Create(dir / "tokens", 5);
  ASSERT_TRUE(authz.ok());
  absl::StatusOr<Caller> t =
      (*authz)->AuthorizeHeader("Bearer token-t-0123456789", Role::kCompile, "C");
  absl::StatusOr<Caller> u =
      (*authz)->AuthorizeHeader("Bearer token-u-0123456789", Role::kCompile, "C");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->max_compiles, 5);  // the default applies to a line without compiles=N
  auto s1 = Authorizer::TryAcquireCompile(*t);
  auto s2 = Authorizer::TryAcquireCompile(*t);
  EXPECT_NE(s1, nullptr);
  EXPECT_NE(s2, nullptr);
  EXPECT_EQ(Authorizer::TryAcquireCompile(*t), nullptr);
  EXPECT_NE(Authorizer::TryAcquireCompile(*u), nullptr) << "one token's limit is its own";
  s1.reset();
  EXPECT_NE(Authorizer::TryAcquireCompile(*t), nullptr);
  EXPECT_EQ(t->counters->limited.load(), 1);
}

TEST(Signing, CanonicalBytesCoverSignedFieldsOnly) {
  const v1::ActionResult base = CpuResult();
  const std::string bytes = CanonicalResultBytes(kHandle, base);
  EXPECT_EQ(bytes.rfind("kiln-result-signature-v1\n", 0), 0u);

  v1::ActionResult log_changed = base;
  log_changed.set_compile_log("different");
  log_changed.mutable_stats()->set_total_ms(99);
  EXPECT_EQ(CanonicalResultBytes(kHandle, log_changed), bytes);

  std::vector<v1::ActionResult> changed(6, base);
  changed[0].mutable_artifacts(0)->set_size(12346);
  changed[1].mutable_plan()->mutable_buffers(0)->set_shape(1, 9);
  changed[2].mutable_plan()->mutable_steps(0)->set_kernel("k1");
  changed[3].mutable_target()->mutable_cpu()->set_isa("x86-64-v4");
  changed[4].set_key_debug("other");
  changed[5].mutable_plan()->mutable_steps(0)->add_args(2);
  for (const v1::ActionResult& c : changed) EXPECT_NE(CanonicalResultBytes(kHandle, c), bytes);
  EXPECT_NE(CanonicalResultBytes(std::string(64, 'f'), base), bytes);
}

TEST(Signing, SignedResultVerifiesAndTamperingIsRefused) {
  std::unique_ptr<Keys> keys = MakeKeys();
  v1::ActionResult r = CpuResult();
  ASSERT_TRUE(keys->signer->Sign(kHandle, &r).ok());
  EXPECT_EQ(r.signature().algorithm(), "ed25519");
  EXPECT_EQ(r.signature().key_id(), keys->signer->key_id());
  EXPECT_EQ(r.signature().signature().size(), 64u);
  ASSERT_TRUE(keys->trusted.VerifyResult(kHandle, r).ok());

  v1::ActionResult artifact = r;
  artifact.mutable_artifacts(0)->set_digest(std::string(63, 'a') + "b");
  EXPECT_TRUE(absl::IsDataLoss(keys->trusted.VerifyResult(kHandle, artifact)));
  v1::ActionResult plan = r;
  plan.mutable_plan()->set_workspace_bytes(1 << 20);
  EXPECT_TRUE(absl::IsDataLoss(keys->trusted.VerifyResult(kHandle, plan)));
  v1::ActionResult signature = r;
  signature.mutable_signature()->mutable_signature()->at(10) ^= 0x01;
  EXPECT_TRUE(absl::IsDataLoss(keys->trusted.VerifyResult(kHandle, signature)));
  EXPECT_TRUE(absl::IsDataLoss(keys->trusted.VerifyResult(std::string(64, 'e'), r)))
      << "a record moved to another handle";
  v1::ActionResult unsigned_result = r;
  unsigned_result.clear_signature();
  EXPECT_TRUE(absl::IsFailedPrecondition(keys->trusted.VerifyResult(kHandle, unsigned_result)));
}

TEST(Signing, TenThousandRandomByteMutationsAreAllRefused) {
  std::unique_ptr<Keys> keys = MakeKeys();
  v1::ActionResult r = CpuResult();
  r.clear_compile_log();  // unsigned fields: a change there is no tampering
  r.clear_stats();
  ASSERT_TRUE(keys->signer->Sign(kHandle, &r).ok());
  const std::string record = r.SerializeAsString();
  std::mt19937_64 rng(20261123);
  int accepted = 0, unparsable = 0;
  for (int i = 0; i < 10000; ++i) {
    std::string mutated = record;
    const size_t at = rng() % mutated.size();
    const char old = mutated[at];
    do {
      mutated[at] = static_cast<char>(rng() & 0xff);
    } while (mutated[at] == old);
    v1::ActionResult parsed;
    if (!parsed.ParseFromString(mutated)) {
      ++unparsable;
      continue;
    }
    // Bits a varint carries past its field's width (a uint32's fifth byte, a negative int32's
    // tenth) are dropped by the parser: the same record, not a changed one.
    if (parsed.SerializeAsString() == record) continue;
    if (keys->trusted.VerifyResult(kHandle, parsed).ok()) ++accepted;
  }
  EXPECT_EQ(accepted, 0);
  EXPECT_LT(unparsable, 10000) << "most mutations must reach the verifier";
}

TEST(Signing, UntrustedKeyIsRefusedAndRotationAcceptsBothKeys) {
  std::unique_ptr<Keys> old_keys = MakeKeys("old");
  std::unique_ptr<Keys> new_keys = MakeKeys("new");
  v1::ActionResult by_old = CpuResult();
  v1::ActionResult by_new = CpuResult();
  ASSERT_TRUE(old_keys->signer->Sign(kHandle, &by_old).ok());
  ASSERT_TRUE(new_keys->signer->Sign(kHandle, &by_new).ok());
  absl::Status untrusted = new_keys->trusted.VerifyResult(kHandle, by_old);
  EXPECT_TRUE(absl::IsFailedPrecondition(untrusted));
  EXPECT_NE(untrusted.message().find("not trusted"), std::string::npos);

  absl::StatusOr<TrustedKeys> both =
      TrustedKeys::FromPemFiles({old_keys->dir / "old.pub", new_keys->dir / "new.pub"});
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->size(), 2u);
  EXPECT_TRUE(both->VerifyResult(kHandle, by_old).ok());
  EXPECT_TRUE(both->VerifyResult(kHandle, by_new).ok());
}

TEST(Signing, ResultSignerAcceptsItsOwnAndListedKeysAndReloads) {
  std::unique_ptr<Keys> a = MakeKeys("a");
  std::unique_ptr<Keys> b = MakeKeys("b");
  TempDir dir;
  fs::copy_file(a->dir / "a", dir / "current");
  absl::StatusOr<std::unique_ptr<ResultSigner>> signer =
      ResultSigner::Load(dir / "current", {b->dir / "b.pub"});
  ASSERT_TRUE(signer.ok()) << signer.status();
  v1::ActionResult r = CpuResult();
  ASSERT_TRUE((*signer)->Sign(kHandle, &r).ok());
  EXPECT_TRUE((*signer)->VerifyStored(kHandle, r).ok());
  v1::ActionResult by_b = CpuResult();
  ASSERT_TRUE(b->signer->Sign(kHandle, &by_b).ok());
  EXPECT_TRUE((*signer)->VerifyStored(kHandle, by_b).ok());

  // Rotate to b: results signed by a are no longer accepted (a is neither current nor listed).
  fs::copy_file(b->dir / "b", dir / "current", fs::copy_options::overwrite_existing);
  ASSERT_TRUE((*signer)->Reload().ok());
  EXPECT_EQ((*signer)->key_id(), b->signer->key_id());
  EXPECT_FALSE((*signer)->VerifyStored(kHandle, r).ok());
  WriteText(dir / "current", "not a key");
  EXPECT_FALSE((*signer)->Reload().ok());
  EXPECT_EQ((*signer)->key_id(), b->signer->key_id()) << "a bad reload keeps the current key";
}

TEST(Keygen, WritesPrivateKeyOwnerOnlyAndNeverOverwrites) {
  TempDir dir;
  ASSERT_TRUE(WriteKeyPair(dir / "k", dir / "k.pub").ok());
  struct stat st {};
  ASSERT_EQ(stat((dir / "k").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(absl::IsFailedPrecondition(WriteKeyPair(dir / "k", dir / "k2.pub")));
  EXPECT_FALSE(SigningKey::FromPemFile(dir / "k.pub").ok()) << "a public key cannot sign";
  EXPECT_TRUE(TrustedKeys::FromPemFiles({dir / "k.pub"}).ok());
  EXPECT_FALSE(TrustedKeys::FromPemFiles({dir / "k"}).ok())
      << "a private key is no trusted public key";
  EXPECT_FALSE(TrustedKeys::FromPemFiles({dir / "missing"}).ok());
}

TEST(Tls, LoadChecksThatKeyAndCertificateBelongTogether) {
  TempDir dir;
  const std::string make =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=localhost -keyout " +
      (dir / "k1") + " -out " + (dir / "c1") +
      " 2>/dev/null && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
      "-nodes -days 1 -subj /CN=localhost -keyout " +
      (dir / "k2") + " -out " + (dir / "c2") + " 2>/dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << "openssl is needed";
  absl::StatusOr<std::unique_ptr<TlsMaterial>> good =
      TlsMaterial::Load({dir / "c1", dir / "k1", ""});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_FALSE((*good)->requires_client_cert());
  absl::StatusOr<std::unique_ptr<TlsMaterial>> mismatched =
      TlsMaterial::Load({dir / "c1", dir / "k2", ""});
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("does not belong"), std::string::npos);
  EXPECT_FALSE(TlsMaterial::Load({dir / "k1", dir / "k1", ""}).ok());

  // A reload to a broken pair keeps the generation (and the set) in use.
  fs::copy_file(dir / "c1", dir / "c", fs::copy_options::overwrite_existing);
  fs::copy_file(dir / "k1", dir / "k", fs::copy_options::overwrite_existing);
  absl::StatusOr<std::unique_ptr<TlsMaterial>> m = TlsMaterial::Load({dir / "c", dir / "k", ""});
  ASSERT_TRUE(m.ok());
  fs::copy_file(dir / "c2", dir / "c", fs::copy_options::overwrite_existing);
  EXPECT_FALSE((*m)->Reload().ok());
  EXPECT_EQ((*m)->generation(), 1);
  fs::copy_file(dir / "k2", dir / "k", fs::copy_options::overwrite_existing);
  EXPECT_TRUE((*m)->Reload().ok());
  EXPECT_EQ((*m)->generation(), 2);
}

}  // namespace
}  // namespace kiln::auth
