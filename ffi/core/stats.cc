#include "ffi/core/stats.h"

#include <deque>
#include <mutex>
#include <unordered_map>

namespace jax_rccl {

namespace {

struct CallSiteRegistry {
  std::mutex mu;
  std::deque<CallSiteStats> records;  // a deque: pointers to its elements stay valid
  std::unordered_map<int64_t, CallSiteStats*> bySite;
};

CallSiteRegistry& Registry() {
  static CallSiteRegistry* r = new CallSiteRegistry();  // never destroyed: used by pool threads
  return *r;
}

}  // namespace

CallSiteStats* CallSiteRecord(int64_t callSite, const std::string& name, const char* kind,
                              int groupSize) {
  CallSiteRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.bySite.find(callSite);
  if (it != r.bySite.end()) return it->second;
  CallSiteStats& s = r.records.emplace_back();
  s.callSite = callSite;
  s.name = name;
  s.kind = kind;
  s.groupSize = groupSize;
  r.bySite.emplace(callSite, &s);
  return &s;
}

std::vector<const CallSiteStats*> CallSiteRecords() {
  CallSiteRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<const CallSiteStats*> out;
  out.reserve(r.records.size());
  for (const CallSiteStats& s : r.records) out.push_back(&s);
  return out;
}

RuntimeStats& Stats() {
  static RuntimeStats* stats = new RuntimeStats();  // never destroyed: used by pool threads
  return *stats;
}

void ResetStats() {
  RuntimeStats& s = Stats();
  s.plansBuilt = 0;
  s.executions = 0;
  s.instantiations = 0;
  s.rendezvousTimeouts = 0;
  s.mismatches = 0;
  s.errors = 0;
  s.oneShots = 0;
  s.netBytesSent = 0;
  s.netBytesReceived = 0;
  s.netSendNs = 0;
  s.netSendNsFull = 0;
  s.netSendNsIdle = 0;
  s.netRecvNs = 0;
  s.netRecvNsFull = 0;
  s.netRecvNsIdle = 0;
  CallSiteRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (CallSiteStats& c : r.records) {
    c.executions = 0;
    c.calls = 0;
    c.bytes = 0;
    c.ns = 0;
  }
}

std::vector<std::pair<const char*, int64_t>> StatsSnapshot() {
  const RuntimeStats& s = Stats();
  return {
      {"plans_built", s.plansBuilt.load()},
      {"executions", s.executions.load()},
      {"instantiations", s.instantiations.load()},
      {"rendezvous_timeouts", s.rendezvousTimeouts.load()},
      {"mismatches", s.mismatches.load()},
      {"errors", s.errors.load()},
      {"one_shots", s.oneShots.load()},
      {"communicators", s.communicators.load()},
      {"rendezvous_pending", s.rendezvousPending.load()},
      {"net_bytes_sent", s.netBytesSent.load()},
      {"net_bytes_received", s.netBytesReceived.load()},
      {"net_send_ns", s.netSendNs.load()},
      {"net_send_ns_full", s.netSendNsFull.load()},
      {"net_send_ns_idle", s.netSendNsIdle.load()},
      {"net_recv_ns", s.netRecvNs.load()},
      {"net_recv_ns_full", s.netRecvNsFull.load()},
      {"net_recv_ns_idle", s.netRecvNsIdle.load()},
  };
}

}  // namespace jax_rccl
