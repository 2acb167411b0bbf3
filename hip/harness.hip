// The one-GPU harness (several ranks on one GPU in one process, see hip/runtime.h) and the
// device's floors, on the runtime's regions, uploads and launches (hip/runtime.hip).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "ffi/core/params.h"
#include "hip/hip_check.h"
#include "hip/portability.h"
#include "hip/runtime.h"

namespace jax_rccl {
namespace gpu {
namespace {

__global__ void EmptyKernel() {}

}  // namespace

StatusOr<std::unique_ptr<Harness>> Harness::Create(const TopologyView& topo, double timeoutS) {
  JR_CHECK(ValidateTopology(topo));
  std::unique_ptr<Harness> h(new Harness());
  h->topo_ = topo;
  h->geo_ = GeometryOf(topo);
  h->timeoutNs_ = uint64_t(std::max(0.001, timeoutS) * 1e9);
  h->checkCalls_ = LoadParams().check_calls != 0;
  JR_CHECK(PrepareDevice());
  const int n = topo.nRanks;
  // All ranks share this GPU: one launch of each must be resident at once (ResidentChannels).
  {
    JR_ASSIGN_OR_RETURN(DeviceCapacity cap, QueryDeviceCapacity());
    JR_ASSIGN_OR_RETURN(int ch, ResidentChannels(topo.nChannels, n, cap.residentBlocks));
    if (ch < topo.nChannels) {
      h->topo_.nChannels = ch;
      int p2p = 1;
      while (p2p * 2 <= ch) p2p *= 2;
      h->topo_.p2pnChannels = std::min(h->topo_.p2pnChannels, p2p);
      h->topo_.p2pnChannelsPerPeer = std::min(h->topo_.p2pnChannelsPerPeer, h->topo_.p2pnChannels);
    }
  }
  for (int r = 0; r < n; ++r) {
    JR_ASSIGN_OR_RETURN(void* reg, AllocRegion(h->geo_));
    h->regions_.push_back(reg);
  }
  for (int r = 0; r < n; ++r) {
    JR_ASSIGN_OR_RETURN(void* t, DeviceAlloc(int64_t(n) * int64_t(sizeof(void*))));
    h->regionTables_.push_back(t);
    JR_CHECK(CopyToDevice(t, h->regions_.data(), int64_t(n) * int64_t(sizeof(void*))));
    hipStream_t s;
    JR_HIP_CHECK(hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
    h->streams_.push_back(s);
  }
  JR_ASSIGN_OR_RETURN(h->status_, MappedAlloc(int64_t(n) * int64_t(sizeof(DevStatus))));
  JR_ASSIGN_OR_RETURN(h->abort_, MappedAlloc(64));
  return std::move(h);
}

Harness::~Harness() {
  for (void* s : streams_) {
    (void)hipStreamSynchronize(static_cast<hipStream_t>(s));
    (void)hipStreamDestroy(static_cast<hipStream_t>(s));
  }
  devPlans_.clear();
  for (void* p : regions_) DeviceFree(p);
  for (void* p : regionTables_) DeviceFree(p);
  MappedFree(status_);
  MappedFree(abort_);
}

RankLaunch Harness::Rank(int r) const {
  RankLaunch rl;
  rl.rank = r;
  rl.nRanks = topo_.nRanks;
  rl.regionsDev = static_cast<char* const*>(regionTables_[size_t(r)]);
  rl.ownRegion = static_cast<char*>(regions_[size_t(r)]);
  rl.statusDev = static_cast<DevStatus*>(status_.dev) + r;
  rl.abortDev = static_cast<int32_t*>(abort_.dev);
  rl.timeoutNs = timeoutNs_;
  rl.systemFence = false;
  rl.stream = streams_[size_t(r)];
  rl.checkCalls = checkCalls_;  // one call identity (0): the ranks run one program
  return rl;
}

Status Harness::Build(const std::vector<std::vector<TaskDesc>>& tasks, const Tuning& tuning,
                      const PlannerParams& params) {
  JR_REQUIRE(int(tasks.size()) == topo_.nRanks, Code::kInvalidArgument, "build got tasks of ",
             tasks.size(), " ranks, the harness has ", topo_.nRanks);
  plans_.clear();
  devPlans_.clear();
  for (int r = 0; r < topo_.nRanks; ++r) {
    PlanRequest req;
    req.topo = topo_;
    req.rank = r;
    req.tasks = tasks[size_t(r)];
    req.tuning = tuning;
    req.params = params;
    JR_ASSIGN_OR_RETURN(Plan p, MakePlan(req));
    JR_ASSIGN_OR_RETURN(std::unique_ptr<DevicePlan> dp, DevicePlan::Upload(p, geo_));
    plans_.push_back(std::move(p));
    devPlans_.push_back(std::move(dp));
  }
  return Status::Ok();
}

StatusOr<std::vector<std::vector<uint64_t>>> Harness::Trace(
    const std::vector<std::vector<SlotPtrs>>& slots) {
  JR_REQUIRE(int(devPlans_.size()) == topo_.nRanks, Code::kInvalidUsage,
             "the harness has no plans: call build first");
  JR_REQUIRE(int(slots.size()) == topo_.nRanks, Code::kInvalidArgument, "trace got buffers of ",
             slots.size(), " ranks, the harness has ", topo_.nRanks);
  for (int r = 0; r < topo_.nRanks; ++r) {
    const DevicePlan& dp = *devPlans_[size_t(r)];
    JR_REQUIRE(dp.nLaunches() <= 1, Code::kInvalidArgument,
               "a timeline covers one kernel launch; rank ", r, "'s plan has ", dp.nLaunches(),
               " (one per element type: trace one type)");
  }
  std::vector<Mapped> bufs;
  std::vector<int64_t> words;
  bool launched = false;
  // Allocates every rank's buffer and launches; the caller below syncs whatever was launched
  // before it frees the buffers.
  auto allocAndLaunch = [&]() -> Status {
    for (int r = 0; r < topo_.nRanks; ++r) {
      const int64_t n = int64_t(std::max(1, devPlans_[size_t(r)]->maxBlocks())) * kTraceEvents;
      JR_ASSIGN_OR_RETURN(Mapped m, MappedAlloc(n * int64_t(sizeof(uint64_t))));
      std::memset(m.host, 0, size_t(n) * sizeof(uint64_t));
      bufs.push_back(m);
      words.push_back(n);
    }
    for (int r = 0; r < topo_.nRanks; ++r) {
      RankLaunch rl = Rank(r);
      rl.traceDev = static_cast<uint64_t*>(bufs[size_t(r)].dev);
      launched = true;
      JR_CHECK(devPlans_[size_t(r)]->Launch(rl, slots[size_t(r)]));
    }
    return Status::Ok();
  };
  const Status started = allocAndLaunch();
  const Status synced = launched ? Sync() : Status::Ok();
  std::vector<std::vector<uint64_t>> out;
  for (size_t r = 0; r < bufs.size(); ++r) {
    const uint64_t* h = static_cast<const uint64_t*>(bufs[r].host);
    out.emplace_back(h, h + words[r]);
    MappedFree(bufs[r]);
  }
  JR_CHECK(started);
  JR_CHECK(synced);
  return out;
}

Status Harness::Launch(const std::vector<std::vector<SlotPtrs>>& slots,
                       const std::vector<int>* only) {
  JR_REQUIRE(int(devPlans_.size()) == topo_.nRanks, Code::kInvalidUsage,
             "the harness has no plans: call build first");
  JR_REQUIRE(int(slots.size()) == topo_.nRanks, Code::kInvalidArgument, "launch got buffers of ",
             slots.size(), " ranks, the harness has ", topo_.nRanks);
  int launches = 1;
  for (const auto& dp : devPlans_) launches = std::max(launches, dp->nLaunches());
  for (int k = 0; k < launches; ++k) {
    for (int r = 0; r < topo_.nRanks; ++r) {
      if (only != nullptr && std::find(only->begin(), only->end(), r) == only->end()) continue;
      const DevicePlan& dp = *devPlans_[size_t(r)];
      if (k < std::max(1, dp.nLaunches())) JR_CHECK(dp.Launch(Rank(r), slots[size_t(r)], k));
    }
  }
  return Status::Ok();
}

Status Harness::Sync() {
  for (void* s : streams_) JR_HIP_CHECK(hipStreamSynchronize(static_cast<hipStream_t>(s)));
  const DevStatus* st = static_cast<const DevStatus*>(status_.host);
  for (int r = 0; r < topo_.nRanks; ++r) {
    if (st[r].code == kDevTimeout) JR_FAIL(Code::kTimeout, DescribeStatus(st[r]));
    if (st[r].code == kDevTooManyRanks) JR_FAIL(Code::kInvalidArgument, DescribeStatus(st[r]));
    if (st[r].code == kDevMismatch) JR_FAIL(Code::kInvalidUsage, DescribeStatus(st[r]));
  }
  for (int r = 0; r < topo_.nRanks; ++r) {
    if (st[r].code != kDevFine) JR_FAIL(Code::kTimeout, DescribeStatus(st[r]));
  }
  return Status::Ok();
}

StatusOr<double> Harness::TimeLaunches(const std::vector<std::vector<SlotPtrs>>& slots, int warmup,
                                       int iters) {
  for (int i = 0; i < warmup; ++i) JR_CHECK(Launch(slots));
  JR_CHECK(Sync());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) JR_CHECK(Launch(slots));
  JR_CHECK(Sync());
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / std::max(1, iters);
}

StatusOr<double> Harness::TimeGraph(const std::vector<std::vector<SlotPtrs>>& slots, int iters,
                                    int reps) {
  reps = std::max(1, reps);
  JR_CHECK(Sync());
  hipStream_t s0 = static_cast<hipStream_t>(streams_[0]);
  std::vector<hipEvent_t> events(size_t(topo_.nRanks) * 2);
  for (hipEvent_t& e : events) JR_HIP_CHECK(hipEventCreate(&e));
  hipGraph_t graph;
  JR_HIP_CHECK(hipStreamBeginCapture(s0, hipStreamCaptureModeRelaxed));
  JR_HIP_CHECK(hipEventRecord(events[0], s0));
  for (int r = 1; r < topo_.nRanks; ++r) {
    JR_HIP_CHECK(hipStreamWaitEvent(static_cast<hipStream_t>(streams_[size_t(r)]), events[0], 0));
  }
  auto launchAll = [&]() -> Status {
    for (int k = 0; k < reps; ++k) JR_CHECK(Launch(slots));
    return Status::Ok();
  };
  Status launched = launchAll();
  for (int r = 1; r < topo_.nRanks; ++r) {
    JR_HIP_CHECK(hipEventRecord(events[size_t(r)], static_cast<hipStream_t>(streams_[size_t(r)])));
    JR_HIP_CHECK(hipStreamWaitEvent(s0, events[size_t(r)], 0));
  }
  JR_HIP_CHECK(hipStreamEndCapture(s0, &graph));
  JR_CHECK(launched);
  hipGraphExec_t exec;
  JR_HIP_CHECK(hipGraphInstantiate(&exec, graph, nullptr, nullptr, 0));
  for (int i = 0; i < 5; ++i) JR_HIP_CHECK(hipGraphLaunch(exec, s0));
  JR_CHECK(Sync());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) JR_HIP_CHECK(hipGraphLaunch(exec, s0));
  JR_CHECK(Sync());
  const auto t1 = std::chrono::steady_clock::now();
  (void)hipGraphExecDestroy(exec);
  (void)hipGraphDestroy(graph);
  for (hipEvent_t& e : events) (void)hipEventDestroy(e);
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / std::max(1, iters) / reps;
}

StatusOr<Floors> MeasureFloors(int64_t copyBytes, int iters) {
  Floors f;
  hipStream_t s;
  JR_HIP_CHECK(hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
  JR_ASSIGN_OR_RETURN(void* a, DeviceAlloc(copyBytes));
  JR_ASSIGN_OR_RETURN(void* b, DeviceAlloc(copyBytes));
  JR_HIP_CHECK(hipMemcpyAsync(b, a, size_t(copyBytes), hipMemcpyDeviceToDevice, s));
  JR_HIP_CHECK(hipStreamSynchronize(s));
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    JR_HIP_CHECK(hipMemcpyAsync(b, a, size_t(copyBytes), hipMemcpyDeviceToDevice, s));
  }
  JR_HIP_CHECK(hipStreamSynchronize(s));
  auto t1 = std::chrono::steady_clock::now();
  const double sec = std::chrono::duration<double>(t1 - t0).count() / std::max(1, iters);
  f.copyGBs = 2.0 * double(copyBytes) / sec / 1e9;
  DeviceFree(a);
  DeviceFree(b);
  const int n = 2000;
  for (int i = 0; i < 100; ++i) hipLaunchKernelGGL(EmptyKernel, 1, 1, 0, s);
  JR_HIP_CHECK(hipStreamSynchronize(s));
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) hipLaunchKernelGGL(EmptyKernel, 1, 1, 0, s);
  JR_HIP_CHECK(hipStreamSynchronize(s));
  t1 = std::chrono::steady_clock::now();
  f.launchUs = std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
  hipGraph_t graph;
  JR_HIP_CHECK(hipStreamBeginCapture(s, hipStreamCaptureModeRelaxed));
  hipLaunchKernelGGL(EmptyKernel, 1, 1, 0, s);
  JR_HIP_CHECK(hipStreamEndCapture(s, &graph));
  hipGraphExec_t exec;
  JR_HIP_CHECK(hipGraphInstantiate(&exec, graph, nullptr, nullptr, 0));
  for (int i = 0; i < 100; ++i) JR_HIP_CHECK(hipGraphLaunch(exec, s));
  JR_HIP_CHECK(hipStreamSynchronize(s));
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) JR_HIP_CHECK(hipGraphLaunch(exec, s));
  JR_HIP_CHECK(hipStreamSynchronize(s));
  t1 = std::chrono::steady_clock::now();
  f.graphUs = std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
  (void)hipGraphExecDestroy(exec);
  (void)hipGraphDestroy(graph);
  // kFloorGraphReps empty kernels in one graph: the cost of one kernel among many in a graph.
  JR_HIP_CHECK(hipStreamBeginCapture(s, hipStreamCaptureModeRelaxed));
  for (int k = 0; k < kFloorGraphReps; ++k) hipLaunchKernelGGL(EmptyKernel, 1, 1, 0, s);
  JR_HIP_CHECK(hipStreamEndCapture(s, &graph));
  JR_HIP_CHECK(hipGraphInstantiate(&exec, graph, nullptr, nullptr, 0));
  for (int i = 0; i < 10; ++i) JR_HIP_CHECK(hipGraphLaunch(exec, s));
  JR_HIP_CHECK(hipStreamSynchronize(s));
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n / kFloorGraphReps; ++i) JR_HIP_CHECK(hipGraphLaunch(exec, s));
  JR_HIP_CHECK(hipStreamSynchronize(s));
  t1 = std::chrono::steady_clock::now();
  f.graphKernelUs = std::chrono::duration<double, std::micro>(t1 - t0).count() /
                    (n / kFloorGraphReps) / kFloorGraphReps;
  (void)hipGraphExecDestroy(exec);
  (void)hipGraphDestroy(graph);
  (void)hipStreamDestroy(s);
  return f;
}

}  // namespace gpu
}  // namespace jax_rccl
