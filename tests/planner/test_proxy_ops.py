"""Proxy ops: what a network proxy moves for each channel whose connections cross nodes (after
RCCL enqueue.cc initCollProxyOp, addProxyOpIfNeeded, the p2p proxy op of addP2pToPlan and
uploadProxyOps; proxy.cc ncclProxyComputeP2p and NeedProxy). Golden numbers worked out by hand
from those formulas; the arithmetic is in the comments.

Connections: the ring in rank order (prev = r - 1, next = r + 1), the tree as one chain in rank
order (up = r - 1, down = r + 1), ranks node-major (node = r // local_ranks)."""

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jax_rccl import planner
from jax_rccl.planner import Task, Topology


def _gfx942_xgmi(nranks, nnodes, **kw):
    """`nnodes` nodes of gfx942 GPUs over XGMI, 12 GB/s a channel within and between nodes."""
    return Topology(
        nranks=nranks, nnodes=nnodes, arch="gfx942", link="xgmi", bw_intra=12.0, bw_inter=12.0, **kw
    )


# Two nodes of 4 gfx942 GPUs (warp 64: Simple alignment 64 * 8 * 16 = 8192 bytes), 4 channels,
# 8 p2p channels of which 2 per peer; RCCL's buffer sizes (Simple step 4 MiB / 8 = 512 KiB).
TWO_BY_FOUR = _gfx942_xgmi(8, 2, nchannels=4, p2p_nchannels=8, p2p_nchannels_per_peer=2)
MIB = 1 << 20


def ops_of(tasks, topo, rank, **kw):
    return planner.plan(tasks, topo, rank, **kw).proxy_ops


def brief(ops):
    """(channel, task, recv peers, send peers, nsteps, op_count) per op, in upload order."""
    return [
        (o["channel"], o["task"], o["recv_peers"], o["send_peers"], o["nsteps"], o["op_count"])
        for o in ops
    ]


# ---- collectives: golden values ----


def test_ring_all_reduce_two_nodes():
    # all_reduce of 4 MiB float32 (1 << 20 elements), Ring/Simple, 4 channels.
    # getChannnelThreadInfo: 4 MiB >= 4 * 256 * 64 -> 4 channels of 256 threads.
    # maxBytesPerChannel = 4 MiB / 4 = 1 MiB -> 262144 elements per channel (a multiple of the
    #   alignment 8192 / 4 = 2048).
    # chunk: step 512 KiB x chunkSteps 4 = 2 MiB -> chunkCount 524288; sliceSteps 2.
    # computeCollSteps: divUp(262144, 8 * 524288) = 1 loop x (8 - 1) x 2 x 4 steps = 56.
    # initCollProxyOp: nbytes = stepSize x sliceSteps = 1 MiB; opCount = 0 << 1 | 0 = 0.
    # The ring crosses nodes at 3 -> 4 and 7 -> 0: rank 3 sends to 4, rank 4 receives from 3,
    # rank 7 sends to 0, rank 0 receives from 7; ranks 1, 2, 5, 6 have no op.
    task = [Task("all_reduce", 1 << 20, "float32")]
    kw = dict(algorithm="Ring", protocol="Simple")
    ops = ops_of(task, TWO_BY_FOUR, 3, **kw)
    assert brief(ops) == [(c, 0, [], [4], 56, 0) for c in range(4)]
    op = ops[0]
    assert (op["coll"], op["pattern"], op["protocol"], op["dtype"]) == (
        "all_reduce",
        "ring_twice",
        "simple",
        "float32",
    )
    assert (op["chunk_size"], op["chunk_steps"], op["slice_steps"], op["nbytes"]) == (
        2 * MIB,
        4,
        2,
        MIB,
    )
    assert (op["red_op"], op["root"], op["peer"], op["conn_index"], op["kernel"]) == (
        "sum",
        0,
        None,
        0,
        0,
    )
    assert brief(ops_of(task, TWO_BY_FOUR, 4, **kw)) == [(c, 0, [3], [], 56, 0) for c in range(4)]
    assert brief(ops_of(task, TWO_BY_FOUR, 7, **kw)) == [(c, 0, [], [0], 56, 0) for c in range(4)]
    assert brief(ops_of(task, TWO_BY_FOUR, 0, **kw)) == [(c, 0, [7], [], 56, 0) for c in range(4)]
    for rank in (1, 2, 5, 6):
        assert ops_of(task, TWO_BY_FOUR, rank, **kw) == []


def test_two_collectives_number_their_ops_and_upload_in_order():
    # all_reduce 4 MiB and 2 MiB float32 (tasks 0 and 1) are costed together: 6 MiB over 4
    # channels -> maxBytesPerChannel 1.5 MiB = 393216 elements. Task 0 (1 << 20 elements) takes
    # channels 0, 1 (393216 each) and 2 (262144); task 1 (1 << 19) the rest of channel 2
    # (131072) and channel 3 (393216). Every part is under one loop (8 x 524288): 56 steps.
    # opCounts: task 0 is collective 0 of the plan (0), task 1 collective 1 (1 << 1 = 2). Upload:
    # by opCount, then channel: (ch0, 0) (ch1, 0) (ch2, 0) (ch2, 2) (ch3, 2).
    tasks = [Task("all_reduce", 1 << 20, "float32"), Task("all_reduce", 1 << 19, "float32")]
    p = planner.plan(tasks, TWO_BY_FOUR, 3, algorithm="Ring", protocol="Simple")
    assert brief(p.proxy_ops) == [
        (0, 0, [], [4], 56, 0),
        (1, 0, [], [4], 56, 0),
        (2, 0, [], [4], 56, 0),
        (2, 1, [], [4], 56, 2),
        (3, 1, [], [4], 56, 2),
    ]
    # uploadProxyOps: a collective's opCount moves past the communicator's collOpCount (5):
    # (5 << 1) + 0 = 10 and (5 << 1) + 2 = 12; the counter then grows by the plan's 2 collectives.
    up = p.upload_proxy_ops(0, coll_op_count=5)
    assert [o["op_count"] for o in up["ops"]] == [10, 10, 10, 12, 12]
    assert up["coll_op_count"] == 7
    assert set(up["p2p_op_counts"]) == {0}
    # The plan keeps its relative numbers (a persistent plan uploads again at every launch).
    assert [o["op_count"] for o in p.proxy_ops] == [0, 0, 0, 2, 2]


def test_tree_all_reduce_two_nodes():
    # all_reduce of 4 MiB float32, Tree/Simple, 4 channels of 1 MiB (262144 elements).
    # Tree/Simple chunk: step 512 KiB, one step a chunk; treeDepth = 8/2 - 1 + log2(2) = 4;
    #   nBytes / (4 x chunk) = 2 < 32 -> 256 KiB (4) -> 128 KiB (8); < 16 -> 64 KiB (16):
    #   chunkCount 16384. computeCollSteps: divUp(262144, 16384) x 1 = 16.
    # nbytes = stepSize x sliceSteps = 512 KiB.
    # The chain crosses nodes between 3 and 4: rank 3 receives from its child 4 (going up) and
    # sends to it (going down); rank 4 sends to its parent 3 and receives from it. Ranks 0 (the
    # root, child 1) and 7 (no child, parent 6) have no op.
    task = [Task("all_reduce", 1 << 20, "float32")]
    kw = dict(algorithm="Tree", protocol="Simple")
    ops = ops_of(task, TWO_BY_FOUR, 3, **kw)
    assert brief(ops) == [(c, 0, [4], [4], 16, 0) for c in range(4)]
    assert (ops[0]["pattern"], ops[0]["chunk_size"], ops[0]["nbytes"]) == (
        "tree_up_down",
        65536,
        524288,
    )
    assert (ops[0]["chunk_steps"], ops[0]["slice_steps"]) == (1, 1)
    assert brief(ops_of(task, TWO_BY_FOUR, 4, **kw)) == [(c, 0, [3], [3], 16, 0) for c in range(4)]
    for rank in (0, 1, 2, 5, 6, 7):
        assert ops_of(task, TWO_BY_FOUR, rank, **kw) == []


def test_one_rank_per_node_uses_both_neighbours():
    # 4 nodes of one rank: every connection crosses nodes. Rank 1's ring: recv from 0, send to 2;
    # its chain: children [2], parent 0 -> receives from 2 then 0 (up, then down), sends to 0
    # then 2 (ncclProxySaveOp's order).
    topo = Topology(nranks=4, nnodes=4, arch="sm90", link="nvlink", bw_intra=20, bw_inter=12)
    task = [Task("all_reduce", 1 << 20, "float32")]
    ring = ops_of(task, topo, 1, algorithm="Ring", protocol="Simple")
    assert {(tuple(o["recv_peers"]), tuple(o["send_peers"])) for o in ring} == {((0,), (2,))}
    tree = ops_of(task, topo, 1, algorithm="Tree", protocol="Simple")
    assert {(tuple(o["recv_peers"]), tuple(o["send_peers"])) for o in tree} == {((2, 0), (0, 2))}


def test_all_gather_and_reduce_scatter_ring():
    # all_gather of 1 MiB float32 per rank: planned as 1 MiB of int8 (costed on 8 MiB: 4
    # channels); maxBytesPerChannel 256 KiB -> 262144 bytes per channel; chunk 2 MiB of int8.
    # computeCollSteps: divUp(262144, 2097152) x (8 - 1) x 4 = 28; nbytes 512 KiB x 2 = 1 MiB.
    kw = dict(algorithm="Ring", protocol="Simple")
    ag = ops_of([Task("all_gather", 1 << 18, "float32")], TWO_BY_FOUR, 3, **kw)
    assert brief(ag) == [(c, 0, [], [4], 28, 0) for c in range(4)]
    assert (ag[0]["pattern"], ag[0]["dtype"], ag[0]["chunk_size"], ag[0]["nbytes"]) == (
        "ring",
        "int8",
        2 * MIB,
        MIB,
    )
    # reduce_scatter of 1 MiB float32 per rank: 256 KiB = 65536 elements per channel, chunk
    # 524288 elements: divUp(65536, 524288) x 7 x 4 = 28.
    rs = ops_of([Task("reduce_scatter", 1 << 18, "float32", op="max")], TWO_BY_FOUR, 4, **kw)
    assert brief(rs) == [(c, 0, [3], [], 28, 0) for c in range(4)]
    assert (rs[0]["dtype"], rs[0]["red_op"]) == ("float32", "max")


def test_avg_is_a_sum_for_the_network():
    # initCollProxyOp: PreMulSum (a float average) and SumPostDiv (an integer one) go as sum.
    kw = dict(algorithm="Ring", protocol="Simple")
    for dtype in ("float32", "int32"):
        ops = ops_of([Task("all_reduce", 1 << 20, dtype, op="avg")], TWO_BY_FOUR, 3, **kw)
        assert {o["red_op"] for o in ops} == {"sum"}
    ops = ops_of([Task("all_reduce", 1 << 20, "float32", op="prod")], TWO_BY_FOUR, 3, **kw)
    assert {o["red_op"] for o in ops} == {"prod"}


def test_broadcast_and_reduce_pipelines():
    # broadcast of 1 MiB (int8), 4 channels of 256 KiB. Ring/Simple pipeline: one step a chunk
    # (512 KiB), halved while nBytes / (4 x chunk) is small and the chunk above each floor:
    # 0 < 64 -> 256 KiB; 1 < 32 -> 128 KiB; 2 < 16 -> 64 KiB; 4 < 8 -> 32 KiB (the last floor).
    # computeCollSteps: divUp(262144, 32768) x 1 = 8; nbytes = 512 KiB x 1.
    kw = dict(algorithm="Ring", protocol="Simple")
    bc = [Task("broadcast", 1 << 18, "float32", root=0)]
    ops = ops_of(bc, TWO_BY_FOUR, 3, **kw)
    assert brief(ops) == [(c, 0, [], [4], 8, 0) for c in range(4)]
    assert (ops[0]["pattern"], ops[0]["root"], ops[0]["chunk_size"], ops[0]["nbytes"]) == (
        "pipeline_from",
        0,
        32768,
        524288,
    )
    assert brief(ops_of(bc, TWO_BY_FOUR, 4, **kw)) == [(c, 0, [3], [], 8, 0) for c in range(4)]
    # NeedProxy: rank 7's next is the root (nothing to send) and the root receives nothing.
    assert ops_of(bc, TWO_BY_FOUR, 7, **kw) == []
    assert ops_of(bc, TWO_BY_FOUR, 0, **kw) == []
    # Root 4: 3 -> 4 carries nothing (4 is the root, 3's next); 7 -> 0 does.
    bc4 = [Task("broadcast", 1 << 18, "float32", root=4)]
    assert ops_of(bc4, TWO_BY_FOUR, 3, **kw) == []
    assert ops_of(bc4, TWO_BY_FOUR, 4, **kw) == []
    assert brief(ops_of(bc4, TWO_BY_FOUR, 7, **kw)) == [(c, 0, [], [0], 8, 0) for c in range(4)]
    assert brief(ops_of(bc4, TWO_BY_FOUR, 0, **kw)) == [(c, 0, [7], [], 8, 0) for c in range(4)]
    # reduce to root 3: the root sends nothing (3 -> 4 idle) and 4 receives nothing from the
    # root; 7 -> 0 carries the partial sums. Same chunking as broadcast (float32: 8192 elements).
    rd = [Task("reduce", 1 << 18, "float32", root=3)]
    assert ops_of(rd, TWO_BY_FOUR, 3, **kw) == []
    assert ops_of(rd, TWO_BY_FOUR, 4, **kw) == []
    ops = ops_of(rd, TWO_BY_FOUR, 7, **kw)
    assert brief(ops) == [(c, 0, [], [0], 8, 0) for c in range(4)]
    assert (ops[0]["pattern"], ops[0]["root"], ops[0]["dtype"]) == ("pipeline_to", 3, "float32")
    assert brief(ops_of(rd, TWO_BY_FOUR, 0, **kw)) == [(c, 0, [7], [], 8, 0) for c in range(4)]


COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"]


@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("preset", ["mi300x-8", "h100-8", "cpu-8", "mi250x-16"])
def test_single_node_has_no_proxy_ops(coll, preset):
    topo = Topology.preset(preset)
    for rank in (0, topo.nranks - 1):
        for algorithm in ("Ring", "Tree", None):
            p = planner.plan([Task(coll, 1 << 20, "float32")], topo, rank, algorithm=algorithm)
            assert p.proxy_ops == []


# ---- point-to-point ----


def test_p2p_across_nodes():
    # send 1 MiB from 0 to 4. Pieces: stepSize = p2p_chunk_size 512 KiB; 2 nodes: min 256 KiB,
    # max 512 KiB; nChannelsMin: 2 per peer x 8 ranks > 8 p2p channels -> 1.
    # calcP2pChunkSize(1 MiB, 1, 2, 256 KiB, 512 KiB): 1 MiB > max -> 2 channels, 512 KiB.
    # Channels: base = node delta 1 + step 0 = 1 -> mirrorBits(1, 8) = 4, pieces on 4 and 5.
    # ncclProxyComputeP2p: Simple, chunk 512 KiB: nsteps = divUp(512 KiB, 512 KiB) = 1,
    # nbytes = min(512 KiB, chunk); opCount = nWork (1) << 1 | 1 = 3.
    ops = ops_of([Task("send", 1 << 18, "float32", peer=4)], TWO_BY_FOUR, 0)
    assert brief(ops) == [(4, 0, [], [4], 1, 3), (5, 0, [], [4], 1, 3)]
    o = ops[0]
    assert (o["coll"], o["pattern"], o["protocol"], o["dtype"], o["peer"], o["root"]) == (
        "send",
        "p2p",
        "simple",
        "int8",
        4,
        4,
    )
    assert (o["chunk_size"], o["nbytes"], o["chunk_steps"], o["slice_steps"]) == (
        524288,
        524288,
        1,
        1,
    )
    assert o["conn_index"] == 1
    # The receiver sees the same channels from its side: step 0, node delta 1.
    ops = ops_of([Task("recv", 1 << 18, "float32", peer=0)], TWO_BY_FOUR, 4)
    assert brief(ops) == [(4, 0, [0], [], 1, 3), (5, 0, [0], [], 1, 3)]


def test_p2p_ll_steps_and_syncs():
    # 100000 bytes as LL (threshold raised): chunk = 256 KiB / 8 = 32768 bytes, of which half is
    # data: nsteps = divUp(100000, 16384) = 7; nbytes = 2 x 100000 = 200000 (whole 16-byte
    # lines), capped at the chunk: 32768. One piece (under the 256 KiB minimum).
    ops = ops_of([Task("send", 100000, "int8", peer=5)], TWO_BY_FOUR, 1, p2p_ll_threshold=1 << 20)
    assert len(ops) == 1
    o = ops[0]
    assert (o["protocol"], o["chunk_size"], o["nsteps"], o["nbytes"]) == ("ll", 32768, 7, 32768)
    # 1000 bytes: nbytes = 2000 under the chunk; one step.
    (o,) = ops_of([Task("send", 1000, "int8", peer=5)], TWO_BY_FOUR, 1)
    assert (o["protocol"], o["nsteps"], o["nbytes"]) == ("ll", 1, 2000)
    # A zero-byte send is a sync: one step, no bytes.
    (o,) = ops_of([Task("send", 0, "float32", peer=5)], TWO_BY_FOUR, 1)
    assert (o["nsteps"], o["nbytes"], o["send_peers"]) == (1, 0, [5])


def test_p2p_within_a_node_or_to_self_has_none():
    same_node = [Task("send", 1 << 18, "float32", peer=1), Task("recv", 1 << 18, "float32", peer=2)]
    assert ops_of(same_node, TWO_BY_FOUR, 0) == []
    to_self = [Task("send", 1024, "float32", peer=0), Task("recv", 1024, "float32", peer=0)]
    assert ops_of(to_self, TWO_BY_FOUR, 0) == []
    p = planner.plan(same_node, TWO_BY_FOUR, 0)
    assert "no proxy ops: every peer on this node" in p.explain()


def test_p2p_fused_recv_and_send_share_an_op_count():
    # Rank 0 receives from and sends to 4 in the same schedule step: each piece's recv and send
    # land in one work of channel 4 (then 5), so both ops carry opCount 1 << 1 | 1 = 3. Upload:
    # equal keys go lowest channel first, each channel's queue in order.
    tasks = [Task("recv", 1 << 18, "float32", peer=4), Task("send", 1 << 18, "float32", peer=4)]
    p = planner.plan(tasks, TWO_BY_FOUR, 0)
    assert brief(p.proxy_ops) == [
        (4, 0, [4], [], 1, 3),
        (4, 1, [], [4], 1, 3),
        (5, 0, [4], [], 1, 3),
        (5, 1, [], [4], 1, 3),
    ]
    # uploadProxyOps: a p2p op moves past its channel's p2pOpCount ((2 << 1) + 3 = 7 on channel
    # 4, (0 << 1) + 3 on 5); each channel's counter then grows by its last op's (3 >> 1) + 1 = 2.
    counts = [0] * 8
    counts[4] = 2
    up = p.upload_proxy_ops(0, coll_op_count=9, p2p_op_counts=counts)
    assert [o["op_count"] for o in up["ops"]] == [7, 7, 3, 3]
    assert up["coll_op_count"] == 9
    assert up["p2p_op_counts"][4:6] == [4, 2]
    assert sum(up["p2p_op_counts"]) == 6


def test_collectives_upload_before_p2p_of_the_same_kernel():
    # A group of an all_reduce and a send: one kernel, the collective first. Channel 0 holds the
    # all_reduce's work, so a p2p piece there would be numbered from nWork 2; whatever the
    # channels, every collective op (tag bit 0) is handed over before every p2p op.
    tasks = [Task("all_reduce", 1 << 20, "float32"), Task("send", 1 << 18, "float32", peer=4)]
    p = planner.plan(tasks, TWO_BY_FOUR, 3, algorithm="Ring", protocol="Simple")
    assert len(p.kernels) == 1
    kinds = [o["coll"] for o in p.proxy_ops]
    assert kinds == ["all_reduce"] * 4 + ["send"] * 2
    # Rank 3 sends to 4: step 1 of node delta 1 -> base 1 + 1 = 2 -> mirrorBits(2, 8) = 2:
    # channels 2 and 3, each already holding one all_reduce work: opCount 2 << 1 | 1 = 5.
    assert [(o["channel"], o["op_count"]) for o in p.proxy_ops[4:]] == [(2, 5), (3, 5)]


def test_explain_shows_proxy_ops():
    task = [Task("all_reduce", 1 << 20, "float32")]
    text = planner.explain(task, TWO_BY_FOUR, 3, algorithm="Ring", protocol="Simple")
    assert "proxy ops (steps a network proxy moves for this rank): 4 op(s) on 4 channel(s)" in text
    # Channels whose ops read the same share a line.
    line = "kernel 0 channels 0-3: [0] send->4: 56 step(s) (4/chunk, 2/slice), simple, opCount 0"
    assert line in text
    assert "no proxy ops" not in text
    text = planner.explain(task, TWO_BY_FOUR, 1, algorithm="Ring", protocol="Simple")
    assert "no proxy ops: every peer on this node" in text
    # A p2p op next to a collective's on its channels: rank 3's send to 4 lands on channels 2, 3.
    tasks = task + [Task("send", 1 << 18, "float32", peer=4)]
    text = planner.explain(tasks, TWO_BY_FOUR, 3, algorithm="Ring", protocol="Simple")
    assert "kernel 0 channels 0-1: [0] send->4: 56 step(s)" in text
    line = "kernel 0 channels 2-3: [0] send->4: 56 step(s) (4/chunk, 2/slice), simple, opCount 0;"
    assert line in text
    assert "; [1] send->4: 1 step(s) (1/chunk, 1/slice), simple, opCount 5" in text
    # Many differing channels: a bounded number of lines.
    tasks = [Task("all_reduce", 1000 * (i + 1) * (i + 7), "float32") for i in range(20)]
    text = planner.explain(tasks, "mi300x-2x8", 7, algorithm="Ring", protocol="Simple")
    proxy = text[text.index("proxy ops") :].splitlines()
    assert len(proxy) == 1 + 7 + 1
    assert proxy[-1].endswith("more channel(s)")


# ---- invariants ----


def _node(topo, r):
    return r // topo.local_ranks


def _network_steps(topo, tasks_of_rank, **kw):
    """Per (channel, sender, receiver): network steps counted by the sender and by the
    receiver; every op's peers are on another node."""
    sent, received = Counter(), Counter()
    for r in range(topo.nranks):
        p = planner.plan(tasks_of_rank(r), topo, r, **kw)
        for k in range(len(p.kernels)):
            uploaded = [o for o in p.proxy_ops if o["kernel"] == k]
            keys = [(o["op_count"] & 1, o["op_count"] >> 1, o["channel"]) for o in uploaded]
            assert keys == sorted(keys), "upload order is by opCount (collectives first)"
            for c in {o["channel"] for o in uploaded}:
                chan = [o for o in uploaded if o["channel"] == c]
                ids = [(o["op_count"] & 1, o["op_count"] >> 1) for o in chan]
                assert ids == sorted(ids), f"rank {r} channel {c}: opCounts go backwards"
        for o in p.proxy_ops:
            assert o["recv_peers"] or o["send_peers"]
            for q in o["send_peers"]:
                assert _node(topo, q) != _node(topo, r)
                sent[(o["kernel"], o["channel"], r, q)] += o["nsteps"]
            for q in o["recv_peers"]:
                assert _node(topo, q) != _node(topo, r)
                received[(o["kernel"], o["channel"], q, r)] += o["nsteps"]
        if topo.nnodes == 1:
            assert p.proxy_ops == []
    return sent, received


SHAPES = [(2, 4), (4, 2), (4, 1), (2, 1), (3, 2), (1, 8)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.sampled_from(SHAPES),
    coll=st.sampled_from(COLLS),
    algo_proto=st.sampled_from(
        [("Ring", "Simple"), ("Ring", "LL"), ("Ring", "LL128"), ("Tree", "Simple"), ("Tree", "LL")]
    ),
    count=st.sampled_from([1, 1000, 1 << 16, 3 << 18, 1 << 22]),
    nchannels=st.sampled_from([1, 2, 4, 7]),
    root=st.integers(0, 7),
)
def test_collective_send_and_recv_steps_match(shape, coll, algo_proto, count, nchannels, root):
    nnodes, local = shape
    topo = Topology(
        nranks=nnodes * local,
        nnodes=nnodes,
        arch="sm90",
        link="nvlink",
        bw_intra=20.0,
        bw_inter=12.0,
        nchannels=nchannels,
        ll128=True,
    )
    algo, proto = algo_proto
    if algo == "Tree" and coll != "all_reduce":
        algo = "Ring"
    task = Task(coll, count, "float32", root=root % topo.nranks)
    sent, received = _network_steps(topo, lambda r: [task], algorithm=algo, protocol=proto)
    assert sent == received
    if nnodes > 1 and coll in ("all_reduce", "all_gather", "reduce_scatter"):
        assert sent, "a ring across nodes always crosses them"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.sampled_from(SHAPES),
    shifts=st.lists(st.integers(0, 7), min_size=1, max_size=3),
    nbytes=st.sampled_from([0, 100, 20000, 300000, 1 << 21]),
    per_peer=st.sampled_from([1, 2, 4]),
)
def test_p2p_send_and_recv_steps_match(shape, shifts, nbytes, per_peer):
    nnodes, local = shape
    n = nnodes * local
    topo = _gfx942_xgmi(n, nnodes, p2p_nchannels=8, p2p_nchannels_per_peer=per_peer)

    def tasks(r):
        out = []
        for s in shifts:
            out.append(Task("send", nbytes, "int8", peer=(r + s) % n))
            out.append(Task("recv", nbytes, "int8", peer=(r - s) % n))
        return out

    sent, received = _network_steps(topo, tasks)
    assert sent == received
    crossing = any(_node(topo, r) != _node(topo, (r + s) % n) for r in range(n) for s in shifts)
    assert bool(sent) == crossing
