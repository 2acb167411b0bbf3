// The host transport (private to ffi/cpu/): per channel and directed pair of ranks a FIFO
// connection of kSteps slots, and per rank a doorbell that waiters sleep on.
//
// A connection has a `tail` (steps the sender filled) and a `head` (steps the receiver consumed),
// both monotonic 64-bit counters that persist across executions, like RCCL's connection step
// counters. The sender may fill step s when s - head < kSteps, writes slot s % kSteps, then
// publishes tail = s + 1 (release) and rings the receiver's doorbell; the receiver may consume
// step s when tail > s (acquire), reads the slot in place, then publishes head = s + 1 and rings
// the sender's doorbell. Each slot records the bytes written and the sender's StepTag (which call
// of the communicator the step belongs to), which the receiver checks before it reads the slot.
//
// Connections hold no pointers: a connection's slots lie at a fixed offset from its header, so
// the same layout works in process memory and in shared memory mapped at different addresses.
// Storage comes from the heap (every rank in this process: connections allocated on first use)
// or from one region per rank (ranks in several processes: rank t's region, in its shared-memory
// segment, holds t's doorbell and the connections from every rank to t on every channel; see
// RankRegion below and ffi/comm/shm.h).
//
// Doorbells: a sequence number bumped on every post, and a futex waiters sleep on with a timeout
// (no busy spinning). A waiter samples the sequence before checking its conditions, so a post it
// missed changes the sequence and the futex wait returns at once. Futexes of a shared transport
// are process-shared (FUTEX_WAIT/FUTEX_WAKE without _PRIVATE): a post in one process wakes a
// waiter in another.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ffi/host/executor.h"

namespace jax_rccl {
namespace host {

// What a sender stamps on every FIFO step: the call it belongs to (its identity and its number
// on the communicator) and the task's kind, type, element count and op. The receiver compares it
// with its own before it reads a byte of the step, so ranks that run different calls (or the same
// calls in different orders) fail with an error naming both instead of mixing their data.
struct StepTag {
  uint64_t call = 0;   // the call's identity (Communicator::Run: call site and plan fingerprint)
  uint64_t seq = 0;    // the call's number on its communicator (0, 1, ...)
  uint64_t count = 0;  // elements of the task
  uint8_t coll = 0, dtype = 0, op = 0, pad[5] = {};
  bool operator==(const StepTag& o) const {
    return call == o.call && seq == o.seq && count == o.count && coll == o.coll &&
           dtype == o.dtype && op == o.op;
  }
};
// "call #3 (all_reduce float32 x1024 sum; id 0123456789abcdef)", for messages.
std::string StepTagString(const StepTag& t);
static_assert(sizeof(StepTag) == 32, "a step tag is 32 bytes (socket frames carry it)");

struct alignas(64) HostConn {
  std::atomic<uint64_t> tail{0};  // written by the sender
  char pad0[64 - sizeof(std::atomic<uint64_t>)];
  std::atomic<uint64_t> head{0};  // written by the receiver
  char pad1[64 - sizeof(std::atomic<uint64_t>)];
  int64_t slotSizes[kSteps] = {};  // bytes in each slot (written before tail is published)
  StepTag tags[kSteps] = {};       // the sender's tag of each slot (written before tail)
  // The layout, for a reader of the memory (ShmGroup::CheckLayout checks it); the slots' address
  // is never taken from here (a peer can write this header): HostFifoTransport::Slots.
  int64_t slotBytes = 0;
  int64_t dataOffset = 0;  // bytes from this header to slot 0 (kSteps slots of slotBytes)
};

struct alignas(64) Doorbell {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> waiters{0};
};

static_assert(sizeof(std::atomic<uint64_t>) == 8 && sizeof(std::atomic<uint32_t>) == 4,
              "lock-free words of the shared layout");

// The sizes every process of a group derives from the topology alone.
struct TransportGeometry {
  int nRanks = 0;
  int nChannels = 0;
  int64_t slotBytes = 0;  // the largest step of any protocol, 64-byte aligned
  int64_t stepBytes[kNumProtos] = {};
};
TransportGeometry GeometryOf(const TopologyView& topo);

// One rank's region: its doorbell, then the headers of the connections to it
// ([channel][from]), then their slots. Offsets are from the region's start.
struct RankRegion {
  static constexpr int64_t kConnHeaderBytes = 512;
  static constexpr int64_t kHeadersOffset = 4096;  // the doorbell owns the first page
  static int64_t ConnIndex(const TransportGeometry& g, int channel, int from) {
    return int64_t(channel) * g.nRanks + from;
  }
  static int64_t HeaderOffset(const TransportGeometry& g, int channel, int from) {
    return kHeadersOffset + ConnIndex(g, channel, from) * kConnHeaderBytes;
  }
  static int64_t DataStart(const TransportGeometry& g) {
    const int64_t end = kHeadersOffset + int64_t(g.nChannels) * g.nRanks * kConnHeaderBytes;
    return (end + 4095) / 4096 * 4096;
  }
  static int64_t DataOffset(const TransportGeometry& g, int channel, int from) {
    return DataStart(g) + ConnIndex(g, channel, from) * kSteps * g.slotBytes;
  }
  static int64_t Bytes(const TransportGeometry& g) {
    return DataOffset(g, g.nChannels, 0);  // one past the last connection
  }
  // Writes the connection headers' constants into zeroed memory (the creator, once).
  static void Init(char* region, const TransportGeometry& g);
};
static_assert(sizeof(HostConn) <= RankRegion::kConnHeaderBytes, "connection header size");

class HostFifoTransport final : public HostTransport {
 public:
  // In-process: every rank's storage on the heap.
  explicit HostFifoTransport(const TopologyView& topo);
  // Across processes: each rank's storage is a region attached with AttachRegion before the
  // first execution (its doorbell and connections to it, laid out as RankRegion says).
  HostFifoTransport(const TopologyView& topo, bool shared);
  ~HostFifoTransport() override;

  int nRanks() const override { return geo_.nRanks; }
  void WakeAll() override;

  bool shared() const { return shared_; }
  const TransportGeometry& geometry() const { return geo_; }
  // Sets rank's region (shared transports; before any execution uses the rank).
  void AttachRegion(int rank, char* region);

  int nChannels() const { return geo_.nChannels; }
  // Bytes one slot holds: the largest step of any protocol (buffSizes[p] / kSteps).
  int64_t slotBytes() const { return geo_.slotBytes; }
  // Bytes one FIFO step holds under protocol `proto` (buffSizes[proto] / kSteps; the host uses
  // the Simple layout for every protocol, only the step size differs).
  int64_t stepBytes(int proto) const { return geo_.stepBytes[proto]; }
  // The connection carrying channel `channel` from rank `from` to rank `to` (in-process:
  // allocated on first use; thread-safe). Null when the channel is out of range, allocation
  // failed or the receiver's region is not attached.
  HostConn* Conn(int channel, int from, int to);
  // Slot 0 of that connection (kSteps slots of slotBytes() follow), from this process's own view
  // of the layout; null where Conn is.
  char* Slots(int channel, int from, int to);
  // Slot `step % kSteps` of `slots`.
  char* Slot(char* slots, uint64_t step) const {
    return slots + int64_t(step % kSteps) * geo_.slotBytes;
  }

  // Per rank and task slot, the reduction argument (PreMulSum scalar bits) the rank resolved for
  // this execution, so Direct can scale a peer's input by the peer's own scalar. A rank writes
  // its row before the barrier that opens a Direct kernel; peers read it after that barrier
  // (Direct runs only in-process).
  void PublishOpArgs(int rank, const std::vector<uint64_t>& args) { opArgs_[rank] = args; }
  uint64_t OpArg(int rank, size_t slot) const {
    return slot < opArgs_[rank].size() ? opArgs_[rank][slot] : 0;
  }

  // Bumps rank's doorbell and wakes its sleeping waiter, if any.
  void Ring(int rank);
  // The doorbell's sequence number, to sample before checking conditions.
  uint32_t Seq(int rank) const { return Bell(rank).seq.load(std::memory_order_seq_cst); }
  // Sleeps until rank's doorbell moves past `seen` or `timeoutNs` passes.
  void Wait(int rank, uint32_t seen, int64_t timeoutNs);

  // A rank reached over the network (ffi/cpu/net_links.h): its doorbell lives in this process's
  // proxy region and wakes the network proxy through the eventfd `fd` instead of a futex.
  void SetWakeFd(int rank, int fd) { wakeFds_[size_t(rank)] = fd; }
  // The network proxy announces (+1) and ends (-1) its sleep on rank's proxy doorbell.
  void AddProxyWaiter(int rank, int delta);

 private:
  Doorbell& Bell(int rank) const;

  TransportGeometry geo_;
  bool shared_ = false;
  std::vector<std::vector<uint64_t>> opArgs_;
  // In-process storage.
  std::unique_ptr<Doorbell[]> bells_;
  std::unique_ptr<std::atomic<HostConn*>[]> conns_;  // [channel][from][to]
  std::mutex allocMu_;
  std::vector<std::unique_ptr<char[]>> blocks_;
  // Shared storage: by rank, its region (not owned).
  std::vector<char*> regions_;
  // By rank: the eventfd its doorbell writes (ranks behind a socket), or -1.
  std::vector<int> wakeFds_;
};

}  // namespace host
}  // namespace jax_rccl
