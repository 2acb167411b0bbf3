"""Whole training steps written with jax.lax only, on 8 virtual CPU devices: each compiled twice in
one process, as XLA lowers it and under ``jax_rccl.install()``, and timed in turns (calls
alternating, median per call, the median of ``--runs`` runs).

The steps have the shapes of the common parallel layouts (many small collectives per step, as
users' programs have): a tensor-parallel MLP (the activations' all_gather and psum_scatter around
column- and row-sharded weights), a fully sharded data-parallel MLP (every layer's weights
gathered before use, their gradients scattered back: the reduce-scatter JAX inserts as the
all_gather's transpose), a data-parallel step with replicated weights (the gradient all-reduce JAX
inserts), and a ring attention (``ppermute`` in ``scan``, ``psum(1, axis)`` for the ring size).

    .venv/bin/python -P benchmarks/cpu_programs.py [--programs tp,fsdp] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, under python -P too

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_rccl  # noqa: E402

N = 8
MESH = Mesh(np.array(jax.devices()[:N]), ("i",))


def _put(x, spec):
    return jax.device_put(x, NamedSharding(MESH, spec))


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.1


def tp_step(d=512, layers=4, batch=64):
    """Each layer: x (batch-sharded) all_gathered, times a column-sharded W1, relu, times a
    row-sharded W2, psum_scattered back to batch shards; loss and its gradient."""

    def loss(ws, x):
        for w1, w2 in ws:
            full = lax.all_gather(x, "i", tiled=True)
            h = jax.nn.relu(full @ w1)
            x = lax.psum_scatter(h @ w2, "i", scatter_dimension=0, tiled=True)
        return lax.psum(jnp.sum(x * x), "i")

    def step(ws, x):
        return jax.value_and_grad(loss)(ws, x)

    ws = [(_rand((d, d // N * N), 2 * k), _rand((d, d), 2 * k + 1)) for k in range(layers)]
    specs = [(P(None, "i"), P("i", None)) for _ in ws]
    fn = jax.shard_map(
        step, mesh=MESH, in_specs=(specs, P("i")), out_specs=(P(), specs), check_vma=False
    )
    args = ([(_put(a, s1), _put(b, s2)) for (a, b), (s1, s2) in zip(ws, specs, strict=True)],)
    return fn, (*args, _put(_rand((batch, d), 99), P("i")))


def fsdp_step(d=256, layers=6, batch=64):
    """Every layer's weight sharded over devices on its rows, all_gathered before use; the
    gradient of the all_gather is the reduce-scatter JAX inserts."""

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ lax.all_gather(w, "i", tiled=True))
        return lax.pmean(jnp.mean(x * x), "i")

    fn = jax.shard_map(
        lambda ws, x: jax.value_and_grad(loss)(ws, x),
        mesh=MESH,
        in_specs=([P("i")] * layers, P("i")),
        out_specs=(P(), [P("i")] * layers),
        check_vma=False,
    )
    ws = [_put(_rand((d, d), k), P("i")) for k in range(layers)]
    return fn, (ws, _put(_rand((batch, d), 99), P("i")))


def dp_step(d=256, layers=4, batch=64):
    """Replicated weights, batch-sharded data: the gradients' all-reduce is the one JAX inserts
    for the weights' implicit broadcast."""

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return lax.psum(jnp.sum(x * x), "i")

    fn = jax.shard_map(
        lambda ws, x: jax.value_and_grad(loss)(ws, x),
        mesh=MESH,
        in_specs=([P()] * layers, P("i")),
        out_specs=(P(), [P()] * layers),
    )
    ws = [_put(_rand((d, d), k), P()) for k in range(layers)]
    return fn, (ws, _put(_rand((batch, d), 99), P("i")))


def ring_attention(seq=1024, dim=64):
    """Blockwise attention over a sequence sharded on the ring: keys and values travel by
    ppermute in a scan; the ring size comes from psum(1, axis)."""

    def attend(q, k, v):
        n = lax.psum(1, "i")
        perm = [(j, (j + 1) % n) for j in range(n)]

        def body(carry, _):
            k, v, acc, denom, mx = carry
            s = q @ k.T / np.sqrt(dim)
            new_mx = jnp.maximum(mx, s.max(-1, keepdims=True))
            scale = jnp.exp(mx - new_mx)
            p = jnp.exp(s - new_mx)
            acc = acc * scale + p @ v
            denom = denom * scale + p.sum(-1, keepdims=True)
            k, v = lax.ppermute(k, "i", perm), lax.ppermute(v, "i", perm)
            return (k, v, acc, denom, new_mx), None

        init = (
            k,
            v,
            jnp.zeros_like(q),
            jnp.zeros(q.shape[:1] + (1,)),
            jnp.full((q.shape[0], 1), -1e9),
        )
        (_, _, acc, denom, _), _ = lax.scan(body, init, None, length=n)
        return acc / denom

    fn = jax.shard_map(
        lambda q, k, v: jax.value_and_grad(lambda q: jnp.sum(attend(q, k, v)))(q),
        mesh=MESH,
        in_specs=(P("i"), P("i"), P("i")),
        out_specs=(P(), P("i")),
        check_vma=False,
    )
    qkv = [_put(_rand((seq, dim), s), P("i")) for s in range(3)]
    return fn, tuple(qkv)


PROGRAMS = {"tp": tp_step, "fsdp": fsdp_step, "dp": dp_step, "ring_attention": ring_attention}


def _compile(fn, args, ours: bool):
    if ours:
        jax_rccl.install(platforms=("cpu",))
    try:
        compiled = jax.jit(fn).lower(*args).compile()
    finally:
        if ours:
            jax_rccl.uninstall()
    text = compiled.as_text()
    return (
        compiled,
        text.count("jax_rccl_"),
        sum(
            text.count(op)
            for op in ("all-reduce(", "all-gather(", "reduce-scatter(", "collective-permute(")
        ),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--min-iters", type=int, default=10)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    args = ap.parse_args()
    print(
        f"jax {jax.__version__}, {N} CPU devices, {os.cpu_count()} cores; time = median per step "
        f"(calls alternating), median of {args.runs} runs; ratio = jax.lax time / jax_rccl time"
    )
    head = (
        f"{'program':<16}{'XLA colls':>10}{'ours':>6} | {'lax us':>10} | {'rccl us':>10} | "
        f"{'ratio':>6}"
    )
    _common.print_head(head)
    for name in args.programs.split(","):
        fn, fargs = PROGRAMS[name]()
        f_lax, _, n_xla = _compile(fn, fargs, ours=False)
        f_ours, n_ours, n_left = _compile(fn, fargs, ours=True)
        a = jax.tree.map(np.asarray, f_lax(*fargs))
        b = jax.tree.map(np.asarray, f_ours(*fargs))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-5)
        runs = [
            _common.time_pair(
                f_lax, f_ours, fargs, args.min_iters, args.min_seconds, jax.block_until_ready
            )
            for _ in range(args.runs)
        ]
        t_lax = statistics.median(r[0] for r in runs)
        t_ours = statistics.median(r[1] for r in runs)
        ours = f"{n_ours}" + ("" if n_left == 0 else f"+{n_left}xla")
        print(
            f"{name:<16}{n_xla:>10}{ours:>6} | {t_lax * 1e6:10.1f} | {t_ours * 1e6:10.1f} | "
            f"{t_lax / t_ours:6.2f}"
        )


if __name__ == "__main__":
    main()
