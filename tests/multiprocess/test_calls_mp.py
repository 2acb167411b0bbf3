"""Calls across processes stay in step or fail loudly: a call's identity comes from what is
called (not from how many lowerings a process did), every FIFO step is checked by its receiver
(a swapped order or a different op is an error on every process, never a wrong result, with no
limit on call sites), a rank that dies, stops or never calls is the one named, and no shared
memory is left behind by a process that dies early. Programs: worker_calls.py."""

from __future__ import annotations

import os
import re
import time

import pytest
from launcher import launch, shm_entries
from nets import BACKENDS, NEEDS_UCX

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_calls.py")
TIMEOUT = 5.0  # JAX_RCCL_TIMEOUT in the processes
SLOW_TIMEOUT = 30.0  # where a test tells an error found at once from one found at the deadline
SOCKET = {"JAX_RCCL_TRANSPORT": "socket"}
# Shared memory, and the network between every pair of processes: our TCP, or UCX over its TCP.
TRANSPORTS = {
    "shm": {},
    "socket": {**SOCKET, **BACKENDS["socket"]},
    "ucx": {**SOCKET, **BACKENDS["ucx_tcp"]},
}
TRANSPORT_CASES = ["shm", "socket", pytest.param("ucx", marks=NEEDS_UCX)]
CULPRIT = re.compile(
    r"rank (\d+) \(device (\d+), process (\d+), host '([^']*)'\) "
    r"(exited|is stopped|never arrived|did not answer)"
)

pytestmark = pytest.mark.needs_world


def _results(procs, n=None):
    out = []
    for p in procs[:n]:
        assert not p.timed_out, p.describe()
        assert p.result is not None and p.result.get("ok"), p.describe()
        out.append(p.result)
    return out


def _run(program, nprocs, *args, env=None, timeout=90):
    return launch(
        program,
        nprocs,
        1,
        args=args,
        env=env,
        timeout=timeout,
        jax_rccl_timeout=TIMEOUT,
        worker=WORKER,
    )


@pytest.mark.parametrize("transport", TRANSPORT_CASES)
@pytest.mark.parametrize("mode", ["extra_lower", "order"])
def test_identity_does_not_count_lowerings(mode, transport):
    """Process 0 alone lowers one more function, or the processes lower f and g in different
    orders: the program that follows runs right."""
    for r in _results(_run("identity", 2, f"--mode={mode}", env=TRANSPORTS[transport])):
        assert r["wrong"] == [], r


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("transport", TRANSPORT_CASES)
def test_swapped_executables_are_an_error_on_every_process(nprocs, transport):
    res = _results(_run("swap", nprocs, env=TRANSPORTS[transport]))
    for r in res:
        assert r["wrong"] == [], r
        assert r["raised"], r
        assert r["seconds"] < TIMEOUT + 3, r
        # Either this process saw it, or it was told by the process that did: both calls named.
        assert "mismatched calls" in r["error"], r["error"]
        assert "all_gather" in r["error"], r["error"]
        assert "psum" in r["error"] or "all_reduce" in r["error"], r["error"]


@pytest.mark.parametrize("transport", TRANSPORT_CASES)
def test_more_than_256_call_sites_still_checked(transport):
    res = _results(_run("swap", 2, "--sites=257", "--swap=op", env=TRANSPORTS[transport]))
    for r in res:
        assert r["wrong"] == [], r
        assert r["raised"] and "mismatched calls" in r["error"], r
        assert " sum;" in r["error"] or " minmax;" in r["error"], r["error"]


@pytest.mark.parametrize("transport", TRANSPORT_CASES)
def test_mismatch_that_sends_nothing_names_both_calls(transport):
    """Rank 0 waits to receive from rank 1 in one ppermute, rank 1 from rank 0 in another: no
    step arrives to tell the calls apart. The wait ends in an error naming both calls (over
    sockets the timeout asks the peers what they run), not an unexplained timeout."""
    res = _results(_run("swap", 2, "--swap=perm", env=TRANSPORTS[transport]))
    for r in res:
        assert r["wrong"] == [], r
        assert r["raised"] and "mismatched calls" in r["error"], r
        assert r["seconds"] < TIMEOUT + 3, r
        ids = set(re.findall(r"; id ([0-9a-f]{16})\)", r["error"]))
        assert len(ids) == 2, r["error"]  # this rank's call and the peer's
        assert "not known" not in r["error"], r["error"]


def _culprits(error):
    return {(int(m.group(1)), m.group(5)) for m in CULPRIT.finditer(error)}


@pytest.mark.parametrize("transport", TRANSPORT_CASES)
@pytest.mark.parametrize(
    "mode,what",
    [
        ("killed", {"exited"}),
        ("frozen", {"is stopped", "did not answer"}),
        ("idle", {"never arrived"}),
    ],
)
def test_the_missing_rank_is_named(mode, what, transport):
    """4 processes in a ring; process 2 dies, stops or never calls: every survivor names rank 2
    (and no other rank) as the culprit, within the timeout."""
    env = {"JAX_RCCL_ALGO": "Ring", **TRANSPORTS[transport]}
    procs = _run("fault", 4, f"--mode={mode}", "--victim=2", f"--linger={TIMEOUT + 8}", env=env)
    survivors = [r for i, r in enumerate(_results([p for p in procs if p.process != 2]))]
    for r in survivors:
        assert r["raised"], r
        assert r["seconds"] < TIMEOUT + 4, r
        found = _culprits(r["error"])
        assert {rank for rank, _ in found} == {2}, r["error"]
        assert {w for _, w in found} <= what, r["error"]


@pytest.mark.parametrize("mode", ["call", "exit"])
def test_early_death_leaves_no_segments(mode):
    procs = _run("early_death", 2, f"--mode={mode}", timeout=60)
    assert procs[1].returncode == -9, procs[1].describe()
    (r,) = _results(procs[:1])
    if mode == "call":
        assert r["raised"], r
        assert {rank for rank, _ in _culprits(r["error"])} == {1}, r["error"]
        assert "exited" in r["error"], r["error"]
    assert r["session"], r
    assert shm_entries(r["session"]) == [], shm_entries(r["session"])


def test_coordinator_killed_before_its_peer_mapped_its_segment_leaves_nothing():
    """The process holding JAX's coordination service is killed after creating its segment and
    before its peer mapped it; the peer is ended without running its exit handlers (as JAX ends
    survivors). Nothing of the job is left in /dev/shm."""
    procs = _run("coordinator_death", 2, timeout=60)
    assert procs[0].returncode == -9, procs[0].describe()
    assert procs[1].returncode is not None and procs[1].returncode < 0, procs[1].describe()
    r = procs[0].result
    assert r is not None and r["session"], procs[0].describe()
    deadline = time.monotonic() + 5
    while shm_entries(r["session"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert shm_entries(r["session"]) == [], shm_entries(r["session"])


@pytest.mark.parametrize(
    "var,values", [("JAX_RCCL_NCHANNELS", ("2", "4")), ("JAX_RCCL_TRANSPORT", ("shm", "socket"))]
)
def test_settings_that_must_agree_are_compared(var, values):
    """A difference is an error on every process naming the setting and both values, at once."""
    procs = launch(
        "collectives",
        2,
        1,
        args=("--sizes=64",),
        env_of=lambda i: {var: values[i]},
        timeout=90,
        jax_rccl_timeout=SLOW_TIMEOUT,
    )
    for p in procs:
        assert not p.timed_out, p.describe()
        r = p.result
        assert r is not None and not r.get("ok"), p.describe()
        assert f"disagree on {var}" in r["error"], r["error"]
        assert all(repr(v) in r["error"] for v in values), r["error"]
        # Found when the processes meet, not at the deadline (far from it on a loaded machine).
        assert r["seconds"] < SLOW_TIMEOUT / 2, r
