// The work layout of one kernel launch (after RCCL src/enqueue.cc uploadWork), and the host's
// bookkeeping of the FIFO ring (waitWorkFifoAvailable, rollingLess32, rollingMin32).
//
// Block b of the kernel starts at work b of the launch's head (the first work of its channel);
// later works of each channel follow all first works and are chained by workNext offsets from
// the head. The tail work of a channel carries the value the device acks back (doneAcks).
#include <cstdint>

#include "ffi/planner/planner.h"

namespace jax_rccl {

namespace {

// Monotonic 32-bit counters compared across wrap-around: a is before b when b - a, seen as
// signed, is positive.
constexpr uint32_t kPositiveMax = uint32_t(-1) >> 1;
bool RollingLess32(uint32_t a, uint32_t b) {
  return a - b > kPositiveMax;
}
uint32_t RollingMin32(uint32_t a, uint32_t b) {
  return (b - a <= kPositiveMax) ? a : b;
}

int CountChannelsWithWork(const KernelPlan& kp, int* nWork) {
  int channels = 0;
  *nWork = 0;
  for (const ChannelPlan& ch : kp.channels) {
    if (!ch.works.empty()) ++channels;
    *nWork += ch.nWork();
  }
  return channels;
}

// Walks the plan's works in layout order: (channel, work, unmasked slot, next slot or none).
// `ixHead` is the slot of the head; `ixMask` maps slots to ring positions.
template <typename Place>
uint32_t PlaceWorks(const KernelPlan& kp, int channelCount, uint32_t ixHead, uint32_t ixMask,
                    bool inFifo, uint32_t* channelSent, Place place) {
  uint32_t ixSent = ixHead + uint32_t(channelCount);  // later works go after all first works
  uint32_t channelsWithWork = 0;
  for (int c = 0; c < kMaxChannels; ++c) {
    const auto& works = kp.channels[c].works;
    uint32_t ix = ixHead + channelsWithWork;
    if (!works.empty()) ++channelsWithWork;
    for (size_t j = 0; j < works.size(); ++j) {
      Work w = works[j];
      const bool last = j + 1 == works.size();
      if (!last) {
        // Offset (in works) of the next one from the head, in ring positions: negative when the
        // chain wrapped past the ring's end.
        w.header.workNext = int32_t(ixSent & ixMask) - int32_t(ixHead & ixMask);
      } else {
        w.header.inFifo = inFifo ? 1 : 0;
        // All slots up to and including ix are consumed once the channel acks ix + 1.
        w.header.doneAcks = ix + 1;
        if (channelSent != nullptr) channelSent[c] = ix + 1;
      }
      place(ix & ixMask, w);
      if (!last) ix = ixSent++;
    }
  }
  return ixSent;
}

}  // namespace

std::vector<Work> LayoutPersistent(const KernelPlan& kp) {
  int nWork = 0;
  const int channelCount = CountChannelsWithWork(kp, &nWork);
  std::vector<Work> heap(static_cast<size_t>(nWork));
  // A persistent plan owns its array: slots from 0, no mask, nothing acked. (RCCL also records
  // the tail slots as the FIFO's per-channel sent counters here; ours keeps the FIFO apart.)
  PlaceWorks(kp, channelCount, /*ixHead=*/0, /*ixMask=*/~uint32_t(0), /*inFifo=*/false,
             /*channelSent=*/nullptr, [&](uint32_t slot, const Work& w) { heap[slot] = w; });
  return heap;
}

StatusOr<FifoLayout> LayoutFifo(const KernelPlan& kp, FifoState* fifo) {
  const uint32_t depth = fifo->depth;
  JR_REQUIRE(depth >= uint32_t(2 * kMaxChannels) && (depth & (depth - 1)) == 0,
             Code::kInvalidArgument, "work FIFO depth must be a power of two >= ", 2 * kMaxChannels,
             ", got ", depth);
  int nWork = 0;
  const int channelCount = CountChannelsWithWork(kp, &nWork);
  JR_REQUIRE(uint32_t(nWork) <= depth, Code::kInvalidArgument, "a launch of ", nWork,
             " works does not fit a work FIFO of depth ", depth);
  const uint32_t ixMask = depth - 1;

  uint32_t ixSent = fifo->sent;
  // Block b reads its first work at head + b, so the first works must not straddle the ring's
  // end: skip to the wrap boundary, and count the skipped slots as sent so that they are
  // treated as consumed once every channel quiesces.
  if (channelCount > 0 && ((ixSent + uint32_t(channelCount) - 1) & ixMask) < (ixSent & ixMask)) {
    ixSent = (ixSent + ixMask) & ~ixMask;
    fifo->sent = ixSent;
  }

  FifoLayout out;
  out.ixHead = ixSent;
  out.waitAcked = ixSent + uint32_t(nWork);
  // The ring may be written only once the device has acked enough (waitWorkFifoAvailable).
  // The per-channel counters must keep their old values while the caller polls, so nothing
  // past the skip is placed until there is room: the caller polls with FifoPoll until
  // FifoHasRoom(*fifo, waitAcked) and calls again (the skip is not repeated).
  if (!FifoHasRoom(*fifo, out.waitAcked)) return out;

  out.writes.reserve(static_cast<size_t>(nWork));
  fifo->sent = PlaceWorks(kp, channelCount, ixSent, ixMask, /*inFifo=*/true, fifo->channelSent,
                          [&](uint32_t slot, const Work& w) { out.writes.emplace_back(slot, w); });
  return out;
}

bool FifoHasRoom(const FifoState& fifo, uint32_t desiredSent) {
  return !RollingLess32(fifo.ackdMin + fifo.depth, desiredSent);
}

void FifoPoll(FifoState* fifo, uint32_t* doneLive) {
  uint32_t ackd[kMaxChannels];
  for (int c = 0; c < kMaxChannels; ++c) ackd[c] = doneLive[c];
  // The least ack over channels still busy (ack differs from what they were last sent);
  // quiesced channels do not hold the FIFO back.
  uint32_t ackdAll = fifo->sent;
  for (int c = 0; c < kMaxChannels; ++c) {
    if (ackd[c] != fifo->channelSent[c]) ackdAll = RollingMin32(ackdAll, ackd[c]);
  }
  // Quiesced channels move along with the minimum so that they never fall a half-range behind
  // and get misread across the 32-bit wrap.
  for (int c = 0; c < kMaxChannels; ++c) {
    if (ackd[c] == fifo->channelSent[c]) {
      fifo->channelSent[c] = ackdAll;
      doneLive[c] = ackdAll;
    }
  }
  fifo->ackdMin = ackdAll;
}

}  // namespace jax_rccl
