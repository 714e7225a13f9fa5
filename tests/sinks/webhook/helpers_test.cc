// The webhook sink's internal helpers: URL splitting, Retry-After, reason snippets.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "webhook_internal.h"

namespace outbox::relay::webhook_detail {
namespace {

using std::chrono::milliseconds;

TEST(WebhookUrl, SplitsSchemeHostPortAndKeepsQuery) {
  const ParsedUrl a = ParseUrl("https://hooks.example.com/in/orders?tenant=7&x=%20#frag");
  EXPECT_TRUE(a.https);
  EXPECT_EQ(a.host, "hooks.example.com");
  EXPECT_EQ(a.port, 443);
  EXPECT_EQ(a.path, "/in/orders?tenant=7&x=%20");

  const ParsedUrl b = ParseUrl("HTTP://127.0.0.1:8080");
  EXPECT_FALSE(b.https);
  EXPECT_EQ(b.host, "127.0.0.1");
  EXPECT_EQ(b.port, 8080);
  EXPECT_EQ(b.path, "/");

  const ParsedUrl c = ParseUrl("http://[::1]:9000?q=1");
  EXPECT_EQ(c.host, "::1");
  EXPECT_EQ(c.port, 9000);
  EXPECT_EQ(c.path, "/?q=1");
}

TEST(WebhookUrl, RejectsWhatCannotBePosted) {
  for (const std::string url :
       {"", "example.com/hook", "ftp://example.com/", "http://", "http:///path", "http://host:/x",
        "http://host:0/", "http://host:65536/", "http://host:12ab/", "http://user:pw@host/",
        "http://[::1/", "http://host/a b", "https://host/\r\nX: y"}) {
    EXPECT_THROW(ParseUrl(url), std::invalid_argument) << url;
  }
}

TEST(RetryAfter, DeltaSeconds) {
  const auto now = std::chrono::system_clock::now();
  EXPECT_EQ(ParseRetryAfter("7", now), milliseconds(7000));
  EXPECT_EQ(ParseRetryAfter(" 0 ", now), milliseconds(0));
  EXPECT_EQ(ParseRetryAfter("99999999999999999999", now), milliseconds(1'000'000'000'000LL));
  EXPECT_FALSE(ParseRetryAfter("-5", now));
  EXPECT_FALSE(ParseRetryAfter("1.5", now));
  EXPECT_FALSE(ParseRetryAfter("", now));
  EXPECT_FALSE(ParseRetryAfter("soon", now));
}

TEST(RetryAfter, HttpDatesInAllThreeFormats) {
  // 1994-11-06 08:49:37 UTC is unix 784111777.
  const auto now = std::chrono::system_clock::time_point(std::chrono::seconds(784111777 - 30));
  EXPECT_EQ(ParseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", now), milliseconds(30'000));
  EXPECT_EQ(ParseRetryAfter("Sunday, 06-Nov-94 08:49:37 GMT", now), milliseconds(30'000));
  EXPECT_EQ(ParseRetryAfter("Sun Nov  6 08:49:37 1994", now), milliseconds(30'000));
  // A date already past means "now".
  EXPECT_EQ(ParseRetryAfter("Sun, 06 Nov 1994 08:49:00 GMT", now), milliseconds(0));
  EXPECT_FALSE(ParseRetryAfter("Sun, 06 Foo 1994 08:49:37 GMT", now));
  EXPECT_FALSE(ParseRetryAfter("Sun, 06 Nov 1994 08:49:37 PST", now));
  EXPECT_FALSE(ParseRetryAfter("Sun, 06 Nov 1994 25:49:37 GMT", now));
}

TEST(ReasonSnippet, OneLineValidUtf8WithinTheLimit) {
  EXPECT_EQ(Snippet("  not found\n", 200), "not found");
  EXPECT_EQ(Snippet("a\r\nb\tc", 200), "a  b c");
  EXPECT_EQ(Snippet(std::string(300, 'x'), 200), std::string(200, 'x'));
  // "é" is two bytes: a cut never splits it.
  EXPECT_EQ(Snippet("ab\xc3\xa9", 3), "ab");
  EXPECT_EQ(Snippet("ab\xc3\xa9", 4), "ab\xc3\xa9");
  // Invalid bytes and NUL cannot end up in a Postgres text column.
  EXPECT_EQ(Snippet(std::string("x\xff\xc3y\0z", 6), 200), std::string("x??y z"));
  EXPECT_EQ(Snippet("\xed\xa0\x80", 200), "???");  // UTF-16 surrogate
  EXPECT_EQ(Snippet("", 200), "");
}

TEST(HeaderNames, Tokens) {
  EXPECT_TRUE(IsHttpToken("X-Trace-Id"));
  EXPECT_TRUE(IsHttpToken("a!#$%&'*+-.^_`|~9"));
  EXPECT_FALSE(IsHttpToken(""));
  EXPECT_FALSE(IsHttpToken("Bad Name"));
  EXPECT_FALSE(IsHttpToken("X:Y"));
  EXPECT_FALSE(IsHttpToken("X\r\nY"));
}

}  // namespace
}  // namespace outbox::relay::webhook_detail
