"""GPU groups across hosts: JAX processes sharing one GPU under MPS, split into two fake hosts.

Processes [0, n/2) say they run on 'hostA', the rest on 'hostB' (JAX_RCCL_HOSTNAME): ranks of one
host trade IPC handles, ranks of the other host are reached through the network proxy over loopback:
our TCP, and UCX where it is installed (the tests of the collectives, the step, the thousand steps
and the fault run on both; tests/nets.py). 2 and 4 processes, XLA command buffers on and off: every
collective under Ring and Tree, LL and Simple (and LL128 where the build has it) at 1, 1001, 65537
and 2^20 elements per rank against NumPy; the six-collective jitted step at 4 and 16 MB per rank
with every connection's counters in step at the end; 1,000 steps checked on the device; a process of
hostB that exits before its second step (the survivors raise, naming a rank, within the timeout).
Other layouts: 4 processes on hosts of unequal or separated runs of ranks, 6 on three hosts, 8 on
two: every collective against NumPy and the plans' node count. Programs: worker_step_gpu.py and
worker_loop_gpu.py (with --world), worker_collectives_cross_host_gpu.py,
worker_setting_cross_host_gpu.py and worker_fault_cross_host_gpu.py.
"""

from __future__ import annotations

import os
import re

import pytest
from gpu_launch import (  # noqa: F401 - mps_env: the fixture, visible to pytest here
    mps_env,
    run_step_processes,
    worker,
)
from nets import GPU_BACKENDS, GPU_NETS

pytestmark = pytest.mark.gpu

HOSTS = ["hostA", "hostB"]


def _two_hosts(nprocs: int, extra: dict | None = None):
    """env_of for run_step_processes: processes [0, n/2) on hostA, the rest on hostB."""

    def env_of(p: int) -> dict:
        return {"JAX_RCCL_HOSTNAME": HOSTS[0] if p < nprocs // 2 else HOSTS[1], **(extra or {})}

    return env_of


# The step and loop workers with --world: a second RESULT line (merged) of what the world table
# says about hosts.
WORLD = ("--world",)
STEP_WORKER = worker("worker_step_gpu.py")
LOOP_WORKER = worker("worker_loop_gpu.py")
COLLECTIVES_WORKER = worker("worker_collectives_cross_host_gpu.py")
SETTING_WORKER = worker("worker_setting_cross_host_gpu.py")
FAULT_WORKER = worker("worker_fault_cross_host_gpu.py")


def _check_world(results: list, nprocs: int) -> None:
    """Each process claimed the host it was given, and every world table has both hosts."""
    assert [r["process"] for r in results] == list(range(nprocs))
    for p, r in enumerate(results):
        want = HOSTS[0] if p < nprocs // 2 else HOSTS[1]
        assert r["host"] == want, (p, r["host"], want)
        assert r["host_of_rank"] == results[0]["host_of_rank"], (p, r["host_of_rank"])
    hosts = results[0]["host_of_rank"]
    assert sorted(set(hosts)) == HOSTS, hosts
    assert hosts == sorted(hosts), f"the ranks of a host must be consecutive: {hosts}"


def _check_counters(results: list) -> dict:
    """Every connection ends in step: the steps a sender posted (its own region's copy of its send
    tail, kept there also for a receiver on another host) are the receiver's tail (posted by the
    network proxy for a sender on another host) and head. Returns the steps moved, by whether the
    connection crosses hosts, and (key "channels across hosts") the channels whose connections
    across hosts moved any step."""
    hosts = results[0]["host_of_rank"]
    by_rank = {
        r["rank"]: {(c, p): (t, h, st) for c, p, t, h, st, _ in r["counters"]} for r in results
    }
    assert sorted(by_rank) == list(range(len(results)))
    moved = {"across hosts": 0, "same host": 0}
    channels_across: set = set()
    for s, conns in by_rank.items():
        for (c, p), (_, _, sent) in conns.items():
            if p == s:
                continue
            across = hosts[s] != hosts[p]
            kind = "across hosts (network proxy)" if across else "on one host (IPC)"
            assert (c, s) in by_rank[p], (
                f"rank {p} reports no connection from rank {s} on channel {c} ({kind})"
            )
            tail, head, _ = by_rank[p][(c, s)]
            assert sent == head == tail, (
                f"connection rank {s} -> rank {p}, channel {c}, {kind}: the sender's own region "
                f"says {sent} steps sent, the receiver's region has tail {tail} and head {head}; "
                "all three must be equal once every rank finished"
            )
            moved["across hosts" if across else "same host"] += sent
            if across and sent > 0:
                channels_across.add(c)
    return {**moved, "channels across hosts": channels_across}


def _no_segments(results: list) -> None:
    sessions = {r["session"] for r in results}
    left = [f for f in os.listdir("/dev/shm") for s in sessions if f.startswith(f"jrccl.{s}.")]
    assert not left, left


def _step_across_hosts(mps_env, nprocs: int, count: int, cb: bool, env=None) -> dict:  # noqa: F811
    """Three jitted six-collective steps (worker_step_gpu.py) on two faked hosts with `env`: every
    result right, no runtime error, every connection's counters in step, some steps across hosts,
    no segment left. Returns _check_counters'."""
    results = run_step_processes(
        mps_env,
        nprocs,
        count,
        3,
        cb,
        STEP_WORKER,
        args=WORLD,
        env_of=_two_hosts(nprocs, env),
    )
    _check_world(results, nprocs)
    for r in results:
        assert r["bad"] == {}, r["bad"]
        assert r["errors"] == 0, r["errors"]
    moved = _check_counters(results)
    assert moved["across hosts"] > 0, moved
    _no_segments(results)
    return moved


# --- every collective against NumPy -----------------------------------------------------------


@pytest.mark.parametrize("net", GPU_NETS)
@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
@pytest.mark.parametrize("nprocs", [2, 4])
def test_every_collective_across_two_hosts(mps_env, net, nprocs, cb):  # noqa: F811
    """psum, pmax (Ring and Tree), all_gather, psum_scatter, pbroadcast, ppermute and all_to_all
    (Ring) under every protocol at 1, 1001, 65537 and 2^20 float32 elements (4 MB) per rank,
    each result against NumPy; the connections end in step and some steps crossed hosts."""
    count = 1 << 20
    results = run_step_processes(
        {**mps_env, **GPU_BACKENDS[net]},
        nprocs,
        count,
        1,
        cb,
        COLLECTIVES_WORKER,
        env_of=_two_hosts(nprocs),
        timeout=480,
    )
    _check_world(results, nprocs)
    for r in results:
        assert r["n"] == nprocs, r["n"]
        per_count = sum(2 if algo == "Tree" else 7 for algo, _ in r["configs"])
        assert r["checks"] == len(r["counts"]) * per_count, (r["checks"], r["configs"])
        assert r["errors"] == 0, r["errors"]
    moved = _check_counters(results)
    assert moved["across hosts"] > 0, moved
    _no_segments(results)


@pytest.mark.parametrize("net", GPU_NETS)
@pytest.mark.parametrize(
    "layout, nodes",
    [
        ("AAAB", 4),  # unequal runs: a node per rank (the socket rows on every hop)
        ("ABAB", 4),  # a host's ranks apart: likewise
        ("AABBCC", 3),  # three hosts of equal runs: a node each
        ("AAAABBBB", 2),  # 8 ranks on two hosts (16 channels)
    ],
)
def test_every_collective_on_other_layouts(mps_env, net, layout, nodes):  # noqa: F811
    """Process p on host `layout[p]`. The planner's nodes hold equal runs of consecutive ranks:
    a group laid out so plans a node per host; otherwise (hostA holding 3 ranks and hostB 1, or
    each host's ranks apart) every rank its own node, so that no hop that may cross hosts is
    costed as one within a host. Every collective under every configuration right against
    NumPy, the connections in step, steps across hosts and within one, and the plans' node
    count."""
    n = len(layout)
    results = run_step_processes(
        {**mps_env, **GPU_BACKENDS[net]},
        n,
        1 << 20,
        1,
        False,
        COLLECTIVES_WORKER,
        env_of=lambda p: {"JAX_RCCL_HOSTNAME": f"host{layout[p]}", "JAX_RCCL_DEBUG": "INFO"},
        timeout=480,
        keep_output=True,
    )
    assert [r["host_of_rank"] for r in results] == [[f"host{h}" for h in layout]] * n
    for r in results:
        assert r["n"] == n, r["n"]
        per_count = sum(2 if algo == "Tree" else 7 for algo, _ in r["configs"])
        assert r["checks"] == len(r["counts"]) * per_count, (r["checks"], r["configs"])
        assert r["errors"] == 0, r["errors"]
    found = set(re.findall(r"jax_rccl INFO .* (\d+) node\(s\)$", results[0]["output"], re.M))
    assert found == {str(nodes)}, found
    moved = _check_counters(results)
    assert moved["across hosts"] > 0 and moved["same host"] > 0, moved
    _no_segments(results)


# --- the six-collective step at large sizes ---------------------------------------------------


@pytest.mark.parametrize("net", GPU_NETS)
@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
@pytest.mark.parametrize(
    "nprocs, count",
    [
        (2, 1 << 20),  # 4 MB per rank
        (2, 1 << 22),  # 16 MB per rank
        (4, 1 << 20),
        (4, 1 << 22),
    ],
)
def test_step_of_every_collective_across_two_hosts(mps_env, net, nprocs, count, cb):  # noqa: F811
    """psum (int32, float32), all_gather, psum_scatter, ppermute and all_to_all in one jitted
    step (test_jax_gpu_mp's worker), three steps, every result against its closed form; at the
    end every connection's counters are in step, those across hosts included."""
    moved = _step_across_hosts({**mps_env, **GPU_BACKENDS[net]}, nprocs, count, cb)
    assert moved["channels across hosts"], moved  # (test_net_nchannels_caps_... checks the cap)


def test_net_nchannels_caps_the_channels_across_hosts(mps_env):  # noqa: F811
    """JAX_RCCL_NET_NCHANNELS=2: the group's connections across hosts use channels 0 and 1 only,
    every result still right."""
    results = run_step_processes(
        mps_env,
        2,
        1 << 20,
        3,
        False,
        STEP_WORKER,
        args=WORLD,
        env_of=_two_hosts(2, {"JAX_RCCL_NET_NCHANNELS": "2"}),
    )
    for r in results:
        assert r["bad"] == {}, r["bad"]
        assert r["errors"] == 0, r["errors"]
    moved = _check_counters(results)
    assert moved["channels across hosts"] == {0, 1}, moved
    _no_segments(results)


def test_net_buffsize_sets_the_steps_across_hosts(mps_env):  # noqa: F811
    """JAX_RCCL_NET_BUFFSIZE=65536 (8 KiB Simple steps) in a group across hosts, with a different
    JAX_RCCL_BUFFSIZE in each process (it sizes groups within one host only): every result right,
    and the int32 psum alone (4 MiB per rank; either algorithm moves 2 x 4 MiB across hosts per
    call) takes at least 3 x 8 MiB / 8 KiB steps through the connections across hosts (the
    default's 128 KiB steps would take 16 times fewer)."""
    count, steps = 1 << 20, 3
    results = run_step_processes(
        mps_env,
        2,
        count,
        steps,
        False,
        STEP_WORKER,
        args=WORLD,
        env_of=lambda p: {
            **_two_hosts(2, {"JAX_RCCL_NET_BUFFSIZE": "65536"})(p),
            "JAX_RCCL_BUFFSIZE": str((1 + p) << 20),
        },
    )
    for r in results:
        assert r["bad"] == {}, r["bad"]
        assert r["errors"] == 0, r["errors"]
    moved = _check_counters(results)
    assert moved["across hosts"] >= steps * 2 * count * 4 // 8192, moved
    _no_segments(results)


def test_net_buffsize_that_differs_is_an_error_naming_it(mps_env):  # noqa: F811
    """Two processes on two hosts with different JAX_RCCL_NET_BUFFSIZE: the first collective raises
    in both, naming the other rank and the variable, instead of running with two layouts."""
    results = run_step_processes(
        mps_env,
        2,
        1024,
        1,
        False,
        SETTING_WORKER,
        env_of=lambda p: _two_hosts(2, {"JAX_RCCL_NET_BUFFSIZE": str(65536 << p)})(p),
        timeout=120,
    )
    for p, r in enumerate(results):
        assert r["raised"], f"process {p} ran with the other's buffer size different: {r}"
        assert "JAX_RCCL_NET_BUFFSIZE" in r["error"], r["error"]
        assert re.search(rf"\brank {1 - p}\b", r["error"]), r["error"]


@pytest.mark.parametrize("nprocs, cb", [(2, False), (4, True)], ids=["2procs", "4procs_cb"])
def test_net_streams_carry_several_channels_each(mps_env, nprocs, cb):  # noqa: F811
    """JAX_RCCL_NET_STREAMS=2: the channels across hosts of each pair of ranks share two TCP
    streams each way (the even channels on one): the six-collective step at 16 MB per rank,
    three steps, every result right and every connection's counters in step."""
    moved = _step_across_hosts(mps_env, nprocs, 1 << 22, cb, {"JAX_RCCL_NET_STREAMS": "2"})
    assert len(moved["channels across hosts"]) > 2, moved


def test_net_streams_that_differ_is_an_error_naming_it(mps_env):  # noqa: F811
    """One process with a stream per channel, the other with two streams: the first collective
    raises in both, naming the other rank and JAX_RCCL_NET_STREAMS, instead of waiting for
    connections the other never opens."""
    results = run_step_processes(
        mps_env,
        2,
        1024,
        1,
        False,
        SETTING_WORKER,
        env_of=lambda p: _two_hosts(2, {"JAX_RCCL_NET_STREAMS": str(2 * p)})(p),
        timeout=120,
    )
    for p, r in enumerate(results):
        assert r["raised"], f"process {p} ran with the other's stream count different: {r}"
        assert "JAX_RCCL_NET_STREAMS" in r["error"], r["error"]
        assert re.search(rf"\brank {1 - p}\b", r["error"]), r["error"]


# --- a thousand steps --------------------------------------------------------------------------


@pytest.mark.parametrize("net", GPU_NETS)
@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
@pytest.mark.parametrize("nprocs", [2, 4])
def test_a_thousand_steps_across_two_hosts(mps_env, net, nprocs, cb):  # noqa: F811
    """1,000 jitted steps of psum (int32, float32), all_gather, psum_scatter, ppermute and
    all_to_all on 2^16 int32 (256 KB) per rank (test_jax_gpu_mp's loop worker): every result of
    every step equals its closed form, compared on the device."""
    steps = 1000
    results = run_step_processes(
        {**mps_env, **GPU_BACKENDS[net]},
        nprocs,
        1 << 16,
        steps,
        cb,
        LOOP_WORKER,
        args=WORLD,
        env_of=_two_hosts(nprocs),
    )
    _check_world(results, nprocs)
    assert sorted(r["rank"] for r in results) == list(range(nprocs))
    for r in results:
        assert r["steps"] == steps, r
        assert r["bad"] == {}, r
        assert r["errors"] == 0, r
    _no_segments(results)


# --- a process that exits ----------------------------------------------------------------------

FAULT_TIMEOUT = 10  # JAX_RCCL_TIMEOUT of the fault test's processes


@pytest.mark.parametrize("net", GPU_NETS)
@pytest.mark.parametrize(
    "victim, cb",
    [(3, False), (2, False), (3, True)],
    ids=["last_of_hostB-plain", "first_of_hostB-plain", "last_of_hostB-command_buffers"],
)
def test_process_that_exits_is_an_error_not_a_hang(mps_env, net, victim, cb):  # noqa: F811
    """4 processes over two fake hosts; after one good step, process `victim` (on hostB) exits
    (os._exit) right before its second. Every survivor raises a Python exception that names a
    rank or another process, within JAX_RCCL_TIMEOUT (plus slack) of the step it was in."""
    nprocs, steps = 4, 6
    results = run_step_processes(
        dict(mps_env, JAX_RCCL_TEST_VICTIM=str(victim), **GPU_BACKENDS[net]),
        nprocs,
        1 << 16,
        steps,
        cb,
        FAULT_WORKER,
        env_of=_two_hosts(nprocs, {"JAX_RCCL_TIMEOUT": str(FAULT_TIMEOUT)}),
        timeout=150,
    )
    assert [r["process"] for r in results] == list(range(nprocs))
    for r in results:
        assert r["first_step_ok"], f"process {r['process']}: the step before the fault was wrong"
    assert results[victim]["victim"], results[victim]
    for p, r in enumerate(results):
        if p == victim:
            continue
        assert r["raised"], (
            f"process {p} (a survivor) raised nothing: {steps - 1} steps after process {victim} "
            "exited, and a new program, returned"
        )
        if not cb:  # every plain execute checks the communicator
            assert r["where"].startswith("step "), (p, r["where"], r["error"])
        assert re.search(r"\brank \d|\bprocess \d|another process", r["error"]), (
            f"process {p}: the error names no rank and no other process: {r['error']}"
        )
        assert r["seconds"] < FAULT_TIMEOUT + 10, (
            f"process {p}: raised {r['seconds']:.1f} s after its second step began, "
            f"JAX_RCCL_TIMEOUT={FAULT_TIMEOUT}: {r['error']}"
        )
