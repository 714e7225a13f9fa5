// Whether libpq can parse a connection string, said without echoing its secrets.
#pragma once

#include <string>

namespace outbox::relay {

/// Why libpq cannot parse `database_url` (a postgresql:// URI or key=value pairs), empty when
/// it can. libpq's own message quotes the token it stopped at, which in a URI is often the
/// password (a raw '%' in it): a quoted token taken from the URI's user information or from
/// a password= value is replaced by "(not shown)". A problem with percent-encoding comes
/// with the fix (write '%' as %25, '@' as %40, ...).
std::string ConnectionStringProblem(const std::string& database_url);

}  // namespace outbox::relay
