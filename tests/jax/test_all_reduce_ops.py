"""jax_rccl.all_reduce (sum/prod/max/min/avg, premul), pmax and pmin on 8 CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import (
    assert_like_lax,
    assert_same,
    assert_same_types,
    custom_calls,
    lowered_text,
    maybe_empty,
    mesh_1d,
    mesh_2d,
    needs_runtime,
    per_device,
    sample,
)
from jax import lax

import jax_rccl

REFS = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def _blocks(x):
    return np.asarray(x).reshape(8, -1, *np.shape(x)[1:])


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("check_vma", [True, False])
def test_pmax_pmin_types_match_lax(op, check_vma):
    fn = lambda lib: lambda v: getattr(lib, "p" + op)(v, "i")  # noqa: E731
    assert_same_types(fn, mesh_1d(), sample((8 * 2,), "float32"), check_vma=check_vma)


@needs_runtime
@pytest.mark.parametrize("op", ["max", "min"])
def test_pmax_pmin_dtypes(op):
    tree = {
        dt: sample((8 * 5,), dt, seed=i)
        for i, dt in enumerate(
            ["float32", "bfloat16", "float16", "int8", "uint8", "int32", "uint16", "bool"]
        )
    }
    tree["empty"] = jnp.zeros((8, 0), jnp.float32)
    fn = lambda lib: lambda t: getattr(lib, "p" + op)(t, "i")  # noqa: E731
    assert_like_lax(fn, mesh_1d(), maybe_empty(tree))


@needs_runtime
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
def test_ops_against_numpy(op):
    mesh = mesh_1d()
    tree = {"f": sample((8 * 3, 2), "float32"), "i": sample((8 * 1001,), "int32")}
    if op == "prod":
        tree = {
            "f": jnp.asarray(np.random.default_rng(1).choice([-1.0, 1.0, 2.0], 8 * 6)),
            "i": sample((8 * 7,), "int8") % 2 + 1,
        }
    got = per_device(lambda t: jax_rccl.all_reduce(t, "i", op=op), mesh)(tree)
    for k, v in tree.items():
        b = _blocks(v)
        if op == "avg":
            s = b.sum(0)  # integer avg truncates toward zero (C division, as NCCL)
            want = s / 8 if np.issubdtype(b.dtype, np.floating) else np.sign(s) * (np.abs(s) // 8)
        else:
            want = REFS[op](b, axis=0)
        want = np.broadcast_to(want.astype(b.dtype), b.shape)
        np.testing.assert_allclose(np.asarray(got[k]), want, rtol=1e-6)


@needs_runtime
def test_ops_2d_mesh_and_groups():
    mesh, x = mesh_2d(), sample((8 * 3,), "float32")
    got = per_device(
        lambda v: (
            jax_rccl.all_reduce(v, "y", op="max"),
            jax_rccl.all_reduce(v, ("x", "y"), op="avg"),
            jax_rccl.pmin(v, "x"),
        ),
        mesh,
    )(x)
    want = per_device(
        lambda v: (lax.pmax(v, "y"), lax.pmean(v, ("x", "y")), lax.pmin(v, "x")), mesh
    )(x)
    assert_same(got, want)
    groups = [[0, 1], [2, 3]]
    fn = lambda lib: lambda v: lib.pmax(v, "y", axis_index_groups=groups)  # noqa: E731
    assert_like_lax(fn, mesh, x, lax_check_vma=False)


def _premul_tree():
    return {
        "f32": sample((8 * 4,), "float32"),
        "bf16": sample((8 * 4,), "bfloat16"),
        "c64": sample((8 * 2,), "complex64"),
    }


@needs_runtime
def test_premul_immediate():
    mesh, tree = mesh_1d(), _premul_tree()
    got = per_device(lambda t: jax_rccl.all_reduce(t, "i", premul=0.5), mesh)(tree)
    want = per_device(lambda t: jax.tree_util.tree_map(lambda v: lax.psum(v * 0.5, "i"), t), mesh)(
        tree
    )
    assert_same(got, want)


@needs_runtime
def test_premul_per_device():
    def per_dev(lib, t):
        s = (lax.axis_index("i") + 1).astype(jnp.float32)  # differs on every device
        if lib is jax_rccl:
            return jax_rccl.all_reduce(t, "i", premul=s)
        return jax.tree_util.tree_map(lambda v: lax.psum(v * s.astype(v.real.dtype), "i"), t)

    assert_like_lax(lambda lib: lambda t: per_dev(lib, t), mesh_1d(), _premul_tree())


def test_premul_attributes():
    text = lowered_text(lambda v: jax_rccl.all_reduce(v, "i", premul=0.25), mesh_1d(), jnp.zeros(8))
    (call,) = custom_calls(text, "all_reduce")
    assert "premul = 1 : i32" in call and "premul_value = 2.500000e-01" in call
    text = lowered_text(
        lambda v: jax_rccl.all_reduce((v, v.astype(jnp.float16)), "i", premul=v[0]),
        mesh_1d(),
        jnp.zeros(8),
    )
    (call,) = custom_calls(text, "all_reduce")
    assert "premul = 2 : i32" in call
    assert "(tensor<1xf32>, tensor<1xf16>, tensor<1xf32>, tensor<1xf16>)" in call, call
