// The management HTTP API: what `outbox-relay endpoints` and `outbox-relay attempts` do, as
// JSON over HTTP for the application that runs a webhook service on outbox-relay. Described
// by docs/openapi.yaml.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace outbox::relay {

/// Serves, under /v1, with `Authorization: Bearer <token>` on every request:
///   GET    /v1/endpoints[?destination=D&limit=N&after=C]
///                                               200 {"data": [endpoint...], "next_after"}
///   POST   /v1/endpoints                        201 endpoint + "secret" (shown once)
///   GET    /v1/endpoints/{id}                   200 endpoint
///   PATCH  /v1/endpoints/{id}                   200 endpoint
///   DELETE /v1/endpoints/{id}                   204
///   POST   /v1/endpoints/{id}/disable           200 endpoint   body {"reason"} optional
///   POST   /v1/endpoints/{id}/enable            200 endpoint
///   POST   /v1/endpoints/{id}/rotate-secret     200 {"secret"}  body {"overlap_seconds", "secret"}
///   POST   /v1/endpoints/{id}/replay            202 {"id", "status", "queued"...}
///                                               body {"since"} or {"message"}; with
///                                               `Prefer: respond-async`, answered once begun
///                                               and run on in the background
///   GET    /v1/endpoints/{id}/replays           200 {"data": [replay...]}
///   GET    /v1/endpoints/{id}/dead-letters[?limit=N&before=CURSOR]
///                                               200 {"data": [dead letter...], "next_before"}
///   GET    /v1/endpoints/{id}/dead-letters/{dead_letter_id}  200 dead letter
///   POST   /v1/endpoints/{id}/test              202 {"id", "delivery_id", "event_type"}
///                                               body {"event_type", "payload"} optional
///   POST   /v1/endpoints/{id}/recover           200 {"replayed", "held_back",
///                                               "of_deleted_endpoint"} body {"since"}
///   GET    /v1/replays/{id}                     200 replay {"status": running|finished|failed}
///   GET    /v1/attempts[?endpoint_id=&message=&limit=]  200 {"data": [attempt...]}
/// Errors are JSON, {"error": {"code", "message", "field"?}}: 401 unauthorized (no or wrong
/// token), 400 invalid_json / invalid_field (naming the field), 404 not_found, 409 conflict
/// (an id in use), 429 too_many_requests (two replays or recoveries run already), 503
/// database_unavailable / endpoint_busy. Nothing is written by a refused request, but the
/// parts a replay or a recovery committed before it failed.
class ManagementApi {
 public:
  /// `listen` as the admin server's ("host:port"); `token`: the bearer token (at least 16
  /// characters, checked by the config).
  ManagementApi(std::string listen, std::string token, std::string database_url);
  ~ManagementApi();  ///< Stop().
  ManagementApi(const ManagementApi&) = delete;
  ManagementApi& operator=(const ManagementApi&) = delete;

  /// Why an endpoint of `destination` at `url` is refused (the destination's SSRF guard), or
  /// nullopt; checked when an endpoint is added or its URL or destination changes.
  using UrlCheck = std::function<std::optional<std::string>(const std::string& destination,
                                                            const std::string& url)>;
  /// Before Start. Without one, URLs are only parsed.
  void SetUrlCheck(UrlCheck check);

  /// Why endpoints cannot belong to `destination` (one this relay delivers somewhere else than
  /// to database endpoints: a Kafka topic, a webhook URL in its config), or nullopt; checked
  /// when an endpoint is added or moved, and before its test event.
  using DestinationCheck =
      std::function<std::optional<std::string>(const std::string& destination)>;
  /// Before Start. Without one, any destination name is taken.
  void SetDestinationCheck(DestinationCheck check);

  /// Binds and serves; throws std::invalid_argument (address) or std::runtime_error (bind).
  void Start();
  void Stop();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::relay
