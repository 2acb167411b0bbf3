"""ragged_all_to_all on GPUs: the kernels read the offsets table from device memory when they run.

One GPU, one process: a group of one device against jax.lax.ragged_all_to_all (XLA's GPU
lowering), for several dtypes and row widths, inside jit and with every table different; a bad
table is an error at the next call. Several processes sharing the GPU under MPS (2, 3 and 4):
a new table every step, every result against numpy, with XLA's command buffers on and off (a
replayed launch reads each step's table); a bad table is an error on both ends of the transfer.
Program of the processes: worker_ragged_gpu.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("JAX_RCCL_TIMEOUT", "60")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from gpu_launch import mps_env, run_step_processes, worker  # noqa: E402, F401
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from test_jax_gpu import _gpu_runtime  # noqa: E402

import jax_rccl  # noqa: E402

pytestmark = pytest.mark.gpu


def _one_gpu_case(rng, n_rows, m_rows):
    """A table for a group of one: sizes within both buffers, slices in random order."""
    k = 3
    sizes = rng.integers(0, min(n_rows, m_rows) // k + 1, size=k)
    in_off = np.cumsum(np.concatenate([[0], sizes[:-1]])) + rng.integers(0, 2, size=k)
    out_off = m_rows - np.cumsum(sizes)  # from the end, in reverse
    in_off = np.minimum(in_off, n_rows - sizes)
    return [a.astype(np.int32) for a in (in_off, sizes, out_off, sizes)]


def _call(fn, x, y, table):
    mesh = Mesh(np.array(jax.devices()[:1]), ("i",))
    specs = (P("i"),) * 6
    f = jax.jit(
        jax.shard_map(
            lambda *a: fn(*(v[0] for v in a))[None],
            mesh=mesh,
            in_specs=specs,
            out_specs=P("i"),
        )
    )
    return f(x[None], y[None], *(t[None] for t in table))


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.int8, np.int64])
@pytest.mark.parametrize("row", [1, 3, 64])
def test_one_gpu_against_jax_lax(dtype, row):
    if not _gpu_runtime():
        pytest.skip("needs a GPU and a GPU build of jax_rccl")
    rng = np.random.default_rng(row)
    n_rows, m_rows = 37, 50

    def ours(*a):
        return jax_rccl.ragged_all_to_all(*a, axis_name="i")

    def theirs(*a):
        return jax.lax.ragged_all_to_all(*a, axis_name="i")

    for trial in range(4):
        x = (np.arange(n_rows * row).reshape(n_rows, row) % 97 + trial).astype(dtype)
        y = np.full((m_rows, row), -1, dtype)
        table = _one_gpu_case(rng, n_rows, m_rows)
        got = np.asarray(_call(ours, x, y, table))
        want = np.asarray(_call(theirs, x, y, table))
        np.testing.assert_array_equal(got, want)


def test_one_gpu_bad_table_is_an_error_at_the_next_call():
    """The kernel finds the bad entry; the next call on that device raises naming it, and the
    calls after run (the communicator stays usable)."""
    if not _gpu_runtime():
        pytest.skip("needs a GPU and a GPU build of jax_rccl")
    x = np.arange(8 * 2, dtype=np.float32).reshape(8, 2)
    y = np.zeros((8, 2), np.float32)

    def ours(*a):
        return jax_rccl.ragged_all_to_all(*a, axis_name="i")

    bad = [np.array([5], np.int32), np.array([4], np.int32)] * 2  # rows [5, 9) of 8
    jax.block_until_ready(_call(ours, x, y, bad))
    good = [np.array([0], np.int32), np.array([2], np.int32)] * 2
    with pytest.raises(Exception, match="ragged_all_to_all's slice 0 of rank 0 is out of range"):
        jax.block_until_ready(_call(ours, x, y, good))
    want = y.copy()
    want[0:2] = x[0:2]
    np.testing.assert_array_equal(np.asarray(_call(ours, x, y, good))[0], want)


# --- several processes sharing the GPU --------------------------------------------------------

RAGGED_WORKER = worker("worker_ragged_gpu.py")


@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
@pytest.mark.parametrize("nprocs, rows", [(2, 1000), (3, 4097), (4, 1 << 16)])
def test_ragged_sharing_one_gpu(mps_env, nprocs, rows, cb):  # noqa: F811
    """30 steps of ragged_all_to_all in `nprocs` processes on one GPU, a new table every step
    (every fifth full): every result equals numpy's, with command buffers on and off."""
    results = run_step_processes(mps_env, nprocs, rows, 30, cb, RAGGED_WORKER)
    assert sorted(r["rank"] for r in results) == list(range(nprocs))
    for r in results:
        assert r["bad"] == {}, r
        assert r["errors"] == 0, r


def test_ragged_bad_table_is_an_error_on_both_ends(mps_env):  # noqa: F811
    env = dict(mps_env, RAGGED_MODE="bad")
    results = run_step_processes(env, 2, 64, 2, False, RAGGED_WORKER)
    for r in results:
        assert r["bad"] == {}, r
        assert r["error"] is not None, r
        assert "ragged_all_to_all's slice 1 of rank 0 is out of range" in r["error"], r
