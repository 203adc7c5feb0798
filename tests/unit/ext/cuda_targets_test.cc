// The architectures of an extension build: checked with errors naming field and value, merged
// as cpp_extension's set of -gencode flags is, one canonical form for the key.
#include "server/ext/cuda_targets.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::ext {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::BuildExtensionRequest Request(std::vector<int> plain, std::vector<CudaTarget> variants) {
  v1::BuildExtensionRequest r;
  for (int sm : plain) r.add_cuda_archs(sm);
  for (const CudaTarget& t : variants) {
    v1::CudaArch* a = r.add_cuda_arch_list();
    a->set_sm(t.sm);
    a->set_arch_specific(t.arch_specific);
    a->set_ptx(t.ptx);
  }
  return r;
}

std::string Label(const v1::BuildExtensionRequest& r) {
  absl::StatusOr<std::vector<CudaTarget>> t = CudaTargets(r);
  return t.ok() ? TargetsLabel(*t) : std::string(t.status().message());
}

TEST(CudaTargets, MergesAndSortsBothFields) {
  EXPECT_EQ(Label(Request({90, 80, 90}, {})), "80,90");
  // "9.0;9.0+PTX" is "9.0+PTX"; "9.0a" is an architecture of its own.
  EXPECT_EQ(Label(Request({90}, {{90, false, true}, {90, true, false}})), "90+PTX,90a");
  EXPECT_EQ(Label(Request({}, {{100, true, true}, {75, false, false}})), "75,100a+PTX");
  EXPECT_EQ(Label(Request({}, {})), "");
}

TEST(CudaTargets, RefusesWhatKilndDoesNotBuildNamingFieldAndValue) {
  struct Case {
    v1::BuildExtensionRequest request;
    std::string message;
  };
  for (const Case& c : {
           Case{Request({49}, {}), "cuda_archs: sm_49 is not"},
           Case{Request({}, {{300, false, false}}), "cuda_arch_list: sm_300 is not"},
           Case{Request({}, {{0, false, true}}), "cuda_arch_list: sm_0 is not"},
           Case{Request({}, {{80, true, false}}), "cuda_arch_list: sm_80a does not exist"},
           Case{Request(std::vector<int>(10, 80), std::vector<CudaTarget>(7, {90, true, false})),
                "more than 16"},
       }) {
    absl::StatusOr<std::vector<CudaTarget>> t = CudaTargets(c.request);
    ASSERT_FALSE(t.ok()) << c.message;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr(c.message));
  }
}

TEST(CudaTargets, GencodeFlagsAsCppExtensionMakesThem) {
  std::vector<CudaTarget> t = *CudaTargets(Request({80}, {{90, true, true}}));
  EXPECT_THAT(GencodeFlags(t), ElementsAre("-gencode", "arch=compute_80,code=sm_80", "-gencode",
                                           "arch=compute_90a,code=sm_90a", "-gencode",
                                           "arch=compute_90a,code=compute_90a"));
  EXPECT_EQ(GencodeCount(t), 3);
}

TEST(CudaTargets, CanonicalFormKeepsOldClientsKeysAndTellsVariantsApart) {
  // Plain architectures go in cuda_archs, as older clients sent them, whichever field held them.
  v1::BuildExtensionRequest old_client = Request({80, 90}, {});
  v1::BuildExtensionRequest new_client = Request({}, {{90, false, false}, {80, false, false}});
  SetCanonicalTargets(*CudaTargets(new_client), &new_client);
  EXPECT_EQ(new_client.SerializeAsString(), old_client.SerializeAsString());
  // A variant moves all of them to cuda_arch_list, so "9.0a" and "9.0+PTX" differ from "9.0".
  v1::BuildExtensionRequest specific = Request({80}, {{90, true, false}});
  SetCanonicalTargets(*CudaTargets(specific), &specific);
  EXPECT_EQ(specific.cuda_archs_size(), 0);
  ASSERT_EQ(specific.cuda_arch_list_size(), 2);
  EXPECT_EQ(specific.cuda_arch_list(0).sm(), 80);
  EXPECT_TRUE(specific.cuda_arch_list(1).arch_specific());
  v1::BuildExtensionRequest ptx = Request({}, {{90, false, true}});
  v1::BuildExtensionRequest plain = Request({90}, {});
  SetCanonicalTargets(*CudaTargets(ptx), &ptx);
  SetCanonicalTargets(*CudaTargets(plain), &plain);
  EXPECT_NE(ptx.SerializeAsString(), plain.SerializeAsString());
}

}  // namespace
}  // namespace kiln::ext
