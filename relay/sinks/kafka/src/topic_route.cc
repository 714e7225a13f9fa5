#include "topic_route.h"

#include <algorithm>
#include <cctype>
#include <regex>
#include <stdexcept>

#include "outbox_relay/config_fields.h"

namespace outbox::relay::kafka_detail {

std::string TopicNameProblem(const std::string& topic) {
  constexpr std::size_t kMaxTopicName = 249;  // Kafka's limit
  if (topic.empty()) return "is empty; name the Kafka topic";
  if (topic == "." || topic == "..")
    return "`.` and `..` are not valid Kafka topic names; choose another name";
  if (topic.size() > kMaxTopicName) {
    return "is " + std::to_string(topic.size()) +
           " characters long; Kafka topic names have at most 249";
  }
  const bool ok = std::all_of(topic.begin(), topic.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (!ok) {
    return cfg::Quote(topic) +
           " is not a valid Kafka topic name; use only letters, digits, `.`, `_` and `-`";
  }
  return "";
}

bool IsValidTopicName(const std::string& topic) { return TopicNameProblem(topic).empty(); }

TopicRoute::TopicRoute(const std::string& destination, const KafkaTarget& target)
    : destination_(destination),
      template_(target.topic),
      allowed_(target.allowed_topics),
      prefix_(target.topic_prefix) {
  const std::string where = "kafka " + destination + ": ";
  for (std::size_t i = 0; i < allowed_.size(); ++i) {
    if (!IsValidTopicName(allowed_[i])) {
      throw std::invalid_argument(where + "allowed_topics[" + std::to_string(i) + "] \"" +
                                  allowed_[i] +
                                  "\" is not a valid Kafka topic name; use letters, digits, `.`, "
                                  "`_` and `-`");
    }
  }
  if (!prefix_.empty() && !IsValidTopicName(prefix_)) {
    throw std::invalid_argument(where + "topic_prefix \"" + prefix_ +
                                "\" is not the start of a valid Kafka topic name");
  }
  std::string text;
  for (std::size_t i = 0; i < template_.size(); ++i) {
    const char c = template_[i];
    if (c == '}') {
      throw std::invalid_argument(
          where + "topic \"" + template_ +
          "\" has a `}` without `{`; placeholders are written {event_type}");
    }
    if (c != '{') {
      text += c;
      continue;
    }
    const auto close = template_.find('}', i);
    if (close == std::string::npos) {
      throw std::invalid_argument(where + "topic \"" + template_ + "\" has an unclosed `{`");
    }
    const std::string name = template_.substr(i + 1, close - i - 1);
    Part p;
    if (name == "event_type") {
      p.kind = Part::kEventType;
    } else if (name == "destination") {
      p.kind = Part::kDestination;
    } else if (name == "key") {
      p.kind = Part::kKey;
    } else if (name.rfind("header.", 0) == 0 && name.size() > 7) {
      p.kind = Part::kHeader;
      p.text = name.substr(7);
    } else {
      throw std::invalid_argument(where + "topic \"" + template_ +
                                  "\" has an unknown placeholder {" + name +
                                  "}; use {event_type}, {destination}, {key} or {header.NAME}");
    }
    if (!text.empty()) parts_.push_back(Part{Part::kText, std::move(text)});
    text.clear();
    parts_.push_back(std::move(p));
    fixed_ = false;
    i = close;
  }
  if (!text.empty()) parts_.push_back(Part{Part::kText, std::move(text)});
  if (!fixed_ && allowed_.empty() && prefix_.empty()) {
    throw std::invalid_argument(
        where + "topic \"" + template_ +
        "\" is a template: add allowed_topics (the topics it may produce to) or topic_prefix "
        "(a prefix every routed topic must start with), so a message cannot choose any topic");
  }
  if (fixed_ && (!allowed_.empty() || !prefix_.empty())) {
    throw std::invalid_argument(where +
                                "allowed_topics and topic_prefix apply to a topic "
                                "template, and topic \"" +
                                template_ +
                                "\" is a fixed name; remove them, or write the topic as a "
                                "template such as \"orders.{event_type}\"");
  }
  if (fixed_ && !IsValidTopicName(template_)) {
    throw std::invalid_argument(where + "topic \"" + template_ +
                                "\" is not a valid Kafka topic name");
  }
  if (!fixed_) CheckTemplateCanRoute(where);
}

// A template whose every topic the route would refuse dead-letters every message: refused at
// start instead. Its literal text and {destination} must be topic characters, its fixed start
// must fit topic_prefix, and some allowed topic must have its shape (placeholders match any
// non-empty run).
void TopicRoute::CheckTemplateCanRoute(const std::string& where) const {
  const auto topic_chars = [](const std::string& text) {
    return std::all_of(text.begin(), text.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    });
  };
  std::string fixed_start;  // up to the first placeholder other than {destination}
  bool open = false;
  std::string pattern;
  for (const auto& p : parts_) {
    std::string literal;
    if (p.kind == Part::kText) {
      if (!topic_chars(p.text)) {
        throw std::invalid_argument(where + "topic \"" + template_ + "\": \"" + p.text +
                                    "\" has characters a Kafka topic name cannot have; use only "
                                    "letters, digits, `.`, `_` and `-` around the placeholders");
      }
      literal = p.text;
    } else if (p.kind == Part::kDestination) {
      if (!topic_chars(destination_)) {
        throw std::invalid_argument(
            where + "topic \"" + template_ + "\": {destination} would put \"" + destination_ +
            "\" in the topic, which has characters a Kafka topic name cannot have; write the "
            "destination's topic name instead of {destination}");
      }
      literal = destination_;
    } else {
      open = true;
      pattern += ".+";
      continue;
    }
    if (!open) fixed_start += literal;
    for (char c : literal) {
      if (c == '.') pattern += '\\';
      pattern += c;
    }
  }
  if (!prefix_.empty() && !fixed_start.starts_with(prefix_) &&
      !(open && prefix_.starts_with(fixed_start))) {
    throw std::invalid_argument(where + "topic \"" + template_ +
                                "\": no topic it makes can start with topic_prefix \"" + prefix_ +
                                "\"; make the template start with the prefix");
  }
  if (!allowed_.empty()) {
    const std::regex shape(pattern);
    const bool any = std::any_of(allowed_.begin(), allowed_.end(),
                                 [&](const std::string& t) { return std::regex_match(t, shape); });
    if (!any) {
      throw std::invalid_argument(where + "topic \"" + template_ +
                                  "\" matches none of allowed_topics, so every message would be "
                                  "refused; list the topics the template makes, or fix it");
    }
  }
}

TopicRoute::Routed TopicRoute::TopicFor(const Message& msg) const {
  if (fixed_) return Routed{template_, ""};
  std::string topic;
  for (const auto& p : parts_) {
    std::string value;
    std::string what;
    switch (p.kind) {
      case Part::kText:
        topic += p.text;
        continue;
      case Part::kEventType:
        value = msg.event_type;
        what = "event_type";
        break;
      case Part::kDestination:
        value = destination_;
        what = "destination";
        break;
      case Part::kKey:
        value = msg.ordering_key.value_or("");
        what = "ordering key";
        break;
      case Part::kHeader:
        for (const auto& [name, v] : msg.headers) {
          if (name == p.text) value = v;
        }
        what = "header " + p.text;
        break;
    }
    if (value.empty()) {
      return Routed{"", "routed nowhere: the topic template \"" + template_ + "\" needs the " +
                            what + ", and the message has none"};
    }
    topic += value;
  }
  if (!IsValidTopicName(topic)) {
    return Routed{"", "routed to \"" + topic.substr(0, 100) +
                          "\", which is not a valid Kafka topic name (topic template \"" +
                          template_ + "\")"};
  }
  const bool allowed = std::find(allowed_.begin(), allowed_.end(), topic) != allowed_.end() ||
                       (!prefix_.empty() && topic.rfind(prefix_, 0) == 0);
  if (!allowed) {
    return Routed{
        "", "routed to topic \"" + topic + "\", which is not in allowed_topics" +
                (prefix_.empty() ? std::string()
                                 : " and does not start with topic_prefix \"" + prefix_ + "\"")};
  }
  return Routed{topic, ""};
}

}  // namespace outbox::relay::kafka_detail
