"""Benchmarks end to end, small: benchmarks/multiprocess.py, whose JAX workers check every result
they time (jax_rccl kept and donated in place, the local floor), so a broken benchmark or a wrong
in-place all-reduce across processes fails here; benchmarks/gpu_cross_host.py on CPU devices."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.needs_world
def test_benchmark_runs_and_prints_every_column():
    cmd = [
        sys.executable,
        "-P",
        os.path.join(ROOT, "benchmarks", "multiprocess.py"),
        "--nprocs=2",
        "--max-mb=0.0625",  # 1 KB .. 64 KB
        "--reps=1",
        "--no-mpi",
        "--timeout=120",
        "--libs=jax_rccl,jax_rccl_donated,jax_local",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    head = next(ln for ln in lines if ln.lstrip().startswith("size"))
    for col in ("jax_rccl", "jax_rccl_donated", "jax_local", "jax_rccl_donated/jax_rccl"):
        assert col in head.split(), head
    rows = [ln.split() for ln in lines if ln.lstrip()[:1].isdigit()]
    assert [" ".join(r[:2]) for r in rows] == ["1 KB", "4 KB", "16 KB", "64 KB"], r.stdout
    for row in rows:
        assert "-" not in row, row  # every library timed every size


@pytest.mark.needs_world
def test_cross_host_benchmark_runs_on_cpu_devices():
    """benchmarks/gpu_cross_host.py on CPU devices (two fake hosts over loopback TCP, no GPU, no
    MPS): every row timed and right, the raw socket measured beside it, the CPU table filled."""
    cmd = [
        sys.executable,
        "-P",
        os.path.join(ROOT, "benchmarks", "gpu_cross_host.py"),
        "--no-mps",
        "--sizes=64K,256K",
        "--paths=cross",
        "--repeat=1",
        "--timeout=120",
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [
        ln.split("|") for ln in r.stdout.splitlines() if ln.strip().startswith(("64KB", "256KB"))
    ]
    assert len(rows) == 4, r.stdout  # all_reduce and all_gather at two sizes
    for row in rows:
        assert row[-1].strip() == "0", row  # no wrong element
        assert "-" not in row[3].split(), row  # raw measured at 1, 4 and 8 sockets
        assert row[4].strip() != "-", row  # a ratio
    cpu = [
        ln for ln in r.stdout.splitlines() if ln.lstrip().startswith(("all_reduce", "all_gather"))
    ]
    assert len(cpu) == 4, r.stdout
