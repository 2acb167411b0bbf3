"""The planner's choices on the GPU topologies the runtime uses (jax_rccl.harness.gpu_topology).

The device code runs LL and Simple (and LL128 on NVIDIA, where the topology allows it), Ring,
Tree, point-to-point and Direct; these topologies must never lead the planner elsewhere, and
Direct appears only where ranks read each other's memory. Also the harness's host-side reading
of a launch's device timeline.
"""

import pytest

from jax_rccl import harness, planner

SIZES = [8, 1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 28]
COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"]


def choice(topo, coll, nbytes, **kw):
    count = max(1, nbytes // 4)
    if coll in ("all_gather", "reduce_scatter"):
        count = max(1, count // topo.nranks)
    task = planner.Task(coll, count, "float32", root=0)
    return planner.plan([task], topo, **kw).to_dict()["tasks"][0]


@pytest.mark.parametrize("nranks", [2, 4, 8])
@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("ll128", [False, True])
@pytest.mark.parametrize("coll", COLLS)
def test_protocols_and_algorithms_the_kernels_run(nranks, direct, ll128, coll):
    topo = harness.gpu_topology(nranks, direct=direct, ll128=ll128)
    for nbytes in SIZES:
        t = choice(topo, coll, nbytes)
        assert t["protocol"] in (("ll", "simple", "ll128") if ll128 else ("ll", "simple")), t
        assert t["algorithm"] in ("ring", "tree", "direct"), (nbytes, t)
        if not direct:
            assert t["algorithm"] != "direct", (nbytes, t)
        assert t["nchannels"] <= topo.nchannels


@pytest.mark.parametrize("nranks", [2, 8])
def test_direct_takes_every_size_where_peers_are_readable(nranks):
    """Two barriers beat a ring's 2(n - 1) LL hops at small sizes, and half a ring's memory
    traffic at large ones (benchmarks/gpu_collectives.py); without Direct, LL takes the small."""
    topo = harness.gpu_topology(nranks)
    for nbytes in (8, 1 << 16, 1 << 28):
        assert choice(topo, "all_reduce", nbytes)["algorithm"] == "direct", nbytes
    assert choice(harness.gpu_topology(nranks, direct=False), "all_reduce", 8)["protocol"] == "ll"


def test_forcing_ll128_falls_back_on_gpu_topologies():
    topo = harness.gpu_topology(4)
    t = choice(topo, "all_reduce", 1 << 16, protocol="LL128")
    assert t["protocol"] != "ll128"


def test_ll128_when_the_topology_allows_it():
    """With LL128 allowed (harness.gpu_topology(ll128=True); the JAX handlers allow it only
    under an explicit protocol setting), forcing it takes it for rings and trees alike."""
    topo = harness.gpu_topology(4, direct=False, ll128=True)
    for coll in COLLS:
        assert choice(topo, coll, 1 << 20, protocol="LL128")["protocol"] == "ll128", coll
    t = choice(topo, "all_reduce", 1 << 20, protocol="LL128", algorithm="Tree")
    assert (t["algorithm"], t["protocol"]) == ("tree", "ll128")


@pytest.mark.parametrize("nranks", [1, 3, 16])
def test_default_channels(nranks):
    topo = harness.gpu_topology(nranks)
    assert topo.nchannels == max(16, 128 // nranks)
    assert topo.p2p_nchannels == topo.nchannels
    assert not topo.ll128


def test_buffer_sizes_are_the_runtimes_and_can_be_changed():
    """The harness's default FIFO buffers are the GPU communicators' (one declaration, in C++);
    each protocol's step is whole 16-byte lines, LL128's whole 128-byte lines."""
    from jax_rccl import _jax_rccl

    ll, ll128, simple = _jax_rccl.gpu_buff_sizes
    assert harness.gpu_topology(4).buff_sizes == (ll, ll128, simple)
    steps = 8
    assert ll % (steps * 16) == 0 and simple % (steps * 16) == 0
    assert ll128 % (steps * 128) == 0
    topo = harness.gpu_topology(2, ll128=True, buff_sizes=(ll, 1 << 20, simple))
    assert topo.buff_sizes == (ll, 1 << 20, simple)
    assert choice(topo, "all_reduce", 1 << 20, protocol="LL128")["protocol"] == "ll128"
    with pytest.raises(ValueError, match="buff_sizes"):
        harness.gpu_topology(2, buff_sizes=(ll, simple))
    with pytest.raises(ValueError, match=r"buff_sizes\[ll128\].*multiple of 8"):
        choice(harness.gpu_topology(2, buff_sizes=(ll, ll128 + 1, simple)), "all_reduce", 1024)


def test_harness_trace_words_become_named_events(monkeypatch):
    """Harness.trace turns the device's words (event << 56 | ns) into (name, us since the
    earliest start) per rank and block, skipping unused words."""
    import types

    per = 4
    monkeypatch.setattr(
        harness, "_jax_rccl", types.SimpleNamespace(gpu=types.SimpleNamespace(TRACE_EVENTS=per))
    )

    def word(event, ns):
        return (event << 56) | ns

    raw = [
        [word(1, 5000), word(3, 6500), word(7, 9000), 0, word(1, 5500), 0, 0, 0],  # 2 blocks
        [word(1, 4000), word(7, 4250), 0, 0],
    ]
    h = harness.Harness.__new__(harness.Harness)
    h._h = types.SimpleNamespace(trace=lambda slots: raw)
    h.failed = False
    out = h.trace([])
    assert out == [
        [[("start", 1.0), ("piece", 2.5), ("end", 5.0)], [("start", 1.5)]],
        [[("start", 0.0), ("end", 0.25)]],
    ]


# ---------------------------------------------------------------------------------------------
# Groups across hosts: the runtime's own topology (ffi/planner/topology.cc: GpuGroupTopology)


def runtime_topology(nranks, nnodes, arch="sm90", ll128=False):
    from jax_rccl import _jax_rccl

    return planner.Topology.from_native(
        _jax_rccl.gpu_topology(nranks, nnodes, arch=arch, ll128=ll128)
    )


@pytest.fixture(autouse=True)
def _default_settings(monkeypatch):
    # The runtime's topology follows the settings: these tests take their defaults.
    for name in ("JAX_RCCL_NCHANNELS", "JAX_RCCL_BUFFSIZE", "JAX_RCCL_NET_BUFFSIZE"):
        monkeypatch.delenv(name, raising=False)


def test_the_runtime_topology_across_hosts(monkeypatch):
    """Across hosts the runtime plans with the network proxy's socket links, its measured rate,
    and JAX_RCCL_NET_BUFFSIZE's Simple steps (JAX_RCCL_BUFFSIZE's within one host)."""
    one, two = runtime_topology(4, 1), runtime_topology(4, 2)
    assert (two.nnodes, two.inter_link, two.bw_inter) == (2, "socket", 0.5)
    assert two.buff_sizes[2] == 1 << 20 and one.buff_sizes[2] == 4 << 20
    assert (one.nchannels, two.nchannels) == (32, 32)
    assert runtime_topology(8, 2).nchannels == 16
    monkeypatch.setenv("JAX_RCCL_NET_BUFFSIZE", str(1 << 19))
    assert runtime_topology(4, 2).buff_sizes[2] == 1 << 19
    with pytest.raises(ValueError, match="nranks must be >= 1 and a multiple of nnodes"):
        runtime_topology(3, 2)


@pytest.mark.parametrize("arch, ll128", [("sm90", False), ("sm90", True), ("gfx942", False)])
@pytest.mark.parametrize("nranks", [2, 4, 8, 16])
@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("a_node_per_rank", [False, True], ids=["two_hosts", "a_node_per_rank"])
def test_groups_across_hosts_take_simple(arch, ll128, nranks, coll, a_node_per_rank):
    """Through the proxy an LL or LL128 step reaches its peer no sooner than a Simple one and
    carries flags too: on one H100 split into two faked hosts, LL ran at 0.16-0.31 of Simple's
    rate at 16 MB and 3.5 times slower at 64 KB (4 processes), no faster at 8 KB; the planner
    chose LL up to 1 MB on NCCL's network rows (1 MB all_reduce: 2.45 ms against Tree/Simple's
    0.51). A group whose hosts hold unequal or separated runs of ranks plans a node per rank
    (comm::CountNodes): the same."""
    topo = runtime_topology(nranks, nranks if a_node_per_rank else 2, arch, ll128)
    assert topo.link == ("xgmi" if arch == "gfx942" else "nvlink")
    for nbytes in SIZES:
        t = choice(topo, coll, nbytes)
        assert t["protocol"] == "simple", (nbytes, t)


def test_a_tree_all_reduce_where_it_crosses_less():
    """4 ranks on 2 hosts: a Ring carries 1.5 S across each way, the double binary tree S; the Tree
    was faster at every size measured (8 KB to 256 MB: 19.0 ms against 27.6 at 256 MB)."""
    topo = runtime_topology(4, 2)
    for nbytes in SIZES[1:]:
        assert choice(topo, "all_reduce", nbytes)["algorithm"] == "tree", nbytes
