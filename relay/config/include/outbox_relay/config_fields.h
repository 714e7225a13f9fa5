// Typed, path-aware access to a parsed YAML document, for the config loader and for the
// section each kind of target reads (relay/sinks/<kind>). Every error names the dotted key
// path, where it is written (file:line:column) and how to fix it.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace outbox::relay::cfg {

/// The longest duration a key accepts (24 h): longer is a mistake, and keeps time math far
/// from overflow.
inline constexpr std::int64_t kMaxDurationMs = 86'400'000;
/// The unit hint of a millisecond key.
inline constexpr std::string_view kMsHint = " of milliseconds, e.g. 30000 for 30 s";

/// `text` in backquotes, cut at 80 characters. Only for values that are never secret (levels,
/// addresses, numbers, names).
std::string Quote(std::string_view text);

/// ASCII lowercase.
std::string Lowercase(std::string_view text);

/// True when `text` has a space, a tab or another control character.
bool HasSpaceOrControl(std::string_view text);

/// One value of the document and how it was reached.
struct Field {
  std::string path;    ///< Dotted key path, "destinations.orders.kafka.topic"; "" for the root.
  std::string source;  ///< File path or "<string>".
  YAML::Mark mark =
      YAML::Mark::null_mark();  ///< Of the key (or list element) that holds the value.
  YAML::Node node;

  /// "relay.yaml:12:7", or just the source when the position is unknown.
  std::string Origin() const;
};

/// "relay.yaml:12:7" (1-based line and column), or `source` for a null mark.
std::string FormatOrigin(const std::string& source, const YAML::Mark& mark);

/// "a.b" + "c" -> "a.b.c"; "" + "c" -> "c".
std::string ChildPath(const std::string& path, std::string_view key);

/// Throws ConfigError("<origin>: <path>: <message>"). `message` says what is wrong and how to fix
/// it.
[[noreturn]] void Fail(const std::string& origin, const std::string& path,
                       const std::string& message);
[[noreturn]] void Fail(const Field& field, const std::string& message);

/// "a mapping", "a list", "an empty value", ... for type errors (never the value itself).
std::string DescribeKind(const YAML::Node& node);

/// Edit distance (optimal string alignment, case-insensitive).
std::size_t EditDistance(std::string_view a, std::string_view b);

/// The candidate closest to `word`, when it is close enough to be a plausible typo.
std::optional<std::string> ClosestMatch(std::string_view word,
                                        const std::vector<std::string>& candidates);

/// The entries of a mapping in document order, each as a Field whose path is the parent's
/// plus the key. An empty (null) value counts as an empty mapping. YAML merge keys (`<<: *anchor`)
/// are resolved; duplicate keys and non-scalar keys are refused.
std::vector<std::pair<std::string, Field>> Entries(const Field& map);

/// A mapping whose keys are checked against the schema.
class Mapping {
 public:
  /// Returns an extra sentence for an unknown key (or ""), e.g. "`topic` belongs under `kafka:`".
  using Hint = std::function<std::string(const std::string& key, const Field& value)>;

  /// Throws for a value that is not a mapping and for any key not in `known`, suggesting the
  /// closest known one.
  Mapping(const Field& field, std::initializer_list<std::string_view> known, const Hint& hint = {});
  Mapping(const Field& field, const std::vector<std::string_view>& known, const Hint& hint = {});

  const Field& self() const { return self_; }
  std::optional<Field> Get(std::string_view key) const;
  bool Has(std::string_view key) const { return Get(key).has_value(); }

 private:
  Field self_;
  std::vector<std::pair<std::string, Field>> entries_;
};

/// A decimal integer, optionally signed, nothing else ("500", "-1"); nullopt otherwise.
std::optional<std::int64_t> ParseInteger(std::string_view text);

/// An integer scalar. `unit_hint` completes "set it to a whole number<unit_hint>", e.g.
/// " of milliseconds, e.g. 30000".
std::int64_t ReadInteger(const Field& field, std::string_view unit_hint);

/// An integer within [min, max]; `meaning` explains the key in the range error.
std::int64_t ReadIntegerIn(const Field& field, std::int64_t min, std::int64_t max,
                           std::string_view unit_hint, std::string_view meaning);

/// true/false (also True/TRUE/yes/no/on/off as YAML 1.1 writes them).
bool ReadBool(const Field& field);

/// Any scalar as its text. Errors for lists, mappings and empty values never echo the value.
std::string ReadString(const Field& field);

/// A non-empty string scalar.
std::string ReadNonEmptyString(const Field& field);

/// One of `choices`; otherwise fails naming them (and the closest, for a typo). `meaning`
/// ends the error: "... (how each message is sent)".
std::string ReadChoice(const Field& field, const std::vector<std::string>& choices,
                       std::string_view meaning);

/// The elements of a list (an empty value counts as an empty list).
std::vector<Field> ReadList(const Field& field);

}  // namespace outbox::relay::cfg
