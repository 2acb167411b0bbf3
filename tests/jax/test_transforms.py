"""jax_rccl collectives under grad, vmap, scan / fori_loop and checkpoint, next to jax.lax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import (
    assert_grad_like_lax,
    assert_like_lax,
    assert_same,
    assert_same_types,
    mesh_1d,
    mesh_2d,
    needs_runtime,
    per_device,
    sample,
)
from jax import lax

import jax_rccl

# Bodies (lib, per-device x[4, 8]) -> scalar-friendly outputs covering every collective.
BODIES = {
    "psum": lambda lib, v: lib.psum(v * v, "i"),
    "pmean": lambda lib, v: lib.pmean(jnp.sin(v), "i"),
    "all_gather": lambda lib, v: lib.all_gather(v, "i", axis=1) ** 2,
    "all_gather_tiled": lambda lib, v: lib.all_gather(v, "i", axis=1, tiled=True) ** 2,
    "psum_scatter": lambda lib, v: lib.psum_scatter(v * v, "i", scatter_dimension=1, tiled=True),
    "all_to_all": lambda lib, v: lib.all_to_all(v * v, "i", 1, 0, tiled=True),
    "ppermute": lambda lib, v: lib.ppermute(v * v, "i", [(j, (j + 3) % 8) for j in range(8)]),
}


def _x():
    return sample((8 * 4, 8), "float32", seed=3) / 3


def _loss(lib, body, check_vma=True):
    def loss(x):
        f = per_device(lambda v: body(lib, v), mesh_1d(), check_vma=check_vma)
        return jnp.sum(f(x) * jnp.arange(1.0, 1.0 + f(x).size).reshape(f(x).shape))

    return loss


@pytest.mark.parametrize("name", list(BODIES))
def test_grad_jaxpr_types_match_lax(name):
    """Typing of the linearized and transposed programs, without running them."""
    body = BODIES[name]
    g = jax.eval_shape(jax.grad(_loss(jax_rccl, body)), _x())
    w = jax.eval_shape(jax.grad(_loss(lax, body)), _x())
    assert (g.shape, g.dtype) == (w.shape, w.dtype)


@needs_runtime
@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("name", list(BODIES))
def test_grad(name, check_vma):
    assert_grad_like_lax(lambda lib: _loss(lib, BODIES[name], check_vma), _x(), rtol=1e-5)


@needs_runtime
def test_grad_pbroadcast_preduce_and_premul():
    mesh = mesh_1d()

    def loss(lib, x):
        def body(v):
            b = (
                lib.pbroadcast(v, "i", 2)
                if lib is jax_rccl
                else lax.psum(jnp.where(lax.axis_index("i") == 2, v, 0.0), "i")
            )
            s = (lax.axis_index("i") + 1).astype(v.dtype)
            p = jax_rccl.all_reduce(v, "i", premul=s) if lib is jax_rccl else lax.psum(v * s, "i")
            q = (
                jax_rccl.all_reduce(v, "i", premul=0.5)
                if lib is jax_rccl
                else lax.psum(v * 0.5, "i")
            )
            return b * b + p * p + q * v

        out = per_device(body, mesh)(x)
        return jnp.sum(out * jnp.arange(out.size).reshape(out.shape))

    assert_grad_like_lax(lambda lib: lambda v: loss(lib, v), _x(), rtol=1e-5)


def test_pmax_has_no_derivative_like_lax():
    for lib in (lax, jax_rccl):
        with pytest.raises(NotImplementedError):
            jax.eval_shape(jax.grad(_loss(lib, lambda lib_, v: lib_.pmax(v, "i"))), _x())


@needs_runtime
def test_vmap_inside_shard_map():
    mesh = mesh_1d()

    def body(lib, v):  # v[8, 8]: map over the 8 rows, then over the 8 columns
        def f(r):
            return (
                lib.psum(r, "i"),
                lib.all_gather(r, "i"),
                lib.psum_scatter(r, "i", tiled=True),
                lib.all_to_all(r.reshape(8, 1), "i", 0, 1),
                lib.ppermute(r, "i", [(0, 1), (1, 0)]),
                lib.pmax(r, "i"),
            )

        return jax.vmap(f)(v), jax.vmap(f, in_axes=1, out_axes=1)(v)

    assert_like_lax(lambda lib: lambda v: body(lib, v), mesh, sample((8 * 8, 8), "float32"))


def test_vmap_types_match_lax():
    def body(lib):
        return lambda v: jax.vmap(
            lambda r: (
                lib.psum(r, "i"),
                lib.all_gather(r, "i", axis=1),
                lib.all_to_all(r.reshape(8, 1), "i", 0, 1),
            )
        )(v)

    assert_same_types(body, mesh_1d(), _x())


@needs_runtime
def test_collective_over_a_vmapped_axis():
    x = jnp.arange(12.0).reshape(4, 3)
    for op in ("psum", "pmax", "pmin", "pmean"):
        got = jax.vmap(lambda r, op=op: getattr(jax_rccl, op)(r, "b"), axis_name="b")(x)
        want = jax.vmap(lambda r, op=op: getattr(lax, op)(r, "b"), axis_name="b")(x)
        assert_same(got, want)


@needs_runtime
def test_scan_fori_loop_and_checkpoint():
    mesh = mesh_1d()

    def body(lib, v):
        def step(c, _):
            c = lib.pmean(c, "i") + 0.5 * lib.ppermute(c, "i", [(j, (j + 1) % 8) for j in range(8)])
            return c, lib.psum(c.sum(), "i")

        c, ys = lax.scan(step, v, None, length=5)
        d = lax.fori_loop(
            0,
            3,
            lambda i, a: lib.psum_scatter(lib.all_gather(a, "i", tiled=True), "i", tiled=True) / 8,
            v,
        )
        e = jax.checkpoint(lambda a: jnp.sin(lib.psum(a, "i")))(v)
        return c, ys, d, e

    x = _x()
    assert_like_lax(lambda lib: lambda v: body(lib, v), mesh, x, rtol=1e-5)
    loss = lambda lib: lambda v: jnp.sum(per_device(lambda a: body(lib, a), mesh)(v)[3])  # noqa: E731,E501
    assert_grad_like_lax(loss, x, rtol=1e-5)


@needs_runtime
def test_2d_mesh_grad():
    mesh = mesh_2d()

    def loss(lib, x):
        out = per_device(lambda v: lib.psum(lib.all_gather(v, "y") ** 2, ("x", "y")), mesh)(x)
        return jnp.sum(out * np.arange(out.size).reshape(out.shape))

    assert_grad_like_lax(lambda lib: lambda v: loss(lib, v), _x(), rtol=1e-5)
