#include "ffi/core/stats.h"

namespace jax_rccl {

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
}

}  // namespace jax_rccl
