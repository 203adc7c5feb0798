// The answers folder (client/core/answers.h, FORMAT.md) through the C++ client's ArtifactCache:
// names and the file format both clients share, atomic writes, the TTL by modification time,
// damaged files removed, the privacy flag, malformed names refused; and KILN_ANSWER_TTL read as
// the Python client reads it.
#include "client/core/answers.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "client/cpp/artifact_cache.h"
#include "client/cpp/kiln.h"
#include "gtest/gtest.h"
#include "kernels/key/digest.h"
#include "tests/unit/client/test_support.h"

namespace kiln::client {
namespace {

namespace fs = std::filesystem;

class AnswersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir();
    ASSERT_FALSE(root_.empty());
    auto cache = ArtifactCache::Open(root_);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Path() const { return root_ + "/answers/" + name_.substr(0, 2) + "/" + name_; }
  // The response saved under name_ within `max_age`, or nullopt.
  std::optional<core::AnswerFolder::Answer> Load(absl::Duration max_age = absl::Seconds(60)) {
    auto answer = cache_->LoadAnswer(name_, max_age);
    EXPECT_TRUE(answer.ok()) << answer.status();
    return answer.ok() ? *std::move(answer) : std::nullopt;
  }

  std::string root_;
  std::unique_ptr<ArtifactCache> cache_;
  const std::string key_ = key::Sha256Hex("a request");
  const std::string name_ = core::AnswerName("localhost:50051", key_);
  const std::string response_ = std::string("a serialized response\0with a NUL", 33);
};

TEST_F(AnswersTest, NamesAndBytesAreTheSharedFormat) {
  EXPECT_EQ(name_, key::Sha256Hex(std::string("localhost:50051") + '\0' + key_));
  EXPECT_NE(name_, core::AnswerName("localhost:50052", key_)) << "answers are per daemon";
  ASSERT_TRUE(cache_->SaveAnswer(name_, response_).ok());
  EXPECT_EQ(ReadAll(Path()), "kiln-answer-v1\n" + key::Sha256Raw(response_) + response_);
  struct stat st;
  ASSERT_EQ(stat(Path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  for (const auto& entry : fs::directory_iterator(fs::path(Path()).parent_path())) {
    EXPECT_EQ(entry.path().filename(), name_) << "left behind: " << entry.path();
  }
  std::optional<core::AnswerFolder::Answer> answer = Load();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->response, response_);
  EXPECT_TRUE(answer->is_private);
  // Saved again: replaced whole.
  ASSERT_TRUE(cache_->SaveAnswer(name_, "shorter").ok());
  answer = Load();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->response, "shorter");
  // Forgotten, twice.
  EXPECT_TRUE(cache_->DropAnswer(name_).ok());
  EXPECT_TRUE(cache_->DropAnswer(name_).ok());
  EXPECT_FALSE(fs::exists(Path()));
  EXPECT_FALSE(Load().has_value());
}

TEST_F(AnswersTest, AnAnswerIsUsedWithinItsAgeOnly) {
  ASSERT_TRUE(cache_->SaveAnswer(name_, response_).ok());
  ASSERT_TRUE(Age(Path(), 120));
  EXPECT_FALSE(Load(absl::Seconds(60)).has_value());
  EXPECT_TRUE(fs::exists(Path())) << "an old answer is not damaged";
  EXPECT_TRUE(Load(absl::Seconds(300)).has_value());
  EXPECT_TRUE(Load(absl::InfiniteDuration()).has_value());
  EXPECT_FALSE(Load(absl::ZeroDuration()).has_value());
  // Saving it again starts its age again.
  ASSERT_TRUE(cache_->SaveAnswer(name_, response_).ok());
  EXPECT_TRUE(Load(absl::Seconds(60)).has_value());
}

TEST_F(AnswersTest, DamagedAnswersAreRemovedAndMissed) {
  const std::string whole = "kiln-answer-v1\n" + key::Sha256Raw(response_) + response_;
  std::string flipped = whole;
  flipped[flipped.size() - 3] ^= 0x40;
  std::string magic = whole;
  magic[5] = 'X';
  for (const std::string& damage : {flipped, magic, whole.substr(0, 20), std::string(),
                                    whole.substr(0, whole.size() - 1), whole + "x"}) {
    ASSERT_TRUE(cache_->SaveAnswer(name_, response_).ok());
    Overwrite(Path(), damage);
    EXPECT_FALSE(Load().has_value()) << damage.size();
    EXPECT_FALSE(fs::exists(Path())) << "a damaged answer was kept: " << damage.size();
  }
  // An empty response is an answer like any other.
  ASSERT_TRUE(cache_->SaveAnswer(name_, "").ok());
  std::optional<core::AnswerFolder::Answer> empty = Load();
  ASSERT_TRUE(empty.has_value());
  EXPECT_EQ(empty->response, "");
}

TEST_F(AnswersTest, OnlyAFileNoOneElseCanWriteIsPrivate) {
  ASSERT_TRUE(cache_->SaveAnswer(name_, response_).ok());
  for (mode_t mode : {0644, 0600, 0444}) {
    ASSERT_EQ(chmod(Path().c_str(), mode), 0);
    std::optional<core::AnswerFolder::Answer> answer = Load();
    ASSERT_TRUE(answer.has_value());
    EXPECT_TRUE(answer->is_private) << std::oct << mode;
  }
  for (mode_t mode : {0664, 0646, 0666}) {
    ASSERT_EQ(chmod(Path().c_str(), mode), 0);
    std::optional<core::AnswerFolder::Answer> answer = Load();
    ASSERT_TRUE(answer.has_value()) << "still used, after verification by the client";
    EXPECT_FALSE(answer->is_private) << std::oct << mode;
  }
}

TEST_F(AnswersTest, MalformedNamesNeverBecomePaths) {
  for (std::string bad :
       {std::string("../../etc/passwd"), name_.substr(1), std::string(""), std::string(64, 'A')}) {
    EXPECT_EQ(cache_->LoadAnswer(bad, absl::Seconds(60)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_EQ(cache_->SaveAnswer(bad, response_).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(cache_->DropAnswer(bad).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(fs::exists(root_ + "/answers"));
}

// KILN_ANSWER_TTL as the Python client reads it: seconds, blank for the default, negative or
// NaN for off, anything else refused naming the variable.
TEST(AnswerTtlFromEnvTest, ReadsSecondsAndRefusesTheRest) {
  const char* saved = std::getenv("KILN_ANSWER_TTL");
  const std::string keep = saved != nullptr ? saved : "";
  unsetenv("KILN_ANSWER_TTL");
  EXPECT_EQ(*AnswerTtlFromEnv(), kDefaultAnswerTtl);
  const std::pair<const char*, absl::Duration> cases[] = {
      {"", kDefaultAnswerTtl},       {"  ", kDefaultAnswerTtl},
      {"60", absl::Seconds(60)},     {" 2.5 ", absl::Milliseconds(2500)},
      {"0", absl::ZeroDuration()},   {"-5", absl::ZeroDuration()},
      {"nan", absl::ZeroDuration()}, {"inf", absl::InfiniteDuration()},
  };
  for (const auto& [value, want] : cases) {
    setenv("KILN_ANSWER_TTL", value, 1);
    absl::StatusOr<absl::Duration> ttl = AnswerTtlFromEnv();
    ASSERT_TRUE(ttl.ok()) << value << ": " << ttl.status();
    EXPECT_EQ(*ttl, want) << value;
  }
  setenv("KILN_ANSWER_TTL", "1_000", 1);  // refused by the Python client alike
  EXPECT_EQ(AnswerTtlFromEnv().status().code(), absl::StatusCode::kInvalidArgument);
  setenv("KILN_ANSWER_TTL", "five minutes", 1);
  absl::StatusOr<absl::Duration> bad = AnswerTtlFromEnv();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "KILN_ANSWER_TTL='five minutes': expected seconds (0 turns the answer tier off)");
  // Session::Create refuses it too, unless the options name a TTL.
  EXPECT_EQ(Session::Create().status().code(), absl::StatusCode::kInvalidArgument);
  SessionOptions options;
  options.cache_dir = MakeTempDir();
  options.answer_ttl = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Create(options);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->answer_ttl(), absl::Seconds(5));
  fs::remove_all(options.cache_dir);
  if (saved != nullptr) {
    setenv("KILN_ANSWER_TTL", keep.c_str(), 1);
  } else {
    unsetenv("KILN_ANSWER_TTL");
  }
}

}  // namespace
}  // namespace kiln::client
