"""jax_rccl.explain(fn, *args): the plans of a jitted function's collectives on the CPU runtime,
8 devices: one entry per jax_rccl call in program order, per collective task the choice, its
predicted time, why, and every algorithm/protocol pair costed or ruled out; the choices are
those the runtime makes when the function runs (its JAX_RCCL_DEBUG=INFO log)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_rccl as jr

SHIFT = [(i, (i + 1) % 8) for i in range(8)]


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:8]), ("i",))


def _body(x, y):
    a = jr.psum(x, "i")
    b = jr.all_gather(y, "i", tiled=True)
    c = jr.ppermute(x, "i", SHIFT)
    d = jr.psum_scatter(x, "i", scatter_dimension=1, tiled=True)
    return a + c, b, d


def _program():
    return jax.shard_map(_body, mesh=_mesh(), in_specs=P("i"), out_specs=(P("i"),) * 3)


ARGS = (np.ones((8, 1024), np.float32), np.ones(64, np.int32))


def test_one_entry_per_call_in_program_order():
    e = jr.explain(_program(), *ARGS)
    calls = e.to_dict()["calls"]
    assert [c["kind"] for c in calls] == ["all_reduce", "all_gather", "ppermute", "reduce_scatter"]
    assert calls[0]["name"] == "psum over ('i',)"
    assert all(c["group_size"] == 8 and c["ngroups"] == 1 and c["kept"] for c in calls)
    assert len({c["call_site"] for c in calls}) == 4
    psum = calls[0]["tasks"][0]
    assert (psum["coll"], psum["dtype"], psum["count"], psum["nbytes"]) == (
        "all_reduce",
        "float32",
        1024,
        4096,
    )
    sends = [(t["coll"], t["peer"]) for t in calls[2]["tasks"]]
    assert sends == [("send", 1), ("recv", 7)]
    assert calls[3]["tasks"][0]["count"] == 128  # each device's block of the 1024


def test_every_pair_is_costed_or_ruled_out_and_the_choice_is_the_fastest_allowed():
    e = jr.explain(_program(), *ARGS)
    for call in e.to_dict()["calls"]:
        for t in call["tasks"]:
            if t["coll"] in ("send", "recv"):
                assert t["alternatives"] == [] and "JAX_RCCL_P2P_LL_THRESHOLD" in t["why"]
                continue
            alts = t["alternatives"]
            assert len(alts) == 9
            chosen = [a for a in alts if a["status"] == "chosen"]
            assert len(chosen) == 1
            assert (chosen[0]["algorithm"], chosen[0]["protocol"]) == (
                t["algorithm"],
                t["protocol"],
            )
            assert chosen[0]["time_us"] == pytest.approx(t["predicted_us"], rel=1e-5)
            for a in alts:
                if a["status"] == "allowed":
                    assert a["time_us"] >= chosen[0]["time_us"]
                if a["status"] == "cannot run":
                    assert a["time_us"] is None and a["note"]
            assert "the cost model's fastest" in t["why"]


def test_the_table_speaks_of_the_cpu_runtime():
    text = str(jr.explain(_program(), *ARGS))
    assert text.startswith("jax_rccl plans of _body on cpu: 4 call(s)")
    assert "[0] psum over ('i',): all_reduce, 1 group(s) of 8 device(s)" in text
    assert "direct/simple on 1 channel(s), predicted" in text
    assert "LL128 is not enabled on this topology" in text
    assert "lanes that thread interleaves" in text
    for gpu_word in ("threads per block", "kernel launch", "block"):
        assert gpu_word not in text, gpu_word


def test_a_forced_algorithm_is_shown_with_what_forced_it():
    f = jax.shard_map(lambda x: jr.psum(x, "i"), mesh=_mesh(), in_specs=P("i"), out_specs=P("i"))
    with jr.config(algorithm="Ring"):
        e = jr.explain(f, np.ones((8, 1 << 16), np.float32))
    (call,) = e.to_dict()["calls"]
    t = call["tasks"][0]
    assert call["algorithm_setting"] == "Ring"
    assert t["algorithm"] == "ring"
    direct = next(a for a in t["alternatives"] if a["algorithm"] == "direct")
    assert direct["status"] == "excluded"
    assert direct["note"] == "excluded by jax_rccl.config(algorithm='Ring')"
    assert "of those jax_rccl.config(algorithm='Ring') allows" in t["why"]


def test_a_jitted_function_and_one_without_collectives():
    jitted = jax.jit(_program())
    assert len(jr.explain(jitted, *ARGS).calls) == 4
    e = jr.explain(lambda x: x + 1, np.ones(3))
    assert e.calls == [] and "0 call(s)" in str(e)


RUN = """
import jax, numpy as np, jax_rccl as jr
from jax.sharding import Mesh, PartitionSpec as P
import json, sys
sys.path.insert(0, {here!r})
from test_explain import ARGS, _program
e = jr.explain(_program(), *ARGS)
print("EXPLAIN", json.dumps([[c["name"], [[t["coll"], t["algorithm"], t["protocol"],
      t["nchannels"]] for t in c["tasks"]]] for c in e.to_dict()["calls"]]))
out = jax.jit(_program())(*ARGS)
jax.block_until_ready(out)
"""


def test_the_plans_are_the_runtimes():
    """The runtime logs each plan it builds (JAX_RCCL_DEBUG=INFO): the same choices."""
    env = dict(
        os.environ,
        JAX_RCCL_DEBUG="INFO",
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
    )
    code = RUN.format(here=os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(
        [sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("EXPLAIN ")]
    explained = {
        (name, i): tuple(t) for name, tasks in json.loads(line[8:]) for i, t in enumerate(tasks)
    }
    ran = {}
    pattern = r"jax_rccl INFO (.+?): rank 0 task (\d+) (\w+) \w+ x \d+: (\w+)/(\w+), (\d+) channel"
    for m in re.finditer(pattern, r.stderr):
        name, i, coll, algo, proto, nch = m.groups()
        ran[(name, int(i))] = (coll, algo, proto, int(nch))
    assert len(ran) == len(explained) == 5, (ran, explained)
    for key, (coll, algo, proto, nch) in explained.items():
        want = ran[key]
        assert want[0] == coll and want[2] == proto and want[3] == nch, (key, want)
        assert want[1] == (algo if coll not in ("send", "recv") else "p2p"), (key, want)


def test_gpu_plans_use_the_gpu_runtimes_topology(monkeypatch):
    """On a GPU the topology is the GPU runtime's (its build's architecture, LL128 where its
    device code has it); without a GPU runtime in the build, the error says so."""
    from jax_rccl import _explain, _ffi

    monkeypatch.setattr(_ffi, "_native_gpu", lambda: None)
    with pytest.raises(NotImplementedError, match="no GPU runtime"):
        _explain._topology("cuda", [], 4)

    class FakeGpu:
        def build_info(self):
            return "HIP 6.2"

        def has_ll128(self):
            return True

    monkeypatch.setattr(_ffi, "_native_gpu", FakeGpu)
    topo, note = _explain._topology("rocm", [], 4)
    assert (topo.arch, topo.nranks, topo.ll128) == ("gfx942", 4, True)
    assert "GPU runtime's starting topology" in note


def test_point_to_point_tasks_share_a_line_per_kind():
    f = jax.shard_map(
        lambda x: jr.all_to_all(x, "i", 0, 0, tiled=True),
        mesh=_mesh(),
        in_specs=P("i"),
        out_specs=P("i"),
    )
    e = jr.explain(f, np.ones((64, 4), np.float32))
    (call,) = e.to_dict()["calls"]
    assert [t["peer"] for t in call["tasks"] if t["coll"] == "send"] == list(range(8))
    text = str(e)
    assert "send float32 x 4 (16 B) each -> ranks 0-7: point-to-point" in text
    assert "recv float32 x 4 (16 B) each <- ranks 0-7: point-to-point" in text
