#include "outbox_relay/endpoints.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <regex>
#include <stdexcept>
#include <string_view>

#include "outbox_relay/config.h"
#include "outbox_relay/webhook_url.h"
#include "store_access.h"

namespace outbox::relay {
namespace {

using nlohmann::json;

constexpr const char* kColumns =
    "SELECT e.id, e.destination, e.url, e.description, e.metadata::text AS metadata, "
    "       array_to_json(e.event_types)::text AS event_types, e.headers::text AS headers, "
    "       e.max_in_flight, e.rate_limit, e.enabled, e.disabled_reason, "
    "       e.breaker::text AS breaker, e.adaptive_concurrency, "
    "       to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS created, "
    "       to_char(e.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS updated, "
    "       (SELECT count(*) FROM outbox.endpoint_secrets s WHERE s.endpoint_id = e.id "
    "         AND (s.expires_at IS NULL OR s.expires_at > clock_timestamp()))::int AS secrets, "
    "       coalesce((SELECT s.public_key IS NOT NULL FROM outbox.endpoint_secrets s "
    "                 WHERE s.endpoint_id = e.id ORDER BY s.created_at DESC LIMIT 1), false) "
    "         AS ed25519, "
    "       (SELECT coalesce(json_agg(s.public_key ORDER BY s.created_at DESC), '[]')::text "
    "          FROM outbox.endpoint_secrets s WHERE s.endpoint_id = e.id "
    "           AND s.public_key IS NOT NULL "
    "           AND (s.expires_at IS NULL OR s.expires_at > clock_timestamp())) AS public_keys, ";

// The endpoints' columns and counts; `count_cap` > 0 counts each backlog and dead letters up
// to one row past it (enough to say "more"), 0 counts every row, < 0 none (0 rows).
std::string SelectEndpoints(std::int64_t count_cap) {
  const auto count = [&](const char* table, const char* also) -> std::string {
    if (count_cap < 0) return "0::bigint";
    const std::string rows = std::string("SELECT 1 FROM outbox.") + table +
                             " x WHERE x.endpoint_id = e.id" + also +
                             (count_cap > 0 ? " LIMIT " + std::to_string(count_cap + 1) : "");
    return "(SELECT count(*) FROM (" + rows + ") n)";
  };
  // Its own dead letters, not a deleted endpoint's of the same id (migration 0041).
  return std::string(kColumns) + count("messages", "") + " AS backlog, " +
         count("dead_letters",
               " AND outbox.dead_letter_is_endpoints_own(x.dead_at, x.reason, e.id,"
               " e.created_at)") +
         " AS dead FROM outbox.endpoints e ";
}

EndpointRecord FromRow(const pqxx::row& r, std::int64_t count_cap = 0) {
  EndpointRecord e;
  e.id = r["id"].as<std::string>();
  e.destination = r["destination"].as<std::string>();
  e.url = r["url"].as<std::string>();
  e.description = r["description"].as<std::string>();
  e.metadata = r["metadata"].as<std::string>();
  const auto event_types = json::parse(r["event_types"].c_str());
  for (const auto& t : event_types) {
    e.event_types.push_back(t.get<std::string>());
  }
  const auto headers = json::parse(r["headers"].c_str());
  for (const auto& [k, v] : headers.items()) {
    e.headers[k] = v.is_string() ? v.get<std::string>() : v.dump();
  }
  if (!r["max_in_flight"].is_null()) e.max_in_flight = r["max_in_flight"].as<int>();
  if (!r["rate_limit"].is_null()) e.rate_limit = r["rate_limit"].as<int>();
  e.breaker = r["breaker"].as<std::string>();
  if (!r["adaptive_concurrency"].is_null()) {
    e.adaptive_concurrency = r["adaptive_concurrency"].as<bool>();
  }
  e.enabled = r["enabled"].as<bool>();
  if (!r["disabled_reason"].is_null()) e.disabled_reason = r["disabled_reason"].as<std::string>();
  e.created_at = r["created"].as<std::string>();
  e.updated_at = r["updated"].as<std::string>();
  e.secrets = r["secrets"].as<int>();
  e.signature = r["ed25519"].as<bool>() ? "ed25519" : "hmac";
  const auto public_keys = json::parse(r["public_keys"].c_str());
  for (const auto& k : public_keys) e.public_keys.push_back(k.get<std::string>());
  e.backlog = r["backlog"].as<std::int64_t>();
  e.dead_letters = r["dead"].as<std::int64_t>();
  if (count_cap > 0) {
    e.backlog_capped = e.backlog > count_cap;
    e.dead_letters_capped = e.dead_letters > count_cap;
    e.backlog = std::min(e.backlog, count_cap);
    e.dead_letters = std::min(e.dead_letters, count_cap);
  }
  return e;
}

}  // namespace

bool JsonNestedDeeperThan(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

namespace {

// What the webhook sink decodes (webhook_detail::DecodeBase64): padding only to a whole
// group, and no group of one character, which cannot make a byte. A secret the sink cannot
// decode made the endpoint unusable and dead-lettered its messages (review).
// Matched by hand, not with std::regex: libstdc++'s matcher recurses once per character, and a
// 200 KB secret sent to the management API overflowed the thread's stack and killed the relay
// (review). A real secret is a few dozen characters.
constexpr std::size_t kMaxSecretChars = 1024;
constexpr std::size_t kMaxHeaderNameChars = 255;  // as the SDKs' and the config's

bool ValidSecret(const std::string& s) {
  if (s.size() > kMaxSecretChars) return false;
  const std::size_t underscore = s.find('_');
  if (underscore == std::string::npos) return false;
  const std::string_view prefix(s.data(), underscore);
  if (prefix != "whsec" && prefix != "whsk") return false;
  const std::string encoded = s.substr(underscore + 1);
  const std::size_t padding_at = encoded.find('=');
  const std::size_t body = padding_at == std::string::npos ? encoded.size() : padding_at;
  if (body == 0 || encoded.size() - body > 2) return false;
  for (std::size_t i = 0; i < encoded.size(); ++i) {
    const auto c = static_cast<unsigned char>(encoded[i]);
    const bool base64 = std::isalnum(c) != 0 || c == '+' || c == '/';
    if (i < body ? !base64 : c != '=') return false;
  }
  if (body < encoded.size() && encoded.size() % 4 != 0) return false;
  return body % 4 != 1;
}

constexpr std::size_t kMaxHeaderValueBytes = 8192;

void CheckId(const std::string& id) {
  static const std::regex re("^[A-Za-z0-9_.-]{1,64}$");
  if (id == "." || id == "..") {
    throw InvalidField("id", "endpoint id \"" + id +
                                 "\" is not allowed: HTTP clients drop it from a path "
                                 "(/v1/endpoints/" +
                                 id + "); use a letter or a digit in it");
  }
  if (!std::regex_match(id, re)) {
    throw InvalidField("id", "endpoint id \"" + id +
                                 "\" is not allowed: use 1 to 64 letters, digits, '_', '.' or '-'"
                                 " (it becomes part of the endpoint's ordering keys)");
  }
}

// What AddEndpoint and UpdateEndpoint store, checked first so the error names the field.
json Changes(const EndpointFields& f) {
  json c = json::object();
  if (f.destination) {
    if (f.destination->empty() || Utf8Length(*f.destination) > kMaxDestinationChars) {
      throw InvalidField("destination",
                         "destination must be 1 to 255 characters: the name applications pass to "
                         "outbox.enqueue, configured with `webhook: {endpoints: database}`");
    }
    c["destination"] = *f.destination;
  }
  if (f.url) {
    // The sink's own parser: a URL it cannot read is refused here, not dead-lettered. The SSRF
    // guard is the destination's (its relay config), applied when the endpoint's sink is made
    // (docs/webhooks.md, "Webhook service").
    try {
      ParseWebhookUrl(*f.url);
    } catch (const std::invalid_argument& e) {
      // Not echoed when it may carry credentials.
      const std::string shown =
          f.url->find('@') == std::string::npos ? " \"" + *f.url + "\"" : std::string();
      throw InvalidField("url", "url" + shown + " is not usable: " + e.what() +
                                    "; write e.g. https://customer.example.com/webhooks");
    }
    c["url"] = *f.url;
  }
  if (f.description) c["description"] = *f.description;
  if (f.metadata) {
    if (JsonNestedDeeperThan(*f.metadata, kMaxJsonDepth)) {
      throw InvalidField("metadata", "metadata nests deeper than " + std::to_string(kMaxJsonDepth) +
                                         " levels; flatten it");
    }
    json m = json::parse(*f.metadata, nullptr, false);
    if (m.is_discarded() || !m.is_object()) {
      throw InvalidField("metadata",
                         "metadata must be a JSON object, e.g. '{\"customer\": \"42\"}'");
    }
    c["metadata"] = std::move(m);
  }
  if (f.event_types) {
    for (const auto& t : *f.event_types) {
      if (t.empty()) {
        throw InvalidField(
            "event_types",
            "an event type filter must not be empty; leave the filter out to receive every event");
      }
      // The wildcards the sink knows (EndpointWants): "*", and "prefix.*" (one '*', last).
      const auto stars = std::count(t.begin(), t.end(), '*');
      if (stars > 0 && t != "*" && !(stars == 1 && t.size() > 2 && t.ends_with(".*"))) {
        throw InvalidField("event_types",
                           "event type filter \"" + t +
                               "\" would match only an event type spelt so: '*' is a wildcard "
                               "alone (every event) or as the last part after a dot "
                               "(\"invoice.*\")");
      }
    }
    c["event_types"] = *f.event_types;
  }
  if (f.headers) {
    std::map<std::string, std::string> seen;  // lower-case name -> as written
    for (const auto& [k, v] : *f.headers) {
      std::string lower = k;
      for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (const auto [it, fresh] = seen.emplace(lower, k); !fresh) {
        throw InvalidField("headers", "headers " + it->second + " and " + k +
                                          " are one header (names are case-insensitive); "
                                          "keep one");
      }
      if (k.size() > kMaxHeaderNameChars) {
        throw InvalidField("headers", "a header name is " + std::to_string(k.size()) +
                                          " characters long, the limit is " +
                                          std::to_string(kMaxHeaderNameChars));
      }
      if (!IsHttpToken(k)) {
        throw InvalidField("headers", "header name \"" + k + "\" is not a valid HTTP field name");
      }
      // The webhook sink would skip it at every delivery: refused, as the config refuses it.
      if (const std::string why = OwnedWebhookHeader(k); !why.empty()) {
        throw InvalidField("headers", "header " + k + " cannot be set: " + why + "; remove it");
      }
      // Receivers answer 431 to a header that size, a permanent failure: every message would
      // go to the dead letters.
      if (v.size() > kMaxHeaderValueBytes) {
        throw InvalidField("headers", "header " + k + ": the value is " + std::to_string(v.size()) +
                                          " bytes; at most " +
                                          std::to_string(kMaxHeaderValueBytes));
      }
      for (const char ch : v) {
        const auto u = static_cast<unsigned char>(ch);
        if ((u < 0x20 && u != '\t') || u == 0x7F) {
          throw InvalidField("headers", "header " + k + ": the value contains a control character");
        }
      }
    }
    c["headers"] = *f.headers;
  }
  if (f.max_in_flight) {
    if (*f.max_in_flight < 0 || *f.max_in_flight > 1024) {
      throw InvalidField(
          "max_in_flight",
          "max_in_flight must be 1 to 1024 concurrent requests (0: the destination's setting)");
    }
    c["max_in_flight"] = *f.max_in_flight;
  }
  if (f.breaker) {
    if (JsonNestedDeeperThan(*f.breaker, kMaxJsonDepth)) {
      throw InvalidField("breaker",
                         "breaker nests deeper than " + std::to_string(kMaxJsonDepth) +
                             " levels; it takes numbers, e.g. {\"failure_threshold\": 5}");
    }
    json b = json::parse(*f.breaker, nullptr, false);
    if (b.is_discarded() || !b.is_object()) {
      throw InvalidField("breaker",
                         "breaker must be a JSON object, e.g. '{\"failure_threshold\": 5, "
                         "\"cooldown_ms\": 10000}'; {} for the destination's settings");
    }
    for (const auto& [key, value] : b.items()) {
      const bool is_int = value.is_number_integer();
      const long long v = is_int ? value.get<long long>() : 0;
      if (key == "enabled" && value.is_boolean()) continue;
      if (key == "failure_threshold" && is_int && v >= 1 && v <= 1'000'000) continue;
      if ((key == "cooldown_ms" || key == "max_cooldown_ms") && is_int && v >= 1 &&
          v <= 86'400'000) {
        continue;
      }
      throw InvalidField("breaker",
                         "breaker." + key +
                             ": the keys are enabled (true/false), failure_threshold (1 to "
                             "1000000), cooldown_ms and max_cooldown_ms (1 to 86400000)");
    }
    if (b.contains("cooldown_ms") && b.contains("max_cooldown_ms") &&
        b["cooldown_ms"].get<long long>() > b["max_cooldown_ms"].get<long long>()) {
      throw InvalidField("breaker", "breaker.cooldown_ms is greater than breaker.max_cooldown_ms");
    }
    c["breaker"] = std::move(b);
  }
  if (f.adaptive_concurrency) {
    const std::string& a = *f.adaptive_concurrency;
    if (a != "true" && a != "false" && !a.empty()) {
      throw InvalidField("adaptive_concurrency",
                         "adaptive_concurrency must be true, false, or empty for the "
                         "destination's setting");
    }
    c["adaptive_concurrency"] = a.empty() ? json() : json(a == "true");
  }
  if (f.rate_limit) {
    if (*f.rate_limit < 0 || *f.rate_limit > 1'000'000) {
      throw InvalidField("rate_limit",
                         "rate_limit must be 1 to 1000000 requests per second (0: no limit of its "
                         "own, the destination's)");
    }
    c["rate_limit"] = *f.rate_limit;
  }
  if (f.enabled) c["enabled"] = *f.enabled;
  return c;
}

constexpr const char* kNewSecret =
    "'whsec_' || encode(decode(replace(gen_random_uuid()::text, '-', '') || "
    "replace(gen_random_uuid()::text, '-', ''), 'hex'), 'base64')";

std::string Base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string PublicKeyOf(EVP_PKEY* key) {
  std::string pub(32, '\0');
  std::size_t len = pub.size();
  if (EVP_PKEY_get_raw_public_key(key, reinterpret_cast<unsigned char*>(pub.data()), &len) != 1) {
    throw std::runtime_error("cannot read an ed25519 public key");
  }
  pub.resize(len);
  return pub;
}

// What to store for a new key: the secret, and for ed25519 the public key. `given`: the
// caller's own (whsec_ or whsk_); otherwise a new random one of `kind` ("" when the database
// makes it: HMAC).
RotatedKey KeyToStore(const std::optional<std::string>& given, const std::string& kind) {
  RotatedKey k;
  if (given) {
    if (given->size() > kMaxSecretChars) {
      throw InvalidField("secret", "secret is " + std::to_string(given->size()) +
                                       " characters long, the limit is " +
                                       std::to_string(kMaxSecretChars) +
                                       "; a Standard Webhooks key is a few dozen");
    }
    if (!ValidSecret(*given)) {
      throw InvalidField("secret",
                         "secret must be a Standard Webhooks key: \"whsec_\" + base64 (HMAC) or "
                         "\"whsk_\" + base64 of a 32-byte ed25519 seed; leave it out to have one "
                         "generated");
    }
    k.secret = *given;
    if (given->rfind("whsec_", 0) == 0) {
      // ValidSecret checked the base64: its length says the key's.
      const std::string encoded = given->substr(6);
      const std::size_t chars =
          encoded.find('=') == std::string::npos ? encoded.size() : encoded.find('=');
      if (const auto why = HmacKeyLengthProblem(chars * 3 / 4); !why.empty()) {
        throw InvalidField("secret", "secret " + why);
      }
    }
    if (given->rfind("whsk_", 0) != 0) return k;
    std::string padded = given->substr(5);
    while (padded.size() % 4) padded += '=';
    std::string raw(padded.size() / 4 * 3, '\0');
    const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(raw.data()),
                                  reinterpret_cast<const unsigned char*>(padded.data()),
                                  static_cast<int>(padded.size()));
    const std::size_t pad = padded.size() - padded.find_last_not_of('=') - 1;
    if (n < 0 ||
        (static_cast<std::size_t>(n) - pad != 32 && static_cast<std::size_t>(n) - pad != 64)) {
      throw InvalidField("secret",
                         "an ed25519 key must be \"whsk_\" + base64 of its 32-byte seed "
                         "(or 64 bytes: seed and public key)");
    }
    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
        EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr,
                                     reinterpret_cast<const unsigned char*>(raw.data()), 32),
        EVP_PKEY_free);
    if (!key) throw InvalidField("secret", "not an ed25519 private key");
    k.public_key = "whpk_" + Base64(PublicKeyOf(key.get()));
    return k;
  }
  if (kind != "ed25519") return k;  // the database makes an HMAC secret
  EVP_PKEY* raw = nullptr;
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> ctx(
      EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr), EVP_PKEY_CTX_free);
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) != 1 || EVP_PKEY_keygen(ctx.get(), &raw) != 1) {
    throw std::runtime_error("cannot generate an ed25519 key");
  }
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(raw, EVP_PKEY_free);
  std::string seed(32, '\0');
  std::size_t len = seed.size();
  if (EVP_PKEY_get_raw_private_key(key.get(), reinterpret_cast<unsigned char*>(seed.data()),
                                   &len) != 1) {
    throw std::runtime_error("cannot read an ed25519 private key");
  }
  const std::string pub = PublicKeyOf(key.get());
  k.secret = "whsk_" + Base64(seed + pub);
  k.public_key = "whpk_" + Base64(pub);
  return k;
}

// Stores `k` (or a new HMAC secret when k.secret is empty) as the endpoint's newest secret;
// returns what to show: the HMAC secret, or nothing for ed25519 (its public key is in k).
RotatedKey StoreKey(pqxx::work& tx, const std::string& id, RotatedKey k) {
  const auto s = tx.exec_params(
      std::string("INSERT INTO outbox.endpoint_secrets (endpoint_id, secret, public_key) "
                  "VALUES ($1, coalesce(nullif($2, ''), ") +
          kNewSecret + "), nullif($3, '')) RETURNING secret",
      id, k.secret, k.public_key);
  if (k.public_key.empty()) {
    k.secret = s[0][0].as<std::string>();
  } else {
    k.secret.clear();  // an ed25519 private key is never shown
  }
  return k;
}

// The endpoint's move lock (migration 0018), exclusively, waited for up to kEndpointLockWait:
// a replay part holds it shared while it waits for its keys' locks, which an application's
// transaction left open can hold for as long as it stays open, and a delete or a move waiting
// behind it held the management API's connection (and every request after it) meanwhile.
// `writers_lock`: the writers' lock (7079, 2) too, shared, as a move takes it after the
// endpoint's (a bucket count change waiting for it, behind a replay part, would otherwise
// hold the move as long).
void TakeEndpointMoveLock(pqxx::work& tx, const std::string& id, bool writers_lock = false) {
  tx.exec("SET LOCAL lock_timeout = " +
          std::to_string(std::chrono::milliseconds(kEndpointLockWait).count()));
  try {
    tx.exec_params("SELECT pg_advisory_xact_lock(outbox.endpoint_lock_key($1))", id);
    if (writers_lock) tx.exec("SELECT pg_advisory_xact_lock_shared(7079, 2)");
  } catch (const pqxx::sql_error& e) {
    if (e.sqlstate() != "55P03") throw;
    throw EndpointBusy("endpoint " + id + " is busy: a replay to it, a relay writing its rows " +
                       "or a change of the bucket count held it for " +
                       std::to_string(kEndpointLockWait.count()) +
                       " s; nothing changed, try again in a few seconds (a replay waits behind "
                       "transactions left open: `outbox-relay status` shows the oldest)");
  }
  tx.exec("SET LOCAL lock_timeout TO DEFAULT");
}

EndpointExists IdTaken(const std::string& id) {
  return EndpointExists("id", "an endpoint with id \"" + id +
                                  "\" already exists; choose another --id, or change it with "
                                  "`outbox-relay endpoints update`");
}

// Dead-letters the queued rows of endpoint `id` that no relay has in flight: a deleted
// endpoint's, which must not go to the next endpoint given its id (its URL, its secret, its
// event types). Returns how many rows of it a relay still has in flight.
std::int64_t BuryRowsOfDeletedEndpoint(pqxx::work& tx, const std::string& id) {
  tx.exec_params(
      "WITH moved AS ("
      "  DELETE FROM outbox.messages WHERE endpoint_id = $1 AND lease_owner IS NULL "
      "  RETURNING *) "
      "INSERT INTO outbox.dead_letters (id, destination, ordering_key, idempotency_key, "
      "                                 event_type, headers, payload, payload_bytes, attempts, "
      "                                 reason, last_error, created_at, endpoint_id) "
      "SELECT id, destination, ordering_key, idempotency_key, event_type, headers, payload, "
      "       payload_bytes, attempts, 'endpoint ' || $1 || ' was deleted', last_error, "
      "       created_at, endpoint_id "
      "FROM moved",
      id);
  return tx.exec_params1("SELECT count(*) FROM outbox.messages WHERE endpoint_id = $1", id)[0]
      .as<std::int64_t>();
}

}  // namespace

CreatedEndpoint AddEndpoint(Store& store, const EndpointFields& fields) {
  if (!fields.destination)
    throw InvalidField("destination", "name the destination (--destination)");
  if (!fields.url) throw InvalidField("url", "give the endpoint's url (--url)");
  if (fields.id) CheckId(*fields.id);
  const std::string kind = fields.signature.value_or("hmac");
  if (kind != "hmac" && kind != "ed25519") {
    throw InvalidField("signature", "signature must be \"hmac\" (default) or \"ed25519\"");
  }
  if (fields.secret && fields.signature &&
      (fields.secret->rfind("whsk_", 0) == 0) != (kind == "ed25519")) {
    throw InvalidField("secret", "a " + kind + " endpoint takes a " +
                                     (kind == "ed25519" ? "whsk_" : "whsec_") + " secret");
  }
  const RotatedKey key = KeyToStore(fields.secret, kind);
  json c = Changes(fields);
  if (fields.id) c["id"] = *fields.id;
  return Translated([&]() -> CreatedEndpoint {
    pqxx::connection& conn = StoreAccess::Connection(store);
    pqxx::work tx(conn);
    pqxx::result r;
    // Rows left by a deleted endpoint of this id (its retries came back after the delete) are
    // dead-lettered; while a relay still has some in flight, the id waits. After a delete of
    // the id under way, which holds the move lock until it commits: seen before it commits,
    // the endpoint was still there, the check was skipped, and the insert (waiting for the
    // delete on the id's index entry) let the deleted endpoint's rows in flight through.
    if (fields.id) {
      // An id taken is refused at once (waiting for its lock, behind a replay to it, answered
      // "busy, try again" where the answer is "taken"); one being deleted counts as taken.
      if (!tx.exec_params("SELECT 1 FROM outbox.endpoints WHERE id = $1", *fields.id).empty()) {
        throw IdTaken(*fields.id);
      }
      TakeEndpointMoveLock(tx, *fields.id);
      if (const auto in_flight = BuryRowsOfDeletedEndpoint(tx, *fields.id); in_flight > 0) {
        throw EndpointExists(
            "id", "endpoint id \"" + *fields.id + "\" still has " + std::to_string(in_flight) +
                      " message(s) of a deleted endpoint with that id in flight; add it again "
                      "once a relay has settled them (within a request's timeout_ms), or choose "
                      "another --id");
      }
    }
    try {
      r = tx.exec_params(
          "INSERT INTO outbox.endpoints (id, destination, url, description, metadata, "
          "                              event_types, headers, max_in_flight, rate_limit, enabled, "
          "                              breaker, adaptive_concurrency) "
          "SELECT coalesce(c->>'id', 'ep_' || replace(gen_random_uuid()::text, '-', '')), "
          "       c->>'destination', c->>'url', coalesce(c->>'description', ''), "
          "       coalesce(c->'metadata', '{}'), "
          "       ARRAY(SELECT jsonb_array_elements_text(coalesce(c->'event_types', '[]'))), "
          "       coalesce(c->'headers', '{}'), nullif((c->>'max_in_flight')::int, 0), "
          "       nullif((c->>'rate_limit')::int, 0), "
          "       coalesce((c->>'enabled')::boolean, true), coalesce(c->'breaker', '{}'), "
          "       (c->>'adaptive_concurrency')::boolean "
          "FROM (SELECT $1::jsonb AS c) x RETURNING id",
          c.dump());
    } catch (const pqxx::unique_violation&) {
      throw IdTaken(c.value("id", std::string()));
    }
    const std::string id = r[0][0].as<std::string>();
    const RotatedKey stored = StoreKey(tx, id, key);
    CreatedEndpoint out;
    out.secret = stored.secret;
    out.public_key = stored.public_key;
    out.endpoint = FromRow(tx.exec_params1(SelectEndpoints(0) + "WHERE e.id = $1", id));
    tx.commit();
    return out;
  });
}

EndpointPage ListEndpointsPage(Store& store, const std::string& destination, int limit,
                               const std::optional<EndpointCursor>& after) {
  return Translated([&]() -> EndpointPage {
    pqxx::nontransaction tx(StoreAccess::Connection(store));
    EndpointPage page;
    // One more than the page holds tells whether another page follows.
    const auto rows = tx.exec_params(
        SelectEndpoints(kListCountCap) +
            "WHERE ($1 = '' OR e.destination = $1) "
            "  AND (NOT $3 OR (e.destination, e.id) > ($4::text, $5::text)) "
            "ORDER BY e.destination, e.id LIMIT $2",
        destination, limit + 1, after.has_value(), after ? after->destination : std::string(),
        after ? after->id : std::string());
    for (const auto& r : rows) {
      if (static_cast<int>(page.endpoints.size()) == limit) {
        page.more = true;
        break;
      }
      page.endpoints.push_back(FromRow(r, kListCountCap));
    }
    return page;
  });
}

std::vector<EndpointRecord> ListEndpoints(Store& store, const std::string& destination) {
  std::vector<EndpointRecord> out;
  std::optional<EndpointCursor> after;
  while (true) {
    EndpointPage page = ListEndpointsPage(store, destination, 1000, after);
    std::move(page.endpoints.begin(), page.endpoints.end(), std::back_inserter(out));
    if (!page.more) return out;
    after = EndpointCursor{out.back().destination, out.back().id};
  }
}

std::optional<EndpointRecord> GetEndpoint(Store& store, const std::string& id,
                                          EndpointCounts counts) {
  return Translated([&]() -> std::optional<EndpointRecord> {
    pqxx::nontransaction tx(StoreAccess::Connection(store));
    const auto r = tx.exec_params(
        SelectEndpoints(counts == EndpointCounts::kAll ? 0 : -1) + "WHERE e.id = $1", id);
    if (r.empty()) return std::nullopt;
    return FromRow(r[0]);
  });
}

bool UpdateEndpoint(Store& store, const std::string& id, const EndpointFields& fields) {
  if (fields.id || fields.secret) {
    throw InvalidField(
        fields.id ? "id" : "secret",
        "an endpoint's id cannot change, and its secret changes with `endpoints rotate-secret`");
  }
  const json c = Changes(fields);
  return Translated([&]() -> bool {
    pqxx::work tx(StoreAccess::Connection(store));
    if (c.contains("destination")) {
      // The move lock (migration 0018), alone: a settle writing what a fan-out leaves this
      // endpoint tries it shared and puts the fan-out aside while the move runs; one under way
      // is waited for, and its rows are then in the queue for the sweep below.
      TakeEndpointMoveLock(tx, id, /*writers_lock=*/true);
    }
    const auto r = tx.exec_params(
        "UPDATE outbox.endpoints e SET "
        "  destination = coalesce(c->>'destination', e.destination), "
        "  url = coalesce(c->>'url', e.url), "
        "  description = coalesce(c->>'description', e.description), "
        "  metadata = coalesce(c->'metadata', e.metadata), "
        "  event_types = CASE WHEN c ? 'event_types' "
        "                THEN ARRAY(SELECT jsonb_array_elements_text(c->'event_types')) "
        "                ELSE e.event_types END, "
        "  headers = coalesce(c->'headers', e.headers), "
        "  max_in_flight = CASE WHEN NOT c ? 'max_in_flight' THEN e.max_in_flight "
        "                  ELSE nullif((c->>'max_in_flight')::int, 0) END, "
        "  breaker = coalesce(c->'breaker', e.breaker), "
        "  adaptive_concurrency = CASE WHEN c ? 'adaptive_concurrency' "
        "                         THEN (c->>'adaptive_concurrency')::boolean "
        "                         ELSE e.adaptive_concurrency END, "
        "  rate_limit = CASE WHEN NOT c ? 'rate_limit' THEN e.rate_limit "
        "               ELSE nullif((c->>'rate_limit')::int, 0) END, "
        "  updated_at = clock_timestamp() "
        "FROM (SELECT $2::jsonb AS c) x WHERE e.id = $1",
        id, c.dump());
    if (r.affected_rows() > 0 && c.contains("destination")) {
      // What the endpoint still owes goes with it: left in the old destination, whose service
      // no longer loads the endpoint, its rows were dead-lettered as "no longer exists
      // (deleted)", and a replay put them back there to die again. Rebucketed for the new
      // destination (its name is in the hash), under the writers' shared lock as
      // set_bucket_count expects (migration 0014), taken with the move lock above.
      const std::string to = c["destination"].get<std::string>();
      tx.exec_params(
          "UPDATE outbox.messages m SET destination = $2, "
          "  bucket = CASE WHEN m.ordering_key IS NULL THEN m.bucket % p.bucket_count "
          "           ELSE (hashtextextended($2 || chr(31) || m.ordering_key, 0) & 32767)"
          "                % p.bucket_count END "
          "FROM outbox.partitioning p WHERE m.endpoint_id = $1 AND m.destination <> $2",
          id, to);
      tx.exec_params(
          "UPDATE outbox.dead_letters SET destination = $2 "
          "WHERE endpoint_id = $1 AND destination <> $2",
          id, to);
    }
    tx.commit();
    return r.affected_rows() > 0;
  });
}

EnableChange SetEndpointEnabled(Store& store, const std::string& id, bool enabled,
                                const std::string& reason) {
  return Translated([&]() -> EnableChange {
    pqxx::work tx(StoreAccess::Connection(store));
    const auto now =
        tx.exec_params("SELECT enabled FROM outbox.endpoints WHERE id = $1 FOR NO KEY UPDATE", id);
    if (now.empty()) return EnableChange::kNoSuchEndpoint;
    if (now[0][0].as<bool>() == enabled) return EnableChange::kUnchanged;
    if (enabled) {
      // What waited while it was disabled (or for a retry) goes now, in order: rows blocked
      // behind their key ('infinity') stay so. Before the endpoint's own row, whose update
      // takes the registry's lock (its version trigger): that lock, which every endpoint change
      // and every relay's automatic disable waits for, is held from there to the commit, not
      // through this update of the endpoint's whole backlog (review). A relay that claims a
      // woken row before it sees the change holds it as disabled, and wakes it again when it
      // does (PostgresEndpointDirectory::WakeEndpoint).
      const auto woken = tx.exec_params(
          "UPDATE outbox.messages SET deliver_after = clock_timestamp() "
          "WHERE endpoint_id = $1 AND parked AND lease_owner IS NULL "
          "  AND deliver_after > clock_timestamp() AND deliver_after <> 'infinity'",
          id);
      // At once, not at the relays' next poll: wakes them as a new message does (on commit).
      if (woken.affected_rows() > 0) tx.exec("SELECT pg_notify('outbox_messages', '')");
      // A fresh start: the failures before it was disabled do not count towards disabling it
      // automatically again.
      tx.exec_params(
          "UPDATE outbox.endpoint_health SET failing_since = NULL WHERE endpoint_id = $1", id);
    }
    // enabled_at: this transaction's start (now()), before the wake above read the backlog;
    // what a relay holds as disabled from then on, it wakes again when it sees the change.
    tx.exec_params(
        "UPDATE outbox.endpoints SET enabled = $2, "
        "  disabled_reason = CASE WHEN $2 THEN NULL ELSE nullif($3, '') END, "
        "  enabled_at = CASE WHEN $2 THEN now() ELSE enabled_at END, "
        "  updated_at = clock_timestamp() WHERE id = $1",
        id, enabled, reason);
    tx.commit();
    return EnableChange::kChanged;
  });
}

bool DeleteEndpoint(Store& store, const std::string& id) {
  return Translated([&]() -> bool {
    pqxx::work tx(StoreAccess::Connection(store));
    // The move lock (migration 0018), as a move takes it: a settle writing what a fan-out
    // leaves this endpoint holds it shared from reading where the endpoint is until it
    // commits, and is waited for, so the sweep below sees its rows; later settles find the
    // endpoint gone (their copies become dead letters of it: settle.sql).
    TakeEndpointMoveLock(tx, id);
    const auto r = tx.exec_params("DELETE FROM outbox.endpoints WHERE id = $1", id);
    // Its queued rows with it (dead letters, to inspect or replay); those in flight are the
    // relays' (settled, or dead-lettered as deleted when claimed again).
    if (r.affected_rows() > 0) BuryRowsOfDeletedEndpoint(tx, id);
    tx.commit();
    return r.affected_rows() > 0;
  });
}

RotatedKey RotateEndpointSecret(Store& store, const std::string& id, std::chrono::seconds overlap,
                                const std::optional<std::string>& secret) {
  if (overlap.count() < 0 || overlap > kMaxSecretOverlap) {
    throw InvalidField("overlap", "the overlap must be 0 to " +
                                      std::to_string(kMaxSecretOverlap.count()) +
                                      " seconds (365 days)");
  }
  if (secret) KeyToStore(secret, "");  // checks it before anything is written
  return Translated([&]() -> RotatedKey {
    pqxx::work tx(StoreAccess::Connection(store));
    if (tx.exec_params("SELECT 1 FROM outbox.endpoints WHERE id = $1 FOR UPDATE", id).empty()) {
      throw NoSuchEndpoint(id);
    }
    const auto newest = tx.exec_params(
        "SELECT secret LIKE 'whsk\\_%' FROM outbox.endpoint_secrets WHERE endpoint_id = $1 "
        "ORDER BY created_at DESC LIMIT 1",
        id);
    const bool ed25519 = !newest.empty() && newest[0][0].as<bool>();
    if (secret && secret->starts_with("whsk_") != ed25519) {
      throw InvalidField("secret", std::string("the endpoint signs with ") +
                                       (ed25519 ? "ed25519 (whsk_ keys)" : "HMAC (whsec_ keys)") +
                                       ", and a rotated secret must be of its kind, or its "
                                       "receivers' checks fail once the overlap ends; give a " +
                                       (ed25519 ? "whsk_" : "whsec_") +
                                       " key, or add a new endpoint to change the kind");
    }
    const RotatedKey key = KeyToStore(secret, ed25519 ? "ed25519" : "hmac");
    // Secrets that sign now stop after the overlap; those already expired are dropped.
    tx.exec_params(
        "UPDATE outbox.endpoint_secrets "
        "SET expires_at = least(coalesce(expires_at, 'infinity'), "
        "                       clock_timestamp() + make_interval(secs => $2)) "
        "WHERE endpoint_id = $1",
        id, static_cast<double>(overlap.count()));
    tx.exec_params(
        "DELETE FROM outbox.endpoint_secrets WHERE endpoint_id = $1 "
        "AND expires_at <= clock_timestamp()",
        id);
    const RotatedKey stored = StoreKey(tx, id, key);
    tx.exec_params("UPDATE outbox.endpoints SET updated_at = clock_timestamp() WHERE id = $1", id);
    tx.commit();
    return stored;
  });
}

namespace {

void CheckUuid(const std::string& text, const char* what) {
  static const std::regex re(
      "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$");
  if (!text.empty() && !std::regex_match(text, re)) {
    throw InvalidField("message", std::string(what) + " \"" + text +
                                      "\" is not a uuid: give the message's idempotency key or the "
                                      "webhook-id a receiver got");
  }
}

}  // namespace

std::vector<AttemptRecord> ListAttempts(Store& store, const std::string& endpoint_id,
                                        const std::string& message, int limit,
                                        std::int64_t before) {
  CheckUuid(message, "--message");
  return Translated([&]() -> std::vector<AttemptRecord> {
    pqxx::nontransaction tx(StoreAccess::Connection(store));
    std::vector<AttemptRecord> out;
    const auto rows = tx.exec_params(
        "SELECT a.id, a.endpoint_id, a.destination, a.delivery_id::text AS delivery_id,"
        "  to_char(a.attempted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS at,"
        "  a.status, a.outcome, a.latency_ms, a.error, coalesce(a.response_body, '') AS body "
        "FROM outbox.delivery_attempts a "
        "WHERE ($1 = '' OR a.endpoint_id = $1) AND ($2 = '' OR a.delivery_id = nullif($2, '')::uuid"
        "  OR a.delivery_id IN (SELECT outbox.endpoint_delivery_id(nullif($2, '')::uuid, e.id)"
        "                        FROM outbox.endpoints e)) "
        "  AND ($4::bigint = 0 OR a.id < $4::bigint) "
        "ORDER BY a.id DESC LIMIT $3",
        endpoint_id, message, limit, before);
    for (const auto& r : rows) {
      AttemptRecord a;
      a.id = r["id"].as<std::int64_t>();
      a.endpoint_id = r["endpoint_id"].as<std::string>();
      a.destination = r["destination"].as<std::string>();
      a.delivery_id = r["delivery_id"].as<std::string>();
      a.attempted_at = r["at"].as<std::string>();
      if (!r["status"].is_null()) a.status = r["status"].as<int>();
      a.outcome = r["outcome"].as<std::string>();
      a.latency_ms = r["latency_ms"].as<int>();
      if (!r["error"].is_null()) a.error = r["error"].as<std::string>();
      a.response_body = r["body"].as<std::string>();
      out.push_back(std::move(a));
    }
    return out;
  });
}

namespace {

// A replay's run holds this lock (shared: two calls of one replay run it together) on its
// connection, at the session's level, from its beginning until it returns; PostgreSQL
// releases it with the connection. GetEndpointReplay reads "running" from it (migration 0040).
constexpr const char* kReplayRunLock = "7080, ($1::bigint % 2147483648)::int";

// On a connection that is still open: a lost one took the lock with it, and the store would
// connect again only to be told it holds no such lock (slowly, with the database away).
void ReleaseReplayRunLock(Store& store, std::int64_t replay_id) noexcept {
  if (!store.Connected()) return;
  try {
    pqxx::nontransaction n(StoreAccess::Connection(store));
    n.exec_params(std::string("SELECT pg_advisory_unlock_shared(") + kReplayRunLock + ")",
                  replay_id);
  } catch (...) {
    // The connection is gone, and the lock with it.
  }
}

// An endpoint replay as EndpointReplay has it, unfinished (outbox.endpoint_replays) or finished
// (outbox.endpoint_replays_finished, migration 0040); "running" when a connection holds its
// run's lock (in this database: the tests' databases share a server). What the next replay's
// beginning deletes (a day after its last change) is gone already.
std::string ReplaysWhere(const std::string& where) {
  const std::string utc = "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'";
  const auto at = [&](const std::string& column) {
    return "to_char(" + column + " AT TIME ZONE 'UTC', " + utc + ")";
  };
  return "SELECT r.id, r.endpoint_id,"
         "  CASE WHEN r.message <> '' THEN '' WHEN NOT isfinite(r.since) THEN r.since::text"
         "       ELSE " +
         at("r.since") +
         " END AS since,"
         "  r.message, r.queued, " +
         at("r.started_at") + " AS began, " + at("r.updated_at") + " AS updated_at, coalesce(" +
         at("r.finished_at") +
         ", '') AS finished_at, coalesce(r.error, '') AS error,"
         "  CASE WHEN r.finished_at IS NOT NULL THEN 'finished'"
         "       WHEN EXISTS (SELECT 1 FROM pg_locks l"
         "                    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2"
         "                      AND l.database = (SELECT oid FROM pg_database"
         "                                        WHERE datname = current_database())"
         "                      AND l.classid = 7080 AND l.objid::bigint = r.id % 2147483648)"
         "         THEN 'running'"
         "       ELSE 'failed' END AS status "
         "FROM (SELECT id, endpoint_id, since, message, queued, started_at, updated_at,"
         "        NULL::timestamptz AS finished_at, error FROM outbox.endpoint_replays"
         "      WHERE updated_at > clock_timestamp() - interval '1 day'"
         "      UNION ALL"
         "      SELECT id, endpoint_id, since, message, queued, started_at, finished_at,"
         "        finished_at, NULL FROM outbox.endpoint_replays_finished"
         "      WHERE finished_at > clock_timestamp() - interval '1 day') r "
         "WHERE " +
         where;
}

EndpointReplay ToReplay(const pqxx::row& r) {
  EndpointReplay e;
  e.id = r["id"].as<std::int64_t>();
  e.endpoint_id = r["endpoint_id"].as<std::string>();
  e.since = r["since"].as<std::string>();
  e.message = r["message"].as<std::string>();
  e.status = r["status"].as<std::string>();
  e.queued = r["queued"].as<std::int64_t>();
  e.began = r["began"].as<std::string>();
  e.updated_at = r["updated_at"].as<std::string>();
  e.finished_at = r["finished_at"].as<std::string>();
  // Why it failed; a run's error may outlive it while another run of the replay goes on.
  e.error = e.status == "failed" ? r["error"].as<std::string>() : "";
  if (e.status == "failed" && e.error.empty()) {
    e.error =
        "no relay is running it: the one running it stopped, or lost its connection to the "
        "database; ask for the same replay again to resume it";
  }
  return e;
}

}  // namespace

ReplayOutcome ReplayToEndpoint(Store& store, const std::string& endpoint_id,
                               const std::string& since, const std::string& message,
                               bool restart) {
  return RunEndpointReplay(store, BeginEndpointReplay(store, endpoint_id, since, message, restart));
}

ReplayOutcome BeginEndpointReplay(Store& store, const std::string& endpoint_id,
                                  const std::string& since, const std::string& message,
                                  bool restart) {
  CheckUuid(message, "--message");
  if (since.empty() == message.empty()) {
    throw InvalidField(
        "since",
        "give exactly one of --since TIME (everything delivered since then) and --message UUID "
        "(one message)");
  }
  return Translated([&]() -> ReplayOutcome {
    // The replay keeps its place in outbox.endpoint_replays (0022), in the same transaction
    // as each part: one that fails part-way, asked again, goes on from there instead of
    // queueing again what it queued before and the relay has delivered since. Its place
    // holds what was archived when it began (upto), and nothing archived since: with the
    // relay running, a copy this replay queued may be delivered and archived (as a row of
    // the endpoint) before the next part is read, and was replayed again. Copies take ids
    // from the sequence, above every id archived before. `since` is read once, here: a time
    // such as 'today' or one without a zone would read differently later.
    const std::string since_at = since.empty() ? "-infinity" : since;
    ReplayOutcome out;
    out.endpoint_id = endpoint_id;
    std::exception_ptr commit_failed;
    // Its session ends with its connection, locks and all, though a part waits on a lock.
    EndWithLostClient(StoreAccess::Connection(store));
    {
      pqxx::work tx(StoreAccess::Connection(store));
      const auto endpoint = tx.exec_params(
          std::string("SELECT ") + kEndpointCreatedAt + " FROM outbox.endpoints WHERE id = $1",
          endpoint_id);
      if (endpoint.empty()) {
        throw NoSuchEndpoint(endpoint_id);
      }
      out.endpoint_created_at = endpoint[0][0].as<std::string>();
      if (!since.empty()) {
        try {
          tx.exec_params("SELECT $1::timestamptz", since);
        } catch (const pqxx::data_exception&) {
          throw InvalidField("since", "--since \"" + since +
                                          "\" is not a time; write e.g. '2026-11-22 10:00:00Z'");
        }
      }
      // A run of the same replay holds its row for each of its parts, and a part waits behind
      // an application's open transaction for as long as it stays open: asked again meanwhile
      // (with `Prefer: respond-async`, to be answered at once), it waited as long (review).
      tx.exec("SET LOCAL lock_timeout = " +
              std::to_string(std::chrono::milliseconds(kEndpointLockWait).count()));
      pqxx::row row;
      try {
        // Replays of any endpoint that stopped part-way more than a day ago go, with the delivery
        // ids they kept (migration 0039), which may be an archive's worth: they would only start
        // over. So do those that finished more than a day ago (migration 0040).
        tx.exec(
            "DELETE FROM outbox.endpoint_replays "
            "WHERE updated_at < clock_timestamp() - interval '1 day'");
        tx.exec(
            "DELETE FROM outbox.endpoint_replays_finished "
            "WHERE finished_at < clock_timestamp() - interval '1 day'");
        // The same replay stopped part-way less than a day ago is resumed; one that stopped
        // longer ago, or asked to restart, starts over, with the archive as it is now. One that
        // finished is in outbox.endpoint_replays_finished: asked again, the replay is a new one.
        row = tx.exec_params1(
            "INSERT INTO outbox.endpoint_replays AS r (endpoint_id, since, message, upto,"
            "  done_through) "
            "SELECT $1, $2::timestamptz, coalesce(nullif($3, '')::uuid::text, ''),"
            "  coalesce(max(id), 0), -9223372036854775808 FROM outbox.delivered_archive "
            "ON CONFLICT (endpoint_id, since, message) DO UPDATE SET"
            "  (upto, done_through, queued, started_at) = ("
            "    SELECT CASE WHEN g.go_on THEN r.upto ELSE excluded.upto END,"
            "           CASE WHEN g.go_on THEN r.done_through ELSE excluded.done_through END,"
            "           CASE WHEN g.go_on THEN r.queued ELSE 0 END,"
            "           CASE WHEN g.go_on THEN r.started_at ELSE clock_timestamp() END"
            "    FROM (SELECT NOT $4::boolean"
            "            AND r.updated_at > clock_timestamp() - interval '1 day' AS go_on) g),"
            "  updated_at = clock_timestamp(), error = NULL "
            "RETURNING r.id, r.queued, r.started_at < statement_timestamp() AS resumed,"
            "  to_char(r.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS began",
            endpoint_id, since_at, message, restart);
      } catch (const pqxx::sql_error& x) {
        if (x.sqlstate() != "55P03") throw;
        throw EndpointBusy(
            "a run of this replay holds it while its part waits for a lock (an application's "
            "transaction left open holds its keys); nothing changed: follow it with GET "
            "/v1/replays/{id} or `outbox-relay endpoints replays " +
            endpoint_id + "`, or ask again in a few seconds");
      }
      tx.exec("SET LOCAL lock_timeout TO DEFAULT");
      out.id = row["id"].as<std::int64_t>();
      out.resumed = row["resumed"].as<bool>();
      out.queued_earlier = out.resumed ? row["queued"].as<std::int64_t>() : 0;
      out.began = row["began"].as<std::string>();
      // Started over (asked to, or stale): what it queued before may be sent again.
      if (!out.resumed) {
        tx.exec_params("DELETE FROM outbox.endpoint_replay_sent WHERE replay_id = $1", out.id);
      }
      // Running from here (a session's lock outlives the transaction), until RunEndpointReplay
      // returns. Last before the commit: a failure after it would leave it held.
      tx.exec_params(std::string("SELECT pg_advisory_lock_shared(") + kReplayRunLock + ")", out.id);
      try {
        tx.commit();
      } catch (...) {
        commit_failed = std::current_exception();
      }
    }  // the transaction ends before its connection is used again
    if (commit_failed) {
      ReleaseReplayRunLock(store, out.id);
      std::rethrow_exception(commit_failed);
    }
    return out;
  });
}

ReplayOutcome RunEndpointReplay(Store& store, ReplayOutcome out,
                                const std::function<bool()>& stop) {
  struct Release {
    Store& store;
    std::int64_t id;
    ~Release() { ReleaseReplayRunLock(store, id); }
  } release{store, out.id};
  const std::int64_t replay_id = out.id;
  const std::string& endpoint_id = out.endpoint_id;
  out.queued = 0;
  out.finished = false;
  return Translated([&]() -> ReplayOutcome {
    try {
      // In parts of kReplayChunk archived messages, each its own transaction: each replayed
      // row of a key takes the key's lock, and a whole archive's worth in one statement filled
      // PostgreSQL's lock table ("out of shared memory").
      constexpr long long kReplayChunk = 500;
      while (!(stop && stop())) {
        pqxx::work tx(StoreAccess::Connection(store));
        // The endpoint's move lock (migration 0018), shared, before the bucket count's as a
        // move takes them: the rows go where the endpoint is, and no move sweeps the queue
        // meanwhile.
        tx.exec_params("SELECT pg_advisory_xact_lock_shared(outbox.endpoint_lock_key($1))",
                       endpoint_id);
        tx.exec("SELECT pg_advisory_xact_lock_shared(7079, 2)");  // as ReplayDeadLetters
        // The place, locked after those: a second call of the same replay waits here and
        // goes on from where this one leaves off. Finished: another call finished it.
        const auto place = tx.exec_params(
            "SELECT upto, done_through, message,"
            "  CASE WHEN message = '' THEN since::text ELSE '' END AS since"
            " FROM outbox.endpoint_replays WHERE id = $1 FOR UPDATE",
            replay_id);
        if (place.empty()) {
          // Gone: another call of it finished the replay, or the endpoint was deleted (its
          // replays go with it, and what they queued that is still queued with its rows).
          if (tx.exec_params("SELECT 1 FROM outbox.endpoints WHERE id = $1 AND created_at = "
                             "$2::timestamptz",
                             endpoint_id, out.endpoint_created_at)
                  .empty()) {
            throw EndpointNotFound("endpoint " + endpoint_id +
                                   " was deleted while the replay ran; it had queued " +
                                   std::to_string(out.queued) +
                                   " message(s), dead-lettered with the endpoint unless already "
                                   "delivered");
          }
          out.finished = true;
          break;
        }
        const long long upto = place[0]["upto"].as<long long>();
        const long long after = place[0]["done_through"].as<long long>();
        const std::string since_read = place[0]["since"].as<std::string>();
        const std::string message_read = place[0]["message"].as<std::string>();
        const auto r = tx.exec_params1(
            "WITH e AS (SELECT * FROM outbox.endpoints WHERE id = $1), picked AS ("
            "  SELECT a.* FROM outbox.delivered_archive a, e"
            "  WHERE a.destination = e.destination AND a.id > $4::bigint AND a.id <= $6::bigint"
            "    AND ($2 = '' OR a.delivered_at >= nullif($2, '')::timestamptz)"
            "    AND ($3 = '' OR a.idempotency_key = nullif($3, '')::uuid"
            "         OR outbox.endpoint_delivery_id(a.idempotency_key, e.id) = nullif($3, "
            "'')::uuid)"
            // The endpoint's own copies: of this endpoint, delivered since it was created (one
            // deleted before it, with its id, is another endpoint).
            "    AND ((a.endpoint_id = e.id AND a.delivered_at >= e.created_at)"
            "         OR (a.endpoint_id IS NULL AND ("
            "         cardinality(e.event_types) = 0 OR a.event_type = ANY(e.event_types)"
            "         OR '*' = ANY(e.event_types)"
            "         OR EXISTS (SELECT 1 FROM unnest(e.event_types) t"
            "                    WHERE t LIKE '%.*' AND starts_with(a.event_type, left(t, -1))))))"
            "  ORDER BY a.id LIMIT $5"
            "), keyed AS ("
            "  SELECT p.*, CASE WHEN p.endpoint_id IS NOT NULL THEN p.ordering_key"
            "                   ELSE e.id || ':' || p.ordering_key END AS key,"
            "         CASE WHEN p.endpoint_id IS NOT NULL THEN p.idempotency_key"
            "              ELSE outbox.endpoint_delivery_id(p.idempotency_key, e.id) END"
            "           AS delivery_id"
            "  FROM picked p, e"
            "), first_time AS ("
            // Each delivery once per replay: a message archived with the endpoint's own copy
            // of it is two rows of one delivery, often in different parts (migration 0039).
            "  INSERT INTO outbox.endpoint_replay_sent (replay_id, delivery_id)"
            "  SELECT DISTINCT $7::bigint, delivery_id FROM keyed"
            "  ON CONFLICT DO NOTHING RETURNING delivery_id"
            "), key_locks AS ("
            // outbox.insert_message's per-key lock, in one global order, before any row takes
            // its id: a replayed row then waits for an uncommitted writer of its key (a dlq
            // replay, a fan-out's settle) instead of being claimed while that writer's row is
            // invisible.
            "  SELECT count(*) AS n FROM (SELECT pg_advisory_xact_lock(k.lock_key) FROM ("
            "    SELECT DISTINCT hashtextextended(destination || chr(31) || key, 7079) AS lock_key"
            "    FROM keyed WHERE key IS NOT NULL) k ORDER BY k.lock_key) l"
            "), inserted AS ("
            "  INSERT INTO outbox.messages (destination, ordering_key, idempotency_key, event_type,"
            "    headers, payload, payload_bytes, deliver_after, parked, created_at, last_error,"
            "    bucket, endpoint_id, due_at) "
            "  SELECT p.destination, p.key, p.delivery_id,"
            "    p.event_type, p.headers, p.payload, p.payload_bytes, clock_timestamp(), true,"
            "    p.created_at, 'replayed from the archive',"
            "    CASE WHEN p.key IS NULL THEN floor(random() * pp.bucket_count)"
            "         ELSE (hashtextextended(p.destination || chr(31) || p.key, 0) & 32767)"
            "              % pp.bucket_count END,"
            // pending since the replay (migration 0025), whatever hands it back
            "    e.id, clock_timestamp() "
            "  FROM keyed p, e, outbox.partitioning pp "
            "  WHERE (SELECT n FROM key_locks) >= 0 "  // every key locked before the first id
            "    AND p.delivery_id IN (SELECT delivery_id FROM first_time)"
            "  ORDER BY p.id "
            "  ON CONFLICT (idempotency_key) DO NOTHING RETURNING 1"
            ") "
            "SELECT (SELECT max(id) FROM picked) AS last, (SELECT count(*) FROM inserted) AS n",
            endpoint_id, since_read, message_read, after, kReplayChunk, upto, replay_id);
        if (r["last"].is_null()) {
          // Done: kept a day among the finished (migration 0040), under its id; the delivery
          // ids it kept go with its row.
          tx.exec_params(
              "WITH done AS (DELETE FROM outbox.endpoint_replays WHERE id = $1 RETURNING *) "
              "INSERT INTO outbox.endpoint_replays_finished (id, endpoint_id, since, message,"
              "  queued, started_at, finished_at) "
              "SELECT id, endpoint_id, since, message, queued, started_at, clock_timestamp()"
              " FROM done",
              replay_id);
          tx.commit();
          out.finished = true;
          break;
        }
        const std::int64_t n = r["n"].as<std::int64_t>();
        // Its place moves in the transaction that queued the part.
        tx.exec_params(
            "UPDATE outbox.endpoint_replays SET done_through = $2::bigint,"
            " queued = queued + $3::bigint, updated_at = clock_timestamp() WHERE id = $1",
            replay_id, r["last"].as<long long>(), n);
        tx.commit();
        out.queued += n;
      }
      return out;
    } catch (const EndpointNotFound&) {
      throw;  // its row went with the endpoint
    } catch (const std::exception& e) {
      // Why it stopped, for GetEndpointReplay, when the connection can still write it (a
      // lost one, or one Store::Interrupt shut, cannot: GetEndpointReplay says so then).
      if (store.Connected()) {
        try {
          pqxx::nontransaction n(StoreAccess::Connection(store));
          n.exec_params("UPDATE outbox.endpoint_replays SET error = $2 WHERE id = $1", replay_id,
                        std::string(e.what()));
        } catch (...) {
        }
      }
      throw;
    }
  });
}

TestEvent SendTestEvent(Store& store, const std::string& endpoint_id, const std::string& event_type,
                        const std::string& payload,
                        const std::function<void(const std::string&)>& check_destination) {
  const std::string type = event_type.empty() ? "webhook.test" : event_type;
  if (type.size() > 255) {
    throw InvalidField("event_type", "event_type is " + std::to_string(type.size()) +
                                         " bytes long, the limit is 255");
  }
  return Translated([&]() -> TestEvent {
    pqxx::work tx(StoreAccess::Connection(store));
    // The endpoint's move lock, shared, before the writers' lock (which outbox.enqueue takes
    // again), as a replay takes them: the row goes where the endpoint is, and a move takes it
    // along. Waited for kEndpointLockWait at most, as a move waits: behind a bucket count
    // change that waits for an application's open transaction, the management API's one
    // connection (and every request after this one) waited as long (review).
    tx.exec("SET LOCAL lock_timeout = " +
            std::to_string(std::chrono::milliseconds(kEndpointLockWait).count()));
    try {
      tx.exec_params("SELECT pg_advisory_xact_lock_shared(outbox.endpoint_lock_key($1))",
                     endpoint_id);
      tx.exec("SELECT pg_advisory_xact_lock_shared(7079, 2)");
    } catch (const pqxx::sql_error& x) {
      if (x.sqlstate() != "55P03") throw;
      throw EndpointBusy("endpoint " + endpoint_id +
                         " is busy: a move or a delete of it, or a change of the bucket count, "
                         "held its locks for " +
                         std::to_string(kEndpointLockWait.count()) +
                         " s; nothing was queued, try again in a few seconds");
    }
    tx.exec("SET LOCAL lock_timeout TO DEFAULT");
    const auto e =
        tx.exec_params("SELECT destination FROM outbox.endpoints WHERE id = $1", endpoint_id);
    if (e.empty()) {
      throw NoSuchEndpoint(endpoint_id);
    }
    // Read under the move lock: where the endpoint is until this commits.
    if (check_destination) check_destination(e[0][0].as<std::string>());
    std::string body = payload;
    if (body.empty()) {
      body = tx.exec_params1(
                   "SELECT jsonb_build_object('type', $1::text, 'endpoint_id', $2::text,"
                   " 'test', true, 'sent_at', to_char(clock_timestamp() AT TIME ZONE "
                   "'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'))::text",
                   type, endpoint_id)[0]
                 .as<std::string>();
    }
    std::int64_t id = 0;
    try {
      tx.exec_params("SELECT $1::jsonb", body);
    } catch (const pqxx::data_exception& x) {
      throw InvalidField("payload", std::string("the payload is not JSON: ") + x.what());
    }
    try {
      // Through outbox.enqueue, with every writer's checks (the payload's size, the
      // destination guard), then made the endpoint's: parked, as its other rows are.
      id = tx.exec_params1("SELECT outbox.enqueue($1, $2::jsonb, NULL, '{}'::jsonb, $3)",
                           e[0][0].as<std::string>(), body, type)[0]
               .as<std::int64_t>();
    } catch (const pqxx::sql_error& x) {
      if (x.sqlstate() == "54000") throw InvalidField("payload", x.what());
      // outbox.validate_message refused the endpoint's destination (the destination guard:
      // no relay config names it).
      if (x.sqlstate() == "22023") throw InvalidField("destination", x.what());
      throw;
    }
    const auto row = tx.exec_params1(
        "UPDATE outbox.messages SET endpoint_id = $2, parked = true WHERE id = $1 "
        "RETURNING idempotency_key::text",
        id, endpoint_id);
    tx.commit();
    return TestEvent{id, row[0].as<std::string>(), type};
  });
}

std::optional<EndpointReplay> GetEndpointReplay(Store& store, std::int64_t id) {
  return Translated([&]() -> std::optional<EndpointReplay> {
    pqxx::read_transaction tx(StoreAccess::Connection(store));
    const auto rows = tx.exec_params(ReplaysWhere("r.id = $1"), id);
    if (rows.empty()) return std::nullopt;
    return ToReplay(rows[0]);
  });
}

std::vector<EndpointReplay> ListEndpointReplays(Store& store, const std::string& endpoint_id) {
  return Translated([&]() -> std::vector<EndpointReplay> {
    pqxx::read_transaction tx(StoreAccess::Connection(store));
    if (tx.exec_params("SELECT 1 FROM outbox.endpoints WHERE id = $1", endpoint_id).empty()) {
      throw NoSuchEndpoint(endpoint_id);
    }
    std::vector<EndpointReplay> out;
    for (const auto& r : tx.exec_params(
             ReplaysWhere("r.endpoint_id = $1 ORDER BY r.id DESC LIMIT 100"), endpoint_id)) {
      out.push_back(ToReplay(r));
    }
    return out;
  });
}

}  // namespace outbox::relay
