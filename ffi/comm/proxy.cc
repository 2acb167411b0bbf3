// The network proxy's thread (proxy.h).
#include "ffi/comm/proxy.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "ffi/core/stats.h"
#include "ffi/core/thread_name.h"
#include "ffi/planner/work.h"

namespace jax_rccl {
namespace comm {
namespace {

static_assert(NetComm::kMaxRequests <= kSteps, "a request per FIFO slot at most");

uint64_t LoadAcquire(const uint64_t* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

void StoreRelease(uint64_t* p, uint64_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

}  // namespace

struct NetProxy::Link {
  uint32_t index = 0;  // in links_ (the timeline's connection)
  ProxyConnection c;
  std::unique_ptr<NetComm> comm;
  NetMemory* mem = nullptr;           // the slots, registered with the network (RegMr)
  std::string peer;                   // the remote rank, for messages
  uint64_t posted = 0;                // requests posted (steps)
  uint64_t done = 0;                  // requests completed (send: head posted; recv: tail posted)
  uint64_t tail = 0;                  // send: the kernel's tail as last read
  uint64_t head = 0;                  // recv: the kernel's head as last read
  NetRequest* requests[kSteps] = {};  // by step % kSteps
  Clock::time_point since;            // send: when the oldest unfinished request was posted
  std::atomic<uint64_t> moved{0};
};

NetProxy::NetProxy(std::unique_ptr<Net> net, uint64_t group,
                   std::vector<ProxyConnection> connections, std::vector<std::string> endpoints,
                   std::function<std::string(int)> rankString, double timeoutSeconds,
                   std::function<void(const std::string&)> onFailure)
    : net_(std::move(net)),
      group_(group),
      endpoints_(std::move(endpoints)),
      rankString_(std::move(rankString)),
      timeout_(timeoutSeconds),
      onFailure_(std::move(onFailure)) {
  for (ProxyConnection& c : connections) {
    auto link = std::make_unique<Link>();
    link->index = uint32_t(links_.size());
    link->c = c;
    link->peer = rankString_(c.remote);
    links_.push_back(std::move(link));
  }
}

NetProxy::~NetProxy() {
  Stop();
}

void NetProxy::SetHooks(ProxyHooks hooks) {
  hooks_ = std::move(hooks);
  netWakes_ = hooks_.wakeFd >= 0 && net_->SetProgressFd(hooks_.wakeFd);
  netPolls_ = hooks_.wakeFd >= 0 && !netWakes_ && net_->SleepOnFds();
}

Status NetProxy::Connect(Clock::time_point deadline) {
  JR_REQUIRE(!thread_.joinable(), Code::kInternal, "jax_rccl: network proxy connected twice");
  Status opened = Open(deadline);
  // The counters persist across launches: start where the FIFOs stand.
  for (auto& lk : links_) {
    lk->posted = lk->done = LoadAcquire(lk->c.send ? lk->c.fifo.head : lk->c.fifo.tail);
    if (lk->c.send) lk->tail = lk->done;
    if (!lk->c.send) lk->head = LoadAcquire(lk->c.fifo.head);
  }
  if (!opened.ok()) {
    // The connections made so far are reset, so their peers fail too instead of taking an
    // orderly close for the end of the data.
    Fail(opened.message());
    for (auto& lk : links_) {
      if (lk->comm != nullptr) lk->comm->Abort();
      Release(*lk);
    }
    return opened;
  }
  if (!traceDir_.empty()) trace_.reserve(traceCap_);
  thread_ = std::thread([this]() {
    NameThisThread("jrccl proxy");
    Loop();
  });
  return Status::Ok();
}

Status NetProxy::Open(Clock::time_point deadline) {
  for (auto& lk : links_) {
    const ProxyConnection& c = lk->c;
    JR_REQUIRE(c.fifo.tail != nullptr && c.fifo.head != nullptr && (!c.send || c.fifo.info),
               Code::kInternal, "jax_rccl: network proxy connection without its FIFO");
    JR_REQUIRE(c.fifo.slots != nullptr && c.fifo.slotBytes > 0, Code::kInternal,
               "jax_rccl: network proxy connection without its slots");
    JR_REQUIRE(c.remote >= 0 && size_t(c.remote) < endpoints_.size(), Code::kInternal,
               "jax_rccl: network proxy connection to rank ", c.remote, " without an endpoint");
    JR_CHECK(net_->Listen(NetKey{group_, c.channel, c.remote, c.local}));
  }
  // Every sending end first: the peer's listener takes the connection whether or not its
  // process has reached this group, so no order between processes is needed.
  for (auto& lk : links_) {
    if (!lk->c.send) continue;
    const NetKey key{group_, lk->c.channel, lk->c.local, lk->c.remote};
    StatusOr<std::unique_ptr<NetComm>> comm =
        net_->Connect(key, endpoints_[size_t(lk->c.remote)], deadline, lk->peer);
    if (!comm.ok() && comm.status().code() == Code::kTimeout) {
      JR_FAIL(Code::kTimeout, "jax_rccl: the network proxy timed out after ", timeout_,
              " s (JAX_RCCL_TIMEOUT): ", lk->peer, " did not answer (", comm.status().message(),
              "; channel ", lk->c.channel, ", from rank ", lk->c.local, ")");
    }
    JR_ASSIGN_OR_RETURN(lk->comm, std::move(comm));
    JR_CHECK(Register(*lk));
  }
  for (auto& lk : links_) {
    if (lk->c.send) continue;
    const NetKey key{group_, lk->c.channel, lk->c.remote, lk->c.local};
    StatusOr<std::unique_ptr<NetComm>> comm = net_->Accept(key, deadline, lk->peer);
    if (!comm.ok() && comm.status().code() == Code::kTimeout) {
      JR_FAIL(Code::kTimeout, "jax_rccl: the network proxy timed out after ", timeout_,
              " s (JAX_RCCL_TIMEOUT): ", lk->peer, " never arrived (", comm.status().message(),
              "; to rank ", lk->c.local, ")");
    }
    JR_ASSIGN_OR_RETURN(lk->comm, std::move(comm));
    JR_CHECK(Register(*lk));
  }
  return Status::Ok();
}

Status NetProxy::Register(Link& lk) {
  // The connection's slots (host memory the device maps): a backend that moves registered
  // memory (UCX) gets their handle once, not a lookup per step.
  JR_ASSIGN_OR_RETURN(lk.mem, lk.comm->RegMr(lk.c.fifo.slots, size_t(lk.c.fifo.slotBytes) * kSteps,
                                             NetMemoryType::kHost));
  return Status::Ok();
}

void NetProxy::Release(Link& lk) {
  if (lk.comm == nullptr) return;
  if (lk.mem != nullptr) (void)lk.comm->DeregMr(lk.mem);
  lk.mem = nullptr;
  lk.comm.reset();
}

std::vector<std::string> NetProxy::Transports() const {
  std::vector<std::string> out;
  for (const auto& lk : links_) out.push_back(lk->comm != nullptr ? lk->comm->Transport() : "");
  return out;
}

bool NetProxy::Failed(std::string* reason) const {
  if (!failed_.load()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (reason != nullptr) *reason = reason_;
  return true;
}

void NetProxy::Fail(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load()) return;
    reason_ = reason;
    failed_.store(true);
  }
  if (onFailure_) onFailure_(reason);
}

bool NetProxy::SendsDrained() const {
  for (const auto& lk : links_) {
    if (lk->c.send && LoadAcquire(lk->c.fifo.tail) != lk->done) return false;
  }
  return true;
}

void NetProxy::Stop() {
  // The thread first ships every step the kernels posted (a peer may still need them: this
  // process may be exiting with its last steps in its send slots), within the drain limit.
  drainUntil_ = Clock::now() +
                std::chrono::microseconds(int64_t(std::min(timeout_, kStopDrainSeconds) * 1e6));
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  WriteTrace();
  // In order where every step the kernel posted is out (so the receivers know nothing more
  // comes: a close header after the data), within the same limit (at least a second); else
  // reset, which the peers report naming this rank.
  const Clock::time_point until = std::max(drainUntil_, Clock::now() + std::chrono::seconds(1));
  bool pending = true;
  while (pending) {
    pending = false;
    for (auto& lk : links_) {
      if (lk->comm == nullptr) continue;
      const bool drained = !lk->c.send || LoadAcquire(lk->c.fifo.tail) == lk->done;
      if (!failed_.load() && drained && !lk->comm->CloseInOrder()) {
        if (Clock::now() < until) {
          pending = true;
          continue;
        }
      }
      lk->comm->Abort();
      Release(*lk);
    }
    if (pending) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void NetProxy::Trace(const Link& lk, TraceKind kind, uint64_t step) {
  if (traceDir_.empty()) return;
  const TraceEvent e{std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now().time_since_epoch())
                         .count(),
                     lk.index, uint32_t(kind), step};
  if (trace_.size() < traceCap_) {
    trace_.push_back(e);
  } else {
    trace_[size_t(traced_ % traceCap_)] = e;
  }
  ++traced_;
}

void NetProxy::WriteTrace() {
  if (traceDir_.empty() || links_.empty()) return;
  const std::string path = detail::StrCat(traceDir_, "/net-trace.", group_, ".", getpid(), ".",
                                          links_[0]->c.local, ".txt");
  traceDir_.clear();  // once
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "jax_rccl: JAX_RCCL_NET_TRACE: cannot write %s: %s\n", path.c_str(),
                 std::strerror(errno));
    return;
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "unknown");
  std::fprintf(f,
               "# jax_rccl network proxy timeline: group %llu, process %d, host %s, %llu events, "
               "the last %zu kept\n",
               static_cast<unsigned long long>(group_), int(getpid()), host,
               static_cast<unsigned long long>(traced_), trace_.size());
  std::fprintf(f,
               "# link <index> <channel> <send|recv> <local rank> <remote rank>; then <ns> <link> "
               "<kind> <step>; kinds: 0 posted by the kernel, 1 to the network, 2 sent, 3 receive "
               "posted, 4 landed, 5 freed by the kernel (steady clock of this machine)\n");
  for (const auto& lk : links_) {
    std::fprintf(f, "link %u %d %s %d %d\n", lk->index, lk->c.channel, lk->c.send ? "send" : "recv",
                 lk->c.local, lk->c.remote);
  }
  const size_t n = trace_.size();
  const size_t first = traced_ > n ? size_t(traced_ % n) : 0;
  for (size_t i = 0; i < n; ++i) {
    const TraceEvent& e = trace_[(first + i) % n];
    std::fprintf(f, "%lld %u %u %llu\n", static_cast<long long>(e.ns), e.link, e.kind,
                 static_cast<unsigned long long>(e.step));
  }
  if (std::fclose(f) != 0) {
    std::fprintf(stderr, "jax_rccl: JAX_RCCL_NET_TRACE: writing %s failed\n", path.c_str());
  }
  trace_.clear();
}

std::vector<uint64_t> NetProxy::StepsMoved() const {
  std::vector<uint64_t> out;
  for (const auto& lk : links_) out.push_back(lk->moved.load());
  return out;
}

// Fails the proxy with `what` about link `lk`; false (for the progress functions to return).
bool NetProxy::FailLink(const Link& lk, const std::string& what) {
  if (!failed_.load()) failedRemote_.store(lk.c.remote);
  Fail(detail::StrCat(what, " (network proxy, channel ", lk.c.channel, ", rank ", lk.c.local,
                      lk.c.send ? " to " : " from ", lk.peer, ")"));
  return false;
}

// One round of a sending link: ship the steps the kernel posted, post head for those the network
// took. Whether anything moved; false after failing the proxy.
bool NetProxy::ProgressSend(Link& lk, Clock::time_point now) {
  const ProxyConnection& c = lk.c;
  bool progressed = false;
  const uint64_t tail = LoadAcquire(c.fifo.tail);
  if (tail < lk.posted || tail - lk.done > uint64_t(kSteps)) {
    return FailLink(lk, detail::StrCat("jax_rccl: rank ", c.local,
                                       "'s send FIFO counters are out of step (tail ", tail, ", ",
                                       lk.done, " steps sent): was the connection reset?"));
  }
  for (uint64_t q = std::max(lk.tail, lk.posted); q < tail; ++q) Trace(lk, kPosted, q);
  lk.tail = tail;
  while (lk.posted < tail && lk.posted - lk.done < uint64_t(NetComm::kMaxRequests)) {
    const int slot = int(lk.posted % kSteps);
    const uint64_t info = LoadAcquire(&c.fifo.info[slot]);
    const int p = ProxyStepProtocol(info);
    const uint64_t bytes = ProxyStepBytes(info);
    if (p >= kProxyProtocols || bytes > uint64_t(c.fifo.slotBytes)) {
      return FailLink(lk, detail::StrCat("jax_rccl: rank ", c.local, " posted step ", lk.posted,
                                         " with protocol ", p, " and ", bytes,
                                         " bytes, which its FIFO cannot hold"));
    }
    NetInfo ni;
    ni.word = info;
    if (c.fifo.tags != nullptr) {
      std::memcpy(ni.tag, c.fifo.tags + size_t(slot) * kProxyTagBytes, kProxyTagBytes);
    }
    NetRequest* r = nullptr;
    Status s = lk.comm->Isend(c.fifo.slots + int64_t(slot) * c.fifo.slotBytes, size_t(bytes), ni,
                              lk.mem, &r);
    if (!s.ok()) return FailLink(lk, s.message());
    if (r == nullptr) break;
    if (lk.posted == lk.done) lk.since = now;
    Trace(lk, kSendPosted, lk.posted);
    lk.requests[slot] = r;
    ++lk.posted;
    progressed = true;
  }
  while (lk.done < lk.posted) {
    bool complete = false;
    size_t bytes = 0;
    Status s = lk.comm->Test(lk.requests[lk.done % kSteps], &complete, &bytes, nullptr);
    if (!s.ok()) return FailLink(lk, s.message());
    if (!complete) break;
    Trace(lk, kSendDone, lk.done);
    ++lk.done;
    lk.since = now;
    bytesMoved_.fetch_add(int64_t(bytes));
    sent_ += int64_t(bytes);
    lk.moved.store(lk.done);
    StoreRelease(c.fifo.head, lk.done);
    if (hooks_.ring) hooks_.ring(c.local);
    progressed = true;
  }
  if (lk.done < lk.posted && std::chrono::duration<double>(now - lk.since).count() > timeout_) {
    return FailLink(lk, detail::StrCat("jax_rccl: ", lk.peer, " took no network data for ",
                                       timeout_, " s (JAX_RCCL_TIMEOUT; step ", lk.done,
                                       " waits: is its process stopped?)"));
  }
  return progressed;
}

// One round of a receiving link: keep receives posted into the slots the kernel freed, and post
// tail for the steps that arrived, in order. Whether anything moved; false after failing the proxy.
bool NetProxy::ProgressRecv(Link& lk) {
  const ProxyConnection& c = lk.c;
  bool progressed = false;
  const uint64_t head = LoadAcquire(c.fifo.head);
  if (head > lk.done) {
    return FailLink(lk, detail::StrCat("jax_rccl: rank ", c.local, " consumed ", head,
                                       " steps of a FIFO the proxy filled with ", lk.done,
                                       ": was the connection reset?"));
  }
  for (uint64_t q = lk.head; q < head; ++q) Trace(lk, kFreed, q);
  lk.head = head;
  while (lk.posted < head + uint64_t(kSteps) &&
         lk.posted - lk.done < uint64_t(NetComm::kMaxRequests)) {
    const int slot = int(lk.posted % kSteps);
    NetRequest* r = nullptr;
    Status s = lk.comm->Irecv(c.fifo.slots + int64_t(slot) * c.fifo.slotBytes,
                              size_t(c.fifo.slotBytes), lk.mem, &r);
    if (!s.ok()) return FailLink(lk, s.message());
    if (r == nullptr) break;
    lk.requests[slot] = r;
    Trace(lk, kRecvPosted, lk.posted);
    ++lk.posted;
  }
  while (lk.done < lk.posted) {
    bool complete = false;
    size_t bytes = 0;
    NetInfo ni;
    Status s = lk.comm->Test(lk.requests[lk.done % kSteps], &complete, &bytes, &ni);
    if (!s.ok()) return FailLink(lk, s.message());
    if (!complete) break;
    const uint64_t info = ni.word;
    const int p = ProxyStepProtocol(info);
    if (p >= kProxyProtocols || ProxyStepBytes(info) != bytes ||
        bytes > uint64_t(c.fifo.slotBytes)) {
      return FailLink(lk, detail::StrCat("jax_rccl: step ", lk.done, " from ", lk.peer,
                                         " has protocol ", p, " and ", bytes,
                                         " bytes, which this rank's FIFO cannot hold (do the "
                                         "processes run the same build and buffer sizes?)"));
    }
    Trace(lk, kLanded, lk.done);
    const size_t slot = size_t(lk.done % kSteps);
    if (c.fifo.info != nullptr) StoreRelease(&c.fifo.info[slot], info);
    if (c.fifo.tags != nullptr)
      std::memcpy(c.fifo.tags + slot * kProxyTagBytes, ni.tag, kProxyTagBytes);
    if (hooks_.check) {
      const std::string wrong = hooks_.check(c, lk.done, ni);
      if (!wrong.empty()) {
        Fail(wrong);
        return false;
      }
    }
    ++lk.done;
    StoreRelease(c.fifo.tail, lk.done);
    if (hooks_.ring) hooks_.ring(c.local);
    bytesMoved_.fetch_add(int64_t(bytes));
    received_ += int64_t(bytes);
    lk.moved.store(lk.done);
    progressed = true;
  }
  return progressed;
}

void NetProxy::Account(const Link& lk, int64_t ns) {
  if (lk.c.send) {
    sendNs_ += ns;
    // Steps the kernel posted and the network has not yet taken: none, or every slot's.
    if (lk.tail == lk.done) sendIdle_ += ns;
    if (lk.tail - lk.done >= uint64_t(kSteps)) sendFull_ += ns;
  } else {
    recvNs_ += ns;
    if (lk.done == lk.head) recvIdle_ += ns;
    if (lk.done - lk.head >= uint64_t(kSteps)) recvFull_ += ns;
  }
}

void NetProxy::FlushStats() {
  RuntimeStats& st = Stats();
  st.netBytesSent.fetch_add(sent_, std::memory_order_relaxed);
  st.netBytesReceived.fetch_add(received_, std::memory_order_relaxed);
  st.netSendNs.fetch_add(sendNs_, std::memory_order_relaxed);
  st.netSendNsFull.fetch_add(sendFull_, std::memory_order_relaxed);
  st.netSendNsIdle.fetch_add(sendIdle_, std::memory_order_relaxed);
  st.netRecvNs.fetch_add(recvNs_, std::memory_order_relaxed);
  st.netRecvNsFull.fetch_add(recvFull_, std::memory_order_relaxed);
  st.netRecvNsIdle.fetch_add(recvIdle_, std::memory_order_relaxed);
  sent_ = received_ = sendNs_ = sendFull_ = sendIdle_ = recvNs_ = recvFull_ = recvIdle_ = 0;
}

void NetProxy::Loop() {
  int idle = 0;
  Clock::time_point lastPoll = Clock::now();
  Clock::time_point last = lastPoll;
  struct Flush {  // every way out of the loop
    NetProxy* p;
    ~Flush() { p->FlushStats(); }
  } flush{this};
  while (true) {
    const Clock::time_point now = Clock::now();
    if (stop_.load() && (SendsDrained() || now > drainUntil_)) return;
    // The time since the last round goes to each link's state as that round left it.
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last).count();
    last = now;
    for (const auto& lk : links_) Account(*lk, ns);
    bool progressed = false;
    for (auto& lk : links_) {
      const uint64_t before = lk->comm->bytesMoved();
      progressed = (lk->c.send ? ProgressSend(*lk, now) : ProgressRecv(*lk)) || progressed;
      if (failed_.load()) break;
      progressed = progressed || lk->comm->bytesMoved() != before;
    }
    // Every 10 ms, every connection is checked for a peer that reset it (its proxy failed), also
    // one with nothing in flight; every round where the thread sleeps on the sockets (PollFds):
    // Poll pumps them, so what a socket holds for a connection without a request in flight (a
    if (!failed_.load() && now - lastPoll > std::chrono::milliseconds(10)) {
      FlushStats();
      lastPoll = now;
      for (auto& lk : links_) {
        const uint64_t before = lk->comm->bytesMoved();
        Status s = lk->comm->Poll();
        if (!s.ok()) {
          FailLink(*lk, s.message());
          break;
        }
        progressed = progressed || lk->comm->bytesMoved() != before;
      }
    }
    if (failed_.load()) {
      // Every connection reset at once (a failure of the proxy's own, or Abort from outside while
      // the thread slept): the peers fail naming this rank instead of waiting.
      for (auto& lk : links_) lk->comm->Abort();
      return;
    }
    // Idle (no step and no byte moved): spin, then sleep up to 20 us at a time; or, with the
    // hooks' eventfd, sleep on it after a round or two (the ranks share the cores with it).
    if (progressed) {
      idle = 0;
    } else if (hooks_.wakeFd >= 0) {
      WaitIdle(++idle);
    } else if (hooks_.wakeFd < 0 && ++idle > 64) {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(20, (idle - 64) * 2)));
    }
  }
}

void NetProxy::WaitIdle(int idle) {
  if (hooks_.arm) hooks_.arm(true);
  // A post between the last round and the arming rang nobody: look at the counters once more.
  bool posted = stop_.load();
  for (const auto& lk : links_) {
    posted = posted || (lk->c.send ? LoadAcquire(lk->c.fifo.tail) != lk->tail
                                   : LoadAcquire(lk->c.fifo.head) != lk->head);
  }
  if (!posted) {
    // With the network's wake-ups, or its sockets polled too, the sleep ends on any event (the
    // 10 ms checks go on); without, its arrivals are looked for after at most 20 us, then 1 ms
    // once idle for long.
    pollFds_.assign(1, pollfd{hooks_.wakeFd, POLLIN, 0});
    const bool events = netWakes_ || (netPolls_ && net_->PollFds(&pollFds_));
    const int64_t us = events ? 10000 : (idle < 2000 ? 20 : 1000);
    const struct timespec ts{time_t(us / 1000000), long(us % 1000000) * 1000};
    const int ready = ppoll(pollFds_.data(), nfds_t(pollFds_.size()), &ts, nullptr);
    // The sockets that are ready are pumped now (what they hold for a connection without a
    // request in flight, a credit, is read: the next sleep does not wake for it again).
    if (ready > 0 && netPolls_) net_->PumpFds(pollFds_);
  }
  if (hooks_.arm) hooks_.arm(false);
  uint64_t drain;
  while (read(hooks_.wakeFd, &drain, sizeof(drain)) > 0) {
  }
}

}  // namespace comm
}  // namespace jax_rccl
