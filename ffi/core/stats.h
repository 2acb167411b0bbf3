// Counters of the runtime, process-wide: the CPU and GPU runtimes, the communicators and the
// handlers count into one set, which `jax_rccl.runtime_stats()` reads.
#pragma once

#include <atomic>
#include <cstdint>
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
void ResetStats();
// Every counter and gauge by its Python name (jax_rccl.runtime_stats()), in a fixed order.
std::vector<std::pair<const char*, int64_t>> StatsSnapshot();

}  // namespace jax_rccl
