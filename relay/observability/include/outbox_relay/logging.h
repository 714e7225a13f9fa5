// Log set-up for the relay: spdlog, text for people or JSON lines for collectors.
#pragma once

#include <spdlog/logger.h>

#include <memory>
#include <string>

namespace outbox::relay {

/// A formatter whose output is one valid JSON object per line:
/// {"ts":"2026-01-01T00:00:00.000Z","level":"info","thread":123,"msg":"..."}; the message is
/// escaped as a JSON string whatever it contains (quotes, newlines, control bytes).
std::unique_ptr<spdlog::formatter> MakeJsonLogFormatter();

/// Makes "outbox-relay" (stderr) the default logger, at `level` (trace..error), as text or
/// JSON lines. Idempotent. Logs never contain payloads or secrets: the relay only logs ids,
/// destinations, counts and error texts.
void ConfigureLogging(const std::string& level, bool json);

}  // namespace outbox::relay
