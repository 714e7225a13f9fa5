#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "outbox_relay/config_sources.h"

namespace outbox::relay {

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

}  // namespace outbox::relay

namespace outbox::relay::cfg {

std::optional<std::string> ReadWholeFile(const std::string& path, std::string* error) {
  errno = 0;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                       &std::fclose);
  if (!file) {
    *error = std::strerror(errno != 0 ? errno : ENOENT);
    return std::nullopt;
  }
  std::string content;
  char buffer[8192];
  while (true) {
    const std::size_t n = std::fread(buffer, 1, sizeof buffer, file.get());
    content.append(buffer, n);
    if (n < sizeof buffer) {
      if (std::ferror(file.get())) {
        *error = std::strerror(errno != 0 ? errno : EIO);  // e.g. EISDIR for a directory
        return std::nullopt;
      }
      break;
    }
  }
  return content;
}

std::string TrimTrailingNewlines(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

std::optional<std::string> Lookup(const EnvLookup& env, const std::string& name) {
  if (!env) return std::nullopt;
  return env(name);
}

bool IsEnvVarName(std::string_view name) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
    const bool digit = c >= '0' && c <= '9';
    if (!letter && !(digit && i > 0)) return false;
  }
  return true;
}

std::string ReadEnvReference(const Field& field, const EnvLookup& env) {
  const std::string name = ReadNonEmptyString(field);
  // The value is echoed in the errors below, so make sure it is a variable name and not a
  // secret pasted into the wrong key.
  if (!IsEnvVarName(name) || name.starts_with("whsec_")) {
    Fail(field,
         "must name an environment variable (letters, digits and _, e.g. KAFKA_PASSWORD), and the "
         "value given is not one; put the variable's name here, or the value itself under the key "
         "without the `_env` suffix");
  }
  // Still, a secret made of letters, digits and _ passes that check (a hex token, say): the
  // name is repeated only when it is written as variable names are, in capitals.
  const bool conventional = std::none_of(name.begin(), name.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) != 0;
  });
  const std::string named = conventional ? name : "the variable named here";
  auto value = Lookup(env, name);
  if (value) value = TrimTrailingNewlines(std::move(*value));  // as a file's value
  if (!value) {
    Fail(field, "environment variable " + (conventional ? name : "named here") +
                    " is not set; export " + named +
                    " in the relay's environment, or change the key to name a variable that is "
                    "set" +
                    (conventional ? std::string()
                                  : " (the name has lowercase letters, so it is not repeated: "
                                    "it may be a secret put in the `_env` key by mistake)"));
  }
  if (value->empty()) {
    Fail(field, "environment variable " + (conventional ? name : "named here") +
                    " is set but empty; give " + named + " a value");
  }
  return *value;
}

std::string ReadFileReference(const Field& field) {
  const std::string path = ReadNonEmptyString(field);
  std::string error;
  auto content = ReadWholeFile(path, &error);
  if (!content) {
    Fail(field, "cannot read file " + path + ": " + error +
                    "; check that the file exists and the relay may read it");
  }
  std::string value = TrimTrailingNewlines(std::move(*content));
  if (value.empty()) Fail(field, "file " + path + " is empty; write the value into it");
  return value;
}

}  // namespace outbox::relay::cfg
