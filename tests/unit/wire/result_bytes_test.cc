// wire/'s protobuf-free half, which the client core compiles too: the signed bytes decoded from
// a serialized ActionResult (pinned by golden digests, and checked against protobuf's own parser
// on reordered, unpacked, merged, unknown and damaged input), KeyRing's verification, the
// request key, and the same through the core's C ABI.
#include "wire/result_bytes.h"

#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/core/kiln_core.h"
#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"
#include "kernels/key/sha256.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "tests/unit/wire/sample_results.h"
#include "wire/ed25519.h"
#include "wire/serialized_request_key.h"
#include "wire/wire.h"

namespace kiln::wire {
namespace {

using testing::CpuResult;
using testing::GuardedCudaResult;
using testing::kHandle;
using testing::TempDir;

std::string Decoded(std::string_view serialized, std::string_view handle = kHandle) {
  std::string error;
  std::optional<SignedResult> r = DecodeSignedResult(handle, serialized, &error);
  EXPECT_TRUE(r.has_value()) << error;
  return r.has_value() ? r->bytes : "";
}

// ---------------------------------------------------------------------------- the format

// Digests of the signed bytes, computed once from the encoding before it moved here (from the
// parsed message): a change to these is a change to what every signature in the field covers.
TEST(ResultBytes, GoldenDigestsPinTheFormat) {
  const std::string cpu = Decoded(CpuResult().SerializeAsString());
  EXPECT_EQ(cpu.rfind("kiln-result-signature-v1\n", 0), 0u);
  EXPECT_EQ(key::Sha256Hex(cpu),
            "c2991c984319a35599bd7d10425b95762221c2e52c2fb78feaaf396eec288f9b");
  const std::string cuda = Decoded(GuardedCudaResult().SerializeAsString());
  EXPECT_EQ(key::Sha256Hex(cuda),
            "96a7ddaab26ca0d516f8c2aa80a2845ec37153f9cd7e9fb02918ff2d33f024c4");
  EXPECT_EQ(key::Sha256Hex(Decoded("")),
            "af60610de3b0fe324934e194e6efede15cdc3c0183af7a2b1fe3e1803624f8dc");
  // The protobuf-typed entry point is the same encoding.
  EXPECT_EQ(CanonicalResultBytes(kHandle, CpuResult()), cpu);
  EXPECT_EQ(CanonicalResultBytes(kHandle, GuardedCudaResult()), cuda);
}

TEST(ResultBytes, UnsignedFieldsAreLeftOutAndSignedOnesCount) {
  v1::ActionResult base = CpuResult();
  const std::string bytes = Decoded(base.SerializeAsString());
  v1::ActionResult log = base;
  log.set_compile_log("other");
  log.clear_stats();
  EXPECT_EQ(Decoded(log.SerializeAsString()), bytes);
  v1::ActionResult guard = GuardedCudaResult();
  const std::string guarded = Decoded(guard.SerializeAsString());
  guard.mutable_plan()->mutable_steps(1)->set_guard_max(7);
  EXPECT_NE(Decoded(guard.SerializeAsString()), guarded);
  EXPECT_NE(Decoded(base.SerializeAsString(), std::string(64, 'f')), bytes);
}

// A writer of protobuf's wire format, to spell one message in the ways protobuf allows.
class Wire {
 public:
  Wire& Varint(uint64_t v) {
    for (; v >= 0x80; v >>= 7) out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
    out_.push_back(static_cast<char>(v));
    return *this;
  }
  Wire& Tag(uint32_t field, int type) { return Varint((uint64_t{field} << 3) | type); }
  Wire& Int(uint32_t field, uint64_t v) { return Tag(field, 0).Varint(v); }
  Wire& Len(uint32_t field, std::string_view bytes) {
    Tag(field, 2).Varint(bytes.size());
    out_.append(bytes);
    return *this;
  }
  Wire& Raw(std::string_view bytes) {
    out_.append(bytes);
    return *this;
  }
  std::string str() const { return out_; }

 private:
  std::string out_;
};

// CpuResult spelled otherwise: fields out of order, repeated integers unpacked, the plan and
// the target given in two parts (merged), a oneof's members replacing each other, unknown fields of
// every wire type (a group among them) and a known field number with a wrong wire type.
std::string ScrambledCpuResult() {
  const std::string unknown = Wire()
                                  .Int(99, 7)
                                  .Tag(98, 1)
                                  .Raw(std::string(8, 'x'))
                                  .Tag(97, 5)
                                  .Raw("abcd")
                                  .Len(96, "junk")
                                  .Tag(95, 3)
                                  .Int(1, 5)
                                  .Tag(94, 3)
                                  .Tag(94, 4)
                                  .Tag(95, 4)
                                  .str();
  const std::string step = Wire()
                               .Int(5, 0)
                               .Raw(unknown)
                               .Int(4, 512)
                               .Int(3, 128)
                               .Int(2, 4000000000u)
                               .Len(1, "k0")
                               .Int(5, 1)
                               .str();
  const std::string input = Wire()
                                .Int(5, 128)
                                .Int(4, 4)
                                .Int(3, 3)
                                .Int(4, 8)
                                .Int(1, 1)
                                .Len(1, "a string where a varint belongs")
                                .str();
  const std::string temp = Wire().Int(6, 64).Int(5, 64).Int(2, uint64_t(-1)).Int(1, 3).str();
  const std::string plan1 = Wire().Int(4, 1).Len(1, input).str();
  const std::string plan2 = Wire().Len(2, step).Len(1, temp).Raw(unknown).Int(3, 128).str();
  const std::string artifact1 = Wire().Int(3, 12345).Len(2, std::string(64, 'a')).Int(1, 1).str();
  const std::string artifact2 = Wire().Len(2, std::string(64, 'b')).Int(3, 678).Int(1, 4).str();
  const std::string cpu0 = Wire().Len(1, Wire().Len(1, "x86-64-v2").Len(2, "sse4.2").str()).str();
  const std::string cuda = Wire().Len(2, Wire().Int(1, 80).str()).str();
  const std::string cpu1 = Wire().Len(1, Wire().Len(1, "x86-64-v3").Len(2, "avx2").str()).str();
  const std::string cpu2 = Wire().Len(1, Wire().Len(2, "fma").str()).str();
  return Wire()
      .Len(7, Wire().Len(2, "abc").Len(1, "graph").str())
      .Len(6, cpu0)  // replaced by the cuda member, and that by the cpu member below
      .Len(6, cuda)
      .Len(2, plan1)
      .Raw(unknown)
      .Len(6, cpu1)
      .Len(5, "graph=...\ntarget=cpu:x86-64-v3\n")
      .Len(1, artifact1)
      .Len(3, "g++ said nothing")
      .Len(2, plan2)
      .Len(6, cpu2)
      .Len(1, artifact2)
      .str();
}

TEST(ResultBytes, AnySpellingOfOneMessageGivesTheSameBytes) {
  const std::string scrambled = ScrambledCpuResult();
  v1::ActionResult parsed;
  ASSERT_TRUE(parsed.ParseFromString(scrambled));  // protobuf reads it as CpuResult too
  EXPECT_EQ(Decoded(scrambled), Decoded(CpuResult().SerializeAsString()));
  EXPECT_EQ(CanonicalResultBytes(kHandle, parsed), Decoded(scrambled));
}

TEST(ResultBytes, MalformedInputIsRefusedSaying) {
  const std::string good = CpuResult().SerializeAsString();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {Wire().Tag(1, 2).Varint(100).Raw("short").str(), "a length past the end"},
      {Wire().Tag(2, 0).Raw("\x80").str(), "a truncated varint"},
      {Wire().Tag(3, 0).Raw(std::string(10, '\xff')).Raw("\x01").str(), "longer than 10 bytes"},
      {Wire().Tag(0, 0).Varint(1).str(), "an invalid field number"},
      {Wire().Tag(9, 6).str(), "an invalid wire type"},
      {Wire().Tag(9, 4).str(), "an end-group tag outside any group"},
      {Wire().Tag(9, 3).Int(1, 1).str(), "a group with no end"},
      {Wire().Tag(9, 3).Tag(8, 4).str(), "closed by another field"},
      {Wire().Tag(9, 1).Raw("1234").str(), "a truncated fixed-size value"},
      // Damage inside a nested message is found too.
      {Wire().Len(2, Wire().Len(2, Wire().Tag(2, 2).Varint(9).str()).str()).str(),
       "a length past the end"},
      {good.substr(0, good.size() - 1), "not a serialized kiln.v1.ActionResult"},
  };
  for (const auto& [bytes, says] : cases) {
    std::string error;
    EXPECT_FALSE(DecodeSignedResult(kHandle, bytes, &error).has_value()) << says;
    EXPECT_NE(error.find("not a serialized kiln.v1.ActionResult: "), std::string::npos) << error;
    EXPECT_NE(error.find(says), std::string::npos) << error;
  }
}

// protobuf logs each string it parses that is not UTF-8: quiet where damage is the point.
class QuietProtobuf {
 public:
  QuietProtobuf() : previous_(google::protobuf::SetLogHandler(nullptr)) {}
  ~QuietProtobuf() { google::protobuf::SetLogHandler(previous_); }

 private:
  google::protobuf::LogHandler* previous_;
};

// protobuf's parser as the oracle: a damaged or cut record that it reads must give the bytes
// of what it read, and one it refuses must not decode here either (but for strings that are
// not UTF-8, which protobuf refuses and this reader, by design, does not look at).
TEST(ResultBytes, AgreesWithProtobufOnEveryPrefixAndRandomDamage) {
  v1::ActionResult full = GuardedCudaResult();
  *full.mutable_key_fields() = CpuResult().key_fields();
  const std::string record = full.SerializeAsString();
  std::vector<std::string> inputs;
  for (size_t n = 0; n < record.size(); ++n) inputs.push_back(record.substr(0, n));
  std::mt19937_64 rng(37);
  for (int i = 0; i < 3000; ++i) {
    std::string b = record;
    for (int k = 0; k < 1 + i % 3; ++k) b[rng() % b.size()] = static_cast<char>(rng());
    inputs.push_back(b);
  }
  QuietProtobuf quiet;
  int agreed_parsed = 0, agreed_refused = 0;
  for (const std::string& bytes : inputs) {
    std::string error;
    std::optional<SignedResult> mine = DecodeSignedResult(kHandle, bytes, &error);
    v1::ActionResult parsed;
    if (parsed.ParseFromString(bytes)) {
      ASSERT_TRUE(mine.has_value()) << error;
      ASSERT_EQ(mine->bytes, CanonicalResultBytes(kHandle, parsed));
      ++agreed_parsed;
    } else if (!mine.has_value()) {
      ++agreed_refused;
    }
  }
  EXPECT_GT(agreed_parsed, 100);
  EXPECT_GT(agreed_refused, 100);
}

// ---------------------------------------------------------------------------- verification

using PkeyPtr = std::unique_ptr<EVP_PKEY, internal::OpenSslFree<EVP_PKEY_free>>;

PkeyPtr NewKey(int type) {
  std::unique_ptr<EVP_PKEY_CTX, internal::OpenSslFree<EVP_PKEY_CTX_free>> ctx(
      EVP_PKEY_CTX_new_id(type, nullptr));
  EVP_PKEY* key = nullptr;
  if (ctx == nullptr || EVP_PKEY_keygen_init(ctx.get()) != 1 ||
      EVP_PKEY_keygen(ctx.get(), &key) != 1) {
    return nullptr;
  }
  return PkeyPtr(key);
}

void WritePublicPem(EVP_PKEY* key, const std::string& path) {
  std::unique_ptr<BIO, internal::OpenSslFree<BIO_free>> bio(BIO_new_file(path.c_str(), "w"));
  ASSERT_NE(bio, nullptr);
  ASSERT_EQ(PEM_write_bio_PUBKEY(bio.get(), key), 1);
}

// `result` signed by `key` over its signed bytes for kHandle, as kilnd signs, serialized.
std::string SignedBy(EVP_PKEY* key, v1::ActionResult result) {
  std::string raw;
  EXPECT_TRUE(internal::RawEd25519PublicKey(key, &raw));
  const std::string message = CanonicalResultBytes(kHandle, result);
  std::string signature(kEd25519SignatureBytes, '\0');
  size_t len = signature.size();
  std::unique_ptr<EVP_MD_CTX, internal::OpenSslFree<EVP_MD_CTX_free>> ctx(EVP_MD_CTX_new());
  EXPECT_EQ(EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key), 1);
  EXPECT_EQ(EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &len,
                           reinterpret_cast<const unsigned char*>(message.data()), message.size()),
            1);
  v1::ResultSignature* sig = result.mutable_signature();
  sig->set_algorithm("ed25519");
  sig->set_key_id(KeyIdOf(raw));
  sig->set_signature(signature);
  return result.SerializeAsString();
}

TEST(KeyRing, VerifiesARealSignatureAndRefusesEveryChange) {
  TempDir dir;
  PkeyPtr key = NewKey(EVP_PKEY_ED25519), other = NewKey(EVP_PKEY_ED25519);
  ASSERT_NE(key, nullptr);
  WritePublicPem(key.get(), dir / "k.pub");
  KeyRing ring;
  std::string id;
  ASSERT_TRUE(ring.AddPemFile(dir / "k.pub", &id).ok());
  EXPECT_EQ(id.size(), 16u);
  EXPECT_TRUE(ring.Trusts(id));

  const std::string good = SignedBy(key.get(), GuardedCudaResult());
  EXPECT_TRUE(ring.VerifyResult(kHandle, good).ok()) << ring.VerifyResult(kHandle, good).message;
  EXPECT_EQ(ring.VerifyResult(std::string(64, 'e'), good).outcome, TrustOutcome::kMismatch);

  v1::ActionResult parsed;
  ASSERT_TRUE(parsed.ParseFromString(good));
  auto outcome = [&](const v1::ActionResult& r) {
    return ring.VerifyResult(kHandle, r.SerializeAsString()).outcome;
  };
  v1::ActionResult flipped = parsed;
  flipped.mutable_signature()->mutable_signature()->at(5) ^= 0x01;
  EXPECT_EQ(outcome(flipped), TrustOutcome::kMismatch);
  v1::ActionResult guard = parsed;
  guard.mutable_plan()->mutable_steps(0)->mutable_guard()->mutable_terms(0)->set_coeff(3);
  EXPECT_EQ(outcome(guard), TrustOutcome::kMismatch);
  v1::ActionResult log = parsed;
  log.set_compile_log("unsigned: may change");
  EXPECT_EQ(outcome(log), TrustOutcome::kOk);
  v1::ActionResult bare = parsed;
  bare.clear_signature();
  EXPECT_EQ(outcome(bare), TrustOutcome::kUnsigned);
  v1::ActionResult rsa = parsed;
  rsa.mutable_signature()->set_algorithm("rsa");
  EXPECT_EQ(outcome(rsa), TrustOutcome::kOtherAlgorithm);
  const std::string stranger = SignedBy(other.get(), GuardedCudaResult());
  const TrustStatus untrusted = ring.VerifyResult(kHandle, stranger);
  EXPECT_EQ(untrusted.outcome, TrustOutcome::kUntrustedKey);
  EXPECT_NE(untrusted.message.find("which is not trusted here"), std::string::npos);
  EXPECT_EQ(ring.VerifyResult(kHandle, good.substr(0, good.size() - 3)).outcome,
            TrustOutcome::kMalformed);

  // Every byte of the record flipped in turn is refused, but where the bytes still spell the
  // same message (a bit past 64 in a ten-byte varint, which protobuf drops too).
  QuietProtobuf quiet;
  int refused = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x20;
    v1::ActionResult reparsed;
    if (reparsed.ParseFromString(bad) &&
        reparsed.SerializeAsString() == parsed.SerializeAsString()) {
      continue;
    }
    EXPECT_NE(ring.VerifyResult(kHandle, bad).outcome, TrustOutcome::kOk) << "byte " << i;
    ++refused;
  }
  EXPECT_GT(refused, static_cast<int>(good.size()) - 8);
}

TEST(KeyRing, KeyFilesThatAreNoEd25519PublicKeyAreRefusedNamingTheFile) {
  TempDir dir;
  PkeyPtr x25519 = NewKey(EVP_PKEY_X25519);
  ASSERT_NE(x25519, nullptr);
  WritePublicPem(x25519.get(), dir / "x.pub");
  std::ofstream(dir / "text") << "not a key\n";
  KeyRing ring;
  const TrustStatus missing = ring.AddPemFile(dir / "missing");
  EXPECT_EQ(missing.outcome, TrustOutcome::kKeyUnreadable);
  EXPECT_NE(missing.message.find(dir / "missing"), std::string::npos);
  EXPECT_EQ(ring.AddPemFile(dir / "text").outcome, TrustOutcome::kKeyNotPem);
  EXPECT_EQ(ring.AddPemFile(dir / "x.pub").outcome, TrustOutcome::kKeyNotEd25519);
  EXPECT_EQ(ring.AddRawPublicKey("short").outcome, TrustOutcome::kKeyNotEd25519);
  EXPECT_TRUE(ring.empty());
}

// ---------------------------------------------------------------------------- request keys

TEST(RequestKey, HashesTheThreeSerializationsLengthPrefixed) {
  v1::Graph graph;
  graph.add_inputs()->set_name("x");
  graph.add_outputs(0);
  v1::Target target;
  target.mutable_cuda()->set_sm(90);
  v1::CompileOptions options;
  options.set_variant(2);
  const std::string key = RequestKey(graph, target, options);
  EXPECT_EQ(key, RequestKeyOfSerialized(graph.SerializeAsString(), target.SerializeAsString(),
                                        options.SerializeAsString()));
  EXPECT_EQ(key, "a440363853a13148a530ef8d662d35dfcd83310be313cbf7a817c98d84e522fd");
  EXPECT_EQ(RequestKeyOfSerialized("", "", ""),
            key::Sha256Hex(std::string("kiln-request-key-v1\n") + std::string(24, '\0')));
  EXPECT_NE(RequestKeyOfSerialized("a", "", ""), RequestKeyOfSerialized("", "a", ""));
}

// ---------------------------------------------------------------------------- the C ABI

TEST(CoreAbi, SignedBytesTrustAndRequestKeysAreWiresOwn) {
  EXPECT_EQ(kiln_core_abi_version(), 5u);
  const std::string record = GuardedCudaResult().SerializeAsString();
  void* bytes = nullptr;
  size_t n = 0;
  ASSERT_EQ(kiln_result_signed_bytes(kHandle, record.data(), record.size(), &bytes, &n), 0);
  EXPECT_EQ(std::string(static_cast<char*>(bytes), n), Decoded(record));
  kiln_core_free(bytes);
  EXPECT_EQ(kiln_result_signed_bytes(kHandle, "\x0a\x09", 2, &bytes, &n), -1);
  EXPECT_EQ(kiln_core_last_error_code(), KILN_CORE_INVALID_ARGUMENT);

  char hex[65];
  kiln_request_key("g", 1, "t", 1, "o", 1, hex);
  EXPECT_EQ(std::string(hex), RequestKeyOfSerialized("g", "t", "o"));

  TempDir dir;
  PkeyPtr key = NewKey(EVP_PKEY_ED25519);
  WritePublicPem(key.get(), dir / "k.pub");
  std::unique_ptr<kiln_trust, decltype(&kiln_trust_free)> trust(kiln_trust_new(), kiln_trust_free);
  char id[17];
  EXPECT_EQ(kiln_trust_add_key_file(trust.get(), (dir / "nope").c_str(), id),
            KILN_TRUST_KEY_UNREADABLE);
  EXPECT_EQ(kiln_core_last_error_code(), KILN_CORE_NOT_FOUND);
  ASSERT_EQ(kiln_trust_add_key_file(trust.get(), (dir / "k.pub").c_str(), id), 0);
  std::string signed_record = SignedBy(key.get(), GuardedCudaResult());
  EXPECT_EQ(kiln_trust_verify(trust.get(), kHandle, signed_record.data(), signed_record.size()),
            KILN_TRUST_OK);
  signed_record[signed_record.size() - 1] ^= 0x01;  // the signature's last byte
  EXPECT_EQ(kiln_trust_verify(trust.get(), kHandle, signed_record.data(), signed_record.size()),
            KILN_TRUST_MISMATCH);
  EXPECT_EQ(kiln_core_last_error_code(), KILN_CORE_DATA_LOSS);
  EXPECT_NE(std::string(kiln_core_last_error()).find("does not match its contents"),
            std::string::npos);
  EXPECT_EQ(kiln_trust_verify(trust.get(), kHandle, record.data(), record.size()),
            KILN_TRUST_UNSIGNED);
  EXPECT_EQ(kiln_trust_verify(nullptr, kHandle, record.data(), record.size()), -1);
}

}  // namespace
}  // namespace kiln::wire
