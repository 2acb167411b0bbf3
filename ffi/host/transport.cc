// The host transport: FIFO connections and futex doorbells, in process memory or in shared
// memory (see transport_host.h).
#include <linux/futex.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <new>

#include "ffi/host/transport_host.h"

namespace jax_rccl {
namespace host {

namespace {

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeoutNs, bool shared) {
  struct timespec ts;
  ts.tv_sec = timeoutNs / 1000000000;
  ts.tv_nsec = timeoutNs % 1000000000;
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE,
          expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word, bool shared) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE,
          INT_MAX, nullptr, nullptr, 0);
}

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word is 32 bits");

}  // namespace

TransportGeometry GeometryOf(const TopologyView& topo) {
  TransportGeometry g;
  g.nRanks = topo.nRanks;
  g.nChannels = std::min(kMaxChannels, std::max({topo.nChannels, topo.p2pnChannels, 1}));
  int64_t step = 0;
  for (int p = 0; p < kNumProtos; ++p) {
    g.stepBytes[p] = topo.buffSizes[p] / kSteps;
    step = std::max<int64_t>(step, g.stepBytes[p]);
  }
  // Keep slots 64-byte aligned so the reduce loops see aligned data.
  g.slotBytes = std::max<int64_t>(64, (step + 63) / 64 * 64);
  return g;
}

void RankRegion::Init(char* region, const TransportGeometry& g) {
  for (int c = 0; c < g.nChannels; ++c) {
    for (int f = 0; f < g.nRanks; ++f) {
      const int64_t h = HeaderOffset(g, c, f);
      HostConn* conn = reinterpret_cast<HostConn*>(region + h);
      conn->slotBytes = g.slotBytes;
      conn->dataOffset = DataOffset(g, c, f) - h;
    }
  }
}

HostFifoTransport::HostFifoTransport(const TopologyView& topo) : HostFifoTransport(topo, false) {}

HostFifoTransport::HostFifoTransport(const TopologyView& topo, bool shared)
    : geo_(GeometryOf(topo)), shared_(shared) {
  opArgs_.resize(size_t(geo_.nRanks));
  wakeFds_.assign(size_t(geo_.nRanks), -1);
  if (shared_) {
    regions_.assign(size_t(geo_.nRanks), nullptr);
    return;
  }
  bells_.reset(new Doorbell[geo_.nRanks]);
  const size_t n = size_t(geo_.nChannels) * geo_.nRanks * geo_.nRanks;
  conns_.reset(new std::atomic<HostConn*>[n]);
  for (size_t i = 0; i < n; ++i) conns_[i].store(nullptr, std::memory_order_relaxed);
}

HostFifoTransport::~HostFifoTransport() = default;

void HostFifoTransport::AttachRegion(int rank, char* region) {
  if (shared_ && rank >= 0 && rank < geo_.nRanks) regions_[size_t(rank)] = region;
}

Doorbell& HostFifoTransport::Bell(int rank) const {
  if (shared_) return *reinterpret_cast<Doorbell*>(regions_[size_t(rank)]);
  return bells_[rank];
}

HostConn* HostFifoTransport::Conn(int channel, int from, int to) {
  const int n = geo_.nRanks;
  if (channel < 0 || channel >= geo_.nChannels || from < 0 || from >= n || to < 0 || to >= n) {
    return nullptr;
  }
  if (shared_) {
    char* region = regions_[size_t(to)];
    if (region == nullptr) return nullptr;
    return reinterpret_cast<HostConn*>(region + RankRegion::HeaderOffset(geo_, channel, from));
  }
  std::atomic<HostConn*>& cell = conns_[(size_t(channel) * n + from) * n + to];
  HostConn* c = cell.load(std::memory_order_acquire);
  if (c != nullptr) return c;
  std::lock_guard<std::mutex> lock(allocMu_);
  c = cell.load(std::memory_order_acquire);
  if (c != nullptr) return c;
  // One block: the header, then the slots (64-byte aligned), the slots at a fixed offset.
  constexpr int64_t kHeader = RankRegion::kConnHeaderBytes;
  auto block = std::unique_ptr<char[]>(
      new (std::nothrow) char[size_t(kHeader + geo_.slotBytes * kSteps + 64)]);
  if (!block) return nullptr;
  const uintptr_t p = reinterpret_cast<uintptr_t>(block.get());
  char* base = reinterpret_cast<char*>((p + 63) / 64 * 64);
  c = new (base) HostConn();
  c->slotBytes = geo_.slotBytes;
  c->dataOffset = kHeader;
  blocks_.push_back(std::move(block));
  cell.store(c, std::memory_order_release);
  return c;
}

char* HostFifoTransport::Slots(int channel, int from, int to) {
  HostConn* c = Conn(channel, from, to);
  if (c == nullptr) return nullptr;
  if (shared_) return regions_[size_t(to)] + RankRegion::DataOffset(geo_, channel, from);
  return reinterpret_cast<char*>(c) + RankRegion::kConnHeaderBytes;  // the heap block's layout
}

void HostFifoTransport::Ring(int rank) {
  Doorbell& b = Bell(rank);
  b.seq.fetch_add(1, std::memory_order_seq_cst);
  if (b.waiters.load(std::memory_order_seq_cst) != 0) {
    const int fd = wakeFds_[size_t(rank)];
    if (fd >= 0) {
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t k = write(fd, &one, sizeof(one));
    } else {
      FutexWakeAll(&b.seq, shared_);
    }
  }
}

void HostFifoTransport::AddProxyWaiter(int rank, int delta) {
  Bell(rank).waiters.fetch_add(uint32_t(delta), std::memory_order_seq_cst);
}

// Yields before sleeping: on a busy host the peer that will post usually runs within a few
// yields, and a waiter that never slept costs the poster no wake-up system call.
constexpr int kYieldsBeforeSleep = 64;

void HostFifoTransport::Wait(int rank, uint32_t seen, int64_t timeoutNs) {
  Doorbell& b = Bell(rank);
  for (int i = 0; i < kYieldsBeforeSleep; ++i) {
    sched_yield();
    if (b.seq.load(std::memory_order_acquire) != seen) return;
  }
  b.waiters.fetch_add(1, std::memory_order_seq_cst);
  if (b.seq.load(std::memory_order_seq_cst) == seen) FutexWait(&b.seq, seen, timeoutNs, shared_);
  b.waiters.fetch_sub(1, std::memory_order_seq_cst);
}

void HostFifoTransport::WakeAll() {
  for (int r = 0; r < geo_.nRanks; ++r) {
    if (shared_ && regions_[size_t(r)] == nullptr) continue;
    Doorbell& b = Bell(r);
    b.seq.fetch_add(1, std::memory_order_seq_cst);
    FutexWakeAll(&b.seq, shared_);
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

}  // namespace host
}  // namespace jax_rccl
