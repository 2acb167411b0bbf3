"""jax_rccl.explain and jax_rccl.profile across 2 processes of 2 CPU devices each (one host,
shared memory): each process's profile counts its own devices' executions, as its
runtime_stats() does, and the choice explain shows for the group across processes is the one
the runtime's plan made. Program: worker_observe.py."""

from __future__ import annotations

import os

import pytest
from launcher import launch

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_observe.py")
CALLS = 5

pytestmark = pytest.mark.needs_world


def test_explain_and_profile_across_two_processes():
    procs = launch("observe", 2, 2, timeout=90, worker=WORKER)
    for p in procs:
        assert not p.timed_out and p.result is not None and p.result.get("ok"), p.describe()
        r = p.result
        (row,) = r["rows"]
        assert row["name"] == "psum over ('i',)" and row["group_size"] == 4
        assert row["calls"] == CALLS
        assert row["executions"] == CALLS * r["local_devices"] == r["executions"]
        assert row["bytes"] == row["executions"] * 4096 * 4
        (call,) = r["explained"]
        assert call["name"] == row["name"]
        assert call["topology_note"] == "across processes (shared memory on one host)"
        assert call["choice"] == [row["algorithm"], row["protocol"]], r
        assert "psum over ('i',)" in r["table"]
