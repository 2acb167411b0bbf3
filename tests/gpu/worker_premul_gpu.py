"""One process of tests/gpu/test_jax_gpu_mp.py's per-device premul scalars: argv process, nprocs,
port, count, steps.

Rank r holds x_r = base * (r + 1) and scalar s_r = ((k + 3 r) % 16) / 4 - 1 at step k (a new value
every step, different on every rank): the sum is base * sum_r (r + 1) s_r, exact in float32,
checked on the device. The state (k, mismatches) is donated, so the buffers keep their addresses
and a captured command buffer is replayed as it is. Prints a RESULT line: this process's rank,
the steps counted on the device ("k"), the mismatches, and jax_rccl's executions (after the
first step) and errors."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import gpu_world  # noqa: E402


def main() -> None:
    world = gpu_world.join()
    import jax_rccl

    n, mesh, spec, count, steps = world.n, world.mesh, world.spec, world.count, world.steps

    def body(base, k, bad):
        r = lax.axis_index("i").astype(jnp.float32)
        s = ((k[0] + 3.0 * r) % 16.0) * 0.25 - 1.0
        got = jax_rccl.all_reduce(base * (r + 1.0), "i", premul=s)
        w = sum((j + 1.0) * (((k[0] + 3.0 * j) % 16.0) * 0.25 - 1.0) for j in range(n))
        bad = bad + jnp.sum(got != base * w).astype(jnp.int32).reshape(1)
        return k + 1.0, bad

    step = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")), donate_argnums=(1, 2)
    )
    b0 = ((np.arange(count) % 13) - 6).astype(np.float32)
    base = jax.make_array_from_callback((n * count,), spec, lambda idx: np.tile(b0, n)[idx])
    k = jax.make_array_from_callback((n,), spec, lambda idx: np.zeros(n, np.float32)[idx])
    bad = jax.make_array_from_callback((n,), spec, lambda idx: np.zeros(n, np.int32)[idx])
    k, bad = step(base, k, bad)
    jax.block_until_ready(bad)
    jax_rccl.reset_runtime_stats()
    for _ in range(1, steps):
        k, bad = step(base, k, bad)
    stats = jax_rccl.runtime_stats()
    gpu_world.result(
        {
            "rank": world.rank,
            "k": float(np.asarray(k.addressable_shards[0].data)[0]),
            "bad": {"premul": int(np.asarray(bad.addressable_shards[0].data)[0])},
            "executions": int(stats["executions"]),
            "errors": int(stats["errors"]),
        }
    )


if __name__ == "__main__":
    main()
