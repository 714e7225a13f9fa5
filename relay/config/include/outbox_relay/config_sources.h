// Values that the config reads from the environment or from files
// (database_url_env, secret_file, sasl.password_env, ...).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "outbox_relay/config.h"
#include "outbox_relay/config_fields.h"

namespace outbox::relay::cfg {

/// The whole content of a file, or nullopt with *error set to the errno text.
std::optional<std::string> ReadWholeFile(const std::string& path, std::string* error);

/// Removes every trailing '\n' and '\r' (files usually end with a newline).
std::string TrimTrailingNewlines(std::string text);

/// `env(name)`; a null EnvLookup is an empty environment.
std::optional<std::string> Lookup(const EnvLookup& env, const std::string& name);

/// True for a portable environment variable name: [A-Za-z_][A-Za-z0-9_]*.
bool IsEnvVarName(std::string_view name);

/// `field` is a `<key>_env` entry: reads the variable it names. Fails, naming the key and the
/// variable, when the variable is unset or empty. The value is returned as it is.
std::string ReadEnvReference(const Field& field, const EnvLookup& env);

/// `field` is a `<key>_file` entry: reads the file it names, without trailing newlines. Fails,
/// naming the key, the file and the errno text, when it cannot be read or is empty.
std::string ReadFileReference(const Field& field);

}  // namespace outbox::relay::cfg
