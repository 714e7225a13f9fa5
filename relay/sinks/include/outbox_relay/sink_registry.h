// The kinds of sink this relay is built with. The app, the dispatcher and the benchmark go
// through here and through Sink; none of them names a kind of sink. The config is read
// through here too, so that each kind reads its own section.
#pragma once

#include <string>
#include <vector>

#include "outbox_relay/config.h"
#include "outbox_relay/sink.h"

namespace outbox::relay {

/// Every registered kind, in registration order (relay/sinks/src/registry.cc).
const std::vector<const SinkFactory*>& SinkFactories();

/// How each registered kind reads its section of a destination, in registration order.
const TargetKinds& SinkTargetKinds();

/// ParseConfig and LoadConfigFile (config.h) with every registered kind of target.
RelayConfig ParseConfig(const std::string& yaml_text, const std::string& source,
                        const EnvLookup& env);
RelayConfig LoadConfigFile(const std::string& path, const EnvLookup& env);

/// The factory that serves `destination`; throws std::invalid_argument when none does.
const SinkFactory& SinkFactoryFor(const Destination& destination);

/// What the destination's sink would refuse, checked without connecting; throws
/// std::invalid_argument.
void ValidateSink(const Destination& destination);

/// Creates the destination's sink; throws std::invalid_argument like ValidateSink.
SinkPtr MakeSink(const Destination& destination);

}  // namespace outbox::relay
