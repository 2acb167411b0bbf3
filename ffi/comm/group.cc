// What the communicators of a group derive alike (group.h).
#include "ffi/comm/group.h"

#include <algorithm>
#include <sstream>

namespace jax_rccl {
namespace comm {

uint64_t HashMix(uint64_t h, uint64_t v) {
  // splitmix64 finalizer over the running hash and the value
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t P2pTransferHash(int src, int dst, int k, uint64_t bytes) {
  uint64_t h = HashMix(0x6a09e667f3bcc909ull, static_cast<uint64_t>(src));
  h = HashMix(h, static_cast<uint64_t>(dst));
  h = HashMix(h, static_cast<uint64_t>(k));
  return HashMix(h, bytes);
}

CallFingerprint FingerprintPlan(const Plan& plan, uint64_t seed) {
  CallFingerprint f;
  const int n = plan.nRanks;
  uint64_t fp = HashMix(0, seed);
  std::vector<int> sentTo(size_t(std::max(n, 1)), 0), receivedFrom(size_t(std::max(n, 1)), 0);
  std::ostringstream text;
  int listed = 0;
  for (const TaskPlan& tp : plan.tasks) {
    const bool p2p = tp.coll == Coll::kSend || tp.coll == Coll::kRecv;
    if (listed < 6) {
      text << (listed ? "; " : "") << CollName(tp.coll) << " " << DataTypeName(tp.dtype) << " x"
           << tp.count;
      if (p2p) text << (tp.coll == Coll::kSend ? " to " : " from ") << tp.peer;
      if (!p2p && tp.coll != Coll::kAllGather && tp.coll != Coll::kBroadcast)
        text << " " << DevRedOpName(tp.opFull.op);
      if (tp.coll == Coll::kBroadcast || tp.coll == Coll::kReduce) text << " root " << tp.root;
      ++listed;
    } else if (listed == 6) {
      text << "; ... (" << plan.tasks.size() << " tasks)";
      ++listed;
    }
    if (p2p) {
      if (tp.peer < 0 || tp.peer >= n) continue;
      const uint64_t bytes = tp.count * DataTypeSize(tp.dtype);
      if (tp.coll == Coll::kSend)
        f.send += P2pTransferHash(plan.rank, tp.peer, sentTo[size_t(tp.peer)]++, bytes);
      else
        f.recv += P2pTransferHash(tp.peer, plan.rank, receivedFrom[size_t(tp.peer)]++, bytes);
      continue;
    }
    for (uint64_t v : {static_cast<uint64_t>(tp.coll), tp.count, static_cast<uint64_t>(tp.dtype),
                       static_cast<uint64_t>(tp.opFull.op), static_cast<uint64_t>(tp.root),
                       static_cast<uint64_t>(static_cast<int>(tp.algo) + 1)}) {
      fp = HashMix(fp, v);
    }
  }
  if (plan.tasks.empty()) text << "nothing";
  f.coll = fp;
  f.text = text.str();
  return f;
}

int CountNodes(const std::vector<std::string>& keys) {
  std::vector<std::string> order;
  std::vector<int> sizes;
  bool regular = true;
  for (const std::string& k : keys) {
    if (order.empty() || order.back() != k) {
      if (std::find(order.begin(), order.end(), k) != order.end()) regular = false;
      order.push_back(k);
      sizes.push_back(0);
    }
    ++sizes.back();
  }
  for (int s : sizes) regular = regular && s == sizes.front();
  if (order.size() <= 1) return 1;
  return regular ? static_cast<int>(order.size()) : static_cast<int>(keys.size());
}

}  // namespace comm
}  // namespace jax_rccl
