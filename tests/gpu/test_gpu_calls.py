"""Every GPU call is checked: JAX processes sharing one GPU under MPS whose programs disagree (an
op, a kind, a dtype, a count, a root, a permutation, or the order of two programs) fail on every
process with an error naming both calls within 2 s, never with a wrong result and never only at
JAX_RCCL_TIMEOUT; on one host (IPC) and across two faked hosts (the network proxy), XLA command
buffers on and off. Identical programs run 1,000 steps. Programs: worker_calls_gpu.py."""

from __future__ import annotations

import pytest
from gpu_launch import (  # noqa: F401 - mps_env: the fixture, visible to pytest here
    mps_env,
    process_env,
    run_processes,
    worker,
)

pytestmark = pytest.mark.gpu

WORKER = worker("worker_calls_gpu.py")
TIMEOUT = 20  # JAX_RCCL_TIMEOUT: a mismatch found by a timeout takes this long
PLACES = {"ipc": None, "proxy": ["hostA", "hostB"]}
# What each case's two calls are called in messages (the call's name or what its plan moves).
NAMES = {
    "op": (("psum", " sum"), ("pmax", " max")),
    "kind": (("psum", "all_reduce"), ("all_gather",)),
    "dtype": (("float32",), ("int32",)),
    "count": (("x4096",), ("x8192",)),
    "root": (("pbroadcast",), ("pbroadcast",)),
    "perm": (("ppermute",), ("ppermute",)),
}


def _run(env_base: dict, nprocs: int, case: str, place: str, cb: bool) -> list:
    """Runs worker_calls_gpu.py in `nprocs` processes sharing GPU 0 (`place`: one host, or two
    faked hosts of nprocs / 2 processes each) and returns each process's RESULT."""

    def env_of(p: int) -> dict:
        env = process_env(TIMEOUT, cb, PYTHONFAULTHANDLER="1")
        if PLACES[place] is not None:
            env["JAX_RCCL_HOSTNAME"] = PLACES[place][0 if p < nprocs // 2 else 1]
        return env

    # A process may exit with an error after its RESULT (a group that failed): not checked.
    return run_processes(WORKER, nprocs, env_base, env_of, (case,), timeout=240, check_exit=False)


def _check_mismatch(results: list, case: str) -> None:
    for r in results:
        p = r["process"]
        assert r["warm_ok"], f"process {p}: the calls before the mismatch were wrong: {r}"
        assert r["raised"], f"process {p} raised nothing (case {case}): {r}"
        error = r["error"]
        assert "mismatched calls" in error, f"process {p}: {error}"
        assert "timed out" not in error.split("mismatched calls")[0], f"process {p}: {error}"
        for names in NAMES[case]:
            assert any(name in error for name in names), f"process {p}: no {names} in {error}"
        assert r["seconds"] < 2.0, f"process {p}: raised after {r['seconds']:.2f} s: {error}"


@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("case", ["op", "count", "kind"])
def test_the_issues_three_cases_fail_naming_both_calls(mps_env, case, place, cb):  # noqa: F811
    """psum against pmax, a count mismatch at the first call, psum against all_gather: 2
    processes, every process raises 'mismatched calls' naming both, within 2 s."""
    _check_mismatch(_run(mps_env, 2, case, place, cb), case)


@pytest.mark.parametrize("case", ["dtype", "root", "perm"])
@pytest.mark.parametrize("place", PLACES)
def test_calls_that_differ_in_dtype_root_or_perm(mps_env, case, place):  # noqa: F811
    _check_mismatch(_run(mps_env, 2, case, place, False), case)


@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
@pytest.mark.parametrize("place", PLACES)
def test_four_processes_every_one_names_both_calls(mps_env, place, cb):  # noqa: F811
    _check_mismatch(_run(mps_env, 4, "op", place, cb), "op")


@pytest.mark.parametrize("place", PLACES)
def test_identical_programs_run_a_thousand_steps(mps_env, place):  # noqa: F811
    for r in _run(mps_env, 2, "same", place, True):
        assert r["warm_ok"] and not r["raised"], r
        assert r["same_ok"], r
        assert r["errors"] == 0, r
