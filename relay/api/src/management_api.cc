#include "outbox_relay/management_api.h"

#include <httplib.h>
#include <openssl/crypto.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "outbox_relay/admin_server.h"
#include "outbox_relay/dead_letters.h"
#include "outbox_relay/endpoint_json.h"
#include "outbox_relay/endpoints.h"
#include "outbox_relay/queue_store.h"
#include "outbox_relay/request_limits.h"
#include "outbox_relay/store.h"
#include "outbox_relay/thread_name.h"

namespace outbox::relay {
namespace {

using nlohmann::json;

constexpr const char* kJson = "application/json";
constexpr const char* kIdPattern = "([A-Za-z0-9_.-]+)";

/// A refused request: its status, code, message and (for bad input) the field.
struct ApiError {
  int status;
  std::string code;
  std::string message;
  std::string field;
};

// Never throws: text that is not UTF-8 (a path, a parameter echoed in an error) is written
// with U+FFFD. Thrown from the error handler, which cpp-httplib runs outside its try, it
// aborted the relay on one unauthenticated request.
void Reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), kJson);
}

void ReplyError(httplib::Response& res, const ApiError& e) {
  json err = {{"code", e.code}, {"message", e.message}};
  if (!e.field.empty()) err["field"] = e.field;
  Reply(res, e.status, {{"error", err}});
}

ApiError BadField(const std::string& field, const std::string& message) {
  return {400, "invalid_field", message, field};
}

json ParseBody(const httplib::Request& req, bool required) {
  if (req.body.empty()) {
    if (required) throw ApiError{400, "invalid_json", "the request needs a JSON object body", ""};
    return json::object();
  }
  if (JsonNestedDeeperThan(req.body, kMaxJsonDepth)) {
    throw ApiError{400, "invalid_json",
                   "the body nests deeper than " + std::to_string(kMaxJsonDepth) +
                       " levels; flatten it (metadata is a small object of your own keys)",
                   ""};
  }
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) {
    throw ApiError{400, "invalid_json", "the body is not valid JSON", ""};
  }
  if (!body.is_object()) throw ApiError{400, "invalid_json", "the body must be a JSON object", ""};
  return body;
}

void OnlyKeys(const json& body, std::initializer_list<const char*> allowed) {
  for (const auto& [key, value] : body.items()) {
    bool known = false;
    for (const char* a : allowed) known = known || key == a;
    if (!known) {
      std::string list;
      for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
      throw BadField(key, "unknown field \"" + key + "\"; the fields are: " + list);
    }
  }
}

// A JSON string field; nullopt when absent. null is no string: read as "absent", a PATCH that
// set a field to null answered 200 and changed nothing (review).
std::optional<std::string> String(const json& body, const char* key) {
  if (!body.contains(key)) return std::nullopt;
  if (!body[key].is_string()) {
    throw BadField(key, std::string(key) + " must be a string" +
                            (body[key].is_null() ? " (null is no value of it: leave the key out "
                                                   "to keep or default it)"
                                                 : ""));
  }
  return body[key].get<std::string>();
}

// A JSON integer field as 64 bits; nullopt when absent. JSON's integers go past an int (and
// an unsigned one past int64): such a number is refused naming the field, never cut to fit.
// `what` says what the field takes. The caller (or the store) checks the field's own range.
std::optional<std::int64_t> Integer(const json& body, const char* key, const std::string& what) {
  if (!body.contains(key)) return std::nullopt;
  const json& v = body[key];
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))) {
    throw BadField(key, what);
  }
  return v.get<std::int64_t>();
}

// The writable fields of an endpoint, checked for their JSON types; their values are checked
// by the store (InvalidField names them too).
EndpointFields Fields(const json& body) {
  EndpointFields f;
  f.id = String(body, "id");
  f.destination = String(body, "destination");
  f.url = String(body, "url");
  f.description = String(body, "description");
  f.secret = String(body, "secret");
  f.signature = String(body, "signature");
  if (body.contains("metadata")) {
    if (!body["metadata"].is_object()) throw BadField("metadata", "metadata must be an object");
    f.metadata = body["metadata"].dump();
  }
  if (body.contains("event_types")) {
    const auto& v = body["event_types"];
    bool ok = v.is_array();
    for (const auto& t : v) ok = ok && t.is_string();
    if (!ok) {
      throw BadField("event_types",
                     "event_types must be an array of strings, e.g. [\"invoice.*\"]; [] for all");
    }
    f.event_types = v.get<std::vector<std::string>>();
  }
  if (body.contains("headers")) {
    const auto& v = body["headers"];
    bool ok = v.is_object();
    for (const auto& [k, h] : v.items()) ok = ok && h.is_string();
    if (!ok) {
      throw BadField("headers",
                     "headers must be an object of strings, e.g. {\"X-Tenant\": \"42\"}");
    }
    f.headers = v.get<std::map<std::string, std::string>>();
  }
  f.max_in_flight = Integer(body, "max_in_flight",
                            "max_in_flight must be an integer from 1 to 1024 concurrent requests "
                            "(0: the destination's setting)");
  if (body.contains("breaker")) {
    if (!body["breaker"].is_object()) {
      throw BadField("breaker", "breaker must be an object, e.g. {\"failure_threshold\": 5}");
    }
    f.breaker = body["breaker"].dump();
  }
  if (body.contains("adaptive_concurrency")) {
    const auto& a = body["adaptive_concurrency"];
    if (!a.is_boolean() && !a.is_null()) {
      throw BadField("adaptive_concurrency",
                     "adaptive_concurrency must be true, false or null (the destination's)");
    }
    f.adaptive_concurrency = a.is_null() ? "" : (a.get<bool>() ? "true" : "false");
  }
  f.rate_limit = Integer(body, "rate_limit",
                         "rate_limit must be an integer from 1 to 1000000 requests per second "
                         "(0: no limit of its own, the destination's)");
  if (body.contains("enabled")) {
    if (!body["enabled"].is_boolean()) throw BadField("enabled", "enabled must be true or false");
    f.enabled = body["enabled"].get<bool>();
  }
  return f;
}

// Whether the client asked for an answer before the work is done: `Prefer: respond-async`
// (RFC 7240), among other preferences or in a header of its own, the name in any case.
bool PrefersAsync(const httplib::Request& req) {
  const std::size_t headers = req.get_header_value_count("Prefer");
  for (std::size_t i = 0; i < headers; ++i) {
    const std::string value = req.get_header_value("Prefer", i);
    std::size_t from = 0;
    while (from <= value.size()) {
      std::size_t to = value.find(',', from);
      if (to == std::string::npos) to = value.size();
      std::string token = value.substr(from, to - from);
      token = token.substr(0, token.find(';'));  // its parameters
      const auto first = token.find_first_not_of(" \t");
      const auto last = token.find_last_not_of(" \t");
      if (first != std::string::npos) token = token.substr(first, last - first + 1);
      std::transform(token.begin(), token.end(), token.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      if (token == "respond-async") return true;
      from = to + 1;
    }
  }
  return false;
}

// A path's id that is a number (a replay's, a dead letter's); nullopt for anything else, which
// names nothing (a 404, as an unknown number is).
std::optional<std::int64_t> PathNumber(const std::string& text) {
  if (text.empty() || text.size() > 18 ||
      !std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); })) {
    return std::nullopt;
  }
  return std::stoll(text);
}

// An endpoint's dead letter: its delivery (webhook-id), why it died, and what it carried. A
// JSON value nlohmann cannot hold (a number past a double's range) is given as its text,
// `payload_text`; one that is too large for a list is left out (`payload_omitted`).
json ToJson(const DeadLetter& d) {
  json out = {{"id", d.id},
              {"delivery_id", d.idempotency_key},
              {"event_type", d.event_type},
              {"attempts", d.attempts},
              {"reason", d.reason},
              {"last_error", d.last_error ? json(*d.last_error) : json()},
              {"created_at", d.created_at},
              {"dead_at", d.dead_at},
              {"payload_size", d.payload_size}};
  const json headers = json::parse(d.headers, nullptr, false);
  out["headers"] = headers.is_discarded() ? json(d.headers) : headers;
  constexpr std::string_view kBase64 = "base64:";
  if (d.payload_omitted) {
    out["payload_omitted"] = true;
  } else if (d.payload.starts_with(kBase64)) {
    std::string b64 = d.payload.substr(kBase64.size());
    std::erase(b64, '\n');  // PostgreSQL's encode() breaks its lines
    out["payload_base64"] = b64;
  } else if (json payload = json::parse(d.payload, nullptr, false); !payload.is_discarded()) {
    out["payload"] = std::move(payload);
  } else {
    out["payload_text"] = d.payload;
  }
  return out;
}

}  // namespace

struct ManagementApi::Impl {
  std::string listen;
  std::string token;
  std::string database_url;
  // A body of up to 1 MiB may take a slow client a while: 30 s for a whole request.
  GuardedServer server{RequestReadLimits{32 * 1024, std::chrono::seconds(30)}};
  std::thread thread;
  std::atomic<bool> thread_done{false};
  int port = 0;

  std::mutex store_mu;
  std::unique_ptr<Store> store;  ///< Guarded by store_mu; one connection, made on first use.
  /// The stores requests are using right now, for Stop to cut their statements short.
  std::mutex busy_mu;
  std::set<Store*> busy;  ///< Guarded by busy_mu.
  bool stopping = false;  ///< Guarded by busy_mu: requests not yet running are answered 503.

  static constexpr int kMaxOwn = 2;  ///< Requests on connections of their own, at once.

  // Replays asked with `Prefer: respond-async`, running on after their answer on the
  // request's connection (and slot of kMaxOwn). Stop ends them between two parts, or cuts
  // the statement running: they are resumable.
  struct Background {
    std::unique_ptr<Store> store;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::mutex background_mu;
  std::list<Background> background;  ///< Guarded by background_mu.
  std::atomic<bool> background_stop{false};
  using Continuation = std::function<void(Store&)>;

  // Runs `then` on `store` on a thread of its own; the slot it holds is given back at its
  // end. Joins the ones that are done.
  void RunInBackground(std::unique_ptr<Store> store, Continuation then) {
    std::lock_guard lk(background_mu);
    background.remove_if([](Background& b) {
      if (!b.done) return false;
      b.thread.join();
      return true;
    });
    Background& b = background.emplace_back();
    b.store = std::move(store);
    try {
      b.thread = std::thread([this, &b, then = std::move(then)] {
        NameThisThread("or-api-bg");
        try {
          then(*b.store);
        } catch (const std::exception& e) {
          spdlog::warn("management API: a background replay stopped: {}", e.what());
        }
        b.store->Reset();  // its connection goes now, not when the next one starts
        --own_running;
        b.done = true;
      });
    } catch (...) {
      // No thread: the connection closes (and the replay's lock with it), the request's slot
      // stays the request's, and the request is answered 500.
      background.pop_back();
      throw;
    }
  }
  std::atomic<int> own_running{0};

  ManagementApi::UrlCheck url_check;                  ///< Set before Start; read-only after.
  ManagementApi::DestinationCheck destination_check;  ///< Set before Start; read-only after.

  void CheckUrl(const std::string& destination, const std::string& url) const {
    if (!url_check) return;
    if (auto why = url_check(destination, url)) throw BadField("url", *why);
  }
  void CheckDestination(const std::string& destination) const {
    if (!destination_check) return;
    if (auto why = destination_check(destination)) throw BadField("destination", *why);
  }

  bool Authorized(const httplib::Request& req) const {
    const std::string header = req.get_header_value("Authorization");
    const std::string prefix = "bearer ";  // the scheme is case-insensitive (RFC 9110, 11.1)
    if (header.size() != prefix.size() + token.size() ||
        !std::equal(prefix.begin(), prefix.end(), header.begin(), [](char p, char h) {
          return p == std::tolower(static_cast<unsigned char>(h));
        })) {
      return false;
    }
    return CRYPTO_memcmp(header.data() + prefix.size(), token.data(), token.size()) == 0;
  }

  // How a request reaches the database: on the API's one connection, one request at a time
  // (most), or on a connection of its own for as long as it runs (a replay, which goes on for
  // minutes over a large archive and held every other request meanwhile).
  enum class Connection { kShared, kOwn };

  // Runs `f(store)` for one request: authentication first, then every failure as a JSON error.
  template <class F>
  void Handle(const httplib::Request& req, httplib::Response& res, F f,
              Connection connection = Connection::kShared) {
    try {
      if (!Authorized(req)) {
        res.set_header("WWW-Authenticate", "Bearer");
        throw ApiError{401, "unauthorized",
                       "send the management API token as `Authorization: Bearer <token>`", ""};
      }
      std::unique_lock lock(store_mu, std::defer_lock);
      std::unique_ptr<Store> own;
      Store* s = nullptr;
      // Requests on connections of their own (replays, for minutes each) run two at a time, so
      // that clients asking again on a short timeout cannot take the server's connections
      // from the relay's claims and settles.
      struct Slot {
        std::atomic<int>* running = nullptr;
        ~Slot() {
          if (running) --*running;
        }
      } slot;
      if (connection == Connection::kOwn) {
        if (++own_running > kMaxOwn) {
          --own_running;
          res.set_header("Retry-After", "5");
          throw ApiError{429, "too_many_requests",
                         std::to_string(kMaxOwn) +
                             " replays or recoveries are running on this relay; ask again "
                             "when one is done "
                             "(a replay asked again goes on from where it is and queues "
                             "nothing twice)",
                         ""};
        }
        slot.running = &own_running;
        own = std::make_unique<Store>(database_url);
        s = own.get();
      } else {
        lock.lock();
        if (!store) store = std::make_unique<Store>(database_url);
        s = store.get();
      }
      struct Busy {
        Impl& d;
        Store* s;
        Busy(Impl& impl, Store* store_in_use) : d(impl), s(store_in_use) {
          std::lock_guard lk(d.busy_mu);
          if (d.stopping) {
            throw ApiError{503, "database_unavailable",
                           "the relay is shutting down; send the request again to another "
                           "relay, or once it is back",
                           ""};
          }
          d.busy.insert(s);
        }
        ~Busy() {
          std::lock_guard lk(d.busy_mu);
          d.busy.erase(s);
        }
      };
      try {
        const Busy busy_now(*this, s);
        if constexpr (std::is_void_v<std::invoke_result_t<F&, Store&, httplib::Response&>>) {
          f(*s, res);
        } else {
          // What f leaves to run on after the answer, on this request's connection and slot.
          Continuation then = f(*s, res);
          if (then) {
            RunInBackground(std::move(own), std::move(then));
            slot.running = nullptr;
          }
        }
      } catch (const StoreError& e) {
        if (!own) store.reset();  // reconnect on the next request
        if (e.transient()) {
          throw ApiError{503, "database_unavailable",
                         std::string("the database cannot be reached: ") + e.what(), ""};
        }
        // SQLSTATE class 22 (data exception): a value the database cannot take, such as
        // \u0000 in text or bytes that are not UTF-8. The client's to fix, not a 500 to retry.
        if (e.sqlstate().starts_with("22")) {
          throw ApiError{400, "invalid_input",
                         std::string("a value cannot be stored: ") + e.what() +
                             "; send UTF-8 text without NUL characters",
                         ""};
        }
        throw;
      }
    } catch (const ApiError& e) {
      ReplyError(res, e);
    } catch (const EndpointExists& e) {
      ReplyError(res, {409, "conflict", e.what(), e.field()});
    } catch (const InvalidField& e) {
      ReplyError(res, {400, "invalid_field", e.what(), e.field()});
    } catch (const EndpointBusy& e) {
      res.set_header("Retry-After", "5");
      ReplyError(res, {503, "endpoint_busy", e.what(), ""});
    } catch (const EndpointNotFound& e) {
      ReplyError(res, {404, "not_found", e.what(), ""});
    } catch (const std::exception& e) {
      spdlog::error("management API: {} {}: {}", req.method, req.path, e.what());
      ReplyError(res, {500, "internal", e.what(), ""});
    }
  }

  // A list's page size: `limit`, 1 to `most`; 50 when not given.
  static int Limit(const httplib::Request& req, int most = 1000) {
    if (!req.has_param("limit")) return 50;
    const std::string text = req.get_param_value("limit");
    try {
      std::size_t used = 0;
      const int limit = std::stoi(text, &used);
      if (used != text.size() || limit < 1 || limit > most) throw std::out_of_range(text);
      return limit;
    } catch (const std::exception&) {
      throw BadField("limit", "limit must be a number from 1 to " + std::to_string(most));
    }
  }

  static ApiError NotFound(const std::string& id) {
    return {404, "not_found", "no endpoint has id \"" + id + "\"", ""};
  }

  // The endpoint as a change left it; deleted since (by another replica or the CLI): 404.
  static EndpointRecord ReadBack(Store& s, const std::string& id) {
    auto e = GetEndpoint(s, id);
    if (!e) throw NotFound(id);
    return std::move(*e);
  }

  void Routes() {
    server.Get("/v1/endpoints", [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, [&](Store& s, httplib::Response& r) {
        const int limit = Limit(req);
        // The next page: after the last endpoint of this one, written "<id>@<destination>"
        // (an id holds no '@').
        std::optional<EndpointCursor> after;
        if (req.has_param("after")) {
          const std::string text = req.get_param_value("after");
          const auto at = text.find('@');
          static const std::regex id_re(std::string("^") + kIdPattern + "$");
          if (at == std::string::npos || !std::regex_match(text.substr(0, at), id_re)) {
            throw BadField("after",
                           "after must be the last page's next_after (\"<id>@<destination>\"), "
                           "as it was given");
          }
          after = EndpointCursor{text.substr(at + 1), text.substr(0, at)};
        }
        const EndpointPage page =
            ListEndpointsPage(s, req.get_param_value("destination"), limit, after);
        json data = json::array();
        for (const auto& e : page.endpoints) data.push_back(ToJson(e));
        // Where the next page starts; null when this one is the last.
        const json next =
            page.more ? json(page.endpoints.back().id + "@" + page.endpoints.back().destination)
                      : json();
        Reply(r, 200, {{"data", data}, {"next_after", next}});
      });
    });
    server.Post("/v1/endpoints", [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, [&](Store& s, httplib::Response& r) {
        const json body = ParseBody(req, true);
        OnlyKeys(body, {"id", "destination", "url", "description", "metadata", "event_types",
                        "headers", "max_in_flight", "rate_limit", "enabled", "secret", "signature",
                        "breaker", "adaptive_concurrency"});
        EndpointFields f = Fields(body);
        if (!f.destination) throw BadField("destination", "destination is required");
        if (!f.url) throw BadField("url", "url is required");
        CheckDestination(*f.destination);
        CheckUrl(*f.destination, *f.url);
        const CreatedEndpoint created = AddEndpoint(s, f);
        json out = ToJson(created.endpoint);
        if (created.public_key.empty()) {
          out["secret"] = created.secret;
        } else {
          out["public_key"] = created.public_key;
        }
        Reply(r, 201, out);
      });
    });
    const std::string one = std::string("/v1/endpoints/") + kIdPattern;
    server.Get(one, [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, [&](Store& s, httplib::Response& r) {
        const std::string id = req.matches[1];
        const auto e = GetEndpoint(s, id);
        if (!e) throw NotFound(id);
        Reply(r, 200, ToJson(*e));
      });
    });
    server.Patch(one, [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, [&](Store& s, httplib::Response& r) {
        const std::string id = req.matches[1];
        const json body = ParseBody(req, true);
        OnlyKeys(body, {"destination", "url", "description", "metadata", "event_types", "headers",
                        "max_in_flight", "rate_limit", "breaker", "adaptive_concurrency"});
        if (body.empty()) throw ApiError{400, "invalid_json", "nothing to update", ""};
        const EndpointFields f = Fields(body);
        if (f.destination) CheckDestination(*f.destination);
        if (url_check && (f.url || f.destination)) {
          const auto now = GetEndpoint(s, id);
          if (!now) throw NotFound(id);
          CheckUrl(f.destination.value_or(now->destination), f.url.value_or(now->url));
        }
        if (!UpdateEndpoint(s, id, f)) throw NotFound(id);
        Reply(r, 200, ToJson(ReadBack(s, id)));
      });
    });
    server.Delete(one, [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, [&](Store& s, httplib::Response& r) {
        const std::string id = req.matches[1];
        if (!DeleteEndpoint(s, id)) throw NotFound(id);
        r.status = 204;
      });
    });
    for (const bool enable : {false, true}) {
      server.Post(one + (enable ? "/enable" : "/disable"),
                  [this, enable](const httplib::Request& req, httplib::Response& res) {
                    Handle(req, res, [&](Store& s, httplib::Response& r) {
                      const std::string id = req.matches[1];
                      const json body = ParseBody(req, false);
                      OnlyKeys(body, enable ? std::initializer_list<const char*>{}
                                            : std::initializer_list<const char*>{"reason"});
                      const std::string reason = String(body, "reason").value_or("");
                      if (SetEndpointEnabled(s, id, enable, reason) ==
                          EnableChange::kNoSuchEndpoint) {
                        throw NotFound(id);
                      }
                      Reply(r, 200, ToJson(ReadBack(s, id)));
                    });
                  });
    }
    server.Post(one + "/rotate-secret", [this](const httplib::Request& req,
                                               httplib::Response& res) {
      Handle(req, res, [&](Store& s, httplib::Response& r) {
        const std::string id = req.matches[1];
        const json body = ParseBody(req, false);
        OnlyKeys(body, {"overlap_seconds", "secret"});
        const std::string range = "overlap_seconds must be a whole number of seconds from 0 to " +
                                  std::to_string(kMaxSecretOverlap.count()) +
                                  " (365 days; default 86400)";
        const std::int64_t overlap = Integer(body, "overlap_seconds", range).value_or(24 * 3600);
        if (overlap < 0 || overlap > kMaxSecretOverlap.count()) {
          throw BadField("overlap_seconds", range);
        }
        const RotatedKey key =
            RotateEndpointSecret(s, id, std::chrono::seconds(overlap), String(body, "secret"));
        json out = {{"id", id}};
        if (key.public_key.empty()) {
          out["secret"] = key.secret;
        } else {
          out["public_key"] = key.public_key;
        }
        Reply(r, 200, out);
      });
    });
    server.Post(one + "/replay", [this](const httplib::Request& req, httplib::Response& res) {
      Handle(
          req, res,
          [&](Store& s, httplib::Response& r) -> Continuation {
            const std::string id = req.matches[1];
            const json body = ParseBody(req, true);
            OnlyKeys(body, {"since", "message", "restart"});
            bool restart = false;
            if (body.contains("restart")) {
              if (!body["restart"].is_boolean()) {
                throw BadField("restart", "restart must be true or false");
              }
              restart = body["restart"].get<bool>();
            }
            const std::string since = String(body, "since").value_or("");
            const std::string message = String(body, "message").value_or("");
            const auto answer = [&](const ReplayOutcome& replay, const char* status) {
              Reply(r, 202,
                    {{"id", replay.id},
                     {"endpoint_id", id},
                     {"status", status},
                     {"queued", replay.queued},
                     {"resumed", replay.resumed},
                     {"queued_earlier", replay.queued_earlier},
                     {"began", replay.began}});
            };
            if (!PrefersAsync(req)) {
              answer(ReplayToEndpoint(s, id, since, message, restart), "finished");
              return {};
            }
            // Begun (or taken up) here, so that bad input and an unknown endpoint are
            // answered; queued in the background, on this connection, which holds the
            // replay's run lock from here.
            const ReplayOutcome begun = BeginEndpointReplay(s, id, since, message, restart);
            r.set_header("Location", "/v1/replays/" + std::to_string(begun.id));
            r.set_header("Preference-Applied", "respond-async");
            answer(begun, "running");
            return [this, begun](Store& store) {
              RunEndpointReplay(store, begun, [this] { return background_stop.load(); });
            };
          },
          Connection::kOwn);
    });
    server.Get(one + "/dead-letters", [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, [&](Store& s, httplib::Response& r) {
        const std::string id = req.matches[1];
        const int limit = Limit(req, 100);
        const auto page = ListEndpointDeadLetters(s, id, limit, req.get_param_value("before"));
        json data = json::array();
        for (const auto& d : page.letters) data.push_back(ToJson(d));
        Reply(r, 200,
              {{"data", data},
               {"next_before", page.next_before.empty() ? json() : json(page.next_before)}});
      });
    });
    server.Get(
        one + "/dead-letters/([^/]+)", [this](const httplib::Request& req, httplib::Response& res) {
          Handle(req, res, [&](Store& s, httplib::Response& r) {
            const std::string id = req.matches[1];
            const std::string letter = req.matches[2];
            const auto number = PathNumber(letter);
            const auto d = number ? GetEndpointDeadLetter(s, id, *number) : std::nullopt;
            if (!d) {
              throw ApiError{404, "not_found",
                             "endpoint " + id + " has no dead letter " + letter +
                                 " (replayed, recovered or purged since, or another's)",
                             ""};
            }
            Reply(r, 200, ToJson(*d));
          });
        });
    server.Post(one + "/test", [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, [&](Store& s, httplib::Response& r) {
        const std::string id = req.matches[1];
        const json body = ParseBody(req, false);
        OnlyKeys(body, {"event_type", "payload"});
        const std::string payload = body.contains("payload") ? body["payload"].dump() : "";
        // A destination this relay delivers elsewhere (a Kafka topic, a URL of its own) would
        // send the test event as an application message: checked where the endpoint is while
        // the event is written (under its move lock).
        const auto sent = SendTestEvent(s, id, String(body, "event_type").value_or(""), payload,
                                        [this](const std::string& d) { CheckDestination(d); });
        Reply(
            r, 202,
            {{"id", sent.id}, {"delivery_id", sent.delivery_id}, {"event_type", sent.event_type}});
      });
    });
    server.Post(one + "/recover", [this](const httplib::Request& req, httplib::Response& res) {
      Handle(
          req, res,
          [&](Store& s, httplib::Response& r) {
            const std::string id = req.matches[1];
            const json body = ParseBody(req, true);
            OnlyKeys(body, {"since"});
            const auto recovered = RecoverEndpoint(s, id, String(body, "since").value_or(""));
            Reply(r, 200,
                  {{"replayed", recovered.ids.size()},
                   {"held_back", recovered.held_back.size()},
                   {"of_deleted_endpoint", recovered.of_deleted_endpoints.size()}});
          },
          Connection::kOwn);
    });
    server.Get(one + "/replays", [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, [&](Store& s, httplib::Response& r) {
        const std::string id = req.matches[1];
        json data = json::array();
        for (const auto& replay : ListEndpointReplays(s, id)) data.push_back(ToJson(replay));
        Reply(r, 200, {{"data", data}});
      });
    });
    server.Get(
        R"(/v1/replays/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
          Handle(req, res, [&](Store& s, httplib::Response& r) {
            const std::string id = req.matches[1];
            const auto number = PathNumber(id);
            const auto replay = number ? GetEndpointReplay(s, *number) : std::nullopt;
            if (!replay) {
              throw ApiError{404, "not_found",
                             "no replay has id " + id +
                                 " (a replay is kept for a day after its last change, "
                                 "and goes with its endpoint)",
                             ""};
            }
            Reply(r, 200, ToJson(*replay));
          });
        });
    server.Get("/v1/attempts", [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, [&](Store& s, httplib::Response& r) {
        const int limit = Limit(req);
        // The next page: what is older than the last attempt of this one.
        std::int64_t before = 0;
        if (req.has_param("before")) {
          const std::string text = req.get_param_value("before");
          try {
            std::size_t used = 0;
            before = std::stoll(text, &used);
            if (used != text.size() || before < 1) throw std::out_of_range(text);
          } catch (const std::exception&) {
            throw BadField("before",
                           "before must be an attempt's id (a positive number), as the last "
                           "page's next_before gave it");
          }
        }
        json data = json::array();
        const auto page = ListAttempts(s, req.get_param_value("endpoint_id"),
                                       req.get_param_value("message"), limit, before);
        for (const auto& a : page) data.push_back(ToJson(a));
        // Where the next page starts; null when this one was the last (it was not full).
        const json next = static_cast<int>(page.size()) == limit ? json(page.back().id) : json();
        Reply(r, 200, {{"data", data}, {"next_before", next}});
      });
    });
    server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (res.status == 404 && res.body.empty()) {
        ReplyError(res, {404, "not_found", "no such route: " + req.method + " " + req.path, ""});
      } else if (res.status == 413 && res.body.empty()) {
        ReplyError(res, {413, "payload_too_large",
                         "the request body is over 1 MiB, the limit; send less (a description "
                         "or metadata of that size belongs in your own store)",
                         ""});
      } else if (res.status == 414 && res.body.empty()) {
        ReplyError(res, {414, "uri_too_long",
                         "the request line's path and query are over 8 KiB; send a shorter one",
                         ""});
      } else if (res.status == 400 && res.body.empty()) {
        // cpp-httplib's own answer to a request line or header it cannot parse: an empty body.
        ReplyError(res, {400, "bad_request",
                         "the request is not well-formed HTTP/1.1 (request line or headers); "
                         "send METHOD /path HTTP/1.1 and valid header lines",
                         ""});
      } else if (res.status >= 400 && res.body.empty()) {
        ReplyError(res, {res.status, "bad_request",
                         "the request was refused (HTTP " + std::to_string(res.status) +
                             ") before it reached a route",
                         ""});
      }
    });
  }
};

ManagementApi::ManagementApi(std::string listen, std::string token, std::string database_url)
    : impl_(std::make_unique<Impl>()) {
  impl_->listen = std::move(listen);
  impl_->token = std::move(token);
  impl_->database_url = std::move(database_url);
}

ManagementApi::~ManagementApi() { Stop(); }

void ManagementApi::SetUrlCheck(UrlCheck check) { impl_->url_check = std::move(check); }
void ManagementApi::SetDestinationCheck(DestinationCheck check) {
  impl_->destination_check = std::move(check);
}

void ManagementApi::Start() {
  auto& d = *impl_;
  const ListenAddress address = ParseListenAddress(d.listen);
  // cpp-httplib gives a connection a worker for its whole life: clients keeping their
  // connections open (a dashboard's pool, CLI sessions) each hold one until the keep-alive
  // ends, and with four workers the fifth client waited 5 s. Requests still run one at a time
  // on the one database connection (store_mu); the workers mostly wait on sockets.
  d.server.new_task_queue = [] { return new httplib::ThreadPool(16); };
  d.server.set_keep_alive_timeout(5);
  d.server.set_read_timeout(std::chrono::seconds(10));
  d.server.set_write_timeout(std::chrono::seconds(10));
  LimitRequestBodies(
      d.server, 1 << 20,
      [](httplib::Response& res, int status, const std::string& code, const std::string& message) {
        ReplyError(res, {status, code, message, ""});
      });
  d.server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  d.Routes();
  int port = address.port;
  if (port == 0) {
    port = d.server.bind_to_any_port(address.host);
  } else if (!d.server.bind_to_port(address.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    throw std::runtime_error("management API: cannot listen on " + d.listen +
                             " (address in use, or no such local address)");
  }
  d.port = port;
  d.thread = std::thread([&d] {
    NameThisThread("or-api");
    d.server.listen_after_bind();
    d.thread_done = true;
  });
  while (!d.server.is_running() && !d.thread_done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void ManagementApi::Stop() {
  auto& d = *impl_;
  if (!d.thread.joinable()) return;
  while (!d.server.is_running() && !d.thread_done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!d.thread_done) d.server.stop();
  // The server waits for the requests running: one waiting on a lock (an endpoint's, a
  // table's) would hold the relay's shutdown for as long as the lock is held. A second, then
  // the statement running is cut (the request is answered 503), and so is any later one until
  // the server is done; requests that had not started by then are answered 503 at once.
  const auto cut_from = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!d.thread_done) {
    if (std::chrono::steady_clock::now() >= cut_from) {
      std::lock_guard lk(d.busy_mu);
      d.stopping = true;
      for (Store* s : d.busy) s->Interrupt();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  d.thread.join();
  // Replays in the background: asked to stop between two parts, and the statement running cut
  // (again until they end: a cut that reaches a statement before it starts is lost).
  d.background_stop = true;
  std::lock_guard lk(d.background_mu);
  while (true) {
    bool all_done = true;
    for (auto& b : d.background) {
      if (b.done) continue;
      all_done = false;
      b.store->Interrupt();
    }
    if (all_done) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (auto& b : d.background) b.thread.join();
  d.background.clear();
}

int ManagementApi::port() const { return impl_->port; }

}  // namespace outbox::relay
