"""all_reduce runs in place: its results may share their operands' buffers.

XLA reuses a dead temporary operand for the result and copies a live one first, so nothing a
caller still holds is overwritten. Parameters of the jitted function are not aliased: XLA would
copy them (twice when donated) rather than write into them.
"""

import re

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


def aliased_operands(text: str) -> list[int]:
    """The operand indices of every output_operand_aliases entry in the lowered text."""
    return [int(m) for m in re.findall(r"operand_index = (\d+)", text)]


def test_the_lowering_aliases_temporaries_not_parameters():
    mesh = mesh8()

    def lower(f, *args, donate=()):
        g = jax.jit(
            jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")), donate_argnums=donate
        )
        return g.lower(*args).as_text()

    a, b = jnp.ones(16), jnp.ones(32)
    # Both leaves computed: both results share their operands' buffers.
    text = lower(lambda a, b: jax_rccl.psum((a * 2, b + 1), "x"), a, b)
    assert "output_operand_aliases" in text
    assert aliased_operands(text) == [0, 1]
    # Leaf 0 a parameter, leaf 1 computed: only leaf 1.
    text = lower(lambda a, b: jax_rccl.psum((a, b * 3), "x"), a, b)
    assert aliased_operands(text) == [1]
    # Parameters, donated or not: no alias (XLA would copy them instead).
    for donate in ((), (0, 1)):
        text = lower(lambda a, b: jax_rccl.psum((a, b), "x"), a, b, donate=donate)
        assert "output_operand_aliases" not in text
    # A parameter of a nested jit counts as a temporary of the outer program.
    inner = jax.jit(lambda v: jax_rccl.psum(v, "x"))
    text = lower(lambda a: inner(a), a)
    assert aliased_operands(text) == [0]


def test_a_psum_of_a_parameter_copies_nothing():
    mesh = mesh8()
    g = jax.jit(
        jax.shard_map(lambda v: jax_rccl.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    )
    hlo = g.lower(jnp.ones(8 * 4096)).compile().as_text()
    entry = hlo[hlo.index("ENTRY") :]
    assert " copy(" not in entry and "copy_fusion" not in entry, entry


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


def test_donated_input_feeds_the_next_call():
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


@pytest.mark.parametrize("donate", [False, True])
def test_shaped_and_scalar_leaves_keep_their_shapes(donate):
    mesh = mesh8()

    def f(a, b):
        s = jnp.sum(a)  # a computed scalar: aliased
        ra, rb, rs = jax_rccl.psum((a, b * 2, s), "x")
        return ra, rb, rs[None], jax_rccl.psum(ra, "x")  # ordered after the first call

    def ref(a, b):
        ra, rb, rs = jax.lax.psum((a, b * 2, jnp.sum(a)), "x")
        return ra, rb, rs[None], jax.lax.psum(ra, "x")

    spec = P("x")
    a = jnp.arange(8 * 3 * 5, dtype=jnp.float32).reshape(8 * 3, 5)
    b = jnp.arange(8 * 2 * 2 * 3, dtype=jnp.int32).reshape(8 * 2, 2, 3)
    want = jax.jit(jax.shard_map(ref, mesh=mesh, in_specs=spec, out_specs=spec))(a, b)
    g = jax.jit(
        jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec),
        donate_argnums=(0, 1) if donate else (),
    )
    got = g(jnp.array(a), jnp.array(b))
    for x, y in zip(got, want, strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_config_in_place_sets_the_aliases():
    mesh = mesh8()

    def lower(f, *args):
        g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
        return g.lower(*args).as_text()

    def f(a, b):
        return jax_rccl.psum((a, b * 3), "x")

    a, b = jnp.ones(16), jnp.ones(32)
    with jax_rccl.config(in_place=True):
        assert aliased_operands(lower(f, a, b)) == [0, 1]
    with jax_rccl.config(in_place=False):
        assert "output_operand_aliases" not in lower(f, a, b)
        with jax_rccl.config(in_place="auto"):
            assert aliased_operands(lower(f, a, b)) == [1]
    assert aliased_operands(lower(f, a, b)) == [1]


@pytest.mark.parametrize(
    "bad,err", [("on", ValueError), ("yes", ValueError), (1, TypeError), (0.5, TypeError)]
)
def test_config_in_place_rejects_other_values(bad, err):
    with pytest.raises(err, match="in_place must be True, False, 'auto' or None"):
        with jax_rccl.config(in_place=bad):
            pass


def test_config_in_place_takes_numpy_bools():
    mesh = mesh8()
    g = jax.jit(
        jax.shard_map(lambda a: jax_rccl.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    )
    with jax_rccl.config(in_place=np.True_):
        assert aliased_operands(g.lower(jnp.ones(16)).as_text()) == [0]


@pytest.mark.parametrize("donate", [False, True])
def test_in_place_arguments_donated_or_kept(donate):
    mesh = mesh8()
    with jax_rccl.config(in_place=True):
        g = jax.jit(
            jax.shard_map(
                lambda v: jax_rccl.pmax(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x")
            ),
            donate_argnums=0 if donate else (),
        )
        x_host = np.arange(8 * 1000, dtype=np.float32) % 13
        x = jnp.asarray(x_host)
        hlo = g.lower(x).compile().as_text()
        y = g(x)
    want = np.tile(x_host.reshape(8, 1000).max(0), 8)
    np.testing.assert_array_equal(np.asarray(y), want)
    entry = hlo[hlo.index("ENTRY") :]
    if donate:  # reduced where it lies
        assert " copy(" not in entry and "copy_fusion" not in entry, entry
    else:  # XLA copies the argument first; the caller's array is intact
        np.testing.assert_array_equal(np.asarray(x), x_host)
