#include "ffi/cpu/comm.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <thread>
#include <utility>

#include "ffi/comm/shm.h"
#include "ffi/core/stats.h"
#include "ffi/cpu/comm_stall.h"
#include "ffi/cpu/net_links.h"
#include "ffi/host/transport_host.h"

namespace jax_rccl {
namespace cpu {

TopologyView CpuTopology(int nRanks, const Params& params) {
  TopologyView t;
  t.nRanks = nRanks;
  t.nNodes = 1;
  t.arch = Arch::kCpu;
  t.intraLink = LinkKind::kLoopback;
  t.interLink = LinkKind::kSocket;  // hosts are joined by the socket transport
  t.bwIntra = 8.0f;                 // GB/s a channel gets from host memory (a rough figure)
  t.nChannels = params.nchannels > 0 ? static_cast<int>(params.nchannels) : 2;
  t.p2pnChannels = 2;
  t.p2pnChannelsPerPeer = 1;
  // RCCL's LL and LL128 defaults (DEFAULT_LL_BUFFSIZE 256 KiB, 448 KiB). Simple: 1 MiB (128 KiB
  // steps) rather than RCCL's 4 MiB: on a host, a ring across processes pipelines only when a
  // rank's chunk spans several steps; 4 processes on 2 cores, 4 MB all-reduce: 2.0 ms against
  // 2.5-3.0 ms with 4 MiB (benchmarks/multiprocess.py). Ranks of one process use Direct.
  t.buffSizes[static_cast<int>(Proto::kLL)] = 262144;
  t.buffSizes[static_cast<int>(Proto::kLL128)] = 458752;
  t.buffSizes[static_cast<int>(Proto::kSimple)] = 1048576;
  t.p2pChunkSize = 524288;
  // workFifoDepth keeps its default: the runtime's plans are persistent (no FIFO budget).
  t.directPeers = true;
  return t;
}

namespace {

Clock::time_point DeadlineIn(double seconds) {
  if (!(seconds > 0)) seconds = 0;
  if (seconds > 1e8) seconds = 1e8;  // "forever" without overflowing the clock
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

// One execution's rendezvous, shared by its ranks (each holds a reference until it returns).
// Every field is guarded by the communicator's mutex.
struct Execution {
  Execution(const ExecKey& k, int n)
      : key(k), present(n, 0), peers(n), collFingerprints(n, 0), barrierIn(n, 0) {}
  ExecKey key;
  int arrived = 0;
  std::vector<uint8_t> present;                 // by rank
  std::vector<std::vector<SlotBuffers>> peers;  // [rank][slot]
  std::vector<uint64_t> collFingerprints;       // by rank
  int errorRank = -1;                           // the first rank that cannot take part
  uint64_t sendSum = 0;
  uint64_t recvSum = 0;
  bool complete = false;
  Status verdict;  // set by the last rank: the ranks disagree on the call
  uint64_t ticket = 0;
  // One-shot (Arrival::oneShot): the rank that runs the body for all (-1: none), and its result,
  // which every rank returns.
  int oneShotRank = -1;
  int oneShotVotes = 0;
  Status oneShotResult;
  std::vector<const std::vector<Arrival::P2pSlot>*> p2p;  // by rank (Arrival::p2p)
  // ExecContext::barrier
  int barrierArrived = 0;
  uint64_t barrierGeneration = 0;
  std::vector<uint8_t> barrierIn;  // by rank, in the current generation
};

Communicator::Communicator(std::vector<int64_t> devices, TopologyView topo,
                           std::unique_ptr<HostTransport> transport)
    : devices_(std::move(devices)),
      topo_(topo),
      transport_(std::move(transport)),
      served_(devices_.size(), 0) {
  entered_ = std::make_unique<std::atomic<uint64_t>[]>(devices_.size());
  calls_ = std::make_unique<std::atomic<uint64_t>[]>(devices_.size());
  callTexts_.resize(devices_.size());
  for (size_t r = 0; r < devices_.size(); ++r) {
    entered_[r].store(0);
    calls_[r].store(0);
    rankNames_.push_back(detail::StrCat("rank ", r, " (device ", devices_[r], ")"));
  }
  placement_.process.assign(devices_.size(), 0);
  placement_.local.assign(devices_.size(), 1);
  placement_.processes = {0};
  nLocal_ = static_cast<int>(devices_.size());
  Stats().communicators.fetch_add(1);
}

Communicator::Communicator(std::vector<int64_t> devices, TopologyView topo,
                           std::unique_ptr<HostTransport> transport, GroupPlacement placement,
                           std::unique_ptr<ShmGroup> shm, std::unique_ptr<NetLinks> links)
    : Communicator(std::move(devices), topo, std::move(transport)) {
  placement_ = std::move(placement);
  shm_ = std::move(shm);
  links_ = std::move(links);
  shmTransport_ = dynamic_cast<HostFifoTransport*>(transport_.get());
  nLocal_ = 0;
  for (uint8_t l : placement_.local) nLocal_ += l ? 1 : 0;
  for (size_t r = 0; r < devices_.size(); ++r) {
    rankNames_[r] = detail::StrCat("rank ", r, " (device ", devices_[r], ", process ",
                                   placement_.process[r], ", host '", placement_.host[r], "')");
  }
  if (links_) {
    links_->SetEnteredSource(entered_.get(), calls_.get(), [this](int r) { return CallText(r); });
  }
}

Communicator::~Communicator() {
  Stats().rendezvousPending.fetch_sub(static_cast<int64_t>(pending_.size()));
  Stats().communicators.fetch_sub(1);
}

std::string Communicator::DevicesString() const {
  return ListString(devices_);
}

Status Communicator::FailedError(const std::string& name) const {
  JR_FAIL(Code::kInvalidUsage, "jax_rccl: '", name, "': the communicator of devices ",
          DevicesString(),
          " failed earlier and cannot run collectives any more (start a new process); the first "
          "failure: ",
          failReason_);
}

void Communicator::Fail(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.load()) {
    failReason_ = reason;
    failed_.store(true, std::memory_order_release);
  }
  Stats().rendezvousPending.fetch_sub(static_cast<int64_t>(pending_.size()));
  pending_.clear();
  cv_.notify_all();
  const std::string first = failReason_;
  if (shm_) shm_->MarkFailed(first);    // before the wake-up: peers that wake see the flag
  if (links_) links_->Shutdown(first);  // the notice, then the socket peers see their streams end
  if (transport_) transport_->WakeAll();
  if (shm_) {
    // Names stay until every process of the group mapped them (a slow peer then still finds the
    // segments, sees the failure and stops at once instead of waiting for them until its
    // deadline); at exit they go in any case.
    bool peerGone = false;
    for (int q = 0; q < nRanks() && !peerGone; ++q) {
      peerGone = !placement_.local[size_t(q)] && shm_->Region(q) != nullptr &&
                 shm_->Liveness(q) == PeerLiveness::kExited;
    }
    if (peerGone) {
      shm_->UnlinkAll();  // a process of the group is gone: nobody maps them any more
    } else {
      shm_->MaybeUnlink();
    }
    ReapSession(placement_.session, /*ownToo=*/false);  // those of processes that died early
  }
}

std::shared_ptr<Execution> Communicator::Join(const ExecKey& key, Arrival arrival, Status* error) {
  const int n = nRanks();
  auto it = pending_.find(key);
  std::shared_ptr<Execution> e;
  if (it == pending_.end()) {
    e = std::make_shared<Execution>(key, n);
    pending_.emplace(key, e);
    Stats().rendezvousPending.fetch_add(1);
  } else {
    e = it->second;
  }
  const int r = arrival.rank;
  if (e->present[r]) {
    *error =
        Status(Code::kInternal, detail::StrCat("jax_rccl: rank ", r, " of devices ",
                                               DevicesString(), " joined the execution (call site ",
                                               key.callSite, ", run id ", key.runId, ") twice"));
    return nullptr;
  }
  e->present[r] = 1;
  e->oneShotVotes += arrival.oneShot ? 1 : 0;
  if (arrival.oneShot && arrival.p2p != nullptr && !arrival.p2p->empty()) {
    e->p2p.resize(size_t(n), nullptr);
    e->p2p[size_t(r)] = arrival.p2p;
  }
  e->peers[r] = std::move(arrival.slots);
  e->collFingerprints[r] = arrival.collFingerprint;
  e->sendSum += arrival.sendHash;
  e->recvSum += arrival.recvHash;
  if (!arrival.error.ok() && e->errorRank < 0) {
    // The execution cannot run: every rank (waiting or still to come) fails at once.
    e->errorRank = r;
    e->verdict =
        Status(arrival.error.code(),
               detail::StrCat("jax_rccl: rank ", r, " (device ", devices_[r], ") of devices ",
                              DevicesString(), " cannot run the call: ", arrival.error.message()));
    cv_.notify_all();
  }
  if (++e->arrived < nLocal_) return e;

  // The last (local) rank: check the ranks agree, hand out the ticket, retire the entry. Across
  // processes only the local ranks are compared here (the others at the call site's first use).
  std::vector<int> differ;
  int first = -1;
  for (int q = 0; q < n; ++q) {
    if (!e->present[q]) continue;
    if (first < 0) {
      first = q;
    } else if (e->collFingerprints[q] != e->collFingerprints[first]) {
      differ.push_back(q);
    }
  }
  if (crossProcess()) e->sendSum = e->recvSum = 0;
  if (e->errorRank >= 0) {
    // verdict already set
  } else if (!differ.empty() || e->sendSum != e->recvSum) {
    Stats().mismatches.fetch_add(1);
    std::string what =
        !differ.empty()
            ? detail::StrCat("ranks ", ListString(differ), " planned a different call than rank ",
                             first, " (counts, dtypes, ops, roots or algorithms differ)")
            : std::string(
                  "their sends and receives do not pair up (counts or dtypes differ "
                  "between a sender and its receiver)");
    e->verdict = Status(Code::kInvalidUsage,
                        detail::StrCat("jax_rccl: the ranks of devices ", DevicesString(),
                                       " disagree on one call: ", what));
  } else {
    e->ticket = nextTicket_++;
  }
  completedSites_.insert({key.instance, key.callSite});
  pending_.erase(key);
  Stats().rendezvousPending.fetch_sub(1);
  if (e->verdict.ok() && e->errorRank < 0 && !crossProcess() && e->oneShotVotes == n) {
    // This rank runs the call for all (Communicator::Run) and completes it then: the others
    // sleep once, until it is done.
    e->oneShotRank = r;
    return e;
  }
  e->complete = true;
  cv_.notify_all();
  return e;
}

Status Communicator::WaitComplete(Execution& e, int rank, Clock::time_point deadline,
                                  double timeout, const std::string& name,
                                  std::unique_lock<std::mutex>& lock) {
  const WaitingInRendezvous waiting;  // for PoolStallError
  // Polls of the stall check: an eighth of the grace, within [50 ms, 250 ms].
  const auto poll = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::clamp(stallGrace_ / 8, 0.05, 0.25)));
  StallWindow window;
  while (!e.complete && e.errorRank < 0) {
    if (e.oneShotRank >= 0) {
      // Every rank arrived and one runs the call for all, writing this rank's outputs: it
      // completes the execution whatever happens (its own waits have the deadline), and only
      // then may this rank return to XLA.
      cv_.wait(lock);
      continue;
    }
    if (failed_.load()) return FailedError(name);
    const Clock::time_point until =
        stallGrace_ > 0 ? std::min(deadline, Clock::now() + poll) : deadline;
    if (cv_.wait_until(lock, until) == std::cv_status::timeout && !e.complete && e.errorRank < 0 &&
        e.oneShotRank < 0 && !failed_.load()) {
      if (Clock::now() < deadline) {  // a poll, not the deadline
        Status stall = PoolStallError(e.key, e.present, rank, name, window);
        if (stall.ok()) continue;
        // Every waiting rank of `e` returns this error (errorRank marks the execution failed, as
        // for a rank that cannot take part); later calls fail at once on the failed communicator.
        e.errorRank = rank;
        e.verdict = stall;
        lock.unlock();
        Fail(stall.message());
        lock.lock();
        return stall;
      }
      std::vector<int> missing;
      std::vector<int64_t> missingDevices;
      for (int q = 0; q < nRanks(); ++q) {
        if (!e.present[q] && placement_.local[q]) {
          missing.push_back(q);
          missingDevices.push_back(devices_[q]);
        }
      }
      std::string msg = detail::StrCat(
          "jax_rccl: '", name, "' timed out after ", timeout, " s (JAX_RCCL_TIMEOUT): ranks ",
          ListString(missing), " (devices ", ListString(missingDevices),
          ") of the group of devices ", DevicesString(), " never arrived (call site ",
          e.key.callSite, ", run id ", e.key.runId, "; rank ", rank, " waited)");
      return RendezvousTimedOut(msg, lock);
    }
  }
  return Status::Ok();
}

Status Communicator::RendezvousTimedOut(const std::string& msg,
                                        std::unique_lock<std::mutex>& lock) {
  Stats().rendezvousTimeouts.fetch_add(1);
  lock.unlock();
  Fail(msg);
  lock.lock();
  JR_FAIL(Code::kTimeout, msg);
}

Status Communicator::WaitTurn(Execution& e, int rank, double timeout, const std::string& name,
                              std::unique_lock<std::mutex>& lock) {
  Clock::time_point deadline = DeadlineIn(timeout);
  uint64_t seen = served_[rank];
  while (served_[rank] != e.ticket) {
    if (failed_.load()) return FailedError(name);
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && served_[rank] != e.ticket &&
        !failed_.load()) {
      if (served_[rank] != seen) {  // earlier executions progress: keep waiting
        seen = served_[rank];
        deadline = DeadlineIn(timeout);
        continue;
      }
      std::string msg = detail::StrCat(
          "jax_rccl: '", name, "' timed out after ", timeout, " s (JAX_RCCL_TIMEOUT): rank ", rank,
          " (device ", devices_[rank], ") of the group of devices ", DevicesString(),
          " waited for an earlier collective on the same devices that never finished");
      return RendezvousTimedOut(msg, lock);
    }
  }
  return Status::Ok();
}

Status Communicator::Barrier(Execution& e, int rank, Clock::time_point deadline,
                             const std::string& name) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_.load()) return FailedError(name);
  const uint64_t generation = e.barrierGeneration;
  e.barrierIn[rank] = 1;
  if (++e.barrierArrived == nRanks()) {
    e.barrierArrived = 0;
    std::fill(e.barrierIn.begin(), e.barrierIn.end(), 0);
    ++e.barrierGeneration;
    cv_.notify_all();
    return Status::Ok();
  }
  while (e.barrierGeneration == generation) {
    if (failed_.load()) return FailedError(name);
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
        e.barrierGeneration == generation && !failed_.load()) {
      std::vector<int> missing;
      for (int q = 0; q < nRanks(); ++q) {
        if (!e.barrierIn[q]) missing.push_back(q);
      }
      std::string msg = detail::StrCat("jax_rccl: '", name,
                                       "' timed out (JAX_RCCL_TIMEOUT) in a barrier of the group "
                                       "of devices ",
                                       DevicesString(), ": ranks ", ListString(missing),
                                       " never reached it (call site ", e.key.callSite, ", run id ",
                                       e.key.runId, ")");
      Stats().rendezvousTimeouts.fetch_add(1);
      lock.unlock();
      Fail(msg);
      JR_FAIL(Code::kTimeout, msg);
    }
  }
  return Status::Ok();
}

Status Communicator::Connect(Clock::time_point deadline, double timeout, const std::string& name) {
  std::lock_guard<std::mutex> lock(connectMu_);
  if (connected_) return Status::Ok();
  if (shm_) {
    int missing = -1;
    Status s = shm_->OpenRemote(deadline, &failed_, &missing);
    if (!s.ok()) {
      if (s.code() != Code::kTimeout || missing < 0) return s;
      Stats().rendezvousTimeouts.fetch_add(1);
      if (shm_->Liveness(missing) == PeerLiveness::kExited) {
        JR_FAIL(Code::kTimeout, "jax_rccl: '", name, "': ", RankString(missing),
                " exited before it mapped the group's shared memory (process ",
                placement_.process[missing], ")");
      }
      JR_FAIL(Code::kTimeout, "jax_rccl: '", name, "' timed out after ", timeout,
              " s (JAX_RCCL_TIMEOUT): ", RankString(missing),
              " never arrived (it never created its shared-memory segment ", shm_->Name(missing),
              ": did process ", placement_.process[missing], " make this call?)");
    }
  }
  for (int r = 0; r < nRanks(); ++r) {
    char* region = nullptr;
    if (links_) region = links_->Region(r);
    if (region == nullptr && shm_) region = shm_->Region(r);
    shmTransport_->AttachRegion(r, region);
  }
  if (links_) {
    Status s = links_->Connect(deadline, name, timeout);
    if (!s.ok()) {
      if (s.code() == Code::kTimeout) Stats().rendezvousTimeouts.fetch_add(1);
      JR_STATUS_FRAME_(s);
      return s;
    }
  }
  connected_ = true;
  return Status::Ok();
}

std::string Communicator::CallText(int rank) {
  std::lock_guard<std::mutex> lock(callTextMu_);
  return callTexts_[size_t(rank)];
}

bool Communicator::PeerFailed(int rank, std::string* why) {
  if (shm_ && shm_->AnyFailed(why)) return true;
  if (links_ && links_->Failed(why)) return true;
  if (!shm_) return false;
  {
    std::lock_guard<std::mutex> lock(livenessMu_);
    if (!peerWhy_.empty()) {  // found before: it stays so
      *why = peerWhy_;
      return true;
    }
  }
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  const int64_t last = livenessCheckedNs_.load(std::memory_order_relaxed);
  if (now - last < 50000000) return false;
  std::unique_lock<std::mutex> lock(livenessMu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  livenessCheckedNs_.store(now, std::memory_order_relaxed);
  for (int q = 0; q < nRanks(); ++q) {
    if (placement_.local[size_t(q)] || shm_->Region(q) == nullptr) continue;
    if (shm_->Liveness(q) == PeerLiveness::kExited) {
      *why = detail::StrCat(RankString(q), " exited (its process is gone)");
      peerWhy_ = *why;
      return true;
    }
    // A peer blocked in another call at the same number (e.g. sending into a FIFO that this
    // rank, blocked itself, never drains): the steps never reach a receiver's check.
    uint64_t calls = 0, call = 0;
    std::string text;
    if (shm_->EnteredCall(q, &calls, &call, &text) &&
        calls == entered_[size_t(rank)].load(std::memory_order_acquire) &&
        call != calls_[size_t(rank)].load(std::memory_order_acquire)) {
      *why = detail::StrCat("mismatched calls: ", RankString(q), " runs its ", text, " where ",
                            RankString(rank), " runs its ", CallText(rank),
                            " (the processes ran different collectives at this point, or the same "
                            "ones in a different order)");
      peerWhy_ = *why;
      return true;
    }
  }
  return false;
}

std::string Communicator::Culprits(int rank, uint64_t seq) {
  if (links_) links_->QueryPeers(std::chrono::milliseconds(1000));
  std::vector<std::string> out;
  for (int q = 0; q < nRanks(); ++q) {
    if (q == rank || placement_.local[size_t(q)]) continue;
    const std::string who = RankString(q);
    uint64_t entered = 0;
    bool known = false;
    if (links_ && links_->netRank(q)) {
      uint64_t call = 0;
      std::string theirs;
      const int st = links_->PeerStatus(q, &entered, &call, &theirs);
      if (st == 2) continue;  // it failed on its own and said so: not a missing rank
      if (st == 1 && entered == seq + 1 && call != calls_[size_t(rank)].load()) {
        out.push_back(detail::StrCat(
            "mismatched calls: ", who, " runs its ",
            theirs.empty() ? detail::StrCat("call #", seq, " (not known)") : theirs, " where ",
            RankString(rank), " runs its ", CallText(rank),
            " (the processes ran different collectives at this point, or the same ones in a "
            "different order)"));
        continue;
      }
      if (st < 0) {
        out.push_back(
            detail::StrCat(who, " exited (its connection closed without a failure notice)"));
        continue;
      }
      if (st == 0) {
        out.push_back(detail::StrCat(
            who,
            " did not answer a status query within 1 s (its process is stopped, frozen or "
            "unreachable)"));
        continue;
      }
      known = true;
    } else if (shm_ && shm_->Region(q) != nullptr) {
      const PeerLiveness l = shm_->Liveness(q);
      if (l == PeerLiveness::kExited) {
        out.push_back(detail::StrCat(who, " exited (its process is gone)"));
        continue;
      }
      if (l == PeerLiveness::kStopped) {
        out.push_back(detail::StrCat(
            who, " is stopped (its process does not run: SIGSTOP, or held by a debugger)"));
        continue;
      }
      entered = shm_->Entered(q);
      known = true;
    }
    if (known && entered < seq + 1) {
      out.push_back(detail::StrCat(
          who, " never arrived at call #", seq, " of the group",
          entered == 0 ? std::string(" (it started no call on this group)")
                       : detail::StrCat(" (the last call it started is #", entered - 1, ")")));
    }
  }
  std::string text;
  for (size_t i = 0; i < out.size(); ++i) text += (i ? "; " : "") + out[i];
  return text;
}

Status Communicator::CopyPointToPoint(Execution& e, const std::string& name) {
  // Every receive, paired with its sender's send: (destination, source, bytes).
  struct Copy {
    char* to;
    const char* from;
    int64_t bytes;
  };
  std::vector<Copy> copies;
  const int n = nRanks();
  for (int r = 0; r < n; ++r) {
    JR_REQUIRE(e.p2p[size_t(r)] != nullptr, Code::kInternal, "jax_rccl: '", name, "': rank ", r,
               " posted no point-to-point transfers to a one-shot call");
    const std::vector<Arrival::P2pSlot>& mine = *e.p2p[size_t(r)];
    for (size_t s = 0; s < mine.size(); ++s) {
      const Arrival::P2pSlot& in = mine[s];
      if (in.send || in.bytes == 0) continue;
      JR_REQUIRE(in.peer >= 0 && in.peer < n, Code::kInternal, "jax_rccl: '", name, "': rank ", r,
                 " receives from rank ", in.peer, " of ", n);
      JR_REQUIRE(e.p2p[size_t(in.peer)] != nullptr, Code::kInternal, "jax_rccl: '", name,
                 "': rank ", in.peer, " posted no point-to-point transfers to a one-shot call");
      const std::vector<Arrival::P2pSlot>& theirs = *e.p2p[size_t(in.peer)];
      const char* from = nullptr;
      for (size_t t = 0; t < theirs.size() && from == nullptr; ++t) {
        const Arrival::P2pSlot& out = theirs[t];
        if (out.send && out.peer == r && out.k == in.k) {
          JR_REQUIRE(out.bytes == in.bytes, Code::kInvalidUsage, "jax_rccl: '", name,
                     "': ", RankString(in.peer), " sends ", out.bytes, " bytes where ",
                     RankString(r), " receives ", in.bytes);
          from = static_cast<const char*>(e.peers[size_t(in.peer)][t].send);
        }
      }
      JR_REQUIRE(from != nullptr, Code::kInvalidUsage, "jax_rccl: '", name, "': ", RankString(r),
                 " receives from ", RankString(in.peer), " a transfer it does not send");
      copies.push_back({static_cast<char*>(e.peers[size_t(r)][s].recv), from, in.bytes});
    }
  }
  // A receive may land where another transfer's source lies (an operand and a result sharing
  // a buffer): then every source is read before anything is written.
  bool overlap = false;
  for (size_t i = 0; i < copies.size(); ++i) {
    for (size_t j = 0; j < copies.size(); ++j) {
      const Copy& a = copies[i];
      const Copy& b = copies[j];
      overlap = overlap || (i != j && a.to < b.from + b.bytes && b.from < a.to + a.bytes);
    }
  }
  if (!overlap) {
    for (const Copy& c : copies) {
      if (c.to != c.from) std::memmove(c.to, c.from, size_t(c.bytes));
    }
    return Status::Ok();
  }
  std::vector<std::vector<char>> staged;
  staged.reserve(copies.size());
  for (const Copy& c : copies) staged.emplace_back(c.from, c.from + c.bytes);
  for (size_t i = 0; i < copies.size(); ++i) {
    std::memcpy(copies[i].to, staged[i].data(), size_t(copies[i].bytes));
  }
  return Status::Ok();
}

Status Communicator::RunOneShot(Execution& e, int rank, double timeout, const std::string& name,
                                const std::function<Status(const ExecContext&)>& body,
                                std::unique_lock<std::mutex>& lock) {
  // Every rank's earlier executions end first (their buffers and FIFOs are theirs until then):
  // this thread runs every rank's share, so it waits for every rank's turn.
  Status result;
  for (int k = 0; k < nRanks() && result.ok(); ++k) result = WaitTurn(e, k, timeout, name, lock);
  if (result.ok() && !e.p2p.empty()) {
    lock.unlock();
    result = CopyPointToPoint(e, name);
    Stats().oneShots.fetch_add(1, std::memory_order_relaxed);
    lock.lock();
  } else if (result.ok()) {
    lock.unlock();
    ExecContext ctx;
    ctx.rank = rank;
    ctx.nRanks = nRanks();
    ctx.transport = transport_.get();
    ctx.peers = &e.peers;
    ctx.deadline = DeadlineIn(timeout);
    ctx.aborted = &failed_;
    ctx.name = name;
    ctx.rankNames = &rankNames_;
    ctx.whole = true;
    result = body(ctx);
    Stats().oneShots.fetch_add(1, std::memory_order_relaxed);
    lock.lock();
  }
  e.oneShotResult = result;
  e.complete = true;
  if (result.ok()) {
    for (int k = 0; k < nRanks(); ++k) ++served_[k];
  }
  cv_.notify_all();
  lock.unlock();
  if (!result.ok()) {
    JR_STATUS_FRAME_(result);
    Fail(result.message());
  }
  return result;
}

// One rank's execution from its turn on: publishes the call it runs (its number and identity, for
// peers that time out), builds the context the body runs with, and serves the turn when it ends,
// whatever the outcome (the rank's next execution may then start).
class Communicator::ExecScope {
 public:
  ExecScope(Communicator* c, Execution* e, int rank, uint64_t callId, const std::string& what,
            double timeout, const std::string& name)
      : c_(c), e_(e), rank_(rank), timeout_(timeout), name_(name) {
    const uint64_t seq = e->ticket;
    if (c->crossProcess()) {
      char id[17];
      std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(callId));
      std::string text = detail::StrCat("call #", seq, " '", name, "' (", what.empty() ? "" : what,
                                        what.empty() ? "" : "; ", "id ", id, ")");
      if (c->shm_) c->shm_->SetEntered(rank, seq + 1, callId, text);
      std::lock_guard<std::mutex> lock(c->callTextMu_);
      c->callTexts_[size_t(rank)] = std::move(text);
    }
    // Readers (the progress thread) take (entered, call) only when entered reads the same
    // non-zero value before and after the call.
    c->entered_[size_t(rank)].store(0, std::memory_order_seq_cst);
    c->calls_[size_t(rank)].store(callId, std::memory_order_seq_cst);
    c->entered_[size_t(rank)].store(seq + 1, std::memory_order_seq_cst);

    ctx_.rank = rank;
    ctx_.nRanks = c->nRanks();
    ctx_.transport = c->transport_.get();
    ctx_.peers = &e->peers;
    ctx_.deadline = DeadlineIn(timeout);
    ctx_.aborted = &c->failed_;
    ctx_.callId = callId;
    ctx_.seq = seq;
    ctx_.checkSteps = c->checkSteps_;
    ctx_.rankNames = &c->rankNames_;
    if (c->shm_ || c->links_) {
      ctx_.peerFailed = [c, rank](std::string* why) { return c->PeerFailed(rank, why); };
    }
    ctx_.name = name;
    // ExecContext::barrier takes no arguments: the scope binds the rank (capturing `this` keeps
    // the std::function free of allocations).
    if (c->crossProcess()) {
      ctx_.barrier = [this]() -> Status {
        JR_FAIL(Code::kUnsupported, "jax_rccl: '", name_,
                "': the Direct algorithm reads the peers' buffers in place and needs every rank "
                "of the group in one process; the group of devices ",
                c_->DevicesString(), " spans processes (use Ring or Tree)");
      };
    } else {
      ctx_.barrier = [this]() -> Status { return c_->Barrier(*e_, rank_, ctx_.deadline, name_); };
    }
  }
  ExecScope(const ExecScope&) = delete;
  ExecScope& operator=(const ExecScope&) = delete;
  ~ExecScope() {
    // An exception out of the body (the handler's guard reports it) may leave a step half moved:
    // nothing runs on this communicator after it.
    if (std::uncaught_exceptions() > exceptions_) {
      c_->Fail(detail::StrCat("jax_rccl: '", name_, "': ", c_->RankString(rank_),
                              " stopped in call #", e_->ticket, " by an exception"));
    }
    std::lock_guard<std::mutex> lock(c_->mu_);
    ++c_->served_[rank_];
    c_->cv_.notify_all();
  }

  // Connects the group's transports (across processes, once), runs `body` (*ran) and, over
  // sockets, waits until this rank's last steps are on the wire (the process may exit after this
  // call).
  Status Run(const std::function<Status(const ExecContext&)>& body, bool* ran) {
    if (c_->crossProcess()) {
      JR_CHECK(c_->Connect(ctx_.deadline, timeout_, name_));
      if (c_->shm_) c_->shm_->MaybeUnlink();
    }
    *ran = true;
    JR_CHECK(body(ctx_));
    if (c_->links_ && !c_->links_->WaitDrained(rank_, ctx_.deadline)) {
      std::string why = "the deadline (JAX_RCCL_TIMEOUT) passed";
      c_->links_->Failed(&why);
      return Status(Code::kTimeout,
                    detail::StrCat("jax_rccl: '", name_, "': ", c_->RankString(rank_),
                                   " could not hand its last steps to the sockets: ", why));
    }
    return Status::Ok();
  }

 private:
  Communicator* c_;
  Execution* e_;
  int rank_;
  double timeout_;
  const std::string& name_;
  const int exceptions_ = std::uncaught_exceptions();
  ExecContext ctx_;
};

Status Communicator::Run(const ExecKey& key, Arrival arrival, double timeout,
                         const std::string& name,
                         const std::function<Status(const ExecContext&)>& body) {
  const InsideRun inside;  // for PoolStallError
  const int rank = arrival.rank;
  JR_REQUIRE(rank >= 0 && rank < nRanks(), Code::kInternal, "jax_rccl: rank ", rank,
             " out of range for the group of devices ", DevicesString());
  JR_REQUIRE(placement_.local[rank], Code::kInternal, "jax_rccl: ", RankString(rank),
             " of the group of devices ", DevicesString(), " does not belong to this process (",
             placement_.thisProcess, ")");
  const Clock::time_point deadline = DeadlineIn(timeout);
  // The call's identity on the wire: what the lowering says is called, and what was planned.
  const uint64_t callId = HashMix(static_cast<uint64_t>(key.callSite), arrival.collFingerprint);
  // What the call moves (the plan's tasks), shortened to fit a segment's published text.
  const std::string what =
      arrival.what.size() > 96 ? arrival.what.substr(0, 93) + "..." : arrival.what;
  std::shared_ptr<Execution> e;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_.load()) return FailedError(name);
    Status joinError;
    const bool cannotRun = !arrival.error.ok();
    e = Join(key, std::move(arrival), &joinError);
    JR_CHECK(joinError);
    if (cannotRun) {  // posted for the local ranks; no waiting
      Status v = e->verdict;
      if (crossProcess()) {
        lock.unlock();
        Fail(v.message());
      }
      return v;
    }
    if (e->oneShotRank == rank) return RunOneShot(*e, rank, timeout, name, body, lock);
    JR_CHECK(WaitComplete(*e, rank, deadline, timeout, name, lock));
    if (e->oneShotRank >= 0) return e->oneShotResult;  // run for this rank by the last to arrive
    if (!e->verdict.ok()) {
      // Across processes the other processes' ranks would wait for this call's data: stop them.
      Status v = e->verdict;
      if (crossProcess()) {
        lock.unlock();
        Fail(v.message());
      }
      return v;
    }
    JR_CHECK(WaitTurn(*e, rank, timeout, name, lock));
  }
  Status result;
  {
    ExecScope scope(this, e.get(), rank, callId, what, timeout, name);
    bool ran = false;  // the transports connected and the body ran
    result = scope.Run(body, &ran);
    if (!result.ok()) {
      result = ExplainFailure(std::move(result), ran, rank, e->ticket, timeout, name);
    }
  }  // the turn is served
  if (!result.ok()) {
    JR_STATUS_FRAME_(result);
    // The other ranks may wait on this one inside the executor or in other processes: stop them.
    Fail(result.message());
  }
  return result;
}

// Why rank's call #seq failed, in one place: a timeout of its own in the body (`ran`; not a
// peer's failure) names the ranks that did not come to the call; a failure that stopped it names
// the first failure, a peer's or this communicator's.
Status Communicator::ExplainFailure(Status result, bool ran, int rank, uint64_t seq, double timeout,
                                    const std::string& name) {
  if (!crossProcess()) return ExplainByFirstFailure(std::move(result));
  std::string why;
  bool peerFailed = !failed() && PeerFailed(rank, &why);
  if (ran && result.code() == Code::kTimeout && !failed() && !peerFailed) {
    const std::string culprits = Culprits(rank, seq);
    result =
        Status(result.code(),
               culprits.empty()
                   ? detail::StrCat(result.message(), " [every rank of the group of devices ",
                                    DevicesString(), " started call #", seq,
                                    "; the ranks stalled inside it]")
                   : detail::StrCat("jax_rccl: '", name, "' (call #", seq, ") timed out after ",
                                    timeout, " s (JAX_RCCL_TIMEOUT) on ", RankString(rank), ": ",
                                    culprits, " [", result.message(), "]"));
    // Asking the peers takes a while: a peer may have failed meanwhile.
    peerFailed = !failed() && PeerFailed(rank, &why);
  }
  if (peerFailed && result.message().find(why) == std::string::npos) {
    result = Status(result.code(), detail::StrCat(result.message(), " [", why, "]"));
  }
  return ExplainByFirstFailure(std::move(result));
}

// A failure after this communicator failed: says what the first failure was.
Status Communicator::ExplainByFirstFailure(Status result) {
  if (!failed()) return result;
  std::string first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = failReason_;
  }
  if (first.empty() || result.message().find(first) != std::string::npos) return result;
  return Status(result.code(),
                detail::StrCat(result.message(), " [the first failure: ", first, "]"));
}

}  // namespace cpu
}  // namespace jax_rccl
