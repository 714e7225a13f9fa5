// The shipping artifacts other than the Debian package (issue 15) are checked, not merely
// written: docker-compose.yaml, the Kubernetes manifests and the Dockerfile parse, reference
// only files that exist, keep the promises docs/deploy.md makes (health probes, non-root,
// read-only, migration before the relays, resources), and their relay configs pass the same
// parser `check-config` uses.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "outbox_relay/config.h"
#include "outbox_relay/sink_registry.h"
#include "outbox_relay/webhook_target.h"

namespace outbox::relay {
namespace {

namespace fs = std::filesystem;
const fs::path kRoot = OUTBOX_SOURCE_DIR;

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << p;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

const std::map<std::string, std::string> kSecrets = {
    {"OUTBOX_DATABASE_URL", "postgresql://app:app@db:5432/app"},
    {"HOOKS_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}};

// How long a relay may take to stop after SIGTERM, at most: shutdown_timeout_ms for the
// sinks, then the settler's last writes (at least 2 s), a second for each of three threads
// stuck in a statement (the coordinator's, the settler's, maintenance's), and a connect that
// was under way (connect_timeout, 10 s). docs/configuration.md gives the same sum. A stop
// timeout below it SIGKILLs a relay still handing back its leases (review: the manifests
// hard-coded 30 s whatever the config said).
std::chrono::milliseconds LongestStop(const RelayConfig& cfg) {
  return cfg.shutdown_timeout + std::chrono::seconds(2 + 3 * 1 + 10);
}

// ---- docker-compose ----

TEST(DeployCompose, ServicesFilesAndOrder) {
  const fs::path dir = kRoot / "deploy/compose";
  const YAML::Node compose = YAML::LoadFile((dir / "docker-compose.yaml").string());
  const YAML::Node services = compose["services"];
  for (const std::string name :
       {"postgres", "kafka", "migrate", "relay", "receiver", "prometheus", "grafana"}) {
    EXPECT_TRUE(services[name]) << "no service " << name;
  }
  // Every file a service mounts or builds from exists.
  for (const auto& entry : services) {
    const std::string name = entry.first.as<std::string>();
    const YAML::Node svc = entry.second;
    if (svc["build"]) {
      const fs::path context = dir / svc["build"]["context"].as<std::string>();
      EXPECT_TRUE(fs::is_directory(context)) << name << ": build context " << context;
      EXPECT_TRUE(fs::exists(context / svc["build"]["dockerfile"].as<std::string>()))
          << name << ": dockerfile";
    }
    for (const auto& volume : svc["volumes"]) {
      const std::string spec = volume.as<std::string>();
      const std::string source = spec.substr(0, spec.find(':'));
      if (source.rfind("./", 0) == 0 || source.rfind("../", 0) == 0) {
        EXPECT_TRUE(fs::exists(dir / source)) << name << " mounts " << source << ", missing";
      }
    }
  }
  // The schema is migrated before the relay starts; the relay drains on stop.
  EXPECT_EQ(services["relay"]["depends_on"]["migrate"]["condition"].as<std::string>(),
            "service_completed_successfully");
  EXPECT_EQ(services["migrate"]["command"][0].as<std::string>(), "migrate");
  EXPECT_EQ(services["relay"]["stop_grace_period"].as<std::string>(), "30s");
  EXPECT_EQ(services["prometheus"]["profiles"][0].as<std::string>(), "observability");

  // Its relay config is one check-config accepts, with the environment compose gives it.
  std::map<std::string, std::string> env;
  for (const auto& kv : services["relay"]["environment"]) {
    env[kv.first.as<std::string>()] = kv.second.as<std::string>();
  }
  const RelayConfig cfg = LoadConfigFile((dir / "relay.yaml").string(), Env(env));
  EXPECT_EQ(cfg.database_url, "postgresql://app:app@postgres:5432/app");
  EXPECT_EQ(cfg.admin_listen, "0.0.0.0:9090");
  EXPECT_EQ(cfg.destinations.size(), 2u);
  const auto& hooks = cfg.destinations.at("hooks").target.Get<WebhookTarget>();
  EXPECT_TRUE(hooks.allow_private_networks) << "the receiver is on the compose network";
  const std::string grace = services["relay"]["stop_grace_period"].as<std::string>();
  ASSERT_TRUE(grace.ends_with("s")) << grace;
  EXPECT_GE(std::chrono::seconds(std::stoi(grace)), LongestStop(cfg))
      << "stop_grace_period " << grace << " for shutdown_timeout_ms "
      << cfg.shutdown_timeout.count();
}

// ---- Kubernetes ----

std::map<std::string, YAML::Node> K8sByKind() {
  const fs::path dir = kRoot / "deploy/k8s";
  const YAML::Node kustomization = YAML::LoadFile((dir / "kustomization.yaml").string());
  std::map<std::string, YAML::Node> out;
  for (const auto& resource : kustomization["resources"]) {
    const fs::path p = dir / resource.as<std::string>();
    EXPECT_TRUE(fs::exists(p)) << "kustomization lists " << p;
    if (!fs::exists(p)) continue;
    const YAML::Node doc = YAML::LoadFile(p.string());
    out[doc["kind"].as<std::string>()] = doc;
  }
  return out;
}

void ExpectHardenedPod(const YAML::Node& pod, const std::string& what) {
  EXPECT_TRUE(pod["securityContext"]["runAsNonRoot"].as<bool>()) << what;
  EXPECT_NE(pod["securityContext"]["runAsUser"].as<int>(), 0) << what;
  for (const auto& c : pod["containers"]) {
    const YAML::Node sc = c["securityContext"];
    EXPECT_TRUE(sc["readOnlyRootFilesystem"].as<bool>()) << what;
    EXPECT_FALSE(sc["allowPrivilegeEscalation"].as<bool>()) << what;
    EXPECT_EQ(sc["capabilities"]["drop"][0].as<std::string>(), "ALL") << what;
    EXPECT_TRUE(c["resources"]["requests"]["cpu"]) << what;
    EXPECT_TRUE(c["resources"]["limits"]["memory"]) << what;
    // Secrets come from a Secret, never inline.
    for (const auto& e : c["env"]) {
      EXPECT_FALSE(e["value"]) << what << ": " << e["name"].as<std::string>() << " inline";
      EXPECT_TRUE(e["valueFrom"]["secretKeyRef"]) << what;
    }
  }
}

TEST(DeployKubernetes, ManifestsKeepTheirPromises) {
  const auto k = K8sByKind();
  for (const std::string kind :
       {"ConfigMap", "Job", "Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor"}) {
    ASSERT_TRUE(k.count(kind)) << "no " << kind;
  }
  const YAML::Node deploy = k.at("Deployment");
  const YAML::Node pod = deploy["spec"]["template"]["spec"];
  ExpectHardenedPod(pod, "Deployment");
  const YAML::Node relay = pod["containers"][0];
  EXPECT_EQ(relay["livenessProbe"]["httpGet"]["path"].as<std::string>(), "/healthz");
  EXPECT_EQ(relay["readinessProbe"]["httpGet"]["path"].as<std::string>(), "/readyz");
  EXPECT_EQ(relay["args"][0].as<std::string>(), "run");
  EXPECT_EQ(relay["ports"][0]["containerPort"].as<int>(), 9090);
  EXPECT_GE(pod["terminationGracePeriodSeconds"].as<int>(), 20)
      << "shutdown_timeout_ms (10 s) and the last settle";

  const YAML::Node job = k.at("Job");
  ExpectHardenedPod(job["spec"]["template"]["spec"], "Job");
  EXPECT_EQ(job["spec"]["template"]["spec"]["containers"][0]["args"][0].as<std::string>(),
            "migrate");
  // migrate needs the schema's owner (docs/roles.md), the relay only the outbox_relay role:
  // the Job read the relay's URL, so it failed to create what the next migration creates,
  // or the relay ran as the owner (review).
  const auto url_key = [](const YAML::Node& container) {
    for (const auto& e : container["env"]) {
      if (e["name"].as<std::string>() == "OUTBOX_DATABASE_URL")
        return e["valueFrom"]["secretKeyRef"]["key"].as<std::string>();
    }
    return std::string();
  };
  EXPECT_EQ(url_key(job["spec"]["template"]["spec"]["containers"][0]), "migrate-database-url");
  EXPECT_EQ(url_key(relay), "database-url");

  // Selectors meet: the PDB and the Service pick the Deployment's pods, the ServiceMonitor
  // picks the Service and scrapes its admin port.
  const YAML::Node labels = deploy["spec"]["template"]["metadata"]["labels"];
  const auto matches = [&](const YAML::Node& selector) {
    for (const auto& kv : selector) {
      const YAML::Node v = labels[kv.first.as<std::string>()];
      if (!v || v.as<std::string>() != kv.second.as<std::string>()) return false;
    }
    return selector.size() > 0;
  };
  EXPECT_TRUE(matches(k.at("PodDisruptionBudget")["spec"]["selector"]["matchLabels"]));
  EXPECT_TRUE(matches(k.at("Service")["spec"]["selector"]));
  EXPECT_TRUE(matches(deploy["spec"]["selector"]["matchLabels"]));
  const YAML::Node service_labels = k.at("Service")["metadata"]["labels"];
  for (const auto& kv : k.at("ServiceMonitor")["spec"]["selector"]["matchLabels"]) {
    EXPECT_EQ(service_labels[kv.first.as<std::string>()].as<std::string>(),
              kv.second.as<std::string>());
  }
  EXPECT_EQ(k.at("ServiceMonitor")["spec"]["endpoints"][0]["port"].as<std::string>(),
            k.at("Service")["spec"]["ports"][0]["name"].as<std::string>());

  // The ConfigMap's relay.yaml is one check-config accepts with the Secret's variables, and
  // its admin server listens where the probes look.
  const RelayConfig cfg = ParseConfig(k.at("ConfigMap")["data"]["relay.yaml"].as<std::string>(),
                                      "deploy/k8s/configmap.yaml", Env(kSecrets));
  EXPECT_EQ(cfg.admin_listen, "0.0.0.0:9090");
  EXPECT_EQ(cfg.database_url, kSecrets.at("OUTBOX_DATABASE_URL"));
  EXPECT_EQ(k.at("ConfigMap")["metadata"]["name"].as<std::string>(),
            pod["volumes"][0]["configMap"]["name"].as<std::string>());
  EXPECT_GE(std::chrono::seconds(pod["terminationGracePeriodSeconds"].as<int>()), LongestStop(cfg))
      << "terminationGracePeriodSeconds for shutdown_timeout_ms " << cfg.shutdown_timeout.count();
}

// The systemd unit's TimeoutStopSec against the example config it points at.
TEST(DeploySystemd, TheStopTimeoutLeavesRoomForTheShutdown) {
  const std::string unit = Read(kRoot / "deploy/systemd/outbox-relay.service");
  const auto at = unit.find("TimeoutStopSec=");
  ASSERT_NE(at, std::string::npos);
  const int seconds = std::stoi(unit.substr(at + 15));
  // (Read off the YAML: the whole example needs its producers' secrets in the environment.)
  RelayConfig cfg;
  const YAML::Node example = YAML::LoadFile((kRoot / "deploy/config/relay.example.yaml").string());
  ASSERT_TRUE(example["shutdown_timeout_ms"]);
  cfg.shutdown_timeout = std::chrono::milliseconds(example["shutdown_timeout_ms"].as<int>());
  EXPECT_GE(std::chrono::seconds(seconds), LongestStop(cfg))
      << "TimeoutStopSec=" << seconds << " for shutdown_timeout_ms " << cfg.shutdown_timeout.count();
}

// ---- Dockerfile ----

TEST(DeployDocker, MultiStageNonRootWithAHealthCheckAndNoCompilerInTheRuntime) {
  const std::string dockerfile = Read(kRoot / "deploy/docker/Dockerfile");
  const auto runtime_at = dockerfile.find("AS runtime");
  ASSERT_NE(runtime_at, std::string::npos) << "a runtime stage";
  ASSERT_NE(dockerfile.find("AS build"), std::string::npos) << "a build stage";
  const auto receiver_at = dockerfile.find("AS sample-receiver");
  const std::string runtime = dockerfile.substr(runtime_at, receiver_at - runtime_at);
  EXPECT_NE(dockerfile.find("FROM ${DEBIAN_SLIM} AS runtime"), std::string::npos);
  EXPECT_NE(dockerfile.find("ARG DEBIAN_SLIM=debian:12-slim"), std::string::npos);
  for (const std::string tool : {"build-essential", "cmake", "g++", "-dev"}) {
    EXPECT_EQ(runtime.find(tool), std::string::npos) << "the runtime stage installs " << tool;
  }
  EXPECT_TRUE(std::regex_search(runtime, std::regex(R"(\nUSER [1-9][0-9]*)")))
      << "a non-root numeric user";
  EXPECT_NE(runtime.find("HEALTHCHECK"), std::string::npos);
  EXPECT_NE(runtime.find("/healthz"), std::string::npos);
  EXPECT_NE(dockerfile.find("cpack -G DEB"), std::string::npos)
      << "the image installs the package the test suite checks";
}

}  // namespace
}  // namespace outbox::relay
