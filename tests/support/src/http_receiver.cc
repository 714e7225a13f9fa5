#include "outbox_test/http_receiver.h"

#include <httplib.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "outbox_relay/listen_backlog.h"
#include "outbox_test/wait.h"

namespace outbox::testing {
namespace {

bool IEquals(const std::string& a, const std::string& b) {
  return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0;
}

// Pseudo headers httplib adds to every request; not sent by the client.
bool IsHttplibPseudoHeader(const std::string& name) {
  return name == "REMOTE_ADDR" || name == "REMOTE_PORT" || name == "LOCAL_ADDR" ||
         name == "LOCAL_PORT";
}

}  // namespace

std::string ReceivedRequest::Header(const std::string& name) const {
  for (const auto& [k, v] : headers) {
    if (IEquals(k, name)) return v;
  }
  return "";
}

struct HttpReceiver::Impl {
  bool tls = false;
  int port = 0;
  std::unique_ptr<httplib::Server> server;
  std::thread thread;

  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::vector<ReceivedRequest> requests;
  std::set<std::pair<std::string, int>> connections;
  std::function<Reply(const ReceivedRequest&)> responder;

  void Handle(const httplib::Request& req, httplib::Response& res) {
    ReceivedRequest r;
    r.method = req.method;
    r.path = req.path;
    r.target = req.target;
    for (const auto& [k, v] : req.headers) {
      if (!IsHttplibPseudoHeader(k)) r.headers.emplace(k, v);
    }
    r.body = req.body;
    r.remote_addr = req.remote_addr;
    r.remote_port = req.remote_port;
    r.at = std::chrono::steady_clock::now();

    std::function<Reply(const ReceivedRequest&)> respond;
    {
      std::lock_guard<std::mutex> lock(mu);
      requests.push_back(r);
      connections.emplace(r.remote_addr, r.remote_port);
      respond = responder;
    }
    cv.notify_all();

    const Reply reply = respond ? respond(r) : Reply{};
    if (reply.delay.count() > 0)
      std::this_thread::sleep_for(reply.delay);  // simulated slow endpoint
    res.status = reply.status;
    std::string content_type = "text/plain";
    for (const auto& [k, v] : reply.headers) {
      if (IEquals(k, "Content-Type")) {
        content_type = v;
      } else {
        res.set_header(k.c_str(), v);
      }
    }
    res.set_content(reply.body, content_type.c_str());
  }

  void Start() {
    if (!server->is_valid()) throw std::runtime_error("HttpReceiver: invalid server (TLS files?)");
    // The defaults (5 requests per connection, about 8 worker threads) would make connection
    // counts depend on httplib rather than on the client under test.
    server->set_keep_alive_max_count(1000000);
    // Headers and body go out in separate writes; without this, Nagle plus the client's
    // delayed ACK adds ~40 ms to every response.
    server->set_tcp_nodelay(true);
    server->new_task_queue = [] { return new httplib::ThreadPool(32); };
    const auto handler = [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res);
    };
    server->Get(".*", handler);
    server->Post(".*", handler);
    server->Put(".*", handler);
    server->Patch(".*", handler);
    server->Delete(".*", handler);
    server->Options(".*", handler);

    // The relay's workers connect all at once: httplib's backlog of 5 would drop handshakes.
    const outbox::relay::ListenBacklog backlog(*server);
    port = server->bind_to_any_port("127.0.0.1");
    if (port <= 0) throw std::runtime_error("HttpReceiver: cannot bind 127.0.0.1:0");
    if (!backlog.Raise()) throw std::runtime_error("HttpReceiver: cannot raise the listen backlog");
    httplib::Server* s = server.get();
    thread = std::thread([s] { s->listen_after_bind(); });
    if (!WaitFor([s] { return s->is_running(); }, std::chrono::seconds(10))) {
      s->stop();
      thread.join();
      throw std::runtime_error("HttpReceiver: server did not start listening within 10s");
    }
  }

  ~Impl() {
    if (thread.joinable()) {
      server->stop();
      thread.join();
    }
  }
};

HttpReceiver::HttpReceiver() : impl_(std::make_unique<Impl>()) {
  impl_->server = std::make_unique<httplib::Server>();
  impl_->Start();
}

HttpReceiver::HttpReceiver(const TlsFiles& tls) : impl_(std::make_unique<Impl>()) {
  impl_->tls = true;
  impl_->server =
      std::make_unique<httplib::SSLServer>(tls.cert_pem_path.c_str(), tls.key_pem_path.c_str());
  impl_->Start();
}

HttpReceiver::~HttpReceiver() = default;

int HttpReceiver::port() const { return impl_->port; }

std::string HttpReceiver::Url(const std::string& path) const {
  std::string url =
      std::string(impl_->tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(impl_->port);
  if (path.empty() || path.front() != '/') url += '/';
  return url + path;
}

void HttpReceiver::SetResponder(std::function<Reply(const ReceivedRequest&)> responder) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->responder = std::move(responder);
}

std::vector<ReceivedRequest> HttpReceiver::Requests() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->requests;
}

std::size_t HttpReceiver::Count() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->requests.size();
}

std::size_t HttpReceiver::ConnectionCount() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->connections.size();
}

bool HttpReceiver::WaitForCount(std::size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->cv.wait_for(lock, timeout, [&] { return impl_->requests.size() >= n; });
}

// ---------------------------------------------------------------------------------------
// Test PKI

namespace {

// Temp dirs made by MakeTestPki, removed at normal exit of the process that made them.
struct PkiDirs {
  std::mutex mu;
  std::vector<std::string> dirs;
  pid_t owner = ::getpid();
  ~PkiDirs() {
    if (::getpid() != owner) return;
    for (const auto& d : dirs) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
};

PkiDirs& Pki() {
  static PkiDirs dirs;
  return dirs;
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void RunOpenssl(const std::string& dir, const std::string& args) {
  const std::string log = dir + "/openssl.log";
  const std::string cmd = "cd " + Quote(dir) + " && openssl " + args + " >" + Quote(log) + " 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
    throw std::runtime_error("MakeTestPki: `openssl " + args + "` failed (status " +
                             std::to_string(rc) + "):\n" + ReadAll(log));
  }
}

}  // namespace

TestPki MakeTestPki() {
  char tmpl[] = "/tmp/outbox-pki-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("MakeTestPki: mkdtemp failed");
  TestPki pki;
  pki.dir = tmpl;
  {
    std::lock_guard<std::mutex> lock(Pki().mu);
    Pki().dirs.push_back(pki.dir);
  }
  pki.ca_cert_path = pki.dir + "/ca.crt";
  pki.server.cert_pem_path = pki.dir + "/server.crt";
  pki.server.key_pem_path = pki.dir + "/server.key";

  {
    std::ofstream ca_cnf(pki.dir + "/ca.cnf");
    ca_cnf << "[req]\n"
              "distinguished_name = dn\n"
              "prompt = no\n"
              "x509_extensions = v3_ca\n"
              "[dn]\n"
              "CN = outbox-test-ca\n"
              "[v3_ca]\n"
              "basicConstraints = critical,CA:true\n"
              "keyUsage = critical,keyCertSign,cRLSign\n"
              "subjectKeyIdentifier = hash\n";
    std::ofstream server_cnf(pki.dir + "/server.cnf");
    server_cnf << "[req]\n"
                  "distinguished_name = dn\n"
                  "prompt = no\n"
                  "[dn]\n"
                  "CN = localhost\n";
    std::ofstream server_ext(pki.dir + "/server.ext");
    server_ext << "basicConstraints = CA:false\n"
                  "keyUsage = critical,digitalSignature,keyEncipherment\n"
                  "extendedKeyUsage = serverAuth\n"
                  "subjectAltName = IP:127.0.0.1,DNS:localhost\n"
                  "authorityKeyIdentifier = keyid\n";
    if (!ca_cnf || !server_cnf || !server_ext) {
      throw std::runtime_error("MakeTestPki: cannot write into " + pki.dir);
    }
  }

  RunOpenssl(
      pki.dir,
      "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -config ca.cnf");
  RunOpenssl(
      pki.dir,
      "req -new -newkey rsa:2048 -nodes -keyout server.key -out server.csr -config server.cnf");
  RunOpenssl(pki.dir,
             "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt "
             "-days 3650 -extfile server.ext");
  return pki;
}

}  // namespace outbox::testing
