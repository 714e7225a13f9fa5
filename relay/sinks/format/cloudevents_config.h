// The `format` and `cloudevents_source` keys every kind of target with CloudEvents support
// reads from its section (Kafka, webhooks): one rule, one set of errors.
#pragma once

#include <string>
#include <string_view>

#include "outbox_relay/config_fields.h"

namespace outbox::relay {

/// Reads `format: plain | cloudevents` and `cloudevents_source` from the section `m`.
/// `plain_headers` says what `plain` sends ("the relay's headers"), `ce_headers` how the
/// attributes travel ("ce_*"). Throws ConfigError naming the key and the fix.
void ReadCloudEventsFormat(const cfg::Mapping& m, std::string_view plain_headers,
                           std::string_view ce_headers, bool& cloudevents, std::string& source);

}  // namespace outbox::relay
