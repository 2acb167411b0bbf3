"""jax_rccl.install() across JAX processes on CPU devices: a step written with jax.lax only
(ppermute, psum, all_gather, psum_scatter, all_to_all and the gradient all-reduce JAX inserts)
runs on jax_rccl's runtime over shared memory and over sockets, every result against its closed
form, with no XLA collective left in the compiled program."""

from __future__ import annotations

import json
import os
import sys

import pytest
from launcher import free_port, run_together

pytestmark = pytest.mark.needs_world

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lax_backend_worker.py")


@pytest.mark.parametrize("transport", ["shm", "socket"])
@pytest.mark.parametrize("nprocs", [2, 3])
def test_lax_step_across_processes(tmp_path, transport, nprocs):
    port = free_port()
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAX_RCCL_TIMEOUT": "30",
        "JAX_RCCL_TRANSPORT": transport,
        "XLA_FLAGS": "",
    }
    commands = [
        [sys.executable, "-P", WORKER, str(p), str(nprocs), str(port), str(3 * 1024), "3"]
        for p in range(nprocs)
    ]
    done = run_together(commands, timeout=180, env=env, cwd=tmp_path)
    for k, (returncode, text) in enumerate(done):
        assert returncode == 0, f"process {k}: exit {returncode}\n{text[-3000:]}"
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        assert lines, text[-3000:]
        r = json.loads(lines[-1][len("RESULT ") :])
        assert r["ours"] and r["xla_ops"] == [], r
        assert r["bad"] == {}, r["bad"]
        assert r["errors"] == 0
