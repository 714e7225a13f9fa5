// A webhook URL checked and split: the one rule the sink, `endpoints add` and the management
// API share, so an endpoint the relay would refuse is refused when it is written.
#include "outbox_relay/webhook_url.h"

#include <cctype>
#include <stdexcept>
#include <string_view>

namespace outbox::relay {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

WebhookUrl ParseWebhookUrl(const std::string& url) {
  WebhookUrl out;
  for (char c : url) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7F) {
      throw std::invalid_argument("webhook url must not contain spaces or control characters");
    }
  }
  const std::size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) {
    throw std::invalid_argument("webhook url must start with http:// or https://");
  }
  const std::string scheme = Lower(std::string_view(url).substr(0, scheme_end));
  if (scheme == "https") {
    out.https = true;
  } else if (scheme != "http") {
    throw std::invalid_argument("webhook url must start with http:// or https://");
  }
  const std::size_t authority_begin = scheme_end + 3;
  std::size_t authority_end = url.find_first_of("/?#", authority_begin);
  if (authority_end == std::string::npos) authority_end = url.size();
  const std::string_view authority =
      std::string_view(url).substr(authority_begin, authority_end - authority_begin);
  if (authority.find('@') != std::string_view::npos) {
    throw std::invalid_argument("webhook url must not contain credentials (use headers)");
  }
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      throw std::invalid_argument("webhook url has an unterminated IPv6 address");
    }
    out.host = std::string(authority.substr(1, close - 1));
    // "[fe80::1%25eth0]": a zone names an interface of the relay's own host, which the checked
    // connect does not carry; every attempt failed "connection error" (review).
    if (const std::size_t zone = out.host.find('%'); zone != std::string::npos) {
      throw std::invalid_argument("webhook url: an IPv6 zone id (" + out.host.substr(zone) +
                                  ") is not supported; give the endpoint a routable address or "
                                  "a name");
    }
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') throw std::invalid_argument("webhook url has a bad host");
      port_text = after.substr(1);
      if (port_text.empty()) throw std::invalid_argument("webhook url has an empty port");
    }
  } else {
    const std::size_t colon = authority.find(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) throw std::invalid_argument("webhook url has an empty port");
    }
  }
  if (out.host.empty()) throw std::invalid_argument("webhook url has no host");
  if (port_text.empty()) {
    out.port = out.https ? 443 : 80;
  } else {
    if (!AllDigits(port_text) || port_text.size() > 5 || std::stoi(std::string(port_text)) < 1 ||
        std::stoi(std::string(port_text)) > 65535) {
      throw std::invalid_argument("webhook url has a bad port");
    }
    out.port = std::stoi(std::string(port_text));
  }
  std::string path = url.substr(authority_end);
  if (const std::size_t hash = path.find('#'); hash != std::string::npos) path.resize(hash);
  if (path.empty() || path.front() != '/') path = "/" + path;
  out.path = std::move(path);
  return out;
}

bool IsHttpToken(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) continue;
    if (std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos) continue;
    return false;
  }
  return true;
}

std::string OwnedWebhookHeader(const std::string& name) {
  struct Owned {
    std::string_view name;  // lowercase
    std::string_view why;
  };
  static constexpr Owned kOwned[] = {
      {"idempotency-key", "the relay sets it to the message's idempotency key"},
      {"content-type",
       "the relay sets it from the message (application/json or application/octet-stream)"},
      {"content-length", "the HTTP client sets it from the body"},
      {"host", "the HTTP client sets it from `url`"},
      {"connection", "the HTTP client manages connections"},
      {"keep-alive", "the HTTP client manages connections"},
      {"proxy-connection", "the HTTP client manages connections"},
      {"transfer-encoding", "the HTTP client sets it"},
      {"te", "the HTTP client sets it"},
      {"trailer", "the HTTP client sets it"},
      {"upgrade", "the HTTP client sets it"},
      {"expect", "the HTTP client sets it"},
  };
  const std::string lower = Lower(name);
  if (lower.starts_with("webhook-")) {
    return "the relay signs every delivery with the Standard Webhooks headers (webhook-id, "
           "webhook-timestamp, webhook-signature) and reserves the `webhook-` prefix";
  }
  for (const auto& owned : kOwned) {
    if (lower == owned.name) return std::string(owned.why);
  }
  return "";
}

std::string HmacKeyLengthProblem(std::size_t bytes) {
  if (bytes >= 24 && bytes <= 64) return "";
  return "is a key of " + std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes") +
         "; Standard Webhooks keys are 24 to 64 bytes (random), e.g. generate one with "
         "`echo \"whsec_$(openssl rand -base64 32)\"`";
}

}  // namespace outbox::relay
