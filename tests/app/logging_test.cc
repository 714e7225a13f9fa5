#include "outbox_relay/logging.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <nlohmann/json.hpp>
#include <sstream>

namespace outbox::relay {
namespace {

TEST(JsonLogs, EveryLineIsValidJsonWhateverTheMessageHolds) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  spdlog::logger logger("json-test", sink);
  logger.set_formatter(MakeJsonLogFormatter());
  logger.warn("claim failed: ERROR:  relation \"outbox.messages\" does not exist\nLINE 1: {}",
              "tab\there \\ \x01");
  logger.info("plain");
  std::istringstream lines(out.str());
  std::string line;
  std::vector<nlohmann::json> parsed;
  while (std::getline(lines, line))
    parsed.push_back(nlohmann::json::parse(line));  // throws if invalid
  ASSERT_EQ(parsed.size(), 2u);
  EXPECT_EQ(parsed[0]["level"], "warning");
  EXPECT_EQ(parsed[0]["msg"],
            "claim failed: ERROR:  relation \"outbox.messages\" does not exist\nLINE 1: tab\there "
            "\\ \x01");
  EXPECT_EQ(parsed[1]["msg"], "plain");
  EXPECT_TRUE(parsed[1]["ts"].get<std::string>().ends_with("Z"));
}

}  // namespace
}  // namespace outbox::relay
