"""Programs of the ragged_all_to_all tests across processes (test_ragged_mp.py), run by
launcher.py like worker.py's: ``python -P worker_ragged.py <program> --process=i --nprocs=N
--port=P``. Reports ``JAX_RCCL_RESULT {json}``: ``ok``, ``wrong`` (results that differ from the
NumPy reference), and for the bad call ``raised`` and ``error``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -P: not on the path
from worker import _global, _raised, init, report, run_programs, session  # noqa: E402


def _case(np, rng, n, n_rows, m_rows):
    """Valid offsets and sizes for n devices (one slice per peer): slices packed in a random
    order with gaps into the operand, and laid out in a random order on each receiver."""
    send = np.zeros((n, n), np.int32)
    for s in range(n):
        budget = n_rows
        for i in rng.permutation(n):
            send[s, i] = rng.integers(0, budget // 2 + 1)
            budget -= send[s, i]
    in_off = np.zeros((n, n), np.int32)
    for s in range(n):
        at, gap = 0, n_rows - int(send[s].sum())
        for i in rng.permutation(n):
            skip = int(rng.integers(0, gap + 1))
            gap, at = gap - skip, at + skip
            in_off[s, i] = at
            at += int(send[s, i])
    out_off = np.zeros((n, n), np.int32)
    recv = send.T.copy()  # recv[d, s] = send[s, d]
    for d in range(n):
        at, gap = 0, m_rows - int(send[:, d].sum())
        for s in rng.permutation(n):
            skip = int(rng.integers(0, gap + 1))
            gap, at = gap - skip, at + skip
            out_off[s, d] = at
            at += int(send[s, d])
    return in_off, send, out_off, recv


def _reference(np, x, y, in_off, send, out_off):
    res = np.array(y, copy=True)
    for s in range(x.shape[0]):
        for d in range(x.shape[0]):
            a, b, m = in_off[s, d], out_off[s, d], send[s, d]
            res[d, b : b + m] = x[s, a : a + m]
    return res


def prog_ragged(args):
    """Three different sets of offsets through one jitted program, then a call whose offsets
    overflow the output (every process must raise), then a good call again."""
    jax = init(args)
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import jax_rccl as jr

    mesh = Mesh(np.array(jax.devices()), ("i",))
    n = len(jax.devices())
    n_rows, m_rows, row = 24, 40, 5
    rng = np.random.default_rng(1234)  # the same case in every process
    f = jax.jit(
        jax.shard_map(
            lambda x, y, a, b, c, d: jr.ragged_all_to_all(
                x[0], y[0], a[0], b[0], c[0], d[0], axis_name="i"
            )[None],
            mesh=mesh,
            in_specs=P("i"),
            out_specs=P("i"),
        )
    )
    x_full = rng.standard_normal((n, n_rows, row)).astype(np.float32)
    y_full = rng.standard_normal((n, m_rows, row)).astype(np.float32)
    x, y = (_global(jax, mesh, P("i"), v) for v in (x_full, y_full))
    wrong = []

    def call(idx):
        return f(x, y, *(_global(jax, mesh, P("i"), v) for v in idx))

    def check(idx):
        out = call(idx)
        want = _reference(np, x_full, y_full, *idx[:3])
        for s in out.addressable_shards:
            got = np.asarray(s.data)
            if not np.array_equal(got, want[s.index]):
                wrong.append(f"device {s.device.id}: rows differ")

    cases = [_case(np, rng, n, n_rows, m_rows) for _ in range(3)]
    for idx in cases:
        check(idx)
    bad = [v.copy() for v in cases[0]]
    bad[0][n - 1, 0] = 0
    bad[2][n - 1, 0] = m_rows  # rank n-1's slice to rank 0 starts past the output's end
    bad[1][n - 1, 0] = max(1, bad[1][n - 1, 0])
    bad[3][0, n - 1] = bad[1][n - 1, 0]
    failed = _raised(lambda: jax.block_until_ready(call(bad)))
    check(cases[1])
    report(ok=True, wrong=wrong, session=session(), **failed)


PROGRAMS = {"ragged": prog_ragged}


def main(argv=None) -> int:
    return run_programs(PROGRAMS, argv, shutdown_timeout=2)


if __name__ == "__main__":
    sys.exit(main())
