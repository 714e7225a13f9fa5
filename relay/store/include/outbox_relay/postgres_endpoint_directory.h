// The store's implementation of the webhook service's EndpointDirectory (libpqxx inside).
// Register it before making sinks: SetEndpointDirectoryFactory(MakePostgresEndpointDirectory).
#pragma once

#include <memory>
#include <string>

#include "outbox_relay/endpoint_directory.h"

namespace outbox::relay {

std::unique_ptr<EndpointDirectory> MakePostgresEndpointDirectory(const std::string& database_url,
                                                                 const std::string& destination);

}  // namespace outbox::relay
