"""jax_rccl.psum_scatter next to jax.lax.psum_scatter under jit(shard_map) on 8 CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import (
    assert_like_lax,
    assert_same,
    lax_twin_tests,
    maybe_empty,
    mesh_1d,
    mesh_2d,
    needs_runtime,
    sample,
)
from jax import lax

import jax_rccl

CASES = [
    dict(scatter_dimension=0),
    dict(scatter_dimension=1),
    dict(scatter_dimension=0, tiled=True),
    dict(scatter_dimension=1, tiled=True),
    dict(scatter_dimension=-1, tiled=True),
]


def _x():
    return sample((8 * 8, 8, 16), "float32")  # per device [8, 8, 16]


def _fn(lib, kw):
    if lib is lax:  # jax 0.10.2's psum_scatter rejects a negative scatter_dimension in lowering
        kw = dict(kw, scatter_dimension=kw["scatter_dimension"] % 3)
    return lambda v: lib.psum_scatter(v, "i", **kw)


test_types_match_lax, test_scatter_dimension_and_tiling = lax_twin_tests(_fn, CASES, _x)


@needs_runtime
def test_dtypes_pytree_and_sizes():
    tree = {
        "c": sample((8 * 8, 3), "complex64"),
        "i8": sample((8 * 8,), "int8"),
        "bf": sample((8 * 8, 1), "bfloat16"),
        "u32": sample((8 * 16,), "uint32"),
        "empty": jnp.zeros((8 * 8, 0), jnp.float32),
        "odd": sample((8 * 8, 129), "float16"),
    }
    fn = lambda lib: lambda t: lib.psum_scatter(t, "i", tiled=True)  # noqa: E731
    assert_like_lax(fn, mesh_1d(), maybe_empty(tree))


@needs_runtime
@pytest.mark.parametrize("axes", [("x", "y"), "x", ("y", "x")])
def test_2d_mesh(axes):
    fn = lambda lib: lambda v: lib.psum_scatter(v, axes, tiled=True)  # noqa: E731
    assert_like_lax(fn, mesh_2d(), sample((8 * 8, 5), "int32"))


@needs_runtime
def test_axis_index_groups():
    groups = [[0, 1, 2, 3], [7, 6, 5, 4]]
    fn = lambda lib: lambda v: lib.psum_scatter(v, "i", axis_index_groups=groups)  # noqa: E731
    assert_like_lax(fn, mesh_1d(), sample((8 * 4, 3), "float32"), lax_check_vma=False)


@needs_runtime
@pytest.mark.parametrize("tiled", [True, False])
def test_unreduced_input(tiled):
    """Partial sums typed unreduced (explicit sharding), as all_gather(to='reduced')'s
    cotangents are: scattered to varying blocks, as jax.lax.psum_scatter does."""
    mesh = jax.make_mesh(
        (2,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:2]
    )
    with jax.set_mesh(mesh):
        a = jax.device_put(np.arange(8.0).reshape(2, 4), jax.P(None, "x"))
        b = jax.device_put(np.arange(24.0).reshape(4, 6), jax.P("x", None))
        types = {}

        def f(lib):
            @jax.jit
            def g(a, b):
                c = jnp.einsum("ij,jk->ik", a, b, out_sharding=jax.P(unreduced={"x"}))
                c = c if tiled else c[:, :2]

                @jax.shard_map(in_specs=jax.P(unreduced={"x"}), out_specs=jax.P("x"))
                def rs(v):
                    y = lib.psum_scatter(v, "x", scatter_dimension=1, tiled=tiled)
                    types[lib] = str(jax.typeof(y))
                    return y if tiled else y[None]

                return rs(c)

            return g

        got, want = f(jax_rccl)(a, b), f(lax)(a, b)
        assert types[jax_rccl] == types[lax] and "V:x" in types[lax], types
        assert_same(got, want)
        assert got.sharding == want.sharding
