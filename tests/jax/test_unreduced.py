"""The reductions of values typed unreduced (explicit sharding: partial sums still to be added)
next to jax.lax: psum and pmean add them up into an invariant value, as jax.lax.psum's
Unreduced -> Invariant sum; max, min and prod refuse them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import assert_same, needs_runtime
from jax import lax

import jax_rccl

A = np.arange(8.0).reshape(2, 4)
B = np.arange(24.0).reshape(4, 6) - 7


def _mesh(n=2):
    return jax.make_mesh(
        (n,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:n]
    )


def _run(reduce, n=2, dtype=np.float32):
    """reduce(v) in a shard_map over a product a @ b typed unreduced over "x"; returns the
    result and the types of input and result inside the body."""
    types = []
    with jax.set_mesh(_mesh(n)):
        a = jax.device_put(np.tile(A, (1, n // 2)).astype(dtype), jax.P(None, "x"))
        b = jax.device_put(np.tile(B, (n // 2, 1)).astype(dtype), jax.P("x", None))

        @jax.jit
        def g(a, b):
            c = jnp.einsum("ij,jk->ik", a, b, out_sharding=jax.P(unreduced={"x"}))

            @jax.shard_map(in_specs=jax.P(unreduced={"x"}), out_specs=jax.P())
            def body(v):
                y = reduce(v)
                types.append((str(jax.typeof(v)), str(jax.tree.map(jax.typeof, y))))
                return y

            return body(c)

        return g(a, b), types


@needs_runtime
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("name", ["psum", "pmean"])
def test_sum_of_partial_sums_matches_lax(name, n):
    got, got_types = _run(lambda v: getattr(jax_rccl, name)(v, "x"), n)
    want, want_types = _run(lambda v: getattr(lax, name)(v, "x"), n)
    assert got_types == want_types and "U:x" in want_types[0][0], (got_types, want_types)
    assert "U:x" not in got_types[0][1]
    assert_same(got, want)
    full = np.tile(A, (1, n // 2)) @ np.tile(B, (n // 2, 1))
    np.testing.assert_allclose(np.asarray(want) * (n if name == "pmean" else 1), full)


@needs_runtime
@pytest.mark.parametrize("dtype", [np.float32, np.int32, jnp.bfloat16])
def test_dtypes_and_pytree(dtype):
    def fn(lib):
        return lambda v: lib.psum({"v": v, "twice": v + v}, "x")

    got, _ = _run(fn(jax_rccl), dtype=dtype)
    want, _ = _run(fn(lax), dtype=dtype)
    assert_same(got, want)


@needs_runtime
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_all_reduce_sum_and_avg(op):
    got, _ = _run(lambda v: jax_rccl.all_reduce(v, "x", op=op), 4)
    want, _ = _run(lambda v: lax.psum(v, "x") / (4 if op == "avg" else 1), 4)
    assert_same(got, want)


@needs_runtime
def test_mixed_leaves_in_one_call():
    """An unreduced leaf and a varying one (made inside the body) summed in one call."""

    def fn(lib):
        def f(v):
            w = (lax.axis_index("x") + 1).astype(v.dtype) * 3  # varying over "x"
            s = lib.psum((v, w), "x")
            return s[0] + s[1]

        return f

    got, _ = _run(fn(jax_rccl), 2)
    want, _ = _run(fn(lax), 2)
    assert_same(got, want)


@needs_runtime
def test_gradient_matches_lax():
    """psum of an unreduced value transposes to a reduced cast (jax.lax's rule)."""

    def loss(lib):
        def f(a, b):
            c = jnp.einsum("ij,jk->ik", a, b, out_sharding=jax.P(unreduced={"x"}))

            @jax.shard_map(in_specs=jax.P(unreduced={"x"}), out_specs=jax.P())
            def body(v):
                return lib.psum(v, "x")

            return (body(c) ** 2).sum()

        return jax.jit(jax.grad(f, argnums=(0, 1)))

    with jax.set_mesh(_mesh(2)):
        a = jax.device_put(A.astype(np.float32), jax.P(None, "x"))
        b = jax.device_put(B.astype(np.float32), jax.P("x", None))
        got, want = loss(jax_rccl)(a, b), loss(lax)(a, b)
        assert_same(got, want)
        for g, w in zip(got, want, strict=True):
            assert g.sharding == w.sharding


@pytest.mark.parametrize("name", ["pmax", "pmin"])
def test_max_min_refuse_partial_sums(name):
    """jax.lax refuses them too (its pvary rejects unreduced arguments)."""
    with pytest.raises(ValueError, match="unreduced"):
        _run(lambda v: getattr(lax, name)(v, "x"))
    with pytest.raises(ValueError, match=f"jax_rccl.{name}: leaf 0 is unreduced over"):
        _run(lambda v: getattr(jax_rccl, name)(v, "x"))


@pytest.mark.parametrize("op", ["prod", "max", "min"])
def test_all_reduce_ops_other_than_sum_refuse_partial_sums(op):
    with pytest.raises(ValueError, match=f"not op='{op}'"):
        _run(lambda v: jax_rccl.all_reduce(v, "x", op=op))


def test_groups_with_partial_sums_are_refused():
    with pytest.raises(NotImplementedError, match="axis_index_groups"):
        _run(lambda v: jax_rccl.psum(v, "x", axis_index_groups=[[0, 1], [2, 3]]), 4)
