#include "cloudevents_config.h"

namespace outbox::relay {

void ReadCloudEventsFormat(const cfg::Mapping& m, std::string_view plain_headers,
                           std::string_view ce_headers, bool& cloudevents, std::string& source) {
  if (auto f = m.Get("format")) {
    cloudevents = cfg::ReadChoice(*f, {"plain", "cloudevents"},
                                  "`plain`: " + std::string(plain_headers) +
                                      "; `cloudevents`: also the CloudEvents binary-mode " +
                                      std::string(ce_headers) + " headers") == "cloudevents";
  }
  if (auto f = m.Get("cloudevents_source")) {
    if (!cloudevents) cfg::Fail(*f, "needs `format: cloudevents`; add it or remove the key");
    source = cfg::ReadNonEmptyString(*f);
    if (cfg::HasSpaceOrControl(source)) {
      cfg::Fail(*f, "must be a URI reference without spaces, e.g. `//billing.example.com/outbox`");
    }
  }
}

}  // namespace outbox::relay
