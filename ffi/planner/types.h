// Small value types at the planner boundary: enums, the topology view, tasks and tuning.
//
// Enum orders follow RCCL/NCCL (ncclFunc_t, ncclDataType_t, ncclRedOp_t, NCCL_ALGO_*,
// NCCL_PROTO_*) wherever the planner's ordering rules depend on them (collCmp sorts by these
// values). Types beyond RCCL's (int16, uint16, bool) come after RCCL's last one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "ffi/core/status.h"

namespace jax_rccl {

enum class Coll : int8_t {
  kBroadcast = 0,
  kReduce = 1,
  kAllGather = 2,
  kReduceScatter = 3,
  kAllReduce = 4,
  kSendRecv = 5,  // unused as a task; kept for RCCL's numbering
  kSend = 6,
  kRecv = 7,
};
constexpr int kNumColls = 8;

enum class DataType : int8_t {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFp8E4M3 = 10,
  kFp8E5M2 = 11,
  // Beyond RCCL: what JAX programs also reduce.
  kInt16 = 12,
  kUint16 = 13,
  kBool = 14,
};
constexpr int kNumDataTypes = 15;

// Host-side reduction ops (ncclRedOp_t). Values >= kNumRedOps are user-created ops (handles from
// a RedOpTable).
enum RedOp : int32_t {
  kSum = 0,
  kProd = 1,
  kMax = 2,
  kMin = 3,
  kAvg = 4,
  kNumRedOps = 5,
};
// Largest op value a handle can take: ncclRedOp_t is an int-sized enum.
constexpr int32_t kMaxRedOp = 0x7fffffff;

// Device-side reduction ops (ncclDevRedOp_t).
enum class DevRedOp : uint8_t {
  kSum = 0,
  kProd = 1,
  kMinMax = 2,
  kPreMulSum = 3,
  kSumPostDiv = 4,
};
constexpr int kNumDevRedOps = 5;

// What a kernel needs to know of a reduction: the op and its 64-bit scalar argument (an xor mask
// for MinMax, the multiplier bits for PreMulSum, the divisor for SumPostDiv), or a device pointer
// to the scalar.
struct DevRedOpFull {
  DevRedOp op = DevRedOp::kSum;
  RedOp proxyOp = kSum;  // the host op that network transports see
  bool scalarArgIsPtr = false;
  uint64_t scalarArg = 0;
  bool operator==(const DevRedOpFull& o) const {
    return op == o.op && scalarArgIsPtr == o.scalarArgIsPtr && scalarArg == o.scalarArg;
  }
};

// Tree and Ring after RCCL; Direct is ours: on one host whose ranks can read each other's buffers
// (topology.directPeers), each rank reads its peers' inputs in place instead of passing chunks
// through FIFOs. CollNet and NVLS need switch hardware this project does not target.
enum class Algo : int8_t { kUndef = -1, kTree = 0, kRing = 1, kDirect = 2 };
constexpr int kNumAlgos = 3;

enum class Proto : int8_t { kUndef = -1, kLL = 0, kLL128 = 1, kSimple = 2 };
constexpr int kNumProtos = 3;

// Connection buffer bytes per protocol (LL, LL128, Simple) of the GPU communicators (and the
// one-GPU harness's default): RCCL's sizes.
constexpr int64_t kGpuBuffSizes[kNumProtos] = {262144, 458752, 4 << 20};

enum class Pattern : int8_t {
  kRing = 0,
  kRingTwice,
  kPipelineFrom,
  kPipelineTo,
  kTreeUp,
  kTreeDown,
  kTreeUpDown,
  kP2p,     // send/recv
  kDirect,  // ranks read and write each other's buffers in place
};
constexpr int kNumPatterns = 9;

enum class Arch : int8_t {
  kCpu = 0,
  kGfx90a,  // MI200 (MI250X)
  kGfx942,  // MI300 (MI300X)
  kSm80,    // A100
  kSm90,    // H100 / H200
};
constexpr int kNumArchs = 5;

// How the ranks of one node reach each other, and how nodes reach each other.
enum class LinkKind : int8_t {
  kLoopback = 0,  // one process, host memory (CPU)
  kShm,           // shared memory between processes (CPU)
  kPcie,
  kXgmi,    // AMD Infinity Fabric
  kNvlink,  // NVIDIA NVLink / NVSwitch
  kNet,     // a network between nodes (RCCL/NCCL's: the kernels' steps go straight to the NIC)
  kSocket,  // TCP sockets between nodes, every step staged in host memory by a proxy or progress
            // thread (the GPU runtime's groups across hosts, ffi/comm/proxy.h; the CPU runtime's)
};
constexpr int kNumLinkKinds = 7;
// Links between nodes (the last kinds): never a node's own.
constexpr int kFirstInterNodeLink = static_cast<int>(LinkKind::kNet);

size_t DataTypeSize(DataType t);
bool IsFloating(DataType t);
bool IsSignedInteger(DataType t);
const char* CollName(Coll c);
const char* DataTypeName(DataType t);
const char* RedOpName(int32_t op);  // "sum", ..., "user"
const char* DevRedOpName(DevRedOp op);
const char* AlgoName(Algo a);    // "tree", "ring"
const char* ProtoName(Proto p);  // "ll", "ll128", "simple"
const char* PatternName(Pattern p);
const char* ArchName(Arch a);
const char* LinkName(LinkKind l);
int ArchWarpSize(Arch a);
// AMD architectures (RCCL's tables and kernels; the others take NVIDIA's).
inline bool IsAmd(Arch a) {
  return a == Arch::kGfx90a || a == Arch::kGfx942;
}

// Parsers accept the names above (case-insensitive); errors name the argument and the allowed
// values.
StatusOr<Coll> ParseColl(const std::string& s);
StatusOr<DataType> ParseDataType(const std::string& s);
StatusOr<int32_t> ParseRedOp(const std::string& s);
StatusOr<Arch> ParseArch(const std::string& s);
StatusOr<LinkKind> ParseLink(const std::string& s);
StatusOr<Algo> ParseAlgo(const std::string& s);
StatusOr<Proto> ParseProto(const std::string& s);

// What the planner knows of the machine: the communicator reduced to values.
struct TopologyView {
  int nRanks = 1;
  int nNodes = 1;
  Arch arch = Arch::kCpu;
  LinkKind intraLink = LinkKind::kLoopback;
  LinkKind interLink = LinkKind::kNet;
  float bwIntra = 0;     // GB/s one channel gets between ranks of one node
  float bwInter = 0;     // GB/s one channel gets between nodes
  int nChannels = 1;     // channels for collectives (comm->nChannels / collChannels)
  int p2pnChannels = 1;  // channels for point-to-point
  int p2pnChannelsPerPeer = 1;
  // Connection buffer bytes per protocol and the p2p chunk: RCCL's defaults, as Python's Topology.
  int64_t buffSizes[kNumProtos] = {kGpuBuffSizes[0], kGpuBuffSizes[1], kGpuBuffSizes[2]};
  int64_t p2pChunkSize = 524288;
  bool ll128Enabled = false;      // the topology allows LL128 (RCCL: RCCL_TOPO_XGMI_ALL)
  bool treeDefined = false;       // RCCL: a tree was given by the topology file; AllReduce uses it
  int pivotA2ANumBiRings = 0;     // RCCL: 3 on MI250X's pivot all-to-all topology
  int workFifoDepth = 256 << 10;  // work elements in a non-persistent launch's FIFO (RCCL default)
  bool directPeers = false;       // ranks can read each other's buffers (one process, or IPC)

  int localRanks() const { return nNodes > 0 ? nRanks / nNodes : nRanks; }
  // Nodes joined by the network proxy's sockets (kSocket) on a device: the cost model's socket
  // rows (cost_model.cc) replace RCCL/NCCL's network rows. The host executor keeps its own.
  bool socketNet() const {
    return nNodes > 1 && interLink == LinkKind::kSocket && !hostFifoLinks();
  }
  int warpSize() const { return ArchWarpSize(arch); }
  // The host executor's own links: Ring and Tree pass every chunk through FIFOs in host memory
  // and cross nodes through sockets (the cost model's CPU rows).
  bool hostFifoLinks() const {
    return arch == Arch::kCpu && (intraLink == LinkKind::kLoopback || intraLink == LinkKind::kShm);
  }
};

// The one check of a topology view (topology.cc): every rule once, each error naming the field
// (Python's name, then TopologyView's) and the allowed values. Link bandwidths are required
// exactly where the cost model reads them. MakePlan and BuildCostModel call it.
Status ValidateTopology(const TopologyView& topo);
// Its rule for ranks and nodes alone (the Python Topology checks it when built).
Status ValidateRanksAndNodes(int nRanks, int nNodes);

// The topology a GPU communicator of `nRanks` ranks on `nNodes` nodes plans with (the runtime's: a
// node per host, or per rank where hosts hold unequal or separated runs of ranks, comm::CountNodes;
// ffi/gpu/comm.cc; here so that it is one declaration the CPU build and its tests see too): `arch`
// the build's target (its links within a host: XGMI on AMD, NVLink on NVIDIA), `nchannels`
// JAX_RCCL_NCHANNELS (0: the default), `buffsize` and `netBuffsize` the Simple buffers within a
// host and across hosts (JAX_RCCL_BUFFSIZE, JAX_RCCL_NET_BUFFSIZE), `ll128` whether the device
// code runs LL128. Across hosts: the network proxy's socket links.
TopologyView GpuGroupTopology(Arch arch, int nRanks, int nNodes, int64_t nchannels,
                              int64_t buffsize, int64_t netBuffsize, bool ll128);

// The node of `rank`: ranks are laid out node-major, localRanks() to a node.
inline int NodeOf(const TopologyView& topo, int rank) {
  return rank / topo.localRanks();
}

// One operation a network proxy runs for one channel of one kernel launch (NCCL's ncclProxyOp,
// filled as initCollProxyOp and ncclProxyComputeP2p fill it): the steps this rank moves over its
// connections to ranks of other nodes on that channel. The planner adds one where the channel's
// ring or tree neighbours of this rank, or a p2p peer, sit on another node (addProxyOpIfNeeded);
// docs/planner.md, "Proxy ops".
struct ProxyOp {
  static constexpr int kMaxPeers = 4;  // NCCL_MAX_TREE_ARITY (3) children and the parent
  int channelId = 0;
  int task = -1;                 // the task's slot (NCCL carries the buffers instead)
  Coll coll = Coll::kAllReduce;  // kSend / kRecv for p2p (NCCL's ncclPatternSend / Recv)
  Pattern pattern = Pattern::kRing;
  Proto protocol = Proto::kSimple;
  DataType dtype = DataType::kInt8;  // the planning type (int8 for all_gather/broadcast, p2p)
  int32_t redOp = kSum;              // what the network sees: PreMulSum and SumPostDiv as sum
  int root = 0;                      // broadcast/reduce root; for p2p the peer (as NCCL)
  int peer = -1;                     // p2p: the peer; -1 for collectives
  int connIndex = 0;                 // the connection index the kernel uses (0; 1 or 2 for p2p)
  uint32_t nsteps = 0;               // FIFO steps to move (computeCollSteps; p2p: bytes / chunk)
  int64_t chunkSize = 0;             // bytes
  int chunkSteps = 1;
  int sliceSteps = 1;
  int64_t nbytes = 0;  // bytes of one slice (stepSize * sliceSteps); p2p: at most one chunk
  // Within the kernel plan, as NCCL numbers them before upload: collective k of the plan
  // k << 1; a p2p element (nWork of its channel after it was placed) << 1 | 1.
  uint64_t opCount = 0;
  // The network connections the op moves steps over: ranks it receives from and sends to, in
  // the order ncclProxySaveOp visits them. Connections to ranks of this node are not listed.
  int nRecvPeers = 0;
  int nSendPeers = 0;
  int recvPeers[kMaxPeers] = {-1, -1, -1, -1};
  int sendPeers[kMaxPeers] = {-1, -1, -1, -1};
  bool isP2p() const { return (opCount & 1) != 0; }
};

// Tunables that NCCL/RCCL read from the environment; here they are passed in.
struct PlannerParams {
  int64_t p2pLLThreshold = 16384;       // NCCL_P2P_LL_THRESHOLD
  int64_t p2pNetThreshold = 131072;     // RCCL_P2P_NET_THRESHOLD
  int64_t intraNetThreshold = 8388608;  // RCCL_INTRANET_THRESHOLD
  bool useIntraNet = false;
  bool p2pNet = false;
};

// One task of a group, as a user issued it.
struct TaskDesc {
  Coll coll = Coll::kAllReduce;
  uint64_t count = 0;  // elements (per rank; for all_gather/reduce_scatter the per-rank part)
  DataType dtype = DataType::kFloat32;
  int32_t op = kSum;  // RedOp or a user op handle
  int root = 0;       // broadcast/reduce root
  int peer = -1;      // send/recv peer
};

// A tuner plugin: it may fix the algorithm, the protocol and the channel count of a collective.
struct TunerQuery {
  Coll coll;
  uint64_t nBytes;
  int numPipeOps;
};
struct TunerChoice {
  Algo algo = Algo::kUndef;
  Proto proto = Proto::kUndef;
  int nChannels = 0;  // 0: let the planner decide
};
using TunerFn = std::function<Status(const TunerQuery&, TunerChoice*)>;

// Overrides and the tuner hook.
struct Tuning {
  uint32_t algoMask = (1u << kNumAlgos) - 1;    // bit a set: algorithm a may be chosen
  uint32_t protoMask = (1u << kNumProtos) - 1;  // bit p set: protocol p may be chosen
  TunerFn tuner;
};

// Parses NCCL's override syntax: "Ring", "Tree,Ring", "^LL128" (exclude), case-insensitive.
// `what` names the variable in errors ("JAX_RCCL_ALGO").
StatusOr<uint32_t> ParseAlgoMask(const std::string& spec, const std::string& what);
StatusOr<uint32_t> ParseProtoMask(const std::string& spec, const std::string& what);

}  // namespace jax_rccl
