"""jax_rccl.psend / jax_rccl.precv on 8 CPU devices (jax.lax lowers its own on GPUs only): what
precv returns against jax.lax.ppermute with the same pairs (the closed form of a matched
psend/precv), under jit(shard_map), vmap, grad and scan; jax.lax's signatures; the errors."""

import inspect

import jax
import jax.numpy as jnp
import pytest
from collectives_util import (
    assert_same,
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
from jax.sharding import PartitionSpec as P

import jax_rccl

PERMS = {
    "chain": [(j, j + 1) for j in range(7)],
    "ring": [(j, (j + 1) % 8) for j in range(8)],
    "one_pair": [(0, 1)],
    "back_edge": [(7, 0)],
    "swap_pairs": [(j, j ^ 1) for j in range(8)],
    "empty": [],
}


def send_recv(x, axes, perm):
    """psend then precv with the same pairs, per leaf (precv receives one array)."""
    tokens = jax_rccl.psend(x, axes, perm)
    return jax.tree_util.tree_map(
        lambda t, v: jax_rccl.precv(t, jax.ShapeDtypeStruct(v.shape, v.dtype), axes, perm),
        tokens,
        x,
    )


def test_signatures_are_lax_ones():
    for name in ("psend", "precv"):
        ours = list(inspect.signature(getattr(jax_rccl, name)).parameters)
        assert ours == list(inspect.signature(getattr(lax, name)).parameters)


@needs_runtime
@pytest.mark.parametrize("name", list(PERMS))
def test_matches_ppermute(name):
    mesh, perm = mesh_1d(), PERMS[name]
    tree = maybe_empty(
        {
            "f": sample((8 * 3, 2), "float32"),
            "b": sample((8 * 5,), "bool"),
            "c": sample((8,), "complex64"),
            "bf": sample((8 * 7,), "bfloat16"),
            "i8": sample((8 * 1001,), "int8"),
            "scalar": sample((8,), "int32"),
            "empty": jnp.zeros((8, 0), jnp.int32),
        }
    )

    def ours(t):
        t = dict(t, scalar=t["scalar"][0])  # a 0-d leaf per device
        return send_recv(t, "i", perm)

    def want(t):
        t = dict(t, scalar=t["scalar"][0])
        return lax.ppermute(t, "i", perm)

    assert_same(per_device(ours, mesh)(tree), per_device(want, mesh)(tree))


@needs_runtime
def test_forward_then_back_edge_pattern():
    """The pipeline pattern of jax.lax's docs: forward along a chain, compute, send back along
    the back edge; against the same program written with jax.lax.ppermute."""
    mesh = mesh_1d()
    x = sample((8 * 8, 8), "float32")
    w = sample((8, 1), "float32", seed=3)

    def program(send):
        def body(a):
            data = send(a, [(j, j + 1) for j in range(7)])
            w_, _ = lax.optimization_barrier((w, data))
            return send(jnp.broadcast_to(jnp.dot(data, w_), a.shape), [(7, 0)])

        return body

    ours = program(lambda v, perm: send_recv(v, "i", perm))
    want = program(lambda v, perm: lax.ppermute(v, "i", perm))
    assert_same(per_device(ours, mesh)(x), per_device(want, mesh)(x))


@needs_runtime
@pytest.mark.parametrize("axes", [("x", "y"), "y", ("y", "x")])
def test_2d_mesh(axes):
    mesh = mesh_2d()
    n = 8 if isinstance(axes, tuple) else 4
    perm = [(j, (3 * j + 1) % n) for j in range(n)]
    x = sample((8 * 3,), "float32")
    got = per_device(lambda v: send_recv(v, axes, perm), mesh)(x)
    assert_same(got, per_device(lambda v: lax.ppermute(v, axes, perm), mesh)(x))


def test_is_one_ppermute_and_no_token_reaches_the_runtime():
    text = lowered_text(lambda v: send_recv(v, "i", PERMS["ring"]), mesh_1d(), sample((64,), "f4"))
    (call,) = custom_calls(text, "ppermute")
    assert "name = \"ppermute over ('i',)\"" in call
    assert "token" not in call


@needs_runtime
def test_vmap_over_a_batch_axis_and_over_the_named_axis():
    mesh, perm = mesh_1d(), PERMS["chain"]
    x = sample((8 * 3, 5), "float32")
    got = per_device(jax.vmap(lambda v: send_recv(v, "i", perm)), mesh)(x)
    want = per_device(jax.vmap(lambda v: lax.ppermute(v, "i", perm)), mesh)(x)
    assert_same(got, want)
    # the named axis bound by vmap itself (as jax.lax's psend batches: a local permutation)
    y, perm = sample((8, 4), "float32", seed=2), PERMS["ring"]  # jax.lax's: a full one
    got = jax.vmap(lambda v: send_recv(v, "v", perm), axis_name="v")(y)
    assert_same(got, jax.vmap(lambda v: lax.ppermute(v, "v", perm), axis_name="v")(y))


@needs_runtime
def test_grad_is_the_inverse_permutation():
    mesh, perm = mesh_1d(), PERMS["chain"]
    x = sample((8 * 4,), "float32")

    def loss(send):
        body = per_device(lambda v: send(v) * v, mesh)
        return lambda a: (body(a) ** 2).sum()

    got = jax.jit(jax.grad(loss(lambda v: send_recv(v, "i", perm))))(x)
    want = jax.jit(jax.grad(loss(lambda v: lax.ppermute(v, "i", perm))))(x)
    assert_same(got, want)


@needs_runtime
def test_scan_pairs_each_step_inside_the_body():
    mesh, perm = mesh_1d(), PERMS["ring"]
    x = sample((8 * 2, 3), "float32")

    def run(send):
        def body(a):
            return lax.scan(lambda c, _: (send(c) + 1, c.sum()), a, None, length=5)

        return body

    got = per_device(run(lambda v: send_recv(v, "i", perm)), mesh)(x)
    want = per_device(run(lambda v: lax.ppermute(v, "i", perm)), mesh)(x)
    assert_same(got, want)


def _trace(fn):
    return jax.eval_shape(per_device(fn, mesh_1d()), sample((8 * 2,), "float32"))


def _sds(v):
    return jax.ShapeDtypeStruct(v.shape, v.dtype)


def test_a_token_not_from_psend_is_refused():
    # jax.lax on GPUs fails at run time ("Expected send to match recv") or hangs
    with pytest.raises(ValueError, match="precv: token must be the token a jax_rccl.psend"):
        _trace(lambda v: jax_rccl.precv(lax.create_token(), _sds(v), "i", [(0, 1)]))


def test_a_token_received_through_a_loop_carry_is_refused():
    def body(v):
        token = jax_rccl.psend(v, "i", [(0, 1)])
        recv = lambda t, _: (t, jax_rccl.precv(t, _sds(v), "i", [(0, 1)]))  # noqa: E731
        return lax.scan(recv, token, None, length=2)[1]

    with pytest.raises(ValueError, match="precv: token must be"):
        _trace(body)


@pytest.mark.parametrize(
    "axes, perm, shape, dtype, words",
    [
        ("i", [(1, 0)], None, None, r"perm \[\(1, 0\)\] must be those of the psend"),
        ("i", [(0, 1), (1, 2)], None, None, "must be those of the psend"),
        ("i", [(0, 1)], (3,), None, r"out_shape is \(3,\) float32 but its psend sent \(2,\)"),
        ("i", [(0, 1)], None, jnp.int32, "out_shape is .* int32 but its psend sent .* float32"),
    ],
)
def test_precv_that_differs_from_its_psend_is_refused(axes, perm, shape, dtype, words):
    def body(v):
        token = jax_rccl.psend(v, "i", [(0, 1)])
        out = jax.ShapeDtypeStruct(shape or v.shape, dtype or v.dtype)
        return jax_rccl.precv(token, out, axes, perm)

    with pytest.raises(ValueError, match=words):
        _trace(body)


def test_precv_over_other_axes_is_refused():
    def body(v):
        token = jax_rccl.psend(v, "y", [(0, 1)])
        return jax_rccl.precv(token, _sds(v), ("x", "y"), [(0, 1)])

    with pytest.raises(ValueError, match=r"axis_name \('x', 'y'\) .* axis_name \('y',\)"):
        jax.eval_shape(per_device(body, mesh_2d()), sample((8 * 2,), "float32"))


@pytest.mark.parametrize(
    "perm, err, words",
    [
        ([(0, 1), (0, 1)], ValueError, "repeats a source"),
        ([(0, 1), (2, 1)], ValueError, "repeats a destination"),
        ([(0, 8)], ValueError, "outside the axis of size 8"),
        ([(0, 0.7)], TypeError, "int pairs"),
        (3, TypeError, "iterable of"),
    ],
)
def test_bad_perm_names_psend(perm, err, words):
    with pytest.raises(err, match="jax_rccl.psend") as info:
        _trace(lambda v: jax_rccl.psend(v, "i", perm))
    assert words in str(info.value)


def test_bad_out_shape_and_unknown_axis():
    def body(v):
        return jax_rccl.precv(jax_rccl.psend(v, "i", [(0, 1)]), (2,), "i", [(0, 1)])

    with pytest.raises(TypeError, match="out_shape must have .shape and .dtype"):
        _trace(body)
    with pytest.raises(NameError, match="zz"):
        _trace(lambda v: jax_rccl.psend(v, "zz", [(0, 1)]))


@needs_runtime
def test_eager_shard_map_says_to_jit():
    mesh = mesh_1d()
    x = jax.device_put(sample((8 * 2,), "float32"), jax.NamedSharding(mesh, P("i")))
    sm = jax.shard_map(
        lambda v: send_recv(v, "i", [(0, 1)]), mesh=mesh, in_specs=P("i"), out_specs=P("i")
    )
    with pytest.raises(NotImplementedError, match="put jax.jit around the shard_map"):
        sm(x)
