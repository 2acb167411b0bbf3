"""One host over shared memory against two hosts over sockets: the same all_reduce plans
differently, and the cost model says why.

The CPU runtime plans a group spanning processes of one host with one node and shm links, and a
group across hosts with one node per host, socket links between them and ``bw_inter`` from the
socket row (ffi/cpu/comm_world.cc; the cost model's CPU network row charges each inter-node step a
socket hand-off). Here both topologies are built as the runtime builds them.
"""

from __future__ import annotations

import pytest

from jax_rccl import _jax_rccl
from jax_rccl.planner import Task, Topology, explain, plan

# What the runtime uses for 4 ranks in 4 processes: one host, or 2 hosts x 2 processes.
ONE_HOST = Topology(nranks=4, nnodes=1, arch="cpu", link="shm", nchannels=2, direct_peers=False)
TWO_HOSTS = ONE_HOST.replace(nnodes=2, inter_link="socket", bw_inter=0.6)
NBYTES = 64 * 1024


def _choice(topo):
    t = plan([Task("all_reduce", NBYTES // 4, "float32")], topo, algorithm="Ring,Tree").tasks[0]
    return t["algorithm"], t["protocol"]


def _cost(topo, algo, proto="Simple"):
    us, _ = _jax_rccl.internal.algo_time(topo.to_native(), "all_reduce", algo, proto, NBYTES)
    return us


def test_shm_and_sockets_choose_differently():
    assert _choice(ONE_HOST) == ("ring", "simple")
    assert _choice(TWO_HOSTS) == ("tree", "simple")


def test_the_costs_say_why():
    # One host: each ring step is a thread hand-off (10 us); the tree's pipeline is slower.
    assert _cost(ONE_HOST, "Ring") < _cost(ONE_HOST, "Tree")
    # Two hosts: the ring crosses the network 2 x nNodes times, the tree 2 x log2(nNodes) times,
    # each a socket step of the progress threads (60 us).
    assert _cost(TWO_HOSTS, "Tree") < _cost(TWO_HOSTS, "Ring")
    assert _cost(TWO_HOSTS, "Ring") > 2 * _cost(ONE_HOST, "Ring")
    one = _jax_rccl.internal.cost_model(ONE_HOST.to_native())
    two = _jax_rccl.internal.cost_model(TWO_HOSTS.to_native())
    # The table explain's prediction comes from: latency per algorithm/protocol.
    assert "1 node(s)" in one["description"] and "2 node(s)" in two["description"]
    lat1, lat2 = one["latency_us"]["all_reduce"], two["latency_us"]["all_reduce"]
    bw1, bw2 = one["bandwidth_gbs"]["all_reduce"], two["bandwidth_gbs"]["all_reduce"]
    assert lat2["ring"]["simple"] > lat1["ring"]["simple"] + 100
    assert lat2["ring"]["simple"] > lat2["tree"]["simple"]
    assert bw2["ring"]["simple"] < bw1["ring"]["simple"]


def test_explain_names_the_topology_and_the_prediction():
    task = Task("all_reduce", NBYTES // 4, "float32")
    a = explain([task], ONE_HOST, algorithm="Ring,Tree")
    b = explain([task], TWO_HOSTS, algorithm="Ring,Tree")
    assert "1 node(s) x 4 ranks" in a and "ring / simple" in a, a
    assert "2 node(s) x 2 ranks" in b and "socket between nodes" in b and "tree / simple" in b, b
    assert "2 channels x 8 GB/s inside, 0.6 GB/s between nodes" in b, b
    assert "between nodes" not in a, a
    assert "predicted" in a and "predicted" in b


@pytest.mark.parametrize(
    "hosts, nodes",
    [
        ("", 1),
        ("A", 1),
        ("AAAA", 1),  # one host
        ("AABB", 2),  # equal runs of consecutive ranks: a node per host
        ("ABC", 3),
        ("AAABBBCCC", 3),
        ("AAAB", 4),  # unequal runs: a node per rank
        ("ABAB", 4),  # a host's ranks apart: likewise
        ("AABBAA", 6),
    ],
)
def test_the_nodes_a_group_plans_with(hosts, nodes):
    """The runtimes plan a node per host where hosts hold equal runs of consecutive ranks (the
    planner's nodes), else a node per rank (comm::CountNodes, for the CPU and GPU runtimes)."""
    from jax_rccl import _jax_rccl_testing

    assert _jax_rccl_testing.count_nodes([f"host{h}" for h in hosts]) == nodes
