#include "outbox/outbox.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string_view>

namespace outbox {
namespace {

// A uuid as outbox.enqueue_many takes one (migration 0015): 32 hex digits in groups of
// 8-4-4-4-12, each hyphen optional, the whole optionally in braces.
bool IsUuid(const std::string& s) {
  std::size_t i = 0, end = s.size();
  if (end > 0 && s[0] == '{') {
    if (s[end - 1] != '}') return false;
    ++i;
    --end;
  }
  int digits = 0;
  for (; i < end; ++i) {
    const char c = s[i];
    if (c == '-' && (digits == 8 || digits == 12 || digits == 16 || digits == 20) && i > 0 &&
        s[i - 1] != '-') {
      continue;
    }
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    ++digits;
  }
  return digits == 32;
}

std::string Iso8601(Clock::time_point tp) {
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(tp.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1'000'000);
  long frac = static_cast<long>(us % 1'000'000);
  if (frac < 0) {
    frac += 1'000'000;
    --secs;
  }
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
  return buf;
}

std::string Base64(const std::string& in) {
  static constexpr char kTable[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(in[i]) << 16) |
                       (static_cast<unsigned char>(in[i + 1]) << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    out += kTable[(v >> 18) & 63];
    out += kTable[(v >> 12) & 63];
    out += kTable[(v >> 6) & 63];
    out += kTable[v & 63];
  }
  if (i < in.size()) {
    unsigned v = static_cast<unsigned char>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out += kTable[(v >> 18) & 63];
    out += kTable[(v >> 12) & 63];
    out += i + 1 < in.size() ? kTable[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// W3C trace context, version-traceid-parentid-flags: lowercase hex, version not ff, ids not all
// zero (https://www.w3.org/TR/trace-context/#traceparent-header).
bool IsTraceparent(const std::string& s) {
  if (s.size() != 55 || s[2] != '-' || s[35] != '-' || s[52] != '-') return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i == 2 || i == 35 || i == 52) continue;
    const char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return s.compare(0, 2, "ff") != 0 && s.substr(3, 32) != std::string(32, '0') &&
         s.substr(36, 16) != std::string(16, '0');
}

/// Well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool IsUtf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = 1;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return false;
    }
    i += len;
  }
  return true;
}

const char* const kNulFix =
    " contains U+0000 (NUL), which PostgreSQL's text and jsonb cannot hold; remove it, or send "
    "binary data in a Bytes() payload";

void RequireUtf8(std::string_view text, const std::string& what) {
  if (!IsUtf8(text)) {
    throw InvalidMessage("outbox: " + what +
                         " is not valid UTF-8; convert it (from Latin-1, say) before publishing, "
                         "or send binary data in a Bytes() payload");
  }
  if (text.find('\0') != std::string_view::npos) throw InvalidMessage("outbox: " + what + kNulFix);
}

/// Reads JSON text once: whether it is JSON, and whether a string or key in it holds U+0000
/// (written \u0000; a raw NUL is not JSON), which jsonb refuses.
class PayloadCheck : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool has_nul = false;
  /// The text stopped being read at a number beyond a double's range (1e400), which is JSON
  /// all the same.
  bool overflow = false;
  /// A number with an exponent or very many digits: PostgreSQL's numeric may not hold it.
  bool wide_number = false;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t& text) override {
    wide_number = wide_number || text.size() > 1000 || text.find_first_of("eE") != string_t::npos;
    return true;
  }
  bool string(string_t& v) override { return Text(v); }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t& v) override { return Text(v); }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& e) override {
    overflow = e.id == 406;  // "number overflow"
    return false;
  }

 private:
  bool Text(const string_t& v) {
    has_nul = v.find('\0') != string_t::npos;
    return !has_nul;  // stop at the first
  }
};

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

/// Whether `t` is a number as JSON writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
bool IsJsonNumber(std::string_view t) {
  std::size_t k = 0;
  const auto digits = [&] {
    const std::size_t from = k;
    while (k < t.size() && IsDigit(t[k])) ++k;
    return k > from;
  };
  if (k < t.size() && t[k] == '-') ++k;
  if (k < t.size() && t[k] == '0') {
    ++k;
  } else if (k >= t.size() || !IsDigit(t[k]) || !digits()) {
    return false;
  }
  if (k < t.size() && t[k] == '.' && (++k, !digits())) return false;
  if (k < t.size() && (t[k] == 'e' || t[k] == 'E')) {
    ++k;
    if (k < t.size() && (t[k] == '+' || t[k] == '-')) ++k;
    if (!digits()) return false;
  }
  return k == t.size();
}

/// Why PostgreSQL's numeric, which jsonb stores numbers in, cannot hold the JSON number `t`
/// ("value overflows numeric format"), or nothing: at most 131,072 digits before the decimal
/// point, and at most 16,383 after it counting the digits as written (1.5e-16383 is refused,
/// 0.1e-16382 taken). Measured against PostgreSQL 15.
std::optional<std::string> NumericRefuses(std::string_view t) {
  std::size_t k = t.starts_with('-') ? 1 : 0;
  const std::size_t int_from = k;
  while (k < t.size() && IsDigit(t[k])) ++k;
  const std::string_view int_part = t.substr(int_from, k - int_from);
  std::string_view frac_part;
  if (k < t.size() && t[k] == '.') {
    const std::size_t from = ++k;
    while (k < t.size() && IsDigit(t[k])) ++k;
    frac_part = t.substr(from, k - from);
  }
  long long exponent = 0;
  if (k < t.size() && (t[k] == 'e' || t[k] == 'E')) {
    ++k;
    const bool negative = k < t.size() && t[k] == '-';
    if (k < t.size() && (t[k] == '-' || t[k] == '+')) ++k;
    for (; k < t.size(); ++k) exponent = std::min(exponent * 10 + (t[k] - '0'), 1'000'000'000LL);
    if (negative) exponent = -exponent;
  }
  const long long after_point = static_cast<long long>(frac_part.size()) - exponent;
  if (after_point > 16383) return "more than 16,383 digits after the decimal point";
  const std::string digits = std::string(int_part) + std::string(frac_part);
  const std::size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) return std::nullopt;  // zero
  const long long top_power =
      static_cast<long long>(int_part.size()) - 1 - static_cast<long long>(first) + exponent;
  if (top_power > 131071) return "more than 131,072 digits before the decimal point";
  return std::nullopt;
}

/// Calls `each(at, length)` with every number token outside the strings of `json` (runs of
/// number characters, whether or not they are JSON numbers).
template <class F>
void ForEachNumber(std::string_view json, F&& each) {
  bool in_string = false;
  for (std::size_t i = 0; i < json.size();) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\' && i + 1 < json.size()) {
        i += 2;
        continue;
      }
      in_string = c != '"';
    } else if (c == '"') {
      in_string = true;
    } else if (c == '-' || IsDigit(c)) {
      std::size_t end = i;
      while (end < json.size() && (IsDigit(json[end]) || json[end] == '-' || json[end] == '+' ||
                                   json[end] == '.' || json[end] == 'e' || json[end] == 'E')) {
        ++end;
      }
      each(i, end - i);
      i = end;
      continue;
    }
    ++i;
  }
}

/// `json` with every number outside its strings written as 0: the same JSON, or not JSON, as
/// before, whatever the numbers were. Runs of number characters that are not a JSON number
/// (`01`, `1e5e5`) stay as they are, for the parser to refuse.
std::string NumbersAsZero(std::string_view json) {
  std::string out;
  out.reserve(json.size());
  std::size_t copied = 0;
  ForEachNumber(json, [&](std::size_t at, std::size_t length) {
    const std::string_view run = json.substr(at, length);
    out.append(json.substr(copied, at - copied));
    out.append(IsJsonNumber(run) ? std::string_view("0") : run);
    copied = at + length;
  });
  out.append(json.substr(copied));
  return out;
}

/// Whether `payload` is JSON that jsonb takes (no U+0000), or InvalidMessage saying why not.
/// A number beyond a double's range (1e400) is JSON, and jsonb keeps it exactly, but nlohmann
/// stops reading at it (out_of_range 406): the text is then read once more with every number
/// written as 0, so what follows it is checked as well.
void CheckJsonPayload(const std::string& payload) {
  // What the parser below takes and PostgreSQL does not: it reads a raw NUL byte as the end of
  // the input, and skips a leading byte order mark.
  if (payload.find('\0') != std::string::npos) {
    throw InvalidMessage(std::string("outbox: payload") + kNulFix);
  }
  if (payload.starts_with("\xEF\xBB\xBF")) {
    throw InvalidMessage(
        "outbox: payload starts with a UTF-8 byte order mark, which is not JSON; strip the "
        "first 3 bytes (EF BB BF) before Json()");
  }
  // JSON, but with a number jsonb cannot store: refused here, naming it, rather than by the
  // database as "value overflows numeric format" naming nothing.
  const auto check_numbers = [&] {
    ForEachNumber(payload, [&](std::size_t at, std::size_t length) {
      const std::string_view number = std::string_view(payload).substr(at, length);
      if (!IsJsonNumber(number)) return;
      if (const auto why = NumericRefuses(number)) {
        throw InvalidMessage("outbox: payload has a number PostgreSQL's jsonb cannot store (" +
                             std::string(number.substr(0, 40)) + (number.size() > 40 ? "..." : "") +
                             ": " + *why + "); send it as a JSON string");
      }
    });
  };
  PayloadCheck check;
  if (nlohmann::json::sax_parse(payload, &check)) {
    if (check.wide_number) check_numbers();
    return;
  }
  bool nul = check.has_nul;
  if (!nul && check.overflow) {
    PayloadCheck again;
    if (nlohmann::json::sax_parse(NumbersAsZero(payload), &again)) {
      check_numbers();
      return;
    }
    nul = again.has_nul;
  }
  if (nul) throw InvalidMessage(std::string("outbox: payload") + kNulFix);
  throw InvalidMessage(
      "outbox: payload is not valid JSON; pass JSON text to Json() or raw bytes to Bytes()");
}

void Validate(const OutboxMessage& m) {
  RequireUtf8(m.destination, "destination");
  if (m.ordering_key) RequireUtf8(*m.ordering_key, "ordering key");
  RequireUtf8(m.event_type, "event type");
  for (const auto& [name, value] : m.headers) {
    RequireUtf8(name, "header name");
    RequireUtf8(value, "header \"" + name + "\"");
  }
  if (m.destination.empty()) {
    throw InvalidMessage(
        "outbox: destination must not be empty; pass the destination name the relay is configured "
        "with");
  }
  // Characters, as outbox.messages counts them (UTF-8 checked above).
  if (std::count_if(m.destination.begin(), m.destination.end(),
                    [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }) > 255) {
    throw InvalidMessage("outbox: destination is longer than 255 characters; use a shorter name");
  }
  if (m.ordering_key && m.ordering_key->empty()) {
    throw InvalidMessage(
        "outbox: ordering key must not be empty; omit Key() for unordered messages");
  }
  if (m.ordering_key && m.ordering_key->size() > kMaxOrderingKeyBytes) {
    throw InvalidMessage("outbox: ordering key is " + std::to_string(m.ordering_key->size()) +
                         " bytes long, the limit is " + std::to_string(kMaxOrderingKeyBytes) +
                         "; use an entity id such as \"order-42\", or a hash of a longer key");
  }
  if (m.event_type.size() > kMaxEventTypeBytes) {
    throw InvalidMessage("outbox: event type is " + std::to_string(m.event_type.size()) +
                         " bytes long, the limit is " + std::to_string(kMaxEventTypeBytes) +
                         "; use a short name such as \"order.paid\"");
  }
  if (m.headers.size() > kMaxHeaders) {
    throw InvalidMessage("outbox: " + std::to_string(m.headers.size()) + " headers, the limit is " +
                         std::to_string(kMaxHeaders) + "; put bulk data in the payload");
  }
  if (m.deliver_after && *m.deliver_after > SchedulingHorizonEnd(Clock::now())) {
    throw InvalidMessage(
        "outbox: deliver time is more than 1 year ahead (the scheduling horizon); keep later "
        "work in your own table and publish it nearer the time");
  }
  if (m.payload_is_json) CheckJsonPayload(m.payload);
  for (std::size_t i = 0; i < m.headers.size(); ++i) {
    const auto& [name, value] = m.headers[i];
    if (name.empty()) throw InvalidMessage("outbox: header name must not be empty");
    if (name.size() > kMaxHeaderNameBytes) {
      throw InvalidMessage("outbox: header name is " + std::to_string(name.size()) +
                           " bytes long, the limit is " + std::to_string(kMaxHeaderNameBytes) +
                           "; use a short name such as \"tenant\"");
    }
    if (value.size() > kMaxHeaderValueBytes) {
      throw InvalidMessage("outbox: header \"" + name + "\" has a value of " +
                           std::to_string(value.size()) + " bytes, the limit is " +
                           std::to_string(kMaxHeaderValueBytes) + "; put bulk data in the payload");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (m.headers[j].first == m.headers[i].first) {
        throw InvalidMessage("outbox: header \"" + m.headers[i].first +
                             "\" is set twice; set each header once");
      }
    }
  }
  // The trace context headers under any case of their names, each once (as the SQL function
  // checks them, 0031): a webhook carries one header of a name.
  const auto lower = [](std::string s) {
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  int traceparents = 0, tracestates = 0;
  for (const auto& [name, value] : m.headers) {
    const std::string lowered = lower(name);
    if (lowered == "traceparent" && !IsTraceparent(value)) {
      throw InvalidMessage("outbox: header \"" + name + "\" is not a W3C traceparent: \"" +
                           value.substr(0, 60) +
                           "\"; write version-traceid-parentid-flags in lowercase hex, e.g. "
                           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    }
    if (lowered == "tracestate" && value.size() > kMaxTracestateBytes) {
      throw InvalidMessage("outbox: header \"" + name + "\" is " + std::to_string(value.size()) +
                           " bytes long, the limit is " + std::to_string(kMaxTracestateBytes) +
                           "; drop list members from the right");
    }
    if ((lowered == "traceparent" && ++traceparents > 1) ||
        (lowered == "tracestate" && ++tracestates > 1)) {
      throw InvalidMessage("outbox: header \"" + lowered +
                           "\" is set twice, under names that differ only in case; set "
                           "traceparent and tracestate once each, in lowercase");
    }
  }
  if (m.idempotency_key && !IsUuid(*m.idempotency_key)) {
    throw InvalidMessage(
        "outbox: idempotency key \"" + *m.idempotency_key +
        "\" is not a uuid; pass a uuid such as 123e4567-e89b-12d3-a456-426614174000");
  }
}

/// The message as enqueue_many's JSON object. A JSON payload goes in as the caller wrote it
/// (validated, not parsed and written again: nlohmann's numbers are doubles, and a 23-digit
/// integer or a long decimal came out rounded; jsonb keeps them exactly).
std::string ToJsonText(const OutboxMessage& m) {
  nlohmann::json j;
  j["destination"] = m.destination;
  if (!m.payload_is_json) j["payload_base64"] = Base64(m.payload);
  if (m.ordering_key) j["ordering_key"] = *m.ordering_key;
  nlohmann::json h = nlohmann::json::object();
  for (const auto& [k, v] : m.headers) h[k] = v;
  j["headers"] = std::move(h);
  j["event_type"] = m.event_type;
  if (m.deliver_after) j["deliver_after"] = Iso8601(*m.deliver_after);
  if (m.idempotency_key) j["idempotency_key"] = *m.idempotency_key;
  std::string text = j.dump();  // an object with at least "destination": ends in '}'
  if (m.payload_is_json) {
    text.pop_back();
    text += ",\"payload\":";
    text += m.payload;
    text += '}';
  }
  return text;
}

/// A refusal only the database can make (its limits and guard, checked there for every
/// writer), as InvalidMessage: "<message>. <hint>", without libpq's severity ("ERROR:  ", in
/// the server's lc_messages), the SQLSTATE verbose errors put before the message, and the
/// PL/pgSQL call stack (CONTEXT) or source location that follow. Other errors stay libpqxx's.
[[noreturn]] void Rethrow(const pqxx::sql_error& e) {
  const std::string state = e.sqlstate();
  if (state != "22023" && state != "54000") throw;
  std::string_view text = e.what();
  std::string message, hint;
  bool first = true;
  while (!text.empty()) {
    const auto end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    if (first) {
      first = false;
      // libpq writes "<severity>:  <message>"; a message of ours has no double space.
      if (const auto at = line.find(":  "); at != std::string_view::npos)
        line.remove_prefix(at + 3);
      if (line.substr(0, state.size() + 2) == state + ": ") line.remove_prefix(state.size() + 2);
      message = line;
    } else if (line.substr(0, 7) == "HINT:  ") {
      hint = line.substr(7);
    }
  }
  if (!hint.empty()) message += ". " + hint;
  throw InvalidMessage(message, state);
}

}  // namespace

Clock::time_point SchedulingHorizonEnd(Clock::time_point now) {
  using namespace std::chrono;
  const auto day = floor<days>(now);
  auto date = year_month_day(day) + years(1);
  // PostgreSQL clamps a day past the month's end to its last day: 29 February + 1 year is
  // 28 February.
  if (!date.ok()) date = date.year() / date.month() / last;
  return sys_days(date) + (now - day);
}

MessageBuilder::MessageBuilder(std::string destination) {
  msg_.destination = std::move(destination);
}

MessageBuilder& MessageBuilder::Json(std::string json_text) {
  msg_.payload = std::move(json_text);
  msg_.payload_is_json = true;
  has_payload_ = true;
  return *this;
}

MessageBuilder& MessageBuilder::Bytes(std::string bytes) {
  msg_.payload = std::move(bytes);
  msg_.payload_is_json = false;
  has_payload_ = true;
  return *this;
}

MessageBuilder& MessageBuilder::Key(std::string ordering_key) {
  msg_.ordering_key = std::move(ordering_key);
  return *this;
}

MessageBuilder& MessageBuilder::Header(std::string name, std::string value) {
  msg_.headers.emplace_back(std::move(name), std::move(value));
  return *this;
}

MessageBuilder& MessageBuilder::TraceContext(std::string traceparent, std::string tracestate) {
  msg_.headers.emplace_back("traceparent", std::move(traceparent));
  if (!tracestate.empty()) msg_.headers.emplace_back("tracestate", std::move(tracestate));
  return *this;
}

MessageBuilder& MessageBuilder::EventType(std::string event_type) {
  msg_.event_type = std::move(event_type);
  return *this;
}

MessageBuilder& MessageBuilder::DeliverAt(Clock::time_point when) {
  msg_.deliver_after = when;
  delay_.reset();
  return *this;
}

MessageBuilder& MessageBuilder::DeliverAfter(std::chrono::milliseconds delay) {
  delay_ = delay;
  msg_.deliver_after.reset();
  return *this;
}

MessageBuilder& MessageBuilder::Jitter(std::chrono::milliseconds max) {
  jitter_ = max;
  return *this;
}

MessageBuilder& MessageBuilder::IdempotencyKey(std::string uuid) {
  msg_.idempotency_key = std::move(uuid);
  return *this;
}

OutboxMessage MessageBuilder::Build() const {
  if (!has_payload_) {
    throw InvalidMessage("outbox: message to \"" + msg_.destination +
                         "\" has no payload; call Json() or Bytes()");
  }
  if (jitter_.count() < 0) throw InvalidMessage("outbox: jitter must not be negative");
  if (delay_ && delay_->count() < 0)
    throw InvalidMessage("outbox: DeliverAfter delay must not be negative");
  // Past the horizon whatever the clock says; refused before the addition, which a delay of
  // centuries overflows (into a time in the past, delivered at once).
  constexpr std::chrono::milliseconds kPastAnyHorizon = std::chrono::days(367);
  if ((delay_ && *delay_ >= kPastAnyHorizon) || jitter_ >= kPastAnyHorizon ||
      (delay_ && *delay_ + jitter_ >= kPastAnyHorizon)) {
    throw InvalidMessage("outbox: message to \"" + msg_.destination +
                         "\": DeliverAfter/Jitter puts it more than 1 year ahead (the scheduling "
                         "horizon); keep later work in your own table and enqueue it nearer the "
                         "time");
  }
  OutboxMessage m = msg_;
  if (delay_) m.deliver_after = Clock::now() + *delay_;
  if (jitter_.count() > 0) {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::uniform_int_distribution<long long> dist(0,
                                                  std::chrono::microseconds(jitter_).count() - 1);
    m.deliver_after = m.deliver_after.value_or(Clock::now()) + std::chrono::microseconds(dist(rng));
  }
  Validate(m);
  return m;
}

std::int64_t Publish(pqxx::dbtransaction& tx, const OutboxMessage& message) {
  return PublishMany(tx, {message}).front();
}

std::vector<std::int64_t> PublishMany(pqxx::dbtransaction& tx,
                                      const std::vector<OutboxMessage>& messages) {
  for (const auto& m : messages) Validate(m);
  std::vector<std::int64_t> ids;
  if (messages.empty()) return ids;
  ids.reserve(messages.size());
  // One call, whatever the count: enqueue_many takes the locks of the keys it is given in one
  // global order before it writes, so keys split over several calls (it was one per 1000
  // messages) were locked call by call, and two such batches sharing keys could deadlock.
  std::string batch = "[";
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (i > 0) batch += ',';
    batch += ToJsonText(messages[i]);
  }
  batch += ']';
  pqxx::result r;
  try {
    r = tx.exec_params("SELECT outbox.enqueue_many($1::jsonb)", batch);
  } catch (const pqxx::sql_error& e) {
    Rethrow(e);
  }
  for (const auto& row : r) ids.push_back(row[0].as<std::int64_t>());
  return ids;
}

}  // namespace outbox
