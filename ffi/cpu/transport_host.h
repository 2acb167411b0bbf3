// The in-process host transport (private to ffi/cpu/): per channel and directed pair of ranks a
// FIFO connection of kSteps slots, and per rank a doorbell that waiters sleep on.
//
// A connection has a `tail` (steps the sender filled) and a `head` (steps the receiver consumed),
// both monotonic 64-bit counters that persist across executions, like RCCL's connection step
// counters. The sender may fill step s when s - head < kSteps, writes slot s % kSteps, then
// publishes tail = s + 1 (release) and rings the receiver's doorbell; the receiver may consume
// step s when tail > s (acquire), reads the slot in place, then publishes head = s + 1 and rings
// the sender's doorbell. Each slot records the bytes written, which the receiver checks.
//
// Doorbells: a sequence number bumped on every post, and a futex waiters sleep on with a timeout
// (no busy spinning). A waiter samples the sequence before checking its conditions, so a post it
// missed changes the sequence and the futex wait returns at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ffi/cpu/executor.h"

namespace jax_rccl {
namespace cpu {

struct alignas(64) HostConn {
  std::atomic<uint64_t> tail{0};  // written by the sender
  char pad0[64 - sizeof(std::atomic<uint64_t>)];
  std::atomic<uint64_t> head{0};  // written by the receiver
  char pad1[64 - sizeof(std::atomic<uint64_t>)];
  int64_t slotSizes[kSteps] = {};  // bytes in each slot (written before tail is published)
  char* buffer = nullptr;          // kSteps slots of slotBytes
  int64_t slotBytes = 0;
  char* Slot(uint64_t step) const { return buffer + int64_t(step % kSteps) * slotBytes; }
};

struct alignas(64) Doorbell {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> waiters{0};
};

class HostFifoTransport final : public HostTransport {
 public:
  explicit HostFifoTransport(const TopologyView& topo);
  ~HostFifoTransport() override;

  int nRanks() const override { return nRanks_; }
  void WakeAll() override;

  int nChannels() const { return nChannels_; }
  // Bytes one slot holds: the largest step of any protocol (buffSizes[p] / kSteps).
  int64_t slotBytes() const { return slotBytes_; }
  // Bytes one FIFO step holds under protocol `proto` (buffSizes[proto] / kSteps; the host uses
  // the Simple layout for every protocol, only the step size differs).
  int64_t stepBytes(int proto) const { return stepBytes_[proto]; }
  // The connection carrying channel `channel` from rank `from` to rank `to` (allocated on first
  // use; thread-safe). Null when the channel is out of range or allocation failed.
  HostConn* Conn(int channel, int from, int to);

  // Per rank and task slot, the reduction argument (PreMulSum scalar bits) the rank resolved for
  // this execution, so Direct can scale a peer's input by the peer's own scalar. A rank writes
  // its row before the barrier that opens a Direct kernel; peers read it after that barrier.
  void PublishOpArgs(int rank, const std::vector<uint64_t>& args) { opArgs_[rank] = args; }
  uint64_t OpArg(int rank, size_t slot) const {
    return slot < opArgs_[rank].size() ? opArgs_[rank][slot] : 0;
  }

  // Bumps rank's doorbell and wakes its sleeping waiter, if any.
  void Ring(int rank);
  // The doorbell's sequence number, to sample before checking conditions.
  uint32_t Seq(int rank) const { return bells_[rank].seq.load(std::memory_order_seq_cst); }
  // Sleeps until rank's doorbell moves past `seen` or `timeoutNs` passes.
  void Wait(int rank, uint32_t seen, int64_t timeoutNs);

 private:
  int nRanks_;
  int nChannels_;
  int64_t slotBytes_;
  int64_t stepBytes_[kNumProtos];
  std::unique_ptr<Doorbell[]> bells_;
  std::vector<std::vector<uint64_t>> opArgs_;
  std::unique_ptr<std::atomic<HostConn*>[]> conns_;  // [channel][from][to]
  std::mutex allocMu_;
  std::vector<std::unique_ptr<HostConn>> owned_;
  std::vector<std::unique_ptr<char[]>> buffers_;
};

}  // namespace cpu
}  // namespace jax_rccl
