// Counters of the runtime, process-wide: the CPU and GPU runtimes, the communicators and the
// handlers count into one set, which `jax_rccl.runtime_stats()` reads.
#pragma once

#include <atomic>
#include <cstdint>

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
};
RuntimeStats& Stats();
void ResetStats();

}  // namespace jax_rccl
