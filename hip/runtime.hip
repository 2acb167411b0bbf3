// The GPU runtime's host side (see hip/runtime.h): regions, uploads and launches (the one-GPU
// harness and the floors: hip/harness.hip).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "ffi/compute/reduce_functors.h"
#include "hip/hip_check.h"
#include "hip/portability.h"
#include "hip/runtime.h"
#include "hip/runtime_kernel.h"

namespace jax_rccl {
namespace gpu {

namespace {

// Writes up to kInlineSlots slot pointers (kernel arguments) into a device table: a launch
// captured in a graph keeps its arguments, so the table is right on every replay.
struct SlotChunk {
  SlotPtrs s[kInlineSlots];
};
__global__ void FillSlotsKernel(SlotPtrs* table, int offset, int n, const SlotChunk chunk) {
  const int i = threadIdx.x;
  if (i < n) table[offset + i] = chunk.s[i];
}

// A call in which this rank moves nothing still counts on the device (hip/kernel_check.h): every
// channel's counter advances as the collective kernels' last launch advances them.
__global__ void AdvanceCallsKernel(char* const* regions, int rank, const Geometry geo) {
  const int c = threadIdx.x;
  if (c >= geo.nChannels) return;
  auto* h = reinterpret_cast<ConnHeader*>(regions[rank] + RegionLayout::HeaderOffset(geo, c, rank));
  volatile uint64_t* w = &h->pad1[kCallSeqPad];
  *w = *w + 1;
}

// One rank, PreMulSum or SumPostDiv: out = PostOp(PreOp(in)) element-wise. The op's argument is
// `opArg`, or the element at `opArgAt` when given (a per-device scalar, read when the kernel runs).
template <typename F>
__global__ void ScaleKernel(const typename F::Elem* in, typename F::Elem* out, int64_t n,
                            uint64_t opArg, const typename F::Elem* opArgAt) {
  using T = typename F::Elem;
  using Tr = ElemTraits<T>;
  if (opArgAt != nullptr) {
    union {
      uint64_t u;
      T t;
    } v;
    v.u = 0;
    v.t = *opArgAt;
    opArg = v.u;
  }
  const F fn(opArg);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    auto v = Tr::Load(in[i]);
    if (F::kHasPreOp) v = fn.PreOp(v);
    if (F::kHasPostOp) v = fn.PostOp(v);
    out[i] = Tr::Store(v);
  }
}

template <typename T>
void LaunchScale(DevRedOp op, const void* in, void* out, int64_t n, uint64_t arg, const void* argAt,
                 hipStream_t stream) {
  const int blocks = int(std::min<int64_t>(1024, (n + 255) / 256));
  const T* at = static_cast<const T*>(argAt);
  if (op == DevRedOp::kPreMulSum) {
    hipLaunchKernelGGL(ScaleKernel<FuncPreMulSum<T>>, blocks, 256, 0, stream,
                       static_cast<const T*>(in), static_cast<T*>(out), n, arg, at);
  } else {
    hipLaunchKernelGGL(ScaleKernel<FuncSumPostDiv<T>>, blocks, 256, 0, stream,
                       static_cast<const T*>(in), static_cast<T*>(out), n, arg, at);
  }
}

// `argAt`: null, or the device address of the op's argument (one element of type `dt`).
bool LaunchScaleFor(DataType dt, DevRedOp op, const void* in, void* out, int64_t n, uint64_t arg,
                    const void* argAt, hipStream_t stream) {
  switch (dt) {
#define JR_CASE(name, enumName, T)                      \
  case DataType::enumName:                              \
    LaunchScale<T>(op, in, out, n, arg, argAt, stream); \
    return true;
    JR_DEVICE_DTYPES(JR_CASE)
#undef JR_CASE
    default:
      return false;
  }
}

using CollKernelFn = void (*)(const KernelArgs);

// The kernel of a class (kCopyClass or a DataType's value); null when not compiled in.
CollKernelFn KernelOfClass(int cls) {
  if (cls == kCopyClass) return &CollKernel_copy;
  switch (DataType(cls)) {
#define JR_CASE(name, enumName, T) \
  case DataType::enumName:         \
    return &CollKernel_##name;
    JR_DEVICE_DTYPES(JR_CASE)
#undef JR_CASE
    default:
      return nullptr;
  }
}

void LaunchCopy(const void* from, void* to, int64_t bytes, hipStream_t stream) {
  if (bytes <= 0 || from == to) return;
  const int blocks = int(std::min<int64_t>(132 * 2, std::max<int64_t>(1, bytes / (64 << 10))));
  hipLaunchKernelGGL(CopyKernel, blocks, 512, 0, stream, static_cast<const char*>(from),
                     static_cast<char*>(to), bytes);
}

}  // namespace

Status LoadKernels(const std::vector<int>& classes) {
  static std::mutex mu;
  static std::set<std::pair<int, int>> loaded;  // (device ordinal, class); class -1: the helpers
  int dev = 0;
  JR_HIP_CHECK(hipGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  size_t stack = 0;  // the largest local memory per thread of the kernels loaded now
  std::vector<int> todo = {-1};
  todo.insert(todo.end(), classes.begin(), classes.end());
  for (int cls : todo) {
    if (loaded.count({dev, cls}) != 0) continue;
    std::vector<const void*> fns;
    if (cls == -1) {
      fns = {reinterpret_cast<const void*>(&FillSlotsKernel),
             reinterpret_cast<const void*>(&AdvanceCallsKernel),
             reinterpret_cast<const void*>(&CopyKernel)};
      // The one-rank scaled copies (PreMulSum / SumPostDiv) of every element type.
#define JR_CASE(name, enumName, T)                                              \
  fns.push_back(reinterpret_cast<const void*>(&ScaleKernel<FuncPreMulSum<T>>)); \
  fns.push_back(reinterpret_cast<const void*>(&ScaleKernel<FuncSumPostDiv<T>>));
      JR_DEVICE_DTYPES(JR_CASE)
#undef JR_CASE
    } else {
      CollKernelFn fn = KernelOfClass(cls);
      JR_REQUIRE(fn != nullptr, Code::kUnsupported, "no device kernel for class ", cls);
      fns = {reinterpret_cast<const void*>(fn)};
    }
    for (const void* fn : fns) {
      hipFuncAttributes attr;
      JR_HIP_CHECK(hipFuncGetAttributes(&attr, fn));
      stack = std::max(stack, size_t(attr.localSizeBytes));
    }
    loaded.insert({dev, cls});
  }
  // A launch whose kernel needs more local memory per thread than the device holds makes the
  // driver reallocate it, and that waits for every running kernel: a rank spinning on a peer whose
  // launch is the one waiting would hang. The stack limit reserves it now, before any launch.
#if JR_HAS_STACK_LIMIT
  size_t cur = 0;
  JR_HIP_CHECK(hipDeviceGetLimit(&cur, hipLimitStackSize));
  if (stack > cur) JR_HIP_CHECK(hipDeviceSetLimit(hipLimitStackSize, stack));
#else
  (void)stack;  // a HIP without hipLimitStackSize: its runtime sizes scratch per launch
#endif
  return Status::Ok();
}

StatusOr<DeviceCapacity> QueryDeviceCapacity() {
  int dev = 0;
  JR_HIP_CHECK(hipGetDevice(&dev));
  DeviceCapacity c;
  JR_HIP_CHECK(hipDeviceGetAttribute(&c.smCount, hipDeviceAttributeMultiprocessorCount, dev));
  std::vector<CollKernelFn> fns = {&CollKernel_copy};
#define JR_CASE(name, enumName, T) fns.push_back(&CollKernel_##name);
  JR_DEVICE_DTYPES(JR_CASE)
#undef JR_CASE
  c.blocksPerSm = 1 << 30;
  for (CollKernelFn fn : fns) {
    int b = 0;
    JR_HIP_CHECK(hipOccupancyMaxActiveBlocksPerMultiprocessor(&b, fn, kMaxLaunchThreads, 0));
    c.blocksPerSm = std::min(c.blocksPerSm, b);
  }
#if !defined(JAX_RCCL_AMD)
  if (const char* e = std::getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")) {
    const double pct = std::atof(e);
    if (pct > 0 && pct < 100) c.mpsActiveThreadPercent = std::max(1, int(pct));
  }
#endif
  // Under MPS with an active thread percentage the multiprocessor count is already the client's
  // share (seen on an H200: 66 of 132 at 50%).
  c.residentBlocks = c.smCount * c.blocksPerSm;
  return c;
}

StatusOr<std::string> DeviceBusId() {
  int dev = 0;
  JR_HIP_CHECK(hipGetDevice(&dev));
  char buf[64] = {};
  JR_HIP_CHECK(hipDeviceGetPCIBusId(buf, int(sizeof(buf)) - 1, dev));
  return std::string(buf);
}

StatusOr<int> ResidentChannels(int want, int ranksOnDevice, int residentBlocks) {
  const int per = residentBlocks / std::max(1, ranksOnDevice);
  JR_REQUIRE(per >= 1, Code::kUnsupported, ranksOnDevice, " ranks share one GPU that holds ",
             residentBlocks,
             " collective blocks at once: not even one block per rank is resident at once (under "
             "MPS, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE lowers what a process holds)");
  return std::max(1, std::min(want, per));
}

Status PrepareDevice() {
  std::vector<int> classes = {kCopyClass};
#define JR_CASE(name, enumName, T) classes.push_back(int(DataType::enumName));
  JR_DEVICE_DTYPES(JR_CASE)
#undef JR_CASE
  return LoadKernels(classes);
}

Geometry GeometryOf(const TopologyView& topo) {
  Geometry g;
  g.nRanks = topo.nRanks;
  g.nChannels = std::max(topo.nChannels, topo.p2pnChannels);
  for (int p = 0; p < kNumProtocols; ++p) g.stepBytes[p] = topo.buffSizes[p] / kSteps / 16 * 16;
  return g;
}

bool DeviceHasLL128() {
#if defined(JAX_RCCL_AMD)
  return false;
#else
  return true;
#endif
}

bool DeviceHasDtype(DataType dtype) {
  switch (dtype) {
#define JR_CASE(name, enumName, T) \
  case DataType::enumName:         \
    return true;
    JR_DEVICE_DTYPES(JR_CASE)
#undef JR_CASE
    default:
      return false;
  }
}

std::string DeviceBuildInfo() {
#if defined(JAX_RCCL_AMD)
  return "HIP (AMD)";
#else
  return "CUDA (NVIDIA, through hip/portability.h)";
#endif
}

StatusOr<void*> DeviceAlloc(int64_t bytes) {
  void* p = nullptr;
  // Allowed while another thread's stream is being captured (XLA's command buffers).
  hipStreamCaptureMode mode = hipStreamCaptureModeRelaxed;
  (void)hipThreadExchangeStreamCaptureMode(&mode);
  const hipError_t err = hipMalloc(&p, size_t(std::max<int64_t>(bytes, 16)));
  (void)hipThreadExchangeStreamCaptureMode(&mode);
  JR_REQUIRE(err == hipSuccess, Code::kInternal, "allocating ", bytes,
             " bytes of device memory: ", hipGetErrorString(err));
  return p;
}

void DeviceFree(void* p) {
  if (p != nullptr) (void)hipFree(p);
}

Status CopyToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return Status::Ok();
  JR_HIP_CHECK(hipMemcpy(dst, src, size_t(bytes), hipMemcpyHostToDevice));
  // The DMA of a pageable source may still be in flight: a kernel on a non-blocking stream could
  // read the old contents (seen as wrong results when several processes share one GPU under MPS,
  // whose copies delay ours).
  JR_HIP_CHECK(hipStreamSynchronize(nullptr));
  return Status::Ok();
}

Status CopyToHost(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) JR_HIP_CHECK(hipMemcpy(dst, src, size_t(bytes), hipMemcpyDeviceToHost));
  return Status::Ok();
}

StatusOr<void*> AllocRegion(const Geometry& geo) {
  const int64_t bytes = RegionLayout::Bytes(geo);
#if defined(JAX_RCCL_AMD)
  // Peers write into a region while its owner's kernel polls it: on AMD that needs memory that is
  // coherent inside a kernel (fine-grained or uncached), not hipMalloc's coarse-grained memory.
#if defined(hipDeviceMallocUncached)
  constexpr unsigned kRegionFlags = hipDeviceMallocUncached;
#else
  constexpr unsigned kRegionFlags = hipDeviceMallocFinegrained;
#endif
  void* p = nullptr;
  hipStreamCaptureMode mode = hipStreamCaptureModeRelaxed;
  (void)hipThreadExchangeStreamCaptureMode(&mode);
  const hipError_t aerr = hipExtMallocWithFlags(&p, size_t(bytes), kRegionFlags);
  (void)hipThreadExchangeStreamCaptureMode(&mode);
  JR_REQUIRE(aerr == hipSuccess, Code::kInternal, "allocating a connection region of ", bytes,
             " bytes: ", hipGetErrorString(aerr));
#else
  JR_ASSIGN_OR_RETURN(void* p, DeviceAlloc(bytes));
#endif
  // Zeroed before anyone can see the region: a memset may still run when the call returns, and a
  // peer (another stream, another process) may start writing as soon as the region is published.
  hipError_t err = hipMemset(p, 0, size_t(bytes));
  if (err == hipSuccess) err = hipStreamSynchronize(nullptr);
  if (err != hipSuccess) {
    DeviceFree(p);
    JR_FAIL(Code::kInternal, "zeroing a connection region of ", bytes,
            " bytes: ", hipGetErrorString(err));
  }
  return p;
}

StatusOr<Mapped> MappedAlloc(int64_t bytes) {
  Mapped m;
  JR_HIP_CHECK(hipHostMalloc(&m.host, size_t(bytes), hipHostMallocMapped));
  std::memset(m.host, 0, size_t(bytes));
  JR_HIP_CHECK(hipHostGetDevicePointer(&m.dev, m.host, 0));
  return m;
}

void MappedFree(const Mapped& m) {
  if (m.host != nullptr) (void)hipHostFree(m.host);
}

// ---- DevicePlan ----

StatusOr<std::unique_ptr<DevicePlan>> DevicePlan::Upload(const Plan& plan, const Geometry& geo,
                                                         const RaggedPlan* ragged) {
  std::unique_ptr<DevicePlan> dp(new DevicePlan());
  if (ragged != nullptr) {
    JR_REQUIRE(ragged->entries.size() == plan.tasks.size() && ragged->dims.slices > 0,
               Code::kInternal, "a ragged_all_to_all plan of ", plan.tasks.size(), " tasks got ",
               ragged->entries.size(), " table entries");
    dp->ragged_ = ragged->dims;
  }
  dp->geo_ = geo;
  dp->nTasks_ = static_cast<int>(plan.tasks.size());
  dp->oneRank_ = plan.oneRank;
  std::vector<DevTask> tasks(plan.tasks.size());
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const TaskPlan& tp = plan.tasks[i];
    DevTask& t = tasks[i];
    const bool p2p = tp.coll == Coll::kSend || tp.coll == Coll::kRecv;
    const bool copy = p2p || tp.coll == Coll::kAllGather || tp.coll == Coll::kBroadcast;
    t.coll = uint8_t(tp.coll);
    t.pattern = uint8_t(tp.pattern);
    t.dtype = uint8_t(copy ? DataType::kUint8 : tp.dtype);
    t.op = uint8_t(tp.opFull.op);
    t.proto = uint8_t(std::max<int>(0, int(tp.proto)));
    t.unitSize = uint8_t(copy ? 1 : DataTypeSize(tp.dtype));
    t.copy = copy ? 1 : 0;
    // A scalar given by pointer (a per-device PreMulSum scalar) is read by the kernel from the
    // launch's slot (SlotPtrs::scalar), never from the address the plan holds.
    t.argKind = !copy && tp.opFull.scalarArgIsPtr ? kArgScalar : kArgValue;
    t.opArg = t.argKind == kArgScalar ? 0 : tp.opFull.scalarArg;
    if (t.argKind == kArgScalar && tp.count > 0) dp->scalarSlots_.push_back(int(i));
    if (ragged != nullptr) {
      t.argKind = kArgRagged;
      t.opArg = ragged->entries[i];
    }
    if (!copy) {
      JR_REQUIRE(DeviceHasDtype(tp.dtype), Code::kUnsupported, "task ", i, " (", CollName(tp.coll),
                 "): this build's device code has no reductions over ", DataTypeName(tp.dtype),
                 " (the build's JAX_RCCL_DEVICE_TYPES / JAX_RCCL_DEVICE_QUICK filter)");
    }
    if (!plan.oneRank && tp.kernel >= 0 && tp.count > 0) {
      JR_REQUIRE(tp.proto == Proto::kLL || tp.proto == Proto::kSimple ||
                     (tp.proto == Proto::kLL128 && DeviceHasLL128()),
                 Code::kUnsupported, "task ", i, " (", CollName(tp.coll), "): protocol ",
                 ProtoName(tp.proto), " is not implemented by this build's device code (",
                 DeviceHasLL128() ? "LL, LL128 and Simple are" : "LL and Simple are", ")");
      JR_REQUIRE(
          tp.algo == Algo::kRing || tp.algo == Algo::kTree || tp.algo == Algo::kDirect || p2p,
          Code::kUnsupported, "task ", i, " (", CollName(tp.coll), "): algorithm ",
          AlgoName(tp.algo), " has no device program (Ring, Tree and Direct do)");
      JR_REQUIRE(tp.algo != Algo::kDirect || plan.nRanks <= kMaxDirectRanks, Code::kUnsupported,
                 "task ", i, ": Direct on the device takes at most ", kMaxDirectRanks,
                 " ranks, the plan has ", plan.nRanks);
    }
    if (plan.oneRank && !p2p && tp.count > 0) {
      OneRankTask o;
      o.slot = int(i);
      o.count = int64_t(tp.count);
      o.bytes = int64_t(tp.count) * int64_t(DataTypeSize(tp.dtype));
      o.scaled =
          !copy && (tp.opFull.op == DevRedOp::kPreMulSum || tp.opFull.op == DevRedOp::kSumPostDiv);
      o.task = t;
      dp->oneRankTasks_.push_back(o);
    }
  }
  if (plan.oneRank) return std::move(dp);  // copies only: nothing to upload
  if (!tasks.empty()) {
    JR_ASSIGN_OR_RETURN(void* t, DeviceAlloc(int64_t(tasks.size() * sizeof(DevTask))));
    dp->tasks_ = static_cast<DevTask*>(t);
    JR_CHECK(CopyToDevice(t, tasks.data(), int64_t(tasks.size() * sizeof(DevTask))));
  }
  if (dp->nTasks_ > kInlineSlots) {
    JR_ASSIGN_OR_RETURN(void* s, DeviceAlloc(int64_t(dp->nTasks_) * int64_t(sizeof(SlotPtrs))));
    dp->slotTable_ = static_cast<SlotPtrs*>(s);
  }
  for (const KernelPlan& kp : plan.kernels) {
    const std::vector<Work> works = LayoutPersistent(kp);
    std::vector<BlockInfo> blocks;
    for (int c = 0; c < kMaxChannels; ++c) {
      if ((kp.channelMask.masks[c / 64] >> (c % 64)) & 1) {
        BlockInfo b;
        b.channel = c;
        b.firstWork = static_cast<int32_t>(blocks.size());
        blocks.push_back(b);
        JR_REQUIRE(c < geo.nChannels, Code::kInternal, "the plan uses channel ", c,
                   ", the connections have ", geo.nChannels);
      }
    }
    if (blocks.empty()) continue;
    Kernel k;
    for (const TaskPlan& tp : plan.tasks) {
      if (tp.kernel != int(dp->kernels_.size()) || tp.count == 0) continue;
      const DevTask& t = tasks[size_t(tp.index)];
      const int cls = t.copy ? kCopyClass : int(t.dtype);
      if (std::find(k.classes.begin(), k.classes.end(), cls) == k.classes.end()) {
        k.classes.push_back(cls);
      }
    }
    std::sort(k.classes.begin(), k.classes.end());
    if (k.classes.empty()) k.classes.push_back(kCopyClass);  // walks the works; moves nothing
    JR_CHECK(LoadKernels(k.classes));
    k.nBlocks = static_cast<int>(blocks.size());
    for (const BlockInfo& b : blocks) k.channels |= uint64_t(1) << b.channel;
    k.nThreads = std::max(kMinLaunchThreads, std::min(kp.threadPerBlock, kMaxLaunchThreads));
    JR_ASSIGN_OR_RETURN(void* w, DeviceAlloc(int64_t(works.size() * sizeof(Work))));
    k.works = static_cast<Work*>(w);
    dp->kernels_.push_back(k);  // owned from here (freed by the destructor on error too)
    JR_CHECK(CopyToDevice(w, works.data(), int64_t(works.size() * sizeof(Work))));
    JR_ASSIGN_OR_RETURN(void* b, DeviceAlloc(int64_t(blocks.size() * sizeof(BlockInfo))));
    dp->kernels_.back().blocks = static_cast<BlockInfo*>(b);
    JR_CHECK(CopyToDevice(b, blocks.data(), int64_t(blocks.size() * sizeof(BlockInfo))));
  }
  return std::move(dp);
}

DevicePlan::~DevicePlan() {
  for (Kernel& k : kernels_) {
    DeviceFree(k.works);
    DeviceFree(k.blocks);
  }
  DeviceFree(tasks_);
  DeviceFree(slotTable_);
}

Status DevicePlan::Launch(const RankLaunch& rl, const std::vector<SlotPtrs>& slots,
                          int only) const {
  hipStream_t stream = static_cast<hipStream_t>(rl.stream);
  JR_REQUIRE(int(slots.size()) >= nTasks_, Code::kInvalidArgument, "a launch got ", slots.size(),
             " buffer slots, the plan has ", nTasks_, " tasks");
  JR_REQUIRE(only >= -1 && only < std::max(1, nLaunches()), Code::kInvalidArgument, "launch ", only,
             " of a plan of ", nLaunches(), " launches");
  const bool first = only <= 0;
  for (int i : scalarSlots_) {
    JR_REQUIRE(slots[size_t(i)].scalar != nullptr, Code::kInvalidArgument, "task ", i,
               ": its op reads a per-device scalar, and the launch gave none");
  }
  if (oneRank_) {
    if (!first) return Status::Ok();
    for (const OneRankTask& o : oneRankTasks_) {
      const SlotPtrs& s = slots[size_t(o.slot)];
      if (o.scaled) {
        JR_REQUIRE(
            LaunchScaleFor(DataType(o.task.dtype), DevRedOp(o.task.op), s.send, s.recv, o.count,
                           o.task.opArg, o.task.argKind == kArgScalar ? s.scalar : nullptr, stream),
            Code::kUnsupported, "no device reduction for ", DataTypeName(DataType(o.task.dtype)));
      } else {
        LaunchCopy(s.send, s.recv, o.bytes, stream);
      }
    }
    JR_HIP_CHECK(hipGetLastError());
    return Status::Ok();
  }
  if (kernels_.empty()) return first ? AdvanceCalls(rl, geo_) : Status::Ok();
  JR_REQUIRE(ragged_.slices == 0 || rl.statusDev != nullptr, Code::kInternal,
             "a ragged_all_to_all launch without a status word");
  KernelArgs a;
  std::memset(&a, 0, sizeof(a));
  a.tasks = tasks_;
  a.regions = rl.regionsDev;
  a.ownRegion = rl.nRanks > 1 ? rl.ownRegion : nullptr;
  a.slotTable = slotTable_;
  a.status = rl.statusDev;
  a.abort = rl.abortDev;
  a.timeoutNs = rl.timeoutNs;
  a.geo = geo_;
  a.rank = rl.rank;
  a.nRanks = rl.nRanks;
  a.nSlots = nTasks_;
  a.systemFence = rl.systemFence ? 1 : 0;
  a.trace = rl.traceDev;
  a.ragged = ragged_;
  a.callId = rl.callId;
  a.checkCalls = rl.checkCalls ? 1 : 0;
  a.deviceCheck = rl.deviceCheck;
  a.device = rl.device;
  const int lastLaunch = nLaunches() - 1;
  if (nTasks_ <= kInlineSlots) {
    for (int i = 0; i < nTasks_; ++i) a.inlineSlots[i] = slots[size_t(i)];
  } else if (first) {
    for (int off = 0; off < nTasks_; off += kInlineSlots) {
      SlotChunk chunk;
      std::memset(&chunk, 0, sizeof(chunk));
      const int n = std::min(kInlineSlots, nTasks_ - off);
      for (int i = 0; i < n; ++i) chunk.s[i] = slots[size_t(off + i)];
      hipLaunchKernelGGL(FillSlotsKernel, 1, kInlineSlots, 0, stream, slotTable_, off, n, chunk);
    }
  }
  int index = 0;
  for (const Kernel& k : kernels_) {
    a.works = k.works;
    a.blocks = k.blocks;
    for (int cls : k.classes) {
      const int at = index++;
      if (only >= 0 && at != only) continue;
      a.lastLaunch = at == lastLaunch ? 1 : 0;
      CollKernelFn fn = KernelOfClass(cls);
      JR_REQUIRE(fn != nullptr, Code::kUnsupported, "no device kernel for class ", cls);
      hipLaunchKernelGGL(fn, k.nBlocks, k.nThreads, 0, stream, a);
    }
  }
  JR_HIP_CHECK(hipGetLastError());
  return Status::Ok();
}

Status AdvanceCalls(const RankLaunch& rl, const Geometry& geo) {
  if (!rl.checkCalls || rl.nRanks < 2 || rl.regionsDev == nullptr) return Status::Ok();
  hipLaunchKernelGGL(AdvanceCallsKernel, 1, 64, 0, static_cast<hipStream_t>(rl.stream),
                     rl.regionsDev, rl.rank, geo);
  JR_HIP_CHECK(hipGetLastError());
  return Status::Ok();
}

std::string DescribeStatus(const DevStatus& s) {
  std::ostringstream os;
  if (s.code == kDevTimeout) {
    os << "rank " << s.rank << " timed out on channel " << s.channel << " waiting for "
       << (s.waitingRecv ? "data from rank " : "room in the FIFO to rank ") << s.peer << " (step "
       << s.step << ")";
  } else if (s.code == kDevAborted) {
    os << "rank " << s.rank << " stopped on channel " << s.channel
       << ": another rank of the communicator failed";
  } else if (s.code == kDevTooManyRanks) {
    os << "rank " << s.rank << ": the Direct algorithm holds at most " << kMaxDirectRanks
       << " ranks (set JAX_RCCL_ALGO to another algorithm)";
  } else if (s.code == kDevMismatch) {
    os << "rank " << s.rank << " on channel " << s.channel << ": step " << s.step << " from rank "
       << s.peer << " carried the tag " << std::hex << s.seen << " (" << std::dec << s.seenBits
       << " bits) of another call, where this rank's call #" << s.seq << " has " << std::hex
       << s.mine << std::dec << "; no data of the step was used";
  } else if (s.code == kDevWrongDevice) {
    os << "rank " << s.rank << " (device " << s.device << ") runs partition " << s.step
       << ", which the exported program was lowered to run on device " << s.seen64
       << "; nothing moved";
  } else if (s.code == kDevBadRagged) {
    os << "rank " << s.rank << ": ragged_all_to_all's slice " << s.step << " of rank " << s.peer
       << " is out of range (input_offsets + send_sizes past the operand's rows, output_offsets + "
          "send_sizes past the output's, a negative entry, or send_sizes unequal to the "
          "receiver's recv_sizes); nothing moved for it";
  } else {
    os << "rank " << s.rank << ": status " << s.code;
  }
  return os.str();
}

DevStatus ReadStatus(const volatile DevStatus& s) {
  DevStatus c;
  std::memset(&c, 0, sizeof(c));
  c.code = s.code;
  c.rank = s.rank;
  c.channel = s.channel;
  c.peer = s.peer;
  c.waitingRecv = s.waitingRecv;
  c.step = s.step;
  c.call = s.call;
  c.seq = s.seq;
  c.mine = s.mine;
  c.seen = s.seen;
  c.seenBits = s.seenBits;
  c.complete = s.complete;
  c.seen64 = s.seen64;
  c.device = s.device;
  return c;
}

int DevicePlan::nLaunches() const {
  int n = 0;
  for (const Kernel& k : kernels_) n += static_cast<int>(k.classes.size());
  return n;
}

int DevicePlan::maxBlocks() const {
  int n = 0;
  for (const Kernel& k : kernels_) n = std::max(n, k.nBlocks);
  return n;
}

}  // namespace gpu
}  // namespace jax_rccl
