"""Our Direct algorithm in the planner: cost rows (ffi/planner/cost_model.cc), selection, masks
and the tuner (select.cc), device function ids, and one-chunk-per-element chunking (chunk.cc).

Direct exists only on one node whose ranks read each other's buffers (topology.direct_peers).
The numbers come from the CPU executor's tables in cost_model.cc (to be calibrated by
benchmarks/cpu_collectives.py): latency 2 barriers x 10 us = 20 us; bandwidth
nChannels * bwIntra / (bytes the busiest rank moves per byte): all_reduce 2, reduce nRanks (the
root reads every input), all_gather, reduce_scatter and broadcast 1.
"""

import pytest
from jax_rccl._jax_rccl import internal

from jax_rccl import planner
from jax_rccl.planner import Task, Topology

REL = 1e-5
COLLS = ["broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce"]
ITEMSIZE = {"int8": 1, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4}

CPU8 = Topology.preset("cpu-8")  # 8 ranks, 2 channels x 8 GB/s, loopback
CPU8D = CPU8.replace(direct_peers=True)


def native(topo):
    return topo.to_native()


def select(topo, coll, nbytes, dtype="float32", **kw):
    count = max(1, nbytes // ITEMSIZE[dtype])
    if coll in ("all_gather", "reduce_scatter"):
        count = max(1, count // topo.nranks)  # per-rank count
    return internal.select(native(topo), coll, count, dtype, **kw)


SIZES = [1, 64, 4096, 1 << 16, 1 << 20, 1 << 24, 1 << 28, 1 << 30]


# ---------------------------------------------------------------------------------------------
# Cost model and AlgoTime


def test_cpu8_direct_rows():
    m = internal.cost_model(native(CPU8D))
    # B = nChannels * bwIntra = 2 * 8 = 16 GB/s; latency 2 * 10 = 20 us.
    for coll, traffic in [
        ("broadcast", 1),
        ("reduce", 1),  # the ranks share the root's reduction
        ("all_gather", 1),
        ("reduce_scatter", 1),
        ("all_reduce", 2),
    ]:
        assert m["latency_us"][coll]["direct"]["simple"] == pytest.approx(20.0)
        assert m["bandwidth_gbs"][coll]["direct"]["simple"] == pytest.approx(16 / traffic)
        assert m["bandwidth_gbs"][coll]["direct"]["ll"] == 0
        assert m["bandwidth_gbs"][coll]["direct"]["ll128"] == 0


def test_algo_time_golden():
    t = lambda coll, nbytes, **kw: internal.algo_time(  # noqa: E731
        native(CPU8D), coll, "direct", "simple", nbytes, **kw
    )
    # all_reduce 1 MiB: 20 + 1048576 / (1000 * 16/2) = 20 + 131.072 = 151.072
    assert t("all_reduce", 1 << 20)[0] == pytest.approx(151.072, rel=REL)
    # all_gather 1 MiB in all (nBytes counts every rank's part): 20 + 1048576/16000 = 85.536
    assert t("all_gather", 1 << 20)[0] == pytest.approx(85.536, rel=REL)
    # reduce 1 MiB: every rank reduces its 1/8 sub-slice into the root's output (reads 1 MiB):
    #   20 + 1048576 / (1000 * 16/1) = 85.536
    assert t("reduce", 1 << 20)[0] == pytest.approx(85.536, rel=REL)
    # A tuner's channel count scales bandwidth as for Ring: 1 of 2 channels -> 8/2 = 4 GB/s
    #   all_reduce 1 MiB: 20 + 1048576/4000 = 282.144
    assert t("all_reduce", 1 << 20, nchannels=1)[0] == pytest.approx(282.144, rel=REL)
    # Never a backup; LL/LL128 cannot run; no Direct without direct_peers.
    assert t("all_reduce", 4096)[1] is False
    for p in ("ll", "ll128"):
        assert internal.algo_time(native(CPU8D), "all_reduce", "direct", p, 4096)[0] < 0
    assert internal.algo_time(native(CPU8), "all_reduce", "direct", "simple", 4096)[0] < 0


# ---------------------------------------------------------------------------------------------
# Selection


@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("nbytes", SIZES)
def test_cpu8_with_direct_peers_plans_direct(coll, nbytes):
    # Direct beats every Ring/Tree row of cpu-8 at every size: lower latency (20 us against at
    # least 76.6 us: 6.6 + 7 hand-offs of 10 us) and higher bandwidth (e.g. all_reduce
    # 8 GB/s against ring/simple 16 * 8/14 * 0.5 = 4.57, tree/simple 3.68).
    d = select(CPU8D, coll, nbytes)
    assert (d["algorithm"], d["protocol"], d["pattern"]) == ("direct", "simple", "direct")
    assert d["func_index"] >= internal.dev_func_id("all_gather", "sum", "int8", "direct", "simple")
    # Ring/Simple's thread logic: 2 * 8 = 16 > 12 GB/s -> 512 threads (+ a sync warp) at most.
    assert 96 <= d["nthreads"] <= 512 + 32
    # The plan agrees.
    p = planner.plan([Task(coll, max(1, d["count"]), d["dtype"])], CPU8D).to_dict()
    assert p["tasks"][0]["algorithm"] == "direct"


@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("nbytes", SIZES)
def test_cpu8_without_direct_peers_keeps_ring_and_tree(coll, nbytes):
    assert select(CPU8, coll, nbytes)["algorithm"] in ("ring", "tree")


def test_masks():
    for coll in COLLS:
        # "Ring" gives ring, "Direct" gives direct, "^Direct" excludes it.
        assert select(CPU8D, coll, 4096, algorithm="Ring")["algorithm"] == "ring"
        assert select(CPU8D, coll, 1 << 26, algorithm="Direct")["algorithm"] == "direct"
        assert select(CPU8D, coll, 4096, algorithm="^Direct")["algorithm"] in ("ring", "tree")
        # Forced on a topology without direct_peers: the Ring backup runs, as for Tree.
        d = select(CPU8, coll, 4096, algorithm="Direct")
        assert d["algorithm"] == "ring"
        # Direct runs Simple only: excluding Simple leaves Ring/Tree with LL.
        d = select(CPU8D, coll, 4096, protocol="LL")
        assert (d["algorithm"], d["protocol"]) in (("ring", "ll"), ("tree", "ll"))
    assert select(CPU8D, "all_reduce", 4096, algorithm="Tree")["algorithm"] == "tree"
    # The same through planner.plan (NCCL syntax, case-insensitive).
    t = [Task("all_gather", 1 << 12, "float32")]
    assert planner.plan(t, CPU8D, algorithm="direct").tasks[0]["algorithm"] == "direct"
    assert planner.plan(t, CPU8D, algorithm="^direct").tasks[0]["algorithm"] == "ring"


def test_env_mask(monkeypatch):
    t = [Task("all_reduce", 1 << 12, "float32")]
    monkeypatch.setenv("JAX_RCCL_ALGO", "Ring")
    assert planner.plan(t, CPU8D).tasks[0]["algorithm"] == "ring"
    monkeypatch.setenv("JAX_RCCL_ALGO", "^Direct")
    assert planner.plan(t, CPU8D).tasks[0]["algorithm"] != "direct"


def test_tuner_fixing_direct():
    fix = lambda proto: lambda coll, nbytes, ops: ("direct", proto, None)  # noqa: E731
    d = select(CPU8D, "reduce", 1 << 24, tuner=fix("simple"))
    assert (d["algorithm"], d["pattern"]) == ("direct", "direct")
    with pytest.raises(ValueError, match="directPeers"):
        select(CPU8, "reduce", 4096, tuner=fix("simple"))
    with pytest.raises(ValueError, match="'simple' only"):
        select(CPU8D, "reduce", 4096, tuner=fix("ll"))


def test_amd_topology_rules_do_not_override_direct():
    # MI250X pivot rule (all_reduce <= 2200008 bytes -> tree/ll) and treeDefined (-> tree) are
    # RCCL's rules for Ring/Tree; a Direct choice holds. 24 channels x 42 GB/s: Direct
    # 1008/2 GB/s after 20 us beats ring/ll's 12 + 30 * 1.5 = 57 us at every size.
    piv = Topology.preset("mi250x-16")
    assert select(piv, "all_reduce", 4096)["algorithm"] == "tree"  # the pivot rule, no Direct
    for nbytes in (4096, 1 << 20, 1 << 26):
        d = select(piv.replace(direct_peers=True), "all_reduce", nbytes)
        assert (d["algorithm"], d["protocol"], d["pattern"]) == ("direct", "simple", "direct")
    td = Topology.preset("mi300x-8").replace(tree_defined=True)
    assert select(td, "all_reduce", 1 << 20)["algorithm"] == "tree"
    d = select(td.replace(direct_peers=True), "all_reduce", 1 << 20)
    assert d["algorithm"] == "direct"


def test_two_nodes_never_direct():
    topo = Topology.preset("mi300x-2x8").replace(direct_peers=True)
    for coll in COLLS:
        assert select(topo, coll, 1 << 20)["algorithm"] in ("ring", "tree")


# ---------------------------------------------------------------------------------------------
# Device functions


def test_dev_func_ids():
    # After the 834 Tree/Ring functions (test_select.py), Direct in generator order, Simple only:
    # all_gather 834; all_reduce 835.. (69 = 5 ops x 15 types - 6 float SumPostDiv);
    # broadcast 835 + 69 = 904; reduce 905..973; reduce_scatter 974..1042; p2p 1043.
    f = internal.dev_func_id
    assert f("all_gather", "sum", "int8", "direct", "simple") == 834
    assert f("all_reduce", "sum", "int8", "direct", "simple") == 835
    assert f("all_reduce", "sum", "float32", "direct", "simple") == 835 + 7  # float32 is type 7
    assert f("all_reduce", "prod", "int8", "direct", "simple") == 835 + 15  # after 15 sum types
    assert f("broadcast", "sum", "int8", "direct", "simple") == 904
    assert f("reduce", "sum", "int8", "direct", "simple") == 905
    assert f("reduce_scatter", "sum", "int8", "direct", "simple") == 974
    # the last: reduce_scatter sumpostdiv bool (its 69th function)
    assert f("reduce_scatter", "sumpostdiv", "bool", "direct", "simple") == 1042
    assert internal.dev_func_id_p2p() == 1043
    assert internal.num_dev_funcs() == 1044
    # Gathers and broadcasts copy bytes: one function whatever the op and type.
    assert f("all_gather", "prod", "float32", "direct", "simple") == 834
    assert f("broadcast", "minmax", "bfloat16", "direct", "simple") == 904
    # Invalid: LL/LL128 Direct, float SumPostDiv.
    for p in ("ll", "ll128"):
        for coll in COLLS:
            assert f(coll, "sum", "int8", "direct", p) == -1
    assert f("all_reduce", "sumpostdiv", "float32", "direct", "simple") == -1
    assert f("all_reduce", "sumpostdiv", "int32", "direct", "simple") >= 0


# ---------------------------------------------------------------------------------------------
# Chunking and coverage


def elements(d, task):
    return [(ch["id"], e) for ch in d["channels"] for e in ch["work"] if e.get("task") == task]


@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("dtype", ["int8", "float16", "float32", "float64"])
@pytest.mark.parametrize("count", [1, 1000, 4097, 1 << 20, 3 * (1 << 20) + 5])
def test_coverage_once_aligned_one_chunk_per_element(coll, dtype, count):
    topo = CPU8D.replace(nchannels=4)
    op = "max" if coll in ("reduce", "all_reduce", "reduce_scatter") else "sum"
    tasks = [Task(coll, count, dtype, op=op, root=3), Task("all_reduce", 777, "float32")]
    d = planner.plan(tasks, topo, algorithm="Direct").to_dict()
    t = d["tasks"][0]
    assert (t["algorithm"], t["protocol"], t["pattern"]) == ("direct", "simple", "direct")
    psize = 1 if coll in ("all_gather", "broadcast") else ITEMSIZE[dtype]
    align = 32 * 8 * 16 // psize  # Simple's alignment: warp 32 x 8 loads x 16 bytes
    pos = 0
    for _, e in sorted(elements(d, 0), key=lambda x: x[1]["offset"]):
        assert e["offset"] == pos  # no gap, no overlap
        assert e["planned_offset"] % align == 0
        # one chunk = the element
        assert e["chunk_count"] == e["last_chunk_count"] == e["planned_count"]
        assert e["root"] == (3 if coll in ("broadcast", "reduce") else 0)
        pos += e["count"]
    assert pos == count
    assert t["chunk_steps"] == t["slice_steps"] == 1


def test_element_larger_than_the_chunk_field():
    # int8 all_reduce of 40,000,000 on one channel: one element of 40e6 > 2^25 - 1 elements.
    # The chunk is capped at the largest multiple of the alignment (4096 int8) that fits 25
    # bits: (33554431 // 4096) * 4096 = 8191 * 4096 = 33550336; the last chunk holds the rest,
    # 40000000 - 33550336 = 6449664.
    topo = CPU8D.replace(nchannels=1)
    d = planner.plan([Task("all_reduce", 40_000_000, "int8")], topo).to_dict()
    assert d["tasks"][0]["algorithm"] == "direct"
    assert d["tasks"][0]["chunk_count"] == 33550336
    [(_, e)] = elements(d, 0)
    assert (e["planned_count"], e["chunk_count"], e["last_chunk_count"]) == (
        40_000_000,
        33550336,
        6449664,
    )
    # The same through computeCollChunkInfo alone: no FIFO, so buff_sizes do not matter; one
    # step per chunk: ceil(40e6 / 33550336) = 2.
    c = internal.coll_chunk_info(
        "all_reduce", "direct", "simple", "int8", 40_000_000, 1, arch="cpu",
        buff_sizes=[0, 0, 0], work_count=40_000_000,
    )  # fmt: skip
    assert (c["pattern"], c["chunk_count"], c["chunk_size"]) == ("direct", 33550336, 33550336)
    assert (c["chunk_steps"], c["slice_steps"], c["align_count"]) == (1, 1, 4096)
    assert (c["last_chunk_count"], c["steps"]) == (6449664, 2)
    # A small element is one chunk: float32 x 1000 (align 4096 B / 4 = 1024 elements).
    c = internal.coll_chunk_info(
        "reduce_scatter", "direct", "simple", "float32", 32000, 2, arch="cpu", work_count=1000
    )
    assert (c["chunk_count"], c["last_chunk_count"], c["steps"]) == (1000, 1000, 1)
    # Direct with LL never reaches chunking (selection refuses it): an internal error if it did.
    with pytest.raises(RuntimeError, match="'simple' only"):
        internal.coll_chunk_info("all_reduce", "direct", "ll", "int8", 4096, 1, arch="cpu")


def test_every_rank_plans_the_same():
    tasks = [Task(c, 12345, "float32", root=2) for c in COLLS]
    plans = [planner.plan(tasks, CPU8D, rank=r).to_dict() for r in range(8)]
    for p in plans[1:]:
        assert {k: v for k, v in p.items() if k != "rank"} == {
            k: v for k, v in plans[0].items() if k != "rank"
        }
