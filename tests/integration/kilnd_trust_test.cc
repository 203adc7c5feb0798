// Trust end to end with the C++ client and the real kilnd: mTLS, tokens and roles, signed
// results verified before the .so is loaded, and stored records tampered with on disk (plan,
// artifact, signature, another signer) that kilnd refuses to serve: it compiles again instead,
// and what clients get always verifies. Certificates come from the openssl command, the
// signing keys from `kilnd keygen`.
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "client/cpp/kiln.h"
#include "gtest/gtest.h"
#include "kernels/key/digest.h"
#include "server/auth/auth.h"
#include "server/store/rocksdb_store.h"
#include "tests/integration/kilnd_process.h"
#include "tests/integration/test_pki.h"
#include "tests/integration/wire_graph.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using client::Session;
using client::SessionOptions;

constexpr int kN = 64;

class TrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kiln-trust-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(testing::MakeTestPki(dir_), "");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::string StartKilnd(testing::KilndProcess* kilnd) {
    return kilnd->Start(Path("cache"),
                        {"--tls-cert=" + Path("server.crt"), "--tls-key=" + Path("server.key"),
                         "--tls-client-ca=" + Path("ca.crt"), "--auth-tokens=" + Path("tokens"),
                         "--signing-key=" + Path("sign.pem"), "--workers=2"},
                        /*quiet=*/true);
  }

  absl::StatusOr<std::unique_ptr<Session>> Connect(const std::string& address,
                                                   const std::string& token,
                                                   const std::string& trusted_key) {
    SessionOptions o;
    o.client.address = address;
    o.client.tls_ca = Path("ca.crt");
    o.client.tls_cert = Path("client.crt");
    o.client.tls_key = Path("client.key");
    o.client.token = token;
    o.client.retry.max_attempts = 2;
    o.client.timeout = absl::Seconds(20);
    o.cache_dir = Path("client-cache");
    o.trusted_keys = {trusted_key};
    return Session::Create(std::move(o));
  }

  static v1::Graph Graph(double scale = 0.5) {
    testing::WireGraph g;
    const int x = g.Input("x", v1::F32, {kN});
    const int y = g.Op("mul", {g.Op("exp", {x}), g.Scalar(scale)});
    g.Output(y);
    return g.graph();
  }

  static v1::Target Cpu() {
    v1::Target t;
    t.mutable_cpu()->set_isa("x86-64-v2");
    return t;
  }

  static void ExpectRuns(const client::LoadedKernel& kernel) {
    std::vector<float> x(kN), y(kN, -1);
    for (int i = 0; i < kN; ++i) x[i] = 0.01f * static_cast<float>(i);
    ASSERT_TRUE(kernel.Run({{x.data(), x.size() * 4}}, {{y.data(), y.size() * 4}}).ok());
    for (int i = 0; i < kN; ++i) EXPECT_NEAR(y[i], 0.5 * std::exp(x[i]), 1e-5);
  }

  std::string dir_;
};

TEST_F(TrustTest, TlsTokensAndVerifiedLoadWithTheCppClient) {
  testing::KilndProcess kilnd;
  ASSERT_EQ(StartKilnd(&kilnd), "");

  absl::StatusOr<std::unique_ptr<Session>> builder =
      Connect(kilnd.address(), testing::kBuilderToken, Path("sign.pem.pub"));
  ASSERT_TRUE(builder.ok()) << builder.status();
  absl::StatusOr<client::LoadedKernel> kernel = (*builder)->CompileAndLoad(Graph(), Cpu());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ(kernel->response().result().signature().algorithm(), "ed25519");
  ExpectRuns(*kernel);

  // Another signer's key only: refused before anything is fetched or loaded.
  absl::StatusOr<std::unique_ptr<Session>> wary =
      Connect(kilnd.address(), testing::kBuilderToken, Path("other.pem.pub"));
  ASSERT_TRUE(wary.ok());
  absl::StatusOr<client::LoadedKernel> refused = (*wary)->CompileAndLoad(Graph(), Cpu());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("not trusted"), std::string::npos);

  // Roles: a reader may load what exists (by handle, or by request key: a lookup, no
  // compile), not compile anything new; no token at all is unauthenticated.
  absl::StatusOr<std::unique_ptr<Session>> reader =
      Connect(kilnd.address(), testing::kReaderToken, Path("sign.pem.pub"));
  ASSERT_TRUE(reader.ok());
  EXPECT_TRUE((*reader)->LoadHandle(kernel->handle()).ok());
  absl::StatusOr<client::LoadedKernel> looked_up = (*reader)->CompileAndLoad(Graph(), Cpu());
  ASSERT_TRUE(looked_up.ok()) << looked_up.status();
  EXPECT_EQ(looked_up->handle(), kernel->handle());
  EXPECT_EQ((*reader)->key_hits(), 1);
  absl::Status denied = (*reader)->CompileAndLoad(Graph(0.75), Cpu()).status();
  EXPECT_TRUE(absl::IsPermissionDenied(denied)) << denied;
  EXPECT_NE(denied.message().find("needs role 'compile'"), std::string::npos);
  unsetenv("KILN_TOKEN");
  absl::StatusOr<std::unique_ptr<Session>> anonymous =
      Connect(kilnd.address(), "", Path("sign.pem.pub"));
  ASSERT_TRUE(anonymous.ok());
  EXPECT_TRUE(absl::IsUnauthenticated((*anonymous)->client().GetStats().status()));

  // Plaintext against the TLS port fails cleanly.
  client::ClientOptions plain;
  plain.address = kilnd.address();
  plain.retry.max_attempts = 1;
  plain.timeout = absl::Seconds(3);
  unsetenv("KILN_TLS_CA");
  absl::StatusOr<std::unique_ptr<client::Client>> plaintext = client::Client::Create(plain);
  ASSERT_TRUE(plaintext.ok());
  EXPECT_TRUE(absl::IsUnavailable((*plaintext)->GetStats().status()));
  EXPECT_EQ(kilnd.Stop(), 0);
}

// A byte flipped in the client's local artifact directory (size and mtime kept) is caught at
// load time: the copy is deleted, fetched again, and what runs is the signed code.
TEST_F(TrustTest, LocalArtifactDirectoryIsReverifiedAtLoad) {
  testing::KilndProcess kilnd;
  ASSERT_EQ(StartKilnd(&kilnd), "");
  absl::StatusOr<std::unique_ptr<Session>> s =
      Connect(kilnd.address(), testing::kBuilderToken, Path("sign.pem.pub"));
  ASSERT_TRUE(s.ok());
  absl::StatusOr<v1::CompileResponse> r = (*s)->client().Compile(Graph(0.75), Cpu());
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::Artifact* so = client::FindArtifact(*r, v1::SHARED_OBJECT);
  ASSERT_NE(so, nullptr);
  absl::StatusOr<std::string> path = (*s)->FetchArtifact(*so);
  ASSERT_TRUE(path.ok()) << path.status();
  const auto mtime = fs::last_write_time(*path);
  {
    std::fstream f(*path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(so->size() / 2);
    const char c = static_cast<char>(f.get());
    f.seekp(so->size() / 2);
    f.put(static_cast<char>(c ^ 0x01));
  }
  fs::last_write_time(*path, mtime);
  absl::StatusOr<client::LoadedKernel> kernel = (*s)->Load(*r);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ((*s)->cache().stats().corruptions, 1);
  std::vector<float> x(kN, 0.25f), y(kN);
  ASSERT_TRUE(kernel->Run({{x.data(), x.size() * 4}}, {{y.data(), y.size() * 4}}).ok());
  EXPECT_NEAR(y[0], 0.75 * std::exp(0.25), 1e-5);
  EXPECT_EQ(kilnd.Stop(), 0);
}

// Each way of changing a stored record, and what kilnd must do about it: refuse it and
// compile again, so the client gets a result that verifies and runs.
TEST_F(TrustTest, TamperedStoredRecordsAreNeverServed) {
  std::string handle;
  {
    testing::KilndProcess kilnd;
    ASSERT_EQ(StartKilnd(&kilnd), "");
    absl::StatusOr<std::unique_ptr<Session>> s =
        Connect(kilnd.address(), testing::kBuilderToken, Path("sign.pem.pub"));
    ASSERT_TRUE(s.ok());
    absl::StatusOr<v1::CompileResponse> r = (*s)->client().Compile(Graph(), Cpu());
    ASSERT_TRUE(r.ok()) << r.status();
    handle = r->handle();
    EXPECT_EQ(kilnd.Stop(), 0);
  }
  absl::StatusOr<std::unique_ptr<auth::SigningKey>> other =
      auth::SigningKey::FromPemFile(Path("other.pem"));
  ASSERT_TRUE(other.ok());

  using Tamper = std::function<void(v1::ActionResult*, std::vector<std::string>*)>;
  const std::vector<std::pair<std::string, Tamper>> cases = {
      {"plan",
       [](v1::ActionResult* r, std::vector<std::string>*) {
         r->mutable_plan()->set_workspace_bytes(r->plan().workspace_bytes() + 4096);
       }},
      {"artifact",
       [](v1::ActionResult* r, std::vector<std::string>* blobs) {
         for (int i = 0; i < r->artifacts_size(); ++i) {
           if (r->artifacts(i).kind() != v1::SHARED_OBJECT) continue;
           std::string& so = (*blobs)[i];
           so[so.size() / 2] ^= 0x01;  // other code, stored under its own (valid) digest
           r->mutable_artifacts(i)->set_digest(key::Sha256Hex(so));
         }
       }},
      {"signature",
       [](v1::ActionResult* r, std::vector<std::string>*) {
         (*r->mutable_signature()->mutable_signature())[3] ^= 0x40;
       }},
      {"untrusted signer",
       [&](v1::ActionResult* r, std::vector<std::string>*) {
         r->mutable_plan()->set_workspace_bytes(r->plan().workspace_bytes() + 4096);
         ASSERT_TRUE((*other)->Sign(handle, r).ok());
       }},
  };
  for (const auto& [name, tamper] : cases) {
    SCOPED_TRACE(name);
    {
      store::RocksDbStoreOptions options;
      options.path = Path("cache");
      absl::StatusOr<std::unique_ptr<store::RocksDbStore>> store =
          store::RocksDbStore::Open(options);
      ASSERT_TRUE(store.ok()) << store.status();
      absl::StatusOr<std::optional<v1::ActionResult>> stored = (*store)->GetResult(handle);
      ASSERT_TRUE(stored.ok() && stored->has_value());
      v1::ActionResult record = **stored;
      std::vector<std::string> blobs;
      for (const v1::Artifact& a : record.artifacts()) {
        absl::StatusOr<std::optional<std::string>> blob = (*store)->GetBlob(a.digest());
        ASSERT_TRUE(blob.ok() && blob->has_value());
        blobs.push_back(**blob);
      }
      tamper(&record, &blobs);
      ASSERT_TRUE((*store)->PutResult(handle, record, blobs).ok());
    }
    testing::KilndProcess kilnd;
    ASSERT_EQ(StartKilnd(&kilnd), "");
    absl::StatusOr<std::unique_ptr<Session>> s =
        Connect(kilnd.address(), testing::kBuilderToken, Path("sign.pem.pub"));
    ASSERT_TRUE(s.ok());
    absl::StatusOr<client::LoadedKernel> kernel = (*s)->CompileAndLoad(Graph(), Cpu());
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    EXPECT_FALSE(kernel->cache_hit()) << "the tampered record was served as a hit";
    ExpectRuns(*kernel);
    absl::StatusOr<v1::GetStatsResponse> stats = (*s)->client().GetStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->compiles(), 1);
    EXPECT_GE(stats->store().corruptions(), 1);
    EXPECT_EQ(kilnd.Stop(), 0);
  }
}

}  // namespace
}  // namespace kiln
