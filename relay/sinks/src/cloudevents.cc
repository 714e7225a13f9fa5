#include "outbox_relay/cloudevents.h"

#include <cstdio>
#include <ctime>

namespace outbox::relay {

std::string FormatRfc3339(std::chrono::system_clock::time_point tp) {
  using namespace std::chrono;
  const auto ms = floor<milliseconds>(tp);
  const auto secs = floor<seconds>(ms);
  const auto millis = static_cast<int>((ms - secs).count());
  const std::time_t t = system_clock::to_time_t(system_clock::time_point(secs));
  std::tm tm{};
  gmtime_r(&t, &tm);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03dZ", date, millis);
  return out;
}

namespace {

/// `text` as one URI path segment: RFC 3986 unreserved characters as they are, every other
/// byte (UTF-8 included) as %XX.
std::string PercentEncoded(const std::string& text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '.' || c == '_' || c == '~') {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> CloudEventAttributes(const Message& msg,
                                                                      const std::string& source) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(6);
  out.emplace_back("specversion", "1.0");
  out.emplace_back("id", msg.idempotency_key);
  // The default source must be a URI reference: a destination's name may hold anything.
  out.emplace_back("source",
                   source.empty() ? "/outbox-relay/" + PercentEncoded(msg.destination) : source);
  out.emplace_back("type", msg.event_type.empty() ? msg.destination : msg.event_type);
  out.emplace_back("time", FormatRfc3339(msg.created_at));
  if (msg.ordering_key) {
    // A webhook service's row for one endpoint is keyed "<endpoint>:<key>": the subject is
    // the message's own key.
    std::string subject = *msg.ordering_key;
    if (msg.endpoint_id && subject.starts_with(*msg.endpoint_id + ":")) {
      subject.erase(0, msg.endpoint_id->size() + 1);
    }
    out.emplace_back("subject", std::move(subject));
  }
  return out;
}

}  // namespace outbox::relay
