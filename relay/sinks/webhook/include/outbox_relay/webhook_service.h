// The webhook service: a destination whose endpoints live in Postgres (outbox.endpoints,
// migration 0008) and are managed at run time with `outbox-relay endpoints`.
#pragma once

#include <string>
#include <vector>

#include "outbox_relay/sink.h"
#include "outbox_relay/webhook_target.h"

namespace outbox::relay {

/// Creates the sink of a webhook destination with `endpoints: database`.
///
/// Fan-out: a message written by an application goes, in one claim, to every enabled endpoint
/// of the destination whose event-type filter takes it, each through a webhook sink of its own
/// (MakeWebhookSink: signing with the endpoint's current secrets, its headers over the
/// destination's, its own circuit breaker and adaptive concurrency). The message completes
/// with kDelivered when every endpoint took it (or none matched), else kFannedOut listing the
/// endpoints that did not: failed, refused, breaker open, disabled, busy (more queued than it
/// allows), or still owing an earlier message of the same ordering key. Each of those becomes
/// a row of its own (Message::endpoint_id), which this sink then delivers to that endpoint
/// only, with its own attempts, retries and dead letter.
///
/// Per-key order per endpoint: before sending a keyed message to an endpoint, the sink asks
/// the database whether that endpoint still owes an earlier message of the key (one query per
/// batch of messages); if it does, the message queues behind it instead.
///
/// The endpoint's delivery id (webhook-id, Idempotency-Key) is EndpointDeliveryId of the
/// message's idempotency key: the same on every attempt and every relay, distinct per endpoint.
///
/// The registry: a thread polls outbox.endpoint_registry.version four times a second and
/// reloads the destination's endpoints when it moved (or when a rotated-out secret expires),
/// so changes reach the relay within a second. Until the first load the sink is not ready and
/// hands messages back unsent.
SinkPtr MakeWebhookServiceSink(std::string destination, const WebhookTarget& defaults);

/// The delivery id of message `message_key` (a uuid) at endpoint `endpoint_id`: the uuid made
/// of md5("<message_key>/<endpoint_id>"), as outbox.endpoint_delivery_id computes it in SQL.
std::string EndpointDeliveryId(const std::string& message_key, const std::string& endpoint_id);

/// Whether an endpoint subscribed to `event_types` receives an event of `event_type`: an empty
/// list takes every event; otherwise an exact match, or a pattern ending in ".*" matching that
/// prefix ("invoice.*" takes "invoice.paid").
bool EndpointWants(const std::vector<std::string>& event_types, const std::string& event_type);

}  // namespace outbox::relay
