// Internal: the topic of each message, from a destination's topic or topic template
// (`orders.{event_type}`, Debezium's route-by-field habit), limited to an allow-list or a
// prefix, so a message can never be produced to a topic nobody meant.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "outbox_relay/kafka_target.h"
#include "outbox_relay/message.h"

namespace outbox::relay::kafka_detail {

class TopicRoute {
 public:
  /// Parses `target.topic`: literal text and the placeholders {event_type}, {destination},
  /// {key} (the ordering key) and {header.NAME}. Throws std::invalid_argument naming the
  /// property and the fix: an unknown placeholder, an unclosed brace, a template without
  /// allowed_topics or topic_prefix, an allowed topic or prefix that is no valid topic name.
  TopicRoute(const std::string& destination, const KafkaTarget& target);

  bool IsTemplate() const { return !fixed_; }

  struct Routed {
    std::string topic;  ///< Empty when `error` says why the message has no topic.
    std::string error;
  };
  /// The topic for `msg`: the fixed topic, or the template filled in and checked.
  Routed TopicFor(const Message& msg) const;

 private:
  /// Throws when no message could be routed: see topic_route.cc.
  void CheckTemplateCanRoute(const std::string& where) const;
  struct Part {
    enum Kind { kText, kEventType, kDestination, kKey, kHeader } kind = kText;
    std::string text;  ///< kText: the text; kHeader: the header name.
  };
  std::string destination_;
  std::string template_;
  bool fixed_ = true;
  std::vector<Part> parts_;
  std::vector<std::string> allowed_;
  std::string prefix_;
};

/// Why `topic` is not a valid Kafka topic name (1 to 249 of [a-zA-Z0-9._-], not "." or ".."),
/// with the fix; "" when it is. The one rule, for the config and the router alike.
std::string TopicNameProblem(const std::string& topic);

/// TopicNameProblem(topic) is "".
bool IsValidTopicName(const std::string& topic);

}  // namespace outbox::relay::kafka_detail
