// The planner's public interface: value structs in, a Plan out.
//
// A port of the planning half of RCCL's src/enqueue.cc (task intake, reduction ops, algorithm
// and protocol choice, chunking, channel scheduling of collectives and point-to-point, plan
// finishing and the work layout) in our own structure: no communicator object, no GPU headers,
// no environment reads. See docs/planner.md.
#pragma once

#include <cstdint>
#include <memory>
#include <memory_resource>
#include <string>
#include <vector>

#include "ffi/core/status.h"
#include "ffi/planner/cost_model.h"
#include "ffi/planner/redop.h"
#include "ffi/planner/types.h"
#include "ffi/planner/work.h"

namespace jax_rccl {

// What the planner decided for one task of the group.
struct TaskPlan {
  int index = 0;  // position in the group (the task's slot)
  Coll coll = Coll::kAllReduce;
  DataType dtype = DataType::kFloat32;
  uint64_t count = 0;
  int32_t op = kSum;
  DevRedOpFull opFull;
  int root = 0;
  int peer = -1;
  int64_t nBytes = 0;  // bytes the algorithm is costed on (ncclInfoSetDerived)
  Algo algo = Algo::kUndef;
  Proto proto = Proto::kUndef;
  Pattern pattern = Pattern::kRing;
  int nChannels = 0;  // channels its elements landed on
  int nThreads = 0;
  int64_t chunkSize = 0;  // bytes
  int64_t chunkCount = 0;
  int chunkSteps = 0;
  int sliceSteps = 0;
  int stepSize = 0;
  int funcIndex = -1;
  bool userTuned = false;  // a tuner fixed its channel count
  int64_t aggBytes = 0;    // bytes of the aggregate it was costed with
  float predictedUs = 0;   // the cost model's time for the chosen algorithm and protocol
  std::string choiceNote;  // why the choice differs from the request or the cost model's pick
  int kernel = -1;         // which kernel plan holds it (-1: nothing to run)
};

// One channel of one kernel launch (ncclKernelPlan::Channel).
struct ChannelPlan {
  ChannelPlan() = default;
  explicit ChannelPlan(std::pmr::memory_resource* arena) : works(arena), proxyOps(arena) {}
  std::pmr::vector<Work> works;  // from the plan's arena: a plan is built without a malloc a work
  // What a network proxy moves for this channel, in the order the works need it (the channel's
  // proxyOpQueue); empty where every peer of the channel is on this node.
  std::pmr::vector<ProxyOp> proxyOps;
  int nWorkElem = 0;            // elements in the tail work
  int p2pTailElem[2] = {0, 0};  // next free p2p slot in the tail work, by type - 1 (send, recv)
  int64_t collBytes = 0;        // collective bytes placed on this channel
  int nWork() const { return static_cast<int>(works.size()); }
};

// One kernel launch (ncclKernelPlan).
struct KernelPlan {
  KernelPlan() : channels(kMaxChannels) {}
  explicit KernelPlan(std::pmr::memory_resource* arena) {
    channels.reserve(kMaxChannels);
    for (int c = 0; c < kMaxChannels; ++c) channels.emplace_back(arena);
  }
  std::vector<ChannelPlan> channels;
  int channelUbound = 0;
  int channelCount = 0;
  ChannelMask channelMask{};
  int threadPerBlock = 0;
  int64_t maxBytesPerChannel = 0;
  int collOpCount = 0;       // collectives placed (each one proxy opCount, whether it has ops)
  bool hasProxyOps = false;  // some channel has a proxy op
  int nWork() const;
};

struct Plan {
  Plan() = default;
  Plan(Plan&&) = default;
  Plan& operator=(Plan&&) = delete;  // would free the arena before the works in it
  int rank = 0;
  int nRanks = 1;
  bool oneRank = false;  // one rank: collectives are plain copies (ncclLaunchOneRank)
  // Where the kernels' works live (declared first: destroyed after them); held by pointer so
  // moving a Plan keeps it in place.
  std::unique_ptr<std::pmr::monotonic_buffer_resource> arena =
      std::make_unique<std::pmr::monotonic_buffer_resource>();
  std::vector<TaskPlan> tasks;      // in the order given
  std::vector<KernelPlan> kernels;  // in launch order
};

struct PlanRequest {
  TopologyView topo;
  int rank = 0;
  std::vector<TaskDesc> tasks;
  Tuning tuning;
  PlannerParams params;
  const RedOpTable* userOps = nullptr;  // where user op handles are looked up
  bool persistent = true;               // work budget: unbounded (persistent) or half the FIFO
  uint64_t opCount = 0;                 // the communicator's op counter, stamped into elements
};

// Validates the tasks (ArgsCheck) and builds the plan.
StatusOr<Plan> MakePlan(const PlanRequest& req);

// ---- Proxy ops (uploadProxyOps) ----

// Every proxy op of a kernel plan in the order uploadProxyOps hands them to the proxy: the
// channels' queues merged by opCount, collectives (in plan order) before p2p ops (by work
// index), the lower channel first among equals. opCounts stay relative to the plan.
std::vector<ProxyOp> ProxyOpsInUploadOrder(const KernelPlan& kp);

// The communicator's proxy op counters: collectives, and p2p ops per channel.
struct ProxyOpCounters {
  uint64_t collOpCount = 0;
  uint64_t p2pOpCount[kMaxChannels] = {};
};
// uploadProxyOps: ProxyOpsInUploadOrder with each opCount moved past the communicator's
// history (a collective's by collOpCount, a p2p op's by its channel's p2pOpCount), then the
// counters advanced by the plan's collectives and each channel's last p2p op. The plan keeps its
// relative opCounts, so a persistent plan uploads again at every launch.
std::vector<ProxyOp> UploadProxyOps(const KernelPlan& kp, ProxyOpCounters* counters);

// ---- Work layout (uploadWork) ----

// A persistent plan's work array: channel c's first work at index (number of channels below c
// with work); later works appended after all first works, linked by workNext.
std::vector<Work> LayoutPersistent(const KernelPlan& kp);

// The host's view of the FIFO ring of a non-persistent launch.
struct FifoState {
  uint32_t depth = 0;  // a power of two
  uint32_t sent = 0;   // workFifoSent
  uint32_t ackdMin = 0;
  uint32_t channelSent[kMaxChannels] = {};
};
struct FifoLayout {
  uint32_t ixHead = 0;     // index of the first work (before masking)
  uint32_t waitAcked = 0;  // the FIFO must be acked up to here (ixHead + nWork) before writing
  std::vector<std::pair<uint32_t, Work>> writes;  // (ring slot, work)
};
// Places the plan in the ring, skipping to the wrap boundary when the first works would straddle
// it; advances `fifo`.
StatusOr<FifoLayout> LayoutFifo(const KernelPlan& kp, FifoState* fifo);
// Whether `fifo` has room to advance `sent` to `desiredSent` (rollingLess32 test).
bool FifoHasRoom(const FifoState& fifo, uint32_t desiredSent);
// Folds per-channel done counters read from the device into ackdMin; advances quiesced
// channels (waitWorkFifoAvailable's loop body). `doneLive` has kMaxChannels entries and is
// updated for quiesced channels.
void FifoPoll(FifoState* fifo, uint32_t* doneLive);

}  // namespace jax_rccl
