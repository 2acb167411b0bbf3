// Communicators of the CPU runtime: one per replica group (its devices in rank order), formed on
// first use in this process, each with its topology view, its host transport and the rendezvous
// through which the ranks of one execution meet.
//
// A group whose devices all belong to this process runs in-process (loopback links, Direct reads of
// peers' buffers, heap FIFOs). A group spanning processes (the world table, world.h) holds this
// process's ranks only: its topology has shm links and no direct peers (the planner picks Ring,
// Tree or p2p), and each pair of ranks talks through FIFOs chosen per pair of processes: in
// shared-memory segments (shm.h, one per rank, mapped on the first execution) when both
// processes share a host, through the network proxy and interface of GPU groups (net_links.h: our
// TCP or UCX) otherwise, or between all processes when JAX_RCCL_TRANSPORT=socket. A group across
// hosts plans with one node per host (one per process when sockets are forced) and network links
// between them. Local ranks meet at the rendezvous as below; ranks in other processes are
// synchronized by the FIFOs themselves: every FIFO step carries the call's identity and number
// (StepTag), which the receiver checks before it reads the step, so ranks that run different calls
// (or the same calls in different orders) fail with an error naming both calls instead of mixing
// their data. A call's identity is the lowering's `call_site` (a hash of what is called: kind,
// group, shapes, dtypes, op, root, perm, settings and the call's position in its module) mixed with
// the plan's fingerprint; its number is its ticket below, the same in every process of the group.
//
// Failures across processes: a process whose communicator fails posts the reason in every mapped
// segment and sends it as a failure notice to every process it reaches over the network before
// resetting those connections, so every peer reports the first failure. A rank that times out names
// the ranks that did not come: a peer process that exited or is stopped (same host: its pid), or
// that never started the call (the count of calls each rank started, in its segment or answered by
// its process's listener: net_links.h).
//
// An execution is one call of one call site: its n invocations (one per device of the group) run
// on n threads of the CPU client's pool and meet under the key (instance, call site, run id).
// Executions of one communicator run through its FIFOs one after another: when the last rank of an
// execution arrives, the execution gets the communicator's next ticket, and every rank runs its
// tickets in increasing order, so all ranks see the same order on their connections even when
// JAX has several executions in flight.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ffi/comm/group.h"
#include "ffi/comm/shm.h"
#include "ffi/comm/world.h"
#include "ffi/core/params.h"
#include "ffi/core/status.h"
#include "ffi/host/executor.h"
#include "ffi/planner/types.h"

namespace jax_rccl {
namespace host {
class HostFifoTransport;
}  // namespace host

namespace cpu {

// What the CPU runtime uses of the layer it shares with the GPU runtime (ffi/comm/).
using comm::CallFingerprint;
using comm::CountNodes;
using comm::EnsureWorld;
using comm::FingerprintPlan;
using comm::GetWorldTable;
using comm::GroupPlacement;
using comm::HashMix;
using comm::ListString;
using comm::P2pTransferHash;
using comm::PeerLiveness;
using comm::PlaceGroup;
using comm::ReapSession;
using comm::ShmGroup;
using comm::ShmNameTag;
using comm::WorldTable;

// The host executor's types it runs on (ffi/host/).
using host::Clock;
using host::ExecContext;
using host::HostFifoTransport;
using host::HostTransport;
using host::SlotBuffers;

// The topology the CPU runtime plans with: one node of `nRanks` ranks in one process (arch cpu,
// loopback links, ranks read each other's buffers), channels from JAX_RCCL_NCHANNELS (default 2),
// RCCL's default connection buffer sizes.
TopologyView CpuTopology(int nRanks, const Params& params);

// Identifies one execution: the state instance (one per compiled call site), the call site and
// XLA's run id (shared by the devices of one call, a counter of the executable).
struct ExecKey {
  int64_t instance = 0;
  int64_t callSite = 0;
  int64_t runId = 0;
  bool operator<(const ExecKey& o) const {
    return std::tie(instance, callSite, runId) < std::tie(o.instance, o.callSite, o.runId);
  }
};

// What a rank brings to the rendezvous.
struct Arrival {
  int rank = 0;
  std::vector<SlotBuffers> slots;  // its buffers, by task slot
  // Hash of its collective tasks; every rank of a call must post the same one.
  uint64_t collFingerprint = 0;
  // What its tasks move ("all_reduce float32 x1024 sum; ..."; CallFingerprint::text), for
  // messages that name the call.
  std::string what;
  // Rank-independent sums over its point-to-point tasks: the sends of all ranks must pair with
  // the receives of all ranks, so the two totals over the group agree.
  uint64_t sendHash = 0;
  uint64_t recvHash = 0;
  // Set when the rank cannot take part (its plan failed to build): the execution then fails on
  // every rank at once instead of the others waiting for the deadline.
  Status error;
  // The plan may run one-shot (host::OneShotEligible; the same on every rank, whose plans agree):
  // in a group within one process, the last rank to arrive runs the body for every rank
  // (ExecContext::whole) and the others return when it is done, woken once.
  bool oneShot = false;
  // A one-shot plan of point-to-point tasks only (every rank's, as their plans agree): by slot,
  // the peer, the bytes and the index of the transfer among this rank's sends to (or receives
  // from) that peer; the runner pairs the k-th receive from p with p's k-th send to this rank
  // and copies, instead of running the body. Owned by the caller's plan (it outlives the call).
  struct P2pSlot {
    bool send = false;
    int peer = -1;
    int k = 0;
    int64_t bytes = 0;
  };
  const std::vector<P2pSlot>* p2p = nullptr;
};

struct Execution;
class NetLinks;

class Communicator {
 public:
  // In-process: every rank of `devices` belongs to this process.
  Communicator(std::vector<int64_t> devices, TopologyView topo,
               std::unique_ptr<HostTransport> transport);
  // Across processes: `placement` says which ranks are local; `shm` holds the segments of the
  // ranks on this host (this process's already created; null when no other process of the group
  // shares the host), `links` the sockets to the other ranks (null when none), and `transport`
  // is the shared FIFO transport over both.
  Communicator(std::vector<int64_t> devices, TopologyView topo,
               std::unique_ptr<HostTransport> transport, GroupPlacement placement,
               std::unique_ptr<ShmGroup> shm, std::unique_ptr<NetLinks> links);
  ~Communicator();

  int nRanks() const { return static_cast<int>(devices_.size()); }
  bool crossProcess() const { return placement_.crossProcess; }
  const GroupPlacement& placement() const { return placement_; }
  // "rank r (device d)", across processes "rank r (device d, process p, host 'h')", for messages.
  std::string RankString(int rank) const { return rankNames_[size_t(rank)]; }
  const std::vector<int64_t>& devices() const { return devices_; }
  const TopologyView& topo() const { return topo_; }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // Ranks reached over sockets (none in-process or on one host with shared memory).
  bool usesSockets() const { return links_ != nullptr; }
  // Whether received FIFO steps are checked against the call (JAX_RCCL_CHECK_CALLS; senders
  // always tag them).
  void SetCheckSteps(bool on) { checkSteps_ = on; }
  const NetLinks* links() const { return links_.get(); }

  // Runs one rank's part of the execution `key`: posts `arrival`, waits for every rank of the
  // group (until `timeout` seconds from now), checks that the ranks agree on the call, waits for
  // this rank's turn on the communicator, then calls `body` with the execution's context (peers'
  // buffers, barrier, deadline, abort flag). `name` is the collective, for messages.
  Status Run(const ExecKey& key, Arrival arrival, double timeout, const std::string& name,
             const std::function<Status(const ExecContext&)>& body);

  // Marks the communicator failed (the first reason is kept), wakes every waiter (also those
  // inside the transport) and drops the pending rendezvous entries.
  void Fail(const std::string& reason);

  // "[0, 1, 2]" of the group's devices, for messages.
  std::string DevicesString() const;

  // Seconds a rendezvous missing a local rank waits with the whole process idle before it fails
  // the call as a stall of XLA's CPU thread pool (PoolStallError); 0 turns the check off.
  void SetStallGrace(double seconds) { stallGrace_ = seconds; }

 private:
  struct StallWindow;
  std::shared_ptr<Execution> Join(const ExecKey& key, Arrival arrival, Status* error);
  Status WaitComplete(Execution& e, int rank, Clock::time_point deadline, double timeout,
                      const std::string& name, std::unique_lock<std::mutex>& lock);
  // Called by a rank waiting in the rendezvous of execution `key` (`present`: its ranks that
  // arrived) at each poll: the error that ends the wait when XLA's thread pool cannot start the
  // missing local ranks, else Ok (comm_stall.cc).
  Status PoolStallError(const ExecKey& key, const std::vector<uint8_t>& present, int rank,
                        const std::string& name, StallWindow& w);
  // The last rank to arrive at a one-shot execution: runs `body` for every rank (with `lock`
  // released), then completes the execution for all.
  // A one-shot of point-to-point tasks (Arrival::p2p): every receive copied from its send.
  Status CopyPointToPoint(Execution& e, const std::string& name);
  Status RunOneShot(Execution& e, int rank, double timeout, const std::string& name,
                    const std::function<Status(const ExecContext&)>& body,
                    std::unique_lock<std::mutex>& lock);
  // A rank that timed out waiting under `lock` (held again on return): counts it, fails the
  // communicator with `msg` and returns it.
  Status RendezvousTimedOut(const std::string& msg, std::unique_lock<std::mutex>& lock);
  Status WaitTurn(Execution& e, int rank, double timeout, const std::string& name,
                  std::unique_lock<std::mutex>& lock);
  Status Barrier(Execution& e, int rank, Clock::time_point deadline, const std::string& name);
  Status FailedError(const std::string& name) const;  // requires mu_
  // Across processes, before the first execution: maps every peer's segment (once).
  Status Connect(Clock::time_point deadline, double timeout, const std::string& name);
  // Across processes: whether another process failed or a peer's process is gone (*why says
  // which, naming the rank). Liveness is looked up at most every 50 ms.
  bool PeerFailed(int rank, std::string* why);
  // "call #S 'name' (id ...)" of local rank's latest call.
  std::string CallText(int rank);
  // One rank's execution from its turn on (comm.cc).
  class ExecScope;
  // Why rank's call #seq failed (`ran`: in its body, not while connecting), in one place: the
  // ranks that did not come, a peer's failure, the communicator's first failure.
  Status ExplainFailure(Status result, bool ran, int rank, uint64_t seq, double timeout,
                        const std::string& name);
  Status ExplainByFirstFailure(Status result);
  // Across processes, after `rank` timed out in call `seq`: the ranks that did not come to it
  // ("rank r (...) exited", "... is stopped", "... never arrived ...", "... did not answer ..."),
  // "; "-separated, or "" when every rank started the call.
  std::string Culprits(int rank, uint64_t seq);

  const std::vector<int64_t> devices_;
  const TopologyView topo_;
  std::unique_ptr<HostTransport> transport_;
  std::atomic<bool> failed_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  std::string failReason_;
  std::map<ExecKey, std::shared_ptr<Execution>> pending_;  // executions not all ranks reached
  uint64_t nextTicket_ = 0;
  std::vector<uint64_t> served_;  // by rank: tickets it has run
  // (instance, call site) of the executions every local rank reached (PoolStallError).
  std::set<std::pair<int64_t, int64_t>> completedSites_;
  double stallGrace_ = 0;

  // Across processes.
  GroupPlacement placement_;
  int nLocal_ = 0;
  std::unique_ptr<ShmGroup> shm_;
  std::unique_ptr<NetLinks> links_;
  HostFifoTransport* shmTransport_ = nullptr;
  std::mutex connectMu_;
  bool connected_ = false;
  bool checkSteps_ = true;
  std::vector<std::string> rankNames_;
  // By rank (local ones): calls started on this communicator (ticket + 1 of the latest).
  std::unique_ptr<std::atomic<uint64_t>[]> entered_;
  std::unique_ptr<std::atomic<uint64_t>[]> calls_;  // by rank: the identity of that call
  std::mutex callTextMu_;
  std::vector<std::string> callTexts_;  // by rank: CallText
  std::atomic<int64_t> livenessCheckedNs_{0};
  std::mutex livenessMu_;
  std::string peerWhy_;  // what PeerFailed found (under livenessMu_)
};

// The communicators of this process, keyed by their group.
class World {
 public:
  static World& Get();
  // The communicator of `devices` (rank order), formed with `params` on first use: in-process
  // when every device is local, over shared memory when the group spans processes of one host
  // (the world table) and over sockets to the processes of other hosts (or to every other
  // process under JAX_RCCL_TRANSPORT=socket).
  StatusOr<Communicator*> GetOrCreate(const std::vector<int64_t>& devices, const Params& params);

 private:
  std::mutex mu_;
  std::map<std::vector<int64_t>, std::unique_ptr<Communicator>> comms_;
};

}  // namespace cpu
}  // namespace jax_rccl
