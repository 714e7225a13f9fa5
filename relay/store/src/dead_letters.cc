#include "outbox_relay/dead_letters.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <regex>
#include <stdexcept>

#include "outbox_relay/endpoints.h"
#include "queries.h"
#include "store_access.h"

namespace outbox::relay {
namespace {

std::string ArrayLiteral(const std::vector<std::int64_t>& ids) {
  if (ids.empty()) return "";
  std::string s = "{";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + "}";
}

// dlq_list.sql's columns; `sized`: endpoint_dead_letters.sql's, which add payload_size and
// leave a large payload out (NULL).
DeadLetter DeadLetterFromRow(const pqxx::row& r, bool sized = false) {
  DeadLetter d;
  d.id = r["id"].as<std::int64_t>();
  d.destination = r["destination"].as<std::string>();
  if (!r["ordering_key"].is_null()) d.ordering_key = r["ordering_key"].as<std::string>();
  d.idempotency_key = r["idempotency_key"].as<std::string>();
  d.event_type = r["event_type"].as<std::string>();
  d.headers = r["headers"].as<std::string>();
  d.payload_omitted = r["payload"].is_null();
  if (!d.payload_omitted) d.payload = r["payload"].as<std::string>();
  if (sized && !r["payload_size"].is_null()) d.payload_size = r["payload_size"].as<std::int64_t>();
  d.attempts = r["attempts"].as<int>();
  d.reason = r["reason"].as<std::string>();
  if (!r["last_error"].is_null()) d.last_error = r["last_error"].as<std::string>();
  d.created_at = r["created_at"].as<std::string>();
  d.dead_at = r["dead_at"].as<std::string>();
  return d;
}

/// `--older-than` must be an interval with its units, not below zero: Postgres reads a bare
/// '7' as 7 seconds and a negative interval as "any age", and either purged every dead letter.
void CheckOlderThan(pqxx::connection& c, const std::string& older_than) {
  static const std::regex kBareNumber(R"(\s*[+-]?[0-9]*\.?[0-9]+\s*)");
  if (std::regex_match(older_than, kBareNumber)) {
    throw std::invalid_argument("--older-than '" + older_than +
                                "' has no unit (Postgres would read it as seconds); say "
                                "'7 days', '12 hours' or '30 minutes'");
  }
  bool negative = false;
  try {
    pqxx::nontransaction check(c);
    negative = check.exec_params1("SELECT $1::interval < interval '0'", older_than)[0].as<bool>();
  } catch (const pqxx::data_exception&) {
    throw std::invalid_argument("--older-than '" + older_than +
                                "' is not an interval; say '7 days', '12 hours' or '30 minutes'");
  }
  if (negative) {
    throw std::invalid_argument("--older-than '" + older_than +
                                "' is negative, which would match every dead letter; to delete "
                                "every dead letter say --older-than '0 seconds'");
  }
}

}  // namespace

std::vector<DeadLetter> ListDeadLetters(Store& store, const std::string& destination, int limit) {
  return Translated([&]() -> std::vector<DeadLetter> {
    pqxx::connection& c = StoreAccess::Connection(store);
    pqxx::nontransaction tx(c);
    std::vector<DeadLetter> out;
    for (const auto& r :
         tx.exec_params(std::string(sql::queries::kdlq_list), destination, 0, limit)) {
      out.push_back(DeadLetterFromRow(r));
    }
    return out;
  });
}

std::int64_t CountDeadLetters(Store& store, const std::string& destination) {
  return Translated([&]() -> std::int64_t {
    pqxx::nontransaction tx(StoreAccess::Connection(store));
    return tx
        .exec_params1("SELECT count(*) FROM outbox.dead_letters "
                      "WHERE NULLIF($1, '') IS NULL OR destination = $1",
                      destination)[0]
        .as<std::int64_t>();
  });
}

std::optional<DeadLetter> GetDeadLetter(Store& store, std::int64_t id) {
  if (id <= 0) return std::nullopt;  // ids start at 1; 0 means "any" to dlq_list.sql
  return Translated([&]() -> std::optional<DeadLetter> {
    pqxx::connection& c = StoreAccess::Connection(store);
    pqxx::nontransaction tx(c);
    const auto r = tx.exec_params(std::string(sql::queries::kdlq_list), std::string(), id, 1);
    if (r.empty()) return std::nullopt;
    return DeadLetterFromRow(r[0]);
  });
}

namespace {

// RecoverEndpoint's endpoint: its id, and which endpoint of the id (its creation, as text).
struct OneEndpoint {
  std::string id;
  std::string created_at;
};

// ReplayDeadLetters and RecoverEndpoint: the dead letters picked by ids (none: all), and by
// destination, endpoint and time of death ('': any), that were dead when it began, in parts.
Replayed ReplayDeadLetterParts(Store& store, const std::vector<std::int64_t>& ids,
                               const std::string& destination, const OneEndpoint& endpoint,
                               const std::string& dead_since) {
  return Translated([&]() -> Replayed {
    pqxx::connection& c = StoreAccess::Connection(store);
    // Its session ends with its connection, locks and all, though a part waits on a lock.
    EndWithLostClient(c);
    Replayed out;
    // A recovery takes what is dead when it begins: a recovered message that dies again
    // meanwhile (the endpoint still refuses it) is a dead letter with a higher id, and was
    // recovered again by a later part of the same run, over and over (review). Ids come from
    // one sequence. (`dlq replay` takes what dies while it runs too.)
    const auto upto = endpoint.id.empty()
                          ? std::numeric_limits<long long>::max()
                          : pqxx::nontransaction(c)
                                .exec1("SELECT coalesce(max(id), 0) FROM outbox.dead_letters")[0]
                                .as<long long>();
    // In parts, oldest first, each its own transaction (dlq_replay.sql says why). What a
    // failed run replayed stays replayed; run again, it replays the rest.
    constexpr long long kReplayChunk = 500;
    // A writer that queues a dead letter's idempotency key while its part is replayed commits
    // the key first: the part fails on the unique index and is run again, and the dead letter
    // is then held back as any whose key is queued. A few times at most.
    constexpr int kKeyConflictTries = 3;
    int conflicts = 0;
    long long after = std::numeric_limits<long long>::min();
    while (true) {
      pqxx::result rows;
      long long part_end = 0;
      try {
        pqxx::work tx(c);
        // The part, its endpoints' move locks taken (dlq_replay_part.sql says why).
        const auto part =
            tx.exec_params(std::string(sql::queries::kdlq_replay_part), ArrayLiteral(ids),
                           destination, after, kReplayChunk, endpoint.id, dead_since, upto);
        if (part.empty()) break;
        // The endpoint, as it was when the recovery began: deleted meanwhile (its dead letters
        // and the rows this run queued are its dead letters now), the run ends saying so. Read
        // under its move lock, which the part took (its dead letters are the endpoint's).
        if (!endpoint.id.empty() &&
            tx.exec_params("SELECT 1 FROM outbox.endpoints WHERE id = $1 AND created_at = "
                           "$2::timestamptz",
                           endpoint.id, endpoint.created_at)
                .empty()) {
          throw EndpointNotFound("endpoint " + endpoint.id +
                                 " was deleted while its dead letters were recovered; " +
                                 std::to_string(out.ids.size()) +
                                 " had been queued again, dead-lettered with the endpoint unless "
                                 "already delivered");
        }
        std::vector<std::int64_t> part_ids;
        for (const auto& r : part) part_ids.push_back(r[0].as<std::int64_t>());
        part_end = part_ids.back();
        // The writers' lock (migration 0014): no bucket count change between here and commit,
        // so the replay's snapshot has the count its rows are bucketed by.
        tx.exec("SELECT pg_advisory_xact_lock_shared(7079, 2)");
        rows = tx.exec_params(std::string(sql::queries::kdlq_replay), ArrayLiteral(part_ids),
                              destination);
        tx.commit();
      } catch (const pqxx::unique_violation& e) {
        if (++conflicts < kKeyConflictTries) continue;
        throw std::runtime_error(
            std::string("dlq replay: other writers kept queueing the idempotency keys of the dead "
                        "letters being replayed (") +
            e.what() +
            "); what was replayed before stays replayed: run the replay again to hold those "
            "dead letters back, or replay them once their keys' messages are delivered");
      }
      for (const auto& r : rows) {
        const std::string kind = r[1].as<std::string>();
        (kind == "replayed"    ? out.ids
         : kind == "held_back" ? out.held_back
                               : out.of_deleted_endpoints)
            .push_back(r[0].as<std::int64_t>());
      }
      // The next part after this one's last dead letter, whatever became of it meanwhile.
      after = part_end;
    }
    return out;
  });
}

// Its creation, as text; throws EndpointNotFound.
std::string CheckEndpoint(pqxx::connection& c, const std::string& endpoint_id) {
  pqxx::nontransaction tx(c);
  const auto r = tx.exec_params(
      std::string("SELECT ") + kEndpointCreatedAt + " FROM outbox.endpoints WHERE id = $1",
      endpoint_id);
  if (r.empty()) {
    throw NoSuchEndpoint(endpoint_id);
  }
  return r[0][0].as<std::string>();
}

// The list shows a payload up to this size; a larger one is left out (GetEndpointDeadLetter
// has it): a page of 100 stays within a few MiB whatever max_payload_bytes allows.
constexpr std::int64_t kListedPayloadBytes = 64 * 1024;

}  // namespace

Replayed ReplayDeadLetters(Store& store, const std::vector<std::int64_t>& ids,
                           const std::string& destination) {
  return ReplayDeadLetterParts(store, ids, destination, {}, "");
}

DeadLetterPage ListEndpointDeadLetters(Store& store, const std::string& endpoint_id, int limit,
                                       const std::string& before) {
  static const std::regex kCursor(
      R"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z@-?[0-9]{1,19})");
  if (!before.empty() && !std::regex_match(before, kCursor)) {
    throw InvalidField("before", "before must be the last page's next_before, as it was given (\"" +
                                     before + "\" is not one)");
  }
  return Translated([&]() -> DeadLetterPage {
    pqxx::connection& c = StoreAccess::Connection(store);
    CheckEndpoint(c, endpoint_id);
    pqxx::nontransaction tx(c);
    DeadLetterPage page;
    pqxx::result rows;
    try {
      rows = tx.exec_params(std::string(sql::queries::kendpoint_dead_letters), endpoint_id, before,
                            limit, 0, kListedPayloadBytes);
    } catch (const pqxx::data_exception&) {  // a time or an id out of range
      throw InvalidField("before",
                         "before must be the last page's next_before, as it was given "
                         "(\"" +
                             before + "\" is not one)");
    }
    for (const auto& r : rows) page.letters.push_back(DeadLetterFromRow(r, true));
    if (static_cast<int>(rows.size()) == limit) {
      page.next_before = rows.back()["cursor"].as<std::string>();
    }
    return page;
  });
}

std::optional<DeadLetter> GetEndpointDeadLetter(Store& store, const std::string& endpoint_id,
                                                std::int64_t id) {
  if (id == 0) return std::nullopt;  // 0 means "any" to endpoint_dead_letters.sql
  return Translated([&]() -> std::optional<DeadLetter> {
    pqxx::connection& c = StoreAccess::Connection(store);
    CheckEndpoint(c, endpoint_id);
    pqxx::nontransaction tx(c);
    const auto rows = tx.exec_params(std::string(sql::queries::kendpoint_dead_letters), endpoint_id,
                                     "", 1, id, std::numeric_limits<std::int64_t>::max());
    if (rows.empty()) return std::nullopt;
    return DeadLetterFromRow(rows[0], true);
  });
}

Replayed RecoverEndpoint(Store& store, const std::string& endpoint_id, const std::string& since) {
  if (since.empty()) {
    throw InvalidField("since",
                       "since (--since) is needed: the endpoint's dead letters that died since "
                       "then are sent again (e.g. '2026-11-22 10:00:00Z')");
  }
  std::string since_read;
  OneEndpoint endpoint{endpoint_id, ""};
  Translated([&] {
    pqxx::connection& c = StoreAccess::Connection(store);
    endpoint.created_at = CheckEndpoint(c, endpoint_id);
    // Read once: 'now' or a time without a zone would read differently in each part. Written
    // in UTC to the microsecond, whatever the session's DateStyle (one that writes zone
    // abbreviations reads back in another zone, or not at all).
    pqxx::nontransaction tx(c);
    try {
      since_read = tx.exec_params1(
                         "SELECT CASE WHEN isfinite(t) THEN to_char(t AT TIME ZONE "
                         "'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') ELSE t::text END "
                         "FROM (SELECT $1::timestamptz AS t) s",
                         since)[0]
                       .as<std::string>();
    } catch (const pqxx::data_exception&) {
      throw InvalidField(
          "since", "--since \"" + since + "\" is not a time; write e.g. '2026-11-22 10:00:00Z'");
    }
  });
  return ReplayDeadLetterParts(store, {}, "", endpoint, since_read);
}

std::map<std::string, std::int64_t> LiveRelaysByDestination(Store& store,
                                                            std::chrono::milliseconds expiry) {
  return Translated([&]() -> std::map<std::string, std::int64_t> {
    pqxx::connection& c = StoreAccess::Connection(store);
    pqxx::nontransaction tx(c);
    std::map<std::string, std::int64_t> out;
    for (const auto& r : tx.exec_params(std::string(sql::queries::kstatus_relays),
                                        static_cast<double>(expiry.count()) / 1000.0)) {
      out[r["destination"].as<std::string>()] = r["relays"].as<std::int64_t>();
    }
    return out;
  });
}

std::int64_t BuryDestination(Store& store, const std::string& destination,
                             const std::string& reason) {
  return Translated([&]() -> std::int64_t {
    pqxx::connection& c = StoreAccess::Connection(store);
    // What is queued when it starts: writers still writing to the destination kept it
    // moving their new rows for as long as they wrote (review).
    const auto upto = pqxx::nontransaction(c)
                          .exec1("SELECT coalesce(pg_sequence_last_value("
                                        "'outbox.messages_id_seq'), 0)")[0]
                          .as<std::int64_t>();
    // Batches go on from the last id moved; once the end is reached, one more pass from the
    // start takes what a batch skipped because another transaction held it then.
    std::int64_t total = 0, after = 0;
    bool again = false;
    while (true) {
      pqxx::nontransaction tx(c);
      const auto rows =
          tx.exec_params(std::string(sql::queries::kdead_letter_all), destination, reason, upto,
                         after);
      if (rows.empty()) {
        if (after == 0 || again) return total;
        again = true;
        after = 0;
        continue;
      }
      total += static_cast<std::int64_t>(rows.size());
      for (const auto& row : rows) after = std::max(after, row[0].as<std::int64_t>());
    }
  });
}

std::int64_t PurgeDeadLetters(Store& store, const std::vector<std::int64_t>& ids,
                              const std::string& older_than, const std::string& destination) {
  return Translated([&]() -> std::int64_t {
    pqxx::connection& c = StoreAccess::Connection(store);
    if (ids.empty() && older_than.empty() && destination.empty()) {
      throw std::invalid_argument(
          "purge needs ids, --older-than or --destination; to delete every dead letter say "
          "--older-than '0 seconds'");
    }
    if (!older_than.empty()) CheckOlderThan(c, older_than);
    pqxx::work tx(c);
    const auto r = tx.exec_params(std::string(sql::queries::kdlq_purge), ArrayLiteral(ids),
                                  older_than, destination);
    tx.commit();
    return static_cast<std::int64_t>(r.size());
  });
}

std::int64_t MaxPayloadBytes(Store& store) {
  return Translated([&]() -> std::int64_t {
    pqxx::nontransaction tx(StoreAccess::Connection(store));
    return tx.exec1("SELECT max_payload_bytes FROM outbox.settings")[0].as<std::int64_t>();
  });
}

void RegisterDestinations(Store& store, const std::vector<std::string>& names,
                          const std::string& registered_by) {
  Translated([&] {
    pqxx::nontransaction tx(StoreAccess::Connection(store));
    tx.exec_params(std::string(sql::queries::kregister_destinations), nlohmann::json(names).dump(),
                   registered_by);
  });
}

DestinationRegistry ListRegisteredDestinations(Store& store) {
  return Translated([&]() -> DestinationRegistry {
    pqxx::nontransaction tx(StoreAccess::Connection(store));
    DestinationRegistry out;
    for (const auto& r : tx.exec(std::string(sql::queries::kregistered_destinations))) {
      out.guard = r["guard"].as<bool>();
      if (r["name"].is_null()) continue;  // the settings row alone: nothing registered
      out.destinations.push_back(
          {r["name"].c_str(), r["registered_by"].c_str(), r["registered_at"].c_str()});
    }
    return out;
  });
}

void PauseDestination(Store& store, const std::string& destination, const std::string& reason) {
  Translated([&] {
    pqxx::nontransaction tx(StoreAccess::Connection(store));
    tx.exec_params(std::string(sql::queries::kpause_destination), destination, reason);
  });
}

bool ResumeDestination(Store& store, const std::string& destination) {
  return Translated([&]() -> bool {
    pqxx::nontransaction tx(StoreAccess::Connection(store));
    return !tx.exec_params(std::string(sql::queries::kresume_destination), destination).empty();
  });
}

}  // namespace outbox::relay
