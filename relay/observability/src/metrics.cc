#include "outbox_relay/metrics.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <set>
#include <utility>

namespace outbox::relay {
namespace {

using metrics::LabelValues;

LabelValues L(std::string_view a) { return {std::string(a)}; }
LabelValues L(std::string_view a, std::string_view b) { return {std::string(a), std::string(b)}; }

const std::vector<std::string> kDest = {"destination"};

}  // namespace

std::string_view ReasonClass(Reason reason) { return MetricLabel(reason); }

std::string_view ReasonClass(std::string_view label) { return MetricLabel(ReasonFromLabel(label)); }

std::string_view WebhookResponseClass(const Outcome& o) {
  if (o.kind == OutcomeKind::kDelivered) return "2xx";
  switch (o.reason_class) {
    case Reason::kShutdown:
      return "";
    case Reason::kHttp3xx:
      return "3xx";
    case Reason::kHttp4xx:
    case Reason::kHttp408:
    case Reason::kHttp429:
      return "4xx";
    case Reason::kHttp5xx:
      return "5xx";
    case Reason::kTimeout:
      return "timeout";
    case Reason::kConnection:
      return "connection";
    case Reason::kTls:
      return "tls";
    case Reason::kBlockedAddress:
      return "blocked_address";
    default:
      return "other";
  }
}

std::string_view SinkLabel(std::string_view sink) {
  // Sink::Kind() of a registered kind: a short lowercase word, a handful per build.
  const bool word =
      !sink.empty() && sink.size() <= 32 && std::all_of(sink.begin(), sink.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
      });
  return word ? sink : "other";
}

const std::vector<double>& PollCycleBuckets() {
  // Seed 001: healthy 10-15 ms, degrading 30-50 ms, trouble 100-200 ms, broken 500 ms+.
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05,
                                        0.1,   0.2,    0.5,   1,    2.5,   5};
  return b;
}

const std::vector<double>& DeliveryDurationBuckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                        0.25,  0.5,    1,     2.5,  5,     10,   30};
  return b;
}

const std::vector<double>& EnqueueToDeliveryBuckets() {
  // From a poll cycle to a day of retries.
  static const std::vector<double> b = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,  1,     2.5,  5,
                                        10,   30,    60,   300, 900,  3600, 14400, 86400};
  return b;
}

RelayMetrics::RelayMetrics(std::string version)
    : queue_depth(registry.AddGauge(
          "outbox_queue_depth",
          "Messages in the queue and not leased (fresh, scheduled, blocked or waiting "
          "for a retry), from the last status read.",
          kDest)),
      oldest_pending_age_seconds(
          registry.AddGauge("outbox_oldest_pending_age_seconds",
                            "Longest wait among unleased messages that are due, blocked or "
                            "retrying, from the last status read.",
                            kDest)),
      in_flight(registry.AddGauge("outbox_in_flight",
                                  "Messages leased by a relay, from the last status read.", kDest)),
      retrying(registry.AddGauge(
          "outbox_retrying",
          "Unleased messages that failed at least once, from the last status read.", kDest)),
      blocked(registry.AddGauge(
          "outbox_blocked",
          "Unleased messages waiting behind an earlier message of their ordering key, from "
          "the last status read.",
          kDest)),
      dead_letters(registry.AddGauge(
          "outbox_dead_letters", "Rows in outbox.dead_letters, from the last status read.", kDest)),
      destination_relays(registry.AddGauge(
          "outbox_destination_relays",
          "Live relays (heartbeat in outbox.relay_heartbeats) that serve the destination, from "
          "the last status read.",
          kDest)),
      destination_paused(registry.AddGauge(
          "outbox_destination_paused",
          "1 while an operator has paused the destination (outbox-relay pause): relays claim "
          "nothing for it. From the last status read.",
          kDest)),
      unserved_oldest_age(registry.AddGauge(
          "outbox_unserved_oldest_age_seconds",
          "Age of the oldest waiting message of a destination that no live relay serves; 0 "
          "while one does. From the last status read.",
          kDest)),
      queue_lock_waiters(
          registry.AddGauge("outbox_queue_lock_waiters",
                            "Sessions waiting for a lock on outbox.messages (should be 0 with SKIP "
                            "LOCKED), from the last status read.")),
      queue_table_live_tuples(registry.AddGauge(
          "outbox_queue_table_live_tuples", "pg_stat_user_tables.n_live_tup of outbox.messages.")),
      queue_table_dead_tuples(registry.AddGauge(
          "outbox_queue_table_dead_tuples", "pg_stat_user_tables.n_dead_tup of outbox.messages.")),
      queue_table_last_vacuum(
          registry.AddGauge("outbox_queue_table_last_vacuum_timestamp_seconds",
                            "When outbox.messages was last vacuumed (manual or auto), Unix time; "
                            "absent if never.")),
      oldest_transaction_age(
          registry.AddGauge("outbox_oldest_transaction_age_seconds",
                            "Age of the oldest open transaction holding back the xmin horizon "
                            "(blocks vacuum and the fresh-lane cursor); 0 if none.")),
      xmin_lag(registry.AddGauge(
          "outbox_xmin_lag_transactions",
          "Transaction ids between the oldest running transaction and the next one.")),
      status_timestamp(registry.AddGauge(
          "outbox_status_timestamp_seconds",
          "When the status gauges were last refreshed (database clock), Unix time.")),
      claims_total(registry.AddCounter("outbox_claims_total", "Claim statements run.", kDest)),
      empty_polls_total(registry.AddCounter("outbox_empty_polls_total",
                                            "Claim statements that leased nothing.", kDest)),
      messages_claimed_total(registry.AddCounter("outbox_messages_claimed_total",
                                                 "Messages leased by claims.", kDest)),
      poll_cycle_duration(registry.AddHistogram(
          "outbox_poll_cycle_duration_seconds",
          "Round trip of one claim statement (the poll cycle).", kDest, PollCycleBuckets())),
      delivered_total(
          registry.AddCounter("outbox_delivered_total", "Messages settled as delivered.", kDest)),
      retried_total(registry.AddCounter("outbox_retried_total",
                                        "Messages settled for a later retry, by reason class.",
                                        {"destination", "reason"})),
      dead_lettered_total(registry.AddCounter(
          "outbox_dead_lettered_total", "Messages moved to the dead letters, by reason class.",
          {"destination", "reason"})),
      enqueue_to_delivery(registry.AddHistogram(
          "outbox_enqueue_to_delivery_seconds",
          "From enqueue (created_at) to settled as delivered.", kDest, EnqueueToDeliveryBuckets())),
      delivery_duration(
          registry.AddHistogram("outbox_delivery_duration_seconds",
                                "One delivery attempt, from submit to the sink's completion.",
                                {"destination", "sink"}, DeliveryDurationBuckets())),
      webhook_responses_total(
          registry.AddCounter("outbox_webhook_responses_total",
                              "Webhook attempts by response class (2xx, 4xx, 5xx, timeout, ...).",
                              {"destination", "class"})),
      kafka_producer_queue_length(
          registry.AddGauge("outbox_kafka_producer_queue_length",
                            "Messages and requests waiting in the Kafka producer.", kDest)),
      webhook_breaker_state(registry.AddGauge(
          "outbox_webhook_breaker_state",
          "The endpoint's circuit breaker: 0 closed, 1 half-open (one probe), 2 open (nothing "
          "is sent).",
          kDest)),
      webhook_breaker_opened_total(registry.AddCounter(
          "outbox_webhook_breaker_opened_total",
          "Times the endpoint's circuit breaker opened after consecutive failures.", kDest)),
      webhook_concurrency_limit(registry.AddGauge(
          "outbox_webhook_concurrency_limit",
          "Concurrent requests adaptive concurrency allows the endpoint now (at most "
          "max_in_flight).",
          kDest)),
      webhook_paused_seconds(registry.AddGauge(
          "outbox_webhook_paused_seconds",
          "Left of a pause the endpoint asked for with Retry-After (0: not paused).", kDest)),
      webhook_pauses_total(registry.AddCounter(
          "outbox_webhook_pauses_total",
          "Times a 429 or 503 with Retry-After paused the whole endpoint.", kDest)),
      webhook_endpoints(registry.AddGauge(
          "outbox_webhook_endpoints",
          "A webhook service's endpoints by state: enabled, disabled, breaker_open.",
          {"destination", "state"})),
      webhook_endpoints_auto_disabled_total(
          registry.AddCounter("outbox_webhook_endpoints_auto_disabled_total",
                              "Endpoints this relay disabled because they kept failing longer than "
                              "auto_disable_after_ms.",
                              kDest)),
      sweep_found_total(registry.AddCounter(
          "outbox_sweep_found_total",
          "Fresh messages only the periodic full sweep found: the fresh lane had passed them "
          "(by design 0; each one waited up to full_sweep_interval_ms).",
          kDest)),
      released_total(registry.AddCounter(
          "outbox_released_total",
          "Messages handed back to the queue with no attempt counted: at shutdown, or while a "
          "sink sends nothing (an open circuit breaker).",
          kDest)),
      sink_events_total(registry.AddCounter(
          "outbox_sink_events_total",
          "Events a sink counts of its own, by name: the exactly-once Kafka sink's "
          "transactions_committed, transactions_failed, recovered (messages found already in "
          "Kafka and not produced again), recovery_partitions_read and producers_created.",
          {"destination", "event"})),
      settle_fenced_total(
          registry.AddCounter("outbox_settle_fenced_total",
                              "Settlements refused because the lease had expired and moved on.")),
      reaper_requeued_total(registry.AddCounter(
          "outbox_reaper_requeued_total",
          "Messages whose lease expired, returned to the queue by the reaper.")),
      db_errors_total(
          registry.AddCounter("outbox_db_errors_total", "Database errors the relay survived.")),
      build_info(registry.AddGauge("outbox_relay_build_info",
                                   "Always 1; the version of this relay.", {"version"})),
      relay_ready(
          registry.AddGauge("outbox_relay_ready",
                            "1 while the relay is ready (what /readyz answers 200 for), else 0.")),
      sink_payload_bytes(registry.AddGauge(
          "outbox_sink_payload_bytes",
          "Bytes of payloads the destination's sink holds, handed over and not finished yet "
          "(max_in_flight_bytes bounds them).",
          kDest)) {
  build_info.Labels({std::move(version)}).Set(1);
  // Unlabelled counters exist from the start, at 0.
  settle_fenced_total.Labels({});
  reaper_requeued_total.Labels({});
  db_errors_total.Labels({});
}

void RelayMetrics::InitDestination(std::string_view destination, std::string_view sink) {
  const auto l = L(destination);
  claims_total.Labels(l);
  empty_polls_total.Labels(l);
  messages_claimed_total.Labels(l);
  sweep_found_total.Labels(l);
  released_total.Labels(l);
  delivered_total.Labels(l);
  poll_cycle_duration.Labels(l);
  enqueue_to_delivery.Labels(l);
  delivery_duration.Labels(L(destination, SinkLabel(sink)));
}

void RelayMetrics::RecordClaim(std::string_view destination, std::int64_t claimed, Seconds cycle) {
  const auto l = L(destination);
  claims_total.Labels(l).Inc();
  if (claimed <= 0) {
    empty_polls_total.Labels(l).Inc();
  } else {
    messages_claimed_total.Labels(l).Inc(static_cast<double>(claimed));
  }
  poll_cycle_duration.Labels(l).Observe(cycle.count());
}

void RelayMetrics::RecordDeliveryDuration(std::string_view destination, std::string_view sink,
                                          Seconds took) {
  DeliveryDuration(destination, sink).Observe(took.count());
}

metrics::Histogram& RelayMetrics::DeliveryDuration(std::string_view destination,
                                                   std::string_view sink) {
  return delivery_duration.Labels(L(destination, SinkLabel(sink)));
}

void RelayMetrics::RecordWebhookResponse(std::string_view destination, const Outcome& outcome) {
  const auto cls = WebhookResponseClass(outcome);
  if (cls.empty()) return;
  webhook_responses_total.Labels(L(destination, cls)).Inc();
}

void RelayMetrics::RecordDelivered(std::string_view destination, Seconds latency) {
  Delivered(destination).Record(latency);
}

RelayMetrics::DeliveredSeries RelayMetrics::Delivered(std::string_view destination) {
  const auto l = L(destination);
  return {delivered_total.Labels(l), enqueue_to_delivery.Labels(l)};
}

void RelayMetrics::DeliveredSeries::Record(Seconds latency_of_one) const {
  delivered.Inc();
  latency.Observe(std::max(0.0, latency_of_one.count()));
}

void RelayMetrics::RecordDelivered(std::string_view destination,
                                   std::chrono::system_clock::time_point created_at) {
  RecordDelivered(destination, std::chrono::system_clock::now() - created_at);
}

void RelayMetrics::RecordRetried(std::string_view destination, Reason reason, std::int64_t n) {
  if (n > 0) retried_total.Labels(L(destination, ReasonClass(reason))).Inc(static_cast<double>(n));
}

void RelayMetrics::RecordDeadLettered(std::string_view destination, Reason reason, std::int64_t n) {
  if (n > 0)
    dead_lettered_total.Labels(L(destination, ReasonClass(reason))).Inc(static_cast<double>(n));
}

void RelayMetrics::RecordReaperRequeued(std::int64_t n) {
  if (n > 0) reaper_requeued_total.Labels({}).Inc(static_cast<double>(n));
}

void RelayMetrics::RecordSweepFound(std::string_view destination, std::int64_t n) {
  if (n > 0) sweep_found_total.Labels(L(destination)).Inc(static_cast<double>(n));
}

void RelayMetrics::RecordSettleFenced(std::int64_t n) {
  if (n > 0) settle_fenced_total.Labels({}).Inc(static_cast<double>(n));
}

void RelayMetrics::RecordReleased(std::string_view destination, std::int64_t n) {
  if (n > 0) released_total.Labels(L(destination)).Inc(static_cast<double>(n));
}

void RelayMetrics::RecordDbError(std::int64_t n) {
  if (n > 0) db_errors_total.Labels({}).Inc(static_cast<double>(n));
}

void RelayMetrics::UpdateSinkEvents(std::string_view destination,
                                    const std::map<std::string, std::int64_t>& counts) {
  const std::string dest(destination);
  for (const auto& [event, count] : counts) {
    auto& series = sink_events_total.Labels({dest, event});
    if (static_cast<double>(count) > series.Value()) {
      series.Inc(static_cast<double>(count) - series.Value());
    }
  }
}

void RelayMetrics::UpdateTargetHealth(std::string_view destination, const TargetHealth& h) {
  // Kafka targets' counts are the sink's event counters (outbox_sink_events_total).
  if (h.kind != "webhook") return;
  const auto l = L(destination);
  const double state = h.breaker == "open" ? 2 : h.breaker == "half_open" ? 1 : 0;
  webhook_breaker_state.Labels(l).Set(state);
  webhook_concurrency_limit.Labels(l).Set(h.concurrency_limit);
  webhook_paused_seconds.Labels(l).Set(static_cast<double>(h.paused_for.count()) / 1000.0);
  std::int64_t opened = 0, paused = 0;
  {
    std::lock_guard lk(health_mu_);
    auto [it, fresh] = health_seen_.try_emplace(std::string(destination));
    opened = h.times_opened - (fresh ? 0 : it->second.times_opened);
    paused = h.times_paused - (fresh ? 0 : it->second.times_paused);
    it->second = h;
  }
  auto& opened_total = webhook_breaker_opened_total.Labels(l);  // created at 0
  if (opened > 0) opened_total.Inc(static_cast<double>(opened));
  auto& pauses_total = webhook_pauses_total.Labels(l);
  if (paused > 0) pauses_total.Inc(static_cast<double>(paused));
  if (!h.service) return;
  const std::string dest(destination);
  webhook_endpoints.Labels({dest, "enabled"}).Set(h.endpoints - h.endpoints_disabled);
  webhook_endpoints.Labels({dest, "disabled"}).Set(h.endpoints_disabled);
  webhook_endpoints.Labels({dest, "breaker_open"}).Set(h.endpoints_open);
  auto& auto_disabled = webhook_endpoints_auto_disabled_total.Labels(l);
  if (h.endpoints_auto_disabled > auto_disabled.Value()) {
    auto_disabled.Inc(static_cast<double>(h.endpoints_auto_disabled) - auto_disabled.Value());
  }
}

void RelayMetrics::SetKafkaProducerQueueLength(std::string_view destination,
                                               std::function<double()> fn) {
  kafka_producer_queue_length.SetCallback(L(destination), std::move(fn));
}

void RelayMetrics::ClearKafkaProducerQueueLength(std::string_view destination) {
  kafka_producer_queue_length.Remove(L(destination));
}

void RelayMetrics::SetSinkPayloadBytes(std::string_view destination, std::function<double()> fn) {
  sink_payload_bytes.SetCallback(L(destination), std::move(fn));
}

void RelayMetrics::ClearSinkPayloadBytes(std::string_view destination) {
  sink_payload_bytes.Remove(L(destination));
}

void RelayMetrics::SetReadyCallback(std::function<bool()> fn) {
  relay_ready.SetCallback({}, [fn = std::move(fn)]() -> double {
    try {
      return fn && fn() ? 1.0 : 0.0;
    } catch (...) {
      return 0.0;
    }
  });
}

void RelayMetrics::ClearReadyCallback() { relay_ready.Remove({}); }

void RelayMetrics::UpdateFromStatus(const StatusSnapshot& s) {
  // Counts not read (the pass over a huge queue ran past its timeout): the destination gauges
  // and the status timestamp keep their last values (OutboxStatusStale fires in time); what
  // was read all the same, the destinations' relays and pauses and the database's health, is
  // set (for destinations that have series: the list of destinations is partial without the
  // counts, and the overflow series sums what it cannot see).
  if (s.counts_error.empty()) {
    UpdateDestinationGauges(s);
  } else {
    for (const auto& d : s.destinations) {
      const auto l = L(d.destination);
      if (destination_relays.Has(l))
        destination_relays.Labels(l).Set(static_cast<double>(d.relays));
      if (destination_paused.Has(l)) destination_paused.Labels(l).Set(d.paused ? 1.0 : 0.0);
    }
  }
  queue_lock_waiters.Labels({}).Set(static_cast<double>(s.lock_waiters));
  queue_table_live_tuples.Labels({}).Set(static_cast<double>(s.table.live_tuples));
  queue_table_dead_tuples.Labels({}).Set(static_cast<double>(s.table.dead_tuples));
  if (const auto v = s.table.LastAnyVacuumEpoch()) {
    queue_table_last_vacuum.Labels({}).Set(*v);
  } else {
    queue_table_last_vacuum.Remove({});
  }
  oldest_transaction_age.Labels({}).Set(s.oldest_transaction ? s.oldest_transaction->age_seconds
                                                             : 0.0);
  xmin_lag.Labels({}).Set(static_cast<double>(s.xmin_lag_xids));
  if (s.counts_error.empty()) status_timestamp.Labels({}).Set(s.taken_at_epoch);
}

void RelayMetrics::UpdateDestinationGauges(const StatusSnapshot& s) {
  // The first kDefaultMaxSeries destinations by name have series of their own; the rest share
  // the overflow series, summed (ages: the oldest). Series of destinations gone, or past the
  // limit, are dropped first, so each family then holds exactly the destinations kept and the
  // overflow label set reaches the overflow series. (Dropped after setting, the overflow
  // series went too: no destination has its label set.)
  std::vector<const DestinationStatus*> by_name;
  for (const auto& d : s.destinations) by_name.push_back(&d);
  std::sort(by_name.begin(), by_name.end(),
            [](const auto* a, const auto* b) { return a->destination < b->destination; });
  const std::size_t kept = std::min(by_name.size(), metrics::kDefaultMaxSeries);
  std::set<LabelValues> present;
  for (std::size_t i = 0; i < kept; ++i) present.insert(L(by_name[i]->destination));
  const auto gone = [&](const LabelValues& l) { return present.count(l) == 0; };
  for (auto* f : {&queue_depth, &oldest_pending_age_seconds, &in_flight, &retrying, &blocked,
                  &dead_letters, &destination_relays, &destination_paused, &unserved_oldest_age}) {
    f->RemoveIf(gone);
  }
  const auto set = [&](const LabelValues& l, const DestinationStatus& d) {
    queue_depth.Labels(l).Set(static_cast<double>(d.depth));
    oldest_pending_age_seconds.Labels(l).Set(d.oldest_pending_age_seconds);
    in_flight.Labels(l).Set(static_cast<double>(d.in_flight));
    retrying.Labels(l).Set(static_cast<double>(d.retrying));
    blocked.Labels(l).Set(static_cast<double>(d.blocked));
    dead_letters.Labels(l).Set(static_cast<double>(d.dead_letters));
    destination_relays.Labels(l).Set(static_cast<double>(d.relays));
    destination_paused.Labels(l).Set(d.paused ? 1.0 : 0.0);
    unserved_oldest_age.Labels(l).Set(d.Unserved() ? d.oldest_pending_age_seconds : 0.0);
  };
  for (std::size_t i = 0; i < kept; ++i) set(L(by_name[i]->destination), *by_name[i]);
  if (by_name.size() > kept) {
    DestinationStatus rest;
    double unserved_age = 0;
    for (std::size_t i = kept; i < by_name.size(); ++i) {
      const auto& d = *by_name[i];
      rest.depth += d.depth;
      rest.in_flight += d.in_flight;
      rest.retrying += d.retrying;
      rest.blocked += d.blocked;
      rest.dead_letters += d.dead_letters;
      rest.relays = std::max(rest.relays, d.relays);
      rest.paused = rest.paused || d.paused;
      rest.oldest_pending_age_seconds =
          std::max(rest.oldest_pending_age_seconds, d.oldest_pending_age_seconds);
      if (d.Unserved()) unserved_age = std::max(unserved_age, d.oldest_pending_age_seconds);
    }
    set(L(metrics::kOverflowLabel), rest);
    unserved_oldest_age.Labels(L(metrics::kOverflowLabel)).Set(unserved_age);
  }
}

}  // namespace outbox::relay
