"""One process of the six-collective jitted step (tests/gpu/test_jax_gpu_mp.py and, across faked
hosts, test_gpu_cross_host.py): argv process, nprocs, port, count, steps [--world].

State (x int32, y float32), both donated: x moves one rank on per step (ppermute), y becomes its
psum; psum (int32, float32), all_gather, psum_scatter, ppermute and all_to_all read them, so each
step's results have a closed form. Prints a RESULT line: this process's rank, the mismatches per
step and collective ("bad"), jax_rccl's runtime errors and its connections' counters; with
--world a second one of what the world table says about hosts (gpu_world.hosts)."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import gpu_world  # noqa: E402


def main() -> None:
    world = gpu_world.join()
    import jax_rccl

    n, mesh, spec, count, steps = world.n, world.mesh, world.spec, world.count, world.steps
    perm = [(k, (k + 1) % n) for k in range(n)]

    def body(x, y):
        s_i = jax_rccl.psum(x, "i")
        s_f = jax_rccl.psum(y, "i")
        ag = jax_rccl.all_gather(x, "i", tiled=True)
        rs = jax_rccl.psum_scatter(x, "i", tiled=True)
        pp = jax_rccl.ppermute(x, "i", perm)
        a2a = jax_rccl.all_to_all(x, "i", 0, 0, tiled=True)
        return pp, s_f, (s_i, ag, rs, a2a)

    step = jax.jit(
        jax.shard_map(
            body, mesh=mesh, in_specs=(P("i"), P("i")), out_specs=(P("i"), P("i"), (P("i"),) * 4)
        ),
        donate_argnums=(0, 1),
    )
    x0 = [((np.arange(count) + 7 * r) % 13 - 6).astype(np.int32) for r in range(n)]
    x = jax.make_array_from_callback((n * count,), spec, lambda idx: np.concatenate(x0)[idx])
    y = jax.jit(lambda v: v.astype(jnp.float32))(x)
    tot = np.sum(x0, axis=0)
    me, b = world.process, count // n
    bad = {}
    names = ["ppermute", "psum_f32", "psum_i32", "all_gather", "psum_scatter", "all_to_all"]
    for k in range(steps):
        x, y, outs = step(x, y)
        cur = [x0[(r - k) % n] for r in range(n)]  # this step's inputs
        got = [np.asarray(o.addressable_shards[0].data) for o in (x, y) + tuple(outs)]
        want = [
            cur[(me - 1) % n],
            (tot * n**k).astype(np.float32),
            tot,
            np.concatenate(cur),
            tot[me * b : (me + 1) * b],
            np.concatenate([c[me * b : (me + 1) * b] for c in cur]),
        ]
        for name, g, w in zip(names, got, want, strict=True):
            if g.shape != w.shape or not np.array_equal(g, w):
                same_shape = g.shape == w.shape
                bad[f"step {k} {name}"] = int(np.count_nonzero(g != w)) if same_shape else -1
        print(f"step {k} done", flush=True)
    gpu_world.result(
        {
            "rank": world.rank,
            "bad": bad,
            "errors": int(jax_rccl.runtime_stats()["errors"]),
            "counters": world.connection_counters(),
        }
    )
    gpu_world.result_of_hosts_if_asked()


if __name__ == "__main__":
    main()
