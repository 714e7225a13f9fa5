// Operator operations: outbox.dead_letters for `outbox-relay dlq`, pausing destinations for
// `outbox-relay pause|resume`.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace outbox::relay {

class Store;

struct DeadLetter {
  std::int64_t id = 0;
  std::string destination;
  std::optional<std::string> ordering_key;
  std::string idempotency_key;
  std::string event_type;
  std::string headers;  ///< JSON object text.
  std::string payload;  ///< JSON text, or "base64:..." for a bytes payload.
  int attempts = 0;
  std::string reason;
  std::optional<std::string> last_error;
  std::string created_at;  ///< RFC 3339 UTC.
  std::string dead_at;
  /// ListEndpointDeadLetters: a payload too large for a list is left out (empty `payload`),
  /// GetEndpointDeadLetter has it; `payload_size` is its size in bytes either way.
  bool payload_omitted = false;
  std::int64_t payload_size = 0;
};

/// Newest first. `destination` empty: all.
std::vector<DeadLetter> ListDeadLetters(Store& store, const std::string& destination, int limit);
/// How many dead letters there are (of `destination`; '' for all).
std::int64_t CountDeadLetters(Store& store, const std::string& destination);
std::optional<DeadLetter> GetDeadLetter(Store& store, std::int64_t id);
struct Replayed {
  std::vector<std::int64_t> ids;        ///< The new messages' ids.
  std::vector<std::int64_t> held_back;  ///< Dead letters left as they are, see below.
  /// Dead letters of a webhook endpoint that was deleted (maybe added again since with its id,
  /// another endpoint, which must not get them): left as they are, for `dlq purge`.
  std::vector<std::int64_t> of_deleted_endpoints;
};
/// Puts dead letters back in the queue with their idempotency keys; `ids` empty: every one
/// (of `destination` if given). A dead letter whose idempotency key is queued, or that shares
/// it with another dead letter replayed now (the oldest goes), is held back: it stays a dead
/// letter, to replay once that message is gone.
Replayed ReplayDeadLetters(Store& store, const std::vector<std::int64_t>& ids,
                           const std::string& destination);
struct DeadLetterPage {
  std::vector<DeadLetter> letters;
  std::string next_before;  ///< the next page's `before`; empty on the last page
};
/// A webhook service endpoint's own dead letters (not those of a deleted endpoint of its id,
/// migration 0041), the last to die first; `before` (empty: none): the page after the one whose
/// next_before it was. A payload over 64 KiB is left out (payload_omitted). Throws
/// EndpointNotFound, InvalidField ("before").
DeadLetterPage ListEndpointDeadLetters(Store& store, const std::string& endpoint_id, int limit,
                                       const std::string& before = "");
/// One of them, with its payload; nullopt when it is not one of the endpoint's own dead
/// letters (any more). Throws EndpointNotFound.
std::optional<DeadLetter> GetEndpointDeadLetter(Store& store, const std::string& endpoint_id,
                                                std::int64_t id);
/// Svix's "recover": puts the endpoint's dead letters that died at or after `since` (a time
/// PostgreSQL reads as timestamptz, read once) back in its queue, as ReplayDeadLetters does
/// (same delivery ids; held back when the key is queued). Those of a deleted endpoint of its
/// id stay, in `of_deleted_endpoints`. Throws EndpointNotFound, InvalidField ("since").
Replayed RecoverEndpoint(Store& store, const std::string& endpoint_id, const std::string& since);
/// outbox.settings.max_payload_bytes: the largest payload writers can queue.
std::int64_t MaxPayloadBytes(Store& store);
/// Records `names` in outbox.destinations (migration 0010: what the write-time guard accepts
/// when it is on), as registered by `registered_by`; known names are left as they are.
void RegisterDestinations(Store& store, const std::vector<std::string>& names,
                          const std::string& registered_by);

struct RegisteredDestination {
  std::string name;
  std::string registered_by;  ///< "relay host:pid" or "operator".
  std::string registered_at;  ///< RFC 3339 UTC.
};
struct DestinationRegistry {
  std::vector<RegisteredDestination> destinations;  ///< By name.
  bool guard = false;  ///< outbox.settings.refuse_unknown_destinations.
};
/// What `outbox-relay destinations list` shows.
DestinationRegistry ListRegisteredDestinations(Store& store);

/// Pausing a destination (`outbox-relay pause|resume`): every relay stops claiming it within
/// a second (what is in flight finishes) until it is resumed; the reason shows in `status`.
/// ResumeDestination returns false when it was not paused.
void PauseDestination(Store& store, const std::string& destination, const std::string& reason);
bool ResumeDestination(Store& store, const std::string& destination);

/// Live relays (heartbeat within `expiry`) per destination they serve.
std::map<std::string, std::int64_t> LiveRelaysByDestination(Store& store,
                                                            std::chrono::milliseconds expiry);

/// Moves every queued, unleased message of `destination` to the dead letters with `reason`
/// (in batches; leased ones stay with their relay). For destinations no relay will ever
/// serve: an operator's explicit decision (`outbox-relay dlq bury`), never the relay's.
/// Returns how many moved.
std::int64_t BuryDestination(Store& store, const std::string& destination,
                             const std::string& reason);

/// Deletes dead letters: by id, and/or dead longer than `older_than` (a PostgreSQL interval
/// such as "7 days"). Returns how many. Refuses to run with neither ids nor older_than nor
/// destination (throws std::invalid_argument) so a typo cannot purge everything.
std::int64_t PurgeDeadLetters(Store& store, const std::vector<std::int64_t>& ids,
                              const std::string& older_than, const std::string& destination);

}  // namespace outbox::relay
