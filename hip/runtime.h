// The GPU runtime's host interface (plain C++: no HIP or CUDA headers, so host-compiled code such
// as the FFI handlers and the Python bindings can include it). Implemented in hip/runtime.hip
// (the harness and the floors: hip/harness.hip).
//
//   - Geometry / regions: every rank owns a zeroed region of device memory holding the
//     connections into it (hip/device_conn.h); AllocRegion makes one on the current device.
//   - DevicePlan: a Plan's kernels uploaded once (persistent work arrays, block table, task
//     table); Launch passes one execution's buffers and launches on a stream. Nothing per
//     execution is uploaded from the host, so a launch may be captured and replayed.
//   - Harness: several ranks on one GPU in one process (one stream each), for kernel tests and
//     benchmarks without JAX.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ffi/core/status.h"
#include "ffi/planner/planner.h"
#include "hip/device_conn.h"

namespace jax_rccl {
namespace gpu {

// The connection geometry of a topology (step bytes per protocol, 16-byte multiples).
Geometry GeometryOf(const TopologyView& topo);
// Whether the device code was compiled with reductions over `dtype`.
bool DeviceHasDtype(DataType dtype);
// Whether this build's device code runs LL128 (NVIDIA: one warp instruction's 16-byte stores to a
// 128-byte line land together; AMD builds: not yet).
bool DeviceHasLL128();
// "CUDA sm_90" / "HIP gfx90a": what the device library was built for.
std::string DeviceBuildInfo();

// Loads the kernels of `classes` (kCopyClass or a DataType's value) and the launch helpers on the
// current device, each once per device; DevicePlan::Upload calls it, so a plan's kernels are
// loaded before its first launch (CUDA loads a kernel at its first launch by default, which holds
// back the launches behind it while peers' kernels already spin). Raises the device's stack limit
// to the kernels' local memory: a launch needing more than the device holds waits for every
// running kernel while the driver reallocates it, and a rank spinning on a peer whose launch is the
// one waiting would hang until the timeout.
Status LoadKernels(const std::vector<int>& classes);
// Every kernel this build has, loaded on the current device with the stack limit raised to the
// largest of them (LoadKernels of every class; once per device). Loading a kernel and raising the
// stack limit may wait for every kernel running on the device - under MPS, other processes'
// kernels too - so this runs before any peer can have a kernel waiting for this rank: GpuComm::Join
// calls it before the rank publishes its region (no peer launches before every rank published),
// Harness::Create before its first launch. A plan's own LoadKernels then finds nothing to do, also
// when a later collective brings a new element type while a peer's kernel already spins on this
// rank (NCCL loads all its kernels and sets the stack limit at communicator init for this reason).
Status PrepareDevice();

// What the current device holds of this build's collective kernels at once for this process.
// smCount: the multiprocessors this process sees (under MPS with an active thread percentage, its
// share: 66 of an H200's 132 at 50%); blocksPerSm: blocks of kMaxLaunchThreads one multiprocessor
// holds, the fewest over every collective kernel (occupancy from their registers, shared memory and
// threads; 1 on an H200: 128 registers x 512 threads fill its register file);
// mpsActiveThreadPercent: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE as this process has it (100 when
// unset; NVIDIA only); residentBlocks: smCount x blocksPerSm.
struct DeviceCapacity {
  int smCount = 0;
  int blocksPerSm = 0;
  int mpsActiveThreadPercent = 100;
  int residentBlocks = 0;
};
StatusOr<DeviceCapacity> QueryDeviceCapacity();
// The current device's PCI bus id ("0000:1b:00.0"): the same physical GPU in every process.
StatusOr<std::string> DeviceBusId();
// Channels each of `ranksOnDevice` ranks sharing one device may use so that the blocks of one
// launch of every rank are resident at once (`residentBlocks` / ranksOnDevice, at most `want`).
// A channel's block spins for its peers' blocks on the same channel; one that cannot be scheduled
// because the others' spinning blocks fill the device never comes, and every rank times out.
// Error (kUnsupported) when not even one block per rank fits.
StatusOr<int> ResidentChannels(int want, int ranksOnDevice, int residentBlocks);

// Device memory on the current device.
StatusOr<void*> DeviceAlloc(int64_t bytes);
void DeviceFree(void* p);
// Synchronous copies: complete on the device when they return. (A copy from pageable memory may
// return once the data is staged, before its DMA lands; the launch that reads the data runs on
// XLA's stream, which does not wait for the null stream. CopyToDevice therefore waits for the null
// stream too.)
Status CopyToDevice(void* dst, const void* src, int64_t bytes);
Status CopyToHost(void* dst, const void* src, int64_t bytes);
// A zeroed region of `RegionLayout::Bytes(geo)` bytes.
StatusOr<void*> AllocRegion(const Geometry& geo);

// Host memory the device can read and write (the status words and the abort word).
struct Mapped {
  void* host = nullptr;
  void* dev = nullptr;
};
StatusOr<Mapped> MappedAlloc(int64_t bytes);
void MappedFree(const Mapped& m);

// What the kernels of one rank's launch see besides the plan.
struct RankLaunch {
  int rank = 0;
  int nRanks = 1;
  char* const* regionsDev = nullptr;  // device array [nRanks] of region pointers (this device)
  char* ownRegion = nullptr;          // this rank's region (regionsDev[rank])
  DevStatus* statusDev = nullptr;     // this rank's status word (mapped)
  int32_t* abortDev = nullptr;        // the communicator's abort word (mapped)
  uint64_t timeoutNs = 0;
  bool systemFence = false;      // a peer on another device or in another process
  void* stream = nullptr;        // hipStream_t / cudaStream_t
  uint64_t* traceDev = nullptr;  // a timeline buffer [blocks][kTraceEvents], or null
  // The call check (hip/kernel_check.h): the call's identity (its call site mixed with its plan's
  // fingerprint) and whether steps are tagged, counted and checked (JAX_RCCL_CHECK_CALLS).
  uint64_t callId = 0;
  bool checkCalls = true;
  // An exported program's device check in device memory, which the kernels compare with `device`
  // (KernelArgs::deviceCheck); null: none.
  const int64_t* deviceCheck = nullptr;
  int64_t device = -1;
};

// A call in which rank rl.rank launches no collective kernel (it moves nothing): its call
// counters advance on rl's stream all the same, so that the ranks' counts stay equal.
Status AdvanceCalls(const RankLaunch& rl, const Geometry& geo);

// A ragged_all_to_all plan's device side: its shapes and, by task, its table entry.
struct RaggedPlan {
  RaggedDims dims{};
  std::vector<uint64_t> entries;  // RaggedEntry(sender, slice), by task
};

// One rank's plan on the device.
class DevicePlan {
 public:
  // Uploads `plan` (built for one rank) to the current device. Errors: a protocol or element
  // type the device code lacks (kUnsupported). A PreMulSum scalar given by pointer (a per-device
  // scalar) is not taken from the plan: each launch gives its address in the task's
  // SlotPtrs::scalar, and the kernel reads the value when it runs.
  // A ragged_all_to_all plan (`ragged`, ffi/handlers/ragged.h) gives its shapes and every task's
  // table entry (RaggedEntry, by task): each launch's slots give the table's address
  // (SlotPtrs::table), and the kernels read the entries when they run.
  static StatusOr<std::unique_ptr<DevicePlan>> Upload(const Plan& plan, const Geometry& geo,
                                                      const RaggedPlan* ragged = nullptr);
  ~DevicePlan();
  DevicePlan(const DevicePlan&) = delete;
  DevicePlan& operator=(const DevicePlan&) = delete;

  // Launches one execution: `slots[i]` are task i's buffers (device pointers); a task whose op
  // reads a per-device scalar needs `slots[i].scalar` (kInvalidArgument otherwise). `only`: -1
  // launches everything; 0 .. nLaunches() - 1 only that kernel launch (launch 0 with the slot
  // table and the one-rank copies), so that several ranks in one process can issue launch k of
  // every rank before launch k + 1 of any (see Harness::Launch).
  Status Launch(const RankLaunch& rl, const std::vector<SlotPtrs>& slots, int only = -1) const;

  int nKernels() const { return static_cast<int>(kernels_.size()); }
  // Kernel launches per execution (one per class of each kernel), and the largest grid.
  int nLaunches() const;
  int maxBlocks() const;
  int nTasks() const { return nTasks_; }

 private:
  DevicePlan() = default;
  struct Kernel {
    Work* works = nullptr;
    BlockInfo* blocks = nullptr;
    int nBlocks = 0;
    int nThreads = 0;
    uint64_t channels = 0;     // the channels of its blocks
    std::vector<int> classes;  // one launch per class present, ascending (hip/kernel_impl.h)
  };
  struct OneRankTask {
    int64_t bytes = 0;
    int slot = 0;
    bool scaled = false;  // PreMulSum / SumPostDiv on one rank: not a plain copy
    DevTask task{};
    int64_t count = 0;
  };
  std::vector<Kernel> kernels_;
  DevTask* tasks_ = nullptr;
  SlotPtrs* slotTable_ = nullptr;
  int nTasks_ = 0;
  Geometry geo_;
  bool oneRank_ = false;
  std::vector<OneRankTask> oneRankTasks_;
  std::vector<int> scalarSlots_;  // tasks whose op reads SlotPtrs::scalar
  RaggedDims ragged_{};           // a ragged_all_to_all plan's shapes (slices 0: none)
};

// Formats a failed launch's status ("timed out on channel 3 waiting for data from rank 2 ...").
std::string DescribeStatus(const DevStatus& s);
// A copy of a status word the device writes (host-mapped memory).
DevStatus ReadStatus(const volatile DevStatus& s);

// Several ranks of one communicator on the current GPU, in this process, one stream each.
class Harness {
 public:
  static StatusOr<std::unique_ptr<Harness>> Create(const TopologyView& topo, double timeoutS);
  ~Harness();
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  int nRanks() const { return topo_.nRanks; }
  const TopologyView& topo() const { return topo_; }
  // Plans tasks[rank] for every rank (with `tuning`) and uploads the plans (collectives: the same
  // list on every rank; point-to-point: each rank its own sends and receives).
  Status Build(const std::vector<std::vector<TaskDesc>>& tasks, const Tuning& tuning,
               const PlannerParams& params);
  const Plan& plan(int rank) const { return plans_[rank]; }
  // Launches every rank once (or only the ranks in `only`, when given); slots[rank][task]. A plan
  // of several kernel launches (one per element type) is issued launch-major: launch k of every
  // rank before launch k + 1 of any. The ranks' streams may share hardware work queues (under
  // MPS a client gets fewer than one per stream), and a queue runs in order: rank-major, rank
  // 0's launch 2 (waiting on its stream for its launch 1, which spins for rank 2's launch 1)
  // could sit in a queue ahead of rank 2's launch 1, and no rank would ever finish.
  Status Launch(const std::vector<std::vector<SlotPtrs>>& slots,
                const std::vector<int>* only = nullptr);
  // Waits for every rank; reports the first failed status.
  Status Sync();
  // Captures `reps` launches of every rank in a graph (forked onto the ranks' streams), then
  // replays it `iters` times; returns microseconds per replay divided by `reps` (reps = 1: a graph
  // replay of one collective; more: one collective among many in a graph).
  StatusOr<double> TimeGraph(const std::vector<std::vector<SlotPtrs>>& slots, int iters,
                             int reps = 1);
  // One launch of every rank with a timeline: per rank, per block of its (single-class) launch,
  // kTraceEvents words (TraceEvent << 56 | device ns), 0 where unused.
  StatusOr<std::vector<std::vector<uint64_t>>> Trace(
      const std::vector<std::vector<SlotPtrs>>& slots);
  // Microseconds per launch of every rank, `iters` launches after `warmup`.
  StatusOr<double> TimeLaunches(const std::vector<std::vector<SlotPtrs>>& slots, int warmup,
                                int iters);

 private:
  Harness() = default;
  TopologyView topo_;
  Geometry geo_;
  uint64_t timeoutNs_ = 0;
  bool checkCalls_ = true;  // JAX_RCCL_CHECK_CALLS when created
  std::vector<void*> regions_;
  std::vector<void*> regionTables_;  // per rank: device copy of the region pointers
  std::vector<void*> streams_;
  Mapped status_;  // DevStatus per rank
  Mapped abort_;
  std::vector<Plan> plans_;
  std::vector<std::unique_ptr<DevicePlan>> devPlans_;
  RankLaunch Rank(int r) const;
};

// Floors measured on the current device: device-to-device copy bandwidth (GB/s counting read and
// write), an empty kernel launch (us, from a host loop), and one empty kernel replayed from a
// captured graph (us).
struct Floors {
  double copyGBs = 0;
  double launchUs = 0;
  double graphUs = 0;
  double graphKernelUs = 0;  // one empty kernel among kFloorGraphReps in one graph
};
constexpr int kFloorGraphReps = 20;
StatusOr<Floors> MeasureFloors(int64_t copyBytes, int iters);

}  // namespace gpu
}  // namespace jax_rccl
