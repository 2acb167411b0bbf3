"""jax_rccl.install(): programs written with jax.lax only run their collectives on jax_rccl.

Each case runs the same jax.lax program twice in one process, once with XLA's collectives and
once under ``jax_rccl.install()``, and checks that the second holds jax_rccl custom calls and no
XLA collective in its compiled HLO, and that both give the same bits."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import mesh_1d, mesh_2d, needs_runtime
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_rccl

pytestmark = needs_runtime

#: XLA's collective instructions, as compiled HLO names them.
XLA_COLLECTIVES = (
    "all-reduce(",
    "all-reduce-start(",
    "all-gather(",
    "all-gather-start(",
    "reduce-scatter(",
    "all-to-all(",
    "collective-permute(",
    "collective-permute-start(",
    "collective-broadcast(",
)


def hlo_of(fn, *args) -> str:
    return fn.lower(*args).compile().as_text()


def check_ours(text: str) -> None:
    assert "jax_rccl_" in text, "no jax_rccl custom call in the compiled program"
    left = [op for op in XLA_COLLECTIVES if op in text]
    assert not left, f"XLA collectives left in the compiled program: {left}"


def assert_same(a, b) -> None:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, x.shape, y.dtype, y.shape)
        np.testing.assert_array_equal(x, y)


def both(make, *args, uses_collectives=True):
    """(XLA's result, jax_rccl's result) of the program `make()` builds, checking the HLO."""
    jax_rccl.uninstall()
    ref = make()(*args)
    with jax_rccl.install(platforms=("cpu",)):
        fn = make()
        if uses_collectives:
            check_ours(hlo_of(fn, *args))
        out = fn(*args)
    assert_same(ref, out)
    return ref, out


def smap(body, mesh, in_specs, out_specs, check_vma=True):
    return lambda: jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma)
    )


@pytest.fixture(autouse=True)
def _restore():
    yield
    jax_rccl.uninstall()


def _x(shape=(8, 6), dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return jnp.asarray(rng.integers(-50, 50, size=shape).astype(dtype))
    return jnp.asarray(rng.standard_normal(shape).astype(dtype))


# --- every primitive, 1-D mesh, check_vma on and off -------------------------------------

PERM = [(i, (i + 3) % 8) for i in range(8)]

BODIES = {
    "psum": (lambda x: lax.psum(x, "i"), P()),
    "pmax": (lambda x: lax.pmax(x, "i"), P()),
    "pmin": (lambda x: lax.pmin(x, "i"), P()),
    "pmean": (lambda x: lax.pmean(x, "i"), P()),
    "psum_pytree": (lambda x: lax.psum({"a": x, "b": (x * 2, x[0])}, "i"), P()),
    "all_gather": (lambda x: lax.all_gather(x, "i"), P("i")),
    "all_gather_axis1": (lambda x: lax.all_gather(x, "i", axis=1), P("i")),
    "all_gather_tiled": (lambda x: lax.all_gather(x, "i", axis=1, tiled=True), P("i")),
    "all_gather_invariant": (lambda x: lax.all_gather(x, "i", tiled=True, to="invarying"), P()),
    "psum_scatter": (lambda x: lax.psum_scatter(jnp.tile(x, (8, 1)), "i"), P("i")),
    "psum_scatter_tiled": (
        lambda x: lax.psum_scatter(jnp.tile(x, (1, 8)), "i", scatter_dimension=1, tiled=True),
        P("i"),
    ),
    "all_to_all": (lambda x: lax.all_to_all(jnp.tile(x, (8, 1)), "i", 0, 1, tiled=True), P("i")),
    "all_to_all_untiled": (
        lambda x: lax.all_to_all(jnp.tile(x, (8, 1)).reshape(8, 1, -1), "i", 0, 2),
        P("i"),
    ),
    "ppermute": (lambda x: lax.ppermute(x, "i", PERM), P("i")),
    "pshuffle": (lambda x: lax.pshuffle(x, "i", [3, 1, 0, 2, 7, 6, 5, 4]), P("i")),
    "pswapaxes": (lambda x: lax.pswapaxes(jnp.tile(x, (8, 1)).reshape(8, -1), "i", 0), P("i")),
}


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("name", sorted(BODIES))
def test_primitive_matches_xla(name, check_vma):
    body, out_spec = BODIES[name]
    mesh = mesh_1d()
    x = _x((8, 6))
    if not check_vma and out_spec == P():
        out_spec = P("i")  # without the type check, the result is taken per device
    both(smap(body, mesh, P("i"), out_spec, check_vma), x)


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, jnp.bfloat16, np.float64, np.int32, np.int8, np.uint8]
)
def test_dtypes(dtype):
    mesh = mesh_1d()
    x = _x((8, 5), dtype)
    body = lambda v: (lax.psum(v, "i"), lax.pmax(v, "i"), lax.all_gather(v, "i"))  # noqa: E731
    both(smap(body, mesh, P("i"), (P(), P(), P("i"))), x)


@pytest.mark.parametrize("dtype", [np.bool_, np.complex64, np.complex128])
def test_types_the_runtime_carries_converted(dtype):
    """bool moves as uint8 (pmax/pmin: or/and), complex as its two parts (sums add them)."""
    mesh = mesh_1d()
    rng = np.random.default_rng(3)
    z = rng.standard_normal((8, 5)) + 1j * rng.standard_normal((8, 5))
    if dtype == np.bool_:
        x = jnp.asarray(rng.integers(0, 2, size=(8, 5)).astype(bool))

        def body(v):
            return (
                lax.pmax(v, "i"),
                lax.pmin(v, "i"),
                lax.all_gather(v, "i", tiled=True),
                lax.ppermute(v, "i", PERM),
                lax.all_to_all(jnp.tile(v, (8, 1)), "i", 0, 0, tiled=True),
            )

        outs = (P(), P(), P("i"), P("i"), P("i"))
    else:
        x = jnp.asarray(
            (rng.standard_normal((8, 5)) + 1j * rng.standard_normal((8, 5))).astype(dtype)
        )

        def body(v):
            return (
                lax.psum(v, "i"),
                lax.all_gather(v, "i", axis=1, tiled=True),
                lax.psum_scatter(jnp.tile(v, (8, 1)), "i", tiled=True),
                lax.ppermute(v, "i", PERM),
            )

        outs = (P(), P("i"), P("i"), P("i"))
    with jax.enable_x64(dtype == np.complex128):
        if dtype != np.bool_:
            x = jnp.asarray(z.astype(dtype))
            assert x.dtype == dtype
        both(smap(body, mesh, P("i"), outs), x)


@pytest.mark.parametrize("shape", [(8,), (8, 1), (8, 3, 5), (16, 7)])
def test_shapes(shape):
    mesh = mesh_1d()
    x = _x(shape)
    body = lambda v: (lax.psum(v, "i"), lax.all_gather(v, "i", tiled=True))  # noqa: E731
    both(smap(body, mesh, P("i"), (P(), P("i"))), x)


def test_empty_leaf_takes_no_call():
    mesh = mesh_1d()
    x = jnp.zeros((8, 0), np.float32)
    body = lambda v: lax.psum(v, "i")  # noqa: E731
    both(smap(body, mesh, P("i"), P()), x, uses_collectives=False)


# --- N-D meshes, tuple axes, groups ---------------------------------------------------------


@pytest.mark.parametrize("axes", ["x", "y", ("x", "y"), ("y", "x")], ids=["x", "y", "xy", "yx"])
def test_2d_mesh(axes):
    mesh = mesh_2d()
    x = _x((8, 4))

    def body(v):
        return (
            lax.psum(v, axes),
            lax.all_gather(v, axes, tiled=True),
            lax.psum_scatter(jnp.tile(v, (lax.psum(1, axes), 1)), axes, tiled=True),
            lax.ppermute(v, axes, [(0, 1), (1, 0)]),
        )

    spec = P(("x", "y"))
    both(smap(body, mesh, spec, (spec,) * 4, check_vma=False), x)


def _interleaved_groups(v):
    groups = [[0, 2, 4, 6], [1, 3, 5, 7]]
    return (
        lax.psum(v, "i", axis_index_groups=groups),
        lax.pmax(v, "i", axis_index_groups=[[0, 1], [2, 3], [4, 5], [6, 7]]),
        lax.psum_scatter(jnp.tile(v, (4, 1)), "i", axis_index_groups=groups, tiled=True),
    )


def _groups_and_scalars(v):
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    return (
        lax.all_to_all(jnp.tile(v, (4, 1)), "i", 0, 0, tiled=True, axis_index_groups=groups),
        lax.pmin(v, "i", axis_index_groups=groups),
        lax.all_gather(v[0, 0], "i"),
        lax.psum(v[0, 0], "i", axis_index_groups=groups)[None],
    )


@pytest.mark.parametrize(
    "body, shape, nout",
    [(_interleaved_groups, (8, 3), 3), (_groups_and_scalars, (8, 4), 4)],
    ids=["axis_index_groups", "groups_and_scalars"],
)
def test_axis_index_groups(body, shape, nout):
    both(smap(body, mesh_1d(), P("i"), (P("i"),) * nout, check_vma=False), _x(shape))


def test_pmap():
    x = _x((8, 5))

    def make():
        return jax.pmap(
            lambda v: (lax.psum(v, "i"), lax.all_gather(v, "i"), lax.ppermute(v, "i", PERM)),
            axis_name="i",
        )

    both(make, x)


# --- transformations --------------------------------------------------------------------------


def test_grad_inserts_ours():
    """The gradient all-reduce JAX inserts itself (the transpose of the parameters' implicit
    broadcast into shard_map, as in JAX's shard_map tutorial) runs on jax_rccl too."""
    mesh = mesh_1d()
    w = _x((6, 3), seed=1)
    xs = _x((16, 6), seed=2)

    def local_loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    for check_vma in (True, False):

        def make(check_vma=check_vma):
            loss = jax.shard_map(
                lambda w, x: lax.pmean(local_loss(w, x), "i"),
                mesh=mesh,
                in_specs=(P(), P("i")),
                out_specs=P(),
                check_vma=check_vma,
            )
            return jax.jit(jax.value_and_grad(loss))

        both(make, w, xs)


def test_vmap_scan_checkpoint():
    mesh = mesh_1d()
    x = _x((8, 4, 3))

    def step(c, v):
        c = c + lax.psum(v, "i")
        return c, lax.all_gather(v, "i", tiled=True)

    def body(v):
        v = v[0]
        ys = jax.vmap(lambda r: lax.pmax(r, "i"))(v)
        c, zs = lax.scan(jax.checkpoint(step), jnp.zeros_like(v[0]), v)
        return ys[None], c[None], zs[None]

    both(smap(body, mesh, P("i"), (P("i"),) * 3), x)


def test_vmap_over_named_axis():
    mesh = mesh_1d()
    x = _x((8, 4, 3))

    def body(v):
        return jax.vmap(lambda r: lax.psum(r, ("i", "b")), axis_name="b")(v[0])[None]

    both(smap(body, mesh, P("i"), P("i"), check_vma=False), x)


def test_grad_of_collectives():
    mesh = mesh_1d()
    x = _x((8, 6))

    def f(v):
        y = lax.all_gather(v, "i", tiled=True)
        z = lax.psum_scatter(y * y, "i", tiled=True)
        return jnp.sum(lax.ppermute(z, "i", PERM) * v)

    def body(v):
        return jax.grad(f)(v)

    both(smap(body, mesh, P("i"), P("i")), x)


# --- what jax.lax leaves to GPUs runs on CPU -------------------------------------------------


def test_pbroadcast_on_cpu():
    mesh = mesh_1d()
    x = _x((8, 3))
    body = lambda v: lax.pbroadcast(v, "i", 5)  # noqa: E731
    with jax_rccl.install(platforms=("cpu",)):
        fn = smap(body, mesh, P("i"), P("i"), check_vma=False)()
        check_ours(hlo_of(fn, x))
        out = np.asarray(fn(x))
    np.testing.assert_array_equal(out, np.tile(np.asarray(x)[5], (8, 1)))


def test_psend_precv_on_cpu():
    mesh = mesh_1d()
    x = _x((8, 3))
    pairs = [(i, (i + 1) % 8) for i in range(8)]

    def body(v):
        tok = lax.psend(v, "i", pairs)
        return lax.precv(tok, jax.ShapeDtypeStruct(v.shape, v.dtype), "i", pairs)

    with jax_rccl.install(platforms=("cpu",)):
        fn = smap(body, mesh, P("i"), P("i"), check_vma=False)()
        check_ours(hlo_of(fn, x))
        out = np.asarray(fn(x))
    np.testing.assert_array_equal(out, np.roll(np.asarray(x), 1, axis=0))


def test_ragged_all_to_all_on_cpu():
    mesh = mesh_1d()
    n, rows = 8, 2
    operand = jnp.arange(n * n * rows * 3, dtype=np.float32).reshape(n * n * rows, 3)
    # device s sends rows [rows*d, rows*(d+1)) to device d, which puts them at rows*s
    offs = jnp.tile(jnp.arange(n, dtype=np.int32) * rows, n)
    sizes = jnp.full((n * n,), rows, np.int32)

    def body(op, io, sz, oo, rs):
        out = jnp.zeros((n * rows, 3), op.dtype)
        return lax.ragged_all_to_all(op, out, io, sz, oo, rs, axis_name="i")

    out_offs = jnp.tile(jnp.arange(n, dtype=np.int32) * rows, n)
    # every device's output offset for sender s is rows * s: output_offsets[d] = rows * s
    out_offs = jnp.repeat(jnp.arange(n, dtype=np.int32) * rows, n)
    with jax_rccl.install(platforms=("cpu",)):
        fn = smap(body, mesh, (P("i"),) * 5, P("i"), check_vma=False)()
        check_ours(hlo_of(fn, operand, offs, sizes, out_offs, sizes))
        out = np.asarray(fn(operand, offs, sizes, out_offs, sizes)).reshape(n, n * rows, 3)
    src = np.asarray(operand).reshape(n, n * rows, 3)
    for d in range(n):
        for s in range(n):
            np.testing.assert_array_equal(
                out[d, rows * s : rows * (s + 1)], src[s, rows * d : rows * (d + 1)]
            )


# --- install / uninstall ----------------------------------------------------------------------


def test_uninstall_restores_xla():
    mesh = mesh_1d()
    x = _x()
    make = smap(lambda v: lax.psum(v, "i"), mesh, P("i"), P())
    jax_rccl.install(platforms=("cpu",))
    assert jax_rccl.installed_platforms() == ("cpu",)
    check_ours(hlo_of(make(), x))
    jax_rccl.uninstall()
    assert jax_rccl.installed_platforms() == ()
    text = hlo_of(make(), x)
    assert "jax_rccl_" not in text and "all-reduce" in text


def test_context_manager_restores_previous():
    jax_rccl.install(platforms=("cpu", "cuda"))
    with jax_rccl.install(platforms=("cpu",)) as inst:
        assert inst.platforms == ("cpu",)
        assert jax_rccl.installed_platforms() == ("cpu",)
    assert jax_rccl.installed_platforms() == ("cpu", "cuda")
    jax_rccl.uninstall()
    with jax_rccl.install():
        pass
    assert jax_rccl.installed_platforms() == ()


def test_a_function_jitted_before_install_is_recompiled():
    mesh = mesh_1d()
    x = _x()
    fn = smap(lambda v: lax.psum(v, "i"), mesh, P("i"), P())()
    ref = fn(x)
    before = jax_rccl.runtime_stats()["executions"]
    with jax_rccl.install(platforms=("cpu",)):
        out = fn(x)
    assert jax_rccl.runtime_stats()["executions"] > before
    assert_same(ref, out)


@pytest.mark.parametrize(
    "bad,err",
    [(("tpu",), ValueError), ((), ValueError), (("cpu", "metal"), ValueError), (3, TypeError)],
)
def test_bad_platforms(bad, err):
    with pytest.raises(err, match="platforms"):
        jax_rccl.install(platforms=bad)
    assert jax_rccl.installed_platforms() == ()


def test_fallback_is_said_at_info(capfd, monkeypatch):
    """all_gather with axis_index_groups: jax_rccl has no such call; XLA's lowering stays, the
    result is XLA's, and JAX_RCCL_DEBUG=INFO says so."""
    monkeypatch.setenv("JAX_RCCL_DEBUG", "INFO")
    mesh = mesh_1d()
    x = _x((8, 2))
    body = lambda v: lax.all_gather(  # noqa: E731
        v, "i", axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]
    )
    jax_rccl.uninstall()
    make = smap(body, mesh, P("i"), P("i"), check_vma=False)
    try:
        ref = make()(x)
    except Exception as e:  # noqa: BLE001 - XLA:CPU may not run it: then neither do we
        pytest.skip(f"XLA's all_gather with groups does not run here: {e}")
    with jax_rccl.install(platforms=("cpu",)):
        out = make()(x)
    assert_same(ref, out)
    said = capfd.readouterr().err
    assert (
        "jax.lax.all_gather: XLA's lowering kept (jax.lax.all_gather with axis_index_groups)"
        in said
    )


# --- constants: jax.lax's rules, and jax_rccl's own functions match them ---------------------


def test_collectives_of_constants_are_concrete():
    mesh = mesh_1d()
    seen = {}

    def body(v):
        for name, fn in (("lax", lax), ("ours", jax_rccl)):
            seen[name] = (
                fn.psum(1, "i"),
                fn.psum(2.5, "i"),
                fn.pmean(3, "i"),
                fn.psum((1, 2), "i"),
            )
        return v

    jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))(_x())
    assert seen["lax"] == (8, 20.0, 3.0, (8, 16))
    for a, b in zip(
        jax.tree_util.tree_leaves(seen["ours"]),
        jax.tree_util.tree_leaves(seen["lax"]),
        strict=True,
    ):
        assert type(a) is type(b) and a == b, (a, b)


def test_ring_attention_axis_size_is_static():
    """psum(1, axis) as an axis size in Python control flow (public ring attentions do)."""
    mesh = mesh_1d()

    def body(v):
        n = jax_rccl.psum(1, "i")
        for _ in range(n):  # needs a Python int
            v = jax_rccl.ppermute(v, "i", [(j, (j + 1) % n) for j in range(n)])
        return v

    x = _x()
    out = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


# --- JAX_RCCL_LAX: on without importing jax_rccl ----------------------------------------------

_ENV_PROGRAM = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("i",))
f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh, in_specs=P("i"),
                          out_specs=P()))
x = np.arange(8.0, dtype=np.float32)
text = f.lower(x).compile().as_text()
print("ours" if "jax_rccl_all_reduce" in text else "xla", float(f(x)[0]))
"""


def _run_python(program: str, tmp_path, lax: str | None) -> subprocess.CompletedProcess:
    """`program` in a new interpreter of this environment, with JAX_RCCL_LAX=`lax` (None:
    unset)."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_RCCL_LAX", "JAX_PLATFORMS")}
    if lax is not None:
        env["JAX_RCCL_LAX"] = lax
    return subprocess.run(
        [sys.executable, "-P", "-c", program],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_without_the_switch_the_entry_point_imports_nothing(tmp_path):
    """JAX starts jax_rccl's plugin in every program of the environment: without JAX_RCCL_LAX it
    leaves the program as it was (no jax_rccl module, no config option of jax_rccl's)."""
    program = (
        "import jax, sys; jax.devices(); "
        "print(sorted(m for m in sys.modules if m.startswith('jax_rccl')), "
        "any(n.startswith('jax_rccl') for n in jax.config.values))"
    )
    r = _run_python(program, tmp_path, None)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["['jax_rccl_plugin']", "False"], r.stdout


@pytest.mark.parametrize("value,expect", [("1", "ours"), ("cpu", "ours"), ("0", "xla")])
def test_env_switch_without_import(value, expect, tmp_path):
    r = _run_python(_ENV_PROGRAM, tmp_path, value)
    assert r.returncode == 0, r.stderr[-3000:]
    word, total = r.stdout.split()
    assert word == expect and float(total) == 28.0


def test_env_switch_bad_value(tmp_path):
    r = _run_python(_ENV_PROGRAM, tmp_path, "tpu")
    assert "JAX_RCCL_LAX='tpu'" in r.stderr


# --- every data-moving primitive under each transformation ---------------------------------------

TRANSFORMED = ["psum", "pmax", "all_gather_tiled", "psum_scatter", "all_to_all", "ppermute"]


def _vmapped(body):
    return lambda v: jax.vmap(body)(jnp.stack([v, 2 * v]))


def _grad(body):
    def f(v):
        return jax.grad(lambda u: jnp.sum(jnp.sin(body(u))))(v)

    return f


def _scanned(body):
    def f(v):
        def step(c, _):
            return c + body(v), None

        out, _ = lax.scan(step, jnp.zeros_like(body(v)), None, length=2)
        return out

    return f


@pytest.mark.parametrize(
    "name,transform",
    # (jax.lax has no differentiation rule for pmax)
    [(n, t) for n in TRANSFORMED for t in ("vmap", "grad", "scan") if (n, t) != ("pmax", "grad")],
)
def test_transformed(name, transform):
    body, _ = BODIES[name]
    wrap = {"vmap": _vmapped, "grad": _grad, "scan": _scanned}[transform]
    both(smap(wrap(body), mesh_1d(), P("i"), P("i"), check_vma=False), _x((8, 6)))


def test_pmap_moving_primitives():
    x = _x((8, 8, 3))

    def make():
        return jax.pmap(
            lambda v: (
                lax.psum_scatter(v, "i", tiled=True),
                lax.all_to_all(v, "i", 0, 0, tiled=True),
                lax.pmax(v, "i"),
                jax.grad(lambda u: jnp.sum(lax.all_gather(u, "i") ** 2))(v),
            ),
            axis_name="i",
        )

    both(make, x)
