// The in-process host transport: FIFO connections in host memory and futex doorbells (see
// transport_host.h).
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <new>

#include "ffi/cpu/transport_host.h"

namespace jax_rccl {
namespace cpu {

namespace {

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeoutNs) {
  struct timespec ts;
  ts.tv_sec = timeoutNs / 1000000000;
  ts.tv_nsec = timeoutNs % 1000000000;
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr,
          0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word is 32 bits");

}  // namespace

HostFifoTransport::HostFifoTransport(const TopologyView& topo)
    : nRanks_(topo.nRanks),
      nChannels_(std::min(kMaxChannels, std::max({topo.nChannels, topo.p2pnChannels, 1}))) {
  int64_t step = 0;
  for (int p = 0; p < kNumProtos; ++p) {
    stepBytes_[p] = topo.buffSizes[p] / kSteps;
    step = std::max<int64_t>(step, stepBytes_[p]);
  }
  // Keep slots 64-byte aligned so the reduce loops see aligned data.
  slotBytes_ = std::max<int64_t>(64, (step + 63) / 64 * 64);
  bells_.reset(new Doorbell[nRanks_]);
  opArgs_.resize(size_t(nRanks_));
  const size_t n = size_t(nChannels_) * nRanks_ * nRanks_;
  conns_.reset(new std::atomic<HostConn*>[n]);
  for (size_t i = 0; i < n; ++i) conns_[i].store(nullptr, std::memory_order_relaxed);
}

HostFifoTransport::~HostFifoTransport() = default;

HostConn* HostFifoTransport::Conn(int channel, int from, int to) {
  if (channel < 0 || channel >= nChannels_ || from < 0 || from >= nRanks_ || to < 0 ||
      to >= nRanks_) {
    return nullptr;
  }
  std::atomic<HostConn*>& cell = conns_[(size_t(channel) * nRanks_ + from) * nRanks_ + to];
  HostConn* c = cell.load(std::memory_order_acquire);
  if (c != nullptr) return c;
  std::lock_guard<std::mutex> lock(allocMu_);
  c = cell.load(std::memory_order_acquire);
  if (c != nullptr) return c;
  auto conn = std::unique_ptr<HostConn>(new (std::nothrow) HostConn());
  auto buf = std::unique_ptr<char[]>(new (std::nothrow) char[size_t(slotBytes_) * kSteps + 64]);
  if (!conn || !buf) return nullptr;
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.get());
  conn->buffer = reinterpret_cast<char*>((p + 63) / 64 * 64);
  conn->slotBytes = slotBytes_;
  c = conn.get();
  owned_.push_back(std::move(conn));
  buffers_.push_back(std::move(buf));
  cell.store(c, std::memory_order_release);
  return c;
}

void HostFifoTransport::Ring(int rank) {
  Doorbell& b = bells_[rank];
  b.seq.fetch_add(1, std::memory_order_seq_cst);
  if (b.waiters.load(std::memory_order_seq_cst) != 0) FutexWakeAll(&b.seq);
}

void HostFifoTransport::Wait(int rank, uint32_t seen, int64_t timeoutNs) {
  Doorbell& b = bells_[rank];
  b.waiters.fetch_add(1, std::memory_order_seq_cst);
  if (b.seq.load(std::memory_order_seq_cst) == seen) FutexWait(&b.seq, seen, timeoutNs);
  b.waiters.fetch_sub(1, std::memory_order_seq_cst);
}

void HostFifoTransport::WakeAll() {
  for (int r = 0; r < nRanks_; ++r) {
    bells_[r].seq.fetch_add(1, std::memory_order_seq_cst);
    FutexWakeAll(&bells_[r].seq);
  }
}

StatusOr<std::unique_ptr<HostTransport>> MakeHostTransport(const TopologyView& topo) {
  JR_REQUIRE(topo.nRanks >= 1, Code::kInvalidArgument, "topology.nRanks must be >= 1, got ",
             topo.nRanks);
  for (int p = 0; p < kNumProtos; ++p) {
    JR_REQUIRE(topo.buffSizes[p] >= 0, Code::kInvalidArgument, "topology.buffSizes[", p,
               "] must be >= 0, got ", topo.buffSizes[p]);
  }
  return std::unique_ptr<HostTransport>(new HostFifoTransport(topo));
}

}  // namespace cpu
}  // namespace jax_rccl
