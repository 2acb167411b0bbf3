"""One process of tests/gpu/test_gpu_cross_host.py's settings that differ between processes:
argv process, nprocs, port, count, steps (steps unused). One psum over `count` elements per rank;
prints a RESULT line of whether it raised and the error. Process 0 serves JAX's coordination
service: it waits (bounded) for the others' results; every process leaves by os._exit (JAX's
shutdown would wait on a failed communicator)."""

import os
import sys

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import gpu_world  # noqa: E402


def main() -> None:
    world = gpu_world.join()
    import jax_rccl

    n, count, process = world.n, world.count, world.process
    f = jax.jit(
        jax.shard_map(
            lambda v: jax_rccl.psum(v, "i"), mesh=world.mesh, in_specs=P("i"), out_specs=P("i")
        )
    )
    x = jax.make_array_from_callback((n * count,), world.spec, lambda idx: np.ones(n * count)[idx])
    out = {"process": process, "raised": False}
    try:
        jax.block_until_ready(f(x))
    except Exception as e:  # noqa: BLE001 - reported to the test
        out.update(raised=True, error=f"{type(e).__name__}: {e}")
    gpu_world.leave(out, ("xhost_setting", process, list(range(1, world.nprocs)), "the others"))


if __name__ == "__main__":
    main()
