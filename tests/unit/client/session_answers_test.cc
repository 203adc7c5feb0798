// Session's machine tier against the real kilnd (signing its results): a second Session on the
// same local folder gets the answer another one was given, with no RPC at all and kilnd's
// request counter still, and runs it right; so does one whose kilnd is gone. An answer past its
// TTL or damaged is asked of kilnd again and written back; a forged answer in a file others may
// write is verified, refused and replaced; one signed by a key no longer trusted is not used.
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/core/answers.h"
#include "client/cpp/kiln.h"
#include "gtest/gtest.h"
#include "kernels/key/digest.h"
#include "tests/integration/test_pki.h"
#include "tests/integration/wire_graph.h"
#include "tests/unit/client/test_support.h"
#include "wire/wire.h"

namespace kiln::client {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kN = 1000;

// Runs `kernel` on random data and checks every element against SinCosGraph's reference.
void ExpectRunsRight(const LoadedKernel& kernel, double c) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<float> x(kN), y(kN, std::nanf(""));
  for (float& v : x) v = dist(rng);
  absl::Status ran = kernel.Run({{x.data(), x.size() * 4}}, {{y.data(), y.size() * 4}});
  ASSERT_TRUE(ran.ok()) << ran;
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(y[i], testing::SinCosReference(x[i], c), 1e-4) << "at " << i;
  }
}

int64_t ModifiedAt(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_mtim.tv_sec) : -1;
}

// One signing kilnd for the suite; each test uses graphs of its own (its own `c`).
class SessionAnswersTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    suite_ = new SuiteDaemon();
    ASSERT_EQ(testing::MakeTestPki(suite_->dir()), "");
    ASSERT_EQ(suite_->Start({"--signing-key=" + suite_->dir() + "/sign.pem"}, /*quiet=*/true), "");
  }
  static void TearDownTestSuite() {
    if (suite_ != nullptr) {
      EXPECT_EQ(suite_->kilnd().Stop(), 0);
    }
    delete suite_;
    suite_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(suite_, nullptr); }

  // A Session on the suite's kilnd and the local folder `cache_name`, trusting kilnd's key
  // (or `trusted_key`), as a fresh process would make it.
  static std::unique_ptr<Session> NewSession(const std::string& cache_name,
                                             absl::Duration answer_ttl = absl::Seconds(60),
                                             const std::string& trusted_key = "sign.pem.pub",
                                             const std::string& address = "") {
    SessionOptions options;
    options.client.address = address.empty() ? suite_->kilnd().address() : address;
    options.client.retry.max_attempts = 1;
    options.cache_dir = suite_->dir() + "/" + cache_name;
    options.trusted_keys = {suite_->dir() + "/" + trusted_key};
    options.answer_ttl = answer_ttl;
    absl::StatusOr<std::unique_ptr<Session>> session = Session::Create(options);
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? *std::move(session) : nullptr;
  }

  // Where `session` keeps the answer to `graph`.
  static std::string AnswerPath(Session& session, const v1::Graph& graph) {
    const std::string name =
        session.AnswerName(wire::RequestKey(graph, testing::CpuTarget(), v1::CompileOptions()));
    return session.cache().root() + "/answers/" + name.substr(0, 2) + "/" + name;
  }

  static int64_t KilndRequests(Session& session) {
    absl::StatusOr<v1::GetStatsResponse> stats = session.client().GetStats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? stats->requests() : -1;
  }

  static SuiteDaemon* suite_;
};

SuiteDaemon* SessionAnswersTest::suite_ = nullptr;

TEST_F(SessionAnswersTest, ASecondSessionRunsTheAnswerWithoutAskingKilnd) {
  const double c = 0.25;
  const v1::Graph graph = testing::SinCosGraph(kN, c);
  std::unique_ptr<Session> first = NewSession("shared");
  ASSERT_NE(first, nullptr);
  absl::StatusOr<LoadedKernel> compiled = first->CompileAndLoad(graph, testing::CpuTarget());
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  EXPECT_EQ(first->machine_hits(), 0);
  EXPECT_TRUE(fs::exists(AnswerPath(*first, graph)));
  const int64_t asked = KilndRequests(*first);

  std::unique_ptr<Session> second = NewSession("shared");
  ASSERT_NE(second, nullptr);
  absl::StatusOr<LoadedKernel> answered = second->CompileAndLoad(graph, testing::CpuTarget());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(second->machine_hits(), 1);
  EXPECT_EQ(second->key_hits(), 0);
  EXPECT_EQ(second->client().stats().calls, 0) << "an RPC was made";
  EXPECT_EQ(KilndRequests(*first), asked) << "kilnd was asked";
  EXPECT_TRUE(answered->cache_hit());
  EXPECT_EQ(answered->handle(), compiled->handle());
  EXPECT_EQ(answered->response().result().signature().algorithm(), "ed25519");
  ExpectRunsRight(*answered, c);
  // Once answered, the Session's own memory answers.
  ASSERT_TRUE(second->CompileAndLoad(graph, testing::CpuTarget()).ok());
  EXPECT_EQ(second->local_hits(), 1);
  EXPECT_EQ(second->machine_hits(), 1);

  // A Session with the tier off asks kilnd, by key.
  std::unique_ptr<Session> off = NewSession("shared", absl::ZeroDuration());
  ASSERT_NE(off, nullptr);
  ASSERT_TRUE(off->CompileAndLoad(graph, testing::CpuTarget()).ok());
  EXPECT_EQ(off->machine_hits(), 0);
  EXPECT_EQ(off->key_hits(), 1);
}

TEST_F(SessionAnswersTest, AnswersOutliveTheirKilnd) {
  const double c = 0.5;
  const v1::Graph graph = testing::SinCosGraph(kN, c);
  std::string address;
  {
    testing::KilndProcess own;
    ASSERT_EQ(
        own.Start(suite_->dir() + "/own-server", {"--signing-key=" + suite_->dir() + "/sign.pem"},
                  /*quiet=*/true),
        "");
    address = own.address();
    std::unique_ptr<Session> first =
        NewSession("outlive", absl::Seconds(60), "sign.pem.pub", address);
    ASSERT_NE(first, nullptr);
    ASSERT_TRUE(first->CompileAndLoad(graph, testing::CpuTarget()).ok());
    EXPECT_EQ(own.Stop(), 0);
  }
  std::unique_ptr<Session> later =
      NewSession("outlive", absl::Seconds(60), "sign.pem.pub", address);
  ASSERT_NE(later, nullptr);
  absl::StatusOr<LoadedKernel> kernel = later->CompileAndLoad(graph, testing::CpuTarget());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ(later->machine_hits(), 1);
  ExpectRunsRight(*kernel, c);
  // Anything new needs kilnd.
  absl::StatusOr<LoadedKernel> other =
      later->CompileAndLoad(testing::SinCosGraph(kN, 0.75), testing::CpuTarget());
  EXPECT_TRUE(absl::IsUnavailable(other.status())) << other.status();
}

TEST_F(SessionAnswersTest, AnswersPastTheirTtlOrDamagedAreAskedOfKilndAgain) {
  const double c = 1.5;
  const v1::Graph graph = testing::SinCosGraph(kN, c);
  std::unique_ptr<Session> first = NewSession("aged");
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->CompileAndLoad(graph, testing::CpuTarget()).ok());
  const std::string path = AnswerPath(*first, graph);
  ASSERT_TRUE(fs::exists(path));

  ASSERT_TRUE(Age(path, 120));
  const int64_t stale = ModifiedAt(path);
  std::unique_ptr<Session> late = NewSession("aged", absl::Seconds(60));
  ASSERT_NE(late, nullptr);
  absl::StatusOr<LoadedKernel> kernel = late->CompileAndLoad(graph, testing::CpuTarget());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ(late->machine_hits(), 0) << "a stale answer was used";
  EXPECT_EQ(late->key_hits(), 1);
  EXPECT_GT(ModifiedAt(path), stale + 60) << "kilnd's fresh answer was not written back";
  std::unique_ptr<Session> fresh = NewSession("aged", absl::Seconds(60));
  ASSERT_NE(fresh, nullptr);
  ASSERT_TRUE(fresh->CompileAndLoad(graph, testing::CpuTarget()).ok());
  EXPECT_EQ(fresh->machine_hits(), 1);

  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('#');
  }
  std::unique_ptr<Session> damaged = NewSession("aged");
  ASSERT_NE(damaged, nullptr);
  kernel = damaged->CompileAndLoad(graph, testing::CpuTarget());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ(damaged->machine_hits(), 0) << "a damaged answer was used";
  EXPECT_EQ(damaged->key_hits(), 1);
  ExpectRunsRight(*kernel, c);
  std::unique_ptr<Session> repaired = NewSession("aged");
  ASSERT_NE(repaired, nullptr);
  ASSERT_TRUE(repaired->CompileAndLoad(graph, testing::CpuTarget()).ok());
  EXPECT_EQ(repaired->machine_hits(), 1) << "not written again";
}

TEST_F(SessionAnswersTest, AForgedAnswerInAFileOthersMayWriteIsRefused) {
  const double c = -2.5;
  const v1::Graph graph = testing::SinCosGraph(kN, c);
  std::unique_ptr<Session> first = NewSession("forged");
  ASSERT_NE(first, nullptr);
  absl::StatusOr<LoadedKernel> compiled = first->CompileAndLoad(graph, testing::CpuTarget());
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const std::string path = AnswerPath(*first, graph);
  const std::string name = fs::path(path).filename();

  // Another graph's library under this answer's signature: what a forger would want run.
  absl::StatusOr<LoadedKernel> decoy =
      first->CompileAndLoad(testing::SinCosGraph(kN, 9.0), testing::CpuTarget());
  ASSERT_TRUE(decoy.ok()) << decoy.status();
  v1::CompileResponse forged = compiled->response();
  *forged.mutable_result()->mutable_artifacts(0) = decoy->response().result().artifacts(0);
  ASSERT_TRUE(first->cache().SaveAnswer(name, forged.SerializeAsString()).ok());
  ASSERT_EQ(chmod(path.c_str(), 0666), 0);  // a file another user could have written

  std::unique_ptr<Session> wary = NewSession("forged");
  ASSERT_NE(wary, nullptr);
  absl::StatusOr<LoadedKernel> kernel = wary->CompileAndLoad(graph, testing::CpuTarget());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ(wary->machine_hits(), 0) << "the forged answer was used";
  EXPECT_EQ(wary->key_hits(), 1);
  EXPECT_EQ(kernel->response().result().artifacts(0).digest(),
            compiled->response().result().artifacts(0).digest());
  ExpectRunsRight(*kernel, c);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u) << "kilnd's answer was not written back";

  // The signing key is no longer trusted: the answer is not used, kilnd's is refused, and the
  // answer is forgotten.
  std::unique_ptr<Session> revoked = NewSession("forged", absl::Seconds(60), "other.pem.pub");
  ASSERT_NE(revoked, nullptr);
  absl::StatusOr<LoadedKernel> refused = revoked->CompileAndLoad(graph, testing::CpuTarget());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("not trusted"), std::string::npos);
  EXPECT_EQ(revoked->machine_hits(), 0);
  EXPECT_FALSE(fs::exists(path)) << "the revoked answer was kept";
}

}  // namespace
}  // namespace kiln::client
