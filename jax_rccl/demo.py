"""``make demo``: data-parallel training whose gradients go through jax_rccl.

A small MLP regression trained with ``shard_map`` over 8 virtual CPU devices (by default): each
device holds a slice of the batch, computes its gradients, and averages them with
``jax_rccl.pmean``. The demo prints the loss per step and the plan the runtime chose for the
gradient all-reduce, then runs the same loop with ``jax.lax.pmean`` and checks that both end with
the same parameters.

The gradients are taken with respect to a per-device (``pcast`` to varying) view of the
replicated parameters: differentiating the replicated parameters directly would make JAX sum the
gradients over the devices itself (the transpose of its implicit broadcast), so the explicit
average would see gradients already summed, and the reduction would not go through jax_rccl.
"""

from __future__ import annotations

import argparse
import os


def _set_devices(n: int) -> None:
    # Must run before JAX starts its CPU backend (the first jax.devices() call).
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def main(argv: list[str] | None = None) -> int:
    """Trains, prints the losses and the plan; 0 when both runs end with the same parameters."""
    return 0 if run(argv)["match"] else 1


def run(argv: list[str] | None = None) -> dict:
    """The demo: prints as it goes and returns the losses of both runs and whether they match."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=256)
    args = ap.parse_args(argv)
    _set_devices(args.devices)

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import jax_rccl
    from jax_rccl import planner

    devices = jax.devices()[: args.devices]
    if len(devices) < args.devices:
        raise SystemExit(f"only {len(devices)} devices available; asked for {args.devices}")
    mesh = Mesh(np.array(devices), ("data",))
    n = len(devices)

    key = jax.random.PRNGKey(0)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    d_in, d_out = 32, 4
    params = {
        "w1": jax.random.normal(k1, (d_in, args.hidden)) / np.sqrt(d_in),
        "b1": jnp.zeros((args.hidden,)),
        "w2": jax.random.normal(k2, (args.hidden, d_out)) / np.sqrt(args.hidden),
        "b2": jnp.zeros((d_out,)),
    }
    true_w = jax.random.normal(k3, (d_in, d_out))
    x = jax.random.normal(k4, (args.batch, d_in))
    # A smooth target the network can fit: unit-variance projections through a sine.
    y = jnp.sin(x @ true_w / np.sqrt(d_in))

    def loss_fn(p, xb, yb):
        h = jnp.tanh(xb @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - yb) ** 2)

    def make_step(pmean):
        def step(p, xb, yb):
            # Per-device gradients of this device's slice (see the module's doc).
            local = jax.tree.map(lambda w: jax.lax.pcast(w, "data", to="varying"), p)
            loss, grads = jax.value_and_grad(loss_fn)(local, xb, yb)
            grads = pmean(grads, "data")  # one grouped call for the whole gradient pytree
            loss = pmean(loss, "data")
            p = jax.tree.map(lambda w, g: w - 0.1 * g, p, grads)
            return p, loss

        return jax.jit(
            jax.shard_map(
                step, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P())
            )
        )

    def train(pmean, label):
        step = make_step(pmean)
        p = params
        losses = []
        for _ in range(args.steps):
            p, loss = step(p, x, y)
            losses.append(float(loss))
        return p, losses

    print(f"data-parallel MLP on {n} CPU devices, batch {args.batch}, {args.steps} steps")
    p_rccl, losses = train(jax_rccl.pmean, "jax_rccl")
    for i, loss in enumerate(losses):
        print(f"step {i:3d}  loss {loss:.6f}")

    # The plan the runtime made for the gradient all-reduce: one group of four avg all-reduces.
    topo = planner.Topology.from_native(jax_rccl.runtime_topology(n))
    tasks = [
        planner.Task("all_reduce", int(np.prod(v.shape)), str(v.dtype), op="avg")
        for v in jax.tree.leaves(params)
    ]
    print("\nplan of the gradient all-reduce (every rank plans the same):")
    print(planner.explain(tasks, topo))
    stats = jax_rccl.runtime_stats()
    print(f"\nruntime: {stats['plans_built']} plans built, {stats['executions']} executions")

    p_lax, lax_losses = train(jax.lax.pmean, "jax.lax")
    pairs = zip(jax.tree.leaves(p_rccl), jax.tree.leaves(p_lax), strict=True)
    worst = max(float(jnp.max(jnp.abs(a - b))) for a, b in pairs)
    ok = worst <= 1e-5
    print(
        f"\nfinal parameters vs the same loop with jax.lax.pmean: max |diff| = {worst:.2e} "
        f"({'match' if ok else 'MISMATCH'}); final loss {losses[-1]:.6f} vs {lax_losses[-1]:.6f}"
    )
    return {"losses": losses, "lax_losses": lax_losses, "max_diff": worst, "match": ok}


if __name__ == "__main__":
    raise SystemExit(main())
