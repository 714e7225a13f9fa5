// A destination's `webhook:` section (docs/configuration.md, "Webhooks"): what it holds, and
// the TargetKind that reads it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox_relay/config.h"

namespace outbox::relay {

/// The circuit breaker of a webhook endpoint (docs/webhooks.md, "Endpoint outages").
struct BreakerSettings {
  bool enabled = true;
  int failure_threshold = 10;    ///< Consecutive failures (connect, timeout, 5xx) that open it.
  Millis cooldown{5'000};        ///< Open this long before one probe request...
  Millis max_cooldown{300'000};  ///< ...doubling after each failed probe, up to this; also the
                                 ///< longest pause a Retry-After can ask for.
};

struct WebhookTarget {
  static constexpr std::string_view kKind = "webhook";

  std::string url;  ///< http:// or https://, with path.
  /// Standard Webhooks secrets, each "whsec_<base64>". Every one signs each delivery, so a
  /// receiver that knows either the new or the old secret verifies during rotation.
  std::vector<std::string> secrets;
  Millis timeout{10'000};  ///< Whole request.
  Millis connect_timeout{5'000};
  int max_in_flight = 32;              ///< Concurrent requests to this endpoint.
  std::optional<std::string> ca_file;  ///< PEM bundle to trust instead of the system one.
  bool verify_tls = true;
  std::map<std::string, std::string> headers;  ///< Extra static headers on every request.
  BreakerSettings breaker;
  /// CloudEvents binary mode: ce-specversion, ce-id, ce-source, ce-type, ce-time and
  /// ce-subject headers on every request (cloudevents.h), besides the signature headers.
  bool cloudevents = false;
  std::string cloudevents_source;  ///< ce-source; empty: "/outbox-relay/<destination>".
  /// The SSRF guard (docs/webhooks.md, "Private networks"): by default the relay refuses to
  /// connect to loopback, private, link-local, CGNAT, unique-local, multicast and reserved
  /// addresses. true: this destination may connect to any of them.
  bool allow_private_networks = false;
  /// Networks this destination may connect to although they are private ("10.20.0.0/16",
  /// "fd00:1::/64", or one address).
  std::vector<std::string> allowed_networks;
  /// 429, 503 and timeouts halve the concurrent requests, successes raise them back up to
  /// max_in_flight. Off: always max_in_flight.
  bool adaptive_concurrency = true;
  /// Requests per second this endpoint is sent at most (a burst of one second's worth); 0: no
  /// limit. With `endpoints: database`, each endpoint's own rate_limit replaces it.
  int rate_limit = 0;
  /// `endpoints: database`: a webhook service. The destination has no url or secret of its
  /// own; each message fans out to the endpoints in outbox.endpoints subscribed to it
  /// (docs/webhooks.md, "Webhook service"), and every other setting here is the default of
  /// each endpoint (max_in_flight is per endpoint).
  bool endpoints_from_database = false;
  /// The relay's database_url, where endpoints_from_database reads the endpoints (set by the
  /// config loader).
  std::string database_url;
  /// endpoints_from_database: record every attempt in outbox.delivery_attempts...
  bool delivery_log = true;
  Millis delivery_log_retention{7LL * 24 * 3600 * 1000};  ///< ...and keep it this long.
  /// endpoints_from_database: disable an endpoint failing for this long (0: never).
  Millis auto_disable_after{5LL * 24 * 3600 * 1000};
  /// endpoints_from_database: the destination that receives an `endpoint.disabled` message
  /// when an endpoint is disabled automatically; empty: none.
  std::string operational_events;
  /// endpoints_from_database: after the registry could not be read for this long, claim
  /// nothing more until it can (an endpoint may have been deleted or disabled, a secret
  /// rotated out, meanwhile). Not in the config file; tests shorten it.
  Millis registry_stale_after{30'000};
};

/// Reads `webhook:` sections: url and secrets (or `endpoints: database`), timeouts, headers,
/// the breaker, the SSRF guard's exceptions, the webhook service's settings.
const TargetKind& WebhookTargetKind();

/// The HMAC key of a Standard Webhooks secret: the bytes that "whsec_<base64>" encodes.
/// Every secret in a loaded WebhookTarget decodes; throws ConfigError (without echoing the
/// secret) for one that does not.
std::string WebhookSecretKey(const std::string& secret);

}  // namespace outbox::relay
