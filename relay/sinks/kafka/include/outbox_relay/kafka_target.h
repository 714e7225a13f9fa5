// A destination's `kafka:` section (docs/configuration.md, "Kafka"): what it holds, and the
// TargetKind that reads it.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "outbox_relay/config.h"

namespace outbox::relay {

struct KafkaTarget {
  static constexpr std::string_view kKind = "kafka";

  std::string brokers;  ///< bootstrap.servers, comma separated.
  /// The topic, or a template over message fields: "orders.{event_type}", with {event_type},
  /// {destination}, {key} and {header.NAME} (docs/configuration.md, "Kafka").
  std::string topic;
  /// A template may only produce to these topics...
  std::vector<std::string> allowed_topics;
  /// ...or to topics starting with this prefix.
  std::string topic_prefix;
  /// The record key: the ordering key (empty), or the value of this message header (a message
  /// without it keeps its ordering key as the key).
  std::string key_header;
  /// CloudEvents binary mode: ce_specversion, ce_id, ce_source, ce_type, ce_time, ce_subject
  /// and content-type headers on every record (cloudevents.h), besides the relay's own.
  bool cloudevents = false;
  std::string cloudevents_source;  ///< ce_source; empty: "/outbox-relay/<destination>".
  /// `delivery: exactly_once`: each claimed batch is produced in Kafka transactions, one
  /// transactional producer per bucket, and a message that may have been produced before is
  /// looked for in its topic first (docs/delivery-semantics.md, ADR 0002). Needs claim_mode
  /// partitioned. Default: at least once, with the idempotent producer.
  bool exactly_once = false;
  /// transactional.id = "<prefix>.<destination>.<bucket>" in exactly-once mode.
  std::string transactional_id_prefix = "outbox-relay";
  /// librdkafka properties passed through as they are (compression.type, linger.ms,
  /// security.protocol, sasl.*, ssl.*, ...). Secrets resolved from *_env / *_file keys.
  std::map<std::string, std::string> producer;
  /// message.timeout.ms when `producer` sets none: how long one attempt may take. The config
  /// derives it from lease_ms (2/3 of it, at most 30 s) so an attempt ends inside its lease.
  Millis attempt_timeout{30'000};
};

/// Reads `kafka:` sections: the brokers, the topic or its template, the producer's librdkafka
/// properties (secrets from *_env / *_file keys), and the attempt timeout derived from the lease.
const TargetKind& KafkaTargetKind();

}  // namespace outbox::relay
