// The cost model: latency and bandwidth tables per collective x algorithm x protocol, after
// ncclTopoTuneModel and ncclTopoGetAlgoTime in RCCL rocm-6.2.0 src/graph/tuning.cc (AMD archs)
// and NVIDIA NCCL v2.19.3 src/graph/tuning.cc (NVIDIA archs and the CPU executor; the same
// numbers as v2.20.5, the NCCL release RCCL rocm-6.2.0 is based on).
//
// All numbers live in the tables of the first section; the second section is the one formula
// that turns a topology into tables, the third the time of one operation. Tree and Ring come
// from RCCL/NCCL (CollNet and NVLS need switch hardware this project does not target); Direct is
// ours and is costed from the host executor's memory traffic (see the CPU tables).
#include "ffi/planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "ffi/planner/work.h"

namespace jax_rccl {
namespace {

// =================================================================================== tables ==
// Index order of RCCL's and NCCL's tables: [algorithm: Tree, Ring][protocol: LL, LL128, Simple]
// (Direct has its own rows below). Latencies in
// microseconds, bandwidths in GB/s.

// Algorithms the RCCL/NCCL tables have rows for: Tree and Ring (Algo's first two values).
constexpr int kNumRcclAlgos = 2;

// Rows of the hardware latency tables (NCCL_HW_NVLINK, NCCL_HW_PCI, NCCL_HW_NET).
enum HwRow { kHwNvlink = 0, kHwPci = 1, kHwNet = 2, kNumHwRows = 3 };

constexpr int kNumCorrectionSizes = 27;  // RCCL: powers of two from 64 B up to 4 GiB

// One of RCCL's rcclTuningModel entries (Tree and Ring rows only).
struct AmdTuning {
  const char* name;
  float hwLat[kNumHwRows][kNumRcclAlgos][kNumProtos];
  float bwRatio[2][kNumRcclAlgos][kNumProtos];  // [0]: up to 2 nodes, [1]: more than 2 nodes
  float treeCorrection[kNumProtos][kNumCorrectionSizes];
  float ringCorrection[kNumProtos][kNumCorrectionSizes];  // applied only across nodes
};

// RCCL rocm-6.2.0 src/graph/tuning.cc: baseLat (Tree, Ring).
constexpr float kAmdBaseLat[kNumRcclAlgos][kNumProtos] = {{12.0f, 12.0f, 17.0f},
                                                          {12.0f, 12.0f, 17.0f}};

// RCCL rocm-6.2.0 src/graph/tuning.cc: tuning_model_1. Selected by src/graph/rome_models.cc
// "tuning=1" for the 16-GCD MI250X node (rome_model_56: pivot all-to-all, tree defined).
constexpr AmdTuning kAmdTuning1 = {
    "rccl tuning_model_1 (MI250X)",
    {{{1.5f, 1.5f, 4.5f}, {1.5f, 1.5f, 4.5f}},
     {{2.2f, 2.2f, 5.7f}, {2.2f, 2.2f, 5.7f}},
     {{33.0f, 33.0f, 15.8f}, {5.1f, 5.1f, 68.8f}}},
    {{{0.12f, 1.0f, 0.99f}, {0.12f, 1.0f, 1.0f}}, {{0.15f, 1.0f, 0.42f}, {0.2f, 1.0f, 1.0f}}},
    {{0.5f, 0.4f, 0.7f, 0.6f, 1.0f, 1.0f, 0.5f, 0.4f, 0.1f, 0.5f, 0.4f, 0.6f, 1.0f, 1.0f,
      1.0f, 1.0f, 1.0f, 0.8f, 0.6f, 0.5f, 0.4f, 0.4f, 0.3f, 0.2f, 0.1f, 0.1f, 0.1f},
     {0.5f, 0.4f, 0.7f, 0.6f, 1.0f, 1.0f, 0.5f, 0.4f, 0.1f, 0.5f, 0.4f, 0.6f, 1.0f, 1.0f,
      1.0f, 1.0f, 1.0f, 0.8f, 0.6f, 0.5f, 0.4f, 0.4f, 0.3f, 0.2f, 0.1f, 0.1f, 0.1f},
     {0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.3f, 0.4f, 0.5f, 0.1f, 0.6f, 1.0f, 1.0f, 1.0f, 0.6f,
      0.5f, 0.7f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.7f, 0.5f, 0.3f, 0.3f}},
    {{1.0f, 0.5f, 1.0f, 1.0f, 0.6f, 0.7f, 1.0f, 1.0f, 0.2f, 1.0f, 0.9f, 0.7f, 1.0f, 1.0f,
      1.0f, 0.9f, 0.9f, 0.8f, 0.8f, 0.7f, 0.6f, 0.5f, 0.5f, 0.3f, 0.2f, 0.1f, 0.1f},
     {1.0f, 0.5f, 1.0f, 1.0f, 0.6f, 0.7f, 1.0f, 1.0f, 0.2f, 1.0f, 0.9f, 0.7f, 1.0f, 1.0f,
      1.0f, 0.9f, 0.9f, 0.8f, 0.8f, 0.7f, 0.6f, 0.5f, 0.5f, 0.3f, 0.2f, 0.1f, 0.1f},
     {0.3f, 1.0f, 0.3f, 0.1f, 0.1f, 0.1f, 0.3f, 0.7f, 1.0f, 0.2f, 0.1f, 0.1f, 0.1f, 0.1f,
      0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.2f, 0.3f, 0.5f, 0.9f, 1.0f, 1.0f, 1.0f, 1.0f}},
};

// RCCL rocm-6.2.0 src/graph/tuning.cc: tuning_model_4. Selected by "tuning=4,ll128Enabled=1"
// (rome_model_58 / rome_model_65: MI250X nodes with NICs, LL128 on).
constexpr AmdTuning kAmdTuning4 = {
    "rccl tuning_model_4 (MI250X, LL128)",
    {{{0.8f, 1.4f, 2.5f}, {0.8f, 2.2f, 3.6f}},
     {{2.2f, 2.2f, 5.7f}, {2.2f, 2.2f, 5.7f}},
     {{32.2f, 34.4f, 47.6f}, {35.4f, 87.8f, 209.2f}}},
    {{{0.16f, 1.09f, 1.61f}, {0.15f, 0.41f, 1.0f}}, {{0.16f, 1.09f, 1.08f}, {0.15f, 0.41f, 1.0f}}},
    {{0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 1.0f, 0.1f, 0.1f, 0.2f, 0.4f, 0.6f,
      0.5f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f},
     {0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.2f, 0.1f, 0.1f, 0.2f, 1.0f,
      0.5f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f},
     {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.8f, 0.4f, 0.3f, 0.3f, 0.1f, 0.1f,
      1.0f, 1.0f, 0.7f, 0.5f, 0.6f, 0.5f, 0.6f, 0.6f, 0.5f, 0.6f, 0.6f, 0.6f, 0.7f}},
    {{0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.2f, 0.2f, 0.1f,
      0.3f, 0.1f, 0.1f, 0.1f, 0.2f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f},
     {0.4f, 0.5f, 0.5f, 0.4f, 0.4f, 0.4f, 0.4f, 0.2f, 0.2f, 0.1f, 0.3f, 1.0f, 1.0f, 0.7f,
      0.8f, 0.5f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.9f, 0.8f, 0.5f, 0.4f, 0.3f, 0.3f},
     {0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 1.0f, 1.0f, 0.8f, 0.5f, 0.1f,
      0.7f, 0.2f, 0.4f, 0.4f, 0.6f, 0.7f, 0.9f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}},
};

// RCCL rocm-6.2.0 src/graph/tuning.cc: tuning_model_5. Selected by "tuning=5" for the 8-GPU
// MI300X nodes (rome_model_79 / _80 / _84). Its LL128 rows are zero: no LL128 on gfx942.
constexpr AmdTuning kAmdTuning5 = {
    "rccl tuning_model_5 (MI300X)",
    {{{0.8f, 0.0f, 2.5f}, {0.8f, 0.0f, 3.6f}},
     {{2.2f, 2.2f, 5.7f}, {2.2f, 2.2f, 5.7f}},
     {{12.5f, 0.0f, 22.4f}, {9.5f, 0.0f, 19.8f}}},
    {{{0.41f, 0.0f, 1.0f}, {0.41f, 0.0f, 1.0f}}, {{0.41f, 0.0f, 0.86f}, {0.41f, 0.0f, 1.0f}}},
    {{0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 1.0f, 1.0f, 0.8f, 0.1f, 0.4f, 0.5f, 1.0f, 0.6f, 0.4f,
      0.6f, 0.1f, 0.3f, 0.4f, 0.4f, 0.3f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f},
     {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,
      0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
     {0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 1.0f, 1.0f, 1.0f, 0.4f, 1.0f, 1.0f,
      1.0f, 0.2f, 0.7f, 1.0f, 1.0f, 1.0f, 0.8f, 0.7f, 0.7f, 0.8f, 0.8f, 0.8f, 0.9f}},
    {{0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 1.0f, 0.1f, 0.2f, 0.2f, 0.1f, 0.5f, 0.8f,
      1.0f, 0.2f, 0.4f, 0.5f, 0.4f, 0.4f, 0.3f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f},
     {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,
      0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
     {0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.7f, 0.1f, 0.1f, 0.1f, 0.1f,
      0.1f, 1.0f, 1.0f, 1.0f, 0.9f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}},
};

// NVIDIA NCCL v2.19.3 src/graph/tuning.cc: baseLat and hwLat (Tree, Ring).
constexpr float kNvBaseLat[kNumRcclAlgos][kNumProtos] = {{6.8f, 14.0f, 0.0f}, {6.6f, 14.0f, 8.4f}};
constexpr float kNvHwLat[kNumHwRows][kNumRcclAlgos][kNumProtos] = {
    {{0.6f, 1.25f, 28.0f}, {0.6f, 1.9f, 3.4f}},   // NVLink
    {{1.0f, 1.9f, 28.0f}, {1.0f, 2.5f, 5.7f}},    // PCI
    {{5.0f, 8.5f, 28.0f}, {2.7f, 4.0f, 14.0f}}};  // network

// NVIDIA NCCL v2.19.3 src/graph/tuning.cc: per-channel caps, [compute capability index:
// Volta, Ampere, Hopper][nodes: 1, 2, more]. llMaxBws' first index is the GPU generation on one
// node and the CPU vendor (Intel 0, AMD 1) across nodes.
constexpr double kNvLLMaxBw[3][3] = {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {87.7, 22.5, 19.0}};
constexpr double kNvPerChMaxRingLL128Bw[3][3] = {
    {20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 36.7}};
constexpr double kNvPerChMaxTreeLL128Bw[3][3] = {
    {20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 29.0}};
constexpr double kNvPerChMaxTreeBw[3][3] = {
    {26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}};

// NVIDIA NCCL v2.19.3 src/graph/tuning.cc: Tree bandwidth correction, powers of two from 64 B.
constexpr int kNvTreeCorrectionSizes = 23;
constexpr float kNvTreeCorrection[kNumProtos][kNvTreeCorrectionSizes] = {
    {1.0f, 1.0f, 1.0f, 1.0f, .9f, .8f, .7f, .7f,  .7f,  .7f,  .6f, .5f,
     .4f,  .4f,  .5f,  .6f,  .7f, .8f, .9f, 1.0f, 1.0f, 1.0f, 1.0f},
    {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, .9f, .8f, .8f, .8f, .7f,  .6f, .6f,
     .6f,  .6f,  .6f,  .6f,  .8f,  .9f, .9f, .9f, .9f, 1.0f, 1.0f},
    {.9f, .9f, .9f, .9f, .9f, .9f, .9f, .8f, .7f, .6f, .6f, .5f,
     .5f, .5f, .5f, .6f, .7f, .8f, .7f, .7f, .8f, .9f, .9f}};

// Threads (src/include/device.h of each): RCCL caps every protocol at 256; NCCL at 512 (Simple,
// LL) and 640 (LL128). NCCL uses 256 for Ring/Simple when the ring's bandwidth is no more than
// PCI_BW (12 GB/s, src/graph/topo.h).
constexpr int kAmdMaxThreads = 256;
constexpr int kNvSimpleMaxThreads = 512;
constexpr int kNvLLMaxThreads = 512;
constexpr int kNvLL128MaxThreads = 640;
constexpr float kPciBw = 12.0f;

// Bytes per thread before a collective gets more channels or threads (src/include/comm.h, the
// same in RCCL and NCCL); Ring/LL multiplies by the rank count.
constexpr int64_t kThreadThreshold[kNumProtos] = {8, 8, 64};

// Network post overhead in us per ring step across nodes (getNetOverhead): 1.0 on Intel hosts,
// 2.0 on AMD hosts; Simple pays it three times. We assume AMD hosts for AMD GPUs and Intel hosts
// otherwise (the topology does not carry the CPU vendor).
constexpr float kNetOverheadAmdHost = 2.0f;
constexpr float kNetOverheadIntelHost = 1.0f;

// The host executor (ffi/host/executor.cc). These numbers model the CPU executor, not a GPU:
// they are first estimates, to be calibrated by benchmarks/cpu_collectives.py (jax_rccl against
// jax.lax on 8 virtual CPU devices).
//
// Ring and Tree on the host (arch cpu with loopback or shm links): every chunk goes through a
// FIFO slot (written by one thread, read by the next: two copies per hop), and every step hands
// off between threads (a doorbell wake-up). So each step costs about one thread hand-off, and
// the bandwidth is half of what the NCCL formula gives for one copy per hop.
constexpr float kCpuHandoffUs = 10.0f;           // one thread hand-off, us per ring/tree step
constexpr float kCpuFifoBandwidthFactor = 0.5f;  // two copies per hop instead of one

// The host runtime's network row: between nodes (hosts) a step crosses the network through the
// network proxies of both processes (ffi/cpu/net_links.h). Per inter-node step: the two proxies'
// hand-offs plus the kernel's socket path (about 60 us measured over loopback with 4
// processes on 2 cores; benchmarks/multiprocess.py). Bandwidth: the topology's bwInter (the CPU
// runtime sets it from the same measurement); the socket, not the memory, bounds a ring or tree
// that crosses nodes, so the model takes the lower of bwIntra and bwInter there.
constexpr float kCpuSocketStepUs = 60.0f;

// The network proxy's sockets between nodes (LinkKind::kSocket: the GPU runtime's groups across
// hosts, ffi/comm/proxy.h). A kernel's step reaches the peer's kernel only once the proxy has all
// of it in host memory and posts tail, whatever the protocol, so LL and LL128 start no earlier
// than Simple there: every protocol pays kSocketStepUs per step that crosses nodes. The sockets
// bound the rate (bwInter per channel, the lower of the two link rates as on the host executor),
// and per byte of the operation the network carries what the algorithm sends across:
//   Ring        NCCL's ratio (2(n-1)/n for all_reduce, (n-1)/n for all_gather and
//               reduce_scatter, 1 for broadcast and reduce);
//   Tree        1 on 2 nodes, 1.5 on more: of the double binary tree's two halves each crosses
//               between two nodes once up and once down (on more nodes an inner node also takes
//               its second child's half), where NCCL's 0.5 models links the chains within the
//               nodes also load.
// LL and LL128 send their flags across too (kSocketProtoBw of Simple's rate), and take Simple's
// latencies there.
// A Ring's steps that cross are its own share (N of its n hops cross nodes: nsteps * N / n of
// them), where NCCL's formula counts 2 * nNodes for an all_reduce whatever the ranks per node.
// Measured on one H100, 2 and 4 processes split into two faked hosts (docs/benchmark-log.md,
// 2026-12-06 fourth and fifth; benchmarks/gpu_cross_host.py): all_reduce at 256 MB Tree 19.0 ms
// against Ring 27.6 on 4 processes (1.45 times; equal on 2), LL 0.16-0.31 and LL128 0.67-0.69 of
// Simple's rate at 16 MB, and Simple as fast as LL or faster from 8 KB. A step that crosses takes
// tens of us on an idle path and 200-450 us with 32 channels busy (the proxies' timelines; Ring
// all_reduce on 4 processes: 1.03 ms at 1 MB against Tree's 0.51, 0.17 and 0.14 ms at 64 KB and 8
// KB, about 60 us of each call being launch and dispatch): kSocketStepUs is between.
constexpr float kSocketStepUs = 100.0f;
constexpr float kSocketProtoBw[kNumProtos] = {0.25f, 0.7f, 1.0f};

// Direct (ours; only with topology.directPeers on one node): ranks read and write each other's
// buffers in place, between two barriers of the host runtime (buffers published; peers done). No
// FIFO, no per-step hand-off: the latency is the two barriers, and the bandwidth is the per-rank
// memory bandwidth divided by the bytes the busiest rank moves per byte of the operation's size
// (nBytes: count for all_reduce, broadcast and reduce, nRanks * count for all_gather and
// reduce_scatter):
//   all_reduce      2      each rank reduces its 1/n sub-slice over the n inputs (reads count)
//                          and writes it into all n outputs (writes count)
//   all_gather      1      each rank copies its input into the n outputs (writes n * count)
//   reduce_scatter  1      rank r reduces block r over the n inputs (reads n * count)
//   broadcast       1      each rank copies the root's input (writes count)
//   reduce          1      rank r reduces sub-slice r over the n inputs into the root's output
//                          (reads count)
// The per-rank memory bandwidth is the one the Ring formula uses for the same topology
// (nChannels * bwIntra) times kCpuDirectMemBwFactor, so Ring and Direct stay comparable when the
// topology's bandwidth changes.
constexpr float kCpuDirectBarrierUs = 10.0f;   // one barrier of the host runtime (a hand-off)
constexpr float kCpuDirectMemBwFactor = 1.0f;  // calibrate: benchmarks/cpu_collectives.py
// On a GPU (ranks of one device, or devices whose memory the others read): the barriers are flags
// the kernels post and poll in the connection regions (a few microseconds each with the launch
// around them), and the bandwidth is the device's memory, which a ring spends twice over (FIFO
// writes and reads besides the buffers): Direct moves half the bytes of a ring per byte reduced.
constexpr float kGpuDirectBarrierUs = 2.0f;    // calibrate: benchmarks/gpu_collectives.py
constexpr float kGpuDirectMemBwFactor = 4.0f;  // calibrate: benchmarks/gpu_collectives.py
struct DirectTraffic {
  float fixed;    // bytes moved per byte of nBytes, independent of the rank count
  float perRank;  // ... and per rank of the communicator
};
constexpr DirectTraffic kCpuDirectTraffic[CostModel::kNumCostColls] = {
    {1.0f, 0.0f},  // broadcast
    {1.0f, 0.0f},  // reduce: each rank reduces its sub-slice into the root's output
    {1.0f, 0.0f},  // all_gather
    {1.0f, 0.0f},  // reduce_scatter
    {2.0f, 0.0f},  // all_reduce
};

// ============================================================================== helpers ==

// rcclTuningModel[topo->tuning] for an AMD topology (see the table comments).
const AmdTuning& AmdTuningFor(const TopologyView& topo) {
  if (topo.arch == Arch::kGfx942) return kAmdTuning5;
  return topo.ll128Enabled ? kAmdTuning4 : kAmdTuning1;
}

// NCCL's compute capability index: Volta 0, Ampere 1, Hopper 2. The CPU executor is costed as
// an Ampere-class device.
int NvCompCapIndex(Arch a) {
  return a == Arch::kSm90 ? 2 : 1;
}

// NCCL's hardware row for the links inside a node: NVLink-class (NVLink, and XGMI, which RCCL
// reports as LINK_NVL) or PCI for everything else (PCIe, and the CPU executor's shared memory
// and loopback, which NCCL would also cost as PCI since they are not NVLink).
HwRow IntraHwRow(LinkKind l) {
  return (l == LinkKind::kNvlink || l == LinkKind::kXgmi) ? kHwNvlink : kHwPci;
}

int Log2i(int64_t n) {
  int l = 0;
  while (n >>= 1) ++l;
  return l;
}

std::string ModelSource(const TopologyView& topo) {
  if (topo.socketNet()) {
    return detail::StrCat(IsAmd(topo.arch) ? AmdTuningFor(topo).name : "nccl v2.19.3 tables",
                          " within nodes, the network proxy's socket rows between them");
  }
  if (IsAmd(topo.arch)) return AmdTuningFor(topo).name;
  if (topo.hostFifoLinks()) {
    return "nccl v2.19.3 tables, Ampere caps, host hand-offs and FIFO copies (cpu executor)";
  }
  if (topo.arch == Arch::kCpu) return "nccl v2.19.3 tables, Ampere caps (cpu executor)";
  return topo.arch == Arch::kSm90 ? "nccl v2.19.3 tables, Hopper caps"
                                  : "nccl v2.19.3 tables, Ampere caps";
}

}  // namespace

// =============================================================================== formula ==

StatusOr<CostModel> BuildCostModel(const TopologyView& topo) {
  JR_CHECK(ValidateTopology(topo));
  CostModel m;
  const bool amd = IsAmd(topo.arch);
  const int tree = static_cast<int>(Algo::kTree);
  const int ring = static_cast<int>(Algo::kRing);
  const int ll = static_cast<int>(Proto::kLL);
  const int ll128 = static_cast<int>(Proto::kLL128);
  const int simple = static_cast<int>(Proto::kSimple);

  // Threads per block.
  if (amd) {
    for (auto& row : m.maxThreads) std::fill(std::begin(row), std::end(row), kAmdMaxThreads);
  } else {
    m.maxThreads[ring][simple] =
        topo.bwIntra * topo.nChannels <= kPciBw ? 256 : kNvSimpleMaxThreads;
    m.maxThreads[tree][simple] = kNvSimpleMaxThreads;
    m.maxThreads[ring][ll] = m.maxThreads[tree][ll] = kNvLLMaxThreads;
    m.maxThreads[ring][ll128] = m.maxThreads[tree][ll128] = kNvLL128MaxThreads;
  }
  // Direct runs with Ring's channel and thread logic (select.cc: GetChannelThreadInfo).
  const int direct = static_cast<int>(Algo::kDirect);
  for (int p = 0; p < kNumProtos; ++p) m.maxThreads[direct][p] = m.maxThreads[ring][p];
  const int nRanks = topo.nRanks;
  const int nNodes = topo.nNodes;
  m.treeDepth = nRanks / nNodes - 1 + Log2i(nNodes);  // connectTrees' approximation
  // One rank: RCCL stops here (no tables, zero thresholds); the planner never costs it.
  if (nRanks <= 1) return m;
  static_assert(static_cast<int>(Algo::kTree) < kNumRcclAlgos &&
                    static_cast<int>(Algo::kRing) < kNumRcclAlgos &&
                    static_cast<int>(Algo::kDirect) >= kNumRcclAlgos,
                "the RCCL/NCCL tables hold Tree and Ring rows only");

  for (int a = 0; a < kNumAlgos; ++a) {
    for (int p = 0; p < kNumProtos; ++p) m.threadThresholds[a][p] = kThreadThreshold[p];
  }
  m.threadThresholds[ring][ll] *= nRanks;
  m.threadThresholds[direct][ll] *= nRanks;  // as Ring (only Simple runs Direct)

  const float ppn = static_cast<float>(nRanks) / nNodes;
  const int nodesIx = nNodes <= 2 ? nNodes - 1 : 2;
  const HwRow intraHw = IntraHwRow(topo.intraLink);
  const HwRow hw = nNodes == 1 ? intraHw : kHwNet;
  const bool gfx94OneNode = topo.arch == Arch::kGfx942 && nNodes == 1;
  const AmdTuning* amdT = amd ? &AmdTuningFor(topo) : nullptr;
  const int cc = NvCompCapIndex(topo.arch);
  const double llMaxBw = kNvLLMaxBw[nNodes == 1 ? cc : 0][nodesIx];  // Intel host across nodes
  const double perChMaxTreeBw = kNvPerChMaxTreeBw[cc][nodesIx];
  const double perChMaxRingLL128Bw = kNvPerChMaxRingLL128Bw[cc][nodesIx];
  const double perChMaxTreeLL128Bw = kNvPerChMaxTreeLL128Bw[cc][nodesIx];
  const float netOverheadBase = amd ? kNetOverheadAmdHost : kNetOverheadIntelHost;
  const int nch = topo.nChannels;
  const bool hostFifo = topo.hostFifoLinks();
  const bool socket = topo.socketNet();
  const bool directOk = topo.directPeers && nNodes == 1;

  for (int c = 0; c < CostModel::kNumCostColls; ++c) {
    const Coll coll = static_cast<Coll>(c);
    const bool bcastOrReduce = coll == Coll::kBroadcast || coll == Coll::kReduce;
    const bool agOrRs = coll == Coll::kAllGather || coll == Coll::kReduceScatter;
    const int nsteps = coll == Coll::kAllReduce ? 2 * (nRanks - 1) : agOrRs ? nRanks - 1 : nRanks;
    const int nInterSteps = coll == Coll::kAllReduce ? (nNodes > 1 ? 2 * nNodes : 0)
                            : agOrRs                 ? nNodes - 1
                                                     : nNodes;
    // Direct: Simple only, on one node whose ranks read each other's buffers (CPU tables).
    if (directOk) {
      const DirectTraffic& tr = kCpuDirectTraffic[c];
      const bool cpu = topo.arch == Arch::kCpu;
      const float factor = cpu ? kCpuDirectMemBwFactor : kGpuDirectMemBwFactor;
      m.bandwidthGBs[c][direct][simple] =
          nch * topo.bwIntra * factor / (tr.fixed + tr.perRank * nRanks);
      m.latencyUs[c][direct][simple] = 2 * (cpu ? kCpuDirectBarrierUs : kGpuDirectBarrierUs);
    }
    for (int a = 0; a < kNumRcclAlgos; ++a) {
      if (coll != Coll::kAllReduce && a != ring) continue;  // Tree runs only all_reduce
      for (int p = 0; p < kNumProtos; ++p) {
        // RCCL: no Tree/Simple on a single gfx94x node.
        if (amd && a == tree && p == simple && gfx94OneNode) continue;
        float bw = nNodes <= 2 ? topo.bwIntra : topo.bwInter;
        if ((hostFifo || socket) && nNodes > 1) {
          bw = std::min(topo.bwIntra, topo.bwInter);  // bwInter validated
        }
        float busBw = nch * bw;
        if (socket) {
          busBw *= kSocketProtoBw[p];
        } else if (amd) {
          busBw *= amdT->bwRatio[nNodes <= 2 ? 0 : 1][a][p];
          if (a == ring && p == ll && bcastOrReduce && gfx94OneNode) busBw *= 1.65f;
        } else {
          if (a == ring && p == ll) {
            const bool quarter = nNodes > 1 || coll == Coll::kAllReduce || coll == Coll::kReduce;
            busBw = std::min(llMaxBw, busBw * (quarter ? 1.0 / 4.0 : 1.0 / 3.0));
          }
          if (a == ring && p == ll128) {
            busBw = std::min(busBw * (ppn < 2 ? 0.7 : 0.92), nch * perChMaxRingLL128Bw);
          }
          if (a == tree) busBw = std::min(busBw * .92, nch * perChMaxTreeBw);
          if (a == tree && p == ll) busBw = std::min(busBw * 1.0 / 3.8, llMaxBw);
          if (a == tree && p == ll128) {
            busBw = std::min(busBw * (nNodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0),
                             nch * perChMaxTreeLL128Bw);
          }
        }
        // Bus bandwidth to algorithm bandwidth.
        const float treeRatio = socket ? (nNodes == 2 ? 1.0f : 1.0f / 1.5f) : 0.5f;
        const float ratio = a == ring ? (1.0f * nRanks) / nsteps : treeRatio;
        m.bandwidthGBs[c][a][p] = busBw * ratio * (hostFifo ? kCpuFifoBandwidthFactor : 1.0f);
        if (a == ring) m.ringBackupGBs[c][p] = m.bandwidthGBs[c][a][p];

        const auto& hwLat = amd ? amdT->hwLat : kNvHwLat;
        // Across socket links every protocol waits for the proxy's whole steps: none starts
        // sooner than Simple, whose latencies all protocols take there (lp).
        const int lp = socket ? simple : p;
        float lat = amd ? kAmdBaseLat[a][lp] : kNvBaseLat[a][lp];
        float intraLat = hostFifo ? kCpuHandoffUs : hwLat[intraHw][a][lp];
        const float interLat = hostFifo ? kCpuSocketStepUs
                               : socket ? kSocketStepUs
                                        : hwLat[kHwNet][a][p];
        if (a == ring) {
          if (bcastOrReduce && hostFifo && nNodes == 1) {
            // Every hop of the host's pipeline is a thread hand-off, so the first chunk pays one
            // per hop: nRanks - 1 of them. (Across nodes NCCL's one network hop stays.)
            lat += (nRanks - 1) * intraLat;
          } else if (bcastOrReduce) {
            // Ring graphs are searched with sameChannels=1: one hop of latency.
            lat += socket ? kSocketStepUs : hwLat[hw][a][p];
          } else {
            float netOverhead = 0;
            if (nNodes > 1) netOverhead = netOverheadBase * (lp == simple ? 3 : 1);
            intraLat = std::max(intraLat, netOverhead);
            // NCCL counts 2 * nNodes crossings for an all_reduce (nNodes - 1 for all_gather and
            // reduce_scatter), whatever the ranks per node; on socket links, where a crossing
            // costs most, the ring's own share: N of its n hops cross, so nsteps * N / n.
            const float cross = socket ? float(nsteps) * nNodes / nRanks : float(nInterSteps);
            lat += (nsteps - cross) * intraLat + cross * interLat;
          }
        } else {
          lat += 2 * ((nRanks / nNodes - 1) * intraLat + Log2i(nNodes) * interLat);
        }
        m.latencyUs[c][a][p] = lat;
      }
    }
  }

  // LL128 only where the topology allows it (RCCL: ll128Enabled with RCCL_TOPO_XGMI_ALL; NCCL:
  // NVLink of one generation). The Ring backup keeps its value, as RCCL's ringbdw does.
  if (!topo.ll128Enabled) {
    for (int c = 0; c < CostModel::kNumCostColls; ++c) {
      for (int a = 0; a < kNumAlgos; ++a) m.bandwidthGBs[c][a][ll128] = 0;
    }
  }
  return m;
}

std::string UnavailableReason(const CostModel& model, const TopologyView& topo, Coll coll,
                              Algo algo, Proto proto, int64_t nBytes) {
  if (AlgoTime(model, topo, coll, algo, proto, nBytes, 1, nullptr) >= 0) return "";
  // The rules of BuildCostModel that leave a combination without bandwidth, most specific first.
  if (proto == Proto::kLL128 && !topo.ll128Enabled) return "LL128 is not enabled on this topology";
  if (algo == Algo::kTree && coll != Coll::kAllReduce) return "Tree runs all_reduce only";
  if (algo == Algo::kDirect && proto != Proto::kSimple) return "Direct runs Simple only";
  if (algo == Algo::kDirect) return "Direct needs one node whose ranks read each other's buffers";
  if (topo.arch == Arch::kGfx942 && topo.nNodes == 1 && algo == Algo::kTree &&
      proto == Proto::kSimple) {
    return "RCCL has no Tree/Simple on a single gfx94x node";
  }
  const int c = static_cast<int>(coll);
  if (c >= 0 && c < CostModel::kNumCostColls &&
      model.bandwidthGBs[c][static_cast<int>(algo)][static_cast<int>(proto)] == 0) {
    return "the cost model gives it no bandwidth on this topology";
  }
  return "the tuning table gives it no bandwidth at this size";
}

float AlgoTime(const CostModel& model, const TopologyView& topo, Coll coll, Algo algo, Proto proto,
               int64_t nBytes, int numPipeOps, bool* backup, int nChannels) {
  if (backup != nullptr) *backup = false;
  const int c = static_cast<int>(coll);
  const int a = static_cast<int>(algo);
  const int p = static_cast<int>(proto);
  if (c < 0 || c >= CostModel::kNumCostColls || a < 0 || a >= kNumAlgos || p < 0 ||
      p >= kNumProtos || nBytes < 0) {
    return -1.0f;
  }
  float bw = model.bandwidthGBs[c][a][p];
  float lat = model.latencyUs[c][a][p];
  if (backup != nullptr && algo == Algo::kRing && bw == 0.0f) {
    bw = model.ringBackupGBs[c][p];
    *backup = true;
  }
  if (bw == 0) return -1.0f;

  const int logSize = Log2i(nBytes >> 6);
  // RCCL's and NCCL's corrections by size fit their own kernels and networks; the socket rows are
  // measured as they stand (and give every protocol Simple's latency, so no Ring plateau either).
  const bool corrected = !topo.socketNet();
  if (IsAmd(topo.arch)) {
    const AmdTuning& t = AmdTuningFor(topo);
    const int ix = std::min(logSize, kNumCorrectionSizes - 1);
    if (corrected && algo == Algo::kTree) {
      bw *= t.treeCorrection[p][ix];
    } else if (corrected && topo.nNodes > 1) {
      bw *= t.ringCorrection[p][ix];
    }
  } else {
    if (corrected && algo == Algo::kTree && logSize < kNvTreeCorrectionSizes)
      bw *= kNvTreeCorrection[p][logSize];
    if (nChannels != 0) bw = bw / topo.nChannels * nChannels;
    if (corrected && algo == Algo::kRing && proto == Proto::kSimple && topo.nNodes > 1 &&
        coll == Coll::kAllReduce &&
        nBytes / (static_cast<int64_t>(topo.nChannels) * topo.nRanks) >= 64) {
      lat *= 1.4f;  // ring plateau; 1.9 before Ampere, which we do not model
    }
  }
  // A zero correction factor (RCCL's LL128 rows of tuning_model_5) leaves nothing to run.
  if (bw <= 0) return -1.0f;
  // Tree pipelining saves latency when operations are aggregated; the divisor is the work
  // elements per work of our layout (work.h: RCCL's NCCL_MAX_WORK_ELEMENTS, 1).
  const int latCount =
      algo == Algo::kRing ? numPipeOps : (numPipeOps + kMaxWorkElements - 1) / kMaxWorkElements;
  return lat * latCount + nBytes / (1000 * bw);
}

std::string DescribeCostModel(const CostModel& model, const TopologyView& topo) {
  std::ostringstream os;
  char buf[64];
  os << "cost model: " << topo.nRanks << " ranks, " << topo.nNodes << " node(s), arch "
     << ArchName(topo.arch) << ", intra " << LinkName(topo.intraLink)
     << (topo.nNodes > 1 ? detail::StrCat(", inter ", LinkName(topo.interLink)) : std::string())
     << ", " << topo.nChannels << " channels x " << topo.bwIntra << "/" << topo.bwInter
     << " GB/s (intra/inter); " << ModelSource(topo) << "; LL128 "
     << (topo.ll128Enabled ? "on" : "off") << "; tree depth " << model.treeDepth << "\n";
  os << "latency us / bandwidth GB/s";
  for (int a = 0; a < kNumAlgos; ++a) {
    for (int p = 0; p < kNumProtos; ++p) {
      std::snprintf(buf, sizeof(buf), " | %6s/%-6s", AlgoName(static_cast<Algo>(a)),
                    ProtoName(static_cast<Proto>(p)));
      os << buf;
    }
  }
  os << "\n";
  std::snprintf(buf, sizeof(buf), "%-27s", "max threads");
  os << buf;
  for (int a = 0; a < kNumAlgos; ++a) {
    for (int p = 0; p < kNumProtos; ++p) {
      std::snprintf(buf, sizeof(buf), " | %13d", model.maxThreads[a][p]);
      os << buf;
    }
  }
  os << "\n";
  std::snprintf(buf, sizeof(buf), "%-27s", "thread thresholds");
  os << buf;
  for (int a = 0; a < kNumAlgos; ++a) {
    for (int p = 0; p < kNumProtos; ++p) {
      std::snprintf(buf, sizeof(buf), " | %13lld",
                    static_cast<long long>(model.threadThresholds[a][p]));
      os << buf;
    }
  }
  os << "\n";
  for (int c = 0; c < CostModel::kNumCostColls; ++c) {
    std::snprintf(buf, sizeof(buf), "%-27s", CollName(static_cast<Coll>(c)));
    os << buf;
    for (int a = 0; a < kNumAlgos; ++a) {
      for (int p = 0; p < kNumProtos; ++p) {
        std::snprintf(buf, sizeof(buf), " | %6.1f/%6.1f", model.latencyUs[c][a][p],
                      model.bandwidthGBs[c][a][p]);
        os << buf;
      }
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace jax_rccl
