// The webhook service's pure parts: which endpoints an event goes to, and the delivery id
// (the same as outbox.endpoint_delivery_id in SQL, checked against Postgres by
// webhook_service_process_pgtest).
#include "outbox_relay/webhook_service.h"

#include <gtest/gtest.h>

namespace outbox::relay {
namespace {

TEST(EndpointWants, AnEmptyFilterTakesEverythingAPatternItsPrefix) {
  EXPECT_TRUE(EndpointWants({}, "anything"));
  EXPECT_TRUE(EndpointWants({}, ""));
  EXPECT_TRUE(EndpointWants({"order.paid"}, "order.paid"));
  EXPECT_FALSE(EndpointWants({"order.paid"}, "order.paid.late"));
  EXPECT_FALSE(EndpointWants({"order.paid"}, "order"));
  EXPECT_TRUE(EndpointWants({"invoice.*"}, "invoice.paid"));
  EXPECT_TRUE(EndpointWants({"invoice.*"}, "invoice.paid.twice"));
  EXPECT_FALSE(EndpointWants({"invoice.*"}, "invoice"));
  EXPECT_FALSE(EndpointWants({"invoice.*"}, "invoices.paid"));
  EXPECT_TRUE(EndpointWants({"a", "invoice.*"}, "a"));
  EXPECT_FALSE(EndpointWants({"a", "invoice.*"}, ""));
}

TEST(EndpointDeliveryId, IsTheUuidOfTheMd5OfMessageAndEndpoint) {
  const std::string a = EndpointDeliveryId("00000000-0000-0000-0000-000000000001", "ep_1");
  ASSERT_EQ(a.size(), 36u);
  EXPECT_EQ(a[8], '-');
  EXPECT_EQ(a[13], '-');
  EXPECT_EQ(a[18], '-');
  EXPECT_EQ(a[23], '-');
  EXPECT_EQ(a, EndpointDeliveryId("00000000-0000-0000-0000-000000000001", "ep_1"));
  EXPECT_NE(a, EndpointDeliveryId("00000000-0000-0000-0000-000000000001", "ep_2"));
  EXPECT_NE(a, EndpointDeliveryId("00000000-0000-0000-0000-000000000002", "ep_1"));
  // The id of ("", "") is md5("/"), 6666cd76f96956469e7be39d750cc7d9 (md5sum).
  EXPECT_EQ(EndpointDeliveryId("", ""), "6666cd76-f969-5646-9e7b-e39d750cc7d9");
}

}  // namespace
}  // namespace outbox::relay
