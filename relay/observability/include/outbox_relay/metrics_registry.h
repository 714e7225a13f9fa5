// A small, dependency-free metrics registry rendering the Prometheus text exposition format
// 0.0.4. Counters, gauges (set, or evaluated at scrape time) and fixed-bucket histograms,
// each a family with a fixed list of label names. Every method is thread-safe; updating an
// existing series is lock-free, creating one takes the family's mutex once.
//
// Cardinality is bounded by construction: a family holds at most `max_series` series; past
// that, new label combinations share one series whose label values are all kOverflowLabel,
// so an unexpected label value can cost memory for one series, never an unbounded number.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace outbox::relay::metrics {

using LabelValues = std::vector<std::string>;

/// The label value of the shared series that takes new label sets once a family is full.
inline constexpr std::string_view kOverflowLabel = "_overflow";
/// Default bound on the series of one family.
inline constexpr std::size_t kDefaultMaxSeries = 1000;

/// A monotonically increasing value.
class Counter {
 public:
  /// Adds `by`; negative or NaN increments are ignored (a counter never goes down).
  void Inc(double by = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

/// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Inc(double by = 1.0);
  void Dec(double by = 1.0) { Inc(-by); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

/// Counts observations into fixed buckets (upper bounds, inclusive), plus their sum.
class Histogram {
 public:
  struct Snapshot {
    std::vector<std::uint64_t> cumulative;  ///< Per bound, then +Inf last (== count).
    double sum = 0;
    std::uint64_t count = 0;
  };

  /// `bounds` must outlive the histogram (the family owns them).
  explicit Histogram(const std::vector<double>& bounds);
  /// NaN observations are ignored.
  void Observe(double v);
  Snapshot Collect() const;

 private:
  const std::vector<double>& bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> counts_;  // bounds_.size() + 1 (+Inf)
  std::atomic<double> sum_{0.0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

/// What every family shares: a name, help text, a type and label names.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  std::size_t max_series() const { return max_series_; }
  /// Appends this family in the text exposition format (HELP, TYPE, samples).
  virtual void Render(std::string& out) const = 0;

 protected:
  FamilyBase(std::string name, std::string help, MetricType type,
             std::vector<std::string> label_names, std::size_t max_series);
  /// Throws std::invalid_argument when the number of values differs from the label names.
  void CheckArity(const LabelValues& values) const;
  /// `# HELP` and `# TYPE` lines.
  void RenderHeader(std::string& out) const;
  /// `name<suffix>{a="x",b="y"[,extra="v"]} value` and a newline.
  void RenderSample(std::string& out, std::string_view suffix, const LabelValues& values,
                    double value, std::string_view extra_name = {},
                    std::string_view extra_value = {}) const;

  std::string name_, help_;
  MetricType type_;
  std::vector<std::string> label_names_;
  std::size_t max_series_;
};

/// A family of series of one kind, keyed by label values.
template <typename T>
class Family : public FamilyBase {
 public:
  /// The series for `values`, created on first use (when the family already holds
  /// max_series series, a new label set gets the shared overflow series instead). Throws
  /// std::invalid_argument when the number of values differs from the number of label names.
  /// The reference stays valid until that series is removed.
  T& Labels(const LabelValues& values);
  /// Drops a series: it is no longer rendered, references to it dangle.
  void Remove(const LabelValues& values);
  /// Drops every series for which `drop` returns true.
  void RemoveIf(const std::function<bool(const LabelValues&)>& drop);
  /// Whether the family has a series of its own for `values` (the overflow series aside).
  bool Has(const LabelValues& values) const;
  /// Number of series (the overflow series included, when it exists).
  std::size_t size() const;

 protected:
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         std::size_t max_series)
      : FamilyBase(std::move(name), std::move(help), type, std::move(label_names), max_series) {}
  virtual std::unique_ptr<T> Make() const = 0;

  struct Series {
    std::unique_ptr<T> metric;
    std::function<double()> callback;  // gauges only: evaluated at scrape time when set
  };
  /// Finds or creates (bounded) the series; mu_ must be held. Null only when the family is
  /// full and `allow_overflow` is false.
  Series* FindOrCreateLocked(const LabelValues& values, bool allow_overflow);

  mutable std::mutex mu_;
  std::map<LabelValues, Series> series_;
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

class CounterFamily final : public Family<Counter> {
 public:
  CounterFamily(std::string name, std::string help, std::vector<std::string> label_names,
                std::size_t max_series = kDefaultMaxSeries);
  void Render(std::string& out) const override;
  /// The sum over every series.
  double Total() const;

 private:
  std::unique_ptr<Counter> Make() const override { return std::make_unique<Counter>(); }
};

class GaugeFamily final : public Family<Gauge> {
 public:
  GaugeFamily(std::string name, std::string help, std::vector<std::string> label_names,
              std::size_t max_series = kDefaultMaxSeries);
  /// Makes the series for `values` report `fn()` at scrape time instead of a stored value
  /// (replacing an earlier callback). `fn` runs on the scraping thread with no registry lock
  /// held; it must be thread-safe; if it throws, the series is left out of that scrape.
  /// Remove the series before whatever `fn` captures goes away. Returns false (and keeps
  /// nothing) when the family is full and `values` is new: a callback never overflows.
  bool SetCallback(const LabelValues& values, std::function<double()> fn);
  void Render(std::string& out) const override;

 private:
  std::unique_ptr<Gauge> Make() const override { return std::make_unique<Gauge>(); }
};

class HistogramFamily final : public Family<Histogram> {
 public:
  /// `bounds`: finite, strictly increasing upper bounds; +Inf is implicit.
  HistogramFamily(std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> bounds, std::size_t max_series = kDefaultMaxSeries);
  const std::vector<double>& bounds() const { return bounds_; }
  void Render(std::string& out) const override;

 private:
  std::unique_ptr<Histogram> Make() const override { return std::make_unique<Histogram>(bounds_); }
  std::vector<double> bounds_;
};

/// Owns families and renders them, in registration order.
class Registry {
 public:
  /// Names follow Prometheus rules ([a-zA-Z_:][a-zA-Z0-9_:]*; labels [a-zA-Z_][a-zA-Z0-9_]*,
  /// not starting with "__"); counter names must end in "_total"; histograms may not use the
  /// label "le". A name may be registered once. Violations throw std::invalid_argument.
  CounterFamily& AddCounter(std::string name, std::string help,
                            std::vector<std::string> label_names = {},
                            std::size_t max_series = kDefaultMaxSeries);
  GaugeFamily& AddGauge(std::string name, std::string help,
                        std::vector<std::string> label_names = {},
                        std::size_t max_series = kDefaultMaxSeries);
  HistogramFamily& AddHistogram(std::string name, std::string help,
                                std::vector<std::string> label_names, std::vector<double> bounds,
                                std::size_t max_series = kDefaultMaxSeries);

  /// Every family in the text exposition format 0.0.4. A family without series renders only
  /// its HELP and TYPE lines.
  std::string Render() const;

 private:
  void Register(std::unique_ptr<FamilyBase> family);
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_;
};

/// The Content-Type of Registry::Render's output.
inline constexpr const char* kExpositionContentType = "text/plain; version=0.0.4; charset=utf-8";

/// A sample value as the format writes it: shortest round-trip decimal, "+Inf", "-Inf", "NaN".
std::string FormatValue(double v);
/// A label value with \, " and newline escaped.
std::string EscapeLabelValue(std::string_view v);
/// HELP text with \ and newline escaped.
std::string EscapeHelp(std::string_view v);

/// `count` bounds start, start*factor, ... (start > 0, factor > 1, count >= 1).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

}  // namespace outbox::relay::metrics
