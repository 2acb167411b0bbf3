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
// The device table maps XLA's device ordinals (the execute context's DeviceOrdinal) to JAX's
// global device ids and back; Python sets it at registration from jax.local_devices().
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

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

// The topology GPU communicators plan with: `nRanks` GPUs of one node in one process, the
// architecture this build targets, channels from JAX_RCCL_NCHANNELS (default 16), LL and Simple
// (the protocols the device code implements).
TopologyView GpuTopology(int nRanks, const Params& params);

class GpuComm {
 public:
  GpuComm(std::vector<int64_t> devices, std::vector<int> ordinals, TopologyView topo,
          double timeout);
  GpuComm(const GpuComm&) = delete;
  GpuComm& operator=(const GpuComm&) = delete;
  // Allocates the status and abort words (a group of several ranks).
  Status Init();
  // A group spanning processes: its placement and its segments (this process's created).
  void SetShared(comm::GroupPlacement placement, std::unique_ptr<comm::ShmGroup> shm);
  bool shared() const { return shm_ != nullptr; }

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
  // kernels in flight stop, wakes ranks waiting to join; returns `s`.
  Status Fail(Status s);

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
  comm::GroupPlacement placement_;
  std::unique_ptr<comm::ShmGroup> shm_;
  // Exports `rank`'s region, maps the other processes' regions into published_ (deadline), and
  // lowers planTopo_'s channels to what the GPUs hold for the ranks sharing them.
  Status TradeRegions(int rank, const std::string& who);
};

// The communicator of `devices` (global ids, in rank order), created on first use. A group with
// devices of other processes on this host needs exactly one of its devices in this process;
// several hosts, or several local devices in such a group: kUnsupported.
StatusOr<GpuComm*> GetOrCreateComm(const std::vector<int64_t>& devices, const Params& params,
                                   const std::string& who);
// The communicator of `devices` if it exists, else null.
GpuComm* FindComm(const std::vector<int64_t>& devices);
// How many GPU communicators exist.
int64_t CommCount();

}  // namespace gpu
}  // namespace jax_rccl
