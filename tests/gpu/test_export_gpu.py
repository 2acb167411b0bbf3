"""A program exported with jax.export runs its jax_rccl calls on GPUs: on one GPU (command buffers
on and off) and in JAX processes sharing one GPU under MPS, where calling it on the mesh's devices
in another order fails on every process naming the partition and both devices instead of
exchanging blocks with the wrong ranks (at its first call; when that call is recorded into a
command buffer, the kernels move nothing and the next call that runs the handler raises).
Programs: worker_export_gpu.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_jax_gpu_mp import (  # noqa: F401 - mps_env: the fixture, visible to pytest here
    _COMMAND_BUFFERS,
    _free_port,
    _gpu_count,
    _has_gpu_runtime,
    mps_env,
)

pytestmark = pytest.mark.gpu

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_export_gpu.py")


def _run(env_base: dict, nprocs: int, cb: bool) -> list:
    port = _free_port()
    procs = []
    for p in range(nprocs):
        env = dict(env_base)
        env["CUDA_VISIBLE_DEVICES"] = "0"
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        env["JAX_RCCL_TIMEOUT"] = "20"
        env["XLA_FLAGS"] = _COMMAND_BUFFERS if cb else "--xla_gpu_enable_command_buffer="
        procs.append(
            subprocess.Popen(
                [sys.executable, "-P", WORKER, str(p), str(nprocs), str(port)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    texts = []
    try:
        for p in procs:
            texts.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = []
    for k, text in enumerate(texts):
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        assert lines, f"process {k} (exit {procs[k].returncode}) printed no RESULT:\n{text[-3000:]}"
        out.append(json.loads(lines[-1][len("RESULT ") :]))
    return out


@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
def test_exported_program_on_one_gpu(cb):
    if not _has_gpu_runtime() or _gpu_count() == 0:
        pytest.skip("needs a GPU build and a GPU")
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
