"""One process of tests/gpu/test_gpu_cross_host.py's process that exits: argv process, nprocs,
port, count, steps; environment JAX_RCCL_TEST_VICTIM, the process that leaves.

A jitted step of ppermute, psum and all_gather on `count` int32 elements per rank; after one good
step (every rank at a barrier) the victim leaves by os._exit right before its second, and every
survivor runs the remaining steps and, if none raised, a new program. Prints a RESULT line:
whether the first step was right, whether, where and what the process raised, the seconds from
its second step to the error, and jax_rccl's runtime errors. Every process leaves by os._exit:
JAX's shutdown would wait for the process that left."""

import os
import sys
import time

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import gpu_world  # noqa: E402


def main() -> None:
    victim = int(os.environ["JAX_RCCL_TEST_VICTIM"])
    world = gpu_world.join()
    import jax_rccl
    from jax_rccl import _compat

    n, mesh, spec, process = world.n, world.mesh, world.spec, world.process
    count, steps, rank = world.count, world.steps, world.rank
    perm = [(k, (k + 1) % n) for k in range(n)]
    client = _compat.distributed_client()
    out = {"process": process, "rank": rank, "victim": process == victim, "raised": False}
    # Process 0 serves JAX's coordination service, whose end aborts the others: it waits (a
    # bounded time) until every other survivor has printed its result. The victim meets no one.
    survivors = [q for q in range(1, world.nprocs) if q != victim]
    meeting = None if process == victim else ("xhost_fault", process, survivors, "the survivors")

    def body(x):
        return (
            jax_rccl.ppermute(x, "i", perm),
            jax_rccl.psum(x, "i"),
            jax_rccl.all_gather(x, "i", tiled=True),
        )

    step = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=(P("i"),) * 3),
        donate_argnums=0,
    )
    x0 = [((np.arange(count) + 7 * r) % 13 - 6).astype(np.int32) for r in range(n)]
    x = jax.make_array_from_callback((n * count,), spec, lambda idx: np.concatenate(x0)[idx])
    x, s, g = step(x)
    got = [np.asarray(a.addressable_shards[0].data) for a in (x, s, g)]
    want = [x0[(rank - 1) % n], np.sum(x0, axis=0), np.concatenate(x0)]
    out["first_step_ok"] = all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    # Every rank has all of its first step before the victim goes.
    client.wait_at_barrier("xhost_fault/first_step", 60_000)
    if process == victim:
        gpu_world.leave(out, meeting)  # right before its second step
    t0 = time.monotonic()
    for k in range(1, steps):
        try:
            x, s, g = step(x)
            jax.block_until_ready((x, s, g))
        except Exception as e:  # noqa: BLE001 - reported to the test
            out.update(raised=True, where=f"step {k}", error=f"{type(e).__name__}: {e}")
            break
    if not out["raised"]:
        # Replayed command buffers may not run the handler that checks the communicator; a new
        # program's first call does.
        try:
            probe = jax.jit(
                jax.shard_map(
                    lambda v: jax_rccl.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")
                )
            )
            ones = jax.make_array_from_callback(
                (n * 1024,), spec, lambda idx: np.ones(n * 1024, np.float32)[idx]
            )
            jax.block_until_ready(probe(ones))
        except Exception as e:  # noqa: BLE001 - reported to the test
            out.update(raised=True, where="a new program", error=f"{type(e).__name__}: {e}")
    out["seconds"] = time.monotonic() - t0
    out["errors"] = int(jax_rccl.runtime_stats()["errors"])
    gpu_world.leave(out, meeting)


if __name__ == "__main__":
    main()
