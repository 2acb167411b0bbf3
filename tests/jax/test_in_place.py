"""all_reduce runs in place: its results may share their operands' buffers.

XLA reuses a dead operand (a donated input, a temporary) for the result and copies a live one
first, so nothing a caller still holds is overwritten.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_rccl


def mesh8():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 CPU devices")
    return Mesh(np.array(jax.devices()[:8]), ("x",))


def test_the_lowering_declares_the_aliases():
    mesh = mesh8()
    g = jax.jit(
        jax.shard_map(
            lambda a, b: jax_rccl.psum((a, b), "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x")
        )
    )
    text = g.lower(jnp.ones(16), jnp.ones(32)).as_text()
    assert "output_operand_aliases" in text


@pytest.mark.parametrize("algorithm", [None, "Ring", "Tree", "Direct"])
@pytest.mark.parametrize("count", [5, 4099, 1 << 20])
def test_inputs_used_after_the_psum_are_intact(algorithm, count):
    mesh = mesh8()

    def f(x):
        with jax_rccl.config(algorithm=algorithm):
            y = jax_rccl.psum(x, "x")
        return x * 1.0, y, x + y  # x is still live after the psum

    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    x = jnp.arange(8 * count, dtype=jnp.float32) % 7
    x_host = np.asarray(x)
    a, y, s = g(x)
    want = x_host.reshape(8, count).sum(0)
    np.testing.assert_array_equal(np.asarray(a), x_host)
    np.testing.assert_array_equal(np.asarray(y).reshape(8, count), np.tile(want, (8, 1)))
    np.testing.assert_array_equal(np.asarray(s), x_host + np.tile(want, 8))
    np.testing.assert_array_equal(np.asarray(x), x_host)  # the caller's array


def test_donated_input_is_reduced_in_place():
    mesh = mesh8()
    g = jax.jit(
        jax.shard_map(
            lambda v: jax_rccl.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x")
        ),
        donate_argnums=0,
    )
    x = jnp.ones(8 * 4096, jnp.float32)
    for k in range(1, 4):
        x = g(x)
        np.testing.assert_array_equal(np.asarray(x), np.full(8 * 4096, 8.0**k, np.float32))


def test_gradient_temporaries_through_psum():
    mesh = mesh8()

    def step(w, xb):
        g = jax.grad(lambda w: jnp.sum((xb * w) ** 2))(w)
        return w - 0.01 * jax_rccl.pmean(g, "x")

    f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("x")), out_specs=P()))
    fl = jax.jit(
        jax.shard_map(
            lambda w, xb: (
                w - 0.01 * jax.lax.pmean(jax.grad(lambda w: jnp.sum((xb * w) ** 2))(w), "x")
            ),
            mesh=mesh,
            in_specs=(P(), P("x")),
            out_specs=P(),
        )
    )
    w = jnp.linspace(-1, 1, 257, dtype=jnp.float32)
    xb = jnp.linspace(0, 2, 8 * 257, dtype=jnp.float32).reshape(8, 257)
    np.testing.assert_allclose(np.asarray(f(w, xb)), np.asarray(fl(w, xb)), rtol=1e-6)
