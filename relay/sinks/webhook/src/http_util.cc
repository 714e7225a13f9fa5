// URL splitting, Retry-After parsing and reason snippets for the webhook sink.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <stdexcept>
#include <string>

#include "webhook_internal.h"

namespace outbox::relay::webhook_detail {
namespace {

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int MonthIndex(const char* mon) {
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  for (int i = 0; i < 12; ++i) {
    if (std::string_view(mon) == kMonths[i]) return i;
  }
  return -1;
}

/// Unix seconds of an HTTP-date in any of the three formats RFC 9110 makes recipients accept.
std::optional<long long> ParseHttpDate(const std::string& s) {
  char weekday[16] = {};
  char mon[4] = {};
  int day = 0, year = 0, hour = 0, minute = 0, second = 0, used = 0;
  bool ok = false;
  // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT"
  if (std::sscanf(s.c_str(), "%15[A-Za-z], %2d %3[A-Za-z] %4d %2d:%2d:%2d GMT%n", weekday, &day,
                  mon, &year, &hour, &minute, &second, &used) == 7 &&
      static_cast<std::size_t>(used) == s.size()) {
    ok = true;
  }
  // RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT"
  if (!ok &&
      std::sscanf(s.c_str(), "%15[A-Za-z], %2d-%3[A-Za-z]-%4d %2d:%2d:%2d GMT%n", weekday, &day,
                  mon, &year, &hour, &minute, &second, &used) == 7 &&
      static_cast<std::size_t>(used) == s.size()) {
    ok = true;
    if (year < 100) year += year < 70 ? 2000 : 1900;
  }
  // asctime: "Sun Nov  6 08:49:37 1994"
  if (!ok &&
      std::sscanf(s.c_str(), "%15[A-Za-z] %3[A-Za-z] %2d %2d:%2d:%2d %4d%n", weekday, mon, &day,
                  &hour, &minute, &second, &year, &used) == 7 &&
      static_cast<std::size_t>(used) == s.size()) {
    ok = true;
  }
  if (!ok) return std::nullopt;
  const int month = MonthIndex(mon);
  if (month < 0 || day < 1 || day > 31 || year < 1970 || hour > 23 || minute > 59 || second > 60 ||
      hour < 0 || minute < 0 || second < 0) {
    return std::nullopt;
  }
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  const time_t t = timegm(&tm);
  if (t == static_cast<time_t>(-1)) return std::nullopt;
  return static_cast<long long>(t);
}

/// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not one.
std::size_t Utf8SequenceLength(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // not above U+10FFFF
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < len; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return len;
}

}  // namespace

std::optional<std::chrono::milliseconds> ParseRetryAfter(
    std::string_view value, std::chrono::system_clock::time_point now) {
  value = TrimOws(value);
  // Bound what a receiver can ask for so the arithmetic never overflows (about 31 years).
  constexpr long long kMaxSeconds = 1'000'000'000;
  if (AllDigits(value)) {
    long long seconds = 0;
    for (char c : value) {
      seconds = seconds * 10 + (c - '0');
      if (seconds > kMaxSeconds) {
        seconds = kMaxSeconds;
        break;
      }
    }
    return std::chrono::milliseconds(seconds * 1000);
  }
  const auto at = ParseHttpDate(std::string(value));
  if (!at) return std::nullopt;
  const auto now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  long long delta = *at * 1000 - now_ms;
  if (delta < 0) delta = 0;
  if (delta > kMaxSeconds * 1000) delta = kMaxSeconds * 1000;
  return std::chrono::milliseconds(delta);
}

std::string Snippet(std::string_view text, std::size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t len = Utf8SequenceLength(text, i);
    if (len == 0) {
      if (out.size() + 1 > max_bytes) break;
      out += '?';
      ++i;
      continue;
    }
    if (out.size() + len > max_bytes) break;
    const auto c = static_cast<unsigned char>(text[i]);
    if (len == 1 && (c < 0x20 || c == 0x7F)) {
      out += ' ';
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  const std::size_t first = out.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  const std::size_t last = out.find_last_not_of(' ');
  return out.substr(first, last - first + 1);
}

}  // namespace outbox::relay::webhook_detail
