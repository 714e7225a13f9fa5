#include "outbox_relay/metrics_registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <stdexcept>
#include <utility>

namespace outbox::relay::metrics {
namespace {

bool ValidMetricName(std::string_view n) {
  if (n.empty()) return false;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    const bool digit = c >= '0' && c <= '9';
    if (!(alpha || (i > 0 && digit))) return false;
  }
  return true;
}

bool ValidLabelName(std::string_view n) {
  if (n.empty() || n.substr(0, 2) == "__") return false;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const bool digit = c >= '0' && c <= '9';
    if (!(alpha || (i > 0 && digit))) return false;
  }
  return true;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// atomic<double> += without relying on fetch_add's codegen for floating point.
void AtomicAdd(std::atomic<double>& a, double by) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + by, std::memory_order_relaxed)) {
  }
}

const char* TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == 0) return "0";  // also -0
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (const char c : v) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (const char c : v) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    throw std::invalid_argument("ExponentialBuckets: need start > 0, factor > 1, count >= 1");
  }
  std::vector<double> out;
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) out.push_back(b);
  return out;
}

// ---- series ----------------------------------------------------------------------------

void Counter::Inc(double by) {
  if (!(by >= 0)) return;  // negative or NaN
  AtomicAdd(value_, by);
}

void Gauge::Inc(double by) { AtomicAdd(value_, by); }

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds), counts_(new std::atomic<std::uint64_t>[bounds.size() + 1]) {
  for (std::size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  // First bound >= v: buckets are "less than or equal".
  const auto i = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                                          bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, v);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot s;
  s.cumulative.resize(bounds_.size() + 1);
  std::uint64_t running = 0;
  for (std::size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  // The count is the +Inf bucket by construction, so _count and le="+Inf" always agree.
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

// ---- families --------------------------------------------------------------------------

FamilyBase::FamilyBase(std::string name, std::string help, MetricType type,
                       std::vector<std::string> label_names, std::size_t max_series)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      max_series_(max_series) {
  if (!ValidMetricName(name_))
    throw std::invalid_argument("metric name \"" + name_ + "\" is not valid");
  if (type_ == MetricType::kCounter && !EndsWith(name_, "_total")) {
    throw std::invalid_argument("counter \"" + name_ + "\" must end in _total");
  }
  std::set<std::string> seen;
  for (const auto& l : label_names_) {
    if (!ValidLabelName(l))
      throw std::invalid_argument("label name \"" + l + "\" of " + name_ + " is not valid");
    if (type_ == MetricType::kHistogram && l == "le") {
      throw std::invalid_argument("histogram " + name_ + " may not use the label \"le\"");
    }
    if (!seen.insert(l).second)
      throw std::invalid_argument("label \"" + l + "\" repeated in " + name_);
  }
  if (max_series_ < 1)
    throw std::invalid_argument("max_series of " + name_ + " must be at least 1");
}

void FamilyBase::CheckArity(const LabelValues& values) const {
  if (values.size() != label_names_.size()) {
    throw std::invalid_argument(name_ + " takes " + std::to_string(label_names_.size()) +
                                " label values, got " + std::to_string(values.size()));
  }
}

void FamilyBase::RenderHeader(std::string& out) const {
  out += "# HELP ";
  out += name_;
  out += ' ';
  out += EscapeHelp(help_);
  out += "\n# TYPE ";
  out += name_;
  out += ' ';
  out += TypeName(type_);
  out += '\n';
}

void FamilyBase::RenderSample(std::string& out, std::string_view suffix, const LabelValues& values,
                              double value, std::string_view extra_name,
                              std::string_view extra_value) const {
  out += name_;
  out += suffix;
  if (!values.empty() || !extra_name.empty()) {
    out += '{';
    bool first = true;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!first) out += ',';
      first = false;
      out += label_names_[i];
      out += "=\"";
      out += EscapeLabelValue(values[i]);
      out += '"';
    }
    if (!extra_name.empty()) {
      if (!first) out += ',';
      out += extra_name;
      out += "=\"";
      out += EscapeLabelValue(extra_value);
      out += '"';
    }
    out += '}';
  }
  out += ' ';
  out += FormatValue(value);
  out += '\n';
}

template <typename T>
typename Family<T>::Series* Family<T>::FindOrCreateLocked(const LabelValues& values,
                                                          bool allow_overflow) {
  if (auto it = series_.find(values); it != series_.end()) return &it->second;
  const LabelValues overflow(label_names_.size(), std::string(kOverflowLabel));
  const bool has_overflow = series_.count(overflow) > 0;
  const std::size_t regular = series_.size() - (has_overflow ? 1 : 0);
  if (regular >= max_series_) {
    if (!allow_overflow) return nullptr;
    auto& s = series_[overflow];
    if (!s.metric) s.metric = Make();
    return &s;
  }
  auto& s = series_[values];
  s.metric = Make();
  return &s;
}

template <typename T>
T& Family<T>::Labels(const LabelValues& values) {
  CheckArity(values);
  std::lock_guard lk(mu_);
  return *FindOrCreateLocked(values, true)->metric;
}

template <typename T>
void Family<T>::Remove(const LabelValues& values) {
  std::lock_guard lk(mu_);
  series_.erase(values);
}

template <typename T>
bool Family<T>::Has(const LabelValues& values) const {
  std::lock_guard lk(mu_);
  return series_.count(values) > 0;
}

template <typename T>
void Family<T>::RemoveIf(const std::function<bool(const LabelValues&)>& drop) {
  std::lock_guard lk(mu_);
  for (auto it = series_.begin(); it != series_.end();) {
    it = drop(it->first) ? series_.erase(it) : std::next(it);
  }
}

template <typename T>
std::size_t Family<T>::size() const {
  std::lock_guard lk(mu_);
  return series_.size();
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

CounterFamily::CounterFamily(std::string name, std::string help,
                             std::vector<std::string> label_names, std::size_t max_series)
    : Family(std::move(name), std::move(help), MetricType::kCounter, std::move(label_names),
             max_series) {}

void CounterFamily::Render(std::string& out) const {
  RenderHeader(out);
  std::lock_guard lk(mu_);
  for (const auto& [labels, s] : series_) RenderSample(out, "", labels, s.metric->Value());
}

double CounterFamily::Total() const {
  std::lock_guard lk(mu_);
  double total = 0;
  for (const auto& [labels, s] : series_) total += s.metric->Value();
  return total;
}

GaugeFamily::GaugeFamily(std::string name, std::string help, std::vector<std::string> label_names,
                         std::size_t max_series)
    : Family(std::move(name), std::move(help), MetricType::kGauge, std::move(label_names),
             max_series) {}

bool GaugeFamily::SetCallback(const LabelValues& values, std::function<double()> fn) {
  CheckArity(values);
  std::lock_guard lk(mu_);
  Series* s = FindOrCreateLocked(values, false);
  if (s == nullptr) return false;
  s->callback = std::move(fn);
  return true;
}

void GaugeFamily::Render(std::string& out) const {
  RenderHeader(out);
  // Copy out under the lock, run callbacks without it (they may take their own locks).
  std::vector<std::pair<LabelValues, std::function<double()>>> callbacks;
  std::vector<std::pair<LabelValues, double>> values;
  {
    std::lock_guard lk(mu_);
    for (const auto& [labels, s] : series_) {
      if (s.callback) {
        callbacks.emplace_back(labels, s.callback);
      } else {
        values.emplace_back(labels, s.metric->Value());
      }
    }
  }
  for (auto& [labels, fn] : callbacks) {
    try {
      values.emplace_back(labels, fn());
    } catch (...) {
      // Left out of this scrape; the next one calls it again.
    }
  }
  std::sort(values.begin(), values.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [labels, v] : values) RenderSample(out, "", labels, v);
}

HistogramFamily::HistogramFamily(std::string name, std::string help,
                                 std::vector<std::string> label_names, std::vector<double> bounds,
                                 std::size_t max_series)
    : Family(std::move(name), std::move(help), MetricType::kHistogram, std::move(label_names),
             max_series),
      bounds_(std::move(bounds)) {
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]))
      throw std::invalid_argument("histogram " + name_ + ": bounds must be finite");
    if (i > 0 && !(bounds_[i] > bounds_[i - 1])) {
      throw std::invalid_argument("histogram " + name_ + ": bounds must be strictly increasing");
    }
  }
}

void HistogramFamily::Render(std::string& out) const {
  RenderHeader(out);
  std::lock_guard lk(mu_);
  for (const auto& [labels, s] : series_) {
    const auto snap = s.metric->Collect();
    for (std::size_t i = 0; i < bounds_.size(); ++i) {
      RenderSample(out, "_bucket", labels, static_cast<double>(snap.cumulative[i]), "le",
                   FormatValue(bounds_[i]));
    }
    RenderSample(out, "_bucket", labels, static_cast<double>(snap.count), "le", "+Inf");
    RenderSample(out, "_sum", labels, snap.sum);
    RenderSample(out, "_count", labels, static_cast<double>(snap.count));
  }
}

// ---- registry --------------------------------------------------------------------------

void Registry::Register(std::unique_ptr<FamilyBase> family) {
  std::lock_guard lk(mu_);
  for (const auto& f : families_) {
    if (f->name() == family->name())
      throw std::invalid_argument("metric \"" + family->name() + "\" registered twice");
  }
  families_.push_back(std::move(family));
}

CounterFamily& Registry::AddCounter(std::string name, std::string help,
                                    std::vector<std::string> label_names, std::size_t max_series) {
  auto f = std::make_unique<CounterFamily>(std::move(name), std::move(help), std::move(label_names),
                                           max_series);
  auto& ref = *f;
  Register(std::move(f));
  return ref;
}

GaugeFamily& Registry::AddGauge(std::string name, std::string help,
                                std::vector<std::string> label_names, std::size_t max_series) {
  auto f = std::make_unique<GaugeFamily>(std::move(name), std::move(help), std::move(label_names),
                                         max_series);
  auto& ref = *f;
  Register(std::move(f));
  return ref;
}

HistogramFamily& Registry::AddHistogram(std::string name, std::string help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds, std::size_t max_series) {
  auto f = std::make_unique<HistogramFamily>(std::move(name), std::move(help),
                                             std::move(label_names), std::move(bounds), max_series);
  auto& ref = *f;
  Register(std::move(f));
  return ref;
}

std::string Registry::Render() const {
  // Families are never removed, so the pointers stay valid; render without the registry
  // lock so a gauge callback may itself touch the registry.
  std::vector<const FamilyBase*> families;
  {
    std::lock_guard lk(mu_);
    for (const auto& f : families_) families.push_back(f.get());
  }
  std::string out;
  for (const auto* f : families) f->Render(out);
  return out;
}

}  // namespace outbox::relay::metrics
