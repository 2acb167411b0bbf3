"""The 8- and 4-bit floats and the sub-byte integers through every collective, bit for bit
against jax.lax on 2, 4 and 8 CPU devices (XLA's CPU backend reduces the small floats in
float16, rounding every step, in rank order; jax_rccl/_carry.py)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from collectives_util import custom_calls, lowered_text, mesh_1d, needs_runtime, per_device
from jax import lax
from jax.sharding import Mesh

import jax_rccl

FLOATS = [
    n
    for n in (
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e4m3b11fnuz",
        "float8_e3m4",
        "float8_e4m3",
        "float8_e8m0fnu",
        "float4_e2m1fn",
    )
    if hasattr(ml_dtypes, n)
]
INTS = ["int4", "uint4"]
NATIVE = ["float8_e4m3fn", "float8_e5m2"]


def _mesh(n):
    return Mesh(np.array(jax.devices()[:n]), ("i",))


def _values(dtype, shape, seed=0):
    """Every bit pattern of the type at random (NaNs, infinities, -0 and subnormals included),
    float4 and the integers from their whole range."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(getattr(ml_dtypes, dtype))
    if dtype in INTS:
        info = ml_dtypes.iinfo(dt)
        return jnp.asarray(rng.integers(int(info.min), int(info.max) + 1, shape)).astype(dt)
    if dtype == "float4_e2m1fn":
        codes = rng.integers(0, 16, shape)
        vals = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)[codes % 8] * np.where(
            codes >= 8, -1, 1
        )
        return jnp.asarray(vals.astype(dt))
    return jnp.asarray(rng.integers(0, 256, shape, dtype=np.uint8).view(dt))


def _bits(x):
    """An array's bits as integers (sub-byte types widened), for an exact compare."""
    x = np.asarray(x)
    if x.dtype.itemsize == 1 and x.dtype.kind == "V":
        return x.view(np.uint8)
    if x.dtype.kind in "iu":
        return x.astype(np.int16)
    return x.view(np.uint8)


def assert_bits(got, want):
    gl, wl = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(gl) == len(wl)
    for g, w in zip(gl, wl, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        gb, wb = _bits(g), _bits(w)
        bad = np.flatnonzero(gb.reshape(-1) != wb.reshape(-1))
        assert bad.size == 0, (
            f"{g.dtype}: {bad.size} of {gb.size} differ; first at {bad[:4]}: "
            f"got {np.asarray(g).reshape(-1)[bad[:4]]}, want {np.asarray(w).reshape(-1)[bad[:4]]}"
        )


def _both(fn, mesh, *args, check_vma=True):
    run = lambda lib: per_device(fn(lib), mesh, check_vma=check_vma)(*args)  # noqa: E731
    return run(jax_rccl), run(lax)


@needs_runtime
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("op", ["psum", "pmax", "pmin", "pmean"])
def test_reductions_bit_exact(op, n):
    mesh = _mesh(n)
    tree = {dt: _values(dt, (n * 509,), seed=i) for i, dt in enumerate(FLOATS + INTS)}
    if op == "pmean":
        tree = {k: v for k, v in tree.items() if k not in INTS}  # jax.lax: floats only
    if op == "pmin":
        # XLA's CPU all-reduce reads float8_e8m0fnu's smallest value (2^-127, a float32
        # subnormal) as 0, whose conversion back is NaN; the runtime keeps the subnormal.
        tree.pop("float8_e8m0fnu", None)
    assert_bits(*_both(lambda lib: lambda t: getattr(lib, op)(t, "i"), mesh, tree))


@needs_runtime
@pytest.mark.parametrize("n", [2, 4, 8])
def test_psum_scatter_bit_exact(n):
    mesh = _mesh(n)
    tree = {dt: _values(dt, (n * n, 37), seed=i) for i, dt in enumerate(FLOATS + INTS)}
    fn = lambda lib: lambda t: lib.psum_scatter(t, "i", tiled=True)  # noqa: E731
    assert_bits(*_both(fn, mesh, tree))


@needs_runtime
@pytest.mark.parametrize("n", [2, 8])
def test_data_movement(n):
    mesh = _mesh(n)
    tree = {dt: _values(dt, (n * n, 3), seed=i) for i, dt in enumerate(FLOATS + INTS)}
    perm = [(j, (j + 1) % n) for j in range(n)]

    def body(lib):
        return lambda t: (
            lib.all_gather(t, "i", tiled=True),
            lib.all_gather(t, "i", axis=1),
            lib.all_to_all(t, "i", 0, 0, tiled=True),
            lib.ppermute(t, "i", perm),
            lib.pshuffle(t, "i", [(j + 1) % n for j in range(n)]),
        )

    assert_bits(*_both(body, mesh, tree))


@needs_runtime
def test_pbroadcast():
    mesh = mesh_1d()
    tree = {dt: _values(dt, (8 * 5,), seed=i) for i, dt in enumerate(FLOATS + INTS)}
    # jax.lax.pbroadcast lowers on GPUs only: compare with device 3's input as jax.lax moves it
    got = per_device(lambda t: jax_rccl.pbroadcast(t, "i", 3), mesh)(tree)
    moved = per_device(lambda t: lax.all_gather(t, "i"), mesh)(tree)
    want = {k: np.tile(np.asarray(v)[0, 3], (8, 1)) for k, v in moved.items()}
    assert_bits(got, want)


def _f16_steps(blocks, op):
    """XLA's rule: from the identity, one step per rank in rank order, rounded to float16."""
    acc = {"sum": 0.0, "prod": 1.0}[op]
    acc = np.full(blocks.shape[1:], acc, np.float16)
    for b in blocks.astype(np.float32):
        a = acc.astype(np.float32)
        acc = (a + b if op == "sum" else a * b).astype(np.float16)
    return acc


@needs_runtime
@pytest.mark.parametrize("dtype", NATIVE + ["float8_e4m3fnuz"])
@pytest.mark.parametrize("op", ["sum", "prod"])
def test_all_reduce_steps_in_float16(dtype, op):
    """Native and widened small floats reduce as XLA would: float16 steps in rank order."""
    x = _values(dtype, (8 * 1000,), seed=7)
    got = per_device(lambda v: jax_rccl.all_reduce(v, "i", op=op), mesh_1d())(x)
    # rounded back as XLA converts (its NaN codes differ from ml_dtypes' for float8_e5m2)
    want = jax.jit(lambda a: a.astype(x.dtype))(_f16_steps(np.asarray(x).reshape(8, -1), op))
    assert_bits(got, np.tile(want, (8, 1)))


@needs_runtime
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", *NATIVE, "float8_e4m3fnuz"])
def test_signed_zeros_and_nans_like_lax(dtype):
    """A sum of -0s only is +0; a NaN never wins pmax/pmin, and only NaNs give the identity."""
    nan, dt = np.nan, jnp.dtype(dtype)
    cols = np.array(
        [
            [-0.0] * 8,
            [nan] * 8,
            [1.0, nan, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [-0.0, 0.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0],
            [0.0, -0.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0],
            [nan, 3.0] + [nan] * 6,
        ],
        np.float32,
    ).T  # [device, column]
    x = jnp.asarray(cols.reshape(-1)).astype(dt)
    for op in ("psum", "pmax", "pmin"):
        assert_bits(*_both(lambda lib, op=op: lambda v: getattr(lib, op)(v, "i"), mesh_1d(), x))


def test_native_floats_travel_as_themselves():
    x = _values("float8_e5m2", (8 * 4,))
    text = lowered_text(lambda v: jax_rccl.psum(v, "i"), mesh_1d(), x)
    (call,) = custom_calls(text, "all_reduce")
    assert "tensor<4xf8E5M2>" in call, call


def test_other_floats_widen_for_reductions_and_move_as_bytes():
    x = _values("float8_e4m3fnuz", (8 * 4,))
    text = lowered_text(
        lambda v: (jax_rccl.psum(v, "i"), jax_rccl.all_gather(v, "i")), mesh_1d(), x
    )
    (red,) = custom_calls(text, "all_reduce")
    (gather,) = custom_calls(text, "all_gather")
    assert "tensor<4xf16>" in red and "tensor<4xui8>" in gather, (red, gather)
    text = lowered_text(lambda v: jax_rccl.pmax(v, "i"), mesh_1d(), _values("float8_e8m0fnu", (8,)))
    assert "tensor<1xf32>" in custom_calls(text, "all_reduce")[0]


def test_sub_byte_integers_widen():
    text = lowered_text(lambda v: jax_rccl.psum(v, "i"), mesh_1d(), _values("int4", (8 * 2,)))
    assert "tensor<2xi8>" in custom_calls(text, "all_reduce")[0]


@needs_runtime
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "int4", "uint4"])
def test_vmap_like_lax(dtype):
    """Over a vmapped axis, alone and with a mesh axis. (The other small floats reduce over a
    vmapped axis in float16 steps, where jax.lax's local reduction rounds once: not compared.)"""
    x = _values(dtype, (8 * 4 * 6,), seed=3)

    def body(lib):
        def f(v):  # v[4, 6] per device: vmap over its 4 rows
            g = jax.vmap(lambda r: (lib.psum(r, "v"), lib.pmax(r, ("i", "v"))), axis_name="v")
            return g(v.reshape(4, 6))

        return f

    # jax.lax 0.10 fails on a mesh axis mixed with a vmapped one under check_vma
    assert_bits(*_both(body, mesh_1d(), x, check_vma=False))


@needs_runtime
@pytest.mark.parametrize("algorithm", ["Ring", "Tree"])
def test_two_ranks_bit_exact_under_every_algorithm(algorithm):
    """With two ranks the order of a sum does not matter: Ring and Tree give jax.lax's bits."""
    mesh = _mesh(2)
    tree = {dt: _values(dt, (2 * 3001,), seed=i) for i, dt in enumerate(NATIVE)}
    with jax_rccl.config(algorithm=algorithm):
        got = per_device(lambda t: jax_rccl.psum(t, "i"), mesh)(tree)
    assert_bits(got, per_device(lambda t: lax.psum(t, "i"), mesh)(tree))
