// The connection string the relay's own Postgres connections use.
#pragma once

#include <string>

namespace outbox::relay {

/// `database_url` (a postgresql:// URI or libpq key=value pairs) as libpq key=value pairs, with
/// network timeouts added where it sets none of its own:
///   connect_timeout=10        a server that accepts the TCP connection but never answers
///                             (a wedged proxy, a load balancer with no backend) fails the
///                             connection after 10 s; libpq's default waits forever
///   keepalives_idle=30, keepalives_interval=10, keepalives_count=3
///                             an idle connection whose server went away is noticed in ~40 s
///   tcp_user_timeout=30000    a request the server stops acknowledging (network partition)
///                             fails after 30 s instead of the kernel's ~15 minutes
/// A value set in `database_url` wins, and so does PGCONNECT_TIMEOUT. A string that names a
/// service (or with PGSERVICE set), whose pg_service.conf may set these itself, comes back
/// unchanged. One libpq cannot parse throws std::invalid_argument naming the problem without
/// its secrets (ConnectionStringProblem): libpq's own error quotes the password.
std::string WithConnectionDefaults(const std::string& database_url);

}  // namespace outbox::relay
