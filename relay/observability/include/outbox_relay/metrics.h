// The relay's metrics: one RelayMetrics owns the registry and every metric the relay exposes
// on /metrics. Every method is thread-safe and cheap enough for the delivery path (a map
// lookup under a short mutex, then atomics). Names, types and labels are documented in
// docs/operations.md; labels are bounded: destination (from the config), sink, and a reason
// or response class from a fixed list (ReasonClass, WebhookResponseClass) — never a key or
// an id.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "outbox_relay/metrics_registry.h"
#include "outbox_relay/sink.h"
#include "outbox_relay/status.h"

namespace outbox::relay {

/// The `reason` label a Reason counts under (MetricLabel, reason.h), one of:
///   http_4xx http_429 http_5xx http_other timeout connection message_rejected authorization
///   topic_or_config producer shutdown lease_expired attempts_exhausted unknown_destination
///   other
/// as documented in docs/operations.md (e.g. http_408 -> timeout, tls -> connection,
/// msg_too_large -> message_rejected). The string form takes a reason's label ("http_408");
/// anything else is "other".
std::string_view ReasonClass(Reason reason);
std::string_view ReasonClass(std::string_view label);

/// The `class` label of outbox_webhook_responses_total for one webhook outcome: "2xx",
/// "3xx", "4xx", "5xx", "timeout", "connection", "tls", "other"; "" when no response was
/// awaited (reason_class "shutdown") and nothing should be counted.
std::string_view WebhookResponseClass(const Outcome& outcome);

/// The `sink` label: Sink::Kind() ("kafka", "webhook"; what the registry lists), or "other"
/// for a text that is not a short lowercase word.
std::string_view SinkLabel(std::string_view sink);

struct RelayMetrics {
  using Seconds = std::chrono::duration<double>;

  /// `version` becomes outbox_relay_build_info{version="..."} 1.
  explicit RelayMetrics(std::string version);
  RelayMetrics(const RelayMetrics&) = delete;
  RelayMetrics& operator=(const RelayMetrics&) = delete;

  metrics::Registry registry;

  // ---- gauges from the status query (UpdateFromStatus) ----
  metrics::GaugeFamily& queue_depth;  // outbox_queue_depth{destination}
  metrics::GaugeFamily&
      oldest_pending_age_seconds;                 // outbox_oldest_pending_age_seconds{destination}
  metrics::GaugeFamily& in_flight;                // outbox_in_flight{destination}
  metrics::GaugeFamily& retrying;                 // outbox_retrying{destination}
  metrics::GaugeFamily& blocked;                  // outbox_blocked{destination}
  metrics::GaugeFamily& dead_letters;             // outbox_dead_letters{destination}
  metrics::GaugeFamily& destination_relays;       // outbox_destination_relays{destination}
  metrics::GaugeFamily& destination_paused;       // outbox_destination_paused{destination}
  metrics::GaugeFamily& unserved_oldest_age;      // outbox_unserved_oldest_age_seconds{destination}
  metrics::GaugeFamily& queue_lock_waiters;       // outbox_queue_lock_waiters
  metrics::GaugeFamily& queue_table_live_tuples;  // outbox_queue_table_live_tuples
  metrics::GaugeFamily& queue_table_dead_tuples;  // outbox_queue_table_dead_tuples
  metrics::GaugeFamily&
      queue_table_last_vacuum;                   // outbox_queue_table_last_vacuum_timestamp_seconds
  metrics::GaugeFamily& oldest_transaction_age;  // outbox_oldest_transaction_age_seconds
  metrics::GaugeFamily& xmin_lag;                // outbox_xmin_lag_transactions
  metrics::GaugeFamily& status_timestamp;        // outbox_status_timestamp_seconds

  // ---- claim loop ----
  metrics::CounterFamily& claims_total;            // outbox_claims_total{destination}
  metrics::CounterFamily& empty_polls_total;       // outbox_empty_polls_total{destination}
  metrics::CounterFamily& messages_claimed_total;  // outbox_messages_claimed_total{destination}
  metrics::HistogramFamily& poll_cycle_duration;  // outbox_poll_cycle_duration_seconds{destination}

  // ---- delivery and settling ----
  metrics::CounterFamily& delivered_total;        // outbox_delivered_total{destination}
  metrics::CounterFamily& retried_total;          // outbox_retried_total{destination,reason}
  metrics::CounterFamily& dead_lettered_total;    // outbox_dead_lettered_total{destination,reason}
  metrics::HistogramFamily& enqueue_to_delivery;  // outbox_enqueue_to_delivery_seconds{destination}
  metrics::HistogramFamily&
      delivery_duration;  // outbox_delivery_duration_seconds{destination,sink}
  metrics::CounterFamily&
      webhook_responses_total;  // outbox_webhook_responses_total{destination,class}
  metrics::GaugeFamily&
      kafka_producer_queue_length;              // outbox_kafka_producer_queue_length{destination}
  metrics::GaugeFamily& webhook_breaker_state;  // outbox_webhook_breaker_state{destination}
  metrics::CounterFamily&
      webhook_breaker_opened_total;  // outbox_webhook_breaker_opened_total{destination}
  metrics::GaugeFamily& webhook_concurrency_limit;  // outbox_webhook_concurrency_limit{destination}
  metrics::GaugeFamily& webhook_paused_seconds;     // outbox_webhook_paused_seconds{destination}
  metrics::CounterFamily& webhook_pauses_total;     // outbox_webhook_pauses_total{destination}
  metrics::GaugeFamily& webhook_endpoints;          // outbox_webhook_endpoints{destination,state}
  metrics::CounterFamily&
      webhook_endpoints_auto_disabled_total;      // ..._auto_disabled_total{destination}
  metrics::CounterFamily& sweep_found_total;      // outbox_sweep_found_total{destination}
  metrics::CounterFamily& released_total;         // outbox_released_total{destination}
  metrics::CounterFamily& sink_events_total;      // outbox_sink_events_total{destination,event}
  metrics::CounterFamily& settle_fenced_total;    // outbox_settle_fenced_total
  metrics::CounterFamily& reaper_requeued_total;  // outbox_reaper_requeued_total
  metrics::CounterFamily& db_errors_total;        // outbox_db_errors_total
  metrics::GaugeFamily& build_info;               // outbox_relay_build_info{version}
  metrics::GaugeFamily& relay_ready;              // outbox_relay_ready (set by AdminServer)
  metrics::GaugeFamily& sink_payload_bytes;       // outbox_sink_payload_bytes{destination}

  /// Creates the series of a configured destination at 0 (claims, empty polls, claimed,
  /// delivered, the histograms), so rates and alerts see them before the first message.
  void InitDestination(std::string_view destination, std::string_view sink);

  /// One claim statement of `destination` that leased `claimed` messages and took `cycle`
  /// (the statement's round trip: seed 001's poll-cycle time).
  void RecordClaim(std::string_view destination, std::int64_t claimed, Seconds cycle);
  /// One delivery attempt by `sink` ("kafka" / "webhook"), from Submit to its completion.
  void RecordDeliveryDuration(std::string_view destination, std::string_view sink, Seconds took);
  /// That histogram's series, to keep and observe without a lookup per attempt.
  metrics::Histogram& DeliveryDuration(std::string_view destination, std::string_view sink);
  /// A webhook outcome: counted under WebhookResponseClass(outcome) (not at all for "").
  void RecordWebhookResponse(std::string_view destination, const Outcome& outcome);
  /// A message settled as delivered, `latency` after it was enqueued.
  void RecordDelivered(std::string_view destination, Seconds latency);
  /// One destination's delivered counter and latency histogram, looked up once to record a
  /// whole settle's deliveries (the series live as long as the metrics).
  struct DeliveredSeries {
    metrics::Counter& delivered;
    metrics::Histogram& latency;
    void Record(Seconds latency_of_one) const;
  };
  DeliveredSeries Delivered(std::string_view destination);
  /// Same, from the message's created_at and the current time (negative clamps to 0).
  void RecordDelivered(std::string_view destination,
                       std::chrono::system_clock::time_point created_at);
  /// A message settled for a later retry / moved to the dead letters, labelled through
  /// ReasonClass.
  void RecordRetried(std::string_view destination, Reason reason, std::int64_t n = 1);
  void RecordDeadLettered(std::string_view destination, Reason reason, std::int64_t n = 1);
  void RecordReaperRequeued(std::int64_t n);
  void RecordSettleFenced(std::int64_t n);
  /// Messages handed back to the queue with no attempt counted (shutdown, a sink that stopped
  /// sending).
  void RecordReleased(std::string_view destination, std::int64_t n = 1);
  /// Fresh messages of `destination` that only the periodic full sweep found: the fresh lane
  /// had passed them (should stay 0; see docs/adr/0001-claim-path.md).
  void RecordSweepFound(std::string_view destination, std::int64_t n);
  void RecordDbError(std::int64_t n = 1);

  /// A sink's view of its target (Sink::Health), read often: sets the breaker state (0 closed,
  /// 1 half-open, 2 open), the concurrency limit and the pause left, and counts the openings
  /// and pauses since the previous call.
  /// A sink's own event counts (Sink::EventCounts), read again and again: each series moves by
  /// what the sink counted since the last call.
  void UpdateSinkEvents(std::string_view destination,
                        const std::map<std::string, std::int64_t>& counts);
  void UpdateTargetHealth(std::string_view destination, const TargetHealth& health);

  /// outbox_kafka_producer_queue_length{destination} = fn() at each scrape (e.g. the
  /// producer's rd_kafka_outq_len). Clear it before whatever fn captures is destroyed.
  void SetKafkaProducerQueueLength(std::string_view destination, std::function<double()> fn);
  void ClearKafkaProducerQueueLength(std::string_view destination);
  /// outbox_sink_payload_bytes{destination} = fn() at each scrape: the bytes of payloads the
  /// destination's sink holds (max_in_flight_bytes caps them; the dispatcher sets it).
  void SetSinkPayloadBytes(std::string_view destination, std::function<double()> fn);
  void ClearSinkPayloadBytes(std::string_view destination);

  /// outbox_relay_ready = 1 while fn() is true, 0 otherwise (also when it throws), evaluated
  /// at scrape time. AdminServer sets it from its ready callback while it runs.
  void SetReadyCallback(std::function<bool()> fn);
  void ClearReadyCallback();

  /// Sets every status gauge from `s`. Per-destination series of destinations no longer in
  /// the snapshot are dropped (pass the configured ones in StatusOptions::destinations so
  /// they stay, at 0). Call it from a periodic collector, e.g. every 15 s. A snapshot whose
  /// counts were not read (counts_error) sets the database's gauges only: the destinations'
  /// and outbox_status_timestamp_seconds keep their values.
  void UpdateFromStatus(const StatusSnapshot& s);

  /// The text exposition of everything (what /metrics serves).
  std::string Render() const { return registry.Render(); }

 private:
  void UpdateDestinationGauges(const StatusSnapshot& s);

  std::mutex health_mu_;
  std::map<std::string, TargetHealth, std::less<>> health_seen_;  // guarded by health_mu_
};

/// Bucket bounds used by the histograms (seconds), for docs and dashboards.
const std::vector<double>& PollCycleBuckets();
const std::vector<double>& DeliveryDurationBuckets();
const std::vector<double>& EnqueueToDeliveryBuckets();

}  // namespace outbox::relay
