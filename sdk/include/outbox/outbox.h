// outbox SDK: write outbox messages in the caller's PostgreSQL transaction.
//
// The SDK never begins, commits or rolls back a transaction. A message becomes visible to
// the relay exactly when the caller's transaction commits, together with the business
// data it wrote, and disappears with it on rollback.
//
//   pqxx::work tx(conn);
//   tx.exec_params("UPDATE orders SET state = 'paid' WHERE id = $1", order_id);
//   outbox::Publish(tx, outbox::Message::To("orders")
//                           .Json(R"({"order_id": 42, "state": "paid"})")
//                           .Key("order-42")
//                           .EventType("order.paid")
//                           .Build());
//   tx.commit();
//
// Thread safety: the functions here are reentrant; a pqxx transaction itself must not be
// shared between threads (libpqxx's rule).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace outbox {

/// Thrown by MessageBuilder::Build and by Publish for input that can never be written.
/// what() names the field and how to fix it. Retrying the same input does not help.
/// Publish* also throws it for a refusal only the database can make (SQLSTATE 22023
/// invalid_parameter_value or 54000 program_limit_exceeded: an unknown destination under the
/// registry guard, a payload over outbox.settings.max_payload_bytes), with the database's
/// text and hint; PostgreSQL has then aborted the transaction, as after any database error.
class InvalidMessage : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
  InvalidMessage(const std::string& what, std::string sqlstate)
      : std::invalid_argument(what), sqlstate_(std::move(sqlstate)) {}
  /// The database's SQLSTATE when the database refused the message; empty when the SDK did.
  const std::string& sqlstate() const noexcept { return sqlstate_; }

 private:
  std::string sqlstate_;
};

using Clock = std::chrono::system_clock;

/// Limits on a message, the same as the SQL functions' (sql/migrations/0003_limits.sql and
/// docs/sdk.md): Build() and Publish throw InvalidMessage beyond them.
inline constexpr std::size_t kMaxOrderingKeyBytes = 1024;
inline constexpr std::size_t kMaxEventTypeBytes = 255;
inline constexpr std::size_t kMaxHeaders = 64;
inline constexpr std::size_t kMaxHeaderNameBytes = 255;
inline constexpr std::size_t kMaxHeaderValueBytes = 4096;
inline constexpr std::size_t kMaxTracestateBytes = 512;
/// How far ahead a message may be scheduled (deliver time): until one calendar year after
/// `now`, as the SQL functions' `clock_timestamp() + interval '1 year'` reads it in UTC (366
/// days when the year spans a 29 February; from a 29 February, the next 28 February).
Clock::time_point SchedulingHorizonEnd(Clock::time_point now);

/// A validated, immutable outbox message. Build one with Message::To(...)...Build().
struct OutboxMessage {
  std::string destination;
  std::string payload;  ///< JSON text when payload_is_json, raw bytes otherwise.
  bool payload_is_json = true;
  std::optional<std::string> ordering_key;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string event_type;
  std::optional<Clock::time_point> deliver_after;  ///< Unset: as soon as committed.
  std::optional<std::string> idempotency_key;      ///< uuid text; unset: a random uuid.
};

/// Fluent builder. Every setter returns *this; Build() validates everything at once.
class MessageBuilder {
 public:
  explicit MessageBuilder(std::string destination);

  /// Payload as JSON text (validated by Build()).
  MessageBuilder& Json(std::string json_text);
  /// Payload as raw bytes (delivered as application/octet-stream to webhooks).
  MessageBuilder& Bytes(std::string bytes);
  /// Ordering key: messages with the same destination and key are delivered in order.
  MessageBuilder& Key(std::string ordering_key);
  /// Adds a header. Names must be non-empty and unique per message.
  MessageBuilder& Header(std::string name, std::string value);
  /// W3C trace context of the span that wrote the message (headers "traceparent" and, when
  /// not empty, "tracestate"): the relay forwards both to Kafka and webhook consumers as they
  /// are, and logs the trace id with each delivery outcome. Build() checks the format.
  MessageBuilder& TraceContext(std::string traceparent, std::string tracestate = "");
  MessageBuilder& EventType(std::string event_type);
  /// Do not deliver before `when`.
  MessageBuilder& DeliverAt(Clock::time_point when);
  /// Do not deliver before now + `delay`.
  MessageBuilder& DeliverAfter(std::chrono::milliseconds delay);
  /// Adds a uniformly random delay in [0, max) to the deliver time, so a burst scheduled
  /// for one instant (a nightly billing run) spreads over a window instead of piling onto
  /// one index range. The cheapest fix for bursts; see docs/scaling.md.
  MessageBuilder& Jitter(std::chrono::milliseconds max);
  /// Fix the idempotency key (a uuid) instead of a random one, e.g. to make a retried
  /// business transaction produce the same key.
  MessageBuilder& IdempotencyKey(std::string uuid);

  /// Validates and returns the message. Throws InvalidMessage naming the first bad field.
  OutboxMessage Build() const;

 private:
  OutboxMessage msg_;
  bool has_payload_ = false;
  std::chrono::milliseconds jitter_{0};
  std::optional<std::chrono::milliseconds> delay_;
};

/// Entry point of the builder: Message::To("orders").Json(...).Build().
struct Message {
  static MessageBuilder To(std::string destination) {
    return MessageBuilder(std::move(destination));
  }
};

/// Writes one message inside `tx` and returns its id. Throws InvalidMessage for invalid
/// input and pqxx exceptions for database errors (after which the transaction is aborted,
/// as always in PostgreSQL, so nothing is half-written). `tx` is a real transaction
/// (pqxx::work, a subtransaction, ...): a pqxx::nontransaction commits every statement on its
/// own, so the message would not share the fate of the business write.
std::int64_t Publish(pqxx::dbtransaction& tx, const OutboxMessage& message);

/// Writes many messages inside `tx` in one round trip (one outbox.enqueue_many call, which
/// takes the locks of all their keys in one global order first); returns their ids in input
/// order. Validates all of them before writing any.
std::vector<std::int64_t> PublishMany(pqxx::dbtransaction& tx,
                                      const std::vector<OutboxMessage>& messages);

}  // namespace outbox
