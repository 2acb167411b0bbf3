// The host executor: runs a Plan the way the device kernels will (per channel its works; ring,
// tree and p2p steps through per-peer FIFO slots in host memory with the chosen protocol's
// chunking; Direct reads peers' buffers in place), with the reduce functors shared with device
// code (ffi/compute/reduce_functors.h).
//
// Interface between the communicator / FFI handlers (comm.cc, handlers.cc) and the executor and
// its transport (executor.cc, transport.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ffi/core/clock.h"
#include "ffi/core/status.h"
#include "ffi/planner/planner.h"

namespace jax_rccl {
namespace host {

using Clock = ::jax_rccl::Clock;

// One rank's buffers for one task slot of one execution.
struct SlotBuffers {
  const void* send = nullptr;  // what the rank contributes (p2p send: the bytes to send)
  void* recv = nullptr;        // where its result goes (p2p recv: where bytes land)
  // A point-to-point task only: the bytes this execution moves, at most the planned count
  // (ragged_all_to_all: the plan is built for the largest transfer, the operands say how much
  // of it moves); -1 moves the planned count. Both ends of a transfer must pass the same value.
  int64_t bytes = -1;
};

// Connections and wake-ups for the ranks of one communicator in one process: for every channel
// a FIFO of kSteps slots per directed pair of ranks (allocated lazily for pairs p2p uses), and one
// doorbell per rank that waiters sleep on (no busy spinning: 8 ranks share 2 cores in CI).
class HostTransport {
 public:
  virtual ~HostTransport() = default;
  virtual int nRanks() const = 0;
  // Wakes every rank waiting on this transport (used when the communicator fails).
  virtual void WakeAll() = 0;
};

StatusOr<std::unique_ptr<HostTransport>> MakeHostTransport(const TopologyView& topo);

// What one rank needs to run its plan for one execution.
struct ExecContext {
  int rank = 0;
  int nRanks = 1;
  HostTransport* transport = nullptr;
  // Every rank's slot buffers of this execution, [rank][slot] (published at the rendezvous;
  // Direct elements read and write peers' buffers through it).
  const std::vector<std::vector<SlotBuffers>>* peers = nullptr;
  // Waits until every rank of this execution reached the same point (with the deadline).
  std::function<Status()> barrier;
  Clock::time_point deadline;
  // Set when the communicator failed (another rank timed out): waits stop with an error.
  const std::atomic<bool>* aborted = nullptr;
  // Across processes: whether another process of the group reported its communicator failed or
  // a socket to a peer broke; *why then says which (asked only when the rank cannot progress).
  std::function<bool(std::string* why)> peerFailed;
  std::string name;  // the collective, for messages
  // The call's identity and its number on the communicator: stamped on every FIFO step this rank
  // sends (transport_host.h: StepTag); with `checkSteps`, every step it receives must carry its
  // own (JAX_RCCL_CHECK_CALLS).
  uint64_t callId = 0;
  uint64_t seq = 0;
  bool checkSteps = true;
  // By rank, how messages name it ("rank r (device d, process p, host 'h')"); null: "rank r".
  const std::vector<std::string>* rankNames = nullptr;
  // A one-shot execution (OneShotEligible): this thread runs every rank's part of the plan, whose
  // elements are all Direct and whose op arguments are the same on every rank, over
  // `peers` (all ranks in this process, all arrived); no barrier, no FIFO.
  bool whole = false;
};

// Whether `plan` may run one-shot: at least two ranks, every collective element Direct, no
// point-to-point task, no op argument that differs between ranks (a PreMulSum scalar read from
// memory), and at most `maxBytes` per rank (0: never), counted as the larger of a rank's buffers
// (all_gather's output, psum_scatter's input), all_reduce's four times.
bool OneShotEligible(const Plan& plan, int64_t maxBytes);

// Runs `plan` (built for ctx.rank) over this rank's slots `mine` (== (*ctx.peers)[ctx.rank]).
// Errors: a wait past the deadline (kTimeout, naming the peer waited for), an abort.
Status ExecutePlan(const Plan& plan, const ExecContext& ctx);

}  // namespace host
}  // namespace jax_rccl
