// GPU communicators across hosts (ffi/gpu/comm.h): the records the ranks trade over the network,
// the windows of the ranks of other hosts and the network proxy that serves them.
//
// For rank `me` of this process and a rank `r` of another host, r's window (host memory the device
// maps, hip/device_conn.h: ProxyWindowLayout) holds both directions of every channel the plan may
// use (the agreed count):
//   me -> r   the kernel fills a slot of direction 0, writes the step's info word and posts tail;
//             the proxy ships the step and posts the head it freed (direction 1's pad1[kSendPad],
//             where the kernel looks for room, as in its own region for a peer of this host);
//   r -> me   the proxy receives r's step into a slot of direction 1 the kernel freed (the head the
//             kernel reports in direction 0's pad1[kSendPad]), writes the step's info word (with
//             its call's tag, hip/kernel_check.h) into direction 1's pad0[step % kSteps] and posts
//             tail there.
// The proxy never touches device memory.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "ffi/comm/group.h"
#include "ffi/comm/notice.h"
#include "ffi/gpu/comm.h"
#include "ffi/gpu/device_ctl.h"

namespace jax_rccl {
namespace gpu {
namespace {

// The network key's channel of the records' exchange (the proxy's connections use the plan's
// channels, all below it).
constexpr int kRecordChannel = (1 << 24) - 1;
static_assert(comm::kNoticeChannel < kRecordChannel, "the notices' channel is not the records'");
// How long a failure notice may take to reach the other hosts, and how long a proxy whose
// connection was reset waits for the notice that says why.
constexpr int kNoticeSendMs = 1000;
constexpr int kNoticeWaitMs = 300;

}  // namespace

uint64_t NetGroupOf(const std::vector<int64_t>& devices) {
  uint64_t h = 0x452821e638d01377ull;
  for (int64_t d : devices) h = comm::HashMix(h, static_cast<uint64_t>(d));
  return h;
}

Status GpuComm::ExchangeRecords(int rank, const std::string& who, Clock::time_point deadline,
                                std::vector<GpuRecord>* recs) {
  const int n = nRanks();
  const uint64_t group = netGroup_;
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
    if (!c.ok())
      return c.status().code() == Code::kTimeout ? timedOut(p.rank, c.status()) : c.status();
    p.send = c.take();
    JR_CHECK(p.send->Isend(&mine, sizeof(mine), comm::NetInfo{}, nullptr, &p.sent));
    JR_REQUIRE(p.sent != nullptr, Code::kInternal,
               "jax_rccl: a fresh network connection took no send");
  }
  for (Peer& p : peers) {
    StatusOr<std::unique_ptr<comm::NetComm>> c =
        net_->Accept(comm::NetKey{group, kRecordChannel, p.rank, rank}, deadline, RankText(p.rank));
    if (!c.ok())
      return c.status().code() == Code::kTimeout ? timedOut(p.rank, c.status()) : c.status();
    p.recv = c.take();
    JR_CHECK(p.recv->Irecv(&(*recs)[size_t(p.rank)], sizeof(GpuRecord), nullptr, &p.got));
    JR_REQUIRE(p.got != nullptr, Code::kInternal,
               "jax_rccl: a fresh network connection took no receive");
  }
  for (bool all = false; !all;) {
    all = true;
    for (Peer& p : peers) {
      size_t bytes = 0;
      if (!p.sendDone) JR_CHECK(p.send->Test(p.sent, &p.sendDone, &bytes, nullptr));
      if (!p.recvDone) {
        JR_CHECK(p.recv->Test(p.got, &p.recvDone, &bytes, nullptr));
        JR_REQUIRE(!p.recvDone || bytes == sizeof(GpuRecord), Code::kInvalidArgument, "jax_rccl '",
                   who, "': ", RankText(p.rank), " sent a record of ", bytes, " bytes, not ",
                   sizeof(GpuRecord), " (do the processes run the same build?)");
      }
      all = all && p.sendDone && p.recvDone;
      if (failed_.load(std::memory_order_acquire)) return Failure();
      if (!p.recvDone && Clock::now() > deadline) {
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
    if (open && Clock::now() > deadline) break;
    if (open) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return Status::Ok();
}

Status GpuComm::ConnectHosts(int rank, const std::string& who, Clock::time_point deadline) {
  const int n = nRanks();
  const int channels = planTopo_.nChannels;
  const int64_t slotBytes = ProxyWindowLayout::SlotBytes(geo_);
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
      auto* out = reinterpret_cast<ConnHeader*>(win + ProxyWindowLayout::HeaderOffset(c, 0));
      auto* in = reinterpret_cast<ConnHeader*>(win + ProxyWindowLayout::HeaderOffset(c, 1));
      comm::ProxyConnection send;
      send.channel = c;
      send.local = rank;
      send.remote = r;
      send.send = true;
      send.fifo.tail = &out->tail;
      send.fifo.info = &out->pad0[0];
      send.fifo.head = &in->pad1[kSendPad];  // where the kernel looks for room (SendHeadMine)
      send.fifo.slots = win + ProxyWindowLayout::SlotOffset(geo_, c, 0, 0);
      send.fifo.slotBytes = slotBytes;
      comm::ProxyConnection recv = send;
      recv.send = false;
      recv.fifo.info = &in->pad0[0];  // each step's info word, its call's tag for the kernel
      recv.fifo.tail = &in->tail;
      recv.fifo.head = &out->pad1[kSendPad];  // where the kernel reports it (HeadAtSender)
      recv.fifo.slots = win + ProxyWindowLayout::SlotOffset(geo_, c, 1, 0);
      conns.push_back(send);
      conns.push_back(recv);
    }
  }
  auto rankText = [this](int r) { return RankText(r); };
  std::unique_ptr<comm::NetProxy> proxy = std::make_unique<comm::NetProxy>(
      std::move(net_), netGroup_, std::move(conns), placement_.endpoint, rankText, timeout_,
      [this, who](const std::string& reason) {
        // A peer that failed first posted why before it reset its connections: its notice says
        // more than the reset (which may arrive first), so it has a moment to come.
        Status notice = AwaitNotice(kNoticeWaitMs);
        if (!notice.ok()) {
          (void)Fail(std::move(notice), false);
          return;
        }
        (void)Fail(Status(Code::kTimeout,
                          detail::StrCat("jax_rccl '", who, "': GPU group ", groupText_, ": ",
                                         reason, "; the communicator is unusable from now on")),
                   /*tell=*/true, /*primary=*/false);
      });
  proxy->TraceTo(netTrace_);
  {
    // Held while connecting: a process that exits meanwhile stops the proxy after it connected.
    std::lock_guard<std::mutex> lock(proxyMu_);
    JR_REQUIRE(!proxiesStopped_, Code::kInvalidUsage, "jax_rccl '", who,
               "': the process is exiting (its network proxies were stopped)");
    proxy_ = std::move(proxy);
    JR_CHECK(proxy_->Connect(deadline));
    liveProxy_.store(proxy_.get(), std::memory_order_release);
  }
  if (failed_.load(std::memory_order_acquire)) {
    // Failed while connecting: the ranks of other hosts learn it from their connections.
    proxy_->Abort(Failure().message());
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (int r = 0; r < n; ++r) {
    if (!otherHost_[size_t(r)] || published_[size_t(r)] != nullptr) continue;
    published_[size_t(r)] = reinterpret_cast<void*>(
        reinterpret_cast<uintptr_t>(windows_[size_t(r)].dev) | kProxiedPeer);
    ++nPublished_;
  }
  return Status::Ok();
}

void GpuComm::TellOtherHosts(const Status& s, bool primary, int process) {
  std::vector<uint8_t> reach = otherHost_;
  for (int r = 0; r < nRanks() && process >= 0; ++r) {
    reach[size_t(r)] = reach[size_t(r)] && placement_.process[size_t(r)] == process;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(kNoticeSendMs);
  (void)comm::SendNotices(netGroup_, placement_.thisProcess, placement_.session,
                          comm::NoticePeersOf(placement_, reach), s, primary, deadline);
}

Status GpuComm::NoticeFromOtherHosts(int* primaryFrom) const {
  Status s = comm::TakeNotice(netGroup_, placement_.thisProcess, 0.5, nullptr, primaryFrom);
  if (s.ok()) return s;
  return Status(s.code(), detail::StrCat("jax_rccl: another process of GPU group ", groupText_,
                                         " reported its communicator failed: ", s.message()));
}

Status GpuComm::AwaitNotice(int ms, int from) const {
  Status s = from >= 0 ? comm::AwaitNoticeFrom(netGroup_, placement_.thisProcess, from, ms)
                       : comm::AwaitNotice(netGroup_, placement_.thisProcess, ms);
  if (s.ok()) return s;
  return Status(s.code(), detail::StrCat("jax_rccl: another process of GPU group ", groupText_,
                                         " reported its communicator failed: ", s.message()));
}

void GpuComm::StopProxy() {
  std::lock_guard<std::mutex> lock(proxyMu_);
  proxiesStopped_ = true;
  if (proxy_ != nullptr) proxy_->Stop();
}

}  // namespace gpu
}  // namespace jax_rccl
