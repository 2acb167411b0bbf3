// Communicators of the GPU FFI handlers: groups of GPUs of this process, one device per rank.
//
// A communicator is created at the first execute of any of its ranks and lives for the process.
// It holds, per rank: a connection region on the rank's device (hip/device_conn.h), a device copy
// of every rank's region pointer (peer pointers; peer access enabled between the devices), a
// status word (host-mapped DevStatus), and one abort word for all ranks (host-mapped).
//
// Each rank joins once, at its first execute (for any call site): it allocates its region,
// publishes it, and waits for the other ranks to publish theirs (deadline JAX_RCCL_TIMEOUT) -
// one rendezvous per communicator, never per execution. A group of one device needs none of it
// (its plans are copies).
//
// Across processes of one host (one rank of the group per process, e.g. one process per GPU or
// several processes sharing a GPU under MPS): each rank's region is exported as an IPC handle
// through a small shared-memory segment per rank (ffi/comm/shm.h: "/jrccl.<session>.g<group
// hash>.<rank>", unlinked once every process mapped it) and mapped by the others; a process whose
// communicator fails marks the segments, and the others fail at their next call (kernels already
// running stop at their own deadline).
//
// Across hosts (ranks whose processes name other hosts in the world table): each rank of another
// host is a window in host memory the device maps (hip/device_conn.h: ProxyWindowLayout) and the
// communicator's network proxy (ffi/comm/proxy.h) carries the steps between the windows and the
// regions over the network interface (ffi/comm/net.h, TCP), both ways; ffi/gpu/comm_net.cc. The
// ranks agree on channels and geometry from records every rank sends the others (GpuRecord).
//
// The device table maps XLA's device ordinals (the execute context's DeviceOrdinal) to JAX's
// global device ids and back; Python sets it at registration from jax.local_devices().
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ffi/comm/proxy.h"
#include "ffi/comm/shm.h"
#include "ffi/comm/world.h"
#include "ffi/core/params.h"
#include "ffi/core/status.h"
#include "ffi/planner/planner.h"
#include "hip/runtime.h"

namespace jax_rccl {
namespace gpu {

// ---- The device table ----

// (device ordinal, global device id) of every local GPU; replaces the table.
void SetLocalDevices(const std::vector<std::pair<int, int64_t>>& devices);
// The global id of a local ordinal (without a table: the ordinal itself).
StatusOr<int64_t> GlobalIdOfOrdinal(int ordinal);
// The local ordinal of a global id, or -1 when the device is not in this process.
int OrdinalOfGlobalId(int64_t id);

// The topology GPU communicators plan with: `nRanks` GPUs on `nNodes` nodes (comm::CountNodes)
// under the settings (planner: GpuGroupTopology), with LL128 where this build's device code has it.
TopologyView GpuTopology(int nRanks, int nNodes, const Params& params);

// What each rank of a group spanning processes tells the others at its join (through its segment
// on this host, over the network to other hosts): its GPU, what the GPU holds, and the geometry it
// lays its connections out with (which must be every rank's).
struct GpuRecord {
  char gpu[96];            // "<machine>/<PCI bus id>": one physical GPU, in every process
  int32_t residentBlocks;  // collective blocks that GPU holds at once for the rank's process
  int32_t knownSharers;    // ranks on that GPU in the process's earlier groups (at least 1)
  int32_t nChannels;       // the geometry's
  int32_t netChannels;     // the process's cap on the channels of a group across hosts (0: none)
  int32_t netStreams;  // the process's TCP streams per pair of ranks across hosts (0: per channel)
  int64_t stepBytes[kNumProtocols];
};

class GpuComm {
 public:
  GpuComm(std::vector<int64_t> devices, std::vector<int> ordinals, TopologyView topo,
          double timeout);
  GpuComm(const GpuComm&) = delete;
  GpuComm& operator=(const GpuComm&) = delete;
  // Allocates the status and abort words (a group of several ranks).
  Status Init();
  // How a group reaches ranks of other hosts (the JAX_RCCL_NET_* settings).
  struct NetSettings {
    int threads = 0;    // the network interface's helper threads
    int channels = 0;   // this process's cap on the group's channels (0: none; every rank takes
                        // the smallest of the group's)
    int streams = 0;    // TCP streams carrying the channels between two ranks of different hosts
                        // (0: one per channel; every process of the group sets the same)
    std::string trace;  // the folder of the network proxy's timeline (empty: none)
    std::string backend = "auto";  // JAX_RCCL_NET: auto, socket or ucx (comm::MakeNet)
    bool info = false;             // JAX_RCCL_DEBUG=INFO: each connection's backend on stderr
  };
  // A group spanning processes: its placement, the segments of its ranks on this host (this
  // process's created; null when every other rank is on another host) and `net`.
  // Errors: the network JAX_RCCL_NET names cannot be made (comm::MakeNet).
  Status SetShared(comm::GroupPlacement placement, std::unique_ptr<comm::ShmGroup> shm,
                   const NetSettings& net);
  bool shared() const { return crossProcess_; }
  // Some rank is on another host (its steps go through the network proxy).
  bool crossHost() const { return crossHost_; }
  // "rank 2 (device 5, process 1, host 'b')"
  std::string RankText(int rank) const;

  int nRanks() const { return topo_.nRanks; }
  // The topology plans are made with. Groups sharing a GPU across processes: after the join, its
  // channels lowered to what the GPU holds for all the group's ranks on it at once (every rank
  // computes the same count from the records the ranks trade; the regions keep the first count).
  const TopologyView& topo() const { return planTopo_; }
  const Geometry& geo() const { return geo_; }
  int ordinal(int rank) const { return ordinals_[static_cast<size_t>(rank)]; }
  const std::vector<int64_t>& devices() const { return devices_; }
  // "[0, 1, 2, 3]"
  const std::string& groupText() const { return groupText_; }

  // Rank `rank`'s first use (idempotent, thread-safe): its region, the rendezvous with the other
  // ranks, peer access, its region table. `who` names the collective for messages.
  Status Join(int rank, const std::string& who);
  bool joined(int rank) const {
    return ranks_[static_cast<size_t>(rank)].joined.load(std::memory_order_acquire);
  }

  // An error when an earlier launch of this communicator failed (read from the mapped status
  // words: no synchronization) or the communicator failed before; the communicator stays failed.
  Status Check(int rank, const std::string& who);

  // What a launch of `rank` on `stream` needs (after Join).
  RankLaunch Launch(int rank, void* stream) const;

  // Rank `rank`'s connection counters as its own region holds them, for every (channel, peer):
  // {channel, peer, tail, head} of the connection peer -> rank, then {send tail, send head} of the
  // connection rank -> peer (hip/kernel_piece.h keeps a sender's side there). Empty before Join.
  StatusOr<std::vector<std::array<int64_t, 6>>> Counters(int rank) const;

  // Marks the communicator failed with `s` (the first failure stays), raises the abort word so
  // kernels in flight stop, wakes ranks waiting to join; returns `s`. A failure this process
  // found (`tell`) goes to the processes of other hosts (a notice, comm/notice.h; `primary`: its
  // own finding, not a peer's reset) before the processes of this host learn it (the segments)
  // and before the proxy resets its connections, so that no reset overtakes the reason; one
  // learned from another process is not sent on (that process tells the others itself).
  Status Fail(Status s, bool tell = true, bool primary = true);
  // Stops the network proxy (a group across hosts; process exit): comm_net.cc.
  void StopProxy();

  // The call check (hip/kernel_check.h; comm_check.cc): the call whose identity is `id` is named
  // `name` ("psum over ('i',)") and moves `what` ("all_reduce float32 x4096 sum"), for messages.
  // Each plan's build notes its call.
  void NoteCall(uint64_t id, const std::string& name, const std::string& what);
  // Across processes: a thread that, every millisecond, passes a failure of this process's
  // launches to the other processes (Fail: the segments and the network proxy) and a failure
  // posted by another process to this process's kernels (the abort word), so that every rank's
  // kernels stop within milliseconds instead of at their deadline.
  void StartWatch();
  // Stops the failure watch (process exit): comm_check.cc.
  void StopWatch();

 private:
  struct RankState {
    std::mutex joinMu;  // one join at a time per rank
    std::atomic<bool> joined{false};
    void* region = nullptr;       // on the rank's device
    void* regionTable = nullptr;  // device array [nRanks] on the rank's device
  };

  const std::vector<int64_t> devices_;
  const std::vector<int> ordinals_;
  const TopologyView topo_;
  const Geometry geo_;
  TopologyView planTopo_;  // set before `joined` (a shared group: in TradeRegions)
  const double timeout_;
  const uint64_t timeoutNs_;
  bool systemFence_ = false;
  std::string groupText_;
  std::vector<RankState> ranks_;
  Mapped status_;  // DevStatus per rank
  Mapped abort_;

  std::mutex mu_;  // guards published_, nPublished_, failure_
  std::condition_variable cv_;
  std::vector<void*> published_;  // regions by rank, as published
  int nPublished_ = 0;
  std::atomic<bool> failed_{false};
  Status failure_;

  // Across processes.
  bool crossProcess_ = false;
  bool crossHost_ = false;
  comm::GroupPlacement placement_;
  std::vector<uint8_t> otherHost_;  // by rank: on another host than this process
  int netChannels_ = 0;             // SetShared's
  int netStreams_ = 0;              // SetShared's
  std::string netTrace_;            // SetShared's
  std::unique_ptr<comm::ShmGroup> shm_;
  // Across hosts (ffi/gpu/comm_net.cc): by rank, the window of a rank of another host; the proxy.
  std::vector<Mapped> windows_;
  std::mutex proxyMu_;  // guards proxy_'s assignment against StopProxy (process exit)
  bool proxiesStopped_ = false;
  std::unique_ptr<comm::NetProxy> proxy_;
  std::atomic<comm::NetProxy*> liveProxy_{nullptr};  // proxy_ once connected (Fail reads it)

  // Exports `rank`'s region and maps the other processes' regions on this host into published_,
  // trades every rank's GpuRecord (deadline), lowers planTopo_'s channels to what the GPUs hold
  // for the ranks sharing them, and connects the windows of ranks on other hosts.
  Status TradeRegions(int rank, const std::string& who);
  // This process's record (its GPU, what the GPU holds, the geometry).
  StatusOr<GpuRecord> OwnRecord() const;
  // Every rank's record from the ranks of other hosts into (*recs)[r], this rank's sent to them
  // over the network (comm_net.cc).
  Status ExchangeRecords(int rank, const std::string& who, Clock::time_point deadline,
                         std::vector<GpuRecord>* recs);
  // The windows of the ranks of other hosts (published_) and the proxy serving them, connected
  // to every such rank's proxy by `deadline` (comm_net.cc).
  Status ConnectHosts(int rank, const std::string& who, Clock::time_point deadline);
  // Failure notices across hosts (comm/notice.h; comm_net.cc): this process's failure `s` to
  // every process of the group on another host (within a second), and the failure such a process
  // posted for this one (Ok: none), as this communicator's failure.
  // (`process` >= 0: to that process of another host only, as an answer to its notice.)
  void TellOtherHosts(const Status& s, bool primary, int process = -1);
  // *primaryFrom: the process whose own finding the notice is (-1: it passes on another's).
  Status NoticeFromOtherHosts(int* primaryFrom = nullptr) const;
  // The first notice from another host that comes within `ms` (Ok: none came); `from` >= 0: the
  // first of process `from` (the others are dropped).
  Status AwaitNotice(int ms, int from = -1) const;
  uint64_t netGroup_ = 0;           // the group's key on the network and its notices (SetShared)
  std::unique_ptr<comm::Net> net_;  // across hosts (SetShared): ExchangeRecords's, then the proxy's
  // The failure the communicator keeps (after failed_ is set).
  Status Failure();

  // The call check's names (comm_check.cc): the calls noted, by identity.
  mutable std::mutex callsMu_;
  std::map<uint64_t, std::pair<std::string, std::string>> calls_;
  // "call #3 'psum over ('i',)' (all_reduce float32 x4096 sum; id 0123456789abcdef)".
  std::string CallText(uint64_t id, uint64_t seq) const;
  // The call of rank `peer` whose tag (its low `bits` bits) is `seen`, near number `seq`: a call
  // this process noted, or the one the peer published in its segment; *text says what the tag
  // says when neither has it (then false). *sameSeq: the call has number `seq`.
  bool FindPeerCall(uint32_t seen, int bits, uint64_t seq, int peer, std::string* text,
                    bool* sameSeq) const;
  // The error of rank `rank`'s failed launch, whose status is `st` (`who`: the call that finds
  // it; empty: the call the status names).
  Status LaunchError(int rank, const DevStatus& st, const std::string& who) const;
  // Raises the abort word: every running kernel of this process stops at its next wait.
  void RaiseAbort() {
    if (abort_.host != nullptr) *static_cast<volatile int32_t*>(abort_.host) = 1;
  }
  // The calls this process's ranks run now, as "rank 1 (...) runs its call #3 'psum ...' (...)"
  // (empty: none runs a checked launch): raises the abort word, and each running kernel records
  // its call in its status (kDevAborted) within `ms` milliseconds.
  std::string RunningCalls(int ms);
  void Watch();
  // Watch's part until the communicator fails; then Watch drops the notices that still come.
  void WatchUntilFailed();
  std::once_flag watchOnce_;
  std::thread watch_;
  std::atomic<bool> stopWatch_{false};
};

// The key of the group of `devices` on the network (its connections and failure notices).
uint64_t NetGroupOf(const std::vector<int64_t>& devices);

// Stops every GPU communicator's network proxy, closing its connections in order where every step
// is out (process exit: the peers then see an orderly end, not a failure).
void StopProxies();
// Stops every GPU communicator's failure watch (process exit, before the GPU runtime shuts down).
void StopWatches();

// The communicator of `devices` (global ids, in rank order), created on first use. A group with
// devices of other processes (of this host or others) needs exactly one of its devices in this
// process (several: kUnsupported); ranks of other hosts need their processes' endpoints.
StatusOr<GpuComm*> GetOrCreateComm(const std::vector<int64_t>& devices, const Params& params,
                                   const std::string& who);
// The communicator of `devices` if it exists, else null.
GpuComm* FindComm(const std::vector<int64_t>& devices);
// How many GPU communicators exist.
int64_t CommCount();

}  // namespace gpu
}  // namespace jax_rccl
