// The operator-facing files agree with the code: every metric RelayMetrics exposes is
// documented in docs/operations.md, the dashboard and the alert rules use only metrics that
// exist, and every alert's runbook link lands on a section of docs/operations.md.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "outbox_relay/metrics.h"

namespace outbox::relay {
namespace {

std::string Read(const std::string& relative) {
  std::ifstream in(std::string(OUTBOX_SOURCE_DIR) + "/" + relative);
  EXPECT_TRUE(in.good()) << relative;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// name -> type, from the exposition of a fresh RelayMetrics.
std::map<std::string, std::string> Families() {
  RelayMetrics m("dev");
  m.SetReadyCallback([] { return true; });
  std::map<std::string, std::string> out;
  const std::regex type_line(R"(# TYPE (\S+) (\S+))");
  const auto text = m.Render();
  for (std::sregex_iterator it(text.begin(), text.end(), type_line), end; it != end; ++it) {
    out[(*it)[1]] = (*it)[2];
  }
  return out;
}

// Every outbox_* identifier in `text`, histogram suffixes folded onto their family.
std::set<std::string> MetricNamesIn(const std::string& text,
                                    const std::map<std::string, std::string>& families) {
  std::set<std::string> out;
  const std::regex ident(R"(\boutbox_[a-z0-9_]+)");
  for (std::sregex_iterator it(text.begin(), text.end(), ident), end; it != end; ++it) {
    std::string name = (*it)[0];
    if (name.back() == '_') continue;  // a wildcard in prose, e.g. outbox_queue_*
    for (const std::string suffix : {"_bucket", "_sum", "_count"}) {
      const auto base =
          name.size() > suffix.size() ? name.substr(0, name.size() - suffix.size()) : "";
      if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix &&
          families.count(base) && families.at(base) == "histogram") {
        name = base;
      }
    }
    out.insert(name);
  }
  return out;
}

TEST(OperatorDocs, EveryMetricIsDocumentedWithItsType) {
  const auto doc = Read("docs/operations.md");
  const auto families = Families();
  ASSERT_EQ(families.size(), 43u);
  for (const auto& [name, type] : families) {
    const std::string row = "| `" + name + "` | " + type + " |";
    EXPECT_NE(doc.find(row), std::string::npos) << "docs/operations.md has no row " << row;
  }
}

TEST(OperatorDocs, DashboardUsesOnlyExistingMetrics) {
  const auto text = Read("deploy/grafana/outbox-relay.json");
  const auto dashboard = nlohmann::json::parse(text);  // throws on invalid JSON
  EXPECT_EQ(dashboard["uid"], "outbox-relay");
  std::set<int> ids;
  std::size_t queries = 0;
  for (const auto& p : dashboard["panels"]) {
    EXPECT_TRUE(ids.insert(p["id"].get<int>()).second) << "duplicate panel id " << p["id"];
    if (p["type"] == "row") continue;
    ASSERT_TRUE(p.contains("targets")) << p["title"];
    for (const auto& t : p["targets"]) {
      EXPECT_FALSE(t["expr"].get<std::string>().empty());
      ++queries;
    }
  }
  EXPECT_GT(queries, 25u);
  const auto families = Families();
  const auto used = MetricNamesIn(text, families);
  for (const auto& name : used)
    EXPECT_TRUE(families.count(name)) << "dashboard uses unknown metric " << name;
  for (const auto& [name, type] : families) {
    EXPECT_TRUE(used.count(name)) << "no dashboard panel shows " << name;
  }
}

TEST(OperatorDocs, AlertsUseExistingMetricsAndLinkToRunbooks) {
  const auto rules = Read("deploy/prometheus/alerts.yaml");
  const auto doc = Read("docs/operations.md");
  const auto families = Families();
  for (const auto& name : MetricNamesIn(rules, families)) {
    EXPECT_TRUE(families.count(name)) << "alerts.yaml uses unknown metric " << name;
  }
  // Anchors of the doc's headings, as GitHub makes them for single-word headings.
  std::set<std::string> anchors;
  const std::regex heading(R"((^|\n)#{2,4} ([A-Za-z]+)\n)");
  for (std::sregex_iterator it(doc.begin(), doc.end(), heading), end; it != end; ++it) {
    std::string a = (*it)[2];
    for (auto& c : a) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    anchors.insert(a);
  }
  const std::regex alert(R"(- alert: (\w+))");
  const std::regex link(R"re(runbook_url: "docs/operations\.md#([a-z]+)")re");
  std::size_t alerts = 0, links = 0;
  for (std::sregex_iterator it(rules.begin(), rules.end(), alert), end; it != end; ++it) ++alerts;
  for (std::sregex_iterator it(rules.begin(), rules.end(), link), end; it != end; ++it) {
    ++links;
    EXPECT_TRUE(anchors.count((*it)[1]))
        << "runbook anchor #" << (*it)[1] << " is not a heading of operations.md";
  }
  EXPECT_EQ(alerts, 17u);
  EXPECT_EQ(links, alerts) << "every alert has a runbook_url";
}

}  // namespace
}  // namespace outbox::relay
