// The webhook service's endpoints (outbox.endpoints, migration 0008), managed at run time:
// what `outbox-relay endpoints ...` does. Relays see every change within a second.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace outbox::relay {

class Store;

/// Bad input to one of the functions below: what() says what is wrong and how to fix it,
/// field() names the field ("url", "event_types", ...). Nothing was written.
class InvalidField : public std::invalid_argument {
 public:
  InvalidField(std::string field, const std::string& message)
      : std::invalid_argument(message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

/// An endpoint with that id exists already.
class EndpointExists : public InvalidField {
 public:
  using InvalidField::InvalidField;
};

/// How deep JSON given for an endpoint (metadata, breaker, an API request's body) may nest.
/// nlohmann parses without recursion, but writes JSON back out (dump) recursing once per
/// level: 200,000 levels, well under 1 MiB, overflowed a thread's stack.
inline constexpr int kMaxJsonDepth = 64;

/// Whether JSON text nests arrays and objects deeper than max_depth (read without parsing; for
/// text that is not JSON the answer means nothing, and the parse refuses it anyway).
bool JsonNestedDeeperThan(std::string_view text, int max_depth);

/// The endpoint named does not exist.
class EndpointNotFound : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};
/// "no endpoint has id ...", saying where the ids are.
inline EndpointNotFound NoSuchEndpoint(const std::string& id) {
  return EndpointNotFound("no endpoint has id \"" + id +
                          "\"; `outbox-relay endpoints list` shows them");
}

/// A delete or a move of an endpoint waited kEndpointLockWait for its move lock (migration
/// 0018) and gave up: a replay to it, or a relay writing its rows, held it. Nothing changed;
/// asking again in a few seconds may well succeed.
class EndpointBusy : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
inline constexpr std::chrono::seconds kEndpointLockWait{5};

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
  std::optional<int> rate_limit;  ///< Requests per second; nullopt: the destination's.
  /// Its own breaker settings (JSON object text: enabled, failure_threshold, cooldown_ms,
  /// max_cooldown_ms, each optional) and adaptive concurrency, over the destination's.
  std::string breaker = "{}";
  std::optional<bool> adaptive_concurrency;
  bool enabled = true;
  std::optional<std::string> disabled_reason;
  std::string created_at;  ///< RFC 3339 UTC.
  std::string updated_at;
  int secrets = 0;  ///< Secrets signing now (more than one during a rotation's overlap).
  std::string signature = "hmac";        ///< Of its newest secret: "hmac" or "ed25519".
  std::vector<std::string> public_keys;  ///< ed25519: the whpk_ keys that verify now, newest first.
  std::int64_t backlog = 0;              ///< Rows waiting for this endpoint alone.
  std::int64_t dead_letters = 0;
  /// In a list (ListEndpoints), each count stops at kListCountCap; true: there are more.
  bool backlog_capped = false;
  bool dead_letters_capped = false;
};

/// How far ListEndpoints counts each endpoint's backlog and dead letters (GetEndpoint counts
/// all): a list of endpoints holding millions of rows each would otherwise read them all.
inline constexpr std::int64_t kListCountCap = 1000;

/// What to set; unset fields stay as they are (add: take their defaults).
struct EndpointFields {
  std::optional<std::string> id;  ///< add only; default "ep_<random>"
  std::optional<std::string> destination;
  std::optional<std::string> url;
  std::optional<std::string> description;
  std::optional<std::string> metadata;  ///< JSON object text
  std::optional<std::vector<std::string>> event_types;
  std::optional<std::map<std::string, std::string>> headers;
  /// 0: back to the destination's. 64-bit, as JSON's integers are: the store checks the range
  /// of whatever it is given (nothing is cut to fit an int first).
  std::optional<std::int64_t> max_in_flight;
  std::optional<std::int64_t> rate_limit;  ///< Requests per second; 0: back to the destination's
  std::optional<std::string> breaker;      ///< JSON object text, replaces the endpoint's ({}: none)
  std::optional<std::string> adaptive_concurrency;  ///< "true", "false"; "": the destination's
  std::optional<bool> enabled;
  std::optional<std::string> secret;  ///< add only; default: a new random key of `signature`
  /// add only: "hmac" (default; whsec_ secrets) or "ed25519" (whsk_ keys, "v1a," signatures).
  std::optional<std::string> signature;
};

struct CreatedEndpoint {
  EndpointRecord endpoint;
  /// HMAC: the secret, shown once; never readable again through these functions. ed25519:
  /// empty (the private key never leaves the database; receivers get public_key).
  std::string secret;
  std::string public_key;  ///< ed25519: what receivers verify with.
};

/// A rotation's new key: `secret` (HMAC) or `public_key` (ed25519), as in CreatedEndpoint.
struct RotatedKey {
  std::string secret;
  std::string public_key;
};

/// Throws std::invalid_argument naming the field and the fix for bad input (a duplicate id,
/// a bad id, url, metadata or max_in_flight).
CreatedEndpoint AddEndpoint(Store& store, const EndpointFields& fields);
/// `destination` empty: every destination.
std::vector<EndpointRecord> ListEndpoints(Store& store, const std::string& destination);
/// Where a page of endpoints starts: after this (destination, id), in that order.
struct EndpointCursor {
  std::string destination;
  std::string id;
};
struct EndpointPage {
  std::vector<EndpointRecord> endpoints;
  bool more = false;  ///< Endpoints follow the last one of this page.
};
/// At most `limit` (> 0) endpoints, ordered by (destination, id), after `after` when given.
/// A cursor naming an endpoint deleted since still works: it is a place, not a lookup.
EndpointPage ListEndpointsPage(Store& store, const std::string& destination, int limit,
                               const std::optional<EndpointCursor>& after);
/// How GetEndpoint counts the endpoint's backlog and dead letters: every row (`show`), or not
/// at all (0: a check of its other fields, which need not read millions of rows).
enum class EndpointCounts { kAll, kNone };
std::optional<EndpointRecord> GetEndpoint(Store& store, const std::string& id,
                                          EndpointCounts counts = EndpointCounts::kAll);
/// False when there is no such endpoint.
bool UpdateEndpoint(Store& store, const std::string& id, const EndpointFields& fields);
enum class EnableChange { kNoSuchEndpoint, kUnchanged, kChanged };
/// Disable: the endpoint's messages wait for it (nothing is sent, nothing is lost).
/// Enable: they go again at once, those waiting for a retry included. An endpoint already in
/// the state asked for is left as it is (kUnchanged): its rows' retry schedule, its
/// failing_since and its disabled reason stay.
EnableChange SetEndpointEnabled(Store& store, const std::string& id, bool enabled,
                                const std::string& reason);
/// Deletes the endpoint and its secrets. Rows still waiting for it go to its dead letters when
/// a relay meets them. False when there is no such endpoint.
bool DeleteEndpoint(Store& store, const std::string& id);
/// The longest a rotated-out secret keeps signing (RotateEndpointSecret's `overlap`): 365 days.
inline constexpr std::chrono::seconds kMaxSecretOverlap{365 * 86'400};

/// A new current secret (given, or random); the ones signing until now keep signing for
/// `overlap` more, then stop. The new key is of the kind the endpoint signs with now, unless
/// `secret` gives one (a whsec_ secret or a whsk_ ed25519 key). Throws std::invalid_argument
/// for an unknown endpoint or a malformed secret.
RotatedKey RotateEndpointSecret(Store& store, const std::string& id, std::chrono::seconds overlap,
                                const std::optional<std::string>& secret);

/// One attempt of the delivery log (outbox.delivery_attempts, migration 0009).
struct AttemptRecord {
  std::int64_t id = 0;
  std::string endpoint_id;
  std::string destination;
  std::string delivery_id;    ///< The webhook-id sent.
  std::string attempted_at;   ///< RFC 3339 UTC, milliseconds.
  std::optional<int> status;  ///< nullopt: no answer
  std::string outcome;        ///< delivered, retry or permanent
  int latency_ms = 0;
  std::optional<std::string> error;
  std::string response_body;
};

/// Newest first. `endpoint_id` empty: every endpoint. `message` (a uuid, empty: any): the
/// attempts of that message, by its own idempotency key or by an endpoint's delivery id.
/// `before` (0: none): only attempts older than that one (ids are in the order they were
/// written), the next page after one whose last attempt it was.
/// Throws std::invalid_argument for a message that is not a uuid.
std::vector<AttemptRecord> ListAttempts(Store& store, const std::string& endpoint_id,
                                        const std::string& message, int limit,
                                        std::int64_t before = 0);

/// What ReplayToEndpoint queued.
struct ReplayOutcome {
  std::int64_t id = 0;              ///< the replay's, for GetEndpointReplay
  std::int64_t queued = 0;          ///< by this call
  bool resumed = false;             ///< it went on with a replay begun by an earlier call
  std::int64_t queued_earlier = 0;  ///< resumed: what the earlier calls of it queued
  std::string began;                ///< when the replay began, RFC 3339 UTC
  bool finished = false;            ///< false: BeginEndpointReplay's, or stopped by `stop`
  std::string endpoint_id;          ///< for RunEndpointReplay
  std::string endpoint_created_at;  ///< which endpoint of the id (one added again is another)
};

/// Sends archived messages (retention.archive_delivered) to one endpoint again, as rows of
/// that endpoint: everything its subscription takes delivered since `since` (a time PostgreSQL
/// reads as timestamptz, e.g. "2026-11-22 10:00Z"), or the one message `message` (its
/// idempotency key or delivery id). Same delivery ids as the first time; what the endpoint
/// still has queued is skipped. A replay that failed part-way is resumed by the next call with
/// the same endpoint, time or message within a day: it queues only the rest (later, or with
/// `restart`, it starts over). Throws std::invalid_argument for an unknown endpoint or bad
/// input. BeginEndpointReplay then RunEndpointReplay on the same store.
ReplayOutcome ReplayToEndpoint(Store& store, const std::string& endpoint_id,
                               const std::string& since, const std::string& message,
                               bool restart = false);

/// ReplayToEndpoint's first step: checks the input, and begins the replay (or takes up the
/// one of the same endpoint, time or message that has not finished; EndpointBusy when a run
/// of it holds it for kEndpointLockWait). From here until
/// RunEndpointReplay returns, GetEndpointReplay says it is running (the store's connection
/// holds its lock). Queues nothing.
ReplayOutcome BeginEndpointReplay(Store& store, const std::string& endpoint_id,
                                  const std::string& since, const std::string& message,
                                  bool restart = false);

/// ReplayToEndpoint's second step, on the store that began it: queues the replay's parts
/// until it is done (`finished`), or until `stop` says so between two parts. A failure is
/// written to the replay (its `error`) when the connection still works, and thrown.
ReplayOutcome RunEndpointReplay(Store& store, ReplayOutcome begun,
                                const std::function<bool()>& stop = {});

/// What SendTestEvent queued.
struct TestEvent {
  std::int64_t id = 0;      ///< the message's
  std::string delivery_id;  ///< its webhook-id: `attempts --message` shows how it went
  std::string event_type;
};

/// Svix's "send example": queues one message for this endpoint alone, whatever its event
/// types, signed and sent as any other (a disabled endpoint gets it once enabled). `event_type`
/// empty: "webhook.test"; `payload` (JSON text) empty: {"type", "endpoint_id", "test": true,
/// "sent_at"}. Throws EndpointNotFound, InvalidField ("event_type", "payload": not JSON, or
/// over outbox.settings.max_payload_bytes). `check_destination` is called with the endpoint's
/// destination, read under its move lock, and may throw to refuse it.
TestEvent SendTestEvent(Store& store, const std::string& endpoint_id, const std::string& event_type,
                        const std::string& payload,
                        const std::function<void(const std::string&)>& check_destination = {});

/// An endpoint replay as GET /v1/replays/{id} shows it, kept for a day after its last change.
struct EndpointReplay {
  std::int64_t id = 0;
  std::string endpoint_id;
  std::string since;    ///< RFC 3339 UTC; empty when one message was asked for
  std::string message;  ///< the message asked for; empty when a time was
  /// "running" (a connection is running it now), "finished", or "failed" (nothing runs it:
  /// it failed, or the relay running it stopped; asked again, it resumes).
  std::string status;
  std::int64_t queued = 0;
  std::string began;        ///< RFC 3339 UTC
  std::string updated_at;   ///< its last part, RFC 3339 UTC
  std::string finished_at;  ///< RFC 3339 UTC; empty until it finished
  /// Failed: why its last run failed, or that nothing runs it (when the failure could not be
  /// written: the relay stopped, or lost its connection).
  std::string error;
};

/// nullopt: no replay has that id (or it ended more than a day ago, or its endpoint is gone).
std::optional<EndpointReplay> GetEndpointReplay(Store& store, std::int64_t id);

/// The endpoint's replays of the last day, newest first, at most 100. Throws EndpointNotFound.
std::vector<EndpointReplay> ListEndpointReplays(Store& store, const std::string& endpoint_id);

}  // namespace outbox::relay
