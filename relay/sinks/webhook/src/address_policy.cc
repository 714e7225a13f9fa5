#include "address_policy.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <atomic>
#include <cctype>
#include <cstring>
#include <mutex>
#include <stdexcept>

namespace outbox::relay::webhook_detail {
namespace {

IpAddress V4(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
  IpAddress ip;
  ip.v4 = true;
  ip.bytes[0] = a;
  ip.bytes[1] = b;
  ip.bytes[2] = c;
  ip.bytes[3] = d;
  return ip;
}

IpAddress V6(const unsigned char (&b)[16]) {
  IpAddress ip;
  ip.v4 = false;
  std::memcpy(ip.bytes.data(), b, 16);
  return ip;
}

bool PrefixMatches(const IpAddress& a, const IpAddress& network, int prefix) {
  if (a.v4 != network.v4) return false;
  int bits = prefix;
  for (std::size_t i = 0; bits > 0; ++i, bits -= 8) {
    const int n = bits >= 8 ? 8 : bits;
    const auto mask = static_cast<std::uint8_t>(0xFF << (8 - n));
    if ((a.bytes[i] & mask) != (network.bytes[i] & mask)) return false;
  }
  return true;
}

// "10.0.0.0/8", "fd00::/8", or one address, read as written (ParseCidr checks more).
Cidr ParseNetwork(std::string_view text) {
  const auto slash = text.find('/');
  const std::string addr(text.substr(0, slash));
  IpAddress ip;
  unsigned char b[16];
  if (addr.find(':') != std::string::npos) {
    if (inet_pton(AF_INET6, addr.c_str(), b) != 1) {
      throw std::invalid_argument("'" + std::string(text) + "' is not an IPv6 network");
    }
    ip = V6(b);
  } else {
    if (inet_pton(AF_INET, addr.c_str(), b) != 1) {  // strict dotted quad here
      throw std::invalid_argument("'" + std::string(text) +
                                  "' is not a network: write an address and a prefix length, "
                                  "e.g. 10.20.0.0/16 or fd00::/8");
    }
    ip = V4(b[0], b[1], b[2], b[3]);
  }
  const int max = ip.v4 ? 32 : 128;
  int prefix = max;
  if (slash != std::string_view::npos) {
    const std::string p(text.substr(slash + 1));
    // Digits only: strtol alone also read "-0", " 8" and "+8".
    const bool digits =
        !p.empty() && p.size() <= 3 && p.find_first_not_of("0123456789") == std::string::npos;
    const long n = digits ? std::strtol(p.c_str(), nullptr, 10) : -1;
    if (n < 0 || n > max) {
      throw std::invalid_argument("'" + std::string(text) + "': the prefix length must be 0.." +
                                  std::to_string(max));
    }
    prefix = static_cast<int>(n);
  }
  return Cidr{ip, prefix};
}

// Whether every address of `inner` is in `outer`.
bool Within(const Cidr& inner, const Cidr& outer) {
  return inner.network.v4 == outer.network.v4 && inner.prefix >= outer.prefix &&
         outer.Contains(inner.network);
}

std::string CidrText(const Cidr& cidr) {
  return cidr.network.ToString() + "/" + std::to_string(cidr.prefix);
}

struct Range {
  const char* cidr;
  const char* why;
};

// Refused unless allowed: what a relay on a private network could reach but the Internet
// could not.
constexpr Range kBlockedV4[] = {
    {"0.0.0.0/8", "unspecified (\"this network\")"},
    {"10.0.0.0/8", "private (RFC 1918)"},
    {"100.64.0.0/10", "shared (carrier-grade NAT, RFC 6598)"},
    {"127.0.0.0/8", "loopback"},
    {"169.254.0.0/16", "link-local (cloud metadata endpoints live here)"},
    {"172.16.0.0/12", "private (RFC 1918)"},
    {"192.0.0.0/24", "IETF protocol assignments"},
    {"192.168.0.0/16", "private (RFC 1918)"},
    {"198.18.0.0/15", "benchmarking (RFC 2544)"},
    {"224.0.0.0/4", "multicast"},
    {"240.0.0.0/4", "reserved (and broadcast)"},
};
constexpr Range kBlockedV6[] = {
    {"::/128", "unspecified"},
    {"::1/128", "loopback"},
    {"100::/64", "discard-only (RFC 6666)"},
    {"2001::/32", "Teredo (RFC 4380)"},
    {"2001:db8::/32", "documentation (RFC 3849)"},
    {"fe80::/10", "link-local"},
    {"fec0::/10", "site-local (deprecated, still routed)"},
    {"fc00::/7", "unique-local (private)"},
    {"ff00::/8", "multicast"},
    // Where its IPv4 address sits depends on the translator's prefix length (RFC 6052: /48,
    // /56, /64 or /96), which the relay cannot know: read as a /96 (the last four bytes),
    // 64:ff9b:1:a00:0:100:808:808 passed as 8.8.8.8 while a /48 translator sends it to
    // 10.0.0.1 (review). Refused as a whole; allowed_networks can name it.
    {"64:ff9b:1::/48",
     "local-use NAT64 (RFC 8215, the IPv4 address it carries depends on the translator)"},
};

// Not covered by allow_private_networks, only by an allow-list entry: the link-local ranges,
// where the cloud metadata endpoints answer (169.254.169.254), and the metadata addresses that
// sit in ranges the flag opens: AWS's IPv6 one fd00:ec2::254 and Google Cloud's fd20:ce::254
// (unique-local), Alibaba Cloud's 100.100.100.200 (CGNAT). With endpoints in Postgres, the
// flag covers every endpoint the management API adds.
// And the local-use NAT64 range, which can carry 169.254.169.254 wherever its translator
// puts it (kBlockedV6).
constexpr const char* kMetadataRanges[] = {"169.254.0.0/16",     "fe80::/10",
                                           "fd00:ec2::254/128",  "fd20:ce::254/128",
                                           "100.100.100.200/32", "64:ff9b:1::/48"};

const std::vector<Cidr>& MetadataRanges() {
  static const auto ranges = [] {
    std::vector<Cidr> out;
    for (const char* r : kMetadataRanges) out.push_back(ParseNetwork(r));
    return out;
  }();
  return ranges;
}

const std::vector<std::pair<Cidr, const char*>>& Blocked() {
  static const auto blocked = [] {
    std::vector<std::pair<Cidr, const char*>> out;
    for (const auto& r : kBlockedV4) out.emplace_back(ParseNetwork(r.cidr), r.why);
    for (const auto& r : kBlockedV6) out.emplace_back(ParseNetwork(r.cidr), r.why);
    return out;
  }();
  return blocked;
}

// The IPv4 address inside an IPv6 one that carries it: IPv4-mapped (::ffff:a.b.c.d),
// IPv4-translated (::ffff:0:a.b.c.d, SIIT), IPv4-compatible (::a.b.c.d, deprecated: all of
// ::/96 but :: and ::1), NAT64 (64:ff9b::a.b.c.d; not the local-use 64:ff9b:1::/48, refused
// as a range) and 6to4 (2002:AABB:CCDD::, the IPv4 address in bytes 2-5).
std::optional<IpAddress> EmbeddedV4(const IpAddress& a) {
  if (a.v4) return std::nullopt;
  static const Cidr mapped = ParseNetwork("::ffff:0:0/96");
  static const Cidr translated = ParseNetwork("::ffff:0:0:0/96");
  static const Cidr compatible = ParseNetwork("::/96");
  static const Cidr unspecified_or_loopback = ParseNetwork("::/127");
  static const Cidr nat64 = ParseNetwork("64:ff9b::/96");
  static const Cidr six_to_four = ParseNetwork("2002::/16");
  if (six_to_four.Contains(a)) return V4(a.bytes[2], a.bytes[3], a.bytes[4], a.bytes[5]);
  // :: and ::1 are judged by the IPv6 ranges themselves.
  const bool compat = compatible.Contains(a) && !unspecified_or_loopback.Contains(a);
  if (!mapped.Contains(a) && !translated.Contains(a) && !compat && !nat64.Contains(a)) {
    return std::nullopt;
  }
  return V4(a.bytes[12], a.bytes[13], a.bytes[14], a.bytes[15]);
}

std::mutex& ResolverMu() {
  static std::mutex mu;
  return mu;
}

Resolver& TestResolver() {
  static Resolver resolver;
  return resolver;
}

std::vector<IpAddress> SystemResolve(const std::string& host, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    *error = gai_strerror(rc);
    return {};
  }
  std::vector<IpAddress> out;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      const auto* p = reinterpret_cast<const std::uint8_t*>(
          &reinterpret_cast<const sockaddr_in*>(ai->ai_addr)->sin_addr);
      out.push_back(V4(p[0], p[1], p[2], p[3]));
    } else if (ai->ai_family == AF_INET6) {
      unsigned char b[16];
      std::memcpy(b, &reinterpret_cast<const sockaddr_in6*>(ai->ai_addr)->sin6_addr, 16);
      out.push_back(V6(b));
    }
  }
  freeaddrinfo(found);
  return out;
}

}  // namespace

void SetResolverForTesting(Resolver resolver) {
  std::lock_guard lock(ResolverMu());
  TestResolver() = std::move(resolver);
}

namespace {
std::atomic<std::int64_t> resolve_every_ms{0};  // 0: the default
}  // namespace

std::chrono::milliseconds ResolveEvery() {
  const auto ms = resolve_every_ms.load();
  return ms > 0 ? std::chrono::milliseconds(ms) : std::chrono::seconds(30);
}

void SetResolveEveryForTesting(std::chrono::milliseconds every) {
  resolve_every_ms.store(every.count());
}

std::string IpAddress::ToString() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (v4) {
    inet_ntop(AF_INET, bytes.data(), buf, sizeof buf);
  } else {
    inet_ntop(AF_INET6, bytes.data(), buf, sizeof buf);
  }
  return buf;
}

std::optional<IpAddress> ParseIpLiteral(std::string_view host) {
  std::string text(host);
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  if (text.find(':') != std::string::npos) {
    unsigned char b[16];
    if (inet_pton(AF_INET6, text.c_str(), b) == 1) return V6(b);
    return std::nullopt;
  }
  // inet_aton takes every historical form: "2130706433", "0177.0.0.1", "0x7f.1", "127.1".
  // A name never parses (it has a letter that is not part of a hex number).
  in_addr a{};
  if (text.empty() || inet_aton(text.c_str(), &a) == 0) return std::nullopt;
  const auto* p = reinterpret_cast<const std::uint8_t*>(&a.s_addr);
  return V4(p[0], p[1], p[2], p[3]);
}

std::optional<IpAddress> KnownAddressOf(std::string_view host) {
  std::string text(host);
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  if (const auto zone = text.find('%');
      zone != std::string::npos && text.find(':') != std::string::npos) {
    text.resize(zone);
  }
  if (auto ip = LiteralAddressOf(text)) return ip;
  if (!text.empty() && text.back() == '.') text.pop_back();
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string_view suffix = ".localhost";
  if (lower == "localhost" ||
      (lower.size() > suffix.size() &&
       lower.compare(lower.size() - suffix.size(), suffix.size(), suffix) == 0)) {
    return V4(127, 0, 0, 1);
  }
  return std::nullopt;
}

bool Cidr::Contains(const IpAddress& address) const {
  return PrefixMatches(address, network, prefix);
}

Cidr ParseCidr(std::string_view text) {
  const Cidr cidr = ParseNetwork(text);
  const IpAddress& ip = cidr.network;
  const int prefix = cidr.prefix;
  const int max = ip.v4 ? 32 : 128;
  // "10.1.2.3/8", as `ip addr` shows an address, is not a network: it opened all of 10.0.0.0/8.
  IpAddress network = ip;
  for (int bit = prefix; bit < max; ++bit) {
    network.bytes[bit / 8] &= static_cast<std::uint8_t>(~(0x80u >> (bit % 8)));
  }
  if (network != ip) {
    throw std::invalid_argument(
        "'" + std::string(text) + "' has bits set past its prefix length: write the network, " +
        CidrText(Cidr{network, prefix}) + ", or the one address, " + ip.ToString());
  }
  // An entry inside a range of IPv6 addresses that carry IPv4 ones matches nothing: they are
  // judged by the IPv4 address (EmbeddedV4).
  if (!ip.v4) {
    static const Cidr forms[] = {ParseNetwork("::ffff:0:0/96"), ParseNetwork("::ffff:0:0:0/96"),
                                 ParseNetwork("64:ff9b::/96")};
    for (const auto& form : forms) {
      if (!Within(cidr, form)) continue;
      const auto v4 = V4(ip.bytes[12], ip.bytes[13], ip.bytes[14], ip.bytes[15]);
      const std::string why = "'" + std::string(text) +
                              "' is a network of IPv6 addresses that carry IPv4 ones, which are "
                              "judged by the IPv4 address, so it matches nothing: ";
      // The whole form is every IPv4 address: no entry to suggest in its place.
      if (prefix == 96) throw std::invalid_argument(why + "remove it");
      throw std::invalid_argument(why + "write " + CidrText(Cidr{v4, prefix - 96}));
    }
  }
  return cidr;
}

std::optional<std::string> BlockedRange(const IpAddress& address) {
  if (auto v4 = EmbeddedV4(address)) return BlockedRange(*v4);
  for (const auto& [cidr, why] : Blocked()) {
    if (cidr.Contains(address)) return std::string(why);
  }
  return std::nullopt;
}

// "an unspecified address", "a loopback address", "a unique-local address": by the sound of
// the range's first word (every one starts with a letter; "uni" is said "you").
static const char* Article(const std::string& why) {
  const bool vowel =
      !why.empty() && std::strchr("aeiouAEIOU", why[0]) != nullptr && why.rfind("uni", 0) != 0;
  return vowel ? "an " : "a ";
}

AddressPolicy::AddressPolicy(bool allow_private_networks, std::vector<Cidr> allowed)
    : allow_private_(allow_private_networks), allowed_(std::move(allowed)) {}

std::optional<std::string> AddressPolicy::Refuses(const IpAddress& address) const {
  const auto why = BlockedRange(address);
  if (!why) return std::nullopt;
  // An address that carries an IPv4 one is judged by it alone, so an IPv6 allow-list entry
  // (::/0, 2002::/16) lets no IPv4 address through that its own entry would not.
  const IpAddress judged = EmbeddedV4(address).value_or(address);
  // A metadata address passes only an entry inside its own range (169.254.0.0/16 or a part of
  // it, fd00:ec2::254 itself): neither the flag nor an entry for a whole internal network
  // (fd00::/8, 100.64.0.0/10, ::/0) opens it without naming it.
  const Cidr* metadata = nullptr;
  for (const auto& cidr : MetadataRanges()) {
    if (cidr.Contains(judged)) metadata = &cidr;
  }
  for (const auto& cidr : allowed_) {
    if (cidr.Contains(judged) && (metadata == nullptr || Within(cidr, *metadata))) {
      return std::nullopt;
    }
  }
  const std::string refused = address.ToString() + " is " + Article(*why) + *why + " address";
  if (metadata != nullptr) {
    return refused + ", which only an allowed_networks entry within " + CidrText(*metadata) +
           " opens (not allow_private_networks, nor a wider entry)";
  }
  if (allow_private_) return std::nullopt;
  return refused;
}

bool IsMetadataAddress(const IpAddress& address) {
  const IpAddress judged = EmbeddedV4(address).value_or(address);
  for (const auto& cidr : MetadataRanges()) {
    if (cidr.Contains(judged)) return true;
  }
  return false;
}

std::optional<IpAddress> LiteralAddressOf(std::string_view host) {
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);
  return ParseIpLiteral(host);
}

Resolution ResolveChecked(const std::string& host, const AddressPolicy& policy) {
  Resolution r;
  if (auto literal = LiteralAddressOf(host)) {
    if (auto why = policy.Refuses(*literal)) {
      r.error = *why;
      r.refused = true;
      r.metadata = IsMetadataAddress(*literal);
    } else {
      r.address = *literal;
      r.allowed.push_back(*literal);
    }
    return r;
  }
  std::string error;
  const std::vector<IpAddress> found = CurrentResolver()(host, &error);
  return CheckResolved(host, found, error, policy);
}

Resolver CurrentResolver() {
  std::lock_guard lock(ResolverMu());
  if (TestResolver()) return TestResolver();
  return SystemResolve;
}

Resolution CheckResolved(const std::string& host, const std::vector<IpAddress>& found,
                         const std::string& error, const AddressPolicy& policy) {
  Resolution r;
  if (found.empty()) {
    r.error = "cannot resolve " + host + ": " + (error.empty() ? "no address" : error);
    return r;
  }
  std::string refused;
  bool metadata = false;
  for (const IpAddress& ip : found) {
    if (auto why = policy.Refuses(ip)) {
      if (refused.empty()) {
        refused = *why;
        metadata = IsMetadataAddress(ip);
      }
      continue;
    }
    if (!r.address) r.address = ip;
    r.allowed.push_back(ip);
  }
  if (!r.address) {
    r.error = host + " resolves only to refused addresses: " + refused;
    r.refused = true;
    r.metadata = metadata;
  }
  return r;
}

}  // namespace outbox::relay::webhook_detail
