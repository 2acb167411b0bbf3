"""The planner's Python contract: Topology, Task, plan(), explain(), Plan.to_dict()/to_json()."""

import json

import numpy as np
import pytest

from jax_rccl import planner
from jax_rccl.planner import Task, Topology

PRESETS = ["mi300x-8", "mi250x-8", "mi250x-16", "h100-8", "cpu-8", "mi300x-2x8"]


def coverage(d, index):
    """Sorted [offset, offset+count) ranges of task `index` over all channels."""
    return sorted(
        (e["offset"], e["offset"] + e["count"])
        for ch in d["channels"]
        for e in ch["work"]
        if e["task"] == index
    )


def assert_covers_once(ranges, count):
    pos = 0
    for lo, hi in ranges:
        assert lo == pos, f"gap or overlap at {pos}: next range starts at {lo}"
        assert hi > lo or count == 0
        pos = hi
    assert pos == count


@pytest.mark.parametrize("name", PRESETS)
def test_presets_plan_an_all_reduce(name):
    topo = Topology.preset(name)
    d = planner.plan([Task("all_reduce", 1 << 20, "float32")], topo).to_dict()
    t = d["tasks"][0]
    for key in ("coll", "algorithm", "protocol", "nchannels", "nthreads", "chunk_size", "count"):
        assert key in t
    assert t["algorithm"] in ("ring", "tree")
    assert t["protocol"] in ("ll", "ll128", "simple")
    assert 1 <= t["nchannels"] <= topo.nchannels
    assert_covers_once(coverage(d, 0), 1 << 20)
    for ch in d["channels"]:
        assert set(ch) >= {"id", "work"}
        assert 0 <= ch["id"] < 128


def test_unknown_preset_names_the_allowed_ones():
    with pytest.raises(ValueError, match="mi300x-8"):
        Topology.preset("mi999")


def test_task_accepts_numpy_and_jax_dtypes():
    import jax.numpy as jnp

    assert Task("all_reduce", 4, np.float32).dtype == "float32"
    assert Task("all_reduce", 4, jnp.bfloat16).dtype == "bfloat16"
    assert Task("all_reduce", 4, np.dtype("int8")).dtype == "int8"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(coll="alltoall", count=4), "coll must be one of"),
        (dict(coll="all_reduce", count=-1), "count must be"),
        (dict(coll="all_reduce", count=4, op="xor"), "op must be one of"),
        (dict(coll="send", count=4), "peer is required"),
    ],
)
def test_task_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Task(**kwargs)


@pytest.mark.parametrize(
    "tasks, match",
    [
        ([Task("broadcast", 4, root=8)], r"root 8.*0\.\.7"),
        ([Task("reduce", 4, root=-1)], "invalid root"),
        ([Task("send", 4, peer=9)], r"peer 9.*0\.\.7"),
        ([Task("all_reduce", 4, "complex64")], "dtype: unknown value 'complex64'"),
        ([Task("all_reduce", 4, op=12345)], "user op"),
        ([Task("all_reduce", 1 << 40, "float32")], "too large"),
    ],
)
def test_plan_errors_name_the_argument(tasks, match):
    with pytest.raises(ValueError, match=match):
        planner.plan(tasks, "mi300x-8")


def test_rank_out_of_range():
    with pytest.raises(ValueError, match=r"rank must be in 0\.\.7"):
        planner.plan([Task("all_reduce", 4)], "mi300x-8", rank=8)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("nchannels", 0, "nchannels must be in 1..128"),
        ("nchannels", 129, "nchannels must be in 1..128"),
        ("p2p_nchannels_per_peer", 3, "power of two"),
        ("work_fifo_depth", 100, "work_fifo_depth must be a power of two"),
        ("bw_intra", 0.0, "bw_intra must be > 0"),
    ],
)
def test_topology_errors_name_the_field(field, value, match):
    topo = Topology.preset("mi300x-8").replace(**{field: value})
    with pytest.raises(ValueError, match=match):
        planner.plan([Task("all_reduce", 4)], topo)


def test_topology_python_validation():
    with pytest.raises(ValueError, match="nnodes must be"):
        Topology(nranks=8, nnodes=3)
    with pytest.raises(ValueError, match="arch must be one of"):
        Topology(nranks=8, arch="gfx1100")
    with pytest.raises(ValueError, match="link must be one of"):
        Topology(nranks=8, link="infiniband")


def test_algorithm_override_and_syntax():
    topo = Topology.preset("mi300x-8")
    t = [Task("all_reduce", 1 << 18, "float32")]
    assert planner.plan(t, topo, algorithm="Tree").tasks[0]["algorithm"] == "tree"
    assert planner.plan(t, topo, algorithm="ring").tasks[0]["algorithm"] == "ring"
    assert planner.plan(t, topo, algorithm="^Tree").tasks[0]["algorithm"] == "ring"
    assert planner.plan(t, topo, protocol="LL").tasks[0]["protocol"] == "ll"
    assert planner.plan(t, topo, protocol="^LL,LL128").tasks[0]["protocol"] == "simple"
    with pytest.raises(ValueError, match="JAX_RCCL_ALGO.*allowed: tree, ring, direct"):
        planner.plan(t, topo, algorithm="CollNet")
    with pytest.raises(ValueError, match="leaves nothing"):
        planner.plan(t, topo, algorithm="^Tree,Ring,Direct")


def test_env_overrides_apply_when_no_argument(monkeypatch):
    topo = Topology.preset("mi300x-8")
    t = [Task("all_reduce", 1 << 18, "float32")]
    monkeypatch.setenv("JAX_RCCL_ALGO", "Tree")
    monkeypatch.setenv("JAX_RCCL_PROTO", "LL")
    d = planner.plan(t, topo).tasks[0]
    assert (d["algorithm"], d["protocol"]) == ("tree", "ll")
    # An explicit argument wins over the environment.
    assert planner.plan(t, topo, algorithm="Ring").tasks[0]["algorithm"] == "ring"


def test_zero_count_tasks_plan_nothing():
    d = planner.plan([Task("all_reduce", 0), Task("all_gather", 0, "int8")], "mi300x-8").to_dict()
    assert d["kernels"] == []
    assert coverage(d, 0) == [] and coverage(d, 1) == []
    assert all(t["kernel"] == -1 for t in d["tasks"])


def test_one_rank_is_a_copy():
    topo = Topology(nranks=1)
    d = planner.plan(
        [Task("all_reduce", 100, op="avg"), Task("all_gather", 7, "int32")], topo
    ).to_dict()
    assert d["one_rank"] and d["kernels"] == []
    assert_covers_once(coverage(d, 0), 100)
    assert_covers_once(coverage(d, 1), 7)
    assert {e["type"] for ch in d["channels"] for e in ch["work"]} == {"copy"}
    # avg on floats with one rank multiplies by 1/1: a PreMulSum scaling.
    assert d["tasks"][0]["dev_op"] == "premulsum"


def test_all_gather_offsets_are_in_task_elements():
    # all_gather is planned in bytes (RCCL converts count and dtype); elements come back in
    # elements of the task's dtype.
    d = planner.plan([Task("all_gather", 1_000_003, "float32")], "mi300x-8").to_dict()
    assert_covers_once(coverage(d, 0), 1_000_003)
    e = d["channels"][0]["work"][0]
    assert e["planned_count"] == 4 * e["count"]


def test_to_json_round_trips():
    p = planner.plan([Task("all_reduce", 4096), Task("send", 10, peer=1)], "mi300x-8")
    assert json.loads(p.to_json()) == json.loads(json.dumps(p.to_dict()))


def test_explain_mentions_the_choice():
    text = planner.explain([Task("all_reduce", 1 << 18, "float32")], "mi300x-8")
    d = planner.plan([Task("all_reduce", 1 << 18, "float32")], "mi300x-8").tasks[0]
    assert f"{d['algorithm']} / {d['protocol']}" in text
    assert "kernel 0" in text
    assert "rank 0 of 8" in text


def test_explain_says_why_a_requested_choice_was_overridden():
    # mi300x-8 is one gfx942 node: RCCL has no Tree/Simple there, so Ring's backup runs.
    args = ([Task("all_reduce", 1 << 22, "float32")], "mi300x-8")  # 16 MiB
    p = planner.plan(*args, algorithm="tree", protocol="simple")
    d = p.to_dict()["tasks"][0]
    assert (d["algorithm"], d["protocol"]) == ("ring", "simple")
    assert "tree/simple: RCCL has no Tree/Simple on a single gfx94x node" in d["choice_note"]
    assert "ring/simple runs instead" in d["choice_note"]
    text = planner.explain(*args, algorithm="tree", protocol="simple")
    assert "ring / simple" in text
    assert f"not the requested choice: {d['choice_note']}" in text
    # A request the cost model can serve has no note.
    plain = planner.plan(*args, algorithm="ring", protocol="simple")
    assert plain.to_dict()["tasks"][0]["choice_note"] is None
    assert "not the requested choice" not in plain.explain()


def test_explain_of_a_large_group_stays_one_line_pair_per_task():
    tasks = [Task("all_reduce", 1024 * (i + 1)) for i in range(50)]
    text = planner.explain(tasks, "mi300x-8")
    assert text.count("\n[") == 50
    assert len(text.splitlines()) < 50 * 5


def test_persistent_layout_links_each_channel():
    p = planner.plan(
        [Task("all_reduce", 1 << 24, "float32")], "mi300x-8", algorithm="Ring", protocol="Simple"
    )
    works = p.layout(0)
    k = p.kernels[0]
    assert len(works) == k["nwork"]
    # Channel j's first work sits at index j (channels are numbered densely from 0 here); each
    # list ends with exactly one work marked last.
    assert sum(w["is_last"] for w in works) == k["channel_count"]
