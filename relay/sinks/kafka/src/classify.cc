// librdkafka error -> Outcome. Pure, so the whole table is unit-tested.
#include "outbox_relay/kafka_sink.h"

namespace outbox::relay {
namespace {

struct Verdict {
  OutcomeKind kind;
  Reason reason_class;
};

Verdict Judge(rd_kafka_resp_err_t err) {
  switch (err) {
    // The record itself is unacceptable: the same bytes fail the same way next time.
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
      return {OutcomeKind::kPermanent, Reason::kMsgTooLarge};
    case RD_KAFKA_RESP_ERR_INVALID_MSG:  // also CORRUPT_MESSAGE (same code)
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
      return {OutcomeKind::kPermanent, Reason::kInvalidMessage};
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
      return {OutcomeKind::kPermanent, Reason::kAuthorization};
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
      return {OutcomeKind::kPermanent, Reason::kInvalidTopic};
    case RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS:
      return {OutcomeKind::kPermanent, Reason::kConfig};

    // Retriable on purpose: the topic may be created after the relay started.
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
      return {OutcomeKind::kRetry, Reason::kUnknownTopic};

    case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
    case RD_KAFKA_RESP_ERR__TIMED_OUT:
    case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
    case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
      return {OutcomeKind::kRetry, Reason::kTimeout};

    case RD_KAFKA_RESP_ERR__TRANSPORT:
    case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
    case RD_KAFKA_RESP_ERR__RESOLVE:
    case RD_KAFKA_RESP_ERR__NODE_UPDATE:
    case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
    case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_REPLICA_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND:
    case RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
    case RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR:
    case RD_KAFKA_RESP_ERR_NOT_CONTROLLER:
    case RD_KAFKA_RESP_ERR_FENCED_LEADER_EPOCH:
    case RD_KAFKA_RESP_ERR_UNKNOWN_LEADER_EPOCH:
      return {OutcomeKind::kRetry, Reason::kBroker};

    case RD_KAFKA_RESP_ERR__QUEUE_FULL:
      return {OutcomeKind::kRetry, Reason::kQueueFull};
    case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
    case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
      return {OutcomeKind::kRetry, Reason::kPurged};
    case RD_KAFKA_RESP_ERR__FATAL:
      return {OutcomeKind::kRetry, Reason::kFatal};

    default:
      return {OutcomeKind::kRetry, Reason::kOther};
  }
}

}  // namespace

Outcome ClassifyDeliveryError(MessageId id, rd_kafka_resp_err_t err, bool retriable) {
  Outcome out;
  out.id = id;
  if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
    out.kind = OutcomeKind::kDelivered;
    return out;
  }
  const Verdict verdict = Judge(err);
  out.kind = retriable ? OutcomeKind::kRetry : verdict.kind;
  out.reason = rd_kafka_err2str(err);
  out.reason_class = verdict.reason_class;
  return out;
}

}  // namespace outbox::relay
