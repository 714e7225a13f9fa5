#include <stdexcept>

#include "outbox_relay/kafka_sink.h"
#include "outbox_relay/sink_registry.h"
#include "outbox_relay/webhook_sink.h"

namespace outbox::relay {

const std::vector<const SinkFactory*>& SinkFactories() {
  // One line per kind of sink.
  static const std::vector<const SinkFactory*> all = {
      &KafkaSinkFactory(),    // relay/sinks/kafka
      &WebhookSinkFactory(),  // relay/sinks/webhook
  };
  return all;
}

const TargetKinds& SinkTargetKinds() {
  static const TargetKinds kinds = [] {
    TargetKinds out;
    for (const auto* f : SinkFactories()) out.push_back(&f->target_kind());
    return out;
  }();
  return kinds;
}

RelayConfig ParseConfig(const std::string& yaml_text, const std::string& source,
                        const EnvLookup& env) {
  return ParseConfig(yaml_text, source, env, SinkTargetKinds());
}

RelayConfig LoadConfigFile(const std::string& path, const EnvLookup& env) {
  return LoadConfigFile(path, env, SinkTargetKinds());
}

const SinkFactory& SinkFactoryFor(const Destination& destination) {
  for (const auto* f : SinkFactories()) {
    if (f->kind == destination.target.kind()) return *f;
  }
  throw std::invalid_argument("destination " + destination.name +
                              ": no sink of this build serves its target");
}

void ValidateSink(const Destination& destination) {
  SinkFactoryFor(destination).validate(destination);
}

SinkPtr MakeSink(const Destination& destination) {
  return SinkFactoryFor(destination).make(destination);
}

}  // namespace outbox::relay
