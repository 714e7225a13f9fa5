// Standard Webhooks signing and verification helpers.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "outbox_relay/webhook_sink.h"
#include "spec_signature.h"

namespace outbox::relay {
namespace {

using webhook_test::SpecSignature;

// The test vector published with the Standard Webhooks reference libraries.
const std::string kVectorSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const std::string kVectorId = "msg_p5jXN8AQM9LWM0D4loKWxJek";
constexpr long long kVectorTimestamp = 1614265330;
const std::string kVectorBody = R"({"test": 2432232314})";
const std::string kVectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

const std::string kOtherSecret = "whsec_b3V0Ym94LXJlbGF5IHJvdGF0aW9uIHRlc3Qga2V5LCAzMmIhIQ==";

TEST(StandardWebhooksSignature, MatchesPublishedTestVector) {
  EXPECT_EQ(SignStandardWebhook(kVectorSecret, kVectorId, kVectorTimestamp, kVectorBody),
            kVectorSignature);
  EXPECT_EQ(SpecSignature(kVectorSecret, kVectorId, std::to_string(kVectorTimestamp), kVectorBody),
            kVectorSignature);
  EXPECT_TRUE(VerifyStandardWebhook(kVectorSecret, kVectorId, kVectorTimestamp, kVectorBody,
                                    kVectorSignature));
}

TEST(StandardWebhooksSignature, VerifyRejectsTampering) {
  EXPECT_FALSE(VerifyStandardWebhook(kVectorSecret, kVectorId, kVectorTimestamp,
                                     R"({"test": 2432232315})", kVectorSignature));
  EXPECT_FALSE(VerifyStandardWebhook(kOtherSecret, kVectorId, kVectorTimestamp, kVectorBody,
                                     kVectorSignature));
  EXPECT_FALSE(VerifyStandardWebhook(kVectorSecret, "msg_other", kVectorTimestamp, kVectorBody,
                                     kVectorSignature));
  EXPECT_FALSE(VerifyStandardWebhook(kVectorSecret, kVectorId, kVectorTimestamp + 1, kVectorBody,
                                     kVectorSignature));
  // Same bytes under another version, a truncated signature, garbage, nothing.
  EXPECT_FALSE(VerifyStandardWebhook(kVectorSecret, kVectorId, kVectorTimestamp, kVectorBody,
                                     "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="));
  EXPECT_FALSE(VerifyStandardWebhook(kVectorSecret, kVectorId, kVectorTimestamp, kVectorBody,
                                     "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE"));
  EXPECT_FALSE(VerifyStandardWebhook(kVectorSecret, kVectorId, kVectorTimestamp, kVectorBody,
                                     "v1,not-a-signature"));
  EXPECT_FALSE(VerifyStandardWebhook(kVectorSecret, kVectorId, kVectorTimestamp, kVectorBody, ""));
}

TEST(StandardWebhooksSignature, RotationHeaderVerifiesWithEitherSecret) {
  const std::string body = R"({"order":42})";
  const std::string header = SignStandardWebhook(kOtherSecret, "msg_1", 1700000000, body) + " " +
                             SignStandardWebhook(kVectorSecret, "msg_1", 1700000000, body);
  EXPECT_TRUE(VerifyStandardWebhook(kVectorSecret, "msg_1", 1700000000, body, header));
  EXPECT_TRUE(VerifyStandardWebhook(kOtherSecret, "msg_1", 1700000000, body, header));
  EXPECT_FALSE(VerifyStandardWebhook("whsec_" + std::string("c29tZSBvdGhlciBrZXk="), "msg_1",
                                     1700000000, body, header));
  // Entries of unknown versions are skipped, not fatal.
  EXPECT_TRUE(VerifyStandardWebhook(kVectorSecret, "msg_1", 1700000000, body,
                                    "v1a,c29tZXRoaW5nIGVsc2U= " + header));
}

TEST(StandardWebhooksSignature, AgreesWithIndependentHmacOnAnyBytes) {
  const std::string binary("\x00\x01\xff\xfe payload \x80", 13);
  for (const std::string& body :
       {std::string(), std::string("plain text"), binary, std::string(100000, 'x')}) {
    for (const auto& secret : {kVectorSecret, kOtherSecret}) {
      EXPECT_EQ(
          SignStandardWebhook(secret, "0b6f5ad2-9a56-4ff3-b8a4-4a6b0d5e0c11", 1700000123, body),
          SpecSignature(secret, "0b6f5ad2-9a56-4ff3-b8a4-4a6b0d5e0c11", "1700000123", body));
    }
  }
}

TEST(StandardWebhooksSignature, RejectsMalformedSecrets) {
  EXPECT_THROW(SignStandardWebhook("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "m", 1, "b"),
               std::invalid_argument);
  EXPECT_THROW(SignStandardWebhook("whsec_", "m", 1, "b"), std::invalid_argument);
  EXPECT_THROW(SignStandardWebhook("whsec_not base64!", "m", 1, "b"), std::invalid_argument);
  EXPECT_THROW(VerifyStandardWebhook("whsec_@@@@", "m", 1, "b", kVectorSignature),
               std::invalid_argument);
  // Unpadded base64 is accepted, as the reference libraries do.
  EXPECT_EQ(
      SignStandardWebhook("whsec_b3V0Ym94LXJlbGF5IHJvdGF0aW9uIHRlc3Qga2V5LCAzMmIhIQ", "m", 1, "b"),
      SignStandardWebhook(kOtherSecret, "m", 1, "b"));
}

}  // namespace
}  // namespace outbox::relay
