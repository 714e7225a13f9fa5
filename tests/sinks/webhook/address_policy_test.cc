// The SSRF guard's address rules: which addresses are refused by default, how IP literals in
// any notation are read, and what an allow-list lets through.
#include "address_policy.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace outbox::relay::webhook_detail {
namespace {

IpAddress Ip(const std::string& text) {
  const auto ip = ParseIpLiteral(text);
  EXPECT_TRUE(ip.has_value()) << text;
  return ip.value_or(IpAddress{});
}

TEST(AddressPolicy, RefusesEveryNonPublicRangeByDefault) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"127.0.0.1", "loopback"},
      {"127.255.1.2", "loopback"},
      {"10.1.2.3", "private (RFC 1918)"},
      {"172.16.0.1", "private (RFC 1918)"},
      {"172.31.255.255", "private (RFC 1918)"},
      {"192.168.1.1", "private (RFC 1918)"},
      {"169.254.169.254", "link-local (cloud metadata endpoints live here)"},
      {"100.64.0.1", "shared (carrier-grade NAT, RFC 6598)"},
      {"100.127.255.254", "shared (carrier-grade NAT, RFC 6598)"},
      {"0.0.0.0", "unspecified (\"this network\")"},
      {"224.0.0.1", "multicast"},
      {"255.255.255.255", "reserved (and broadcast)"},
      {"::1", "loopback"},
      {"::", "unspecified"},
      {"fe80::1", "link-local"},
      {"fd12:3456::1", "unique-local (private)"},
      {"ff02::1", "multicast"},
      {"::ffff:127.0.0.1", "loopback"},  // IPv4-mapped
      {"::ffff:169.254.169.254", "link-local (cloud metadata endpoints live here)"},
      {"64:ff9b::10.0.0.1", "private (RFC 1918)"},  // NAT64
      // Local-use NAT64: where the IPv4 address sits depends on the translator's prefix
      // length. Read as a /96, the second was 8.8.8.8; a /48 translator sends it to 10.0.0.1.
      {"64:ff9b:1::a00:1",
       "local-use NAT64 (RFC 8215, the IPv4 address it carries depends on the translator)"},
      {"64:ff9b:1:a00:0:100:808:808",
       "local-use NAT64 (RFC 8215, the IPv4 address it carries depends on the translator)"},
      {"::127.0.0.1", "loopback"},                  // IPv4-compatible
      {"2002:a9fe:a9fe::1", "link-local (cloud metadata endpoints live here)"},  // 6to4
      // Review: the rest of ::/96 (0.0.1.2 is in 0.0.0.0/8), IPv4-translated (SIIT), and
      // IPv6 ranges the Internet does not route to an endpoint.
      {"::2", "unspecified (\"this network\")"},
      {"::0.0.1.2", "unspecified (\"this network\")"},
      {"::ffff:0:7f00:1", "loopback"},
      {"::ffff:0:a00:1", "private (RFC 1918)"},
      {"2001::1", "Teredo (RFC 4380)"},
      {"2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo (RFC 4380)"},
      {"fec0::1", "site-local (deprecated, still routed)"},
      {"100::1", "discard-only (RFC 6666)"},
      {"2001:db8::1", "documentation (RFC 3849)"},
  };
  for (const auto& [text, why] : refused) {
    EXPECT_EQ(BlockedRange(Ip(text)).value_or("public"), why) << text;
  }
  for (const std::string text : {"8.8.8.8", "172.32.0.1", "100.128.0.1", "192.169.0.1",
                                 "169.255.0.1", "2001:4860:4860::8888", "::ffff:8.8.8.8"}) {
    EXPECT_FALSE(BlockedRange(Ip(text))) << text << " is public";
  }
}

TEST(AddressPolicy, ReadsIpLiteralsInEveryNotation) {
  EXPECT_EQ(Ip("2130706433").ToString(), "127.0.0.1") << "decimal";
  EXPECT_EQ(Ip("0177.0.0.1").ToString(), "127.0.0.1") << "octal";
  EXPECT_EQ(Ip("0x7f.0.0.1").ToString(), "127.0.0.1") << "hex";
  EXPECT_EQ(Ip("0x7f000001").ToString(), "127.0.0.1") << "one hex number";
  EXPECT_EQ(Ip("127.1").ToString(), "127.0.0.1") << "short form";
  EXPECT_EQ(Ip("[::1]").ToString(), "::1") << "bracketed IPv6";
  EXPECT_EQ(Ip("0251.0376.0251.0376").ToString(), "169.254.169.254");
  for (const std::string name : {"example.com", "localhost", "hooks.internal", "1e100.net", ""}) {
    EXPECT_FALSE(ParseIpLiteral(name)) << name << " is a name";
  }
}

TEST(AddressPolicy, AnAllowListOrAllowPrivateNetworksLetsPrivateAddressesThrough) {
  const AddressPolicy strict(false, {});
  EXPECT_EQ(strict.Refuses(Ip("10.20.1.5")).value_or(""),
            "10.20.1.5 is a private (RFC 1918) address");
  EXPECT_FALSE(strict.Refuses(Ip("93.184.216.34")));
  // The article follows the word: "a unspecified address" read as a typo in every refusal.
  EXPECT_EQ(strict.Refuses(Ip("0.0.0.0")).value_or(""),
            "0.0.0.0 is an unspecified (\"this network\") address");
  EXPECT_EQ(strict.Refuses(Ip("192.0.0.8")).value_or(""),
            "192.0.0.8 is an IETF protocol assignments address");
  EXPECT_EQ(strict.Refuses(Ip("::")).value_or(""), ":: is an unspecified address");
  EXPECT_EQ(strict.Refuses(Ip("fd00::1")).value_or(""),
            "fd00::1 is a unique-local (private) address");

  const AddressPolicy some(
      false, {ParseCidr("10.20.0.0/16"), ParseCidr("fd00:1::/64"), ParseCidr("192.168.7.7")});
  EXPECT_FALSE(some.Refuses(Ip("10.20.1.5")));
  EXPECT_TRUE(some.Refuses(Ip("10.21.0.1"))) << "outside the allowed /16";
  EXPECT_FALSE(some.Refuses(Ip("fd00:1::42")));
  EXPECT_TRUE(some.Refuses(Ip("fd00:2::42")));
  EXPECT_FALSE(some.Refuses(Ip("192.168.7.7"))) << "one address is a /32";
  EXPECT_TRUE(some.Refuses(Ip("192.168.7.8")));
  EXPECT_FALSE(some.Refuses(Ip("::ffff:10.20.3.4"))) << "an IPv4-mapped address of the network";
  EXPECT_TRUE(some.Refuses(Ip("127.0.0.1")));

  // An allow-list entry matches the IPv4 address an IPv6 one carries, not the IPv6 form:
  // ::/0 allowed ::ffff:127.0.0.1 while 127.0.0.1 stayed refused (review).
  const AddressPolicy v6_only(false, {ParseCidr("::/0")});
  EXPECT_TRUE(v6_only.Refuses(Ip("::ffff:127.0.0.1")));
  EXPECT_TRUE(v6_only.Refuses(Ip("2002:7f00:1::")));
  EXPECT_FALSE(v6_only.Refuses(Ip("fd00::1")));

  // allow_private_networks lets private and loopback addresses through, not link-local ones
  // (the cloud metadata endpoints, AWS's IPv6 one included), unless the allow-list names
  // them: with endpoints in Postgres the flag covers every endpoint the API adds (review).
  const AddressPolicy open(true, {});
  EXPECT_FALSE(open.Refuses(Ip("127.0.0.1")));
  EXPECT_FALSE(open.Refuses(Ip("10.1.2.3")));
  EXPECT_FALSE(open.Refuses(Ip("fd12::1")));
  EXPECT_EQ(open.Refuses(Ip("169.254.169.254")).value_or(""),
            "169.254.169.254 is a link-local (cloud metadata endpoints live here) address, "
            "which only an allowed_networks entry within 169.254.0.0/16 opens (not "
            "allow_private_networks, nor a wider entry)");
  EXPECT_TRUE(open.Refuses(Ip("::ffff:169.254.169.254")));
  EXPECT_TRUE(open.Refuses(Ip("fe80::1")));
  EXPECT_TRUE(open.Refuses(Ip("fd00:ec2::254")));
  // The metadata addresses of other clouds inside ranges the flag opens (review): Google
  // Cloud's IPv6 one (unique-local), Alibaba Cloud's (CGNAT); their neighbours stay open.
  EXPECT_TRUE(open.Refuses(Ip("fd20:ce::254")));
  EXPECT_TRUE(open.Refuses(Ip("100.100.100.200")));
  EXPECT_TRUE(open.Refuses(Ip("::ffff:100.100.100.200")));
  EXPECT_FALSE(open.Refuses(Ip("fd20:ce::253")));
  EXPECT_FALSE(open.Refuses(Ip("100.100.100.201")));
  // The local-use NAT64 range, which can carry 169.254.169.254 wherever its translator puts
  // it (64:ff9b:1::a9fe:a9fe, 64:ff9b:1:a9fe:a9:fe00::): refused as a range, it is not one the
  // flag opens (review of the change that refused it).
  EXPECT_TRUE(open.Refuses(Ip("64:ff9b:1::a9fe:a9fe")));
  EXPECT_TRUE(open.Refuses(Ip("64:ff9b:1:a9fe:a9:fe00::")));
  EXPECT_FALSE(AddressPolicy(true, {ParseCidr("64:ff9b:1::/48")})
                   .Refuses(Ip("64:ff9b:1::a9fe:a9fe")))
      << "allowed_networks names it";
  const AddressPolicy open_listed(true, {ParseCidr("169.254.0.0/16")});
  EXPECT_FALSE(open_listed.Refuses(Ip("169.254.169.254")));
}

// A metadata address passes only an allow-list entry inside its own range: an entry for an
// internal network (fd00::/8, Tailscale's 100.64.0.0/10, ::/0) opened AWS's fd00:ec2::254,
// Alibaba Cloud's 100.100.100.200 and the link-local ranges without naming them (review).
TEST(AddressPolicy, AMetadataAddressPassesOnlyAnEntryInsideItsOwnRange) {
  struct Case {
    const char* entry;
    const char* address;
  };
  for (const auto& [entry, address] : std::vector<Case>{{"fd00::/8", "fd00:ec2::254"},
                                                        {"fc00::/7", "fd20:ce::254"},
                                                        {"100.64.0.0/10", "100.100.100.200"},
                                                        {"::/0", "fe80::1"},
                                                        {"::/0", "64:ff9b:1::a9fe:a9fe"},
                                                        {"0.0.0.0/0", "169.254.169.254"},
                                                        {"169.0.0.0/8", "169.254.169.254"},
                                                        {"fe80::/9", "fe80::1"}}) {
    for (const bool flag : {false, true}) {
      const auto why = AddressPolicy(flag, {ParseCidr(entry)}).Refuses(Ip(address));
      ASSERT_TRUE(why) << entry << " let " << address << " through (flag " << flag << ")";
      EXPECT_NE(why->find("only an allowed_networks entry within"), std::string::npos) << *why;
    }
  }
  // Their neighbours are what the entries opened before.
  EXPECT_FALSE(AddressPolicy(false, {ParseCidr("fd00::/8")}).Refuses(Ip("fd00:ec2::253")));
  EXPECT_FALSE(AddressPolicy(false, {ParseCidr("100.64.0.0/10")}).Refuses(Ip("100.100.100.201")));
  // Entries inside the range, or naming the address, open it.
  EXPECT_FALSE(AddressPolicy(false, {ParseCidr("fd00:ec2::254")}).Refuses(Ip("fd00:ec2::254")));
  EXPECT_FALSE(AddressPolicy(false, {ParseCidr("169.254.10.0/24")}).Refuses(Ip("169.254.10.5")));
  EXPECT_FALSE(AddressPolicy(false, {ParseCidr("fe80::/10")}).Refuses(Ip("fe80::1")));
  EXPECT_FALSE(
      AddressPolicy(false, {ParseCidr("169.254.0.0/16")}).Refuses(Ip("::ffff:169.254.169.254")))
      << "judged by the IPv4 address it carries";
  EXPECT_EQ(
      AddressPolicy(false, {ParseCidr("0.0.0.0/0")}).Refuses(Ip("169.254.169.254")).value_or(""),
      "169.254.169.254 is a link-local (cloud metadata endpoints live here) address, which "
      "only an allowed_networks entry within 169.254.0.0/16 opens (not "
      "allow_private_networks, nor a wider entry)");
  EXPECT_EQ(AddressPolicy(true, {}).Refuses(Ip("fd00:ec2::254")).value_or(""),
            "fd00:ec2::254 is a unique-local (private) address, which only an allowed_networks "
            "entry within fd00:ec2::254/128 opens (not allow_private_networks, nor a wider "
            "entry)");
  EXPECT_TRUE(IsMetadataAddress(Ip("100.100.100.200")));
  EXPECT_TRUE(IsMetadataAddress(Ip("::ffff:169.254.1.1")));
  EXPECT_FALSE(IsMetadataAddress(Ip("10.0.0.1")));
}

TEST(AddressPolicy, BadNetworksAreRefusedWithTheFix) {
  for (const std::string bad :
       {"10.0.0.0/33", "10.0.0.0/", "10.0.0/8", "fd00::/129", "nope", "10.0.0.0/8x", "0x0a.0.0.0/8",
        "0.0.0.0/-0", "10.0.0.0/ 8", "10.0.0.0/+8"}) {
    EXPECT_THROW(ParseCidr(bad), std::invalid_argument) << bad;
  }
  EXPECT_EQ(ParseCidr("10.0.0.0/8").prefix, 8);
  EXPECT_EQ(ParseCidr("::1").prefix, 128);
  // An address with its prefix, as `ip addr` shows it, opened the whole network (review): the
  // entry is refused with the network it would have opened.
  try {
    ParseCidr("10.1.2.3/8");
    ADD_FAILURE() << "10.1.2.3/8 was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "'10.1.2.3/8' has bits set past its prefix length: write the network, "
                 "10.0.0.0/8, or the one address, 10.1.2.3");
  }
  EXPECT_THROW(ParseCidr("fd00::1/8"), std::invalid_argument);
  EXPECT_EQ(ParseCidr("fd00::/8").prefix, 8);
  EXPECT_EQ(ParseCidr("0.0.0.0/0").prefix, 0);
  // IPv6 forms of IPv4 addresses are judged by the IPv4 address they carry, so such an entry
  // matched nothing (review): refused, naming the IPv4 network to write.
  try {
    ParseCidr("::ffff:10.0.0.0/104");
    ADD_FAILURE() << "::ffff:10.0.0.0/104 was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "'::ffff:10.0.0.0/104' is a network of IPv6 addresses that carry IPv4 ones, which "
                 "are judged by the IPv4 address, so it matches nothing: write 10.0.0.0/8");
  }
  // The whole form: every IPv4 address; 0.0.0.0/0 in its place would open them all (review).
  for (const std::string whole : {"64:ff9b::/96", "::ffff:0:0/96"}) {
    try {
      ParseCidr(whole);
      ADD_FAILURE() << whole << " was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("matches nothing: remove it"), std::string::npos)
          << e.what();
      EXPECT_EQ(std::string(e.what()).find("0.0.0.0"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(ParseCidr("64:ff9b::a00:0/104"), std::invalid_argument);
  EXPECT_THROW(ParseCidr("::ffff:127.0.0.1"), std::invalid_argument);
  EXPECT_EQ(ParseCidr("::/0").prefix, 0) << "wider than the forms: still an entry";
}

TEST(AddressPolicy, ResolvesNamesAndRefusesWhatOnlyResolvesToBlockedAddresses) {
  const auto blocked = ResolveChecked("localhost", AddressPolicy(false, {}));
  EXPECT_FALSE(blocked.address);
  EXPECT_TRUE(blocked.refused);
  EXPECT_NE(blocked.error.find("localhost resolves only to refused addresses"), std::string::npos)
      << blocked.error;
  const auto allowed = ResolveChecked(
      "localhost", AddressPolicy(false, {ParseCidr("127.0.0.0/8"), ParseCidr("::1")}));
  ASSERT_TRUE(allowed.address) << allowed.error;
  EXPECT_EQ(BlockedRange(*allowed.address).value_or("public"), "loopback");
  const auto literal = ResolveChecked("0x7f.1", AddressPolicy(false, {}));
  EXPECT_TRUE(literal.refused);
  EXPECT_NE(literal.error.find("127.0.0.1 is a loopback address"), std::string::npos);
  const auto unknown = ResolveChecked("no-such-host.invalid", AddressPolicy(false, {}));
  EXPECT_FALSE(unknown.address);
  EXPECT_FALSE(unknown.refused) << "a lookup failure is no refusal";
  EXPECT_NE(unknown.error.find("cannot resolve no-such-host.invalid"), std::string::npos)
      << unknown.error;
}

}  // namespace
}  // namespace outbox::relay::webhook_detail
