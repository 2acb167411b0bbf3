"""jax_rccl.profile(): per call site, what the collectives run inside a block did, on 8 CPU
devices: calls, executions (as runtime_stats() counts them), bytes, time, the plan's choice and
the bus bandwidth; the table; plot() with matplotlib as an optional extra."""

from __future__ import annotations

import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_rccl as jr


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:8]), ("i",))


def _program():
    def body(x):
        s = jr.psum(x, "i")
        return jr.all_gather(s, "i", tiled=True)

    return jax.shard_map(body, mesh=_mesh(), in_specs=P("i"), out_specs=P("i"))


X = np.ones((8, 2048), np.float32)  # each device: 2048 floats, 8 KiB


@pytest.fixture(scope="module")
def profiled():
    f = jax.jit(_program())
    f(X).block_until_ready()  # compiled and planned outside the block
    with jr.profile() as p:
        assert p.running
        for _ in range(10):
            f(X).block_until_ready()
    return p


def test_the_figures_match_runtime_stats(profiled):
    p = profiled
    assert not p.running
    assert sum(r["executions"] for r in p.rows) == p.runtime_stats["executions"] == 160
    assert p.runtime_stats["plans_built"] == 0  # planned before the block
    by_kind = {r["kind"]: r for r in p.rows}
    assert set(by_kind) == {"all_reduce", "all_gather"}
    psum, gather = by_kind["all_reduce"], by_kind["all_gather"]
    assert psum["name"] == "psum over ('i',)" and gather["name"] == "all_gather over ('i',)"
    for r in (psum, gather):
        assert (r["calls"], r["executions"], r["group_size"]) == (10, 80, 8)
        assert r["seconds"] > 0
        assert r["mean_us"] == pytest.approx(r["seconds"] / 80 * 1e6)
    assert psum["bytes"] == 80 * 8192  # a device's operand per execution
    assert gather["bytes"] == 80 * 8 * 8192  # a device's result (NCCL's tests' size)


def test_the_choice_is_the_plans_and_the_bus_bandwidth_nccls(profiled):
    plans = jr.explain(_program(), X).to_dict()["calls"]
    chosen = {c["kind"]: (c["tasks"][0]["algorithm"], c["tasks"][0]["protocol"]) for c in plans}
    for r in profiled.rows:
        assert (r["algorithm"], r["protocol"]) == chosen[r["kind"]]
        algbw = r["bytes"] / r["executions"] / (r["mean_us"] * 1e-6) / 1e9
        factor = {"all_reduce": 2 * 7 / 8, "all_gather": 7 / 8}[r["kind"]]
        assert r["algbw_gbs"] == pytest.approx(algbw)
        assert r["busbw_gbs"] == pytest.approx(algbw * factor)


def test_only_the_blocks_calls_count():
    f = jax.jit(
        jax.shard_map(lambda x: jr.pmax(x, "i"), mesh=_mesh(), in_specs=P("i"), out_specs=P("i"))
    )
    f(X).block_until_ready()
    with jr.profile() as p:
        f(X).block_until_ready()
        f(X).block_until_ready()
    assert [(r["name"], r["calls"], r["executions"]) for r in p.rows] == [
        ("pmax over ('i',)", 2, 16)
    ]
    with jr.profile() as empty:
        pass
    assert empty.rows == [] and empty.runtime_stats["executions"] == 0


def test_the_table(profiled):
    text = profiled.table()
    lines = text.splitlines()
    assert lines[0].split() == [
        "call", "site", "kind", "calls", "execs", "bytes/exec", "time/exec", "total",
        "algo/proto", "busbw",
    ]  # fmt: skip
    assert any(ln.startswith("psum over ('i',)") and "8 KiB" in ln for ln in lines)
    assert any(ln.startswith("all_gather over ('i',)") and "64 KiB" in ln for ln in lines)
    assert lines[-1].split()[:3] == ["total", "20", "160"]
    assert "GB/s" in text and str(profiled) == text
    d = profiled.to_dict()
    assert d["rows"] == profiled.rows and d["runtime_stats"]["executions"] == 160


def test_plot_without_matplotlib_names_the_extra(profiled, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(
        ImportError, match=r"needs matplotlib, the 'plot' extra: .*jax_rccl\[plot\]"
    ):
        profiled.plot()


def test_plot_draws_one_bar_per_call_site(profiled, tmp_path):
    pytest.importorskip("matplotlib")
    fig = profiled.plot(str(tmp_path / "profile.png"))
    (ax,) = fig.axes
    assert len(ax.patches) == len(profiled.rows)
    assert (tmp_path / "profile.png").stat().st_size > 0
