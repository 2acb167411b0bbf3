"""One process of a thousand steps checked on the device (tests/gpu/test_jax_gpu_mp.py and, across
faked hosts, test_gpu_cross_host.py): argv process, nprocs, port, count, steps [--world].

At step k rank m holds x = f((m - k) mod n), f(r) = ((i + 7 r) % 13) - 6 over i < count; the
ppermute of the step hands rank m + 1 its next x. Every result's closed form is computed on the
device from (m, k) and compared there: a mismatch count per collective, carried (with k and x) in
donated buffers, so a captured command buffer replays with the same addresses. Prints a RESULT
line: this process's rank, the steps run, the collectives that mismatched and jax_rccl's runtime
errors; with --world a second one of what the world table says about hosts (gpu_world.hosts)."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import gpu_world  # noqa: E402

NAMES = ["psum_i32", "psum_f32", "all_gather", "psum_scatter", "ppermute", "all_to_all"]


def main() -> None:
    world = gpu_world.join()
    import jax_rccl

    n, mesh, spec, count, steps = world.n, world.mesh, world.spec, world.count, world.steps
    b = count // n
    perm = [(j, (j + 1) % n) for j in range(n)]

    def f(r):
        return (lax.iota(jnp.int32, count) + 7 * r) % 13 - 6

    def body(x, k, bad):
        m = lax.axis_index("i")
        kk = k[0]
        src = [f((r - kk) % n) for r in range(n)]  # every rank's input of this step
        tot = sum(src)
        got = [
            jax_rccl.psum(x, "i"),
            jax_rccl.psum(x.astype(jnp.float32), "i"),
            jax_rccl.all_gather(x, "i", tiled=True),
            jax_rccl.psum_scatter(x, "i", tiled=True),
            jax_rccl.ppermute(x, "i", perm),
            jax_rccl.all_to_all(x, "i", 0, 0, tiled=True),
        ]
        want = [
            tot,
            tot.astype(jnp.float32),
            jnp.concatenate(src),
            lax.dynamic_slice(tot, (m * b,), (b,)),
            f((m - 1 - kk) % n),
            jnp.concatenate([lax.dynamic_slice(c, (m * b,), (b,)) for c in src]),
        ]
        mismatches = [jnp.sum(g != w).astype(jnp.int32) for g, w in zip(got, want, strict=True)]
        bad = bad + jnp.stack(mismatches)[None]
        return got[4], k + 1, bad

    step = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")),
        donate_argnums=(0, 1, 2),
    )
    x0 = np.concatenate([((np.arange(count) + 7 * r) % 13 - 6).astype(np.int32) for r in range(n)])
    x = jax.make_array_from_callback((n * count,), spec, lambda idx: x0[idx])
    k = jax.make_array_from_callback((n,), spec, lambda idx: np.zeros(n, np.int32)[idx])
    bad = jax.make_array_from_callback(
        (n, len(NAMES)), spec, lambda idx: np.zeros((n, len(NAMES)), np.int32)[idx]
    )
    for _ in range(steps):
        x, k, bad = step(x, k, bad)
    jax.block_until_ready(bad)
    counts = np.asarray(bad.addressable_shards[0].data)[0]
    gpu_world.result(
        {
            "rank": world.rank,
            "steps": int(np.asarray(k.addressable_shards[0].data)[0]),
            "bad": {name: int(c) for name, c in zip(NAMES, counts, strict=True) if c},
            "errors": int(jax_rccl.runtime_stats()["errors"]),
        }
    )
    gpu_world.result_of_hosts_if_asked()


if __name__ == "__main__":
    main()
