"""ragged_all_to_all on GPUs: the kernels read the offsets table from device memory when they run.

One GPU, one process: a group of one device against jax.lax.ragged_all_to_all (XLA's GPU
lowering), for several dtypes and row widths, inside jit and with every table different; a bad
table is an error at the next call. Several processes sharing the GPU under MPS (2, 3 and 4):
a new table every step, every result against numpy, with XLA's command buffers on and off (a
replayed launch reads each step's table); a bad table is an error on both ends of the transfer.
"""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

os.environ.setdefault("JAX_RCCL_TIMEOUT", "60")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from test_jax_gpu import _gpu_runtime  # noqa: E402
from test_jax_gpu_mp import _run_step_processes, mps_env  # noqa: E402, F401

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

_RAGGED_WORKER = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import jax
    process, nprocs, port, rows, steps = (int(a) for a in sys.argv[1:6])
    jax.distributed.initialize(f"127.0.0.1:{port}", nprocs, process, initialization_timeout=120)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jax_rccl

    devs = jax.devices()
    n = len(devs)
    R = 5  # 20-byte rows: slices start and end off 16-byte boundaries
    N = M = rows
    me = [d.id for d in devs].index(jax.local_devices()[0].id)
    mesh = Mesh(np.array(devs), ("i",))
    spec = NamedSharding(mesh, P("i"))
    f = jax.jit(jax.shard_map(
        lambda x, y, a, b, c, d: jax_rccl.ragged_all_to_all(x, y, a, b, c, d, axis_name="i"),
        mesh=mesh, in_specs=(P("i"),) * 6, out_specs=P("i")))

    def case(k):
        # The same on every process: sizes[s, j] rows from s to j, placed with random gaps.
        rng = np.random.default_rng(1000 + k)
        sizes = rng.integers(0, N // n + 1, size=(n, n))
        if k % 5 == 0:
            sizes[:, :] = N // n  # full
        in_off = np.zeros((n, n), np.int64)
        out_off = np.zeros((n, n), np.int64)
        for s in range(n):
            slack = N - sizes[s].sum()
            gaps = rng.multinomial(slack, np.ones(n + 1) / (n + 1))[:n]
            in_off[s] = np.cumsum(gaps) + np.concatenate([[0], np.cumsum(sizes[s])[:-1]])
        for j in range(n):
            slack = M - sizes[:, j].sum()
            gaps = rng.multinomial(slack, np.ones(n + 1) / (n + 1))[:n]
            order = rng.permutation(n)
            pos = 0
            for t, s in enumerate(order):
                pos += gaps[t]
                out_off[s, j] = pos
                pos += sizes[s, j]
        return in_off, sizes, out_off, sizes.T.copy()

    def inputs(k):
        x = [(np.arange(N * R).reshape(N, R) + 1000 * s + 7 * k).astype(np.float32)
             for s in range(n)]
        return x, np.full((M, R), -1.0 - k, np.float32)

    def arr(full):
        return jax.make_array_from_callback(full.shape, spec, lambda idx: full[idx])

    def run(k, tab):
        x, y = inputs(k)
        args = [arr(np.concatenate(x)), arr(np.tile(y, (n, 1)))]
        args += [arr(t.astype(np.int32).reshape(-1)) for t in tab]
        return np.asarray(f(*args).addressable_shards[0].data), x, y

    mode = os.environ.get("RAGGED_MODE", "good")
    bad = {}
    for k in range(steps):
        tab = case(k)
        got, x, y = run(k, tab)
        in_off, sizes, out_off, _ = tab
        want = y.copy()
        for s in range(n):
            m = sizes[s, me]
            want[out_off[s, me]:out_off[s, me] + m] = x[s][in_off[s, me]:in_off[s, me] + m]
        if not np.array_equal(got, want):
            bad[f"step {k}"] = int(np.count_nonzero(got != want))
    error = None
    if mode == "bad":
        # Rank 0 sends rows [N - 1, N + 1) to rank 1: past its operand (recv_sizes agree).
        in_off, sizes, out_off, recv = case(steps)
        in_off[0, 1], sizes[0, 1], out_off[0, 1] = N - 1, 2, 0
        recv = sizes.T.copy()
        jax.block_until_ready(run(steps, (in_off, sizes, out_off, recv))[0])
        try:
            run(steps + 1, case(steps + 1))
        except Exception as e:
            error = str(e)
    print("RESULT " + json.dumps({
        "rank": me, "bad": bad, "error": error,
        "errors": int(jax_rccl.runtime_stats()["errors"]),
    }), flush=True)
    os._exit(0)
    """
)


@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
@pytest.mark.parametrize("nprocs, rows", [(2, 1000), (3, 4097), (4, 1 << 16)])
def test_ragged_sharing_one_gpu(mps_env, nprocs, rows, cb):  # noqa: F811
    """30 steps of ragged_all_to_all in `nprocs` processes on one GPU, a new table every step
    (every fifth full): every result equals numpy's, with command buffers on and off."""
    results = _run_step_processes(mps_env, nprocs, rows, 30, cb, script=_RAGGED_WORKER)
    assert sorted(r["rank"] for r in results) == list(range(nprocs))
    for r in results:
        assert r["bad"] == {}, r
        assert r["errors"] == 0, r


def test_ragged_bad_table_is_an_error_on_both_ends(mps_env):  # noqa: F811
    env = dict(mps_env, RAGGED_MODE="bad")
    results = _run_step_processes(env, 2, 64, 2, False, script=_RAGGED_WORKER)
    for r in results:
        assert r["bad"] == {}, r
        assert r["error"] is not None, r
        assert "ragged_all_to_all's slice 1 of rank 0 is out of range" in r["error"], r
