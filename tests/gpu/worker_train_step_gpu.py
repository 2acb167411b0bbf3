"""One process of tests/gpu/test_jax_gpu.py's command-buffer tests: argv steps. A data-parallel
training step over every visible GPU whose gradient, loss and batch statistics go through
jax_rccl (psum, pmean, all_gather) runs `steps` times on fresh inputs (weights donated), checked
against the same steps in NumPy (float64), then 200 times on the same buffers (a captured command
buffer is replayed). Prints one JSON line: the devices, jax_rccl calls in the program, the steps
and jax_rccl's executions after the first, the errors, the largest relative error of the
statistics and absolute error of the weights, and the replay's executions and sameness."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_rccl

D, LR = 4096, 0.05


def main() -> None:
    steps = int(sys.argv[1])
    n = len(jax.devices())  # data parallel over every visible GPU
    mesh = Mesh(np.array(jax.devices()), ("i",))

    def body(w, x, y):  # w: this device's copy of the weights, x and y: its batch
        def loss(w):
            return jnp.mean((x * w - y) ** 2)

        value, g = jax.value_and_grad(loss)(w)
        g = jax_rccl.psum(g, "i") * (1.0 / n)  # a temp in, a temp out
        value = jax_rccl.pmean(value.reshape(1), "i")
        s = jax_rccl.all_gather(jnp.sum(x).reshape(1), "i", tiled=True)
        stats = jnp.concatenate([value, s]) * 2.0 + 0.5  # results reach outputs through a fusion
        return w - LR * g, stats

    spec = P("i")
    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec), donate_argnums=0)
    sharding = jax.sharding.NamedSharding(mesh, spec)
    rng = np.random.default_rng(0)
    w0 = rng.uniform(-1, 1, D).astype(np.float32)
    xs_np = [rng.uniform(0.5, 1.5, (n, D)).astype(np.float32) for _ in range(steps)]
    ys_np = [rng.uniform(-1, 1, (n, D)).astype(np.float32) for _ in range(steps)]

    def put(a):
        return jax.device_put(a.reshape(-1), sharding)

    def w_init():
        return put(np.tile(w0, (n, 1)))

    xs, ys = [put(a) for a in xs_np], [put(a) for a in ys_np]
    calls = step.trace(w_init(), xs[0], ys[0]).lower().as_text().count("custom_call @jax_rccl_")

    w = w_init()
    w, st = step(w, xs[0], ys[0])  # compile and first run
    jax.block_until_ready(w)
    jax_rccl.reset_runtime_stats()
    stats = []
    for i in range(1, steps):
        w, st = step(w, xs[i], ys[i])
        stats.append(st)
    w_final = np.asarray(w).reshape(n, D)
    stats = np.stack([np.asarray(s).reshape(n, 1 + n) for s in stats])
    counters = jax_rccl.runtime_stats()

    # numpy, float64: the same steps (every device holds the same weights and statistics)
    wr = w0.astype(np.float64)
    want = []
    for i in range(steps):
        x, y = xs_np[i].astype(np.float64), ys_np[i].astype(np.float64)
        r = x * wr - y
        if i > 0:
            row = [np.mean(np.mean(r * r, axis=1)) * 2.0 + 0.5] + list(x.sum(1) * 2.0 + 0.5)
            want.append(np.tile(row, (n, 1)))
        wr = wr - LR * (2.0 * r * x / D).mean(0)
    want = np.asarray(want)
    err_stats = float(np.max(np.abs(stats - want) / (np.abs(want) + 1e-3)))
    err_w = float(np.max(np.abs(w_final - wr[None, :])))

    # Replay: the same step on the same buffers (no donation) 200 times. Captured once, a
    # command buffer is replayed without calling the handlers again.
    step2 = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
    w2 = w_init()
    ref = step2(w2, xs[1], ys[1])
    jax.block_until_ready(ref)
    jax_rccl.reset_runtime_stats()
    same = True
    for _ in range(200):
        out = step2(w2, xs[1], ys[1])
        same = same and bool(np.array_equal(np.asarray(out[1]), np.asarray(ref[1])))
    replay_execs = jax_rccl.runtime_stats()["executions"]
    print(
        json.dumps(
            {
                "devices": n,
                "calls": calls,
                "steps": steps - 1,
                "executions": counters["executions"],
                "errors": counters["errors"],
                "err_stats": err_stats,
                "err_w": err_w,
                "replay_steps": 200,
                "replay_executions": replay_execs,
                "replay_same": same,
            }
        )
    )


if __name__ == "__main__":
    main()
