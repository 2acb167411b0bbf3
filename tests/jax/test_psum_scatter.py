"""jax_rccl.psum_scatter next to jax.lax.psum_scatter under jit(shard_map) on 8 CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import (
    assert_same,
    assert_same_types,
    maybe_empty,
    mesh_1d,
    mesh_2d,
    needs_runtime,
    per_device,
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


@pytest.mark.parametrize("kw", CASES, ids=str)
def test_types_match_lax(kw):
    assert_same_types(lambda lib: _fn(lib, kw), mesh_1d(), _x())


@needs_runtime
@pytest.mark.parametrize("kw", CASES, ids=str)
def test_scatter_dimension_and_tiling(kw):
    mesh, x = mesh_1d(), _x()
    assert_same(per_device(_fn(jax_rccl, kw), mesh)(x), per_device(_fn(lax, kw), mesh)(x))


@needs_runtime
def test_dtypes_pytree_and_sizes():
    mesh = mesh_1d()
    tree = {
        "c": sample((8 * 8, 3), "complex64"),
        "i8": sample((8 * 8,), "int8"),
        "bf": sample((8 * 8, 1), "bfloat16"),
        "u32": sample((8 * 16,), "uint32"),
        "empty": jnp.zeros((8 * 8, 0), jnp.float32),
        "odd": sample((8 * 8, 129), "float16"),
    }
    tree = maybe_empty(tree)
    fn = lambda lib: lambda t: lib.psum_scatter(t, "i", tiled=True)  # noqa: E731
    assert_same(per_device(fn(jax_rccl), mesh)(tree), per_device(fn(lax), mesh)(tree))


@needs_runtime
@pytest.mark.parametrize("axes", [("x", "y"), "x", ("y", "x")])
def test_2d_mesh(axes):
    mesh, x = mesh_2d(), sample((8 * 8, 5), "int32")
    fn = lambda lib: lambda v: lib.psum_scatter(v, axes, tiled=True)  # noqa: E731
    assert_same(per_device(fn(jax_rccl), mesh)(x), per_device(fn(lax), mesh)(x))


@needs_runtime
def test_axis_index_groups():
    mesh, x = mesh_1d(), sample((8 * 4, 3), "float32")
    groups = [[0, 1, 2, 3], [7, 6, 5, 4]]
    fn = lambda lib: lambda v: lib.psum_scatter(v, "i", axis_index_groups=groups)  # noqa: E731
    assert_same(per_device(fn(jax_rccl), mesh)(x), per_device(fn(lax), mesh, check_vma=False)(x))


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
