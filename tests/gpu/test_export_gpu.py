"""A program exported with jax.export runs its jax_rccl calls on GPUs: on one GPU (command buffers
on and off) and in JAX processes sharing one GPU under MPS, where calling it on the mesh's devices
in another order fails on every process naming the partition and both devices instead of
exchanging blocks with the wrong ranks (at its first call; when that call is recorded into a
command buffer, the kernels move nothing and the next call that runs the handler raises).
Programs: worker_export_gpu.py."""

from __future__ import annotations

import os

import pytest
from gpu_launch import (  # noqa: F401 - mps_env: the fixture, visible to pytest here
    mps_env,
    process_env,
    run_processes,
    skip_without_gpu,
    worker,
)

pytestmark = pytest.mark.gpu

WORKER = worker("worker_export_gpu.py")


def _run(env_base: dict, nprocs: int, cb: bool) -> list:
    return run_processes(
        WORKER, nprocs, env_base, lambda p: process_env(20, cb), timeout=240, check_exit=False
    )


@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
def test_exported_program_on_one_gpu(cb):
    skip_without_gpu()
    (r,) = _run(dict(os.environ), 1, cb)
    assert r["same_ok"], r


@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
def test_exported_program_across_processes_checks_the_mesh_order(mps_env, cb):  # noqa: F811
    for r in _run(mps_env, 2, cb):
        assert r["same_ok"], r
        error = r["reversed_error"]
        assert error is not None, f"process {r['process']}: the reversed mesh ran: {r}"
        assert "exported with" in error and "partition" in error, error
        assert r["reversed_seconds"] < 20, r  # found by the check, not by a timeout
        # Without command buffers the host reads the check at the first call; with them XLA may
        # still run that call directly (the host check), or record it, when the kernels compare
        # it and the next program's call raises.
        assert r["reversed_where"] in (("first call", "next program") if cb else ("first call",)), r
