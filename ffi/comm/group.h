// What the CPU and GPU communicators of a group derive alike in every process: the nodes a group
// plans with, the hashes that identify a call (its plan's fingerprint, its point-to-point
// transfers) and the lists messages print.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "ffi/planner/planner.h"

namespace jax_rccl {
namespace comm {

// What the ranks of a call compare: a hash of the collective tasks (equal on every rank), the
// rank-independent sums over the point-to-point transfers (sends of all ranks pair with receives
// of all ranks), and a short text of the tasks for messages.
struct CallFingerprint {
  uint64_t coll = 0;
  uint64_t send = 0;
  uint64_t recv = 0;
  std::string text;
};
// The fingerprint of `plan` (built for plan.rank); `seed` distinguishes call kinds.
CallFingerprint FingerprintPlan(const Plan& plan, uint64_t seed);

// Order-independent hash of one point-to-point transfer (src -> dst, k-th on that pair, bytes).
uint64_t P2pTransferHash(int src, int dst, int k, uint64_t bytes);
// Mixes `v` into the hash `h` (for fingerprints).
uint64_t HashMix(uint64_t h, uint64_t v);

// "[a, b, c]", for messages.
template <typename T>
std::string ListString(const std::vector<T>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// The nodes a group plans with, from each rank's node key (its host): the planner's nodes hold
// equal runs of consecutive ranks (ffi/planner/types.h: NodeOf), so the keys' count when they are
// laid out that way; otherwise (unequal runs, or a key's ranks apart) every rank its own node, so
// that no hop that may cross hosts is costed as one within a node (the hops within a host then cost
// as crossings: slower rows; on the GPU no collective chooses LL over a socket). One key: 1.
int CountNodes(const std::vector<std::string>& keys);

}  // namespace comm
}  // namespace jax_rccl
