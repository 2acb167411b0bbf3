"""jax_rccl.install() on GPUs: a step written with jax.lax only (psum, all_gather, psum_scatter,
all_to_all, ppermute and the gradient all-reduce JAX inserts) runs on jax_rccl's GPU runtime in
processes sharing one GPU under MPS, command buffers on and off, every result against its closed
form, and the compiled program holds no XLA collective."""

from __future__ import annotations

import os

import pytest
from gpu_launch import mps_env, run_step_processes  # noqa: F401 - the fixture

pytestmark = pytest.mark.gpu

_WORKER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "multiprocess",
    "lax_backend_worker.py",
)


@pytest.mark.parametrize(
    "nprocs, count, cb", [(2, 1 << 16, False), (2, 1 << 20, True), (4, 1 << 18, True)]
)
def test_lax_step_on_gpus(mps_env, nprocs, count, cb):  # noqa: F811
    results = run_step_processes(mps_env, nprocs, count, 3, cb, _WORKER)
    for r in results:
        assert r["ours"] and r["xla_ops"] == [], r
        assert r["bad"] == {}, r["bad"]
        assert r["errors"] == 0
