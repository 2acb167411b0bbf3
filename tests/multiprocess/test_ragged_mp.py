"""jax_rccl.ragged_all_to_all across processes of one host (shared memory, and sockets):
results against NumPy, and a bad call that fails in every process without a hang.
Programs: worker_ragged.py."""

from __future__ import annotations

import os

import pytest
from launcher import launch

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_ragged.py")
TRANSPORTS = {"shm": {}, "socket": {"JAX_RCCL_TRANSPORT": "socket"}}

pytestmark = pytest.mark.needs_world


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("nprocs", "local"), [(4, 1), (2, 2)], ids=["4x1", "2x2"])
def test_ragged_all_to_all_across_processes(nprocs, local, transport):
    procs = launch(
        "ragged",
        nprocs,
        local,
        env=TRANSPORTS[transport],
        timeout=120,
        jax_rccl_timeout=10.0,
        worker=WORKER,
    )
    for p in procs:
        assert not p.timed_out, p.describe()
        r = p.result
        assert r is not None and r.get("ok"), p.describe()
        assert r["wrong"] == [], r
        assert r["raised"], r
        assert "past its 40 rows" in r["error"], r
        assert r["seconds"] < 8.0, r  # refused at once, not at the runtime's deadline
