// The registry of sink kinds: each destination finds its factory, the factory's checks are the
// sink's own, and what the rest of the relay asks a sink (kind, in-flight cap, client queue,
// whether outcomes are responses) comes from the sink, not from a branch on its kind.
#include "outbox_relay/sink_registry.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>

#include "outbox_relay/kafka_target.h"
#include "outbox_relay/webhook_target.h"

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;

Destination Kafka(const std::string& name) {
  Destination d;
  d.name = name;
  KafkaTarget k;
  k.brokers = "127.0.0.1:1";  // nothing listens: the sink connects lazily
  k.topic = "t";
  d.target = k;
  return d;
}

Destination Webhook(const std::string& name, int max_in_flight) {
  Destination d;
  d.name = name;
  WebhookTarget w;
  w.url = "http://127.0.0.1:1/hook";
  w.allow_private_networks = true;
  w.secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
  w.max_in_flight = max_in_flight;
  d.target = w;
  return d;
}

TEST(SinkRegistry, EveryKindIsRegisteredOnce) {
  std::set<std::string_view> kinds;
  for (const auto* f : SinkFactories()) EXPECT_TRUE(kinds.insert(f->kind).second) << f->kind;
  EXPECT_EQ(kinds, (std::set<std::string_view>{"kafka", "webhook"}));
}

TEST(SinkRegistry, EachDestinationGetsTheSinkOfItsTarget) {
  EXPECT_EQ(SinkFactoryFor(Kafka("orders")).kind, "kafka");
  EXPECT_EQ(SinkFactoryFor(Webhook("hooks", 2)).kind, "webhook");

  auto kafka = MakeSink(Kafka("orders"));
  EXPECT_EQ(kafka->Kind(), "kafka");
  EXPECT_EQ(kafka->MaxInFlight(100), 400u) << "four claims' worth";
  EXPECT_TRUE(kafka->ClientQueueLength().has_value()) << "the producer queue is a gauge";
  EXPECT_FALSE(kafka->OutcomesAreResponses());
  kafka->Shutdown(0ms);

  auto hook = MakeSink(Webhook("hooks", 3));
  EXPECT_EQ(hook->Kind(), "webhook");
  // Room for the next claim to run while two are still queued (session 28: at two claims'
  // worth, 16 per worker, the 16-core machine's workers idled through most of each claim).
  EXPECT_EQ(hook->MaxInFlight(100), 192u) << "64 per worker";
  EXPECT_EQ(MakeSink(Webhook("one", 1))->MaxInFlight(100), 64u);
  auto wide = MakeSink(Webhook("wide", 64));
  EXPECT_EQ(wide->MaxInFlight(100), 300u) << "at most three claims' worth";
  EXPECT_EQ(wide->MaxInFlight(500), 1500u) << "at most three claims' worth";
  EXPECT_EQ(wide->MaxInFlight(10), 128u) << "but two per worker";
  wide->Shutdown(0ms);
  EXPECT_FALSE(hook->ClientQueueLength().has_value());
  EXPECT_TRUE(hook->OutcomesAreResponses());
  hook->Shutdown(0ms);
}

TEST(SinkRegistry, ValidateIsTheSinksOwnCheck) {
  auto bad_kafka = Kafka("orders");
  bad_kafka.target.Get<KafkaTarget>().producer["no.such.property"] = "1";
  try {
    ValidateSink(bad_kafka);
    ADD_FAILURE() << "an unknown producer property passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no.such.property"), std::string::npos) << e.what();
  }
  EXPECT_THROW(MakeSink(bad_kafka), std::invalid_argument);

  auto bad_hook = Webhook("hooks", 1);
  bad_hook.target.Get<WebhookTarget>().secrets.clear();
  EXPECT_THROW(ValidateSink(bad_hook), std::invalid_argument);
  EXPECT_NO_THROW(ValidateSink(Kafka("orders")));
  EXPECT_NO_THROW(ValidateSink(Webhook("hooks", 1)));
}

}  // namespace
}  // namespace outbox::relay
