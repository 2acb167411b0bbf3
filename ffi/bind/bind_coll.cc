// Low-level collective planner entry points for tests (jax_rccl._jax_rccl.internal): element
// alignment, chunk size, last chunk and step counts of one collective, and the FIFO ring's
// layout and bookkeeping. See ffi/planner/chunk.cc and ffi/planner/layout.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ffi/bind/bindings.h"
#include "ffi/planner/internal.h"

namespace nb = nanobind;

namespace jax_rccl {
namespace {

// A topology with what chunking reads: ranks, nodes, arch (warp size), buffer sizes.
TopologyView ChunkTopology(int nRanks, int nNodes, const std::string& arch,
                           const std::vector<int64_t>& buffSizes) {
  TopologyView t;
  ThrowIfError(ValidateRanksAndNodes(nRanks, nNodes));
  t.nRanks = nRanks;
  t.nNodes = nNodes;
  t.arch = ValueOrThrow(ParseArch(arch));
  if (buffSizes.size() != size_t(kNumProtos)) {
    throw nb::value_error("buff_sizes: expected 3 sizes (ll, ll128, simple)");
  }
  for (int p = 0; p < kNumProtos; ++p) t.buffSizes[p] = buffSizes[p];
  return t;
}

// What chunking plans with, as rank 0: a topology, a default cost model, tuning and parameters.
// `ctx` refers to the other members: the struct stays where it was made.
struct ChunkContext {
  explicit ChunkContext(const TopologyView& topo) : t(topo) {}
  ChunkContext(const ChunkContext&) = delete;
  ChunkContext& operator=(const ChunkContext&) = delete;
  TopologyView t;
  CostModel model;
  Tuning tuning;
  PlannerParams params;
  PlanContext ctx{t, model, tuning, params, 0, 0};
};

std::vector<uint32_t> Padded(const std::vector<uint32_t>& v, const char* what) {
  if (v.size() > size_t(kMaxChannels)) {
    throw nb::value_error((std::string(what) + ": at most 128 channels").c_str());
  }
  std::vector<uint32_t> out(v);
  out.resize(kMaxChannels, 0);
  return out;
}

FifoState MakeFifo(uint32_t depth, uint32_t sent, uint32_t ackdMin,
                   const std::vector<uint32_t>& channelSent) {
  FifoState f;
  f.depth = depth;
  f.sent = sent;
  f.ackdMin = ackdMin;
  std::vector<uint32_t> cs = Padded(channelSent, "channel_sent");
  for (int c = 0; c < kMaxChannels; ++c) f.channelSent[c] = cs[c];
  return f;
}

nb::list ChannelSentList(const FifoState& f) {
  nb::list out;
  for (int c = 0; c < kMaxChannels; ++c) out.append(f.channelSent[c]);
  return out;
}

// A plan whose channel c holds works_per_channel[c] works; work j of channel c is tagged with
// funcIndex = c and elems[0].slot = j so that the layout can be read back.
KernelPlan SkeletonPlan(const std::vector<int>& worksPerChannel) {
  if (worksPerChannel.size() > size_t(kMaxChannels)) {
    throw nb::value_error("works_per_channel: at most 128 channels");
  }
  KernelPlan kp;
  for (size_t c = 0; c < worksPerChannel.size(); ++c) {
    if (worksPerChannel[c] < 0) throw nb::value_error("works_per_channel: counts must be >= 0");
    for (int j = 0; j < worksPerChannel[c]; ++j) {
      Work w{};
      w.header.type = kWorkTypeColl;
      w.header.funcIndex = uint16_t(c);
      w.elems[0].slot = uint32_t(j);
      kp.channels[c].works.push_back(w);
    }
    if (worksPerChannel[c] > 0) {
      kp.channels[c].works.back().header.isLast = 1;
      kp.channelUbound = int(c) + 1;
      kp.channelCount += 1;
    }
  }
  return kp;
}

nb::dict WorkDict(uint32_t slot, const Work& w) {
  nb::dict d;
  d["slot"] = slot;
  d["channel"] = int(w.header.funcIndex);
  d["index"] = int(w.elems[0].slot);
  d["is_last"] = bool(w.header.isLast);
  d["in_fifo"] = bool(w.header.inFifo);
  if (w.header.isLast) {
    d["done_acks"] = w.header.doneAcks;
  } else {
    d["work_next"] = w.header.workNext;
  }
  return d;
}

}  // namespace

void BindCollInternals(nb::module_& m) {
  m.def(
      "calc_align_count",
      [](const std::string& protocol, const std::string& dtype, int nThreads,
         const std::string& arch) {
        const ChunkContext c(ChunkTopology(8, 1, arch, {262144, 458752, 4194304}));
        CollInfo info;
        info.proto = ValueOrThrow(ParseProto(protocol));
        info.dtype = ValueOrThrow(ParseDataType(dtype));
        info.nThreads = nThreads;
        return ComputeAlignCount(c.ctx, info);
      },
      nb::arg("protocol"), nb::arg("dtype"), nb::arg("nthreads") = 256, nb::arg("arch") = "gfx942",
      "computeCollAlignCount: elements each part is aligned to.");

  m.def(
      "coll_chunk_info",
      [](const std::string& coll, const std::string& algorithm, const std::string& protocol,
         const std::string& dtype, int64_t nBytes, int nChannels, int nRanks, int nNodes,
         const std::string& arch, const std::vector<int64_t>& buffSizes, int treeDepth,
         int chunkSteps, int sliceSteps, uint64_t workCount) {
        ChunkContext c(ChunkTopology(nRanks, nNodes, arch, buffSizes));
        c.model.treeDepth = treeDepth;
        const PlanContext& ctx = c.ctx;
        CollInfo info;
        info.coll = ValueOrThrow(ParseColl(coll));
        info.algo = ValueOrThrow(ParseAlgo(algorithm));
        info.proto = ValueOrThrow(ParseProto(protocol));
        info.dtype = ValueOrThrow(ParseDataType(dtype));
        info.nBytes = nBytes;
        info.nChannels = nChannels;
        info.nThreads = kMaxNThreads;
        info.chunkSteps = chunkSteps;
        info.sliceSteps = sliceSteps;
        info.count = workCount;
        ThrowIfError(GetPatternInfo(&info));
        ThrowIfError(ComputeChunkInfo(ctx, &info, nBytes, nChannels));
        const int64_t align = ComputeAlignCount(ctx, info);
        nb::dict d;
        d["pattern"] = PatternName(info.pattern);
        d["step_size"] = info.stepSize;
        d["chunk_size"] = info.chunkSize;
        d["chunk_count"] = info.chunkCount;
        d["chunk_steps"] = info.chunkSteps;
        d["slice_steps"] = info.sliceSteps;
        d["align_count"] = align;
        d["last_chunk_count"] = ComputeLastChunkCount(ctx, info, workCount, align);
        d["steps"] = ComputeSteps(ctx, info, workCount);
        return d;
      },
      nb::arg("coll"), nb::arg("algorithm"), nb::arg("protocol"), nb::arg("dtype"),
      nb::arg("nbytes"), nb::arg("nchannels"), nb::arg("nranks") = 8, nb::arg("nnodes") = 1,
      nb::arg("arch") = "gfx942",
      nb::arg("buff_sizes") = std::vector<int64_t>{262144, 458752, 4194304},
      nb::arg("tree_depth") = 7, nb::arg("chunk_steps") = 4, nb::arg("slice_steps") = 2,
      nb::arg("work_count") = 0,
      "computeCollChunkInfo for one collective (nbytes/nchannels stand for both the task's and "
      "the arguments), with the alignment (256 threads), the last chunk and the step count of a "
      "part of work_count elements.");

  m.def(
      "fifo_has_room",
      [](uint32_t depth, uint32_t ackdMin, uint32_t desiredSent) {
        FifoState f;
        f.depth = depth;
        f.ackdMin = ackdMin;
        return FifoHasRoom(f, desiredSent);
      },
      nb::arg("depth"), nb::arg("ackd_min"), nb::arg("desired_sent"),
      "Whether the ring may advance to desired_sent (rollingLess32 on ackd_min + depth).");

  m.def(
      "fifo_poll",
      [](uint32_t depth, uint32_t sent, uint32_t ackdMin, const std::vector<uint32_t>& channelSent,
         const std::vector<uint32_t>& doneLive) {
        FifoState f = MakeFifo(depth, sent, ackdMin, channelSent);
        std::vector<uint32_t> done = Padded(doneLive, "done_live");
        FifoPoll(&f, done.data());
        nb::dict d;
        d["ackd_min"] = f.ackdMin;
        d["channel_sent"] = ChannelSentList(f);
        nb::list dl;
        for (uint32_t v : done) dl.append(v);
        d["done_live"] = dl;
        return d;
      },
      nb::arg("depth"), nb::arg("sent"), nb::arg("ackd_min"), nb::arg("channel_sent"),
      nb::arg("done_live"),
      "One round of waitWorkFifoAvailable's poll; lists are per channel, padded to 128 with 0.");

  m.def(
      "layout_fifo",
      [](const std::vector<int>& worksPerChannel, uint32_t depth, uint32_t sent, nb::object ackdMin,
         const std::vector<uint32_t>& channelSent) {
        KernelPlan kp = SkeletonPlan(worksPerChannel);
        const uint32_t ackd = ackdMin.is_none() ? sent : nb::cast<uint32_t>(ackdMin);
        std::vector<uint32_t> cs = channelSent;
        if (cs.empty()) cs.assign(kMaxChannels, sent);
        FifoState f = MakeFifo(depth, sent, ackd, cs);
        FifoLayout l = ValueOrThrow(LayoutFifo(kp, &f));
        nb::dict d;
        d["ix_head"] = l.ixHead;
        d["wait_acked"] = l.waitAcked;
        d["placed"] = FifoHasRoom(f, l.waitAcked);
        d["sent"] = f.sent;
        d["channel_sent"] = ChannelSentList(f);
        nb::list writes;
        for (const auto& [slot, w] : l.writes) writes.append(WorkDict(slot, w));
        d["writes"] = writes;
        return d;
      },
      nb::arg("works_per_channel"), nb::arg("depth"), nb::arg("sent") = 0,
      nb::arg("ackd_min") = nb::none(), nb::arg("channel_sent") = std::vector<uint32_t>{},
      "uploadWork's FIFO layout of a plan with works_per_channel[c] works on channel c. "
      "ackd_min defaults to sent, channel_sent to sent on every channel.");

  m.def(
      "layout_persistent",
      [](const std::vector<int>& worksPerChannel) {
        KernelPlan kp = SkeletonPlan(worksPerChannel);
        std::vector<Work> heap = LayoutPersistent(kp);
        nb::list out;
        for (size_t i = 0; i < heap.size(); ++i) out.append(WorkDict(uint32_t(i), heap[i]));
        return out;
      },
      nb::arg("works_per_channel"),
      "uploadWork's persistent layout of a plan with works_per_channel[c] works on channel c.");
}

}  // namespace jax_rccl
