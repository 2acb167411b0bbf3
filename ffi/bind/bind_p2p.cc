// Low-level point-to-point planner entry points for tests (jax_rccl._jax_rccl.internal): the
// per-step peer order, the channel of a chunk, the chunk size split and the warp split of a p2p
// work. See ffi/planner/schedule_p2p.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ffi/bind/bindings.h"
#include "ffi/planner/internal.h"

namespace nb = nanobind;

namespace jax_rccl {
namespace {

// The shared dict conversion, validated like a planner input.
TopologyView P2pTopologyFromDict(const nb::dict& d) {
  TopologyView t = TopologyFromDict(d);
  ThrowIfError(ValidateTopology(t));
  return t;
}

void CheckRank(const TopologyView& t, int rank, const char* what) {
  if (rank < 0 || rank >= t.nRanks) {
    throw nb::value_error(
        detail::StrCat(what, " must be in 0..", t.nRanks - 1, ", got ", rank).c_str());
  }
}

}  // namespace

void BindP2pInternals(nb::module_& internal) {
  internal.def(
      "p2p_schedule",
      [](const nb::dict& topology, int rank) {
        const TopologyView t = P2pTopologyFromDict(topology);
        CheckRank(t, rank, "rank");
        std::vector<int> send, recv;
        ComputeP2pSchedule(t, rank, &send, &recv);
        return std::make_pair(send, recv);
      },
      nb::arg("topology"), nb::arg("rank"),
      "The per-step peer order of `rank`: (send_order, recv_order); -1 marks an empty step.");

  internal.def(
      "p2p_channel",
      [](const nb::dict& topology, int rank, int peer, int chunk, bool is_send) {
        const TopologyView t = P2pTopologyFromDict(topology);
        CheckRank(t, rank, "rank");
        CheckRank(t, peer, "peer");
        if (chunk < 0) {
          throw nb::value_error(detail::StrCat("chunk must be >= 0, got ", chunk).c_str());
        }
        return P2pChannel(t, rank, peer, chunk % t.p2pnChannelsPerPeer, is_send);
      },
      nb::arg("topology"), nb::arg("rank"), nb::arg("peer"), nb::arg("chunk"), nb::arg("is_send"),
      "The channel of the `chunk`-th piece `rank` sends to (or receives from) `peer`.");

  internal.def(
      "calc_p2p_chunk_size",
      [](int64_t total, int min_channels, int max_channels, int64_t min_size, int64_t max_size) {
        if (total < 0 || min_channels < 1 || max_channels < 1 || min_size < 1 || max_size < 1) {
          throw nb::value_error(
              "calc_p2p_chunk_size: total must be >= 0; channels and sizes must be >= 1");
        }
        return CalcP2pChunkSize(total, min_channels, max_channels, min_size, max_size);
      },
      nb::arg("total"), nb::arg("min_channels"), nb::arg("max_channels"), nb::arg("min_size"),
      nb::arg("max_size"), "The largest piece a send/recv of `total` bytes is cut into.");

  internal.def(
      "p2p_chunk_params",
      [](const nb::dict& topology) {
        const TopologyView t = P2pTopologyFromDict(topology);
        // The arguments scheduleP2pTasksToPlan passes to calcP2pChunkSize.
        int nChannelsMin = t.p2pnChannelsPerPeer;
        while (nChannelsMin * t.nRanks > t.p2pnChannels && nChannelsMin > 1) nChannelsMin /= 2;
        nb::dict d;
        d["min_channels"] = nChannelsMin;
        d["max_channels"] = t.p2pnChannelsPerPeer;
        d["min_size"] = t.nNodes > 1 ? t.p2pChunkSize / 2 : t.p2pChunkSize / 8;
        d["max_size"] = t.nNodes > 1 ? t.p2pChunkSize : t.p2pChunkSize * 32;
        return d;
      },
      nb::arg("topology"),
      "The channel and size bounds the p2p scheduler splits tasks with, for a topology.");

  internal.def(
      "finish_work_p2p",
      [](const std::vector<std::string>& slots, int warp_size) {
        if (slots.size() != size_t(kMaxWorkElementsP2p)) {
          throw nb::value_error(detail::StrCat("slots must name ", kMaxWorkElementsP2p,
                                               " slots ('send', 'recv' or 'unused')")
                                    .c_str());
        }
        if (warp_size != 32 && warp_size != 64) {
          throw nb::value_error(
              detail::StrCat("warp_size must be 32 or 64, got ", warp_size).c_str());
        }
        Work w;
        std::memset(&w, 0, sizeof(w));
        w.header.type = kWorkTypeP2p;
        for (int e = 0; e < kMaxWorkElementsP2p; ++e) {
          const std::string& s = slots[e];
          if (s == "send") {
            w.p2pElems[e].p2pType = kWorkP2pTypeSend;
          } else if (s == "recv") {
            w.p2pElems[e].p2pType = kWorkP2pTypeRecv;
          } else if (s != "unused") {
            throw nb::value_error(
                ("slots: each must be 'send', 'recv' or 'unused', got '" + s + "'").c_str());
          }
        }
        FinishWorkP2p(&w, warp_size);
        nb::list out;
        for (int e = 0; e < kMaxWorkElementsP2p; ++e) {
          nb::dict d;
          d["ngroups"] = int(w.p2pElems[e].ngroups);
          d["warp_start"] = int(w.p2pElems[e].warpStart);
          d["nwarps"] = int(w.p2pElems[e].nWarps);
          out.append(d);
        }
        return out;
      },
      nb::arg("slots"), nb::arg("warp_size"),
      "The warp split finishWorkP2p gives the elements of a p2p work, per slot.");
}

}  // namespace jax_rccl
