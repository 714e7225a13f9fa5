// `outbox-relay verify` against what a real relay delivered to the mock cluster: clean after
// a normal run; then a duplicate record, a lost record and an out-of-order record are each
// found, named in the JSON report, and turn the exit code to 1. Also `outbox-relay
// destinations`, whose list a starting relay fills (the write-time guard's, migration 0010).
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <set>
#include <sstream>

#include "outbox_relay/kafka_sink.h"
#include "outbox_test/wait.h"
#include "process_harness.h"

namespace outbox::testing {
namespace {

using namespace std::chrono_literals;
using relay::Message;
using relay::MessageId;
using relay::Outcome;
using relay::OutcomeKind;

class VerifyTest : public RelayProcessFixture {
 protected:
  // Runs `outbox-relay verify` and returns its exit code; the report lands in report_.
  int Verify(const std::string& config, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"verify",      "--config",     config, "--json",
                                     report_path(), "--timeout-ms", "30000"};
    args.insert(args.end(), extra.begin(), extra.end());
    ChildProcess& v = Spawn("verify-" + std::to_string(++runs_), args);
    EXPECT_TRUE(v.WaitExit(60s)) << v.Describe();
    for (int code : {0, 1, 2}) {
      if (v.ExitedWith(code)) {
        last_stdout_ = v.Stdout();
        last_stderr_ = v.Stderr();
        if (code != 2) report_ = nlohmann::json::parse(ReadWholeFile(report_path()));
        return code;
      }
    }
    ADD_FAILURE() << v.Describe() << "\n" << v.Stderr();
    return -1;
  }
  std::string report_path() const { return dir_ + "/report.json"; }

  // Writes a record to the topic as the relay's own sink would.
  void Produce(const Message& m) {
    relay::KafkaTarget t;
    t.brokers = kafka_->bootstraps();
    t.topic = kTopic;
    auto sink = relay::MakeKafkaSink("tamper", t);
    std::promise<Outcome> done;
    sink->Submit(m, [&](Outcome o) { done.set_value(std::move(o)); });
    auto f = done.get_future();
    ASSERT_EQ(f.wait_for(30s), std::future_status::ready);
    ASSERT_EQ(f.get().kind, OutcomeKind::kDelivered);
    sink->Shutdown(5s);
  }

  // Message `id` of the topic, without a key, its idempotency key made of its id.
  static std::string KeyOf(std::int64_t id) {
    const std::string digits = std::to_string(id);
    return "00000000-0000-4000-8000-" + std::string(12 - digits.size(), '0') + digits;
  }
  void ProduceUnkeyed(std::int64_t id) {
    Message m;
    m.id = MessageId{id};
    m.destination = kTopic;
    m.idempotency_key = KeyOf(id);
    m.payload = "{}";
    Produce(m);
  }
  // Archives message `id` as delivered, at the SQL times given.
  void ArchiveUnkeyed(std::int64_t id, const std::string& created_at,
                      const std::string& delivered_at) {
    Exec(
        "INSERT INTO outbox.delivered_archive (id, destination, ordering_key, idempotency_key, "
        "event_type, headers, attempts, created_at, delivered_at) VALUES (" +
        std::to_string(id) + ", 'orders', NULL, '" + KeyOf(id) + "', '', '{}', 1, " + created_at +
        ", " + delivered_at + ")");
  }
  // The database's clock `interval` from now, as --since takes it.
  std::string DatabaseTimeIn(const std::string& interval) {
    pqxx::connection c(db_url_);
    return pqxx::nontransaction(c)
        .exec1("SELECT to_char((now() + interval '" + interval +
               "') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')")[0]
        .as<std::string>();
  }

  void Exec(const std::string& sql) {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    tx.exec(sql);
    tx.commit();
  }

  int runs_ = 0;
  nlohmann::json report_;
  std::string last_stdout_, last_stderr_;
};

TEST_F(VerifyTest, CleanAfterARunThenFindsADuplicateAGapAndAnInversion) {
  const std::string config =
      WriteConfig("relay.yaml", Yaml(db_url_, {}, "retention:\n  archive_delivered: true\n"));
  const ExpectedMap sent = Enqueue(300, 12, 10);
  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(DrainedBy({&relay}, 120s));
  StopGracefully(relay);
  ASSERT_EQ(Scalar("SELECT count(*) FROM outbox.delivered_archive"), 300);
  // The relay registered its config's destination for the write-time guard (migration 0010).
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.destinations WHERE name = 'orders' AND "
                   "registered_by LIKE 'relay %'"),
            1);

  ASSERT_EQ(Verify(config), 0) << last_stdout_ << last_stderr_;
  EXPECT_TRUE(report_["clean"].get<bool>());
  EXPECT_EQ(report_["archived"], 300);
  EXPECT_EQ(report_["records"], 300);
  EXPECT_EQ(report_["streams"].size(), 3u) << "every partition of the topic was read";
  EXPECT_NE(last_stdout_.find("CLEAN"), std::string::npos) << last_stdout_;

  // A window after everything: nothing archived, nothing read, still clean.
  ASSERT_EQ(Verify(config, {"--since", "2099-01-01T00:00:00Z"}), 0) << last_stderr_;
  EXPECT_EQ(report_["archived"], 0);
  EXPECT_EQ(report_["records"], 0);

  // 1. A duplicate: a message of key k, sent again.
  const auto keyed = std::find_if(sent.begin(), sent.end(),
                                  [](const auto& e) { return e.second.ordering_key.has_value(); });
  ASSERT_NE(keyed, sent.end());
  Message again;
  again.id = MessageId{keyed->first};
  again.destination = kTopic;
  again.ordering_key = keyed->second.ordering_key;
  again.idempotency_key = keyed->second.idempotency_key;
  again.payload = keyed->second.payload;
  Produce(again);
  // 2. A gap: the archive says delivered, the topic never got it.
  Exec(
      "INSERT INTO outbox.delivered_archive (id, destination, ordering_key, idempotency_key, "
      "event_type, headers, attempts, created_at) VALUES (900001, 'orders', NULL, "
      "'00000000-0000-4000-8000-000000900001', '', '{}', 1, now())");
  // 3. An inversion: message -5 of key k (earlier than every other of k) lands after them.
  Exec(
      "INSERT INTO outbox.delivered_archive (id, destination, ordering_key, idempotency_key, "
      "event_type, headers, attempts, created_at) VALUES (-5, 'orders', '" +
      *keyed->second.ordering_key +
      "', '00000000-0000-4000-8000-000000000005', '', '{}', 1, "
      "now())");
  Message early = again;
  early.id = MessageId{-5};
  early.idempotency_key = "00000000-0000-4000-8000-000000000005";
  Produce(early);

  ASSERT_EQ(Verify(config), 1) << last_stdout_ << last_stderr_;
  EXPECT_FALSE(report_["clean"].get<bool>());
  ASSERT_EQ(report_["gap_count"], 1) << report_.dump(2);
  EXPECT_EQ(report_["gaps"][0]["id"], 900001);
  ASSERT_EQ(report_["duplicate_count"], 1) << report_.dump(2);
  EXPECT_EQ(report_["duplicates"][0]["idempotency_key"], keyed->second.idempotency_key);
  EXPECT_EQ(report_["duplicates"][0]["at"].size(), 2u);
  ASSERT_EQ(report_["inversion_count"], 1) << report_.dump(2);
  EXPECT_EQ(report_["inversions"][0]["earlier_id"], -5);
  EXPECT_EQ(report_["inversions"][0]["ordering_key"], *keyed->second.ordering_key);
  EXPECT_NE(last_stdout_.find("NOT CLEAN"), std::string::npos) << last_stdout_;
}

TEST_F(VerifyTest, RefusesWhatItCannotVerifyNamingTheFix) {
  // No archive kept: nothing to compare with.
  const std::string no_archive = WriteConfig("no-archive.yaml", Yaml(db_url_));
  EXPECT_EQ(Verify(no_archive), 2);
  EXPECT_NE(last_stderr_.find("set `retention: {archive_delivered: true}`"), std::string::npos)
      << last_stderr_;
  const std::string config =
      WriteConfig("relay.yaml", Yaml(db_url_, {}, "retention:\n  archive_delivered: true\n"));
  EXPECT_EQ(Verify(config, {"--destination", "nope"}), 2);
  EXPECT_NE(last_stderr_.find("no destination nope"), std::string::npos) << last_stderr_;
  EXPECT_EQ(Verify(config, {"--since", "yesterday"}), 2);
  EXPECT_NE(last_stderr_.find("is neither a UTC time"), std::string::npos) << last_stderr_;
  // A command line it cannot take is "could not verify" too: CLI11's own codes (105, 106, ...)
  // fell outside the documented 0 / 1 / 2, and a script reading 1 as findings misread them.
  EXPECT_EQ(Verify(config, {"--timeout-ms", "0"}), 2);
  EXPECT_NE(last_stderr_.find("--timeout-ms: Value 0 not in range 1 to 86400000"),
            std::string::npos)
      << last_stderr_;
  EXPECT_EQ(Verify(config, {"--no-such-flag"}), 2);

  // A template under a prefix routes to topics nobody listed, allowed_topics or not: verify
  // read only the allow-list and called what went to the others gaps (review).
  std::string yaml = Yaml(db_url_, {}, "retention:\n  archive_delivered: true\n");
  const std::string fixed = "      topic: " + std::string(kTopic) + "\n";
  ASSERT_NE(yaml.find(fixed), std::string::npos);
  yaml.replace(yaml.find(fixed), fixed.size(),
               "      topic: \"" + std::string(kTopic) + ".{event_type}\"\n" +
                   "      allowed_topics: [\"" + kTopic + ".created\"]\n" +
                   "      topic_prefix: \"" + kTopic + ".\"\n");
  EXPECT_EQ(Verify(WriteConfig("prefixed.yaml", yaml)), 2);
  EXPECT_NE(last_stderr_.find("name the topics to read with --topic"), std::string::npos)
      << last_stderr_;
}

// A destination that routes by a template reads every topic of its allow-list, and one that
// does not exist (yet: nothing was routed there, and the broker does not auto-create) holds no
// record. verify gave up on it after 2 s with exit 2, so it could not run at all until every
// allowed topic had a message (found in review).
TEST_F(VerifyTest, AnAllowedTopicThatDoesNotExistHoldsNothing) {
  std::string yaml = Yaml(db_url_, {}, "retention:\n  archive_delivered: true\n");
  const std::string fixed = "      topic: " + std::string(kTopic) + "\n";
  ASSERT_NE(yaml.find(fixed), std::string::npos);
  yaml.replace(yaml.find(fixed), fixed.size(),
               "      topic: \"" + std::string(kTopic) + ".{event_type}\"\n" +
                   "      allowed_topics: [\"" + kTopic + ".created\", \"" + kTopic +
                   ".never\"]\n");
  kafka_->CreateTopic(std::string(kTopic) + ".created");
  // The mock broker creates any topic asked about; a real one with auto-creation off answers
  // that it does not know it.
  rd_kafka_mock_topic_set_error(kafka_->raw(), "orders.never",
                                RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
  const std::string config = WriteConfig("routed.yaml", yaml);
  EXPECT_EQ(Verify(config), 0) << last_stderr_;
  EXPECT_NE((last_stdout_ + last_stderr_).find("orders.never"), std::string::npos)
      << "says which topic it found missing\n"
      << last_stdout_ << last_stderr_;
}

// The archive's window is the database's clock (delivered_at), a record's timestamp the clock of
// the relay that produced it. With the relay's clock behind the database's, a message written
// just after --since was produced "before" it: verify started reading after that record and
// reported a gap. It now reads from 5 minutes before --since, as the exactly-once recovery
// does; a record of a message outside the window counts as such. Here the database's clock is
// ahead: the message was written 2 s from now, and produced now.
TEST_F(VerifyTest, ARecordStampedBeforeTheWindowByASlowClockIsNoGap) {
  const std::string config =
      WriteConfig("relay.yaml", Yaml(db_url_, {}, "retention:\n  archive_delivered: true\n"));
  ProduceUnkeyed(700001);
  ArchiveUnkeyed(700001, "now() + interval '2 seconds'", "now() + interval '2 seconds'");
  const std::string since = DatabaseTimeIn("1 second");
  ASSERT_EQ(Verify(config, {"--since", since}), 0) << last_stdout_ << last_stderr_;
  EXPECT_EQ(report_["archived"], 1);
  EXPECT_EQ(report_["records"], 1);
}

// The window is by delivery: a message created before it (an outage's backlog, a replayed dead
// letter) and delivered in it is verified; by creation, its gap went unseen after the
// incident the window was chosen for (review). Its record would have been produced after its
// creation: the read starts there.
TEST_F(VerifyTest, AMessageCreatedBeforeTheWindowAndDeliveredInItIsVerified) {
  const std::string config =
      WriteConfig("relay.yaml", Yaml(db_url_, {}, "retention:\n  archive_delivered: true\n"));
  ArchiveUnkeyed(600001, "now() - interval '3 hours'", "now()");
  ASSERT_EQ(Verify(config, {"--since", "1h"}), 1) << last_stdout_ << last_stderr_;
  EXPECT_EQ(report_["archived"], 1);
  ASSERT_EQ(report_["gaps"].size(), 1u);
  EXPECT_EQ(report_["gaps"][0]["id"], 600001);

  // Its record, produced now, written delivered 20 minutes from now (a settle held up): a
  // window from 10 minutes from now takes the message, and the read, from its creation on,
  // takes the record.
  ProduceUnkeyed(600002);
  ArchiveUnkeyed(600002, "now() - interval '1 hour'", "now() + interval '20 minutes'");
  const std::string since = DatabaseTimeIn("10 minutes");
  ASSERT_EQ(Verify(config, {"--since", since}), 0) << last_stdout_ << last_stderr_;
  EXPECT_EQ(report_["archived"], 1);
  EXPECT_EQ(report_["records"], 1);
}

// A --since that names no real time, or one the clock cannot hold, would compare a window
// other than the one asked for (999999999d wrapped around and checked nothing, yet said
// CLEAN; February 31st became March 3rd): refused, naming --since and the forms it takes.
TEST_F(VerifyTest, RefusesASinceThatIsNoRealTimeOrOutOfRange) {
  const std::string config =
      WriteConfig("relay.yaml", Yaml(db_url_, {}, "retention:\n  archive_delivered: true\n"));
  for (const char* since :
       {"999999999d", "999999999h", "200000d", "2026-02-31T00:00:00Z", "2026-02-29T00:00:00Z",
        "2026-13-01T00:00:00Z", "2026-00-10T00:00:00Z", "2026-01-00T00:00:00Z",
        "2026-02-31T25:61:00Z", "2026-01-01T24:00:00Z", "2026-01-01T00:60:00Z",
        "2026-01-01T00:00:60Z", "1969-12-31T23:59:59Z", "9999-01-01T00:00:00Z"}) {
    SCOPED_TRACE(since);
    EXPECT_EQ(Verify(config, {"--since", since}), 2) << last_stdout_ << last_stderr_;
    EXPECT_NE(last_stderr_.find(std::string("--since ") + since), std::string::npos)
        << last_stderr_;
    EXPECT_NE(last_stderr_.find("2026-11-23T08:00:00Z"), std::string::npos) << last_stderr_;
    EXPECT_NE(last_stderr_.find("7d"), std::string::npos) << last_stderr_;
    EXPECT_EQ(last_stdout_.find("CLEAN"), std::string::npos) << last_stdout_;
  }
  // Real times and ages in range are taken.
  for (const char* since : {"2024-02-29T23:59:59.5Z", "1970-01-01T00:00:00Z", "20000d", "90s"}) {
    SCOPED_TRACE(since);
    EXPECT_EQ(Verify(config, {"--since", since}), 0) << last_stdout_ << last_stderr_;
  }
}

// `--json -`: stdout is the JSON report and nothing else (the summary goes to stderr), so it
// can be piped to jq.
TEST_F(VerifyTest, JsonToStdoutIsOnlyTheReport) {
  const std::string config =
      WriteConfig("relay.yaml", Yaml(db_url_, {}, "retention:\n  archive_delivered: true\n"));
  Enqueue(20, 4, 5);
  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(DrainedBy({&relay}, 120s));
  StopGracefully(relay);
  ChildProcess& v = Spawn("verify-stdout",
                          {"verify", "--config", config, "--json", "-", "--timeout-ms", "30000"});
  ASSERT_TRUE(v.WaitExit(60s)) << v.Describe();
  EXPECT_TRUE(v.ExitedWith(0)) << v.Describe() << v.Stderr();
  const nlohmann::json report = nlohmann::json::parse(v.Stdout(), nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << "stdout is not JSON:\n" << v.Stdout();
  EXPECT_TRUE(report["clean"].get<bool>()) << report.dump(2);
  EXPECT_EQ(report["archived"], 20);
  EXPECT_NE(v.Stderr().find("CLEAN"), std::string::npos) << "the summary, on stderr:\n"
                                                         << v.Stderr();
}

// --database-url stands in for a config without database_url, as it does for `run`.
TEST_F(VerifyTest, DatabaseUrlFlagStandsInForAConfigWithoutOne) {
  std::string yaml = Yaml(db_url_, {}, "retention:\n  archive_delivered: true\n");
  const auto line = yaml.find("database_url:");
  ASSERT_NE(line, std::string::npos);
  yaml.erase(line, yaml.find('\n', line) + 1 - line);
  const std::string config = WriteConfig("no-db.yaml", yaml);
  // Without the flag: the config's own error.
  EXPECT_EQ(Verify(config), 2);
  EXPECT_NE(last_stderr_.find("database_url"), std::string::npos) << last_stderr_;
  // With it: verified.
  EXPECT_EQ(Verify(config, {"--database-url", db_url_}), 0) << last_stdout_ << last_stderr_;
  EXPECT_TRUE(report_["clean"].get<bool>()) << report_.dump(2);
  // And it wins over the config's database_url.
  const std::string elsewhere = WriteConfig(
      "elsewhere.yaml",
      Yaml("postgresql://nobody@127.0.0.1:1/none", {}, "retention:\n  archive_delivered: true\n"));
  EXPECT_EQ(Verify(elsewhere, {"--database-url", db_url_}), 0) << last_stdout_ << last_stderr_;
}

// docs/roles.md: verify runs under the read-only outbox_reader; a login without any outbox
// role is told which to grant.
TEST_F(VerifyTest, RunsUnderTheReaderRoleAndNamesTheRoleALoginLacks) {
  const std::string config =
      WriteConfig("relay.yaml", Yaml(db_url_, {}, "retention:\n  archive_delivered: true\n"));
  EXPECT_EQ(Verify(config, {"--database-url", UrlOfLogin("verify_reader", "outbox_reader")}), 0)
      << last_stdout_ << last_stderr_;
  EXPECT_EQ(Verify(config, {"--database-url", UrlOfLogin("verify_nobody", "")}), 2) << last_stdout_;
  EXPECT_NE(last_stderr_.find("GRANT outbox_reader TO"), std::string::npos) << last_stderr_;
}

TEST_F(VerifyTest, DestinationsListsWhatRelaysRegisteredAndAddRegistersMore) {
  const std::string config = WriteConfig("relay.yaml", Yaml(db_url_));
  auto run = [&](const std::vector<std::string>& args) {
    ChildProcess& c = Spawn("destinations-" + std::to_string(++runs_), args);
    EXPECT_TRUE(c.WaitExit(30s)) << c.Describe();
    EXPECT_TRUE(c.ExitedWith(0)) << c.Describe() << c.Stderr();
    return c.Stdout();
  };
  std::string out = run({"destinations", "list", "--config", config});
  EXPECT_NE(out.find("guard of unknown destinations: off"), std::string::npos) << out;
  EXPECT_NE(out.find("no destination registered yet"), std::string::npos) << out;
  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(
      WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.destinations") == 1; }, 30s));
  StopGracefully(relay);
  run({"destinations", "add", "--config", config, "invoices", "refunds"});
  Exec("UPDATE outbox.settings SET refuse_unknown_destinations = true");
  out = run({"destinations", "list", "--config", config});
  EXPECT_NE(out.find("guard of unknown destinations: on"), std::string::npos) << out;
  for (const char* line : {"orders", "invoices", "refunds", "relay ", "operator"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << " missing in:\n" << out;
  }
  // The guard now takes what was added, and refuses a typo.
  Exec("SELECT outbox.enqueue('invoices', '{}'::jsonb)");
  EXPECT_THROW(Exec("SELECT outbox.enqueue('invoice', '{}'::jsonb)"), pqxx::sql_error);
}

}  // namespace
}  // namespace outbox::testing
