// The exactly-once Kafka sink (`delivery: exactly_once`) against librdkafka's mock cluster:
// each bucket's messages go out in a transaction of that bucket's producer; a message claimed
// again after an attempt (attempts > 0) is first looked for in the topic and completes as
// delivered without being produced again when an earlier transaction put it there; a
// transaction that does not commit completes its messages as retries that may have been sent.
//
// The mock cluster keeps no transaction state for consumers (it reports no aborted
// transactions and its last stable offset is the high watermark), so what a failed
// transaction wrote stays visible here: the recovery reads what a read_committed consumer
// reads, and these tests check that nobody sees a message twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kafka_records.h"
#include "outbox_relay/kafka_sink.h"
#include "outbox_test/kafka_mock.h"
#include "outbox_test/log_watch.h"
#include "outbox_test/wait.h"

namespace outbox::relay {
// Named, so that its helpers do not meet those of the files built beside it in one unity
// translation unit (CMakeLists.txt).
namespace transactional_sink_test {
namespace {

using namespace std::chrono_literals;
using outbox::testing::ConsumedRecord;
using outbox::testing::KafkaMockCluster;
using outbox::testing::LogWatch;
using outbox::testing::WaitFor;

constexpr auto kWait = 30s;
constexpr const char* kTopic = "orders.events";

class Recorder {
 public:
  Sink::Completion Callback() {
    return [this](Outcome out) {
      std::lock_guard lock(mu_);
      outcomes_[Raw(out.id)].push_back(std::move(out));
      ++count_;
    };
  }
  bool WaitCount(std::size_t n) const {
    return WaitFor(
        [&] {
          std::lock_guard lock(mu_);
          return count_ >= n;
        },
        kWait);
  }
  std::map<std::int64_t, std::vector<Outcome>> outcomes() const {
    std::lock_guard lock(mu_);
    return outcomes_;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::int64_t, std::vector<Outcome>> outcomes_;
  std::size_t count_ = 0;
};

Message MakeMessage(std::int64_t id, int bucket, int attempts = 0) {
  Message msg;
  msg.id = MessageId{id};
  msg.destination = "orders";
  msg.ordering_key = "key-" + std::to_string(id % 5);
  char uuid[40];
  std::snprintf(uuid, sizeof uuid, "00000000-0000-4000-8000-%012lld", static_cast<long long>(id));
  msg.idempotency_key = uuid;
  msg.event_type = "order.created";
  msg.payload = "{\"n\":" + std::to_string(id) + "}";
  msg.created_at = std::chrono::system_clock::now() - 1s;
  msg.bucket = bucket;
  msg.attempts = attempts;
  return msg;
}

class TransactionalSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<KafkaMockCluster>(3);
    cluster_->CreateTopic(kTopic, 3, 3);
  }

  KafkaTarget Target() const {
    KafkaTarget target;
    target.brokers = cluster_->bootstraps();
    target.topic = kTopic;
    target.exactly_once = true;
    target.attempt_timeout = 10s;
    target.producer["reconnect.backoff.ms"] = "20";
    target.producer["reconnect.backoff.max.ms"] = "200";
    return target;
  }

  // Topic per message, "orders.{event_type}" under the prefix "orders."; only orders.created
  // exists at first.
  KafkaTarget RoutedByEventType(std::chrono::milliseconds attempt_timeout) const {
    KafkaTarget target = Target();
    target.topic = "orders.{event_type}";
    target.topic_prefix = "orders.";
    target.attempt_timeout = attempt_timeout;
    cluster_->CreateTopic("orders.created", 3, 3);
    return target;
  }

  // Submits `messages` to `sink` and waits for each completion.
  static std::map<std::int64_t, std::vector<Outcome>> Deliver(
      Sink& sink, const std::vector<Message>& messages) {
    Recorder rec;
    for (const auto& m : messages) sink.Submit(m, rec.Callback());
    EXPECT_TRUE(rec.WaitCount(messages.size()));
    return rec.outcomes();
  }

  // outbox-id -> how many records of it the topic holds.
  std::map<std::int64_t, int> RecordsById(std::size_t at_least) const {
    std::map<std::int64_t, int> by_id;
    for (const ConsumedRecord& r : cluster_->ConsumeAll(kTopic, at_least, 10s)) {
      ++by_id[std::stoll(r.headers.at("outbox-id"))];
    }
    return by_id;
  }

  std::unique_ptr<KafkaMockCluster> cluster_;
};

TEST_F(TransactionalSinkTest, EachBucketsMessagesCommitInATransactionOfItsOwn) {
  auto sink = MakeKafkaSink("orders", Target());
  ASSERT_TRUE(WaitFor([&] { return sink->Ready(); }, kWait)) << sink->WhyNotReady();
  std::vector<Message> messages;
  for (int i = 1; i <= 60; ++i) messages.push_back(MakeMessage(i, i % 3));
  const auto outcomes = Deliver(*sink, messages);
  ASSERT_EQ(outcomes.size(), 60u);
  for (const auto& [id, outs] : outcomes) {
    ASSERT_EQ(outs.size(), 1u) << "completed once: " << id;
    EXPECT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id << ": " << outs[0].reason;
  }
  const auto events = sink->EventCounts();
  EXPECT_EQ(events.at("producers_created"), 3) << "one per bucket";
  EXPECT_GE(events.at("transactions_committed"), 3);
  EXPECT_EQ(events.at("transactions_failed"), 0);
  EXPECT_EQ(events.at("recovered"), 0);
  // What `outbox-relay status` shows for this relay (carried in its heartbeat).
  const auto health = sink->Health();
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->kind, "kafka");
  EXPECT_EQ(health->delivery, "exactly_once");
  EXPECT_EQ(health->transactional_id_prefix, Target().transactional_id_prefix)
      << "status compares the relays' prefixes";
  EXPECT_EQ(health->transactions_committed, events.at("transactions_committed"));
  EXPECT_EQ(health->transactions_failed, 0);
  const auto by_id = RecordsById(60);
  EXPECT_EQ(by_id.size(), 60u);
  for (const auto& [id, n] : by_id) EXPECT_EQ(n, 1) << "records of " << id;
  EXPECT_EQ(sink->InFlight(), 0u);
}

// A relay died between the Kafka commit and the settle: the messages come back with an
// attempt counted, and the sink that takes them finds them in the topic.
TEST_F(TransactionalSinkTest, AMessageAnEarlierTransactionCommittedIsNotProducedAgain) {
  {
    auto first = MakeKafkaSink("orders", Target());
    std::vector<Message> committed;
    for (int i = 1; i <= 10; ++i) committed.push_back(MakeMessage(i, 0));
    for (const auto& [id, outs] : Deliver(*first, committed))
      ASSERT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id;
    first->Shutdown(5s);
  }
  auto second = MakeKafkaSink("orders", Target());
  std::vector<Message> again;
  for (int i = 1; i <= 10; ++i) again.push_back(MakeMessage(i, 0, 1));   // in the topic
  for (int i = 11; i <= 15; ++i) again.push_back(MakeMessage(i, 0, 2));  // failed before
  for (int i = 16; i <= 20; ++i) again.push_back(MakeMessage(i, 1, 0));  // first attempt
  for (const auto& [id, outs] : Deliver(*second, again)) {
    ASSERT_EQ(outs.size(), 1u) << id;
    EXPECT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id << ": " << outs[0].reason;
  }
  EXPECT_EQ(second->EventCounts().at("recovered"), 10);
  const auto by_id = RecordsById(20);
  ASSERT_EQ(by_id.size(), 20u);
  for (const auto& [id, n] : by_id)
    EXPECT_EQ(n, 1) << "message " << id << " is in the topic " << n << " times";
}

// The database refuses an idempotency key only while a message with it is queued: once the
// first is delivered, the application may use the key again. Recovery matched the key alone,
// so a second message whose first transaction aborted was taken for the first one's record
// and settled as delivered without ever being produced (review). A record is this message's
// when its outbox-id is this message's id too.
TEST_F(TransactionalSinkTest, RecoveryDoesNotTakeAnEarlierMessageWithTheSameKeyForThisOne) {
  auto first = MakeKafkaSink("orders", Target());
  for (const auto& [id, outs] : Deliver(*first, {MakeMessage(1, 0)}))
    ASSERT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id;
  first->Shutdown(5s);
  Message again = MakeMessage(2, 0, 1);  // its first transaction aborted
  again.idempotency_key = MakeMessage(1, 0).idempotency_key;
  again.ordering_key = MakeMessage(1, 0).ordering_key;  // the same entity: the same partition
  auto second = MakeKafkaSink("orders", Target());
  for (const auto& [id, outs] : Deliver(*second, {again}))
    EXPECT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id << ": " << outs[0].reason;
  EXPECT_EQ(second->EventCounts().at("recovered"), 0);
  const auto by_id = RecordsById(2);
  EXPECT_EQ(by_id.count(2), 1u) << "the second message was never produced";
}

// The recovery reads only the partitions the messages' keys hash to (the relay's partitioner,
// murmur2_random); a message without a key may be anywhere, so its topic is read whole.
TEST_F(TransactionalSinkTest, RecoveryReadsOnlyThePartitionsOfTheMessagesKeys) {
  auto keyed = [](std::int64_t id, int attempts) {
    Message m = MakeMessage(id, 0, attempts);
    m.ordering_key = "one-key";
    return m;
  };
  {
    auto first = MakeKafkaSink("orders", Target());
    std::vector<Message> committed;
    for (int i = 1; i <= 10; ++i) committed.push_back(keyed(i, 0));
    for (const auto& [id, outs] : Deliver(*first, committed))
      ASSERT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id;
  }
  auto second = MakeKafkaSink("orders", Target());
  std::vector<Message> again;
  for (int i = 1; i <= 10; ++i) again.push_back(keyed(i, 1));
  for (const auto& [id, outs] : Deliver(*second, again))
    EXPECT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id;
  auto events = second->EventCounts();
  EXPECT_EQ(events.at("recovered"), 10);
  EXPECT_EQ(events.at("recovery_partitions_read"), 1) << "one key: one of the 3 partitions";

  Message unkeyed = MakeMessage(11, 0, 1);
  unkeyed.ordering_key.reset();
  for (const auto& [id, outs] : Deliver(*second, {keyed(12, 1), unkeyed}))
    EXPECT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id;
  events = second->EventCounts();
  EXPECT_EQ(events.at("recovery_partitions_read"), 1 + 3) << "a message without a key: all 3";
  const auto by_id = RecordsById(12);
  ASSERT_EQ(by_id.size(), 12u);
  for (const auto& [id, n] : by_id) EXPECT_EQ(n, 1) << "message " << id;
}

// A recovery keeps to its time budget when the brokers are slow: each broker lookup (the end of
// each partition, the offsets at the start time) took at least 1 s and up to 10 s whatever was
// left, one partition after another on the sink's single worker, so a keyless message on a
// wide topic held the recovery (and with it every other claim of the cycle, and a stop) for
// many times its budget (review).
TEST_F(TransactionalSinkTest, RecoveryKeepsToItsBudgetWhenTheBrokersAreSlow) {
  const std::string topic = "orders.wide";
  cluster_->CreateTopic(topic, 24, 1);
  KafkaTarget target = Target();
  target.topic = topic;
  cluster_->SetAllBrokersRtt(300ms);
  const auto started = std::chrono::steady_clock::now();
  try {
    kafka_detail::FindRecorded(target, {{topic, {std::nullopt}}},
                               std::chrono::system_clock::now() - 1h, {{"never-produced", 1}}, 2s);
  } catch (const std::runtime_error&) {
    // Out of time: the sink counts the attempt and tries again later.
  }
  const auto took = std::chrono::steady_clock::now() - started;
  cluster_->SetAllBrokersRtt(0ms);
  EXPECT_LT(took, 4500ms) << "a 2 s recovery of 24 partitions with brokers 300 ms slow";
}

// A recovery reads from when the message was last known absent (an earlier attempt that
// checked and aborted), not from its creation: records older than that are not read. Here
// the message's copies in the topic predate that time (known absent "later" than they were
// written: in the mock's clock, a time ahead of now), so the recovery does not see them and
// produces it again; from the creation time, it would find them (the test above).
TEST_F(TransactionalSinkTest, RecoveryReadsFromWhenTheMessageWasLastKnownAbsent) {
  {
    auto first = MakeKafkaSink("orders", Target());
    std::vector<Message> committed;
    for (int i = 1; i <= 5; ++i) committed.push_back(MakeMessage(i, 0));
    for (const auto& [id, outs] : Deliver(*first, committed))
      ASSERT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id;
  }
  auto second = MakeKafkaSink("orders", Target());
  std::vector<Message> again;
  for (int i = 1; i <= 5; ++i) {
    Message m = MakeMessage(i, 0, 1);
    m.absent_as_of = std::chrono::system_clock::now() + 1h;
    again.push_back(std::move(m));
  }
  for (const auto& [id, outs] : Deliver(*second, again))
    EXPECT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id << ": " << outs[0].reason;
  EXPECT_EQ(second->EventCounts().at("recovered"), 0) << "nothing read before the bound";
  const auto by_id = RecordsById(10);
  ASSERT_EQ(by_id.size(), 5u);
  for (const auto& [id, n] : by_id) EXPECT_EQ(n, 2) << "message " << id;
}

// The commit fails (the broker says another producer of the transactional id fenced this
// one): the messages are retries that may have been sent, counted even at shutdown; the next
// attempt, with a new producer, finds what reached the topic and sends the rest once.
TEST_F(TransactionalSinkTest, ATransactionThatDidNotCommitIsRetriedWithoutDuplicates) {
  auto sink = MakeKafkaSink("orders", Target());
  ASSERT_TRUE(WaitFor([&] { return sink->Ready(); }, kWait)) << sink->WhyNotReady();
  // The producer exists once a first transaction ran.
  for (const auto& [id, outs] : Deliver(*sink, {MakeMessage(1, 0)}))
    ASSERT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id;
  cluster_->PushRequestErrors(RD_KAFKAP_EndTxn, {RD_KAFKA_RESP_ERR_PRODUCER_FENCED});
  std::vector<Message> batch;
  for (int i = 2; i <= 11; ++i) batch.push_back(MakeMessage(i, 0));
  for (const auto& [id, outs] : Deliver(*sink, batch)) {
    ASSERT_EQ(outs.size(), 1u);
    EXPECT_EQ(outs[0].kind, OutcomeKind::kRetry) << id;
    EXPECT_TRUE(outs[0].maybe_sent) << id;
    EXPECT_NE(outs[0].reason.find("did not commit"), std::string::npos) << outs[0].reason;
    EXPECT_FALSE(outs[0].absent_as_of.has_value()) << id << ": the commit's end is unknown";
  }
  for (auto& m : batch) m.attempts = 1;
  for (const auto& [id, outs] : Deliver(*sink, batch)) {
    EXPECT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id << ": " << outs[0].reason;
  }
  const auto by_id = RecordsById(11);
  ASSERT_EQ(by_id.size(), 11u);
  for (const auto& [id, n] : by_id)
    EXPECT_EQ(n, 1) << "message " << id << " is in the topic " << n << " times";
}

// The broker refuses the records: another producer of the transactional id fenced this one
// (what a relay that stalled meets when it wakes up). The transaction fails, its messages are
// counted retries, and the next attempt creates a producer again and delivers them once.
TEST_F(TransactionalSinkTest, AFencedProducersRecordsAreRetriedByANewProducer) {
  auto sink = MakeKafkaSink("orders", Target());
  for (const auto& [id, outs] : Deliver(*sink, {MakeMessage(1, 0)}))
    ASSERT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id;
  cluster_->PushRequestErrors(RD_KAFKAP_Produce, {RD_KAFKA_RESP_ERR_PRODUCER_FENCED});
  std::vector<Message> batch;
  for (int i = 2; i <= 6; ++i) batch.push_back(MakeMessage(i, 0));
  const auto before = std::chrono::system_clock::now();
  for (const auto& [id, outs] : Deliver(*sink, batch)) {
    ASSERT_EQ(outs.size(), 1u);
    EXPECT_EQ(outs[0].kind, OutcomeKind::kRetry) << id;
    EXPECT_TRUE(outs[0].maybe_sent) << id;
    // Aborted, and a first attempt: as of the abort, it is not in Kafka (for read_committed),
    // and the next recovery need not look further back (migration 0012).
    EXPECT_NE(outs[0].reason.find("(aborted)"), std::string::npos) << outs[0].reason;
    ASSERT_TRUE(outs[0].absent_as_of.has_value()) << id;
    EXPECT_GE(*outs[0].absent_as_of, before) << id;
  }
  EXPECT_EQ(sink->EventCounts().at("transactions_failed"), 1);
  for (auto& m : batch) m.attempts = 1;
  for (const auto& [id, outs] : Deliver(*sink, batch)) {
    EXPECT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id << ": " << outs[0].reason;
  }
  EXPECT_EQ(sink->EventCounts().at("producers_created"), 2) << "the failed one was replaced";
  const auto by_id = RecordsById(6);
  ASSERT_EQ(by_id.size(), 6u);
  for (const auto& [id, n] : by_id)
    EXPECT_EQ(n, 1) << "message " << id << " is in the topic " << n << " times";
}

// A relay stalled (SIGSTOP, a VM pause) past its claim's lease before it created the bucket's
// producer: meanwhile another relay took the bucket and the message (attempts 1), found it
// absent and committed it. The stalled relay's late init_transactions fences that owner, and
// the message, still "attempts 0" in its copy, would be produced again without a read-back. A
// claim that ran out by the time the producer is ready is handed back unsent instead.
TEST_F(TransactionalSinkTest, AClaimThatRanOutBeforeItsProducerWasReadyIsHandedBackUnsent) {
  {
    auto owner = MakeKafkaSink("orders", Target());  // the relay that took over
    for (const auto& [id, outs] : Deliver(*owner, {MakeMessage(1, 0, 1)}))
      ASSERT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id;
    owner->Shutdown(5s);
  }
  auto stalled = MakeKafkaSink("orders", Target());
  Message stale = MakeMessage(1, 0, 0);
  stale.claim_expires = std::chrono::steady_clock::now() - 1s;  // its lease ran out
  Message live = MakeMessage(2, 0, 0);
  live.claim_expires = std::chrono::steady_clock::now() + 60s;
  const auto outcomes = Deliver(*stalled, {stale, live});
  ASSERT_EQ(outcomes.at(1).size(), 1u);
  EXPECT_EQ(outcomes.at(1)[0].kind, OutcomeKind::kReturned) << outcomes.at(1)[0].reason;
  EXPECT_FALSE(outcomes.at(1)[0].maybe_sent);
  EXPECT_EQ(outcomes.at(2)[0].kind, OutcomeKind::kDelivered) << outcomes.at(2)[0].reason;
  const auto by_id = RecordsById(2);
  EXPECT_EQ(by_id.at(1), 1) << "produced again by the stalled relay";
  EXPECT_EQ(by_id.at(2), 1);
}

// The read-back of one topic that cannot be read (here the relay may not read it; a topic
// that does not exist answers the same way on a broker that does not create topics) fails
// only its own messages: the others of the cycle are recovered at once, not retried after the
// whole attempt timeout.
TEST_F(TransactionalSinkTest, ATopicThatCannotBeReadBackFailsOnlyItsOwnMessages) {
  const KafkaTarget target = RoutedByEventType(8s);
  {
    auto first = MakeKafkaSink("orders", target);
    for (const auto& [id, outs] : Deliver(*first, {MakeMessage(1, 0)}))
      ASSERT_EQ(outs[0].kind, OutcomeKind::kDelivered) << id << ": " << outs[0].reason;
    first->Shutdown(5s);
  }
  auto second = MakeKafkaSink("orders", target);
  Message committed = MakeMessage(1, 0, 1);  // its first transaction committed; settle lost
  Message lost = MakeMessage(2, 0, 1);
  lost.event_type = "unreadable";
  rd_kafka_mock_topic_set_error(cluster_->raw(), "orders.unreadable",
                                RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
  Recorder rec;
  const auto start = std::chrono::steady_clock::now();
  second->Submit(committed, rec.Callback());
  second->Submit(lost, rec.Callback());
  ASSERT_TRUE(rec.WaitCount(2));
  const auto outcomes = rec.outcomes();
  EXPECT_EQ(outcomes.at(1)[0].kind, OutcomeKind::kDelivered) << outcomes.at(1)[0].reason;
  EXPECT_NE(outcomes.at(2)[0].kind, OutcomeKind::kDelivered);
  EXPECT_NE(outcomes.at(2)[0].reason.find("orders.unreadable"), std::string::npos)
      << outcomes.at(2)[0].reason;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 6s) << "waited for the attempt timeout";
  EXPECT_EQ(second->EventCounts().at("recovered"), 1);
}

// A topic the relay may describe but not write: its metadata looks fine, and the broker refuses
// the transaction's AddPartitionsToTxn with TOPIC_AUTHORIZATION_FAILED, which librdkafka treats
// as abortable (no record carries the error). Every transaction that held such a record
// aborted, each of its messages counted an attempt, until the message ran out of attempts a
// day later as "gave up", not as an authorization failure (review). Now the topics of such a
// transaction that never committed are tried alone, one a cycle: the one that fails alone is
// refused (dead-lettered, and its later messages at once), the others commit.
// (The mock cluster has no ACLs: the refusal is pushed for the AddPartitionsToTxn requests of
// the first and the third transaction.)
TEST_F(TransactionalSinkTest, ATopicTheRelayMayNotWriteIsFoundAloneAndItsMessagesDeadLettered) {
  const KafkaTarget target = RoutedByEventType(8s);
  cluster_->CreateTopic("orders.denied", 3, 3);
  auto sink = MakeKafkaSink("orders", target);
  auto message = [](std::int64_t id, const std::string& event, int attempts) {
    Message m = MakeMessage(id, 0, attempts);
    m.event_type = event;
    return m;
  };
  cluster_->PushRequestErrors(RD_KAFKAP_AddPartitionsToTxn,
                              {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED});
  auto outcomes = Deliver(*sink, {message(1, "denied", 0), message(2, "created", 0)});
  EXPECT_EQ(outcomes.at(1)[0].kind, OutcomeKind::kRetry) << outcomes.at(1)[0].reason;
  EXPECT_EQ(outcomes.at(2)[0].kind, OutcomeKind::kRetry) << outcomes.at(2)[0].reason;

  // Claimed again: orders.created goes alone (first by name) and commits; the other waits.
  outcomes = Deliver(*sink, {message(1, "denied", 1), message(2, "created", 1)});
  EXPECT_EQ(outcomes.at(2)[0].kind, OutcomeKind::kDelivered) << outcomes.at(2)[0].reason;
  EXPECT_EQ(outcomes.at(1)[0].kind, OutcomeKind::kReturned) << outcomes.at(1)[0].reason;
  EXPECT_TRUE(outcomes.at(1)[0].absent_as_of.has_value())
      << "its recovery found it absent: the next one reads from here, not from its creation";

  // orders.denied alone, refused: an authorization failure, dead-lettered at once.
  cluster_->PushRequestErrors(RD_KAFKAP_AddPartitionsToTxn,
                              {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED});
  outcomes = Deliver(*sink, {message(1, "denied", 1)});
  EXPECT_EQ(outcomes.at(1)[0].kind, OutcomeKind::kPermanent) << outcomes.at(1)[0].reason;
  EXPECT_EQ(outcomes.at(1)[0].reason_class, Reason::kAuthorization) << outcomes.at(1)[0].reason;
  EXPECT_NE(outcomes.at(1)[0].reason.find("orders.denied"), std::string::npos)
      << outcomes.at(1)[0].reason;

  // From then on its messages fail on their own, and the others of the bucket commit.
  outcomes = Deliver(*sink, {message(3, "denied", 0), message(4, "created", 0)});
  EXPECT_EQ(outcomes.at(3)[0].kind, OutcomeKind::kPermanent) << outcomes.at(3)[0].reason;
  EXPECT_EQ(outcomes.at(4)[0].kind, OutcomeKind::kDelivered) << outcomes.at(4)[0].reason;
}

// A message routed to a topic the relay may not write (or that does not exist, on a broker
// that does not create topics) fails on its own: the other messages of its bucket commit.
TEST_F(TransactionalSinkTest, AMessageForAnUnusableTopicDoesNotFailItsBucketsTransaction) {
  const KafkaTarget target = RoutedByEventType(8s);
  rd_kafka_mock_topic_set_error(cluster_->raw(), "orders.denied",
                                RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
  auto sink = MakeKafkaSink("orders", target);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Message denied = MakeMessage(10 * round + 1, 0);
    denied.event_type = "denied";
    Message fine = MakeMessage(10 * round + 2, 0);
    const auto outcomes = Deliver(*sink, {denied, fine});
    EXPECT_EQ(outcomes.at(10 * round + 1)[0].kind, OutcomeKind::kPermanent);
    EXPECT_NE(outcomes.at(10 * round + 1)[0].reason.find("orders.denied"), std::string::npos)
        << outcomes.at(10 * round + 1)[0].reason;
    EXPECT_EQ(outcomes.at(10 * round + 2)[0].kind, OutcomeKind::kDelivered)
        << outcomes.at(10 * round + 2)[0].reason;
  }
}

// A topic that does not exist, on a broker that does not create topics: its first record
// cannot complete and aborts its bucket's transaction (the broker might have created it).
// After that the sink knows: while the broker still does not have it, its messages are
// retried without being produced, and the others of the bucket commit.
TEST_F(TransactionalSinkTest, AfterAMissingTopicFailedATransactionItsMessagesStayOutOfTheNext) {
  const KafkaTarget target = RoutedByEventType(4s);
  rd_kafka_mock_topic_set_error(cluster_->raw(), "orders.missing",
                                RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
  auto sink = MakeKafkaSink("orders", target);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Message missing = MakeMessage(10 * round + 1, 0);
    missing.event_type = "missing";
    Message fine = MakeMessage(10 * round + 2, 0);
    const auto outcomes = Deliver(*sink, {missing, fine});
    EXPECT_EQ(outcomes.at(10 * round + 1)[0].kind, OutcomeKind::kRetry);
    if (round == 1) {
      EXPECT_EQ(outcomes.at(11)[0].reason_class, Reason::kUnknownTopic)
          << outcomes.at(11)[0].reason;
      EXPECT_EQ(outcomes.at(12)[0].kind, OutcomeKind::kDelivered) << outcomes.at(12)[0].reason;
    }
  }
}

TEST_F(TransactionalSinkTest, ShutdownHandsBackWhatWasNeverSent) {
  auto sink = MakeKafkaSink("orders", Target());
  sink->Shutdown(2s);
  const auto outcomes = Deliver(*sink, {MakeMessage(1, 0)});
  EXPECT_EQ(outcomes.at(1)[0].kind, OutcomeKind::kRetry);
  EXPECT_FALSE(outcomes.at(1)[0].maybe_sent) << "never sent: handed back uncounted";
}

// A stop keeps to its deadline while the running cycle waits on the brokers, here for the
// coordinator of a new producer (init_transactions, given the whole attempt timeout), and
// what that cycle never produced is handed back uncounted. It had waited the attempt
// timeout (20 s) and then counted the message as a broker failure.
TEST_F(TransactionalSinkTest, AStopWhileAProducerWaitsForItsCoordinatorKeepsTheDeadline) {
  KafkaTarget target = Target();
  target.attempt_timeout = 20s;
  cluster_->SetAllBrokersDown(true);
  auto sink = MakeKafkaSink("orders", target);
  auto watch = LogWatch::Install();
  Recorder rec;
  sink->Submit(MakeMessage(1, 0), rec.Callback());
  const bool waiting = watch->WaitFor("init_transactions", kWait);
  watch->Remove();
  ASSERT_TRUE(waiting) << "the cycle never began to create the bucket's producer";
  const auto stopping = std::chrono::steady_clock::now();
  sink->Shutdown(300ms);
  EXPECT_LT(std::chrono::steady_clock::now() - stopping, 5s) << "the stop waited for the broker";
  ASSERT_TRUE(rec.WaitCount(1));
  const Outcome out = rec.outcomes().at(1).at(0);
  EXPECT_EQ(out.kind, OutcomeKind::kRetry);
  EXPECT_EQ(out.reason_class, Reason::kShutdown) << out.reason;
  EXPECT_FALSE(out.maybe_sent) << "nothing was produced: handed back uncounted";
}

// The same while a transaction's commit waits for brokers that went away after it was
// produced: the stop ends the wait at its deadline. What the commit did not confirm may be in
// Kafka, so it comes back as a counted retry, checked before it is produced again.
TEST_F(TransactionalSinkTest, AStopWhileACommitWaitsForTheBrokersKeepsTheDeadline) {
  KafkaTarget target = Target();
  target.attempt_timeout = 20s;
  auto sink = MakeKafkaSink("orders", target);
  ASSERT_TRUE(WaitFor([&] { return sink->Ready(); }, kWait)) << sink->WhyNotReady();
  ASSERT_EQ(Deliver(*sink, {MakeMessage(1, 0)}).at(1)[0].kind, OutcomeKind::kDelivered);
  auto watch = LogWatch::Install();
  cluster_->PushRequestErrors(
      RD_KAFKAP_EndTxn,
      std::vector<rd_kafka_resp_err_t>(200, RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS));
  Recorder rec;
  sink->Submit(MakeMessage(2, 0), rec.Callback());
  const bool committing = watch->WaitFor("committing", kWait);
  watch->Remove();
  ASSERT_TRUE(committing) << "the transaction never began to commit";
  const auto stopping = std::chrono::steady_clock::now();
  sink->Shutdown(300ms);
  EXPECT_LT(std::chrono::steady_clock::now() - stopping, 5s) << "the stop waited for the commit";
  ASSERT_TRUE(rec.WaitCount(1));
  const Outcome out = rec.outcomes().at(2).at(0);
  EXPECT_EQ(out.kind, OutcomeKind::kRetry) << out.reason;
  EXPECT_TRUE(out.maybe_sent) << out.reason;
}

// The transaction timeout follows an explicit message.timeout.ms (or delivery.timeout.ms), up
// to 2 minutes: brokers refuse a transaction longer than their transaction.max.timeout.ms (15
// minutes by default), which failed every init_transactions until each message was
// dead-lettered, and a transaction left open by a relay that died has to end well inside the
// recovery's 5 minutes of clock slack (review). Refused when the config is read, naming the key.
TEST(TransactionalSinkConfig, ATransactionTimeoutOverTwoMinutesIsRefusedNamingTheKey) {
  for (const char* key : {"message.timeout.ms", "delivery.timeout.ms"}) {
    SCOPED_TRACE(key);
    KafkaTarget t;
    t.brokers = "localhost:9";
    t.topic = "orders";
    t.exactly_once = true;
    t.attempt_timeout = 30'000ms;
    t.producer[key] = "1200000";
    try {
      ValidateKafkaTarget("orders", t);
      FAIL() << "a 20-minute transaction timeout was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("\"") + key + "\" is 1200000"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("at most 120000"), std::string::npos) << e.what();
    }
    t.producer[key] = "120000";
    EXPECT_NO_THROW(ValidateKafkaTarget("orders", t));
  }
}

// An explicit message.timeout.ms (or delivery.timeout.ms) longer than the relay's attempt
// timeout, which the config has already fitted inside the lease: librdkafka wants it within
// transaction.timeout.ms, which the relay set to the attempt timeout, so every such config was
// refused with "`message.timeout.ms` must be set <= `transaction.timeout.ms`", a property the
// config does not let one set (found in review). The transaction timeout now covers it.
TEST_F(TransactionalSinkTest, AnExplicitMessageTimeoutLongerThanTheAttemptTimeoutIsUsable) {
  for (const char* key : {"message.timeout.ms", "delivery.timeout.ms"}) {
    SCOPED_TRACE(key);
    KafkaTarget t = Target();
    t.attempt_timeout = 23'333ms;  // lease 35 s
    t.producer[key] = "25000";
    EXPECT_NO_THROW(ValidateKafkaTarget("orders", t));
    auto sink = MakeKafkaSink("orders", t);
    Recorder rec;
    sink->Submit(MakeMessage(1, 0), rec.Callback());
    ASSERT_TRUE(rec.WaitCount(1));
    EXPECT_EQ(rec.outcomes().at(1).at(0).kind, OutcomeKind::kDelivered)
        << rec.outcomes().at(1).at(0).reason;
    sink->Shutdown(5s);
  }
  // socket.timeout.ms is bounded by the transaction timeout too (librdkafka lowers it when it
  // is not set): set above it, the error named transaction.timeout.ms, not the key to change.
  KafkaTarget t = Target();
  t.producer["socket.timeout.ms"] = "60000";
  try {
    ValidateKafkaTarget("orders", t);
    FAIL() << "socket.timeout.ms 60000 accepted with a 10 s transaction timeout";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"socket.timeout.ms\" is 60000; with `delivery: "
                                         "exactly_once` it must be at most 10100"),
              std::string::npos)
        << e.what();
  }
}

// The consumers of the exactly-once recovery and of `verify` reach the brokers as the producer
// does. "enable.ssl.certificate.verification: false" (a self-signed broker) and
// "enable.sasl.oauthbearer.unsecure.jwt" stayed with the producer: the producer connected, the
// recovery's consumer could not, and every message claimed again failed its check until it was
// dead-lettered (found in review).
TEST(ReadBackConsumer, TakesEveryPropertyAboutReachingTheBrokers) {
  for (const char* name :
       {"security.protocol", "ssl.ca.location", "sasl.mechanisms", "sasl.username",
        "enable.ssl.certificate.verification", "enable.sasl.oauthbearer.unsecure.jwt",
        "socket.timeout.ms", "broker.address.family", "client.dns.lookup",
        "api.version.request", "reconnect.backoff.ms", "ssl_engine_callback_data",
        "connections.max.idle.ms", "metadata.max.age.ms", "topic.metadata.refresh.interval.ms",
        "resolve.canonical.bootstrap.servers.only"}) {
    EXPECT_TRUE(kafka_detail::IsConnectionProperty(name)) << name;
  }
  for (const char* name : {"linger.ms", "acks", "enable.idempotence", "message.timeout.ms",
                           "compression.type", "batch.num.messages"}) {
    EXPECT_FALSE(kafka_detail::IsConnectionProperty(name)) << name;
  }
}

TEST_F(TransactionalSinkTest, TransactionPropertiesAreTheRelays) {
  KafkaTarget t = Target();
  t.producer["transaction.timeout.ms"] = "5000";
  try {
    ValidateKafkaTarget("orders", t);
    FAIL() << "transaction.timeout.ms accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("`delivery: exactly_once`"), std::string::npos)
        << e.what();
  }
}

// A read of a partition ends at the consumer's end report or at a record at or past the high
// watermark the partition had when the read began. It ended only at the end report, which
// librdkafka makes only when a fetch brings nothing new: on a partition that producers commit
// to more often than fetch.wait.max.ms (500 ms) a real broker answers every fetch with new
// records, so the exactly-once recovery after a relay crash read until its deadline and counted
// every message it checked as a failed attempt, and `verify` on a live topic never finished
// (review). librdkafka's mock cluster always reports the end, so the rule is tested here.
TEST(ReadBackEnd, ABusyPartitionIsReadOnceARecordReachesTheMark) {
  {
    kafka_detail::PartitionEnd recovery(100);
    EXPECT_FALSE(recovery.OnRecord(50));
    EXPECT_FALSE(recovery.OnEnd(60)) << "the end at the last stable offset, below the mark";
    EXPECT_FALSE(recovery.OnRecord(98));
    EXPECT_TRUE(recovery.OnRecord(99)) << "the last record below the mark";
    EXPECT_TRUE(recovery.done());
  }
  {
    // A transaction marker at 99 is never delivered: the next record ends the read.
    kafka_detail::PartitionEnd recovery(100);
    EXPECT_FALSE(recovery.OnRecord(98));
    EXPECT_TRUE(recovery.OnRecord(103));
  }
  {
    kafka_detail::PartitionEnd quiet(100);
    EXPECT_TRUE(quiet.OnEnd(100)) << "a quiet partition reports its end at the mark";
  }
  {
    // verify reads as the recovery does. It stopped at the last stable offset: behind a
    // transaction a killed relay left open, a message committed past it was a gap, and its
    // duplicate was not seen (review).
    kafka_detail::PartitionEnd verify(100);
    EXPECT_FALSE(verify.OnEnd(60)) << "the end report at an open transaction's stable offset";
    EXPECT_TRUE(verify.OnEnd(100));
    kafka_detail::PartitionEnd busy(100);
    EXPECT_FALSE(busy.OnRecord(10));
    EXPECT_TRUE(busy.OnRecord(100)) << "or at the mark, without an end report";
    kafka_detail::PartitionEnd empty(0);
    EXPECT_TRUE(empty.OnEnd(0));
  }
}

}  // namespace
}  // namespace transactional_sink_test
}  // namespace outbox::relay
