// GPU communicators across hosts (ffi/gpu/comm.h): the records the ranks trade over the network,
// the windows of the ranks of other hosts and the network proxy that serves them.
//
// For rank `me` of this process and a rank `r` of another host, on every channel c the plan may
// use (the agreed count):
//   me -> r   the kernel fills its send slots in r's window (host memory the device maps), writes
//             each step's info word and posts tail there; the proxy ships the step and posts the
//             head it freed into me's region (SendHeadMine, device memory, by a copy);
//   r -> me   the proxy receives r's step, waits until me's kernel freed the slot (the head the
//             kernel reports in r's window), copies the step into me's region (the connection
//             r -> me, device memory) and posts tail there.
// hip/device_conn.h: ProxyWindowLayout lays the window out; hip/kernel_piece.h reads the bit that
// marks r's entry of the region table.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "ffi/comm/comm.h"
#include "ffi/gpu/comm.h"
#include "ffi/gpu/device_ctl.h"

namespace jax_rccl {
namespace gpu {
namespace {

// The network key's channel of the records' exchange (the proxy's connections use the plan's
// channels, all below it).
constexpr int kRecordChannel = (1 << 24) - 1;

// The proxy writes the receiving FIFOs and the senders' heads in device memory by copies on a
// stream of its own: a step's data, then its counter from a page-locked word, waited for.
class DeviceProxyMemory final : public comm::ProxyMemory {
 public:
  explicit DeviceProxyMemory(int ordinal) : copies_(ordinal) {}
  ~DeviceProxyMemory() override { PinnedFree(word_); }
  Status Write(char* dst, const char* src, size_t bytes) override {
    return copies_.ToDevice(dst, src, int64_t(bytes));
  }
  Status Post(uint64_t* counter, uint64_t value) override {
    if (word_ == nullptr) {
      JR_ASSIGN_OR_RETURN(void* w, PinnedAlloc(sizeof(uint64_t)));
      word_ = static_cast<uint64_t*>(w);
    }
    *word_ = value;  // the last copy from it was waited for
    JR_CHECK(copies_.ToDevice(counter, word_, sizeof(uint64_t)));
    return copies_.Wait();
  }
  StatusOr<uint64_t> Read(const uint64_t* counter) override {
    uint64_t v = 0;
    JR_CHECK(copies_.ToHost(&v, counter, sizeof(v)));
    return v;
  }
  StatusOr<char*> AllocStaging(size_t bytes) override {
    JR_ASSIGN_OR_RETURN(void* p, PinnedAlloc(int64_t(bytes)));
    return static_cast<char*>(p);
  }
  void FreeStaging(char* p) override { PinnedFree(p); }

 private:
  CopyStream copies_;
  uint64_t* word_ = nullptr;
};

uint64_t NetGroup(const std::vector<int64_t>& devices) {
  uint64_t h = 0x452821e638d01377ull;
  for (int64_t d : devices) h = comm::HashMix(h, static_cast<uint64_t>(d));
  return h;
}

}  // namespace

Status GpuComm::ExchangeRecords(int rank, const std::string& who, comm::Clock::time_point deadline,
                                std::vector<GpuRecord>* recs) {
  const int n = nRanks();
  const uint64_t group = NetGroup(devices_);
  if (net_ == nullptr) net_ = comm::MakeSocketNet(placement_.session, placement_.thisProcess);
  struct Peer {
    int rank;
    std::unique_ptr<comm::NetComm> send, recv;
    comm::NetRequest* sent = nullptr;
    comm::NetRequest* got = nullptr;
    bool sendDone = false, recvDone = false;
  };
  std::vector<Peer> peers;
  for (int r = 0; r < n; ++r) {
    if (!otherHost_[size_t(r)]) continue;
    peers.push_back(Peer{r, nullptr, nullptr});
    JR_CHECK(net_->Listen(comm::NetKey{group, kRecordChannel, r, rank}));
  }
  const GpuRecord& mine = (*recs)[size_t(rank)];
  auto timedOut = [&](int r, const Status& s) {
    return Status(Code::kTimeout,
                  detail::StrCat("jax_rccl '", who, "': rank ", rank, " of GPU group ", groupText_,
                                 " waited ", timeout_, " s (JAX_RCCL_TIMEOUT) for ", RankText(r),
                                 " to join the group (", s.message(), ")"));
  };
  // Every sending end first: a listener takes a connection before its process reaches the group.
  for (Peer& p : peers) {
    StatusOr<std::unique_ptr<comm::NetComm>> c =
        net_->Connect(comm::NetKey{group, kRecordChannel, rank, p.rank},
                      placement_.endpoint[size_t(p.rank)], deadline, RankText(p.rank));
    if (!c.ok()) return c.status().code() == Code::kTimeout ? timedOut(p.rank, c.status()) : c.status();
    p.send = c.take();
    JR_CHECK(p.send->Isend(&mine, sizeof(mine), 0, nullptr, &p.sent));
    JR_REQUIRE(p.sent != nullptr, Code::kInternal, "jax_rccl: a fresh network connection took no send");
  }
  for (Peer& p : peers) {
    StatusOr<std::unique_ptr<comm::NetComm>> c = net_->Accept(
        comm::NetKey{group, kRecordChannel, p.rank, rank}, deadline, RankText(p.rank));
    if (!c.ok()) return c.status().code() == Code::kTimeout ? timedOut(p.rank, c.status()) : c.status();
    p.recv = c.take();
    JR_CHECK(p.recv->Irecv(&(*recs)[size_t(p.rank)], sizeof(GpuRecord), nullptr, &p.got));
    JR_REQUIRE(p.got != nullptr, Code::kInternal, "jax_rccl: a fresh network connection took no receive");
  }
  for (bool all = false; !all;) {
    all = true;
    for (Peer& p : peers) {
      size_t bytes = 0;
      if (!p.sendDone) JR_CHECK(p.send->Test(p.sent, &p.sendDone, &bytes, nullptr));
      if (!p.recvDone) {
        uint64_t info = 0;
        JR_CHECK(p.recv->Test(p.got, &p.recvDone, &bytes, &info));
        JR_REQUIRE(!p.recvDone || bytes == sizeof(GpuRecord), Code::kInvalidArgument, "jax_rccl '",
                   who, "': ", RankText(p.rank), " sent a record of ", bytes, " bytes, not ",
                   sizeof(GpuRecord), " (do the processes run the same build?)");
      }
      all = all && p.sendDone && p.recvDone;
      if (!p.recvDone && comm::Clock::now() > deadline) {
        return timedOut(p.rank, Status(Code::kTimeout, "its record never came"));
      }
    }
    if (!all) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  // Closed in order: every peer has its record.
  for (bool open = true; open;) {
    open = false;
    for (Peer& p : peers) {
      if (p.send != nullptr && !p.send->CloseInOrder()) open = true;
      if (p.recv != nullptr && !p.recv->CloseInOrder()) open = true;
    }
    if (open && comm::Clock::now() > deadline) break;
    if (open) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return Status::Ok();
}

Status GpuComm::ConnectHosts(int rank, const std::string& who, comm::Clock::time_point deadline) {
  const int n = nRanks();
  const int channels = planTopo_.nChannels;
  char* region = static_cast<char*>(ranks_[size_t(rank)].region);
  windows_.resize(size_t(n));
  std::vector<comm::ProxyConnection> conns;
  for (int r = 0; r < n; ++r) {
    if (!otherHost_[size_t(r)]) continue;
    if (windows_[size_t(r)].host == nullptr) {
      StatusOr<Mapped> w = MappedAlloc(ProxyWindowLayout::Bytes(geo_, channels));
      if (!w.ok()) {
        return Status(w.status().code(),
                      detail::StrCat("jax_rccl '", who, "': the window of ", RankText(r), " (",
                                     ProxyWindowLayout::Bytes(geo_, channels),
                                     " bytes of host memory): ", w.status().message()));
      }
      windows_[size_t(r)] = w.value();
    }
    char* win = static_cast<char*>(windows_[size_t(r)].host);
    for (int c = 0; c < channels; ++c) {
      auto* wh = reinterpret_cast<ConnHeader*>(win + ProxyWindowLayout::HeaderOffset(geo_, c));
      auto* own = reinterpret_cast<ConnHeader*>(region + RegionLayout::HeaderOffset(geo_, c, r));
      comm::ProxyConnection send;
      send.channel = c;
      send.local = rank;
      send.remote = r;
      send.send = true;
      send.fifo.tail = &wh->tail;
      send.fifo.info = &wh->pad0[0];
      send.fifo.head = &own->pad1[kSendPad];  // SendHeadMine, device memory
      comm::ProxyConnection recv = send;
      recv.send = false;
      recv.fifo.info = nullptr;
      recv.fifo.tail = &own->tail;  // device memory
      recv.fifo.head = &wh->pad1[kSendPad];
      for (int p = 0; p < kNumProtocols; ++p) {
        send.fifo.slots[p] = win + ProxyWindowLayout::SlotOffset(geo_, c, p, 0);
        recv.fifo.slots[p] = region + RegionLayout::SlotOffset(geo_, c, r, p, 0);
        send.fifo.stepBytes[p] = recv.fifo.stepBytes[p] = geo_.stepBytes[p];
      }
      conns.push_back(send);
      conns.push_back(recv);
    }
  }
  if (net_ == nullptr) net_ = comm::MakeSocketNet(placement_.session, placement_.thisProcess);
  proxyMemory_ = std::make_unique<DeviceProxyMemory>(ordinal(rank));
  auto rankText = [this](int r) { return RankText(r); };
  proxy_ = std::make_unique<comm::NetProxy>(
      std::move(net_), proxyMemory_.get(), NetGroup(devices_), std::move(conns),
      placement_.endpoint, rankText, timeout_, [this, who](const std::string& reason) {
        (void)Fail(Status(Code::kTimeout,
                          detail::StrCat("jax_rccl '", who, "': GPU group ", groupText_, ": ",
                                         reason, "; the communicator is unusable from now on")));
      });
  JR_CHECK(proxy_->Connect(deadline));
  liveProxy_.store(proxy_.get(), std::memory_order_release);
  std::lock_guard<std::mutex> lock(mu_);
  for (int r = 0; r < n; ++r) {
    if (!otherHost_[size_t(r)] || published_[size_t(r)] != nullptr) continue;
    published_[size_t(r)] =
        reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(windows_[size_t(r)].dev) | kProxiedPeer);
    ++nPublished_;
  }
  return Status::Ok();
}

void GpuComm::StopProxy() {
  if (proxy_ != nullptr) proxy_->Stop();
}

}  // namespace gpu
}  // namespace jax_rccl
