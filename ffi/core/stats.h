// Counters of the runtime, process-wide: the CPU and GPU runtimes, the communicators and the
// handlers count into one set, which `jax_rccl.runtime_stats()` reads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace jax_rccl {

// The gauges (communicators, rendezvousPending) are not reset by ResetStats.
struct RuntimeStats {
  std::atomic<int64_t> plansBuilt{0};
  std::atomic<int64_t> executions{0};
  std::atomic<int64_t> instantiations{0};
  std::atomic<int64_t> rendezvousTimeouts{0};
  std::atomic<int64_t> mismatches{0};  // executions whose ranks disagreed on the call
  std::atomic<int64_t> errors{0};      // executions that returned an error
  std::atomic<int64_t> oneShots{0};    // CPU executions one rank ran for its group (one-shot)
  std::atomic<int64_t> communicators{0};
  std::atomic<int64_t> rendezvousPending{0};  // rendezvous entries alive in the maps
  // The network proxies (GPU groups across hosts, ffi/comm/proxy.h): bytes each way, and where
  // their connections' time went, summed over connections (ns): all of it (*_ns), the part with
  // every slot full (sending: every slot's step in the network, so the kernel waits for room;
  // receiving: every slot holds a step the kernel has not consumed, so the network waits for it),
  // and the part idle (sending: no step in the network, which waits for the kernel; receiving:
  // every step that arrived consumed, so the kernel waits for the network, or nothing is due).
  std::atomic<int64_t> netBytesSent{0};
  std::atomic<int64_t> netBytesReceived{0};
  std::atomic<int64_t> netSendNs{0};
  std::atomic<int64_t> netSendNsFull{0};
  std::atomic<int64_t> netSendNsIdle{0};
  std::atomic<int64_t> netRecvNs{0};
  std::atomic<int64_t> netRecvNsFull{0};
  std::atomic<int64_t> netRecvNsIdle{0};
};
RuntimeStats& Stats();
// Zeroes the counters of RuntimeStats and those of every call site's record.
void ResetStats();
// Every counter and gauge by its Python name (jax_rccl.runtime_stats()), in a fixed order.
std::vector<std::pair<const char*, int64_t>> StatsSnapshot();

// One call site's record (the `call_site` identity of a custom call, the same in every
// executable and process that holds the call): its executions (one per device and call, as
// RuntimeStats::executions counts them), the bytes and nanoseconds they took, and the plan's
// choice. Made at instantiate under the registry's lock; an execution only adds to its atomics.
// Records live as long as the process (executables keep pointers to them).
struct CallSiteStats {
  int64_t callSite = 0;
  std::string name;  // the call's `name` attribute ("psum over ('i',)")
  std::string kind;  // "all_reduce", ...
  int groupSize = 1;
  std::atomic<int64_t> executions{0};
  // Calls of the site in this process: executions on one of its devices (the first to run it).
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> leaderDevice{-1};
  // The message size of each execution summed: a device's operand bytes (all_gather: its
  // result's), the size NCCL's tests report a collective's bandwidth for.
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> ns{0};  // wall time of the executions, from entry to return
  // The plan's algorithm and protocol (the planner's enum values; -1 none yet, kP2p a
  // point-to-point plan), written when a device's plan is built.
  static constexpr int32_t kP2p = -2;
  std::atomic<int32_t> algo{-1};
  std::atomic<int32_t> proto{-1};

  void Add(int64_t device, int64_t nbytes, int64_t elapsedNs) {
    executions.fetch_add(1, std::memory_order_relaxed);
    int64_t leader = leaderDevice.load(std::memory_order_relaxed);
    if (leader < 0 && leaderDevice.compare_exchange_strong(leader, device)) leader = device;
    if (leader == device) calls.fetch_add(1, std::memory_order_relaxed);
    bytes.fetch_add(nbytes, std::memory_order_relaxed);
    ns.fetch_add(elapsedNs, std::memory_order_relaxed);
  }
};

// The record of `callSite`, made on first use (name, kind and group size from that use).
CallSiteStats* CallSiteRecord(int64_t callSite, const std::string& name, const char* kind,
                              int groupSize);
// Every record made so far, in the order they were made (pointers stay valid).
std::vector<const CallSiteStats*> CallSiteRecords();

// Times one execution on `device` into `record` from construction to destruction (null:
// nothing).
class CallTimer {
 public:
  CallTimer(CallSiteStats* record, int64_t device, int64_t bytes)
      : record_(record), device_(device), bytes_(bytes), start_(std::chrono::steady_clock::now()) {}
  ~CallTimer() {
    if (record_ == nullptr) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - start_);
    record_->Add(device_, bytes_, static_cast<int64_t>(ns.count()));
  }
  CallTimer(const CallTimer&) = delete;
  CallTimer& operator=(const CallTimer&) = delete;

 private:
  CallSiteStats* record_;
  int64_t device_;
  int64_t bytes_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace jax_rccl
