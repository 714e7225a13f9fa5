#include "outbox_relay/conninfo.h"

#include <libpq-fe.h>

#include <array>
#include <cstdlib>
#include <memory>
#include <set>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "outbox_relay/connection_string.h"

namespace outbox::relay {
namespace {

constexpr std::array<std::pair<std::string_view, std::string_view>, 5> kDefaults{{
    {"connect_timeout", "10"},
    {"keepalives_idle", "30"},
    {"keepalives_interval", "10"},
    {"keepalives_count", "3"},
    {"tcp_user_timeout", "30000"},
}};

void AppendPair(std::string& out, std::string_view key, std::string_view value) {
  if (!out.empty()) out += ' ';
  out.append(key);
  out += "='";
  for (char c : value) {
    if (c == '\\' || c == '\'') out += '\\';
    out += c;
  }
  out += '\'';
}

}  // namespace

std::string WithConnectionDefaults(const std::string& database_url) {
  char* error = nullptr;
  std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)> options(
      PQconninfoParse(database_url.c_str(), &error), &PQconninfoFree);
  if (error != nullptr) PQfreemem(error);
  if (!options) {
    throw std::invalid_argument("database_url is not a valid connection string: " +
                                ConnectionStringProblem(database_url));
  }
  std::string out;
  std::set<std::string_view> set;
  for (const PQconninfoOption* o = options.get(); o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    AppendPair(out, o->keyword, o->val);
    set.insert(o->keyword);
  }
  // libpq takes a service's values (pg_service.conf) and then the environment's only for
  // options the string leaves unset, so a default written here would override them: with a
  // service the string stays as it is, and PGCONNECT_TIMEOUT keeps its say.
  if (set.count("service") || std::getenv("PGSERVICE") != nullptr) return database_url;
  for (const auto& [key, value] : kDefaults) {
    if (set.count(key)) continue;
    if (key == "connect_timeout" && std::getenv("PGCONNECT_TIMEOUT") != nullptr) continue;
    AppendPair(out, key, value);
  }
  return out;
}

}  // namespace outbox::relay
