"""jax_rccl.pshuffle and jax_rccl.pswapaxes next to jax.lax's under jit(shard_map), vmap, grad
and scan on 8 CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import (
    assert_grad_like_lax,
    assert_like_lax,
    assert_same,
    assert_same_types,
    custom_calls,
    lax_twin_tests,
    lowered_text,
    mesh_1d,
    mesh_2d,
    mixed_tree,
    needs_runtime,
    per_device,
    sample,
)
from jax import lax

import jax_rccl

SHUFFLES = {
    "reverse": list(range(7, -1, -1)),
    "rotate": [(j + 3) % 8 for j in range(8)],
    "identity": list(range(8)),
    "prefix": [2, 0, 1],  # indices 3..7 receive zeros, as jax.lax's
    "numpy": np.array([1, 0, 3, 2, 5, 4, 7, 6], np.int32),
}


test_pshuffle_types_match_lax, test_pshuffle = lax_twin_tests(
    lambda lib, name: lambda v: lib.pshuffle(v, "i", SHUFFLES[name]),
    list(SHUFFLES),
    lambda: sample((8 * 2,), "float32"),
    lambda: mixed_tree("int8"),
)


def test_pshuffle_is_one_ppermute():
    text = lowered_text(lambda v: jax_rccl.pshuffle(v, "i", SHUFFLES["rotate"]), mesh_1d(), _f())
    (call,) = custom_calls(text, "ppermute")
    assert "name = \"ppermute over ('i',)\"" in call


@needs_runtime
@pytest.mark.parametrize("axes", [("x", "y"), "y", ("y", "x")])
def test_pshuffle_2d_mesh(axes):
    n = 8 if isinstance(axes, tuple) else 4
    perm = [(3 * j + 1) % n for j in range(n)]
    fn = lambda lib: lambda v: lib.pshuffle(v, axes, perm)  # noqa: E731
    assert_like_lax(fn, mesh_2d(), sample((8 * 3,), "float32"))


@pytest.mark.parametrize(
    "perm, err, words",
    [
        ([0, 0, 1], ValueError, "not a permutation of range(3)"),
        ([1, 2, 3], ValueError, "not a permutation"),
        ([0, 1.0], TypeError, "sequence of ints"),
        ([True, False], TypeError, "bool"),
        (3, TypeError, "sequence of ints"),
        ("01", TypeError, "sequence of ints"),
        (list(range(9)), ValueError, "outside the axis of size 8"),
    ],
)
def test_pshuffle_bad_perm(perm, err, words):
    with pytest.raises(err, match="pshuffle|ppermute") as info:
        jax.eval_shape(per_device(lambda v: jax_rccl.pshuffle(v, "i", perm), mesh_1d()), _f())
    assert words in str(info.value)


def _f(shape=(8 * 8, 3)):
    return sample(shape, "float32", seed=5)


@pytest.mark.parametrize("axis", [0, 1, -2])
def test_pswapaxes_types_match_lax(axis):
    x = sample((8 * 8, 8, 8), "float32")
    assert_same_types(lambda lib: lambda v: lib.pswapaxes(v, "i", axis), mesh_1d(), x)


@needs_runtime
@pytest.mark.parametrize(
    "shape, axis",  # global shapes: 8 devices' blocks along the first axis
    [((8 * 8, 3), 0), ((8 * 2, 8, 3), 1), ((8 * 2, 3, 8), 2), ((8 * 2, 3, 8), -1), ((8 * 8,), 0)],
)
def test_pswapaxes(shape, axis):
    mesh = mesh_1d()
    x = sample(shape, "float32")
    tree = {"f": x, "i": x.astype(jnp.int16), "c": x.astype(jnp.complex64), "b": x > 0}
    got = per_device(lambda t: jax_rccl.pswapaxes(t, "i", axis), mesh)(tree)
    # jax.lax 0.10 crashes on a negative axis: its twin gets the same axis counted from 0
    want = per_device(lambda t: lax.pswapaxes(t, "i", axis % len(shape)), mesh)(tree)
    assert_same(got, want)


def test_pswapaxes_is_one_all_to_all():
    text = lowered_text(lambda v: jax_rccl.pswapaxes(v, "i", 0), mesh_1d(), _f())
    assert len(custom_calls(text, "all_to_all")) == 1


@needs_runtime
@pytest.mark.parametrize("axes", ["x", "y", ("x", "y")])
def test_pswapaxes_2d_mesh(axes):
    n = {"x": 2, "y": 4}.get(axes, 8)
    fn = lambda lib: lambda v: lib.pswapaxes(v, axes, 1)  # noqa: E731
    assert_like_lax(fn, mesh_2d(), sample((8 * 3, n, 2), "float32"))


@needs_runtime
def test_pswapaxes_axis_index_groups():
    groups = [[0, 2, 4, 6], [1, 3, 5, 7]]
    fn = lambda lib: lambda v: lib.pswapaxes(v, "i", 0, axis_index_groups=groups)  # noqa: E731
    assert_like_lax(fn, mesh_1d(), sample((8 * 4, 3), "float32"), lax_check_vma=False)


@pytest.mark.parametrize(
    "shape, axis, err, words",
    [
        ((8 * 3, 3), 0, ValueError, "has size 3; it must equal the group size 8"),
        ((8 * 8, 8), 2, ValueError, "out of range"),
        ((8 * 8, 8), 1.0, TypeError, "axis must be an int"),
        ((8,), 0, ValueError, "scalar"),
    ],
)
def test_pswapaxes_bad_arguments(shape, axis, err, words):
    x = jnp.zeros(shape)
    with pytest.raises(err, match="pswapaxes") as info:
        jax.eval_shape(per_device(lambda v: jax_rccl.pswapaxes(v[0], "i", axis), mesh_1d()), x)
    assert words in str(info.value)


# --- transformations ---------------------------------------------------------------------------

BODIES = {
    "pshuffle": lambda lib, v: lib.pshuffle(v * v, "i", [(5 * j + 2) % 8 for j in range(8)]),
    "pswapaxes": lambda lib, v: lib.pswapaxes(v * v, "i", 1),
}


def _loss(lib, body):
    def loss(x):
        y = per_device(lambda v: body(lib, v), mesh_1d())(x)
        return jnp.sum(y * jnp.arange(1.0, 1.0 + y.size).reshape(y.shape))

    return loss


@needs_runtime
@pytest.mark.parametrize("name", list(BODIES))
def test_grad(name):
    assert_grad_like_lax(lambda lib: _loss(lib, BODIES[name]), _f((8 * 4, 8)) / 3, rtol=1e-6)


@needs_runtime
@pytest.mark.parametrize("name", list(BODIES))
def test_vmap_inside_shard_map(name):
    body = BODIES[name]
    x = _f((8 * 5, 8))  # each device maps over 5 rows of 8
    fn = lambda lib: lambda v: jax.vmap(lambda r: body(lib, r.reshape(1, 8)))(v)  # noqa: E731
    assert_like_lax(fn, mesh_1d(), x)


@needs_runtime
def test_over_a_vmapped_axis():
    x = jnp.arange(4 * 4 * 3.0).reshape(4, 4, 3)
    for lib_fn in (
        lambda lib, r: lib.pshuffle(r, "b", [2, 0, 3, 1]),
        lambda lib, r: lib.pswapaxes(r, "b", 0),
    ):
        got = jax.vmap(lambda r, f=lib_fn: f(jax_rccl, r), axis_name="b")(x)
        want = jax.vmap(lambda r, f=lib_fn: f(lax, r), axis_name="b")(x)
        assert_same(got, want)


@needs_runtime
def test_scan():
    def body(lib, v):
        def step(c, _):
            c = lib.pswapaxes(lib.pshuffle(c, "i", [(j + 1) % 8 for j in range(8)]), "i", 0)
            return c, c.sum()

        return lax.scan(step, v, None, length=4)

    assert_like_lax(lambda lib: lambda v: body(lib, v), mesh_1d(), _f((8 * 8, 2)))
