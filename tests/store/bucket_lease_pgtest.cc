// The store's bucket-lease statements (docs/adr/0003-bucket-leases.md, plan step 2:
// claim_owned.sql, settle_owned_delivered.sql) against a real PostgreSQL: a claim that leases
// by bucket ownership writes nothing to the rows it reads, a settle is fenced by the buckets'
// epochs, keys keep their order, and the slow lane holds what it takes.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <pqxx/pqxx>
#include <set>

#include "outbox/outbox.h"
#include "outbox_relay/fresh_cursor.h"
#include "outbox_relay/store.h"
#include "outbox_test/pg.h"

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;

std::string NewInstance() { return NewUuid(); }

class BucketLeaseTest : public testing::PgTest {
 protected:
  std::vector<std::int64_t> Enqueue(int n, const std::optional<std::string>& key = std::nullopt,
                                    const std::string& destination = "d") {
    std::vector<outbox::OutboxMessage> msgs;
    for (int i = 0; i < n; ++i) {
      outbox::OutboxMessage m;
      m.destination = destination;
      m.payload = "{\"n\": " + std::to_string(i) + "}";
      m.ordering_key = key;
      msgs.push_back(std::move(m));
    }
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    auto ids = outbox::PublishMany(tx, msgs);
    tx.commit();
    return ids;
  }
  std::int64_t Scalar(const std::string& sql) {
    pqxx::connection c(db_url_);
    return pqxx::nontransaction(c).exec1(sql)[0].as<std::int64_t>();
  }
  static std::vector<std::int64_t> Ids(const ClaimResult& claim) {
    std::vector<std::int64_t> ids;
    for (const auto& m : claim.messages) ids.push_back(Raw(m.id));
    return ids;
  }
  static std::vector<MessageId> MessageIds(const std::vector<std::int64_t>& ids) {
    std::vector<MessageId> out;
    for (const auto id : ids) out.push_back(MessageId{id});
    return out;
  }
  // `bucket` moves to another relay, as a rebalance moves it: a new owner, the next epoch.
  void MoveToAnotherRelay(int bucket) {
    Scalar("WITH m AS (UPDATE outbox.bucket_owners SET owner = '" + NewInstance() +
           "', epoch = epoch + 1 WHERE bucket = " + std::to_string(bucket) +
           " RETURNING 1) SELECT count(*) FROM m");
  }
  // The queue's rows with anything a lease would write: an owner, a lease end, a record.
  std::int64_t Leased() {
    return Scalar("SELECT count(*) FROM outbox.messages WHERE lease_owner IS NOT NULL") +
           Scalar("SELECT count(*) FROM outbox.leases");
  }
};

TEST_F(BucketLeaseTest, AClaimOfOwnedBucketsReadsTheRowsAndWritesNothing) {
  const auto ids = Enqueue(30);
  Store store(db_url_);
  const std::string me = NewInstance();
  const auto owned = store.Coordinate(me, 10s, false, "bucket_lease_pgtest");
  ASSERT_EQ(owned.size(), 64u);
  const auto versions = Scalar("SELECT sum(xmin::text::bigint) FROM outbox.messages");
  const auto claim = store.ClaimOwned("d", 0, 20, 10, 30s, me, owned);
  EXPECT_TRUE(claim.lease_token.empty());
  ASSERT_EQ(Ids(claim), std::vector<std::int64_t>(ids.begin(), ids.begin() + 20));
  EXPECT_EQ(claim.fresh_lane.size(), 20u);
  ASSERT_TRUE(claim.facts.fresh_full_bound.has_value()) << "the lane stopped at its limit";
  EXPECT_EQ(*claim.facts.fresh_full_bound, ids[19]);
  EXPECT_EQ(claim.messages[0].payload, "{\"n\": 0}");
  EXPECT_EQ(Leased(), 0) << "no lease owner, no lease record";
  EXPECT_EQ(Scalar("SELECT sum(xmin::text::bigint) FROM outbox.messages"), versions)
      << "a row the claim read was written";
  // From the cursor on: the rest.
  const auto next = store.ClaimOwned("d", ids[19], 20, 10, 30s, me, owned);
  EXPECT_EQ(Ids(next), std::vector<std::int64_t>(ids.begin() + 20, ids.end()));
  EXPECT_FALSE(next.facts.fresh_full_bound.has_value());
}

// Only the buckets owned at the epochs the relay holds: a bucket that moved on (its epoch
// bumped, another owner) is neither claimed from nor settled in.
TEST_F(BucketLeaseTest, ABucketThatMovedIsNeitherClaimedNorSettled) {
  const auto ids = Enqueue(200);
  Store store(db_url_);
  const std::string me = NewInstance();
  auto owned = store.Coordinate(me, 10s, false, "bucket_lease_pgtest");
  ASSERT_EQ(owned.size(), 64u);
  const auto first = store.ClaimOwned("d", 0, 200, 10, 30s, me, owned);
  ASSERT_EQ(first.messages.size(), 200u);
  // Bucket of the first message moves to another relay: new owner, next epoch.
  const int moved = first.messages[0].bucket;
  MoveToAnotherRelay(moved);
  std::set<std::int64_t> in_moved;
  for (const auto& m : first.messages) {
    if (m.bucket == moved) in_moved.insert(Raw(m.id));
  }
  ASSERT_FALSE(in_moved.empty());
  const auto counts = store.SettleOwnedDelivered(MessageIds(ids), me, owned);
  EXPECT_EQ(counts.delivered, 200 - static_cast<std::int64_t>(in_moved.size()));
  EXPECT_EQ(counts.fenced, static_cast<std::int64_t>(in_moved.size()));
  EXPECT_EQ(counts.gone, 0);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages"),
            static_cast<std::int64_t>(in_moved.size()))
      << "the moved bucket's rows stay for their new owner";
  // Claimed again from the start (the lane started over), they are not this relay's.
  EXPECT_TRUE(store.ClaimOwned("d", 0, 200, 10, 30s, me, owned).messages.empty());
  // Settled again: already gone ones count as gone.
  const auto again = store.SettleOwnedDelivered({MessageId{ids[0]}}, me, owned);
  EXPECT_EQ(again.delivered, 0);
  EXPECT_EQ(again.gone + again.fenced, 1);
}

// A key's next message is handed out only once its predecessor is settled: blocked, it is
// parked, and the settle of the predecessor wakes it for the next claim.
TEST_F(BucketLeaseTest, AKeysNextMessageWaitsForItsPredecessorsSettle) {
  const auto ids = Enqueue(3, std::string("k"));
  Store store(db_url_);
  const std::string me = NewInstance();
  const auto owned = store.Coordinate(me, 10s, false, "bucket_lease_pgtest");
  const auto first = store.ClaimOwned("d", 0, 10, 5, 30s, me, owned);
  ASSERT_EQ(Ids(first), std::vector<std::int64_t>{ids[0]});
  EXPECT_EQ(first.facts.held, 2) << "the two behind it parked";
  EXPECT_TRUE(store.ClaimOwned("d", ids[2], 10, 5, 30s, me, owned).messages.empty());
  const auto settled = store.SettleOwnedDelivered({MessageId{ids[0]}}, me, owned);
  EXPECT_EQ(settled.delivered, 1);
  EXPECT_EQ(settled.woken, 1);
  const auto second = store.ClaimOwned("d", ids[2], 10, 5, 30s, me, owned);
  ASSERT_EQ(Ids(second), std::vector<std::int64_t>{ids[1]}) << "from the slow lane, woken";
  EXPECT_TRUE(second.fresh_lane.empty());
  EXPECT_EQ(Leased(), 0);
}

// The slow lane's rows are held a lease ahead when taken: the next claims pass them, and once
// that time has passed (the relay died with them) they come due again.
TEST_F(BucketLeaseTest, ASlowLaneRowTakenIsHeldForTheLease) {
  const auto ids = Enqueue(1);
  Scalar("WITH m AS (UPDATE outbox.messages SET parked = true, deliver_after = now() - "
         "interval '1 s', attempts = 1 RETURNING 1) SELECT count(*) FROM m");
  Store store(db_url_);
  const std::string me = NewInstance();
  const auto owned = store.Coordinate(me, 10s, false, "bucket_lease_pgtest");
  const auto taken = store.ClaimOwned("d", ids[0], 10, 5, 30s, me, owned);
  ASSERT_EQ(Ids(taken), ids);
  EXPECT_EQ(taken.messages[0].attempts, 1);
  EXPECT_TRUE(store.ClaimOwned("d", ids[0], 10, 5, 30s, me, owned).messages.empty())
      << "taken again while held";
  EXPECT_GT(Scalar("SELECT count(*) FROM outbox.messages WHERE deliver_after > now() + "
                   "interval '25 s'"),
            0);
  // Its hold ran out.
  Scalar("WITH m AS (UPDATE outbox.messages SET deliver_after = now() - interval '1 s' "
         "RETURNING 1) SELECT count(*) FROM m");
  EXPECT_EQ(Ids(store.ClaimOwned("d", ids[0], 10, 5, 30s, me, owned)), ids);
  EXPECT_EQ(store.SettleOwnedDelivered(MessageIds(ids), me, owned).delivered, 1);
}

// The fresh-lane cursor passes what a claim read once no transaction that may still commit
// queue rows below it is running (docs/adr/0001-claim-path.md). A bucket-lease relay's settles
// write no queue rows, and one begins between most two claims; counted, they held the cursor
// back at every other claim, which read the last one's rows again (a third of the claims of a
// 100k drain came back with nothing new). Here a settle's transaction begins before each claim
// and runs through it: from the second claim on, each one's rows are passed at once. Any other
// transaction running through the claims still holds the cursor back, and so does a session
// that only takes the settler's connection name: a settler is known by its registered backend
// (migration 0038; known by that name before, such a transaction was passed over, and the
// cursor could pass the rows it then committed).
TEST_F(BucketLeaseTest, TheCursorPassesEachClaimsRowsWhileOnlyBucketLeaseSettlesRun) {
  const auto ids = Enqueue(40);
  Store store(db_url_);
  const std::string me = NewInstance();
  const auto owned = store.Coordinate(me, 10s, false, "bucket_lease_pgtest");
  enum class Other { kSettler, kNamedLikeASettler, kWriter };
  for (const Other kind : {Other::kSettler, Other::kNamedLikeASettler, Other::kWriter}) {
    const bool settler = kind == Other::kSettler;
    SCOPED_TRACE(settler                             ? "bucket-lease settles running"
                 : kind == Other::kNamedLikeASettler ? "a session named as a settler running"
                                                     : "other transactions running");
    pqxx::connection other(db_url_);
    if (kind != Other::kWriter) {
      pqxx::nontransaction(other).exec("SET application_name = '" +
                                       std::string(Store::kOwnedSettlerName) + "'");
    }
    if (settler) pqxx::nontransaction(other).exec("SELECT outbox.register_bucket_lease_settler()");
    std::optional<pqxx::work> tx;
    FreshCursor cursor;
    for (int i = 0; i < 4; ++i) {
      // A settle begins before each claim; the other transaction runs through them all.
      if (!tx || settler) {
        if (tx) tx->abort();
        tx.emplace(other);
        tx->exec("SELECT pg_current_xact_id()");  // an xid, as a settle's DELETE takes
      }
      const auto claim = store.ClaimOwned("d", cursor.position(), 10, 5, 30s, me, owned);
      ASSERT_EQ(claim.messages.size(), 10u);
      cursor.Observe(claim.facts);
      if (settler && i >= 1) {
        EXPECT_EQ(cursor.position(), Raw(claim.messages.back().id))
            << "claim " << i << ": a settle held the cursor back";
      }
    }
    tx->abort();
    if (!settler) {
      EXPECT_EQ(cursor.position(), 0) << "the cursor passed rows a running transaction may commit";
    }
  }
  EXPECT_EQ(ids.size(), 40u);
}

Settlement Outcome(std::int64_t id, Settlement::Kind kind) {
  Settlement s;
  s.id = MessageId{id};
  s.kind = kind;
  s.delay = 60s;
  s.error = "HTTP 503";
  return s;
}

// Retries, releases and dead letters, with deliveries in the same batch: written as under row
// leases, in the buckets still owned; no lease is left behind.
TEST_F(BucketLeaseTest, EveryOutcomeIsWrittenInTheBucketsStillOwned) {
  const auto ids = Enqueue(4);
  Store store(db_url_);
  const std::string me = NewInstance();
  const auto owned = store.Coordinate(me, 10s, false, "bucket_lease_pgtest");
  ASSERT_EQ(store.ClaimOwned("d", 0, 10, 5, 30s, me, owned).messages.size(), 4u);
  const auto counts = store.SettleOwned(
      {Outcome(ids[0], Settlement::Kind::kDelivered), Outcome(ids[1], Settlement::Kind::kRetry),
       Outcome(ids[2], Settlement::Kind::kRelease), Outcome(ids[3], Settlement::Kind::kDead)},
      false, me, owned);
  EXPECT_EQ(counts.delivered, 1);
  EXPECT_EQ(counts.retried, 1);
  EXPECT_EQ(counts.released, 1);
  EXPECT_EQ(counts.dead, 1);
  EXPECT_EQ(counts.fenced, 0);
  EXPECT_EQ(counts.written.size(), 4u);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages"), 2) << "the retry and the release";
  EXPECT_EQ(Scalar("SELECT attempts FROM outbox.messages WHERE id = " + std::to_string(ids[1])), 1)
      << "the retry counted an attempt";
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages WHERE parked AND deliver_after > "
                   "now() + interval '50 s'"),
            2)
      << "both wait for their delay";
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters WHERE id = " + std::to_string(ids[3])),
            1);
  EXPECT_EQ(Leased(), 0) << "the lease the transaction gave them is gone with it";
}

// retention.archive_delivered: a delivery under bucket leases is archived as under row leases
// (outbox-relay verify compares a topic with the archive), and a fenced one is not.
TEST_F(BucketLeaseTest, ArchivedDeliveriesAreCopiedToTheArchiveInTheBucketsStillOwned) {
  Enqueue(16);
  Store store(db_url_);
  const std::string me = NewInstance();
  auto owned = store.Coordinate(me, 10s, false, "bucket_lease_pgtest");
  const auto claim = store.ClaimOwned("d", 0, 20, 5, 30s, me, owned);
  ASSERT_EQ(claim.messages.size(), 16u);
  // Two messages of different buckets; the second one's bucket moves away before the settle.
  const auto& kept = claim.messages[0];
  const auto other = std::find_if(claim.messages.begin(), claim.messages.end(),
                                  [&](const Message& m) { return m.bucket != kept.bucket; });
  ASSERT_NE(other, claim.messages.end()) << "16 messages in one bucket";
  const std::int64_t ids[] = {Raw(kept.id), Raw(other->id)};
  MoveToAnotherRelay(other->bucket);
  const auto counts = store.SettleOwned(
      {Outcome(ids[0], Settlement::Kind::kDelivered), Outcome(ids[1], Settlement::Kind::kDelivered)},
      true, me, owned);
  EXPECT_EQ(counts.delivered, 1);
  EXPECT_EQ(counts.fenced, 1);
  EXPECT_EQ(counts.archived, 1);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.delivered_archive WHERE id = " +
                   std::to_string(ids[0])),
            1);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.delivered_archive"), 1);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages WHERE id = " + std::to_string(ids[1])), 1)
      << "the fenced one stays for the bucket's new owner";
  EXPECT_EQ(Leased(), 0);
}

TEST_F(BucketLeaseTest, AnOutcomeInABucketThatMovedIsFenced) {
  const auto ids = Enqueue(1);
  Store store(db_url_);
  const std::string me = NewInstance();
  const auto owned = store.Coordinate(me, 10s, false, "bucket_lease_pgtest");
  const auto claim = store.ClaimOwned("d", 0, 10, 5, 30s, me, owned);
  ASSERT_EQ(claim.messages.size(), 1u);
  MoveToAnotherRelay(claim.messages[0].bucket);
  const auto counts = store.SettleOwned({Outcome(ids[0], Settlement::Kind::kRetry)}, false, me, owned);
  EXPECT_EQ(counts.retried, 0);
  EXPECT_EQ(counts.fenced, 1);
  EXPECT_EQ(Scalar("SELECT attempts FROM outbox.messages"), 0) << "nothing written";
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages WHERE NOT parked"), 1);
  EXPECT_EQ(Leased(), 0);
}

// A batch is written whole or not at all: its deliveries were written in a transaction of
// their own, so when the rest failed the settler's retry found them gone and counted them as
// such, not as delivered (the delivered metrics undercounted; ADR 0003, "Left").
TEST_F(BucketLeaseTest, ABatchWhoseOtherOutcomesFailWritesNoneOfItsDeliveriesEither) {
  const auto ids = Enqueue(2);
  Store store(db_url_);
  const std::string me = NewInstance();
  const auto owned = store.Coordinate(me, 10s, false, "bucket_lease_pgtest");
  ASSERT_EQ(store.ClaimOwned("d", 0, 10, 5, 30s, me, owned).messages.size(), 2u);
  pqxx::connection admin(db_url_);
  pqxx::nontransaction(admin).exec(
      "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS "
      "$$ BEGIN RAISE EXCEPTION 'dead letters refused by the test'; END $$; "
      "CREATE TRIGGER refuse BEFORE INSERT ON outbox.dead_letters "
      "FOR EACH ROW EXECUTE FUNCTION public.refuse()");
  const std::vector<Settlement> batch = {Outcome(ids[0], Settlement::Kind::kDelivered),
                                         Outcome(ids[1], Settlement::Kind::kDead)};
  EXPECT_ANY_THROW(store.SettleOwned(batch, false, me, owned));
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages"), 2)
      << "the delivery was written although its batch failed";
  pqxx::nontransaction(admin).exec(
      "DROP TRIGGER refuse ON outbox.dead_letters; DROP FUNCTION public.refuse()");
  const auto counts = store.SettleOwned(batch, false, me, owned);  // the settler's retry
  EXPECT_EQ(counts.delivered, 1);
  EXPECT_EQ(counts.dead, 1);
  EXPECT_EQ(counts.gone, 0);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages"), 0);
}

TEST_F(BucketLeaseTest, AFanOutThatLeavesEndpointsRowsIsRefused) {
  const auto ids = Enqueue(1);
  Store store(db_url_);
  const std::string me = NewInstance();
  const auto owned = store.Coordinate(me, 10s, false, "bucket_lease_pgtest");
  auto fanout = Outcome(ids[0], Settlement::Kind::kFanOut);
  fanout.children.push_back({"e1", Settlement::Kind::kRetry, 1s, "HTTP 500", 1, Reason::kNone});
  EXPECT_THROW(store.SettleOwned({fanout}, false, me, owned), std::invalid_argument);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages"), 1);
}

TEST_F(BucketLeaseTest, AnotherDestinationsRowsAreNotClaimed) {
  Enqueue(5, std::nullopt, "other");
  const auto ids = Enqueue(5);
  Store store(db_url_);
  const std::string me = NewInstance();
  const auto owned = store.Coordinate(me, 10s, false, "bucket_lease_pgtest");
  EXPECT_EQ(Ids(store.ClaimOwned("d", 0, 100, 10, 30s, me, owned)), ids);
}

}  // namespace
}  // namespace outbox::relay
