#include <algorithm>
#include <cctype>
#include <limits>

#include "outbox_relay/config.h"
#include "outbox_relay/config_fields.h"

namespace outbox::relay::cfg {

std::string Quote(std::string_view text) {
  constexpr std::size_t kMax = 80;
  std::string shown(text.substr(0, kMax));
  if (text.size() > kMax) shown += "...";
  return "`" + shown + "`";
}

std::string Lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool HasSpaceOrControl(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u <= 0x20 || u == 0x7F;
  });
}

std::string FormatOrigin(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0) return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

std::string Field::Origin() const { return FormatOrigin(source, mark); }

std::string ChildPath(const std::string& path, std::string_view key) {
  if (path.empty()) return std::string(key);
  std::string out = path;
  out += '.';
  out += key;
  return out;
}

void Fail(const std::string& origin, const std::string& path, const std::string& message) {
  std::string text = origin;
  if (!path.empty()) {
    text += text.empty() ? "" : ": ";
    text += path;
  }
  text += text.empty() ? "" : ": ";
  text += message;
  throw ConfigError(text);
}

void Fail(const Field& field, const std::string& message) {
  Fail(field.Origin(), field.path, message);
}

std::string DescribeKind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return "an empty value";
    case YAML::NodeType::Scalar:
      return "a single value";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
  }
  return "an unsupported value";
}

namespace {

char Lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

std::string JoinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

}  // namespace

std::size_t EditDistance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size();
  const std::size_t m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1, 0));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = Lower(a[i - 1]) == Lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && Lower(a[i - 1]) == Lower(b[j - 2]) &&
          Lower(a[i - 2]) == Lower(b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::optional<std::string> ClosestMatch(std::string_view word,
                                        const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  std::string lower_word;
  for (char c : word) lower_word += Lower(c);
  for (const auto& candidate : candidates) {
    const std::size_t distance = EditDistance(word, candidate);
    const std::size_t longest = std::max(word.size(), candidate.size());
    bool plausible = distance <= std::max<std::size_t>(2, longest / 3);
    // "lease" for "lease_ms", "poll_interval" for "poll_interval_ms": a prefix is a plausible slip.
    std::string lower_candidate;
    for (char c : candidate) lower_candidate += Lower(c);
    if (lower_word.size() >= 3 &&
        (lower_candidate.starts_with(lower_word) || lower_word.starts_with(lower_candidate))) {
      plausible = true;
    }
    if (plausible && distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

namespace {

void AppendEntries(const Field& map, std::vector<std::pair<std::string, Field>>& out, int depth) {
  if (depth > 32) Fail(map, "YAML merge keys (`<<`) nest too deeply; simplify the anchors");
  if (map.node.IsNull() || !map.node.IsDefined()) return;
  if (!map.node.IsMap()) {
    Fail(map, "expected a mapping of `key: value` lines, got " + DescribeKind(map.node) +
                  "; indent the keys that belong under it");
  }
  std::vector<std::pair<std::string, Field>> explicit_entries;
  std::vector<Field> merges;
  for (const auto& entry : map.node) {
    const YAML::Node key = entry.first;
    if (!key.IsScalar()) {
      Fail(FormatOrigin(map.source, key.Mark()), map.path,
           "found a key that is " + DescribeKind(key) + "; keys must be plain names");
    }
    const std::string name = key.Scalar();
    Field child{ChildPath(map.path, name), map.source, key.Mark(), entry.second};
    if (name == "<<" && key.Tag() == "?") {
      merges.push_back(std::move(child));
      continue;
    }
    for (const auto& [seen, seen_field] : explicit_entries) {
      if (seen == name) {
        Fail(child,
             "duplicate key (first set at " + seen_field.Origin() + "); keep only one of them");
      }
    }
    explicit_entries.emplace_back(name, std::move(child));
  }
  // Merge keys: explicit keys win, then earlier merged mappings win over later ones.
  std::vector<std::pair<std::string, Field>> merged;
  for (const auto& merge : merges) {
    std::vector<Field> sources;
    if (merge.node.IsSequence()) {
      for (const auto& element : merge.node)
        sources.push_back(Field{map.path, map.source, element.Mark(), element});
    } else if (merge.node.IsMap()) {
      sources.push_back(Field{map.path, map.source, merge.mark, merge.node});
    } else {
      Fail(merge, "a merge key (`<<`) takes a mapping or a list of mappings, e.g. `<<: *defaults`");
    }
    for (const auto& source : sources) {
      std::vector<std::pair<std::string, Field>> inner;
      AppendEntries(source, inner, depth + 1);
      for (auto& entry : inner) {
        auto same = [&](const auto& e) { return e.first == entry.first; };
        if (std::any_of(explicit_entries.begin(), explicit_entries.end(), same) ||
            std::any_of(merged.begin(), merged.end(), same)) {
          continue;
        }
        merged.push_back(std::move(entry));
      }
    }
  }
  for (auto& e : explicit_entries) out.push_back(std::move(e));
  for (auto& e : merged) out.push_back(std::move(e));
}

}  // namespace

std::vector<std::pair<std::string, Field>> Entries(const Field& map) {
  std::vector<std::pair<std::string, Field>> out;
  AppendEntries(map, out, 0);
  return out;
}

Mapping::Mapping(const Field& field, std::initializer_list<std::string_view> known,
                 const Hint& hint)
    : Mapping(field, std::vector<std::string_view>(known.begin(), known.end()), hint) {}

Mapping::Mapping(const Field& field, const std::vector<std::string_view>& known, const Hint& hint)
    : self_(field), entries_(Entries(field)) {
  std::vector<std::string> known_keys(known.begin(), known.end());
  for (const auto& [key, child] : entries_) {
    if (std::find(known_keys.begin(), known_keys.end(), key) != known_keys.end()) continue;
    std::string message = "unknown key `" + key + "`";
    if (auto suggestion = ClosestMatch(key, known_keys)) {
      message += "; did you mean `" + *suggestion + "`?";
    } else {
      message += ".";
    }
    if (hint) {
      std::string extra = hint(key, child);
      if (!extra.empty()) message += " " + extra;
    }
    message += " Keys allowed in " +
               (field.path.empty() ? std::string("the top level") : "`" + field.path + "`") + ": " +
               JoinKeys(known_keys) + ".";
    Fail(child, message);
  }
}

std::optional<Field> Mapping::Get(std::string_view key) const {
  for (const auto& [name, child] : entries_) {
    if (name == key) return child;
  }
  return std::nullopt;
}

std::optional<std::int64_t> ParseInteger(std::string_view text) {
  if (text.empty()) return std::nullopt;
  bool negative = false;
  std::size_t i = 0;
  if (text[0] == '-' || text[0] == '+') {
    negative = text[0] == '-';
    i = 1;
  }
  if (i == text.size()) return std::nullopt;
  std::int64_t value = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c < '0' || c > '9') return std::nullopt;
    const int digit = c - '0';
    if (negative) {
      if (value < (std::numeric_limits<std::int64_t>::min() + digit) / 10) return std::nullopt;
      value = value * 10 - digit;
    } else {
      if (value > (std::numeric_limits<std::int64_t>::max() - digit) / 10) return std::nullopt;
      value = value * 10 + digit;
    }
  }
  return value;
}

namespace {

// Integers and booleans are never secret, so their text may appear in errors; keep it short.
std::string QuoteShort(std::string_view text) {
  constexpr std::size_t kMax = 40;
  std::string shown(text.substr(0, kMax));
  if (text.size() > kMax) shown += "...";
  return "`" + shown + "`";
}

bool AllDigits(std::string_view text) {
  std::size_t i = (!text.empty() && (text[0] == '-' || text[0] == '+')) ? 1 : 0;
  if (i == text.size()) return false;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
  }
  return true;
}

}  // namespace

std::int64_t ReadInteger(const Field& field, std::string_view unit_hint) {
  const std::string fix = "; set it to a whole number" + std::string(unit_hint);
  if (!field.node.IsScalar())
    Fail(field, "expected an integer, got " + DescribeKind(field.node) + fix);
  const std::string& text = field.node.Scalar();
  auto value = ParseInteger(text);
  if (!value) {
    if (AllDigits(text)) Fail(field, "the integer " + QuoteShort(text) + " is too large" + fix);
    Fail(field, "expected an integer, got " + QuoteShort(text) + fix);
  }
  return *value;
}

std::int64_t ReadIntegerIn(const Field& field, std::int64_t min, std::int64_t max,
                           std::string_view unit_hint, std::string_view meaning) {
  const std::int64_t value = ReadInteger(field, unit_hint);
  if (value < min || value > max) {
    Fail(field, std::to_string(value) + " is out of range; set it between " + std::to_string(min) +
                    " and " + std::to_string(max) + " (" + std::string(meaning) + ")");
  }
  return value;
}

bool ReadBool(const Field& field) {
  const std::string fix = "; write `true` or `false`";
  if (!field.node.IsScalar())
    Fail(field, "expected true or false, got " + DescribeKind(field.node) + fix);
  const std::string& text = field.node.Scalar();
  static const char* const kTrue[] = {"true", "True", "TRUE", "yes", "Yes",
                                      "YES",  "on",   "On",   "ON"};
  static const char* const kFalse[] = {"false", "False", "FALSE", "no", "No",
                                       "NO",    "off",   "Off",   "OFF"};
  for (const char* t : kTrue) {
    if (text == t) return true;
  }
  for (const char* f : kFalse) {
    if (text == f) return false;
  }
  Fail(field, "expected true or false, got " + QuoteShort(text) + fix);
}

std::string ReadString(const Field& field) {
  if (!field.node.IsScalar()) {
    Fail(field, "expected a single text value, got " + DescribeKind(field.node) +
                    "; write it on the same line as the key, e.g. `key: value`");
  }
  return field.node.Scalar();
}

std::string ReadNonEmptyString(const Field& field) {
  std::string value = ReadString(field);
  if (value.empty()) Fail(field, "is empty; give it a value or remove the key");
  return value;
}

std::vector<Field> ReadList(const Field& field) {
  std::vector<Field> out;
  if (field.node.IsNull() || !field.node.IsDefined()) return out;
  if (!field.node.IsSequence()) {
    Fail(field, "expected a list, got " + DescribeKind(field.node) +
                    "; write one `- item` line per element, or `[a, b]`");
  }
  std::size_t index = 0;
  for (const auto& element : field.node) {
    YAML::Mark mark = element.Mark();
    if (mark.is_null() || element.IsNull()) mark = field.mark;
    out.push_back(
        Field{field.path + "[" + std::to_string(index) + "]", field.source, mark, element});
    ++index;
  }
  return out;
}

std::string ReadChoice(const Field& field, const std::vector<std::string>& choices,
                       std::string_view meaning) {
  const std::string value = ReadNonEmptyString(field);
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return value;
  std::string listed;
  for (const auto& c : choices) listed += (listed.empty() ? "`" : ", `") + c + "`";
  std::string message = Quote(value) + " is not allowed here";
  if (auto close = ClosestMatch(value, choices)) message += " (did you mean `" + *close + "`?)";
  Fail(field, message + "; use one of " + listed + " (" + std::string(meaning) + ")");
}

}  // namespace outbox::relay::cfg
