"""Many independent collectives in one program run in program order (no deadlock).

XLA may run custom calls with no data dependency between them concurrently and in a different
order on each device; each collective blocks its thread until its peers arrive. The lowering
chains jax_rccl's calls (an ordering operand), so 40 independent psums finish like jax.lax's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_rccl


@pytest.mark.parametrize("count", [1023, 100_000])
def test_forty_independent_psums(count):
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 CPU devices")
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))

    def f(*vs):
        return [jax_rccl.psum(v, "x") for v in vs]

    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    vs = [jnp.full((8 * count,), float(i)) for i in range(40)]
    for i, out in enumerate(g(*vs)):
        np.testing.assert_allclose(np.asarray(out), 8.0 * i)


def test_calls_are_chained_in_the_lowering():
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))

    def f(a, b):
        return jax_rccl.psum(a, "x"), jax_rccl.pmax(b, "x")

    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    text = g.lower(jnp.ones(16), jnp.ones(16)).as_text()
    calls = [line for line in text.splitlines() if "custom_call @jax_rccl" in line]
    assert len(calls) == 2
    # The second call takes one more operand than it has results: the ordering slice.
    assert "stablehlo.slice" in text


def test_a_new_program_does_not_chain_to_an_old_one():
    """The first call of each lowered program has only its own operands, however many programs
    were lowered (and freed) before: the chain never reaches into another module."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    for k in range(30):
        g = jax.jit(
            jax.shard_map(
                lambda v, k=k: jax_rccl.psum(v * k, "x"),
                mesh=mesh,
                in_specs=P("x"),
                out_specs=P("x"),
            )
        )
        text = g.lower(jnp.ones(8 * (k + 1))).as_text()
        assert "stablehlo.slice" not in text, text
        del g, text
