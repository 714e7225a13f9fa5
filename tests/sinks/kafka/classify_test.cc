// ClassifyDeliveryError: which librdkafka errors dead-letter and which retry.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "outbox_relay/kafka_sink.h"

namespace outbox::relay {
namespace {

constexpr MessageId kId{42};

TEST(ClassifyDeliveryError, NoErrorIsDelivered) {
  const Outcome out = ClassifyDeliveryError(kId, RD_KAFKA_RESP_ERR_NO_ERROR);
  EXPECT_EQ(out.kind, OutcomeKind::kDelivered);
  EXPECT_EQ(out.id, kId);
  EXPECT_TRUE(out.reason.empty());
}

struct Case {
  rd_kafka_resp_err_t err;
  OutcomeKind kind;
  const char* reason_class;
};

class ClassifyTable : public ::testing::TestWithParam<Case> {};

TEST_P(ClassifyTable, KindClassAndReason) {
  const Case& c = GetParam();
  const Outcome out = ClassifyDeliveryError(kId, c.err);
  EXPECT_EQ(out.id, kId);
  EXPECT_EQ(out.kind, c.kind) << rd_kafka_err2name(c.err);
  EXPECT_EQ(out.reason_class, c.reason_class) << rd_kafka_err2name(c.err);
  EXPECT_EQ(out.reason, rd_kafka_err2str(c.err));
  EXPECT_FALSE(out.retry_after.has_value());
}

INSTANTIATE_TEST_SUITE_P(
    Permanent, ClassifyTable,
    ::testing::Values(
        Case{RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, OutcomeKind::kPermanent, "msg_too_large"},
        Case{RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE, OutcomeKind::kPermanent, "msg_too_large"},
        Case{RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE, OutcomeKind::kPermanent, "msg_too_large"},
        Case{RD_KAFKA_RESP_ERR_INVALID_MSG, OutcomeKind::kPermanent, "invalid_message"},
        Case{RD_KAFKA_RESP_ERR_INVALID_RECORD, OutcomeKind::kPermanent, "invalid_message"},
        Case{RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT, OutcomeKind::kPermanent,
             "invalid_message"},
        Case{RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, OutcomeKind::kPermanent,
             "authorization"},
        Case{RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED, OutcomeKind::kPermanent,
             "authorization"},
        Case{RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION, OutcomeKind::kPermanent, "invalid_topic"},
        Case{RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS, OutcomeKind::kPermanent, "config"}));

INSTANTIATE_TEST_SUITE_P(
    Retriable, ClassifyTable,
    ::testing::Values(
        // A topic that does not exist yet may be created later: back off, don't dead-letter.
        Case{RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC, OutcomeKind::kRetry, "unknown_topic"},
        Case{RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, OutcomeKind::kRetry, "unknown_topic"},
        Case{RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION, OutcomeKind::kRetry, "unknown_topic"},
        Case{RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, OutcomeKind::kRetry, "timeout"},
        Case{RD_KAFKA_RESP_ERR__TIMED_OUT, OutcomeKind::kRetry, "timeout"},
        Case{RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, OutcomeKind::kRetry, "timeout"},
        Case{RD_KAFKA_RESP_ERR__TRANSPORT, OutcomeKind::kRetry, "broker"},
        Case{RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN, OutcomeKind::kRetry, "broker"},
        Case{RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, OutcomeKind::kRetry, "broker"},
        Case{RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE, OutcomeKind::kRetry, "broker"},
        Case{RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, OutcomeKind::kRetry, "broker"},
        Case{RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND, OutcomeKind::kRetry, "broker"},
        Case{RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION, OutcomeKind::kRetry, "broker"},
        Case{RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR, OutcomeKind::kRetry, "broker"},
        Case{RD_KAFKA_RESP_ERR__QUEUE_FULL, OutcomeKind::kRetry, "queue_full"},
        Case{RD_KAFKA_RESP_ERR__PURGE_QUEUE, OutcomeKind::kRetry, "purged"},
        Case{RD_KAFKA_RESP_ERR__PURGE_INFLIGHT, OutcomeKind::kRetry, "purged"},
        Case{RD_KAFKA_RESP_ERR__FATAL, OutcomeKind::kRetry, "fatal"},
        Case{RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, OutcomeKind::kRetry, "other"},
        Case{RD_KAFKA_RESP_ERR_UNKNOWN, OutcomeKind::kRetry, "other"}));

TEST(ClassifyDeliveryError, RetriableFlagOverridesAPermanentCode) {
  const Outcome out = ClassifyDeliveryError(kId, RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, true);
  EXPECT_EQ(out.kind, OutcomeKind::kRetry);
  EXPECT_EQ(out.reason_class, "msg_too_large");
}

TEST(ClassifyDeliveryError, TimedOutReasonSaysSo) {
  const Outcome out = ClassifyDeliveryError(kId, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT);
  EXPECT_NE(out.reason.find("timed out"), std::string::npos) << out.reason;
}

// reason_class feeds a metrics label: it must come from a small fixed set, whatever the code.
TEST(ClassifyDeliveryError, ReasonClassIsBoundedOverAllCodes) {
  const std::set<std::string> allowed = {"msg_too_large", "invalid_message", "authorization",
                                         "invalid_topic", "config",          "unknown_topic",
                                         "timeout",       "broker",          "queue_full",
                                         "purged",        "fatal",           "other"};
  const struct rd_kafka_err_desc* descs = nullptr;
  size_t count = 0;
  rd_kafka_get_err_descs(&descs, &count);
  ASSERT_GT(count, 0u);
  std::size_t checked = 0;
  for (size_t i = 0; i < count; ++i) {
    if (descs[i].name == nullptr || descs[i].code == RD_KAFKA_RESP_ERR_NO_ERROR) continue;
    const Outcome out = ClassifyDeliveryError(kId, descs[i].code);
    EXPECT_NE(out.kind, OutcomeKind::kDelivered) << descs[i].name;
    EXPECT_TRUE(allowed.count(std::string(Label(out.reason_class))))
        << descs[i].name << " -> " << out.reason_class;
    EXPECT_FALSE(out.reason.empty()) << descs[i].name;
    ++checked;
  }
  EXPECT_GT(checked, 100u);
}

}  // namespace
}  // namespace outbox::relay
