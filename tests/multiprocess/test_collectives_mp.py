"""jax_rccl across JAX processes on one host: the bootstrap, every public collective against
NumPy, forced algorithms, a process that dies, processes that disagree, and no shared memory
left behind. Each test starts its own processes (launcher.py, worker.py), each launch bounded.
"""

from __future__ import annotations

import os
import re
import time

import pytest
from launcher import launch, shm_entries
from nets import BACKENDS, NETS

TIMEOUT = 5.0  # JAX_RCCL_TIMEOUT in the processes


def _ok(procs, *, expect_rc=0):
    for p in procs:
        assert not p.timed_out, p.describe()
        assert p.result is not None and p.result.get("ok"), p.describe()
        if expect_rc is not None:
            assert p.returncode == expect_rc, p.describe()
    return [p.result for p in procs]


def _no_segments(results):
    sessions = {r.get("session") for r in results if r.get("session")}
    for s in sessions:
        assert shm_entries(s) == [], f"session {s} left {shm_entries(s)} in /dev/shm"


# --- bootstrap ---------------------------------------------------------------------------------


def test_single_process_has_no_world():
    from jax_rccl import _bootstrap

    assert _bootstrap.ensure_world() is None
    assert _bootstrap.world() is None


def test_world_table():
    res = _ok(launch("probe", 2, 2, args=("--bootstrap",), timeout=60))
    worlds = [r["world"] for r in res]
    assert [w["process"] for w in worlds] == [0, 1]
    assert len({w["session"] for w in worlds}) == 1
    assert all(len(w["session"]) >= 16 and int(w["session"], 16) >= 0 for w in worlds)
    devices = worlds[0]["devices"]
    assert all(w["devices"] == devices and w["nprocesses"] == 2 for w in worlds)
    jax_view = sorted(tuple(d) for d in res[0]["devices"])  # (id, process_index)
    assert sorted((d["id"], d["process"]) for d in devices) == jax_view
    assert len({d["host"] for d in devices}) == 1
    assert [p["devices"] for p in res[0]["peers"]] == [r["local"] for r in res]
    for r in res:
        if "native_world" in r:  # the runtime keeps what it was given
            assert r["native_world"] == r["world"]


def test_bootstrap_names_a_missing_process():
    procs = launch(
        "killed",
        3,
        1,
        args=("--victim=2", "--when=before", "--shutdown-timeout=1"),
        timeout=60,
        jax_rccl_timeout=2.0,
    )
    assert procs[2].returncode == -9
    for r in _ok(procs[:2], expect_rc=None):
        assert r["raised"], r
        assert "process(es) [2] never did" in r["error"], r["error"]
        assert r["seconds"] < 2.0 + 5, r


def test_lowering_meets_nobody():
    """Lowering, compiling and exporting on one process while the others are elsewhere takes no
    bootstrap (it would wait JAX_RCCL_TIMEOUT for them and fail); the first run meets them."""
    res = _ok(launch("lower_only", 2, 2, timeout=90, jax_rccl_timeout=5.0))
    assert res[0]["world_after_lowering"] == [None, None], res[0]
    assert res[0]["lower_seconds"] < 5.0, res[0]
    assert [r["world_after_running"] for r in res] == [2, 2], res


def test_harness_against_jax_lax():
    """The NumPy twin of the checks agrees with jax.lax across processes (gloo)."""
    _ok(launch("collectives", 2, 2, args=("--backend=lax", "--sizes=64"), timeout=60))


# --- collectives in the runtime -----------------------------------------------------------------


@pytest.mark.needs_world
@pytest.mark.parametrize("nprocs,local", [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_every_collective(nprocs, local):
    """All collectives in one program, chained into one order (see the next test)."""
    res = _ok(
        launch(
            "collectives", nprocs, local, args=("--chain",), timeout=90, jax_rccl_timeout=TIMEOUT
        )
    )
    _no_segments(res)


@pytest.mark.needs_world
def test_independent_collectives_in_one_program():
    """The same program without data dependencies between its 14 collectives: the lowering
    chains jax_rccl's calls into program order, so every process runs them in the same order."""
    res = _ok(
        launch(
            "collectives", 2, 1, args=("--sizes=64,40000",), timeout=90, jax_rccl_timeout=TIMEOUT
        )
    )
    _no_segments(res)


@pytest.mark.needs_world
@pytest.mark.parametrize("transport", ["shm", "socket"])
@pytest.mark.parametrize("algo", ["Ring", "Tree"])
def test_forced_algorithm(algo, transport):
    res = _ok(
        launch(
            "collectives",
            2,
            2,
            args=(f"--algo={algo}", "--sizes=64,40000", "--chain"),
            env={"JAX_RCCL_TRANSPORT": transport},
            timeout=90,
            jax_rccl_timeout=TIMEOUT,
        )
    )
    _no_segments(res)


def _survivors_of_a_kill(env=None):
    """The reports of processes 0 and 1 of three, process 2 killed after the first collective."""
    procs = launch(
        "killed",
        3,
        1,
        args=("--victim=2", "--when=after", "--shutdown-timeout=1"),
        env=env,
        timeout=60,
        jax_rccl_timeout=TIMEOUT,
    )
    assert procs[2].returncode == -9, procs[2].describe()
    return _ok(procs[:2], expect_rc=None)  # JAX's own shutdown then aborts: a peer is gone


@pytest.mark.needs_world
def test_killed_process_is_an_error_not_a_hang():
    res = _survivors_of_a_kill()
    for r in res:
        assert r["raised"], r
        assert r["seconds"] < TIMEOUT + 5, r
        assert "process " in r["error"], r["error"]
    # The rank a survivor waits for may itself be a survivor that is stuck (a ring): at least
    # one error names the dead process.
    assert any("process 2" in r["error"] for r in res), [r["error"] for r in res]
    _no_segments(res)


@pytest.mark.needs_world
def test_mismatched_counts_are_an_error():
    res = _ok(launch("mismatch", 2, 1, timeout=60, jax_rccl_timeout=TIMEOUT))
    for r in res:
        assert r["raised"], r
        assert r["seconds"] < TIMEOUT + 5, r
    _no_segments(res)


@pytest.fixture(scope="module", autouse=True)
def _segments_before():
    return set(shm_entries())


def test_no_segments_left(_segments_before):
    """No jax_rccl shared memory appeared during this module and stayed (a concurrent run's
    transient segments get a few seconds to go)."""
    deadline = time.monotonic() + 3
    while True:
        left = sorted(set(shm_entries()) - _segments_before)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert left == [], left


# --- between hosts: sockets ----------------------------------------------------------------------

SOCKET = {"JAX_RCCL_TRANSPORT": "socket"}


@pytest.mark.needs_world
@pytest.mark.parametrize("nprocs,local", [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_every_collective_over_sockets(nprocs, local):
    """JAX_RCCL_TRANSPORT=socket: every process pair talks over loopback TCP."""
    res = _ok(
        launch(
            "collectives",
            nprocs,
            local,
            args=("--chain", "--sizes=64,40000"),
            env=SOCKET,
            timeout=90,
            jax_rccl_timeout=TIMEOUT,
        )
    )
    _no_segments(res)
    if os.path.isdir("/proc/self/task"):  # the transport's threads are named (top -H, ps -L)
        assert {"jrccl proxy", "jrccl accept"} <= set(res[0]["threads"]), res[0]


def _planned_nodes(proc) -> set[int]:
    """The node counts in a process's plan lines (JAX_RCCL_DEBUG=INFO)."""
    found = re.findall(r"jax_rccl INFO .* (\d+) node\(s\)$", proc.stderr, re.MULTILINE)
    assert found, proc.describe()
    return {int(n) for n in found}


@pytest.mark.needs_world
@pytest.mark.parametrize(
    "hosts,nodes",
    [
        ("AABB", 2),  # hosts holding equal runs of consecutive ranks: a node each
        ("AAAB", 4),  # unequal runs: every rank its own node (no hop costed as one within a node)
        ("ABAB", 4),  # a host's ranks not consecutive: likewise
    ],
)
def test_fake_hosts_mix_shm_and_sockets(hosts, nodes):
    """JAX_RCCL_HOSTNAME puts process i on host `hosts[i]`: shared memory within a host, sockets
    between (the default transport); every collective right, and the plans' topology has the
    nodes the layout allows (the planner's nodes hold equal runs of consecutive ranks)."""
    procs = launch(
        "collectives",
        4,
        1,
        args=("--chain", "--sizes=64,40000"),
        env={"JAX_RCCL_DEBUG": "INFO"},
        env_of=lambda i: {"JAX_RCCL_HOSTNAME": f"host{hosts[i]}"},
        timeout=90,
        jax_rccl_timeout=TIMEOUT,
    )
    res = _ok(procs)
    assert res[0]["hosts"] == ["hostA", "hostB"]
    assert _planned_nodes(procs[0]) == {nodes}
    _no_segments(res)


@pytest.mark.needs_world
@pytest.mark.parametrize("net", NETS)
def test_every_collective_across_fake_hosts_on_each_network(net):
    """Two faked hosts of two processes (shared memory within a host): the groups across the
    hosts move their steps on our TCP or on UCX (over its TCP or its shared-memory transports),
    every collective right, and the connections say they ran on UCX where it was asked for."""
    procs = launch(
        "collectives",
        4,
        1,
        args=("--chain", "--sizes=64,40000"),
        env={"JAX_RCCL_DEBUG": "INFO", **BACKENDS[net]},
        env_of=lambda i: {"JAX_RCCL_HOSTNAME": f"host{'AABB'[i]}"},
        timeout=90,
        jax_rccl_timeout=TIMEOUT,
    )
    res = _ok(procs)
    _no_segments(res)
    ucx = re.findall(r"jax_rccl INFO net: channel \d+, .*: UCX \S+ over", procs[0].stderr)
    if net == "socket":
        assert ucx == [], ucx
    else:
        assert ucx, procs[0].describe()


@pytest.mark.needs_world
def test_tcp_runs_where_ucx_cannot_be_loaded(tmp_path):
    """A process where UCX cannot be loaded (its `libucx` does not import, no system libucp):
    JAX_RCCL_NET=auto and socket run the group across faked hosts on our TCP; ucx fails naming
    the variable and what to do."""
    (tmp_path / "libucx.py").write_text("raise ImportError('no UCX here')\n")
    no_ucx = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for net in ("auto", "socket"):
        procs = launch(
            "collectives",
            2,
            1,
            args=("--sizes=64",),
            env={"JAX_RCCL_NET": net, **no_ucx},
            env_of=lambda i: {"JAX_RCCL_HOSTNAME": f"host{i}"},
            timeout=90,
            jax_rccl_timeout=TIMEOUT,
        )
        _ok(procs)
    procs = launch(
        "collectives",
        2,
        1,
        args=("--sizes=64",),
        env={"JAX_RCCL_NET": "ucx", **no_ucx},
        env_of=lambda i: {"JAX_RCCL_HOSTNAME": f"host{i}"},
        timeout=90,
        jax_rccl_timeout=TIMEOUT,
    )
    for p in procs:
        text = p.stdout + p.stderr
        assert "JAX_RCCL_NET=ucx" in text and "UCX could not be loaded" in text, p.describe()


@pytest.mark.needs_world
@pytest.mark.parametrize("net", NETS)
def test_killed_process_over_sockets_is_an_error_not_a_hang(net):
    res = _survivors_of_a_kill({**SOCKET, **BACKENDS[net]})
    for r in res:
        assert r["raised"], r
        assert r["seconds"] < TIMEOUT, r  # the closed sockets stop the survivors early
    assert any("process 2" in r["error"] for r in res), [r["error"] for r in res]


@pytest.mark.needs_world
def test_bad_transport_value_names_the_allowed_ones():
    procs = launch(
        "collectives",
        2,
        1,
        args=("--sizes=64",),
        env={"JAX_RCCL_TRANSPORT": "tcp"},
        timeout=60,
        jax_rccl_timeout=TIMEOUT,
    )
    for p in procs:
        assert not p.timed_out, p.describe()
        assert p.result is not None and not p.result.get("ok"), p.describe()
        assert "JAX_RCCL_TRANSPORT='tcp'" in p.result["error"], p.result["error"]
        assert "auto, shm, socket" in p.result["error"], p.result["error"]
