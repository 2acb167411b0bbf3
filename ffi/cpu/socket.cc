// TCP links between processes and their progress thread (see socket.h).
#include "ffi/cpu/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "ffi/core/thread_name.h"

namespace jax_rccl {
namespace cpu {

namespace {

constexpr uint32_t kFrameData = 0x6a720001u;
constexpr uint32_t kFrameFail = 0x6a720003u;    // payload: the sender's failure, as text
constexpr uint32_t kFrameQuery = 0x6a720004u;   // no payload: "how many calls have you started?"
constexpr uint32_t kFrameStatus = 0x6a720005u;  // payload: StatusAnswer, the call's text
constexpr int64_t kMaxControlBytes = 4096;

struct FrameHeader {
  uint32_t type;
  int32_t channel, from, to;
  uint64_t step;
  int64_t bytes;
  StepTag tag;  // a data step's tag (transport_host.h), copied into the receiver's FIFO slot
};
static_assert(sizeof(FrameHeader) == 64, "frame header");

struct StatusAnswer {
  int64_t rank;
  uint64_t entered;
  uint64_t call;
};

}  // namespace

// One TCP connection: channel `channel` between local rank `local` and remote rank `remote`.
struct SocketLink {
  int channel = 0, local = 0, remote = 0;
  int fd = -1;
  HostConn* out = nullptr;   // Conn(channel, local, remote): the send proxy FIFO
  HostConn* in = nullptr;    // Conn(channel, remote, local): filled from the socket
  char* outSlots = nullptr;  // their slots (HostFifoTransport::Slots)
  char* inSlots = nullptr;
  // send state
  uint64_t sent = 0;  // steps of `out` fully on the wire
  FrameHeader sendHdr{};
  int64_t sendDone = -1;  // bytes of the current frame written (-1: none started)
  bool sendingControl = false;
  std::string control;  // the control frame being written (header + payload)
  std::deque<std::string> controlQueue;
  // recv state
  uint64_t received = 0;  // steps of `in` filled
  FrameHeader recvHdr{};
  int64_t hdrGot = 0;
  int64_t payloadGot = 0;
  std::string controlIn;             // a control frame's payload being read
  bool dead = false;                 // closed or failed: not polled any more
  bool sendDead = false;             // a send failed (the peer's end went away): only read now
  bool closedWithoutNotice = false;  // the peer's end closed before any failure notice from it
};

SocketLinks::SocketLinks(std::string session, uint64_t group, const GroupPlacement& placement,
                         std::vector<uint8_t> socketRank, std::vector<uint8_t> ownRegion,
                         std::vector<std::string> endpoints, HostFifoTransport* transport,
                         std::function<std::string(int)> rankString)
    : session_(std::move(session)),
      group_(group),
      placement_(placement),
      socketRank_(std::move(socketRank)),
      ownRegion_(std::move(ownRegion)),
      endpoints_(std::move(endpoints)),
      tr_(transport),
      rankString_(std::move(rankString)),
      geo_(transport->geometry()) {
  regionBytes_ = RankRegion::Bytes(geo_);
  regions_.assign(size_t(geo_.nRanks), nullptr);
  noticeFrom_.assign(size_t(geo_.nRanks), 0);
}

SocketLinks::~SocketLinks() {
  stop_.store(true);
  Wake();
  if (thread_.joinable()) thread_.join();
  for (auto& l : links_) {
    if (l->fd >= 0) close(l->fd);
  }
  if (wakeFd_ >= 0) close(wakeFd_);
  for (char* r : regions_) {
    if (r != nullptr) munmap(r, size_t(regionBytes_));
  }
}

Status SocketLinks::AllocateRegions() {
  for (int r = 0; r < geo_.nRanks; ++r) {
    if (!ownRegion_[size_t(r)] || regions_[size_t(r)] != nullptr) continue;
    // Anonymous memory: zeroed, and only the pages the FIFOs touch materialize.
    void* p = mmap(nullptr, size_t(regionBytes_), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    JR_REQUIRE(p != MAP_FAILED, Code::kSystem, "jax_rccl: cannot map ", regionBytes_,
               " bytes for the FIFOs of ", rankString_(r), ": ", ErrnoText(errno));
    RankRegion::Init(static_cast<char*>(p), geo_);
    regions_[size_t(r)] = static_cast<char*>(p);
  }
  return Status::Ok();
}

void SocketLinks::Wake() {
  if (wakeFd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t k = write(wakeFd_, &one, sizeof(one));
  }
}

void SocketLinks::SetFailed(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load()) return;
    reason_ = reason;
    failed_.store(true, std::memory_order_release);
  }
  // Wake the local ranks: they stop as soon as they cannot progress.
  for (int r = 0; r < geo_.nRanks; ++r) {
    if (placement_.local[size_t(r)]) tr_->Ring(r);
  }
}

bool SocketLinks::Failed(std::string* reason) const {
  if (!failed_.load(std::memory_order_acquire)) return false;
  if (reason != nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    *reason = reason_;
  }
  return true;
}

void SocketLinks::QueueControl(SocketLink& lk, uint32_t type, const std::string& payload) {
  FrameHeader h{};
  h.type = type;
  h.channel = lk.channel;
  h.from = lk.local;
  h.to = lk.remote;
  h.bytes = int64_t(payload.size());
  std::string frame(reinterpret_cast<const char*>(&h), sizeof(h));
  frame += payload;
  lk.controlQueue.push_back(std::move(frame));
}

void SocketLinks::Shutdown(const std::string& reason) {
  if (!reason.empty() && thread_.joinable() && !stop_.load()) {
    // The notice goes on every connection (whichever a peer reads first carries it, ahead of
    // the end of the stream); the progress thread writes it at a frame boundary.
    const std::string text = reason.substr(0, size_t(kMaxControlBytes));
    int64_t queued = 0;
    const int64_t before = controlSent_.load();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& lk : links_) {
        if (lk->dead || lk->sendDead) continue;
        QueueControl(*lk, kFrameFail, text);
        ++queued;
      }
    }
    Wake();
    const auto until = Clock::now() + std::chrono::milliseconds(500);
    while (controlSent_.load() - before < queued && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  for (auto& l : links_) {
    if (l->fd >= 0) shutdown(l->fd, SHUT_RDWR);
  }
  stop_.store(true);
  Wake();
}

void SocketLinks::QueryPeers(std::chrono::milliseconds wait) {
  const int n = geo_.nRanks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    answered_.assign(size_t(n), 0);
    peerEntered_.assign(size_t(n), 0);
    peerCall_.assign(size_t(n), 0);
    peerText_.assign(size_t(n), std::string());
    std::vector<uint8_t> asked(size_t(n), 0);
    for (auto& lk : links_) {
      if (lk->dead || asked[size_t(lk->remote)]) continue;
      asked[size_t(lk->remote)] = 1;
      QueueControl(*lk, kFrameQuery, std::string());
    }
    for (auto& lk : links_) {
      if (lk->dead && lk->closedWithoutNotice) answered_[size_t(lk->remote)] = -1;
    }
  }
  Wake();
  const auto until = Clock::now() + wait;
  while (Clock::now() < until) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      bool all = true;
      for (int r = 0; r < n; ++r) all = all && (!socketRank_[size_t(r)] || answered_[size_t(r)]);
      if (all) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

int SocketLinks::PeerStatus(int rank, uint64_t* entered, uint64_t* call, std::string* text) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (size_t(rank) >= answered_.size()) return 0;
  *entered = peerEntered_[size_t(rank)];
  *call = peerCall_[size_t(rank)];
  *text = peerText_[size_t(rank)];
  return answered_[size_t(rank)];
}

Status SocketLinks::Connect(Clock::time_point deadline, const std::atomic<bool>* aborted,
                            const std::string& name, double timeout) {
  JR_REQUIRE(links_.empty(), Code::kInternal, "jax_rccl: socket links connected twice");
  JR_REQUIRE(SocketListenerPort() > 0, Code::kInvalidUsage, "jax_rccl: '", name,
             "': this process reaches ranks over sockets but has no socket listener (the "
             "bootstrap starts it when the run needs sockets: _jax_rccl.socket_listen)");
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  JR_REQUIRE(wakeFd_ >= 0, Code::kSystem, "jax_rccl: cannot create an eventfd: ", ErrnoText(errno));
  const int n = geo_.nRanks;
  for (int c = 0; c < geo_.nChannels; ++c) {
    for (int l = 0; l < n; ++l) {
      if (!placement_.local[size_t(l)]) continue;
      for (int r = 0; r < n; ++r) {
        if (!socketRank_[size_t(r)]) continue;
        auto link = std::make_unique<SocketLink>();
        link->channel = c;
        link->local = l;
        link->remote = r;
        link->out = tr_->Conn(c, l, r);
        link->in = tr_->Conn(c, r, l);
        link->outSlots = tr_->Slots(c, l, r);
        link->inSlots = tr_->Slots(c, r, l);
        JR_REQUIRE(link->out != nullptr && link->in != nullptr && link->outSlots != nullptr &&
                       link->inSlots != nullptr,
                   Code::kInternal, "jax_rccl: no FIFO for the socket link of channel ", c,
                   " between ranks ", l, " and ", r);
        links_.push_back(std::move(link));
      }
    }
  }
  // The lower rank of a pair connects (the peer's listener queues the connection even before its
  // process reaches this group); then the higher rank's connections are claimed.
  for (auto& lk : links_) {
    if (lk->local > lk->remote) continue;
    const std::string& ep = endpoints_[size_t(lk->remote)];
    StatusOr<int> fd =
        DialListener(ep, LinkKey(group_, lk->channel, lk->local, lk->remote),
                     placement_.thisProcess, session_, deadline, aborted, rankString_(lk->remote));
    if (!fd.ok() && fd.status().code() == Code::kTimeout) {
      JR_FAIL(Code::kTimeout, "jax_rccl: '", name, "' timed out after ", timeout,
              " s (JAX_RCCL_TIMEOUT): ", rankString_(lk->remote), " did not answer (",
              fd.status().message(), "; channel ", lk->channel, ", from rank ", lk->local, ")");
    }
    JR_ASSIGN_OR_RETURN(lk->fd, std::move(fd));
  }
  for (auto& lk : links_) {
    if (lk->local < lk->remote) continue;
    const int fd =
        AcceptFor(LinkKey(group_, lk->channel, lk->remote, lk->local), deadline, aborted);
    if (fd < 0) {
      JR_FAIL(Code::kTimeout, "jax_rccl: '", name, "' timed out after ", timeout,
              " s (JAX_RCCL_TIMEOUT): ", rankString_(lk->remote),
              " never arrived (it never connected to this process for channel ", lk->channel,
              ", rank ", lk->local, ": did process ", placement_.process[size_t(lk->remote)],
              " make this call?)");
    }
    lk->fd = fd;
  }
  for (auto& lk : links_) {
    JR_CHECK(PrepareStream(lk->fd));
  }
  for (int r = 0; r < n; ++r) {
    if (socketRank_[size_t(r)]) tr_->SetWakeFd(r, wakeFd_);
  }
  thread_ = std::thread([this]() {
    NameThisThread("jrccl socket");
    ProgressLoop();
  });
  return Status::Ok();
}

bool SocketLinks::PumpSend(SocketLink& lk, bool* wantWrite) {
  bool progressed = false;
  if (lk.sendDead) return false;
  while (true) {
    if (lk.sendDone < 0) {  // start a frame: a control frame first, then the next data step
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!lk.controlQueue.empty()) {
          lk.control = std::move(lk.controlQueue.front());
          lk.controlQueue.pop_front();
          lk.sendingControl = true;
          lk.sendDone = 0;
        }
      }
      if (lk.sendDone < 0) {
        // After a failure only control frames (the notice) go out.
        if (failed_.load(std::memory_order_acquire)) return progressed;
        if (lk.out->tail.load(std::memory_order_acquire) <= lk.sent) return progressed;
        lk.sendHdr.type = kFrameData;
        lk.sendHdr.channel = lk.channel;
        lk.sendHdr.from = lk.local;
        lk.sendHdr.to = lk.remote;
        lk.sendHdr.step = lk.sent;
        lk.sendHdr.bytes = lk.out->slotSizes[lk.sent % kSteps];
        lk.sendHdr.tag = lk.out->tags[lk.sent % kSteps];
        lk.sendingControl = false;
        lk.sendDone = 0;
      }
    }
    ssize_t k;
    int64_t total;
    if (lk.sendingControl) {
      total = int64_t(lk.control.size());
      k = send(lk.fd, lk.control.data() + lk.sendDone, size_t(total - lk.sendDone),
               MSG_NOSIGNAL | MSG_DONTWAIT);
    } else {
      const int64_t hdr = sizeof(FrameHeader);
      total = hdr + lk.sendHdr.bytes;
      struct iovec iov[2];
      int niov = 0;
      if (lk.sendDone < hdr) {
        iov[niov].iov_base = reinterpret_cast<char*>(&lk.sendHdr) + lk.sendDone;
        iov[niov].iov_len = size_t(hdr - lk.sendDone);
        ++niov;
      }
      const int64_t pdone = std::max<int64_t>(0, lk.sendDone - hdr);
      if (lk.sendHdr.bytes > pdone) {
        iov[niov].iov_base = tr_->Slot(lk.outSlots, lk.sent) + pdone;
        iov[niov].iov_len = size_t(lk.sendHdr.bytes - pdone);
        ++niov;
      }
      struct msghdr msg;
      std::memset(&msg, 0, sizeof(msg));
      msg.msg_iov = iov;
      msg.msg_iovlen = size_t(niov);
      k = niov ? sendmsg(lk.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) : 0;
    }
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *wantWrite = true;
        return progressed;
      }
      if (errno == EINTR) continue;
      // The peer's end went away. Its process may have failed and sent a notice that is still
      // unread (on this connection, ahead of the end of its stream, or on another): the receive
      // side stays read, and the loss is reported as a closed receive is, after a grace period.
      lk.sendDead = true;
      PeerGone(lk, detail::StrCat(rankString_(lk.remote), " went away (the socket to it at ",
                                  endpoints_[size_t(lk.remote)], ", channel ", lk.channel,
                                  ", failed while sending: ", ErrnoText(errno),
                                  "; the process exited or its communicator failed)"));
      return progressed;
    }
    lk.sendDone += k;
    progressed = progressed || k > 0;
    if (lk.sendDone < total) continue;
    lk.sendDone = -1;
    if (lk.sendingControl) {
      controlSent_.fetch_add(1);
    } else {
      lk.sent += 1;
      lk.out->head.store(lk.sent, std::memory_order_release);
      tr_->Ring(lk.local);
      framesSent_.fetch_add(1, std::memory_order_relaxed);
    }
    progressed = true;
  }
}

void SocketLinks::PeerGone(SocketLink& lk, std::string reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!noticeFrom_[size_t(lk.remote)]) {
    // No failure notice came first: the process is gone (a communicator that fails sends one).
    lk.closedWithoutNotice = true;
    if (size_t(lk.remote) < answered_.size()) answered_[size_t(lk.remote)] = -1;
  }
  if (failed_.load() || !eofReason_.empty()) return;
  // Reported after a grace period (ProgressLoop): a notice may still come on another connection
  // of that process.
  eofAt_ = Clock::now();
  eofReason_ = std::move(reason);
}

bool SocketLinks::PumpRecv(SocketLink& lk, bool* wantRead) {
  bool progressed = false;
  const int64_t hdr = sizeof(FrameHeader);
  auto closed = [&](ssize_t k) {
    const int e = errno;
    lk.dead = true;
    PeerGone(lk, k == 0 ? detail::StrCat(rankString_(lk.remote), " exited (its connection at ",
                                         endpoints_[size_t(lk.remote)], ", channel ", lk.channel,
                                         ", closed without a failure notice)")
                        : detail::StrCat(rankString_(lk.remote), " exited (its connection at ",
                                         endpoints_[size_t(lk.remote)], ", channel ", lk.channel,
                                         ", failed: ", ErrnoText(e), ")"));
  };
  // Reads into dst[*got, want) without blocking: true once complete; false when the socket has
  // nothing more now (*wantRead) or closed or failed (reported).
  auto readInto = [&](char* dst, int64_t want, int64_t* got) {
    while (*got < want) {
      const ssize_t k = recv(lk.fd, dst + *got, size_t(want - *got), MSG_DONTWAIT);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        *wantRead = true;
        return false;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        closed(k);
        return false;
      }
      *got += k;
      progressed = true;
    }
    return true;
  };
  while (!lk.dead) {
    if (lk.hdrGot < hdr) {
      if (!readInto(reinterpret_cast<char*>(&lk.recvHdr), hdr, &lk.hdrGot)) break;
      const FrameHeader& h = lk.recvHdr;
      const bool okControl = (h.type == kFrameFail && h.bytes > 0 && h.bytes <= kMaxControlBytes) ||
                             (h.type == kFrameQuery && h.bytes == 0) ||
                             (h.type == kFrameStatus && h.bytes >= int64_t(sizeof(StatusAnswer)) &&
                              h.bytes <= kMaxControlBytes);
      const bool okData = h.type == kFrameData && h.channel == lk.channel && h.from == lk.remote &&
                          h.to == lk.local && h.step == lk.received && h.bytes >= 0 &&
                          h.bytes <= tr_->slotBytes();
      if (!okControl && !okData) {
        lk.dead = true;
        SetFailed(detail::StrCat("a malformed frame arrived from ", rankString_(lk.remote),
                                 " (channel ", lk.channel, ": type ", h.type, ", step ", h.step,
                                 " where ", lk.received, " was due, ", h.bytes, " bytes)"));
        break;
      }
      lk.payloadGot = 0;
      if (okControl) lk.controlIn.assign(size_t(h.bytes), '\0');
    }
    const FrameHeader& h = lk.recvHdr;
    if (h.type == kFrameData && lk.payloadGot == 0 && entered_ != nullptr && calls_ != nullptr &&
        !failed_.load()) {
      // A step of another call at the number the local rank runs now: the ranks ran different
      // calls (the rank itself may be blocked elsewhere and never read this step).
      const uint64_t e1 = entered_[lk.local].load(std::memory_order_acquire);
      const uint64_t call = calls_[lk.local].load(std::memory_order_acquire);
      const uint64_t e2 = entered_[lk.local].load(std::memory_order_acquire);
      if (e1 == e2 && e1 > 0 && h.tag.seq + 1 == e1 && h.tag.call != call && h.tag.call != 0) {
        SetFailed(detail::StrCat("mismatched calls: ", rankString_(lk.remote),
                                 " sent a step of its ", StepTagString(h.tag), " where ",
                                 rankString_(lk.local), " runs its ",
                                 callText_ ? callText_(lk.local) : std::string("call"),
                                 " (the processes ran different collectives at this point, "
                                 "or the same ones in a different order)"));
      }
    }
    if (h.type == kFrameData) {
      // Only into a free slot: a full FIFO leaves the bytes in the socket (TCP holds the sender).
      if (lk.received - lk.in->head.load(std::memory_order_acquire) >= uint64_t(kSteps)) break;
      if (!readInto(tr_->Slot(lk.inSlots, lk.received), h.bytes, &lk.payloadGot)) break;
      lk.in->slotSizes[lk.received % kSteps] = h.bytes;
      lk.in->tags[lk.received % kSteps] = h.tag;
      lk.received += 1;
      lk.in->tail.store(lk.received, std::memory_order_release);
      tr_->Ring(lk.local);
      framesReceived_.fetch_add(1, std::memory_order_relaxed);
    } else {
      if (!readInto(&lk.controlIn[0], h.bytes, &lk.payloadGot)) break;
      std::lock_guard<std::mutex> lock(mu_);
      if (h.type == kFrameFail) {
        noticeFrom_[size_t(lk.remote)] = 1;
        if (!failed_.load() && reasonPending_.empty()) {
          reasonPending_ = detail::StrCat("process ", placement_.process[size_t(lk.remote)],
                                          " reported its communicator failed: ", lk.controlIn);
        }
      } else if (h.type == kFrameQuery) {
        StatusAnswer a{lk.local,
                       entered_ != nullptr ? entered_[lk.local].load(std::memory_order_acquire) : 0,
                       calls_ != nullptr ? calls_[lk.local].load(std::memory_order_acquire) : 0};
        std::string answer(reinterpret_cast<const char*>(&a), sizeof(a));
        if (callText_ && a.entered > 0) {
          answer += callText_(lk.local).substr(0, size_t(kMaxControlBytes) - sizeof(a));
        }
        QueueControl(lk, kFrameStatus, answer);
      } else if (size_t(lk.remote) < answered_.size()) {
        StatusAnswer a;
        std::memcpy(&a, lk.controlIn.data(), sizeof(a));
        answered_[size_t(lk.remote)] = 1;
        peerEntered_[size_t(lk.remote)] = a.entered;
        peerCall_[size_t(lk.remote)] = a.call;
        peerText_[size_t(lk.remote)] = lk.controlIn.substr(sizeof(a));
      }
    }
    lk.hdrGot = 0;
    progressed = true;
  }
  if (!reasonPending_.empty()) {  // reported outside the lock (SetFailed takes it)
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      why.swap(reasonPending_);
    }
    if (!why.empty()) SetFailed(why);
  }
  return progressed;
}

void SocketLinks::ProgressLoop() {
  std::vector<int> proxies;
  for (int r = 0; r < geo_.nRanks; ++r) {
    if (socketRank_[size_t(r)]) proxies.push_back(r);
  }
  std::vector<uint32_t> seen(proxies.size());
  std::vector<struct pollfd> pfds;
  // Runs until the links shut down: after a failure it still writes the failure notice and
  // answers status queries.
  while (!stop_.load(std::memory_order_acquire)) {
    for (size_t i = 0; i < proxies.size(); ++i) seen[i] = tr_->Seq(proxies[i]);
    bool progressed = false;
    pfds.clear();
    pfds.push_back({wakeFd_, POLLIN, 0});
    for (auto& lk : links_) {
      if (lk->dead) continue;
      bool wantWrite = false, wantRead = false;
      progressed = PumpSend(*lk, &wantWrite) || progressed;
      progressed = PumpRecv(*lk, &wantRead) || progressed;
      short ev = 0;
      if (wantRead) ev |= POLLIN;
      if (wantWrite) ev |= POLLOUT;
      if (ev && !lk->dead) pfds.push_back({lk->fd, ev, 0});
    }
    {
      std::string eof;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!eofReason_.empty() && Clock::now() - eofAt_ > std::chrono::milliseconds(300)) {
          eof.swap(eofReason_);
        }
      }
      if (!eof.empty()) SetFailed(eof);
    }
    if (progressed) continue;
    // Sleep until a socket is ready or a local rank rings a proxy doorbell (the transport writes
    // the eventfd while `waiters` is set). A ring between the sample above and here changed the
    // sequence: no sleep then.
    for (int r : proxies) tr_->AddProxyWaiter(r, 1);
    bool changed = false;
    for (size_t i = 0; i < proxies.size(); ++i)
      changed = changed || tr_->Seq(proxies[i]) != seen[i];
    if (!changed) poll(pfds.data(), nfds_t(pfds.size()), 50);
    for (int r : proxies) tr_->AddProxyWaiter(r, -1);
    uint64_t drain;
    while (read(wakeFd_, &drain, sizeof(drain)) > 0) {
    }
  }
}

bool SocketLinks::WaitDrained(int rank, Clock::time_point deadline) {
  while (true) {
    const uint32_t seen = tr_->Seq(rank);
    bool drained = true;
    for (auto& lk : links_) {
      if (lk->local != rank) continue;
      if (lk->out->head.load(std::memory_order_acquire) <
          lk->out->tail.load(std::memory_order_acquire)) {
        drained = false;
        break;
      }
    }
    if (drained) return true;
    if (failed_.load() || Clock::now() >= deadline) return false;
    tr_->Wait(rank, seen, 5000000);
  }
}

}  // namespace cpu
}  // namespace jax_rccl
