#include "ffi/comm/world.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "ffi/comm/hmac.h"
#include "ffi/comm/shm.h"

namespace jax_rccl {
namespace comm {

namespace {

std::mutex g_mu;
std::shared_ptr<const WorldTable> g_table;
std::string g_secret;  // guarded by g_mu

constexpr char kShmTagLabel[] = "jax_rccl shared-memory names";

// The provider and whether it has run (EnsureWorld).
std::mutex g_providerMu;
WorldProvider* g_provider = nullptr;  // guarded by g_providerMu; never freed (see SetWorldProvider)
std::atomic<bool> g_met{false};

}  // namespace

void SetWorldProvider(WorldProvider provider) {
  std::lock_guard<std::mutex> lock(g_providerMu);
  // The old provider is kept alive: it may hold a Python object that must not be released
  // without the interpreter's lock (or after the interpreter is gone, at exit).
  g_provider = new WorldProvider(std::move(provider));
  g_met.store(false, std::memory_order_release);
}

Status EnsureWorld() {
  if (g_met.load(std::memory_order_acquire)) return Status::Ok();
  std::lock_guard<std::mutex> lock(g_providerMu);
  if (g_met.load(std::memory_order_relaxed)) return Status::Ok();
  if (g_provider != nullptr && *g_provider) JR_CHECK((*g_provider)());
  g_met.store(true, std::memory_order_release);
  return Status::Ok();
}

const WorldDevice* WorldTable::Find(int64_t id) const {
  for (const WorldDevice& d : devices) {
    if (d.id == id) return &d;
  }
  return nullptr;
}

Status SetWorldTable(WorldTable table) {
  JR_REQUIRE(table.nprocesses >= 1, Code::kInvalidArgument,
             "set_world: nprocesses must be >= 1, got ", table.nprocesses);
  JR_REQUIRE(table.process >= 0 && table.process < table.nprocesses, Code::kInvalidArgument,
             "set_world: process ", table.process, " is not in 0..", table.nprocesses - 1);
  JR_REQUIRE(!table.session.empty() && table.session.size() <= 64, Code::kInvalidArgument,
             "set_world: session must be 1..64 characters, got ", table.session.size());
  for (char c : table.session) {
    const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    JR_REQUIRE(ok, Code::kInvalidArgument, "set_world: session '", table.session,
               "' may hold only letters and digits (it names shared-memory segments)");
  }
  std::set<int64_t> seen;
  for (const WorldDevice& d : table.devices) {
    JR_REQUIRE(d.id >= 0, Code::kInvalidArgument, "set_world: device id ", d.id, " is negative");
    JR_REQUIRE(seen.insert(d.id).second, Code::kInvalidArgument, "set_world: device id ", d.id,
               " appears more than once in devices");
    JR_REQUIRE(d.process >= 0 && d.process < table.nprocesses, Code::kInvalidArgument,
               "set_world: device ", d.id, " names process ", d.process, ", not in 0..",
               table.nprocesses - 1);
  }
  JR_REQUIRE(table.endpoints.empty() || int(table.endpoints.size()) == table.nprocesses,
             Code::kInvalidArgument, "set_world: endpoints must name one 'host:port' per process (",
             table.nprocesses, "), got ", table.endpoints.size());
  NoteShmSession(table.session);  // its dead processes' segments are reaped at exit
  auto p = std::make_shared<const WorldTable>(std::move(table));
  std::lock_guard<std::mutex> lock(g_mu);
  g_table = std::move(p);
  return Status::Ok();
}

Status SetSessionSecret(std::string secret) {
  JR_REQUIRE(secret.size() >= 16 && secret.size() <= 256, Code::kInvalidArgument,
             "set_session_secret: the secret must be 16..256 bytes, got ", secret.size());
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_secret.empty()) {
    JR_REQUIRE(g_secret.size() == secret.size() &&
                   ConstantTimeEqual(g_secret.data(), secret.data(), secret.size()),
               Code::kInvalidUsage,
               "set_session_secret: this process already has another session secret (one run "
               "per process)");
    return Status::Ok();
  }
  g_secret = std::move(secret);
  return Status::Ok();
}

std::string SessionSecret() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_secret;
}

std::string ShmNameTag(const std::string& group) {
  const std::string secret = SessionSecret();
  if (secret.empty()) return "";
  const std::string msg = detail::StrCat(kShmTagLabel, "|", group);
  const Digest tag = HmacSha256(secret.data(), secret.size(), msg.data(), msg.size());
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (int i = 0; i < 8; ++i) {
    hex += kHex[tag[size_t(i)] >> 4];
    hex += kHex[tag[size_t(i)] & 15];
  }
  return hex;
}

std::shared_ptr<const WorldTable> GetWorldTable() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_table;
}

StatusOr<GroupPlacement> PlaceGroup(const std::vector<int64_t>& devices) {
  GroupPlacement g;
  const int n = static_cast<int>(devices.size());
  std::shared_ptr<const WorldTable> w = GetWorldTable();
  if (!w || w->nprocesses <= 1) {
    g.process.assign(size_t(n), 0);
    g.local.assign(size_t(n), 1);
    g.processes = {0};
    return g;
  }
  g.thisProcess = w->process;
  g.session = w->session;
  for (const WorldDevice& d : w->devices) {
    if (d.process == w->process) {
      g.thisHost = d.host;
      break;
    }
  }
  std::map<std::string, std::vector<int64_t>> byHost;
  std::set<int> procs;
  for (int r = 0; r < n; ++r) {
    const WorldDevice* d = w->Find(devices[r]);
    JR_REQUIRE(d != nullptr, Code::kInvalidArgument, "jax_rccl: device ", devices[r],
               " of a replica group is not in the world table set by set_world (",
               w->devices.size(), " devices)");
    g.process.push_back(d->process);
    g.host.push_back(d->host);
    g.endpoint.push_back(size_t(d->process) < w->endpoints.size() ? w->endpoints[d->process]
                                                                  : std::string());
    g.local.push_back(d->process == w->process ? 1 : 0);
    const size_t p = size_t(d->process);
    g.pid.push_back(p < w->pids.size() ? w->pids[p] : 0);
    g.pidNamespace.push_back(p < w->pidNamespaces.size() ? w->pidNamespaces[p] : 0);
    byHost[d->host].push_back(devices[r]);
    procs.insert(d->process);
  }
  g.processes.assign(procs.begin(), procs.end());
  if (byHost.size() > 1 && w->endpoints.empty()) {
    std::string hosts;
    for (const auto& [host, ids] : byHost) {
      hosts += detail::StrCat(hosts.empty() ? "" : ", ", "'", host, "' (devices");
      for (int64_t id : ids) hosts += detail::StrCat(" ", id);
      hosts += ")";
    }
    JR_FAIL(Code::kUnsupported, "jax_rccl: a replica group spans several hosts: ", hosts,
            "; collectives between hosts need every process's socket endpoint in the world table "
            "(set_world's 'endpoints', published by jax_rccl's bootstrap)");
  }
  JR_REQUIRE(std::find(g.local.begin(), g.local.end(), 1) != g.local.end(), Code::kInvalidArgument,
             "jax_rccl: no device of the replica group belongs to this "
             "process (",
             w->process, ")");
  g.crossProcess = procs.size() > 1;
  if (g.crossProcess) {
    JR_REQUIRE(!SessionSecret().empty(), Code::kInvalidUsage,
               "jax_rccl: a replica group spans processes but this process has no session secret "
               "(jax_rccl's bootstrap sets it from JAX's key-value store; set_session_secret)");
  }
  return g;
}

}  // namespace comm
}  // namespace jax_rccl
