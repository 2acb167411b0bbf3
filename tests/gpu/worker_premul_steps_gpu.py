"""One process of tests/gpu/test_jax_gpu.py's premul tests in command buffers: argv steps, types
(a JSON list of the leaf types this build's device code reduces over). all_reduce of a pytree of
one 4,099-element leaf per type on one GPU, with a premul scalar computed on the device from the
step counter (a new value every step), `steps` times, each result compared on the device with
its closed form. Prints one JSON line: the steps, the counter ("k"), the mismatches, and
jax_rccl's executions after the first step and errors."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_rccl


def main() -> None:
    steps = int(sys.argv[1])
    types = json.loads(sys.argv[2])  # the leaf types this build's device code reduces over
    mesh = Mesh(np.array(jax.devices()[:1]), ("i",))
    rng = np.random.default_rng(0)

    def ints():
        return rng.integers(-3, 4, 4099).astype(np.float32)

    leaf = {
        "float32": lambda: ints(),
        "bfloat16": lambda: ints().astype(jnp.bfloat16),
        "float16": lambda: ints().astype(np.float16),
        "complex64": lambda: (ints() + 1j * ints()).astype(np.complex64),
    }
    xs = tuple(leaf[t]() for t in types)

    # The state (step counter, mismatches) is donated, the inputs stay: every buffer keeps its
    # address from step to step, so a captured command buffer is replayed as it is. The premul
    # scalar is computed on the device from the step counter, a new value every step, and each
    # result is compared on the device with its closed form.
    def body(xs, k, bad):
        s = (k[0] % 16.0) * 0.25 - 1.0  # -1 .. 2.75 in quarters: exact in every type
        ys = jax_rccl.all_reduce(xs, "i", premul=s)
        for x, y in zip(xs, ys, strict=True):
            if jnp.issubdtype(x.dtype, jnp.complexfloating):
                want = x * s.astype(x.dtype)
            else:
                want = (x.astype(jnp.float32) * s).astype(x.dtype)
            bad = bad + jnp.sum(y != want).astype(jnp.int32).reshape(1)
        return k + 1.0, bad

    step = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")), donate_argnums=(1, 2)
    )
    xd = tuple(jax.device_put(x) for x in xs)
    k, bad = jnp.zeros(1, jnp.float32), jnp.zeros(1, jnp.int32)
    k, bad = step(xd, k, bad)  # compile and first run
    jax.block_until_ready(bad)
    jax_rccl.reset_runtime_stats()
    for _ in range(1, steps):
        k, bad = step(xd, k, bad)
    stats = jax_rccl.runtime_stats()
    print(
        json.dumps(
            {
                "steps": steps,
                "k": float(np.asarray(k)[0]),
                "bad": int(np.asarray(bad)[0]),
                "executions": int(stats["executions"]),
                "errors": int(stats["errors"]),
            }
        )
    )


if __name__ == "__main__":
    main()
