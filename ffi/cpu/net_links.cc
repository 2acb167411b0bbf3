// The CPU runtime's network links (net_links.h).
#include "ffi/cpu/net_links.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <system_error>
#include <thread>

#include "ffi/comm/socket_listen.h"

namespace jax_rccl {
namespace cpu {
namespace {

using host::Clock;
using host::HostConn;
using host::RankRegion;
using host::StepTag;

// The listener's channel of status queries (LinkKey (group, kStatusChannel, asking rank, asked
// rank)); the network's own channels and the notices' (notice.h) are apart from it.
constexpr int kStatusChannel = (1 << 24) - 3;
static_assert(kStatusChannel != comm::kNoticeChannel, "a channel of its own");

// A status answer: the asked rank's counters, then the text of its call.
struct StatusAnswer {
  int64_t rank;
  uint64_t entered;
  uint64_t call;
};

// How long a peer whose connection failed gets for its failure notice to arrive.
constexpr int kNoticeGraceMs = 300;

static_assert(sizeof(StepTag) == comm::kProxyTagBytes, "a step's tag travels as NetInfo's tag");
static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t) &&
                  sizeof(int64_t) == sizeof(uint64_t),
              "the proxy reads the FIFO counters and sizes as words");

uint64_t* Word(std::atomic<uint64_t>* a) {
  return reinterpret_cast<uint64_t*>(a);
}

}  // namespace

NetLinks::NetLinks(uint64_t group, const comm::GroupPlacement& placement,
                   std::vector<uint8_t> netRank, std::vector<uint8_t> ownRegion,
                   std::vector<std::string> endpoints, host::HostFifoTransport* transport,
                   std::function<std::string(int)> rankString, comm::NetOptions net)
    : group_(group),
      placement_(placement),
      netRank_(std::move(netRank)),
      ownRegion_(std::move(ownRegion)),
      endpoints_(std::move(endpoints)),
      tr_(transport),
      rankString_(std::move(rankString)),
      netOptions_(std::move(net)),
      geo_(transport->geometry()) {
  regionBytes_ = RankRegion::Bytes(geo_);
  regions_.assign(size_t(geo_.nRanks), nullptr);
}

NetLinks::~NetLinks() {
  answering_.reset();  // no answer runs past here
  if (proxy_ != nullptr) {
    // A failure was told when it happened; going away tells nothing more.
    const bool failed = failed_.load();
    shut_.store(true);
    if (failed) proxy_->Abort("the communicator went away");
    proxy_->Stop();
    proxy_.reset();
  }
  if (wakeFd_ >= 0) close(wakeFd_);
  for (char* r : regions_) {
    if (r != nullptr) munmap(r, size_t(regionBytes_));
  }
}

Status NetLinks::AllocateRegions() {
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

void NetLinks::SetEnteredSource(const std::atomic<uint64_t>* entered,
                                const std::atomic<uint64_t>* calls,
                                std::function<std::string(int)> callText) {
  entered_ = entered;
  calls_ = calls;
  callText_ = std::move(callText);
}

std::string NetLinks::Answer(int rank) const {
  if (rank < 0 || rank >= geo_.nRanks || !placement_.local[size_t(rank)]) return std::string();
  StatusAnswer a{rank, entered_ != nullptr ? entered_[rank].load(std::memory_order_acquire) : 0,
                 calls_ != nullptr ? calls_[rank].load(std::memory_order_acquire) : 0};
  std::string out(reinterpret_cast<const char*>(&a), sizeof(a));
  if (callText_ && a.entered > 0) out += callText_(rank);
  return out;
}

Status NetLinks::Connect(Clock::time_point deadline, const std::string& name, double timeout) {
  JR_REQUIRE(proxy_ == nullptr, Code::kInternal, "jax_rccl: network links connected twice");
  JR_REQUIRE(comm::SocketListenerPort() > 0, Code::kInvalidUsage, "jax_rccl: '", name,
             "': this process reaches ranks over the network but has no socket listener (the "
             "bootstrap starts it when the run needs sockets: _jax_rccl.socket_listen)");
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  JR_REQUIRE(wakeFd_ >= 0, Code::kSystem, "jax_rccl: cannot create an eventfd: ", ErrnoText(errno));
  std::vector<comm::ProxyConnection> conns;
  const int n = geo_.nRanks;
  for (int c = 0; c < geo_.nChannels; ++c) {
    for (int l = 0; l < n; ++l) {
      if (!placement_.local[size_t(l)]) continue;
      for (int r = 0; r < n; ++r) {
        if (!netRank_[size_t(r)]) continue;
        for (int send = 1; send >= 0; --send) {
          const int from = send ? l : r, to = send ? r : l;
          HostConn* fifo = tr_->Conn(c, from, to);
          char* slots = tr_->Slots(c, from, to);
          JR_REQUIRE(fifo != nullptr && slots != nullptr, Code::kInternal,
                     "jax_rccl: no FIFO for the network link of channel ", c, " between ranks ", l,
                     " and ", r);
          comm::ProxyConnection pc;
          pc.channel = c;
          pc.local = l;
          pc.remote = r;
          pc.send = send != 0;
          pc.fifo.tail = Word(&fifo->tail);
          pc.fifo.head = Word(&fifo->head);
          pc.fifo.info = reinterpret_cast<uint64_t*>(fifo->slotSizes);
          pc.fifo.tags = reinterpret_cast<char*>(fifo->tags);
          pc.fifo.slots = slots;
          pc.fifo.slotBytes = tr_->slotBytes();
          conns.push_back(pc);
        }
      }
    }
  }
  JR_ASSIGN_OR_RETURN(std::unique_ptr<comm::Net> net, comm::MakeNet(netOptions_));
  // The proxy's own timeout (a step the network does not take) stays behind the executor's,
  // which names the ranks that never arrived.
  proxy_ = std::make_unique<comm::NetProxy>(
      std::move(net), group_, std::move(conns), endpoints_, rankString_, 2 * timeout + 5,
      [this](const std::string& reason) { OnProxyFailure(reason); });
  comm::ProxyHooks hooks;
  hooks.ring = [this](int local) { tr_->Ring(local); };
  hooks.check = [this](const comm::ProxyConnection& c, uint64_t, const comm::NetInfo& info) {
    return CheckStep(c, info);
  };
  hooks.wakeFd = wakeFd_;
  hooks.arm = [this](bool on) {
    for (int r = 0; r < geo_.nRanks; ++r) {
      if (netRank_[size_t(r)]) tr_->AddProxyWaiter(r, on ? 1 : -1);
    }
  };
  proxy_->SetHooks(std::move(hooks));
  for (int r = 0; r < n; ++r) {
    if (netRank_[size_t(r)]) tr_->SetWakeFd(r, wakeFd_);
  }
  answering_ = comm::AnswerOnListener(group_, kStatusChannel,
                                      [this](int, int asked) { return Answer(asked); });
  Status s = proxy_->Connect(deadline);
  if (!s.ok() && s.code() == Code::kTimeout) {
    JR_FAIL(Code::kTimeout, "jax_rccl: '", name, "': ", s.message(),
            " (did its process make this call?)");
  }
  return s;
}

std::string NetLinks::CheckStep(const comm::ProxyConnection& c, const comm::NetInfo& info) const {
  if (entered_ == nullptr || calls_ == nullptr || failed_.load()) return std::string();
  StepTag tag;
  std::memcpy(&tag, info.tag, sizeof(tag));
  // A step of another call at the number the local rank runs now: the ranks ran different calls
  // (the rank itself may be blocked elsewhere and never read this step).
  const uint64_t e1 = entered_[c.local].load(std::memory_order_acquire);
  const uint64_t call = calls_[c.local].load(std::memory_order_acquire);
  const uint64_t e2 = entered_[c.local].load(std::memory_order_acquire);
  if (e1 != e2 || e1 == 0 || tag.seq + 1 != e1 || tag.call == call || tag.call == 0) {
    return std::string();
  }
  return detail::StrCat("mismatched calls: ", rankString_(c.remote), " sent a step of its ",
                        host::StepTagString(tag), " where ", rankString_(c.local), " runs its ",
                        callText_ ? callText_(c.local) : std::string("call"),
                        " (the processes ran different collectives at this point, or the same "
                        "ones in a different order)");
}

void NetLinks::OnProxyFailure(const std::string& reason) {
  if (shut_.load()) return;  // Shutdown's Abort: its reason is set and told already
  const int remote = proxy_ != nullptr ? proxy_->FailedRemote() : -1;
  if (remote < 0) {
    // This process's own finding (a step of another call, a step the network did not take):
    // the peers hear it before the connections reset.
    SetFailed(reason);
    (void)comm::SendNotices(group_, placement_.thisProcess, placement_.session,
                            comm::NoticePeersOf(placement_, netRank_),
                            Status(Code::kTimeout, reason), true,
                            Clock::now() + std::chrono::milliseconds(500));
    return;
  }
  // A connection failed: its process failed (its notice comes) or exited (nothing listens).
  std::vector<int> senders;
  const Status notice = comm::AwaitNotice(group_, placement_.thisProcess, kNoticeGraceMs, &senders);
  {
    std::lock_guard<std::mutex> lock(mu_);
    noticeFrom_.insert(senders.begin(), senders.end());
  }
  if (!notice.ok()) {
    SetFailed(detail::StrCat("a process of the group reported its communicator failed: ",
                             notice.message()));
    return;
  }
  bool refused = false;
  const std::string who = rankString_(remote);
  (void)comm::AskListener(endpoints_[size_t(remote)],
                          comm::LinkKey(group_, kStatusChannel, -1, remote), placement_.thisProcess,
                          placement_.session, Clock::now() + std::chrono::milliseconds(200), who,
                          &refused);
  if (refused) {
    SetFailed(detail::StrCat(who,
                             " exited (its network connection closed without a failure "
                             "notice; ",
                             reason, ")"));
    return;
  }
  SetFailed(reason);
}

void NetLinks::SetFailed(const std::string& reason) {
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

bool NetLinks::Failed(std::string* reason) const {
  if (!failed_.load(std::memory_order_acquire)) return false;
  if (reason != nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    *reason = reason_;
  }
  return true;
}

void NetLinks::Shutdown(const std::string& reason) {
  if (shut_.exchange(true) || proxy_ == nullptr) return;
  if (reason.empty()) {
    proxy_->Stop();
    return;
  }
  bool tell = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The links' own failure told the peers already; one learned from a peer is not told again.
    tell = !failed_.load();
    if (tell) {
      reason_ = reason;
      failed_.store(true, std::memory_order_release);
    }
  }
  if (tell) {
    (void)comm::SendNotices(group_, placement_.thisProcess, placement_.session,
                            comm::NoticePeersOf(placement_, netRank_),
                            Status(Code::kTimeout, reason), true,
                            Clock::now() + std::chrono::milliseconds(500));
  }
  proxy_->Abort(reason);  // every connection reset: the peers fail at once naming this rank
}

void NetLinks::QueryPeers(std::chrono::milliseconds wait) {
  const int n = geo_.nRanks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    answered_.assign(size_t(n), 0);
    peerEntered_.assign(size_t(n), 0);
    peerCall_.assign(size_t(n), 0);
    peerText_.assign(size_t(n), std::string());
  }
  const Clock::time_point deadline = Clock::now() + wait;
  int asker = -1;
  for (int r = 0; r < n && asker < 0; ++r) asker = placement_.local[size_t(r)] ? r : -1;
  std::vector<int> ask;
  for (int r = 0; r < n; ++r) {
    if (netRank_[size_t(r)]) ask.push_back(r);
  }
  comm::RunAtOnce(ask.size(), [&](size_t i) {
    const int r = ask[i];
    bool refused = false;
    StatusOr<std::string> a = comm::AskListener(
        endpoints_[size_t(r)], comm::LinkKey(group_, kStatusChannel, asker, r),
        placement_.thisProcess, placement_.session, deadline, rankString_(r), &refused);
    std::lock_guard<std::mutex> lock(mu_);
    if (refused) {
      answered_[size_t(r)] = -1;
    } else if (a.ok() && a.value().size() >= sizeof(StatusAnswer)) {
      StatusAnswer s;
      std::memcpy(&s, a.value().data(), sizeof(s));
      answered_[size_t(r)] = 1;
      peerEntered_[size_t(r)] = s.entered;
      peerCall_[size_t(r)] = s.call;
      peerText_[size_t(r)] = a.value().substr(sizeof(s));
    }
  });
}

int NetLinks::PeerStatus(int rank, uint64_t* entered, uint64_t* call, std::string* text) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (size_t(rank) >= answered_.size()) return 0;
  // Gone after its own failure notice: it failed (and said why), it did not vanish.
  if (answered_[size_t(rank)] < 0 && noticeFrom_.count(placement_.process[size_t(rank)]) != 0) {
    return 2;
  }
  *entered = peerEntered_[size_t(rank)];
  *call = peerCall_[size_t(rank)];
  *text = peerText_[size_t(rank)];
  return answered_[size_t(rank)];
}

bool NetLinks::WaitDrained(int rank, Clock::time_point deadline) {
  while (true) {
    const uint32_t seen = tr_->Seq(rank);
    bool drained = true;
    for (int c = 0; c < geo_.nChannels && drained; ++c) {
      for (int r = 0; r < geo_.nRanks && drained; ++r) {
        if (!netRank_[size_t(r)]) continue;
        const HostConn* out = tr_->Conn(c, rank, r);
        drained =
            out->head.load(std::memory_order_acquire) >= out->tail.load(std::memory_order_acquire);
      }
    }
    if (drained) return true;
    if (failed_.load() || Clock::now() >= deadline) return false;
    tr_->Wait(rank, seen, 5000000);
  }
}

std::vector<std::string> NetLinks::Transports() const {
  return proxy_ != nullptr ? proxy_->Transports() : std::vector<std::string>();
}

}  // namespace cpu
}  // namespace jax_rccl
