"""One process of tests/multiprocess/test_lax_backend_mp.py (CPU devices) and
tests/gpu/test_lax_backend_gpu.py (processes sharing a GPU): a step written with jax.lax
only, under jax_rccl.install() (argv: process, nprocs, port, count,
steps). Prints RESULT with the mismatches against each collective's closed form and whether the
compiled program holds jax_rccl's calls and no XLA collective."""

import json
import sys

import jax
import numpy as np

process, nprocs, port, count, steps = (int(a) for a in sys.argv[1:6])
jax.distributed.initialize(f"127.0.0.1:{port}", nprocs, process, initialization_timeout=120)

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_rccl  # noqa: E402

jax_rccl.install()
devs = jax.devices()
n = len(devs)
mesh = Mesh(np.array(devs), ("i",))
spec = NamedSharding(mesh, P("i"))
perm = [(k, (k + 1) % n) for k in range(n)]


def body(x, y):
    return (
        lax.ppermute(x, "i", perm),
        lax.psum(y, "i"),
        lax.all_gather(x, "i", tiled=True),
        lax.psum_scatter(x, "i", tiled=True),
        lax.all_to_all(x, "i", 0, 0, tiled=True),
    )


moves = jax.shard_map(
    body, mesh=mesh, in_specs=(P("i"), P("i")), out_specs=(P("i"),) * 5, check_vma=False
)
# w replicated into shard_map: the gradient's all-reduce is the one JAX inserts.
loss = jax.shard_map(
    lambda w, y: lax.psum(jnp.sum(w * y), "i"), mesh=mesh, in_specs=(P(), P("i")), out_specs=P()
)


@jax.jit
def step(x, y, w):
    return (*moves(x, y), jax.grad(loss)(w, y))


x0 = [((np.arange(count) + 7 * r) % 13 - 6).astype(np.int32) for r in range(n)]
x = jax.make_array_from_callback((n * count,), spec, lambda idx: np.concatenate(x0)[idx])
y = jax.jit(lambda v: v.astype(jnp.float32))(x)
# Replicated without jax.device_put, whose check that every process passed the same value runs an
# XLA all-gather (NCCL, which refuses processes that share one GPU).
w = jax.make_array_from_callback(
    (count,), NamedSharding(mesh, P()), lambda idx: np.ones(count, np.float32)[idx]
)
text = step.lower(x, y, w).compile().as_text()
xla_ops = [
    op
    for op in (
        "all-reduce(",
        "all-gather(",
        "reduce-scatter(",
        "all-to-all(",
        "collective-permute(",
    )
    if op in text
]
tot = np.sum(x0, axis=0)
me, b = process, count // n
bad = {}
for k in range(steps):
    cur = [x0[(r - k) % n] for r in range(n)]
    outs = step(x, y, w)
    got = [np.asarray(o.addressable_shards[0].data) for o in outs]
    want = [
        cur[(me - 1) % n],
        (tot * n**k).astype(np.float32),
        np.concatenate(cur),
        tot[me * b : (me + 1) * b],
        np.concatenate([c[me * b : (me + 1) * b] for c in cur]),
        (tot * n**k).astype(np.float32),  # the gradient: the sum of every rank's y
    ]
    names = ["ppermute", "psum", "all_gather", "psum_scatter", "all_to_all", "grad_psum"]
    for name, g, wnt in zip(names, got, want, strict=True):
        if g.shape != wnt.shape or not np.array_equal(g, wnt):
            bad[f"step {k} {name}"] = (
                int(np.count_nonzero(g != wnt)) if g.shape == wnt.shape else -1
            )
    x, y = outs[0], outs[1]
print(
    "RESULT "
    + json.dumps(
        {
            "bad": bad,
            "ours": "jax_rccl_" in text,
            "xla_ops": xla_ops,
            "errors": int(jax_rccl.runtime_stats()["errors"]),
        }
    ),
    flush=True,
)
