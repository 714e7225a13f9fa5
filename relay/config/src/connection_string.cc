#include "outbox_relay/connection_string.h"

#include <libpq-fe.h>

#include <memory>
#include <string_view>
#include <vector>

namespace outbox::relay {
namespace {

/// The parts of `url` that may hold a secret: a URI's user information (between "://" and
/// the last '@' of the authority) and the value of every password= pair.
std::vector<std::string_view> SecretParts(std::string_view url) {
  std::vector<std::string_view> out;
  if (const auto scheme = url.find("://"); scheme != std::string_view::npos) {
    const auto begin = scheme + 3;
    auto end = url.find_first_of("/?#", begin);
    if (end == std::string_view::npos) end = url.size();
    const auto at = url.substr(begin, end - begin).rfind('@');
    if (at != std::string_view::npos) out.push_back(url.substr(begin, at));
    if (const auto query = url.find('?', begin); query != std::string_view::npos) {
      out.push_back(url.substr(query));  // ?password=... among the parameters
    }
  } else {
    for (auto pos = url.find("password"); pos != std::string_view::npos;
         pos = url.find("password", pos + 1)) {
      out.push_back(url.substr(pos));  // the value, and whatever follows it
    }
  }
  return out;
}

std::string Redacted(std::string message, const std::vector<std::string_view>& secrets) {
  std::string out;
  std::size_t pos = 0;
  while (true) {
    const auto open = message.find('"', pos);
    const auto close = open == std::string::npos ? open : message.find('"', open + 1);
    if (close == std::string::npos) break;
    const std::string_view token(message.data() + open + 1, close - open - 1);
    bool secret = false;
    for (const auto part : secrets) {
      if (!token.empty() && !part.empty() &&
          (part.find(token) != std::string_view::npos ||
           token.find(part) != std::string_view::npos)) {
        secret = true;
      }
    }
    out.append(message, pos, open - pos);
    out += secret ? std::string("(not shown)") : message.substr(open, close - open + 1);
    pos = close + 1;
  }
  out.append(message, pos);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

}  // namespace

std::string ConnectionStringProblem(const std::string& database_url) {
  char* error = nullptr;
  std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)> options(
      PQconninfoParse(database_url.c_str(), &error), &PQconninfoFree);
  if (options) {
    if (error != nullptr) PQfreemem(error);
    return "";
  }
  std::string message = error != nullptr ? error : "libpq cannot parse it";
  if (error != nullptr) PQfreemem(error);
  message = Redacted(std::move(message), SecretParts(database_url));
  if (message.find("percent") != std::string::npos) {
    message +=
        "; in a URI write '%' as %25 (and '@' as %40, ':' as %3A, '/' as %2F, '?' as %3F, '#' "
        "as %23), in the password too";
  }
  return message;
}

}  // namespace outbox::relay
