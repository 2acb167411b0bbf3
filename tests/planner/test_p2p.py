"""Point-to-point planning: the peer schedule, channel mapping, chunking and element placement.

Golden numbers are worked out by hand from RCCL rocm-6.2.0 (src/init.cc p2p schedule,
src/include/channel.h ncclChannelCompute, src/enqueue.cc scheduleP2pTasksToPlan / addP2pToPlan /
calcP2pChunkSize / finishWorkP2p, src/proxy.cc ncclProxyComputeP2p); the arithmetic is in the
comments. Invariants over random task mixes are checked with hypothesis.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax_rccl._jax_rccl import internal

from jax_rccl import planner

MI300X_8 = planner.Topology.preset("mi300x-8")  # 8 ranks, p2p 64 channels, 2 per peer, 512 KiB
MI300X_2X8 = planner.Topology.preset("mi300x-2x8")  # 16 ranks / 2 nodes, 64 ch, 2 per peer, 128 KiB
MAX_WORK_ELEMENTS_P2P = 2  # NCCL_MAX_WORK_ELEMENTS_P2P in RCCL


def mirror(val: int, pow2: int) -> int:
    """mirrorBits: the p2p channel table entry (reverses the low log2(pow2) bits)."""
    bits = pow2.bit_length() - 1
    return int(format(val, f"0{bits}b")[::-1], 2) if bits else 0


def p2p_elems(d: dict) -> list[dict]:
    """Every send/recv element of a plan dict, with its channel id added."""
    out = []
    for ch in d["channels"]:
        for e in ch["work"]:
            if e["type"] in ("send", "recv"):
                out.append({**e, "channel": ch["id"]})
    return out


def task_elems(d: dict, task: int) -> list[dict]:
    return sorted((e for e in p2p_elems(d) if e["task"] == task), key=lambda e: e["byte_offset"])


# ---------------------------------------------------------------------------------------------
# The peer schedule (src/init.cc): steps = maxLocalRanks (ALIGN_POWER(x, 1) = x); node distances
# in the order 0, nNodes/2, then +-d pairs; step s sends to local rank (localRank + s) of node
# (node + delta) and receives from local rank (localRank - s) of node (node - delta).


def test_schedule_8_ranks_one_node():
    topo = MI300X_8.to_native()
    for r in range(8):
        send, recv = internal.p2p_schedule(topo, r)
        assert send == [(r + s) % 8 for s in range(8)]
        assert recv == [(r - s) % 8 for s in range(8)]
    # Rank 3 spelled out: send 3,4,...,2; recv 3,2,1,0,7,6,5,4.
    assert internal.p2p_schedule(topo, 3) == ([3, 4, 5, 6, 7, 0, 1, 2], [3, 2, 1, 0, 7, 6, 5, 4])


def test_schedule_16_ranks_two_nodes():
    topo = MI300X_2X8.to_native()
    # nNodes = 2: d runs 0..0, deltas = {0, (2-0)%2=0, 2/2-0=1, (2-1)%2=1} -> delta order 0, 1.
    # Rank 3 (node 0, local 3): delta 0 -> own node, send local 3+s, recv local 3-s;
    # delta 1 -> node 1 (ranks 8..15) for both directions: send 8+(3+s)%8, recv 8+(3-s)%8.
    send, recv = internal.p2p_schedule(topo, 3)
    assert send == [3, 4, 5, 6, 7, 0, 1, 2, 11, 12, 13, 14, 15, 8, 9, 10]
    assert recv == [3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12]
    # Rank 10 (node 1, local 2): own node first, then node 0.
    send, recv = internal.p2p_schedule(topo, 10)
    assert send == [10, 11, 12, 13, 14, 15, 8, 9, 2, 3, 4, 5, 6, 7, 0, 1]
    assert recv == [10, 9, 8, 15, 14, 13, 12, 11, 2, 1, 0, 7, 6, 5, 4, 3]


def test_schedule_4_nodes_delta_order():
    # nNodes = 4: d = 0..1. d=0: deltas {0, 0, 2, 2} -> 0, 2. d=1: {1, 3, 1, 3} -> 1, 3 (index 2
    # repeats deltas[0], index 3 repeats deltas[1]). Send nodes of node 0: 0, 2, 1, 3; recv nodes
    # (node - delta): 0, 2, 3, 1.
    topo = planner.Topology(nranks=32, nnodes=4, bw_inter=5.0).to_native()
    send, recv = internal.p2p_schedule(topo, 5)
    assert [s // 8 for s in send[::8]] == [0, 2, 1, 3]
    assert [r // 8 for r in recv[::8]] == [0, 2, 3, 1]
    assert send[8:16] == [21, 22, 23, 16, 17, 18, 19, 20]
    assert recv[16:24] == [29, 28, 27, 26, 25, 24, 31, 30]


@pytest.mark.parametrize("nnodes", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16])
@pytest.mark.parametrize("local", [1, 3, 8])
def test_schedule_is_a_permutation(nnodes, local):
    topo = planner.Topology(nranks=nnodes * local, nnodes=nnodes, bw_inter=5.0).to_native()
    for r in range(0, nnodes * local, max(1, nnodes * local // 5)):
        send, recv = internal.p2p_schedule(topo, r)
        assert sorted(send) == list(range(nnodes * local))
        assert sorted(recv) == list(range(nnodes * local))
        assert send[0] == recv[0] == r  # step 0 is self


# ---------------------------------------------------------------------------------------------
# Channels (ncclChannelCompute): base = step (one node) or delta + step (several nodes),
# channel = (mirrorBits(base % p2pnChannels, p2pnChannels) + chunk % perPeer) % p2pnChannels.


def test_p2p_channel_golden():
    topo = MI300X_8.to_native()
    # rank 0 -> 1: step (8 + 1 - 0) % 8 = 1; mirror(1, 64) = 0b100000 = 32; chunk 1 -> 33;
    # chunk 2 -> 2 % perPeer(2) = 0 -> 32.
    assert internal.p2p_channel(topo, 0, 1, 0, True) == 32
    assert internal.p2p_channel(topo, 0, 1, 1, True) == 33
    assert internal.p2p_channel(topo, 0, 1, 2, True) == 32
    # rank 0 <- 1: step (8 + 0 - 1) % 8 = 7; mirror(7, 64) = 0b111000 = 56.
    assert internal.p2p_channel(topo, 0, 1, 0, False) == 56
    # rank 1 <- 0 matches rank 0 -> 1: step (8 + 1 - 0) % 8 = 1 -> 32.
    assert internal.p2p_channel(topo, 1, 0, 0, False) == 32
    for p in range(8):
        assert internal.p2p_channel(topo, 0, p, 0, True) == mirror(p, 64)
    topo2 = MI300X_2X8.to_native()
    # rank 0 -> 8: delta 1, step 0 -> base 1 -> 32. rank 0 -> 9: delta 1, step 1 -> base 2 -> 16.
    assert internal.p2p_channel(topo2, 0, 8, 0, True) == 32
    assert internal.p2p_channel(topo2, 0, 9, 0, True) == 16
    assert internal.p2p_channel(topo2, 9, 0, 0, False) == 16


# ---------------------------------------------------------------------------------------------
# Chunk sizes: calcP2pChunkSize(total, minCh, maxCh, minSize, maxSize) =
#   size = max(minSize, divUp(total, minCh)); double the channels while size > maxSize and
#   channels <= maxCh / 2; return alignUp(size, minSize).


def test_calc_p2p_chunk_size_golden():
    # 1 MB on one node of mi300x-8: minSize = 524288/8 = 65536, maxSize = 524288*32 = 16 MiB,
    # minCh = maxCh = 2: divUp(1000000, 2) = 500000 -> alignUp(500000, 65536) = 8*65536 = 524288.
    assert internal.calc_p2p_chunk_size(1_000_000, 2, 2, 65536, 16 << 20) == 524288
    # A zero-byte sync: max(65536, 0) = 65536.
    assert internal.calc_p2p_chunk_size(0, 2, 2, 65536, 16 << 20) == 65536
    # Doubling: 1 MiB, minCh 1, maxCh 8, maxSize 64 KiB: 1 MiB -> 512 KiB (2) -> 256 KiB (4) ->
    # 128 KiB (8); 8 > 8/2 stops; alignUp(131072, 1024) = 131072.
    assert internal.calc_p2p_chunk_size(1 << 20, 1, 8, 1024, 65536) == 131072


def test_p2p_chunk_params():
    # mi300x-8: perPeer 2, 2*8 = 16 <= 64 keeps minCh = 2.
    assert internal.p2p_chunk_params(MI300X_8.to_native()) == {
        "min_channels": 2,
        "max_channels": 2,
        "min_size": 65536,
        "max_size": 16 << 20,
    }
    # mi300x-2x8: 2*16 = 32 <= 64; nNodes > 1: minSize = 131072/2, maxSize = 131072.
    assert internal.p2p_chunk_params(MI300X_2X8.to_native()) == {
        "min_channels": 2,
        "max_channels": 2,
        "min_size": 65536,
        "max_size": 131072,
    }
    # perPeer 4 on 8 p2p channels, 8 ranks: 4*8 = 32 > 8 -> 2; 2*8 = 16 > 8 -> 1.
    t = planner.Topology(nranks=8, p2p_nchannels=8, p2p_nchannels_per_peer=4)
    assert internal.p2p_chunk_params(t.to_native())["min_channels"] == 1


def test_send_1mb_one_node():
    # 1 MB = 250000 float32 from rank 0 to 1: chunk max 524288 (above); pieces 524288 and
    # 1000000 - 524288 = 475712 on channels 32 (chunk 0) and 33 (chunk 1). Both > 16384 ->
    # Simple; element chunkSize for Simple = p2pChunkSize = 524288.
    p = planner.plan([planner.Task("send", 250000, "float32", peer=1)], MI300X_8, rank=0)
    d = p.to_dict()
    es = task_elems(d, 0)
    assert [(e["channel"], e["byte_offset"], e["bytes"]) for e in es] == [
        (32, 0, 524288),
        (33, 524288, 475712),
    ]
    assert [e["offset"] for e in es] == [0, 131072]  # in float32 elements
    assert all(e["proto"] == "simple" and e["chunk_size"] == 524288 for e in es)
    assert all(e["type"] == "send" and e["peer"] == 1 and e["kernel"] == 0 for e in es)
    assert d["tasks"][0]["protocol"] == "simple"
    assert d["tasks"][0]["nchannels"] == 2
    assert d["tasks"][0]["kernel"] == 0
    # threadPerBlock = max(NCCL_MAX_NTHREADS = 256, 3 * 64).
    assert d["kernels"][0]["threads_per_block"] == 256
    # The matching recv on rank 1 lands on the same channels with the same pieces.
    q = planner.plan([planner.Task("recv", 250000, "float32", peer=0)], MI300X_8, rank=1).to_dict()
    assert [(e["channel"], e["byte_offset"], e["bytes"]) for e in task_elems(q, 0)] == [
        (32, 0, 524288),
        (33, 524288, 475712),
    ]


def test_send_1mb_two_nodes():
    # mi300x-2x8, rank 0 -> 8 (other node): minSize 65536, maxSize 131072, minCh = maxCh = 2:
    # size = divUp(1000000, 2) = 500000 > 131072 but 2 channels cannot double (2 > 2/2):
    # alignUp(500000, 65536) = 524288 -> pieces 524288, 475712 on channels 32, 33 (base 1).
    # Element chunkSize = p2pChunkSize = 131072 (no network tuning; see schedule_p2p.cc).
    d = planner.plan([planner.Task("send", 1_000_000, "int8", peer=8)], MI300X_2X8, rank=0)
    es = task_elems(d.to_dict(), 0)
    assert [(e["channel"], e["bytes"], e["chunk_size"]) for e in es] == [
        (32, 524288, 131072),
        (33, 475712, 131072),
    ]


def test_ll_threshold():
    # 16384 bytes: one piece (max(65536, 8192) = 65536 >= 16384), 16384 <= 16384 -> LL;
    # LL element chunkSize = buffSizes[LL] / NCCL_STEPS = 262144 / 8 = 32768.
    d = planner.plan([planner.Task("send", 4096, "float32", peer=1)], MI300X_8, rank=0).to_dict()
    (e,) = task_elems(d, 0)
    assert (e["proto"], e["chunk_size"], e["bytes"]) == ("ll", 32768, 16384)
    assert d["tasks"][0]["protocol"] == "ll"
    # 16388 bytes > 16384 -> Simple.
    d = planner.plan([planner.Task("send", 4097, "float32", peer=1)], MI300X_8, rank=0).to_dict()
    (e,) = task_elems(d, 0)
    assert (e["proto"], e["chunk_size"]) == ("simple", 524288)
    # The threshold is a parameter; with 0, even 16 bytes go Simple.
    d = planner.plan(
        [planner.Task("send", 4, "float32", peer=1)], MI300X_8, rank=0, p2p_ll_threshold=0
    ).to_dict()
    assert task_elems(d, 0)[0]["proto"] == "simple"
    # No LL buffer on the connection -> Simple.
    no_ll = MI300X_8.replace(buff_sizes=(0, 458752, 4194304))
    d = planner.plan([planner.Task("send", 4, "float32", peer=1)], no_ll, rank=0).to_dict()
    assert task_elems(d, 0)[0]["proto"] == "simple"


def test_protocol_is_per_piece():
    # 131172 bytes: divUp(131172, 2) = 65586 -> alignUp(65586, 65536) = 131072: pieces 131072
    # (Simple) and 100 (<= 16384 -> LL). The task reports the first piece's protocol.
    d = planner.plan([planner.Task("send", 131172, "int8", peer=1)], MI300X_8, rank=0).to_dict()
    es = task_elems(d, 0)
    assert [(e["channel"], e["bytes"], e["proto"], e["chunk_size"]) for e in es] == [
        (32, 131072, "simple", 524288),
        (33, 100, "ll", 32768),
    ]
    assert d["tasks"][0]["protocol"] == "simple"


def test_zero_byte_send_is_a_sync():
    # A zero-byte send is one empty element (bytes -1 inside the scheduler, 0 in the element) on
    # the channel of chunk 0; 0 <= 16384 with an LL buffer -> LL.
    d = planner.plan([planner.Task("send", 0, "float32", peer=1)], MI300X_8, rank=0).to_dict()
    (e,) = task_elems(d, 0)
    assert (e["channel"], e["byte_offset"], e["bytes"], e["proto"]) == (32, 0, 0, "ll")
    assert d["tasks"][0]["nchannels"] == 1
    assert d["tasks"][0]["kernel"] == 0


def test_self_send_recv_pairs():
    # Step 0 pairs send-to-self with recv-from-self on channel mirror(0) = 0. The recv starts a
    # new work (slot 0); the send fuses into it (slot 1).
    tasks = [
        planner.Task("send", 250, "float32", peer=0),
        planner.Task("recv", 250, "float32", peer=0),
    ]
    d = planner.plan(tasks, MI300X_8, rank=0).to_dict()
    (ch,) = d["kernels"][0]["channels"]
    assert ch["id"] == 0 and ch["nwork"] == 1
    (w,) = ch["works"]
    assert [(e["type"], e["task"], e["bytes"]) for e in w["elems"]] == [
        ("recv", 1, 1000),
        ("send", 0, 1000),
    ]
    # finishWorkP2p with 2 elements, warp 64: nGroup 2, nWarp 2 (2*2 <= 256/64/2 = 2 fails at 4),
    # warpStart 0 and 2.
    assert [(e["ngroups"], e["nwarps"], e["warp_start"]) for e in w["elems"]] == [
        (2, 2, 0),
        (2, 2, 2),
    ]
    # Two pairs: the second pair is a later pass over the schedule: a new work (fusing restarts).
    tasks = [
        planner.Task("send", 250, "float32", peer=0),
        planner.Task("send", 500, "float32", peer=0),
        planner.Task("recv", 250, "float32", peer=0),
        planner.Task("recv", 500, "float32", peer=0),
    ]
    d = planner.plan(tasks, MI300X_8, rank=0).to_dict()
    (ch,) = d["kernels"][0]["channels"]
    assert [[(e["type"], e["task"]) for e in w["elems"]] for w in ch["works"]] == [
        [("recv", 2), ("send", 0)],
        [("recv", 3), ("send", 1)],
    ]


def test_self_send_without_recv_fails():
    with pytest.raises(ValueError, match="send to self.*without a matching recv"):
        planner.plan([planner.Task("send", 10, "float32", peer=2)], MI300X_8, rank=2)
    with pytest.raises(ValueError, match="recv from self.*without a matching send"):
        planner.plan([planner.Task("recv", 10, "float32", peer=2)], MI300X_8, rank=2)
    # Pairs match in order: two sends to self and one recv leave the second send unmatched.
    tasks = [
        planner.Task("send", 10, "float32", peer=0),
        planner.Task("send", 10, "float32", peer=0),
        planner.Task("recv", 10, "float32", peer=0),
    ]
    with pytest.raises(ValueError, match="send to self"):
        planner.plan(tasks, MI300X_8, rank=0)


def test_all_to_all_fuses_recv_and_send_of_each_step():
    # Rank 0, 8 ranks, 1000 bytes to and from everyone: step s receives from (0 - s) % 8 and sends
    # to s, both with base s -> channel mirror(s, 64). Each such channel holds one work: the recv
    # in slot 0 and the send in slot 1.
    tasks = []
    for r in range(8):
        tasks.append(planner.Task("send", 1000, "int8", peer=r))
        tasks.append(planner.Task("recv", 1000, "int8", peer=r))
    d = planner.plan(tasks, MI300X_8, rank=0).to_dict()
    chans = {c["id"]: c for c in d["kernels"][0]["channels"]}
    assert sorted(chans) == sorted(mirror(s, 64) for s in range(8))
    for s in range(8):
        (w,) = chans[mirror(s, 64)]["works"]
        assert [(e["type"], e["peer"]) for e in w["elems"]] == [("recv", (8 - s) % 8), ("send", s)]


def test_op_count_is_12_bits():
    d = planner.plan(
        [planner.Task("send", 1, "float32", peer=1)], MI300X_8, rank=0, op_count=0x1234
    ).to_dict()
    assert task_elems(d, 0)[0]["op_count"] == 0x234


def test_finish_work_p2p():
    # warp 64: 256/64 = 4 warps. Two slots: nGroup 2, nWarp 2, warpStart 0, 2.
    assert internal.finish_work_p2p(["recv", "send"], 64) == [
        {"ngroups": 2, "warp_start": 0, "nwarps": 2},
        {"ngroups": 2, "warp_start": 2, "nwarps": 2},
    ]
    # One recv: nGroup 1, nWarp 4 (1,2 <= 2; 4 > 2).
    assert internal.finish_work_p2p(["recv", "unused"], 64)[0] == {
        "ngroups": 1,
        "warp_start": 0,
        "nwarps": 4,
    }
    # warp 32: 8 warps. Two slots: nWarp 4 (2*2 <= 4, 4*2 > 4), warpStart 0, 4.
    assert internal.finish_work_p2p(["unused", "send"], 32) == [
        {"ngroups": 2, "warp_start": 0, "nwarps": 4},
        {"ngroups": 2, "warp_start": 4, "nwarps": 4},
    ]


# ---------------------------------------------------------------------------------------------
# Invariants over random task mixes on random topologies.

DTYPES = {"int8": 1, "float16": 2, "float32": 4, "float64": 8}


@st.composite
def topologies(draw):
    nnodes = draw(st.integers(1, 3))
    local = draw(st.integers(1, 4))
    p2p_nch = draw(st.sampled_from([1, 2, 4, 8, 16, 64]))
    per_peer = draw(st.sampled_from([c for c in (1, 2, 4, 8) if c <= p2p_nch]))
    return planner.Topology(
        nranks=nnodes * local,
        nnodes=nnodes,
        arch=draw(st.sampled_from(["gfx942", "gfx90a", "sm90", "cpu"])),
        bw_inter=5.0,
        p2p_nchannels=p2p_nch,
        p2p_nchannels_per_peer=per_peer,
        p2p_chunk_size=draw(st.sampled_from([1024, 8192, 131072, 524288])),
        buff_sizes=(draw(st.sampled_from([0, 262144])), 458752, 4194304),
        work_fifo_depth=256,
    )


@st.composite
def mixes(draw):
    topo = draw(topologies())
    n = topo.nranks
    transfers = draw(
        st.lists(
            st.tuples(
                st.integers(0, n - 1),
                st.integers(0, n - 1),
                st.sampled_from(sorted(DTYPES)),
                st.one_of(
                    st.integers(0, 5000),
                    st.integers(0, 400_000),
                    st.sampled_from([0, 1, 4096, 16384, 131072]),
                ),
            ),
            min_size=1,
            max_size=24,
        )
    )
    persistent = draw(st.booleans())
    threshold = draw(st.sampled_from([0, 16384, 100_000]))
    return topo, transfers, persistent, threshold


def plan_all(topo, transfers, persistent, threshold):
    """Tasks per rank (in transfer order) and each rank's plan dict."""
    per_rank = defaultdict(list)  # rank -> [(Task, transfer index)]
    for i, (src, dst, dtype, count) in enumerate(transfers):
        per_rank[src].append((planner.Task("send", count, dtype, peer=dst), i))
        per_rank[dst].append((planner.Task("recv", count, dtype, peer=src), i))
    plans = {}
    for r, tl in per_rank.items():
        plans[r] = planner.plan(
            [t for t, _ in tl], topo, rank=r, persistent=persistent, p2p_ll_threshold=threshold
        ).to_dict()
    return per_rank, plans


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixes())
def test_p2p_invariants(mix):
    topo, transfers, persistent, threshold = mix
    per_rank, plans = plan_all(topo, transfers, persistent, threshold)

    # Each task's pieces, keyed by (rank, task index in that rank's group).
    pieces = {}
    for r, d in plans.items():
        elems = p2p_elems(d)
        for ti, (task, _) in enumerate(per_rank[r]):
            es = sorted((e for e in elems if e["task"] == ti), key=lambda e: e["byte_offset"])
            nbytes = task.count * DTYPES[task.dtype]
            # Coverage: consecutive pieces from 0 covering the bytes exactly once; a zero-byte
            # task is one empty piece (a sync).
            assert es, f"rank {r} task {ti} has no elements"
            if nbytes == 0:
                assert [(e["byte_offset"], e["bytes"]) for e in es] == [(0, 0)]
            else:
                off = 0
                for e in es:
                    assert e["byte_offset"] == off and e["bytes"] > 0
                    off += e["bytes"]
                assert off == nbytes
            for e in es:
                assert e["type"] == task.coll and e["peer"] == task.peer
                assert e["proto"] in ("ll", "simple")
            # Kernels follow the byte order; the task reports its first kernel and protocol.
            ks = [e["kernel"] for e in es]
            assert ks == sorted(ks)
            t = d["tasks"][ti]
            assert t["kernel"] == ks[0]
            assert t["protocol"] == es[0]["proto"]
            assert t["nchannels"] == len({e["channel"] for e in es})
            pieces[(r, ti)] = es
        if persistent:
            assert len(d["kernels"]) == 1

        # Works: at most NCCL_MAX_WORK_ELEMENTS_P2P elements, recv in the even slot and send in
        # the odd one, never two elements of one type for the same peer.
        for k in d["kernels"]:
            for ch in k["channels"]:
                for w in ch["works"]:
                    es = [e for e in w["elems"] if e["type"] in ("send", "recv")]
                    if not es:
                        continue
                    assert len(es) <= MAX_WORK_ELEMENTS_P2P
                    if len(es) == 2:
                        assert [e["type"] for e in es] == ["recv", "send"]
                    for typ in ("send", "recv"):
                        peers = [e["peer"] for e in es if e["type"] == typ]
                        assert len(peers) == len(set(peers))

    # Pairing: the send of transfer i on its source and the recv on its destination are cut into
    # the same pieces, on the same channels, with the same protocol and element chunk size.
    index = {}
    for r, tl in per_rank.items():
        for ti, (task, i) in enumerate(tl):
            index[(i, task.coll)] = (r, ti)
    for i in range(len(transfers)):
        s = pieces[index[(i, "send")]]
        rv = pieces[index[(i, "recv")]]
        assert [piece_key(e) for e in s] == [piece_key(e) for e in rv], (
            f"transfer {i}: {transfers[i]}"
        )


def piece_key(e: dict) -> tuple:
    return (e["byte_offset"], e["bytes"], e["channel"], e["proto"], e["chunk_size"])


def test_fifo_budget_splits_kernels():
    # A FIFO launch's budget is work_fifo_depth / 2 = 128 works. 200 sends of 1000 bytes each to
    # rank 1 on one p2p channel, one channel per peer: every send is its own work (two elements
    # for one peer never share a work), so they need 2 kernels: 128 + 72.
    topo = planner.Topology(
        nranks=2, p2p_nchannels=1, p2p_nchannels_per_peer=1, work_fifo_depth=256
    )
    tasks = [planner.Task("send", 1000, "int8", peer=1) for _ in range(200)]
    d = planner.plan(tasks, topo, rank=0, persistent=False).to_dict()
    assert [k["nwork"] for k in d["kernels"]] == [128, 72]
    assert [t["kernel"] for t in d["tasks"]] == [0] * 128 + [1] * 72
    assert np.all(np.diff([t["kernel"] for t in d["tasks"]]) >= 0)
