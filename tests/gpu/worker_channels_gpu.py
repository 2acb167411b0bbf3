"""One process of tests/gpu/test_jax_gpu.py's test_groups_of_several_gpus_with_any_channel_count
(no argv; JAX_RCCL_NCHANNELS in the environment): psum and ppermute over every visible GPU,
against NumPy; prints OK."""

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_rccl


def main() -> None:
    n = len(jax.devices())
    mesh = Mesh(np.array(jax.devices()), ("i",))
    x = np.arange(n * 70001, dtype=np.float32) % 13
    ring = [(j, (j + 1) % n) for j in range(n)]
    f = jax.jit(
        jax.shard_map(
            lambda v: (jax_rccl.psum(v, "i"), jax_rccl.ppermute(v, "i", ring)),
            mesh=mesh,
            in_specs=P("i"),
            out_specs=P("i"),
        )
    )
    s, p = (np.asarray(a).reshape(n, -1) for a in f(x))
    xs = x.reshape(n, -1)
    np.testing.assert_array_equal(s, np.tile(xs.sum(0), (n, 1)))
    np.testing.assert_array_equal(p, np.roll(xs, 1, axis=0))
    print("OK")


if __name__ == "__main__":
    main()
