// The webhook service's endpoints (outbox.endpoints, migration 0008), managed at run time:
// what `outbox-relay endpoints ...` does. Relays see every change within a second.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace outbox::relay {

class Store;

/// One endpoint as an operator sees it. Never its secrets.
struct EndpointRecord {
  std::string id;
  std::string destination;
  std::string url;
  std::string description;
  std::string metadata;  ///< JSON object text.
  std::vector<std::string> event_types;
  std::map<std::string, std::string> headers;
  std::optional<int> max_in_flight;
  bool enabled = true;
  std::optional<std::string> disabled_reason;
  std::string created_at;  ///< RFC 3339 UTC.
  std::string updated_at;
  int secrets = 0;           ///< Secrets signing now (more than one during a rotation's overlap).
  std::int64_t backlog = 0;  ///< Rows waiting for this endpoint alone.
  std::int64_t dead_letters = 0;
};

/// What to set; unset fields stay as they are (add: take their defaults).
struct EndpointFields {
  std::optional<std::string> id;  ///< add only; default "ep_<random>"
  std::optional<std::string> destination;
  std::optional<std::string> url;
  std::optional<std::string> description;
  std::optional<std::string> metadata;  ///< JSON object text
  std::optional<std::vector<std::string>> event_types;
  std::optional<std::map<std::string, std::string>> headers;
  std::optional<int> max_in_flight;  ///< 0: back to the destination's
  std::optional<bool> enabled;
  std::optional<std::string> secret;  ///< add only; default: a new random whsec_ secret
};

struct CreatedEndpoint {
  EndpointRecord endpoint;
  std::string secret;  ///< Shown once; never readable again through these functions.
};

/// Throws std::invalid_argument naming the field and the fix for bad input (a duplicate id,
/// a bad id, url, metadata or max_in_flight).
CreatedEndpoint AddEndpoint(Store& store, const EndpointFields& fields);
/// `destination` empty: every destination.
std::vector<EndpointRecord> ListEndpoints(Store& store, const std::string& destination);
std::optional<EndpointRecord> GetEndpoint(Store& store, const std::string& id);
/// False when there is no such endpoint.
bool UpdateEndpoint(Store& store, const std::string& id, const EndpointFields& fields);
/// Disable: the endpoint's messages wait for it (nothing is sent, nothing is lost).
/// Enable: they go again at once. False when there is no such endpoint.
bool SetEndpointEnabled(Store& store, const std::string& id, bool enabled,
                        const std::string& reason);
/// Deletes the endpoint and its secrets. Rows still waiting for it go to its dead letters when
/// a relay meets them. False when there is no such endpoint.
bool DeleteEndpoint(Store& store, const std::string& id);
/// A new current secret (given, or random); the ones signing until now keep signing for
/// `overlap` more, then stop. Returns the new secret. Throws std::invalid_argument for an
/// unknown endpoint or a malformed secret.
std::string RotateEndpointSecret(Store& store, const std::string& id, std::chrono::seconds overlap,
                                 const std::optional<std::string>& secret);

}  // namespace outbox::relay
