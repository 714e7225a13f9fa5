#include "outbox_relay/endpoint_directory.h"

#include <mutex>
#include <stdexcept>

namespace outbox::relay {
namespace {

std::mutex& FactoryMutex() {
  static std::mutex mu;
  return mu;
}
EndpointDirectoryFactory& Factory() {
  static EndpointDirectoryFactory factory;
  return factory;
}

}  // namespace

void SetEndpointDirectoryFactory(EndpointDirectoryFactory factory) {
  std::lock_guard lock(FactoryMutex());
  Factory() = std::move(factory);
}

std::unique_ptr<EndpointDirectory> MakeEndpointDirectory(const std::string& database_url,
                                                         const std::string& destination) {
  EndpointDirectoryFactory factory;
  {
    std::lock_guard lock(FactoryMutex());
    factory = Factory();
  }
  if (!factory) {
    throw std::logic_error(
        "no endpoint directory registered: call SetEndpointDirectoryFactory (with the store's "
        "PostgresEndpointDirectory) before making a webhook-service sink");
  }
  return factory(database_url, destination);
}

}  // namespace outbox::relay
