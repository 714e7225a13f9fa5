// outbox-relay endpoints add|list|show|update|disable|enable|delete|rotate-secret: the webhook
// service's endpoints, stored in Postgres (docs/webhooks.md, "Webhook service").
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "commands.h"
#include "outbox_relay/dead_letters.h"
#include "outbox_relay/endpoint_json.h"
#include "outbox_relay/endpoints.h"
#include "outbox_relay/store.h"
#include "outbox_relay/webhook_url.h"

namespace outbox::relay::app {
namespace {

std::map<std::string, std::string> ParseHeaders(const std::vector<std::string>& given) {
  std::map<std::string, std::string> out;
  for (const auto& h : given) {
    const auto colon = h.find(':');
    if (colon == std::string::npos || colon == 0) {
      throw std::invalid_argument("--header \"" + h +
                                  "\" is not \"Name: value\"; write e.g. --header 'X-Tenant: 42'");
    }
    std::string value = h.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.erase(0, 1);
    out[h.substr(0, colon)] = value;
  }
  return out;
}

EndpointFields Fields(const EndpointArgs& a, bool adding) {
  EndpointFields f;
  if (adding || a.set_destination) f.destination = a.destination;
  if (adding || a.set_url) f.url = a.url;
  if (a.set_description) f.description = a.description;
  if (a.set_metadata) f.metadata = a.metadata;
  if (a.set_event_types) f.event_types = a.event_types;
  if (a.set_headers) f.headers = ParseHeaders(a.headers);
  if (a.set_max_in_flight) f.max_in_flight = a.max_in_flight;
  if (a.set_rate_limit) f.rate_limit = a.rate_limit;
  if (a.set_breaker) f.breaker = a.breaker;
  if (a.set_adaptive) {
    f.adaptive_concurrency = a.adaptive_concurrency == "default" ? "" : a.adaptive_concurrency;
  }
  if (adding) {
    if (!a.id.empty()) f.id = a.id;
    if (!a.secret.empty()) f.secret = a.secret;
    if (!a.signature.empty()) f.signature = a.signature;
    f.enabled = !a.disabled;
  }
  return f;
}

// "24h", "30m", "90s", "2d" or plain seconds.
std::chrono::seconds ParseOverlap(const std::string& text) {
  std::size_t used = 0;
  long long n = -1;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
  }
  const std::string unit = n < 0 ? "" : text.substr(used);
  long long mult = 0;
  if (unit.empty() || unit == "s") mult = 1;
  if (unit == "m") mult = 60;
  if (unit == "h") mult = 3600;
  if (unit == "d") mult = 86400;
  if (n < 0 || mult == 0) {
    throw std::invalid_argument("--overlap \"" + text +
                                "\" is not a duration; write e.g. 24h, 30m, 90s or 0 (the old "
                                "secret stops signing at once)");
  }
  if (n > kMaxSecretOverlap.count() / mult) {  // also before n * mult could overflow
    throw std::invalid_argument("--overlap \"" + text +
                                "\" is longer than an overlap may be; write at most 365d (" +
                                std::to_string(kMaxSecretOverlap.count()) + " seconds)");
  }
  return std::chrono::seconds(n * mult);
}

// Why the --config's SSRF guard refuses `url` for `destination`, or nullopt. A URL that does
// not parse is left to the store, whose refusal names what is wrong with it (and does not
// echo credentials).
std::optional<std::string> GuardRefuses(const EndpointArgs& a, const std::string& destination,
                                        const std::string& url) {
  if (!a.url_check) return std::nullopt;
  try {
    ParseWebhookUrl(url);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  return a.url_check(destination, url);
}

int NoSuch(const std::string& id) {
  return PrintError("no endpoint has id \"" + id + "\"; `outbox-relay endpoints list` shows them");
}

void PrintOne(const EndpointRecord& e) {
  std::cout << "id:            " << e.id << "\n"
            << "destination:   " << e.destination << "\n"
            << "url:           " << e.url << "\n"
            << "enabled:       " << (e.enabled ? "yes" : "no")
            << (e.disabled_reason ? " (" + *e.disabled_reason + ")" : "") << "\n"
            << "event types:   ";
  if (e.event_types.empty()) std::cout << "(all)";
  for (std::size_t i = 0; i < e.event_types.size(); ++i) {
    std::cout << (i ? ", " : "") << e.event_types[i];
  }
  std::cout << "\n";
  for (const auto& [k, v] : e.headers) std::cout << "header:        " << k << ": " << v << "\n";
  std::cout << "signature:     " << e.signature << "\n";
  for (const auto& k : e.public_keys) std::cout << "public key:    " << k << "\n";
  std::cout << "max in flight: "
            << (e.max_in_flight ? std::to_string(*e.max_in_flight) : "(destination's)") << "\n"
            << "breaker:       " << e.breaker << " (over the destination's)\n"
            << "adaptive:      "
            << (e.adaptive_concurrency ? (*e.adaptive_concurrency ? "on" : "off")
                                       : "(destination's)")
            << "\n"
            << "rate limit:    "
            << (e.rate_limit ? std::to_string(*e.rate_limit) + " requests/s" : "(destination's)")
            << "\n"
            << "secrets:       " << e.secrets << " signing (never shown after creation)\n"
            << "backlog:       " << e.backlog << " message(s) waiting for this endpoint\n"
            << "dead letters:  " << e.dead_letters << "\n"
            << "description:   " << e.description << "\n"
            << "metadata:      " << e.metadata << "\n"
            << "created:       " << e.created_at << "\n"
            << "updated:       " << e.updated_at << "\n";
}

}  // namespace

int RunEndpointsAdd(const EndpointArgs& a) {
  return WithStore(a.database_url, [&](Store& store) {
    if (auto why = GuardRefuses(a, a.destination, a.url)) {
      throw InvalidField("url", "--url: " + *why);
    }
    const CreatedEndpoint created = AddEndpoint(store, Fields(a, true));
    if (a.json) {
      nlohmann::json j = ToJson(created.endpoint);
      if (created.public_key.empty()) {
        j["secret"] = created.secret;
      } else {
        j["public_key"] = created.public_key;
      }
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::cout << "added endpoint " << created.endpoint.id << " to destination "
              << created.endpoint.destination << " (relays use it within a second)\n";
    if (!created.public_key.empty()) {
      std::cout << "public key: " << created.public_key << "\n"
                << "(deliveries are signed with ed25519, \"v1a,\" entries of webhook-signature; "
                   "the receiver verifies with this key, which `endpoints show` prints again)\n";
      return 0;
    }
    std::cout << "secret: " << created.secret << "\n"
              << "(the secret is shown only now: give it to the receiver; "
              << "`outbox-relay endpoints rotate-secret " << created.endpoint.id
              << "` makes a new one)\n";
    return 0;
  });
}

int RunEndpointsList(const EndpointArgs& a) {
  return WithStore(a.database_url, [&](Store& store) {
    const auto all = ListEndpoints(store, a.destination);
    if (a.json) {
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& e : all) arr.push_back(ToJson(e));
      std::cout << arr.dump(2) << "\n";
      return 0;
    }
    if (all.empty()) {
      std::cout << "no endpoints" << (a.destination.empty() ? "" : " for " + a.destination)
                << "; add one with `outbox-relay endpoints add --destination D --url URL`\n";
      return 0;
    }
    std::cout << std::left << std::setw(36) << "ID" << std::setw(16) << "DESTINATION"
              << std::setw(9) << "ENABLED" << std::setw(9) << "BACKLOG" << std::setw(6) << "DEAD"
              << "URL\n";
    // Counts stop at kListCountCap ("1000+"); `show` counts one endpoint's to the last row.
    const auto count = [](std::int64_t n, bool capped) {
      return std::to_string(n) + (capped ? "+" : "");
    };
    for (const auto& e : all) {
      std::cout << std::left << std::setw(36) << e.id << std::setw(16) << e.destination
                << std::setw(9) << (e.enabled ? "yes" : "no") << std::setw(9)
                << count(e.backlog, e.backlog_capped) << std::setw(6)
                << count(e.dead_letters, e.dead_letters_capped) << e.url << "\n";
    }
    return 0;
  });
}

int RunEndpointsShow(const EndpointArgs& a) {
  return WithStore(a.database_url, [&](Store& store) {
    const auto e = GetEndpoint(store, a.id);
    if (!e) return NoSuch(a.id);
    if (a.json) {
      std::cout << ToJson(*e).dump(2) << "\n";
    } else {
      PrintOne(*e);
    }
    return 0;
  });
}

int RunEndpointsUpdate(const EndpointArgs& a) {
  return WithStore(a.database_url, [&](Store& store) {
    const EndpointFields f = Fields(a, false);
    if (!f.destination && !f.url && !f.description && !f.metadata && !f.event_types && !f.headers &&
        !f.max_in_flight && !f.rate_limit && !f.breaker && !f.adaptive_concurrency) {
      return PrintError(
          "nothing to update: give at least one of --destination, --url, --description, "
          "--metadata, --event-type (or --all-events), --header (or --no-headers), "
          "--max-in-flight, --rate-limit, --breaker, --adaptive-concurrency");
    }
    if (a.url_check && (f.url || f.destination)) {
      const auto now = GetEndpoint(store, a.id, EndpointCounts::kNone);
      if (!now) return NoSuch(a.id);
      if (auto why =
              GuardRefuses(a, f.destination.value_or(now->destination), f.url.value_or(now->url))) {
        throw InvalidField("url",
                           (f.url ? "--url: " : "--destination " + *f.destination + ": ") + *why);
      }
    }
    if (!UpdateEndpoint(store, a.id, f)) return NoSuch(a.id);
    std::cout << "updated endpoint " << a.id << " (relays use the change within a second)\n";
    return 0;
  });
}

int RunEndpointsEnable(const EndpointArgs& a, bool enabled) {
  return WithStore(a.database_url, [&](Store& store) {
    const auto change = SetEndpointEnabled(store, a.id, enabled, a.reason);
    if (change == EnableChange::kNoSuchEndpoint) return NoSuch(a.id);
    if (change == EnableChange::kUnchanged) {
      std::cout << "endpoint " << a.id << " is already " << (enabled ? "enabled" : "disabled")
                << ": nothing changed\n";
      return 0;
    }
    std::cout << (enabled ? "enabled endpoint " : "disabled endpoint ") << a.id
              << (enabled ? ": what waited for it is sent again now\n"
                          : ": its messages wait for it (nothing is sent, nothing is lost) until "
                            "`outbox-relay endpoints enable " +
                                a.id + "`\n");
    return 0;
  });
}

int RunEndpointsDelete(const EndpointArgs& a) {
  return WithStore(a.database_url, [&](Store& store) {
    if (!DeleteEndpoint(store, a.id)) return NoSuch(a.id);
    std::cout << "deleted endpoint " << a.id
              << " and its secrets; messages still waiting for it go to its dead letters\n";
    return 0;
  });
}

int RunEndpointsRotateSecret(const EndpointArgs& a) {
  return WithStore(a.database_url, [&](Store& store) {
    const auto overlap = ParseOverlap(a.overlap);
    const RotatedKey key = RotateEndpointSecret(
        store, a.id, overlap, a.secret.empty() ? std::nullopt : std::optional(a.secret));
    const bool ed25519 = !key.public_key.empty();
    const std::string shown = ed25519 ? key.public_key : key.secret;
    if (a.json) {
      std::cout
          << nlohmann::json({{"id", a.id}, {ed25519 ? "public_key" : "secret", shown}}).dump(2)
          << "\n";
      return 0;
    }
    std::cout << "new " << (ed25519 ? "public key" : "secret") << " for endpoint " << a.id << ": "
              << shown << "\n"
              << "every delivery is signed with it and, for " << a.overlap
              << " more, with the previous one too\n";
    return 0;
  });
}

int RunEndpointsTest(const EndpointArgs& a) {
  return WithStore(a.database_url, [&](Store& store) {
    const auto sent = SendTestEvent(store, a.id, a.event_type_one, a.payload);
    std::cout << "queued a test event (" << sent.event_type << ") for endpoint " << a.id
              << ", delivery id " << sent.delivery_id << "\n"
              << "`outbox-relay attempts --message " << sent.delivery_id << "` shows how it went\n";
    return 0;
  });
}

int RunEndpointsRecover(const EndpointArgs& a) {
  return WithStore(a.database_url, [&](Store& store) {
    const auto r = RecoverEndpoint(store, a.id, a.since);
    std::cout << "queued " << r.ids.size() << " dead letter(s) of endpoint " << a.id
              << " again, with their delivery ids\n";
    if (!r.of_deleted_endpoints.empty()) {
      std::cout << r.of_deleted_endpoints.size()
                << " dead letter(s) of an earlier endpoint with this id (deleted) left as they "
                   "are: this endpoint does not get them; `outbox-relay dlq purge` deletes them\n";
    }
    if (r.held_back.empty()) return 0;
    std::string ids;
    for (const auto id : r.held_back) ids += " " + std::to_string(id);
    std::cerr << "error: " << r.held_back.size()
              << " dead letter(s) held back, their delivery is queued already or was queued now "
                 "from an older dead letter:"
              << ids << "; run the same command again once it is delivered\n";
    return 1;
  });
}

int RunEndpointsReplays(const EndpointArgs& a) {
  return WithStore(a.database_url, [&](Store& store) {
    // ListEndpointReplays reads what outbox_reader may: an operator's read-only login runs it.
    const auto all = ListEndpointReplays(store, a.id);
    if (a.json) {
      for (const auto& r : all) std::cout << ToJson(r).dump() << "\n";
      return 0;
    }
    if (all.empty()) {
      std::cout << "no replays of " << a.id << " in the last day\n";
      return 0;
    }
    std::cout << std::left << std::setw(10) << "ID" << std::setw(10) << "STATUS" << std::setw(10)
              << "QUEUED" << std::setw(22) << "BEGAN" << std::setw(22) << "FINISHED"
              << "ASKED\n";
    for (const auto& r : all) {
      std::cout << std::left << std::setw(10) << r.id << std::setw(10) << r.status << std::setw(10)
                << r.queued << std::setw(22) << r.began << std::setw(22)
                << (r.finished_at.empty() ? "-" : r.finished_at)
                << (r.message.empty() ? "since " + r.since : "message " + r.message) << "\n";
      if (r.status == "failed") std::cout << "          " << r.error << "\n";
    }
    return 0;
  });
}

int RunEndpointsReplay(const EndpointArgs& a) {
  return WithStore(a.database_url, [&](Store& store) {
    const auto replay = ReplayToEndpoint(store, a.id, a.since, a.message, a.restart);
    const auto n = replay.queued;
    if (replay.resumed) {
      std::cout << "resumed the replay to " << a.id << " begun at " << replay.began
                << ", which had queued " << replay.queued_earlier << " message(s)\n";
      if (n == 0) {
        std::cout << "nothing left to queue: the replay is complete\n";
        return 0;
      }
    }
    if (n == 0) {
      std::cout << "nothing to replay to " << a.id
                << ": no archived message matches (is retention.archive_delivered on? an "
                   "endpoint that still has it queued gets it anyway)\n";
      return 0;
    }
    std::cout << "queued " << n << " message(s) for endpoint " << a.id
              << " again, with their first delivery ids\n";
    return 0;
  });
}

int RunAttempts(const EndpointArgs& a) {
  return WithStore(a.database_url, [&](Store& store) {
    const auto all = ListAttempts(store, a.id, a.message, a.limit, a.before);
    if (a.json) {
      for (const auto& t : all) {
        std::cout << ToJson(t).dump() << "\n";
      }
      return 0;
    }
    if (all.empty()) {
      std::cout << "no attempts recorded (delivery_log: true on a webhook service records "
                   "them)\n";
      return 0;
    }
    std::cout << std::left << std::setw(26) << "AT" << std::setw(20) << "ENDPOINT" << std::setw(38)
              << "DELIVERY ID" << std::setw(7) << "STATUS" << std::setw(10) << "OUTCOME"
              << std::setw(8) << "MS"
              << "ERROR\n";
    for (const auto& t : all) {
      std::cout << std::left << std::setw(26) << t.attempted_at << std::setw(20) << t.endpoint_id
                << std::setw(38) << t.delivery_id << std::setw(7)
                << (t.status ? std::to_string(*t.status) : "-") << std::setw(10) << t.outcome
                << std::setw(8) << t.latency_ms << t.error.value_or("") << "\n";
    }
    return 0;
  });
}

}  // namespace outbox::relay::app
