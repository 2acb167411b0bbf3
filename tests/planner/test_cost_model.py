"""Golden numbers of the cost model (ffi/planner/cost_model.cc) and properties of AlgoTime.

Expected values are worked out by hand from RCCL rocm-6.2.0 src/graph/tuning.cc (AMD archs) and
NVIDIA NCCL v2.19.3 src/graph/tuning.cc (NVIDIA archs); the arithmetic is in the comments.
"""

import math

import pytest
from jax_rccl._jax_rccl import internal

from planner.topologies import H100, MI300X

REL = 1e-5

# Two nodes of MI300X.
MI300X_2X8 = dict(MI300X, nRanks=16, nNodes=2, bwInter=12.5)
# The CPU executor: 4 processes over shared memory.
CPU = dict(nRanks=4, nNodes=1, arch="cpu", intraLink="shm", bwIntra=5.0, nChannels=2)

COLLS = ["broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce"]
ALGOS = ["tree", "ring", "direct"]
PROTOS = ["ll", "ll128", "simple"]


def cell(model, coll, algo, proto):
    return model["latency_us"][coll][algo][proto], model["bandwidth_gbs"][coll][algo][proto]


def check(model, coll, algo, proto, lat, bw):
    got_lat, got_bw = cell(model, coll, algo, proto)
    assert got_bw == pytest.approx(bw, rel=REL), (coll, algo, proto)
    if bw:
        assert got_lat == pytest.approx(lat, rel=REL), (coll, algo, proto)


# ---------------------------------------------------------------------------------------------
# MI300X (AMD path)


def test_mi300x_all_reduce():
    m = internal.cost_model(MI300X)
    # busBw = nChannels * bwIntra = 16 * 20 = 320; times bwRatio[<=2 nodes] of tuning_model_5.
    # Ring: algorithm bw = busBw * nRanks / nsteps, nsteps = 2*(8-1) = 14.
    # Latency: baseLat + nsteps * hwLat[NVLINK (xgmi)][ring][p] (one node: no inter steps).
    # ring/ll:     320 * 0.41 * 8/14 = 74.971428;  12 + 14 * 0.8 = 23.2
    check(m, "all_reduce", "ring", "ll", 23.2, 320 * 0.41 * 8 / 14)
    # ring/simple: 320 * 1.0 * 8/14 = 182.857142; 17 + 14 * 3.6 = 67.4
    check(m, "all_reduce", "ring", "simple", 67.4, 320 * 8 / 14)
    # Tree: bw * 0.5; latency baseLat + 2 * ((ranks per node - 1) * intraLat + log2(nodes) * net)
    # tree/ll:     320 * 0.41 * 0.5 = 65.6;      12 + 2 * (7 * 0.8 + 0) = 23.2
    check(m, "all_reduce", "tree", "ll", 23.2, 65.6)
    # tree/simple: RCCL skips Tree/Simple on a single gfx94x node -> nothing.
    check(m, "all_reduce", "tree", "simple", 0, 0)
    # LL128: off on this topology (and tuning_model_5's LL128 ratio is 0 anyway).
    check(m, "all_reduce", "ring", "ll128", 0, 0)
    check(m, "all_reduce", "tree", "ll128", 0, 0)


def test_mi300x_other_collectives():
    m = internal.cost_model(MI300X)
    # broadcast/reduce: nsteps = nRanks = 8, ratio 8/8 = 1; one hop of latency (sameChannels).
    # ring/ll: 320 * 0.41 * 1.65 (gfx94 single-node LL boost) = 216.48; 12 + 0.8 = 12.8
    # ring/simple: 320; 17 + 3.6 = 20.6
    for coll in ("broadcast", "reduce"):
        check(m, coll, "ring", "ll", 12.8, 320 * 0.41 * 1.65)
        check(m, coll, "ring", "simple", 20.6, 320.0)
    # all_gather/reduce_scatter: nsteps = 7, ratio 8/7.
    # ring/ll: 131.2 * 8/7 = 149.942857; 12 + 7 * 0.8 = 17.6
    # ring/simple: 320 * 8/7 = 365.714285; 17 + 7 * 3.6 = 42.2
    for coll in ("all_gather", "reduce_scatter"):
        check(m, coll, "ring", "ll", 17.6, 131.2 * 8 / 7)
        check(m, coll, "ring", "simple", 42.2, 320 * 8 / 7)
    # Tree exists only for all_reduce.
    for coll in COLLS[:4]:
        for p in PROTOS:
            assert m["bandwidth_gbs"][coll]["tree"][p] == 0


def test_mi300x_threads_and_thresholds():
    m = internal.cost_model(MI300X)
    # RCCL: every protocol capped at NCCL_MAX_NTHREADS = 256.
    for a in ALGOS:
        for p in PROTOS:
            assert m["max_threads"][a][p] == 256
    # comm.h: LL 8, LL128 8, Simple 64 bytes per thread; Ring/LL times nRanks (8 * 8 = 64).
    assert m["thread_thresholds"]["tree"] == {"ll": 8, "ll128": 8, "simple": 64}
    assert m["thread_thresholds"]["ring"] == {"ll": 64, "ll128": 8, "simple": 64}
    assert m["thread_thresholds"]["direct"] == m["thread_thresholds"]["ring"]  # Ring's logic
    # tree depth = ranks per node - 1 + log2(nodes) = 7 + 0
    assert m["tree_depth"] == 7


def test_mi300x_two_nodes():
    m = internal.cost_model(MI300X_2X8)
    # 2 nodes: bw = bwIntra (nNodes <= 2), busBw = 320, bwRatio[0]; no gfx94 single-node rules.
    # all_reduce: nsteps = 30, nInterSteps = 2 * nNodes = 4, ratio 16/30.
    # Inter-node rings pay the AMD-host net overhead 2.0 us per step (x3 for Simple):
    # ring/simple: intraLat = max(3.6, 6) = 6; 17 + 26*6 + 4*19.8 = 252.2; 320 * 16/30
    check(m, "all_reduce", "ring", "simple", 252.2, 320 * 16 / 30)
    # ring/ll: intraLat = max(0.8, 2) = 2; 12 + 26*2 + 4*9.5 = 102; 320 * 0.41 * 16/30
    check(m, "all_reduce", "ring", "ll", 102.0, 320 * 0.41 * 16 / 30)
    # tree/ll: 12 + 2*(7*0.8 + 1*12.5) = 48.2; 320 * 0.41 * 0.5 = 65.6
    check(m, "all_reduce", "tree", "ll", 48.2, 65.6)
    # tree/simple exists across nodes: 17 + 2*(7*2.5 + 22.4) = 96.8; 320 * 1.0 * 0.5 = 160
    check(m, "all_reduce", "tree", "simple", 96.8, 160.0)
    # broadcast: one hop on the NET row: ring/ll 12 + 9.5 = 21.5, no LL boost: 131.2
    check(m, "broadcast", "ring", "ll", 21.5, 131.2)
    # tree depth = 7 + log2(2) = 8; Ring/LL threshold 8 * 16 = 128
    assert m["tree_depth"] == 8
    assert m["thread_thresholds"]["ring"]["ll"] == 128


# ---------------------------------------------------------------------------------------------
# H100 (NVIDIA path)


def test_h100_all_reduce():
    m = internal.cost_model(H100)
    # busBw = 320. Hopper caps, one node: llMaxBw 87.7, perChMaxTreeBw 38.7,
    # perChMaxRingLL128Bw 36.7, perChMaxTreeLL128Bw 36.7. ppn = 8. nsteps 14, ratio 8/14.
    # ring/ll: min(87.7, 320/4) = 80 -> 80 * 8/14 = 45.714285;    6.6 + 14*0.6 = 15.0
    check(m, "all_reduce", "ring", "ll", 15.0, 80 * 8 / 14)
    # ring/ll128: min(320*0.92, 16*36.7) = 294.4 -> *8/14 = 168.228571; 14 + 14*1.9 = 40.6
    check(m, "all_reduce", "ring", "ll128", 40.6, 294.4 * 8 / 14)
    # ring/simple: 320*8/14 = 182.857142;                           8.4 + 14*3.4 = 56.0
    check(m, "all_reduce", "ring", "simple", 56.0, 320 * 8 / 14)
    # tree: busBw = min(320*0.92, 16*38.7) = 294.4
    # tree/ll: min(294.4/3.8, 87.7) = 77.473684 -> *0.5 = 38.736842;  6.8 + 2*7*0.6 = 15.2
    check(m, "all_reduce", "tree", "ll", 15.2, 294.4 / 3.8 * 0.5)
    # tree/ll128: min(294.4*7/9, 16*36.7) = 228.977777 -> *0.5;       14 + 2*7*1.25 = 31.5
    check(m, "all_reduce", "tree", "ll128", 31.5, 294.4 * 7 / 9 * 0.5)
    # tree/simple: 294.4*0.5 = 147.2;                                  0 + 2*7*28 = 392
    check(m, "all_reduce", "tree", "simple", 392.0, 147.2)


def test_h100_other_collectives():
    m = internal.cost_model(H100)
    # broadcast: ring/ll min(87.7, 320/3) = 87.7 (ratio 1); 6.6 + 0.6 = 7.2
    check(m, "broadcast", "ring", "ll", 7.2, 87.7)
    # reduce: ring/ll takes the 1/4 factor: 80; 7.2
    check(m, "reduce", "ring", "ll", 7.2, 80.0)
    # all_gather: ring/ll min(87.7, 320/3 = 106.67) = 87.7 * 8/7 = 100.228571; 6.6 + 7*0.6 = 10.8
    check(m, "all_gather", "ring", "ll", 10.8, 87.7 * 8 / 7)
    # ring/simple 320*8/7; 8.4 + 7*3.4 = 32.2
    check(m, "all_gather", "ring", "simple", 32.2, 320 * 8 / 7)


def test_h100_threads():
    m = internal.cost_model(H100)
    # NCCL: Simple/LL up to 512 threads, LL128 640; Ring/Simple 512 as 16*20 > PCI_BW (12).
    assert m["max_threads"]["ring"] == {"ll": 512, "ll128": 640, "simple": 512}
    assert m["max_threads"]["tree"] == {"ll": 512, "ll128": 640, "simple": 512}
    slow = internal.cost_model(dict(H100, nChannels=1, bwIntra=10.0))
    assert slow["max_threads"]["ring"]["simple"] == 256  # 1 * 10 <= 12


# ---------------------------------------------------------------------------------------------
# The network proxy's socket links between nodes (the GPU runtime's groups across hosts)

H100_2_HOSTS = dict(H100, nNodes=2, interLink="socket", bwInter=0.5)


def test_socket_rows_all_reduce():
    """Across socket links the sockets bound the rate (bwInter), every protocol takes Simple's
    latencies (a step reaches the peer's kernel only once all of it is in), LL and LL128 pay for
    their flags, and a Tree sends each byte across once each way."""
    m = internal.cost_model(H100_2_HOSTS)
    # busBw = 16 channels * min(20, 0.5) = 8. Ring: nsteps 14, of which 14 * 2/8 = 3.5 cross (2 of
    # the ring's 8 hops do; NCCL's network rows would count 2 * nNodes = 4); latency
    # 8.4 + 10.5 * max(3.4, netOverhead 3 * 1.0) + 3.5 * 100 = 394.1 for every protocol.
    check(m, "all_reduce", "ring", "simple", 394.1, 8 * 8 / 14)
    check(m, "all_reduce", "ring", "ll", 394.1, 8 * 0.25 * 8 / 14)
    check(m, "all_reduce", "ring", "ll128", 394.1, 8 * 0.7 * 8 / 14)
    # Tree: ratio 1 on two nodes; latency 0 + 2 * ((4 - 1) * 28 + log2(2) * 100) = 368.
    check(m, "all_reduce", "tree", "simple", 368.0, 8.0)
    check(m, "all_reduce", "tree", "ll", 368.0, 8 * 0.25)
    check(m, "all_reduce", "tree", "ll128", 368.0, 8 * 0.7)


def test_socket_rows_other_collectives_and_more_nodes():
    m = internal.cost_model(H100_2_HOSTS)
    # all_gather: nsteps 7, 7 * 2/8 = 1.75 across: 8.4 + 5.25 * 3.4 + 175 = 201.25; bw 8 * 8/7.
    check(m, "all_gather", "ring", "simple", 201.25, 8 * 8 / 7)
    check(m, "all_gather", "ring", "ll", 201.25, 8 * 0.25 * 8 / 7)
    # broadcast: one hop across: 8.4 + 100; ratio 1.
    check(m, "broadcast", "ring", "simple", 108.4, 8.0)
    # Four nodes: an inner node of the tree also takes its second child's half (ratio 1 / 1.5);
    # latency 0 + 2 * ((4 - 1) * 28 + 2 * 100) = 568.
    four = internal.cost_model(dict(H100_2_HOSTS, nRanks=16, nNodes=4))
    check(four, "all_reduce", "tree", "simple", 568.0, 8 / 1.5)


def test_socket_ring_with_a_rank_per_node_crosses_at_every_step():
    # 2 ranks on 2 nodes: both hops of the ring cross, 2 steps of all_reduce: 8.4 + 2 * 100,
    # against a Tree's 0 + 2 * (0 * 28 + 1 * 100) = 200 (the two ran alike measured).
    m = internal.cost_model(dict(H100_2_HOSTS, nRanks=2))
    check(m, "all_reduce", "ring", "simple", 208.4, 16 * 0.5 * 2 / 2)
    check(m, "all_reduce", "tree", "simple", 200.0, 8.0)


def test_socket_rows_leave_the_network_rows_alone():
    """inter_link 'net' keeps NCCL's rows: its LL crosses with its own lower latency."""
    net = internal.cost_model(dict(H100_2_HOSTS, interLink="net"))
    assert cell(net, "all_reduce", "ring", "ll")[0] < cell(net, "all_reduce", "ring", "simple")[0]
    sock = internal.cost_model(H100_2_HOSTS)
    assert (
        cell(sock, "all_reduce", "ring", "ll")[0] == cell(sock, "all_reduce", "ring", "simple")[0]
    )


def test_socket_rows_take_no_corrections_by_size():
    # NCCL's 1.4 on a multi-node Ring/Simple all_reduce and its Tree correction are for its own
    # rows: 394.1 + 1048576 / (1000 * 4.571429) and 368 + 1048576 / (1000 * 8) on socket links.
    t, _ = internal.algo_time(H100_2_HOSTS, "all_reduce", "ring", "simple", 1 << 20)
    assert t == pytest.approx(394.1 + 1048576 / (1000 * 8 * 8 / 14), rel=REL)
    t, _ = internal.algo_time(H100_2_HOSTS, "all_reduce", "tree", "simple", 1 << 20)
    assert t == pytest.approx(368.0 + 1048576 / (1000 * 8), rel=REL)
    # RCCL's ring correction neither (MI300X over sockets: 16 channels x 0.5 GB/s, 16 ranks).
    amd = dict(MI300X_2X8, interLink="socket", bwInter=0.5)
    bw = internal.cost_model(amd)["bandwidth_gbs"]["all_reduce"]["ring"]["simple"]
    lat = internal.cost_model(amd)["latency_us"]["all_reduce"]["ring"]["simple"]
    t, _ = internal.algo_time(amd, "all_reduce", "ring", "simple", 1 << 20)
    assert t == pytest.approx(lat + 1048576 / (1000 * bw), rel=REL)


def test_cpu_model_over_pcie_uses_pci_row():
    m = internal.cost_model(dict(CPU, intraLink="pcie"))
    # cpu over PCIe: NCCL tables, Ampere caps, NCCL's PCI row (no host FIFO rule).
    # busBw = 2 * 5 = 10; all_reduce nsteps 6, ratio 4/6.
    # ring/simple: 10 * 4/6 = 6.666667; 8.4 + 6 * 5.7 = 42.6
    check(m, "all_reduce", "ring", "simple", 42.6, 10 * 4 / 6)
    # ring/ll: min(87.7, 10/4) = 2.5 * 4/6; 6.6 + 6 * 1.0 = 12.6
    check(m, "all_reduce", "ring", "ll", 12.6, 2.5 * 4 / 6)
    # tree/ll: min(10*0.92, 2*24.0) = 9.2 -> 9.2/3.8 * 0.5; 6.8 + 2*3*1.0 = 12.8
    check(m, "all_reduce", "tree", "ll", 12.8, 9.2 / 3.8 * 0.5)
    # Ring/Simple threads: 2*5 = 10 <= 12 -> 256
    assert m["max_threads"]["ring"]["simple"] == 256
    assert "cpu" in m["description"]


def test_cpu_model_over_shm_pays_handoffs_and_fifo_copies():
    m = internal.cost_model(CPU)
    # cpu over shm (the host executor): every ring/tree step is a thread hand-off (10 us instead
    # of the PCI row) and every hop copies twice through a FIFO (half the NCCL bandwidth).
    # ring/simple: 10 * 4/6 * 0.5 = 3.333333; 8.4 + 6 * 10 = 68.4
    check(m, "all_reduce", "ring", "simple", 68.4, 10 * 4 / 6 * 0.5)
    # ring/ll: 2.5 * 4/6 * 0.5; 6.6 + 6 * 10 = 66.6
    check(m, "all_reduce", "ring", "ll", 66.6, 2.5 * 4 / 6 * 0.5)
    # tree/ll: 9.2/3.8 * 0.5 * 0.5; 6.8 + 2*3*10 = 66.8
    check(m, "all_reduce", "tree", "ll", 66.8, 9.2 / 3.8 * 0.5 * 0.5)
    # broadcast pays a hand-off per hop (nRanks - 1 = 3): 8.4 + 3*10 = 38.4; 10 * 4/4 * 0.5
    check(m, "broadcast", "ring", "simple", 38.4, 10 * 0.5)
    # all_gather: nsteps 3, ratio 4/3: 8.4 + 3*10 = 38.4; 10 * 4/3 * 0.5
    check(m, "all_gather", "ring", "simple", 38.4, 10 * 4 / 3 * 0.5)
    assert m["max_threads"]["ring"]["simple"] == 256
    assert "host hand-offs" in m["description"]
    # No direct_peers: no Direct rows.
    assert all(m["bandwidth_gbs"][c]["direct"][p] == 0 for c in COLLS for p in PROTOS)


def test_direct_rows_only_with_direct_peers_on_one_node():
    # Direct rows come from the host executor's traffic (tables in cost_model.cc), Simple only:
    # latency 2 barriers * 10 us; bandwidth nChannels * bwIntra = 10 GB/s over the bytes the
    # busiest rank moves per byte: all_reduce 2, the others 1 (reduce: the ranks share the
    # root's reduction, each reading its 1/n sub-slice of every input).
    m = internal.cost_model(dict(CPU, directPeers=True))
    for coll, traffic in [
        ("broadcast", 1),
        ("reduce", 1),
        ("all_gather", 1),
        ("reduce_scatter", 1),
        ("all_reduce", 2),
    ]:
        check(m, coll, "direct", "simple", 20.0, 10 / traffic)
        assert m["bandwidth_gbs"][coll]["direct"]["ll"] == 0
        assert m["bandwidth_gbs"][coll]["direct"]["ll128"] == 0
    # Direct takes Ring's threads and thresholds.
    assert m["max_threads"]["direct"] == m["max_threads"]["ring"]
    assert m["thread_thresholds"]["direct"] == m["thread_thresholds"]["ring"]
    # Two nodes: ranks of different nodes cannot read each other's buffers.
    m2 = internal.cost_model(dict(CPU, nRanks=4, nNodes=2, bwInter=5.0, directPeers=True))
    assert all(m2["bandwidth_gbs"][c]["direct"][p] == 0 for c in COLLS for p in PROTOS)
    # The Ring/Tree rows do not depend on directPeers.
    m0 = internal.cost_model(CPU)
    for c in COLLS:
        for a in ("tree", "ring"):
            assert m["bandwidth_gbs"][c][a] == m0["bandwidth_gbs"][c][a]
            assert m["latency_us"][c][a] == m0["latency_us"][c][a]


def test_ring_backup_keeps_disabled_ll128():
    # RCCL keeps the Ring bandwidth from before LL128 was disabled (ringbdw).
    m = internal.cost_model(dict(H100, ll128Enabled=False))
    assert m["bandwidth_gbs"]["all_reduce"]["ring"]["ll128"] == 0
    assert m["ring_backup_gbs"]["all_reduce"]["ll128"] == pytest.approx(294.4 * 8 / 14, rel=REL)
    t, backup = internal.algo_time(
        dict(H100, ll128Enabled=False), "all_reduce", "ring", "ll128", 1 << 20
    )
    assert backup and t > 0
    t, backup = internal.algo_time(
        dict(H100, ll128Enabled=False), "all_reduce", "tree", "ll128", 1 << 20
    )
    assert t < 0 and not backup


# ---------------------------------------------------------------------------------------------
# AlgoTime


def test_algo_time_golden_mi300x():
    # 1 MiB: logSize = log2(2^20 >> 6) = 14. One node: Ring has no correction.
    # ring/simple: 67.4 + 1048576 / (1000 * 182.857142) = 67.4 + 5.734400 = 73.134400
    t, b = internal.algo_time(MI300X, "all_reduce", "ring", "simple", 1 << 20)
    assert t == pytest.approx(67.4 + 1048576 / (1000 * 320 * 8 / 14), rel=REL) and not b
    # tree/ll: treeCorrection[ll][14] of tuning_model_5 = 0.6 -> bw 39.36;
    #   23.2 + 1048576 / 39360 = 49.840650
    t, _ = internal.algo_time(MI300X, "all_reduce", "tree", "ll", 1 << 20)
    assert t == pytest.approx(23.2 + 1048576 / (1000 * 65.6 * 0.6), rel=REL)
    # numPipeOps multiplies the latency (Ring: count; Tree: ceil(count / 1 element per work)).
    t3, _ = internal.algo_time(MI300X, "all_reduce", "ring", "simple", 1 << 20, num_pipe_ops=3)
    assert t3 == pytest.approx(3 * 67.4 + 1048576 / (1000 * 320 * 8 / 14), rel=REL)


def test_algo_time_golden_two_nodes_ring_correction():
    # Across nodes AMD Rings take ringCorrection: tuning_model_5 ring/simple [14] = 0.1.
    # 252.2 + 1048576 / (1000 * 170.666667 * 0.1) = 252.2 + 61.44 = 313.64
    t, _ = internal.algo_time(MI300X_2X8, "all_reduce", "ring", "simple", 1 << 20)
    assert t == pytest.approx(252.2 + 1048576 / (1000 * 320 * 16 / 30 * 0.1), rel=REL)


def test_algo_time_golden_h100():
    # ring/ll 1 MiB: 15.0 + 1048576 / 45714.285 = 37.937600
    t, _ = internal.algo_time(H100, "all_reduce", "ring", "ll", 1 << 20)
    assert t == pytest.approx(15.0 + 1048576 / (1000 * 80 * 8 / 14), rel=REL)
    # tree/ll128 1 MiB: NCCL treeCorrectionFactor[ll128][14] = 0.6:
    #   31.5 + 1048576 / (1000 * 114.488889 * 0.6) = 46.764
    t, _ = internal.algo_time(H100, "all_reduce", "tree", "ll128", 1 << 20)
    assert t == pytest.approx(31.5 + 1048576 / (1000 * 294.4 * 7 / 9 * 0.5 * 0.6), rel=REL)
    # A tuner's channel count scales bandwidth (NVIDIA path): 8 of 16 channels halves it.
    t8, _ = internal.algo_time(H100, "all_reduce", "ring", "simple", 1 << 20, nchannels=8)
    assert t8 == pytest.approx(56.0 + 1048576 / (1000 * 320 * 8 / 14 / 2), rel=REL)


SIZES = [0, 1, 63, 64, 1000, 4096, 65535, 1 << 20, (1 << 20) + 12345, 1 << 26, 1 << 31]


@pytest.mark.parametrize("topo", [MI300X, H100, CPU], ids=["mi300x", "h100", "cpu"])
@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("proto", PROTOS)
def test_ring_time_monotonic_in_bytes(topo, coll, proto):
    # Single-node Rings have no size correction: time = lat + bytes / bw is increasing.
    times = [internal.algo_time(topo, coll, "ring", proto, n)[0] for n in SIZES]
    if times[0] < 0:
        return  # combination not available
    assert times == sorted(times)
    assert times[-1] > times[0]


@pytest.mark.parametrize("topo", [MI300X, MI300X_2X8, H100], ids=["mi300x", "mi300x2", "h100"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("proto", PROTOS)
def test_time_monotonic_within_size_bucket(topo, algo, proto):
    # Correction factors are per power-of-two bucket; inside a bucket time grows with bytes.
    for log in (8, 14, 20, 26):
        lo, hi = 1 << log, (1 << (log + 1)) - 1
        sizes = [lo, lo + 1, (lo + hi) // 2, hi]
        times = [internal.algo_time(topo, "all_reduce", algo, proto, n)[0] for n in sizes]
        if times[0] < 0:
            continue
        assert times == sorted(times)


@pytest.mark.parametrize("topo", [MI300X, H100], ids=["mi300x", "h100"])
def test_time_monotonic_in_pipe_ops(topo):
    prev = -1.0
    for ops in (1, 2, 4, 8):
        t, _ = internal.algo_time(topo, "all_reduce", "ring", "ll", 1 << 16, num_pipe_ops=ops)
        assert t > prev
        prev = t


def test_unavailable_combinations_are_negative():
    # Tree does not run broadcast; LL128 is off on MI300X.
    assert internal.algo_time(MI300X, "broadcast", "tree", "ll", 4096)[0] < 0
    assert internal.algo_time(MI300X, "all_reduce", "tree", "ll128", 4096)[0] < 0
    assert internal.algo_time(MI300X, "all_reduce", "tree", "simple", 4096)[0] < 0


def test_single_rank_model_is_empty():
    m = internal.cost_model(dict(MI300X, nRanks=1, bwIntra=0.0))
    assert all(m["bandwidth_gbs"][c][a][p] == 0 for c in COLLS for a in ALGOS for p in PROTOS)
    assert m["thread_thresholds"]["ring"]["ll"] == 0
    assert m["max_threads"]["ring"]["simple"] == 256


# ---------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(nRanks=0), ["nRanks"]),
        (dict(nNodes=3), ["nNodes", "divide"]),
        (dict(nNodes=16), ["nNodes"]),
        (dict(nChannels=0), ["nChannels"]),
        (dict(nChannels=129), ["nChannels", "128"]),
        (dict(bwIntra=0.0), ["bwIntra"]),
        (dict(bwIntra=math.inf), ["bwIntra"]),
        (dict(bwIntra=-1.0), ["bwIntra"]),
        (dict(intraLink="net"), ["intraLink", "allowed"]),
        (dict(intraLink="socket"), ["intraLink", "allowed", "'socket'"]),
        (dict(nRanks=16, nNodes=2, interLink="socket", bwInter=0.0), ["bwInter", "socket"]),
        (dict(nRanks=24, nNodes=3, bwInter=0.0), ["bwInter"]),
    ],
)
def test_invalid_topologies(change, words):
    with pytest.raises(ValueError) as e:
        internal.cost_model(dict(MI300X, **change))
    for w in words:
        assert w in str(e.value)


def test_topology_dict_errors():
    with pytest.raises(ValueError, match="unknown field 'nranks'"):
        internal.cost_model(dict(MI300X, nranks=8))
    with pytest.raises(ValueError, match="arch"):
        internal.cost_model(dict(MI300X, arch="gfx1100"))
    with pytest.raises(ValueError, match="buffSizes"):
        internal.cost_model(dict(MI300X, buffSizes=[1, 2]))


def test_describe_mentions_source():
    assert "tuning_model_5" in internal.cost_model(MI300X)["description"]
    mi250 = dict(MI300X, arch="gfx90a", nRanks=16)
    assert "tuning_model_1" in internal.cost_model(mi250)["description"]
    assert "tuning_model_4" in internal.cost_model(dict(mi250, ll128Enabled=True))["description"]
    assert "Hopper" in internal.cost_model(H100)["description"]
    d = internal.cost_model(H100_2_HOSTS)["description"]
    assert "inter socket" in d and "socket rows between them" in d
