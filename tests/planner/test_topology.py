"""One topology check (ffi/planner/topology.cc: ValidateTopology) behind every entry point: plan,
explain, the cost model queries and Topology.validate() accept and refuse the same topologies,
and each refusal names the field (Python's name and TopologyView's) and what is allowed."""

from __future__ import annotations

import math

import pytest
from jax_rccl._jax_rccl import internal

import jax_rccl
from jax_rccl import _jax_rccl, planner
from jax_rccl.planner import Task, Topology

TASK = Task("all_reduce", 1 << 16, "float32")


def _outcome(fn):
    """'ok' or the first line of the ValueError's message."""
    try:
        fn()
    except ValueError as e:
        return str(e).splitlines()[0]
    return "ok"


def outcomes(topo: Topology) -> dict[str, str]:
    """What every entry point that takes a topology makes of this one."""
    d = topo.to_native()
    return {
        "validate": _outcome(topo.validate),
        "plan": _outcome(lambda: planner.plan([TASK], topo)),
        "explain": _outcome(lambda: planner.explain([TASK], topo)),
        "make_plan": _outcome(lambda: _jax_rccl.make_plan(d, [TASK.to_native()], 0)),
        "cost_model": _outcome(lambda: internal.cost_model(d)),
        "algo_time": _outcome(lambda: internal.algo_time(d, "all_reduce", "ring", "ll", 4096)),
        "select": _outcome(lambda: internal.select(d, "all_reduce", 1024, "float32", "sum")),
    }


MI300X_8 = Topology.preset("mi300x-8")
MI300X_2X8 = Topology.preset("mi300x-2x8")
CPU_2_HOSTS = Topology(nranks=4, nnodes=2, arch="cpu", link="shm", bw_intra=8.0, bw_inter=0.6)

# Topologies that plan.cc's check and cost_model.cc's check used to judge differently.
ONCE_DISPUTED_VALID = [
    # One rank: bw_intra is never read (a one-rank plan is a copy); plan() used to require it.
    Topology(nranks=1, bw_intra=0.0),
    MI300X_8.replace(nranks=1, bw_intra=0.0),
    # Two GPU nodes: NCCL's formula takes bw_intra up to 2 nodes; plan() used to require bw_inter.
    MI300X_2X8.replace(bw_inter=0.0),
]
ONCE_DISPUTED_INVALID = [
    # The host executor across 2 nodes reads bw_inter (its sockets); the cost model took 0 as
    # "use bw_intra".
    (CPU_2_HOSTS.replace(bw_inter=0.0), "topology.bw_inter must be > 0"),
    # Fields the cost model queries did not check.
    (MI300X_8.replace(p2p_nchannels=3), "topology.p2p_nchannels must be a power of two"),
    (MI300X_8.replace(p2p_chunk_size=4), "topology.p2p_chunk_size must be >= 8"),
    (MI300X_8.replace(work_fifo_depth=100), "topology.work_fifo_depth must be a power of two"),
    (MI300X_8.replace(buff_sizes=(262144, 458752, 0)), "topology.buff_sizes[simple] must be > 0"),
    # plan.cc's check let an infinite bandwidth through (the cost model refused it later).
    (MI300X_8.replace(bw_intra=math.inf), "topology.bw_intra must be a finite value"),
]


@pytest.mark.parametrize("topo", ONCE_DISPUTED_VALID)
def test_once_disputed_topologies_are_accepted_everywhere(topo):
    assert set(outcomes(topo).values()) == {"ok"}, outcomes(topo)


@pytest.mark.parametrize("topo, message", ONCE_DISPUTED_INVALID)
def test_once_disputed_topologies_are_refused_everywhere_alike(topo, message):
    got = outcomes(topo)
    assert len(set(got.values())) == 1, got
    assert message in got["plan"], got


def test_unread_bandwidths_do_not_change_the_plan():
    # Not read, so any value plans alike: bw_inter on 2 GPU nodes, bw_intra on one rank.
    tasks = [TASK, Task("all_gather", 1 << 20, "bfloat16"), Task("broadcast", 100, root=3)]
    a = planner.plan(tasks, MI300X_2X8.replace(bw_inter=0.0)).to_dict()
    b = planner.plan(tasks, MI300X_2X8.replace(bw_inter=123.0)).to_dict()
    assert a == b
    tables = [
        {k: v for k, v in internal.cost_model(t.to_native()).items() if k != "description"}
        for t in (MI300X_2X8.replace(bw_inter=0.0), MI300X_2X8)
    ]
    assert tables[0] == tables[1]
    one = [Task("all_reduce", 64, "float32", op="avg")]
    assert (
        planner.plan(one, Topology(nranks=1, bw_intra=0.0)).to_dict()
        == planner.plan(one, Topology(nranks=1, bw_intra=8.0)).to_dict()
    )


def test_read_bandwidths_are_required():
    assert "bw_intra must be > 0" in outcomes(MI300X_8.replace(bw_intra=0.0))["cost_model"]
    three_nodes = MI300X_2X8.replace(nranks=24, nnodes=3, bw_inter=0.0)
    assert len(set(outcomes(three_nodes).values())) == 1
    assert "bw_inter must be > 0" in outcomes(three_nodes)["select"]
    assert set(outcomes(CPU_2_HOSTS).values()) == {"ok"}


# (TopologyView field, bad value, Python field, words of the rule)
INVALID_FIELDS = [
    ("nRanks", 0, "nranks", ">= 1"),
    ("nNodes", 3, "nnodes", "divide nranks"),
    ("nNodes", 16, "nnodes", "1..nranks"),
    ("intraLink", "net", "link", "allowed: loopback, shm, pcie, xgmi, nvlink"),
    ("intraLink", "socket", "link", "allowed: loopback, shm, pcie, xgmi, nvlink; got 'socket'"),
    ("interLink", "nvlink", "inter_link", "joins nodes; allowed: net, socket; got 'nvlink'"),
    ("nChannels", 0, "nchannels", "1..128"),
    ("nChannels", 129, "nchannels", "1..128"),
    ("p2pnChannels", 3, "p2p_nchannels", "power of two in 1..128"),
    ("p2pnChannelsPerPeer", 128, "p2p_nchannels_per_peer", "power of two in 1..p2p_nchannels"),
    ("buffSizes", [12, 458752, 4194304], "buff_sizes[ll]", "multiple of 8"),
    ("buffSizes", [262144, 458752, 0], "buff_sizes[simple]", "> 0"),
    ("p2pChunkSize", 4, "p2p_chunk_size", ">= 8"),
    ("bwIntra", 0.0, "bw_intra", "> 0 GB/s per channel when nranks > 1"),
    ("bwIntra", -1.0, "bw_intra", "finite value >= 0"),
    ("bwIntra", math.nan, "bw_intra", "finite value >= 0"),
    ("bwInter", -1.0, "bw_inter", "finite value >= 0"),
    ("bwInter", math.inf, "bw_inter", "finite value >= 0"),
    ("workFifoDepth", 128, "work_fifo_depth", "power of two >= 256"),
    ("workFifoDepth", 1000, "work_fifo_depth", "power of two >= 256"),
]


@pytest.mark.parametrize("field, value, name, rule", INVALID_FIELDS)
def test_each_invalid_field_is_named(field, value, name, rule):
    d = dict(MI300X_8.to_native(), **{field: value})
    for entry in (
        lambda: _jax_rccl.validate_topology(d),
        lambda: _jax_rccl.make_plan(d, [TASK.to_native()], 0),
        lambda: internal.cost_model(d),
    ):
        with pytest.raises(ValueError) as e:
            entry()
        msg = str(e.value)
        assert f"topology.{name} " in msg and rule in msg and f"({field})" in msg, msg


def test_three_nodes_need_bw_inter_named():
    d = dict(MI300X_2X8.to_native(), nRanks=24, nNodes=3, bwInter=0.0)
    with pytest.raises(ValueError, match=r"topology\.bw_inter must be > 0.*\(bwInter\)"):
        _jax_rccl.validate_topology(d)


def test_python_topology_checks_ranks_and_nodes_by_the_same_rule():
    with pytest.raises(ValueError, match=r"topology\.nnodes must be in 1\.\.nranks.*\(nNodes\)"):
        Topology(nranks=8, nnodes=3)
    with pytest.raises(ValueError, match=r"topology\.nranks must be >= 1.*\(nRanks\)"):
        Topology(nranks=0)
    with pytest.raises(ValueError, match="nranks must be an integer"):
        Topology(nranks=8.0)
    # The chunking test entry point checks ranks and nodes by the same rule too.
    with pytest.raises(ValueError, match=r"topology\.nnodes must be"):
        internal.coll_chunk_info("all_reduce", "ring", "simple", "float32", 1024, 1, nnodes=3)


def test_validate_returns_the_topology():
    assert MI300X_8.validate() is MI300X_8


def test_runtime_topology_is_valid_and_keeps_the_default_fifo_depth():
    # The runtime's plans are persistent: no FIFO budget applies, and no setting changes it.
    envs = {p["env"] for p in jax_rccl.params()}
    assert "JAX_RCCL_WORK_FIFO_DEPTH" not in envs
    topo = Topology.from_native(jax_rccl.runtime_topology(4))
    assert topo.validate().work_fifo_depth == Topology(nranks=4).work_fifo_depth == 262144
