// Internal: the SSRF guard of the webhook sink. The relay must not become a way into the
// network it runs in, so by default it refuses to connect to loopback, private (RFC 1918),
// link-local (cloud metadata included), CGNAT, unique-local, unspecified, multicast and
// reserved addresses. It resolves the endpoint's host itself, checks every address, and
// connects to the one it checked (no second lookup between the check and the connect: DNS
// rebinding), keeping the host name for the Host header and TLS SNI.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace outbox::relay::webhook_detail {

struct IpAddress {
  bool v4 = true;
  std::array<std::uint8_t, 16> bytes{};  ///< v4: the first 4 bytes.

  std::string ToString() const;
  bool operator==(const IpAddress&) const = default;
};

/// A host written as an IP address: a dotted quad, every form inet_aton reads (decimal
/// "2130706433", octal "0177.0.0.1", hex "0x7f.0.0.1", short "127.1"), or IPv6 (with or
/// without brackets). nullopt for a name.
std::optional<IpAddress> ParseIpLiteral(std::string_view host);

/// ParseIpLiteral of a host that may end in one dot ("127.0.0.1." is 127.0.0.1, as a resolver
/// reads it): the address to connect to without a lookup.
std::optional<IpAddress> LiteralAddressOf(std::string_view host);

/// Whether `address` is where cloud metadata endpoints answer (the link-local ranges, AWS's
/// fd00:ec2::254, Google Cloud's fd20:ce::254, Alibaba Cloud's 100.100.100.200, the local-use
/// NAT64 range): only an allow-list entry inside its range opens it.
bool IsMetadataAddress(const IpAddress& address);

/// The address a host is known to have without asking DNS, for check-config: an IP literal
/// (also with one trailing dot, or an IPv6 zone id), and 127.0.0.1 for `localhost` and names
/// under it (RFC 6761). nullopt when only a lookup can tell.
std::optional<IpAddress> KnownAddressOf(std::string_view host);

struct Cidr {
  IpAddress network;
  int prefix = 0;
  bool Contains(const IpAddress& address) const;
};

/// "10.0.0.0/8", "fd00::/8", or one address ("10.1.2.3" is /32, "::1" /128). Throws
/// std::invalid_argument saying what is wrong: also for bits set past the prefix length
/// ("10.1.2.3/8") and for a network of IPv6 forms of IPv4 addresses (judged as IPv4).
Cidr ParseCidr(std::string_view text);

/// Why `address` is refused by default ("loopback", "private (RFC 1918)", ...), or nullopt for
/// a public address. IPv4-mapped and NAT64 IPv6 addresses are judged by their IPv4 address.
std::optional<std::string> BlockedRange(const IpAddress& address);

class AddressPolicy {
 public:
  AddressPolicy(bool allow_private_networks, std::vector<Cidr> allowed);

  /// Why `address` may not be connected to, or nullopt when it may: public, or in an allowed
  /// network, or private networks are allowed for this destination; a metadata address
  /// (IsMetadataAddress) only through an allowed network inside its range.
  std::optional<std::string> Refuses(const IpAddress& address) const;

 private:
  bool allow_private_;
  std::vector<Cidr> allowed_;
};

/// The address to connect to for `host`: the first address it resolves to that the policy
/// allows. `error` says why there is none (resolution failed, or every address is refused).
struct Resolution {
  std::optional<IpAddress> address;
  /// Every address the policy allows, in the resolver's order (`address` first): where to
  /// connect next when one takes no connections.
  std::vector<IpAddress> allowed;
  std::string error;
  bool refused = false;  ///< The host resolved, but only to addresses the policy refuses.
  bool metadata = false;  ///< Refused, the first refused address a metadata one.
};
Resolution ResolveChecked(const std::string& host, const AddressPolicy& policy);

/// What a name resolves to; empty with `error` set when it does not. The system's
/// (getaddrinfo) unless a test replaced it: a name the system cannot resolve then proves the
/// client connects to the checked address and asks no DNS of its own.
using Resolver = std::function<std::vector<IpAddress>(const std::string& host, std::string* error)>;
/// Replaces the resolver of every ResolveChecked until called with an empty one. A webhook
/// sink calls it on a thread of its own that Shutdown may leave behind: a test's resolver must
/// own what it captures (a shared_ptr), not refer to the test's locals.
void SetResolverForTesting(Resolver resolver);
/// The resolver ResolveChecked uses now (a test's, or getaddrinfo), to call on another thread:
/// it touches no state of this file.
Resolver CurrentResolver();
/// What ResolveChecked makes of the addresses a name (not an IP literal) resolved to: `found`,
/// or `error` when it is empty.
Resolution CheckResolved(const std::string& host, const std::vector<IpAddress>& found,
                         const std::string& error, const AddressPolicy& policy);

/// How long the addresses a name resolved to are used before it is resolved again: 30 s
/// (DNS answers change), unless a test set another (0: back to 30 s).
std::chrono::milliseconds ResolveEvery();
void SetResolveEveryForTesting(std::chrono::milliseconds every);

}  // namespace outbox::relay::webhook_detail
