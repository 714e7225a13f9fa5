// Internal: the webhook service's way to make an endpoint's sink again without forgetting what
// the old one learned of the endpoint (not installed, not public).
#pragma once

#include <string>

#include "outbox_relay/sink.h"
#include "outbox_relay/webhook_target.h"

namespace outbox::relay::webhook_detail {

/// MakeWebhookSink for an endpoint whose sink is replaced while its URL stays (a new secret,
/// its headers or limits changed): the new sink's breaker, Retry-After pause and concurrency
/// limit go on from `previous`'s (a sink MakeWebhookSink or this made; any other kind of sink
/// gives a fresh state), within the new settings (EndpointGovernor::Resume).
SinkPtr RemakeWebhookSink(std::string destination, const WebhookTarget& target,
                          const Sink& previous);

}  // namespace outbox::relay::webhook_detail
