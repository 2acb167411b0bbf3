"""One process of tests/gpu/test_ragged_gpu.py's processes sharing the GPU: argv process, nprocs,
port, rows, steps; environment RAGGED_MODE ("good", the default, or "bad").

ragged_all_to_all of 20-byte rows, a new offsets table every step (the same on every process:
random sizes and gaps, every fifth step full), every result against NumPy. With RAGGED_MODE=bad,
after the steps rank 0 sends rows past its operand to rank 1, and the call after that is expected
to raise. Prints a RESULT line (this process's rank, the mismatches per step, the error of the
call after the bad table, jax_rccl's runtime errors) and leaves by os._exit."""

import os
import sys

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import gpu_world  # noqa: E402

R = 5  # 20-byte rows: slices start and end off 16-byte boundaries


def main() -> None:
    world = gpu_world.join()
    import jax_rccl

    n, spec, steps = world.n, world.spec, world.steps
    N = M = world.count  # rows
    me = world.rank
    f = jax.jit(
        jax.shard_map(
            lambda x, y, a, b, c, d: jax_rccl.ragged_all_to_all(x, y, a, b, c, d, axis_name="i"),
            mesh=world.mesh,
            in_specs=(P("i"),) * 6,
            out_specs=P("i"),
        )
    )

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
        x = [
            (np.arange(N * R).reshape(N, R) + 1000 * s + 7 * k).astype(np.float32) for s in range(n)
        ]
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
            want[out_off[s, me] : out_off[s, me] + m] = x[s][in_off[s, me] : in_off[s, me] + m]
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
        except Exception as e:  # noqa: BLE001 - reported to the test
            error = str(e)
    out = {
        "rank": me,
        "bad": bad,
        "error": error,
        "errors": int(jax_rccl.runtime_stats()["errors"]),
    }
    gpu_world.leave(out, None)


if __name__ == "__main__":
    main()
