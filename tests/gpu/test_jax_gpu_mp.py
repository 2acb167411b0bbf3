"""Several JAX processes sharing one GPU (or one GPU each), through jax.distributed.

Each process owns one GPU device; the group's connection regions are traded as IPC handles
through shared-memory segments. Without MPS the processes' kernels are time-sliced (every FIFO
hand-off waits for a time slice), so the sizes stay small; with MPS running
(`nvidia-cuda-mps-control -d`) the same test runs at full speed. Programs: worker_mp_gpu.py (a GPU
each or one shared), worker_step_gpu.py, worker_loop_gpu.py and worker_premul_gpu.py (sharing).
"""

from __future__ import annotations

import os

import pytest
from gpu_launch import (  # noqa: F401 - mps_env: the fixture, visible to pytest here
    gpu_count,
    mps_env,
    process_env,
    run_processes,
    run_step_processes,
    skip_without_gpu,
    worker,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("share", [True, False])
def test_processes_with_one_gpu_each(nprocs, share):
    skip_without_gpu()
    ngpus = gpu_count()
    if not share and ngpus < nprocs:
        pytest.skip(f"needs {nprocs} GPUs (one per process)")

    def env_of(p: int) -> dict:
        # PYTHONFAULTHANDLER: a crash prints every thread's Python stack; PYTHONSAFEPATH: a
        # checkout's source folder never shadows the package.
        return process_env(
            60,
            None,
            CUDA_VISIBLE_DEVICES="0" if share else str(p),
            PYTHONFAULTHANDLER="1",
            PYTHONSAFEPATH="1",
        )

    results = run_processes(worker("worker_mp_gpu.py"), nprocs, os.environ, env_of, timeout=300)
    for r in results:
        assert r["n"] == nprocs
        # Per count: a psum under every config, six more checks under the non-Tree ones.
        per_count = sum(1 if algo == "Tree" else 7 for algo, _ in r["configs"])
        assert r["checks"] == 3 * per_count, r
        assert r["stats"]["errors"] == 0
    # Every connection ends where it began: the steps a sender filled (its own copy) are the steps
    # its receiver consumed, and the tail the receiver holds (written by the sender).
    by_rank = {
        r["rank"]: {(c, p): (t, h, st) for c, p, t, h, st, _ in r["counters"]} for r in results
    }
    assert sorted(by_rank) == list(range(nprocs))
    moved = 0
    for s in range(nprocs):
        for r in range(nprocs):
            if s == r:
                continue
            for (c, p), (_, _, sent) in by_rank[s].items():
                if p != r:
                    continue
                tail, head, _ = by_rank[r][(c, s)]
                assert sent == head == tail, (s, r, c, sent, head, tail)
                moved += sent
    assert moved > 0
    leftovers = [f for f in os.listdir("/dev/shm") if f.startswith("jrccl.")]
    assert not leftovers, leftovers


# --- one step of every collective at large sizes, processes sharing the GPU under MPS ----------


@pytest.mark.parametrize(
    "nprocs, count, cb",
    [
        (2, 1 << 24, False),  # 64 MB per rank
        (3, (1 << 22) - 1, False),  # 16 MB per rank (a multiple of 3 elements)
        (3, (1 << 24) - 1, True),
        (4, 1 << 20, True),
        (4, 1 << 22, False),  # 16 MB per rank: issue 21's step
        (4, 1 << 22, True),
        (4, 1 << 24, False),  # 64 MB per rank
    ],
)
def test_step_of_every_collective_sharing_one_gpu(mps_env, nprocs, count, cb):  # noqa: F811
    """psum (int32, float32), all_gather, psum_scatter, ppermute and all_to_all in one jitted step
    of `nprocs` processes on one GPU, every result against its closed form, three steps; command
    buffers on or off. The connections end where they began (every sent step consumed)."""
    results = run_step_processes(mps_env, nprocs, count, 3, cb)
    for r in results:
        assert r["bad"] == {}, r["bad"]
        assert r["errors"] == 0
    by_rank = {
        r["rank"]: {(c, p): (t, h, st) for c, p, t, h, st, _ in r["counters"]} for r in results
    }
    assert sorted(by_rank) == list(range(nprocs))
    for s in range(nprocs):
        for (c, p), (_, _, sent) in by_rank[s].items():
            if p != s:
                tail, head, _ = by_rank[p][(c, s)]
                assert sent == head == tail, (s, p, c, sent, head, tail)


# --- a thousand steps, every result checked on the device ----------------------------------------


@pytest.mark.parametrize(
    "nprocs, count",
    [
        (2, 1 << 24),  # 64 MB per rank
        (3, (1 << 24) - 1),  # 64 MB per rank less 4 bytes (a multiple of 3 elements)
        (4, 1 << 24),
    ],
)
@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
def test_a_thousand_steps_sharing_one_gpu(mps_env, nprocs, count, cb):  # noqa: F811
    """1,000 jitted steps of psum (int32, float32), all_gather, psum_scatter, ppermute and
    all_to_all on 64 MB per rank, `nprocs` processes sharing the GPU, command buffers on and off:
    every result of every step equals its closed form, compared on the device."""
    steps = 1000
    results = run_step_processes(mps_env, nprocs, count, steps, cb, worker("worker_loop_gpu.py"))
    assert sorted(r["rank"] for r in results) == list(range(nprocs))
    for r in results:
        assert r["steps"] == steps, r
        assert r["bad"] == {}, r
        assert r["errors"] == 0, r


# --- per-device premul scalars: processes sharing the GPU, command buffers on and off ----------


@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
@pytest.mark.parametrize("nprocs, count", [(2, 1000), (3, 4097), (4, 1 << 20)])
def test_premul_array_sharing_one_gpu(mps_env, nprocs, count, cb):  # noqa: F811
    """all_reduce with a per-device premul scalar (a new value every step, different on every
    rank) in 200 steps of `nprocs` processes on one GPU, each result checked on the device; with
    command buffers the launch is replayed and reads each step's scalar."""
    steps = 200
    results = run_step_processes(mps_env, nprocs, count, steps, cb, worker("worker_premul_gpu.py"))
    assert sorted(r["rank"] for r in results) == list(range(nprocs))
    for r in results:
        assert r["k"] == steps, r
        assert r["bad"] == {"premul": 0}, r
        assert r["errors"] == 0, r
        if cb:
            assert r["executions"] <= steps // 10, r
        else:
            assert r["executions"] == steps - 1, r
