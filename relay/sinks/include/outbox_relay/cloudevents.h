// CloudEvents 1.0 in binary content mode (docs/configuration.md, "Message format"): the
// message's payload stays the body, and its context attributes travel as headers, `ce_<name>`
// on Kafka (Kafka protocol binding) and `ce-<name>` over HTTP (HTTP protocol binding). Both
// sinks take the attributes from here, so a consumer sees the same event either way.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "outbox_relay/message.h"

namespace outbox::relay {

/// The context attributes of `msg`, in this order, each as (attribute name, value):
///   specversion  "1.0"
///   id           the idempotency key: the same across redeliveries, so (source, id) dedupes
///   source       `source`, or "/outbox-relay/<destination>" when empty
///   type         the event type, or the destination's name when the message has none
///   time         created_at, RFC 3339 UTC with milliseconds
///   subject      the ordering key, when the message has one
/// The content type is not among them: each binding sends its own header (content-type).
std::vector<std::pair<std::string, std::string>> CloudEventAttributes(const Message& msg,
                                                                      const std::string& source);

/// RFC 3339 UTC with milliseconds: "2026-11-23T08:01:02.345Z".
std::string FormatRfc3339(std::chrono::system_clock::time_point tp);

}  // namespace outbox::relay
