"""Shared helpers of the jax_rccl collective tests: meshes, running a body under
jit(shard_map) next to its jax.lax twin, and comparing the two."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_rccl

# A hang must fail a test, not the suite (the runtime reads this at instantiate).
os.environ.setdefault("JAX_RCCL_TIMEOUT", "60")


# The CPU runtime registered with JAX (tests/jax/conftest.py: `registered_runtime`). It is part of
# every build, so a registration that fails (a broken build, a bad setting) fails every test that
# needs it with the registration's own error; it never turns into skips.
needs_runtime = pytest.mark.usefixtures("registered_runtime")


def mesh_1d(order=None) -> Mesh:
    devs = np.array(jax.devices()[:8])
    if order is not None:
        devs = devs[np.asarray(order)]
    return Mesh(devs, ("i",))


def mesh_2d() -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))


def all_axes(mesh: Mesh):
    names = tuple(mesh.axis_names)
    return names[0] if len(names) == 1 else names


def per_device(fn, mesh: Mesh, *, check_vma=True, in_specs=None):
    """jit(shard_map(fn)) whose outputs come back stacked per device: leaf[d] = device d's.

    Inputs are sharded along their leading axis over every mesh axis (unless `in_specs`)."""
    spec = P(all_axes(mesh))

    def body(*args):
        out = fn(*args)
        return jax.tree_util.tree_map(lambda y: jnp.expand_dims(y, 0), out)

    sm = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=spec if in_specs is None else in_specs,
        out_specs=spec,
        check_vma=check_vma,
    )
    return jax.jit(sm)


def body_types(fn, mesh: Mesh, *args, check_vma=True):
    """(shape, dtype, varying axes) of each output leaf of `fn`, typed inside shard_map."""
    seen = []

    def record(*a):
        out = fn(*a)
        for leaf in jax.tree_util.tree_leaves(out):
            t = jax.typeof(leaf)
            seen.append((t.shape, t.dtype, frozenset(jax_rccl._compat.varying(t))))
        return out

    jax.eval_shape(per_device(record, mesh, check_vma=check_vma), *args)
    return seen


def assert_same_types(fn, mesh: Mesh, *args, check_vma=True):
    """`fn(lib)` types alike for lib = jax_rccl and jax.lax (shapes, dtypes, varying axes)."""
    got = body_types(fn(jax_rccl), mesh, *args, check_vma=check_vma)
    want = body_types(fn(jax.lax), mesh, *args, check_vma=check_vma)
    assert got == want, (got, want)


def assert_same(got, want, *, exact=None, rtol=None):
    """Trees of arrays equal in structure, shape and dtype; values exact for ints/bools."""
    gl, gt = jax.tree_util.tree_flatten(got)
    wl, wt = jax.tree_util.tree_flatten(want)
    assert gt == wt, (gt, wt)
    for g, w in zip(gl, wl, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        is_exact = exact if exact is not None else not np.issubdtype(w.dtype, np.inexact)
        if is_exact:
            np.testing.assert_array_equal(g, w)
        else:
            tol = rtol or {2: 2e-2, 4: 1e-5, 8: 1e-12, 16: 1e-12}.get(w.dtype.itemsize, 1e-5)
            if np.issubdtype(w.dtype, np.complexfloating):
                tol = 1e-5 if w.dtype == np.complex64 else 1e-12
            np.testing.assert_allclose(
                g.astype(np.float64) if g.dtype.kind == "V" else g, w, rtol=tol, atol=tol
            )


def assert_like_lax(fn, mesh: Mesh, *args, check_vma=True, lax_check_vma=None, rtol=None):
    """`fn(jax_rccl)` and `fn(jax.lax)`, each run by `per_device` on `mesh`, return the same
    (`assert_same`); returns jax_rccl's. `lax_check_vma` (default: `check_vma`) types jax.lax's
    twin alone (jax.lax takes axis_index_groups only without check_vma)."""
    got = per_device(fn(jax_rccl), mesh, check_vma=check_vma)(*args)
    lax_vma = check_vma if lax_check_vma is None else lax_check_vma
    assert_same(got, per_device(fn(jax.lax), mesh, check_vma=lax_vma)(*args), rtol=rtol)
    return got


def assert_grad_like_lax(loss, x, *, rtol=None):
    """jit(grad(loss(jax_rccl))) and jit(grad(loss(jax.lax))) agree at `x` (`assert_same`)."""
    got = jax.jit(jax.grad(loss(jax_rccl)))(x)
    assert_same(got, jax.jit(jax.grad(loss(jax.lax)))(x), rtol=rtol)


def lax_twin_tests(fn, cases, types_input, values_input=None):
    """Two tests over `cases` (ids: str(case)) on the 1-D mesh: `fn(lib, case)` types as jax.lax's
    (`assert_same_types` on types_input()), and computes as jax.lax's (`assert_like_lax` on
    values_input(), default types_input(); needs the runtime). A test module names them:
    `test_types_match_lax, test_values = lax_twin_tests(...)`."""

    @pytest.mark.parametrize("case", cases, ids=str)
    def types_match_lax(case):
        assert_same_types(lambda lib: fn(lib, case), mesh_1d(), types_input())

    @needs_runtime
    @pytest.mark.parametrize("case", cases, ids=str)
    def values_match_lax(case):
        assert_like_lax(lambda lib: fn(lib, case), mesh_1d(), (values_input or types_input)())

    return types_match_lax, values_match_lax


def sample(shape, dtype, seed=0):
    """Small, exactly representable values (sums stay exact in every dtype)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(jnp.dtype(dtype))
    if dt == np.bool_:
        return jnp.asarray(rng.integers(0, 2, shape).astype(bool))
    if np.issubdtype(dt, np.complexfloating):
        v = rng.integers(-4, 5, shape) + 1j * rng.integers(-4, 5, shape)
        return jnp.asarray(v.astype(dt))
    lo = 0 if np.issubdtype(dt, np.unsignedinteger) else -4
    return jnp.asarray(rng.integers(lo, 5, shape)).astype(dt)


def lowered_text(fn, mesh: Mesh, *args, check_vma=True) -> str:
    return per_device(fn, mesh, check_vma=check_vma).lower(*args).as_text()


def custom_calls(text: str, kind: str | None = None) -> list[str]:
    tag = f"@jax_rccl_{kind}(" if kind else "@jax_rccl_"
    return [line for line in text.splitlines() if "custom_call" in line and tag in line]


# jax 0.11's compiler (Shardy) crashes on a shard_map whose pytree holds an empty leaf among
# others, for jax.lax's collectives as for ours; there, empty leaves are tested alone.
EMPTY_LEAF_IN_TREE_OK = tuple(int(v) for v in jax.__version__.split(".")[:2]) < (0, 11)


def maybe_empty(tree):
    """`tree` without its "empty" leaf where jax cannot compile one inside a pytree."""
    if not EMPTY_LEAF_IN_TREE_OK:
        tree = {k: v for k, v in tree.items() if k != "empty"}
    return tree


def mixed_tree(odd_dtype):
    """A pytree of 8 devices' blocks of every kind of leaf: float32 [3, 2], bool [5], complex64
    [1], an empty int32 leaf (where jax compiles one among others) and 1001 `odd_dtype`s."""
    return maybe_empty(
        {
            "f": sample((8 * 3, 2), "float32"),
            "b": sample((8 * 5,), "bool"),
            "c": sample((8,), "complex64"),
            "empty": jnp.zeros((8, 0), jnp.int32),
            "odd": sample((8 * 1001,), odd_dtype),
        }
    )


# --- named axes bound by jax.vmap, and their twins on a mesh -----------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    """Named axes of a test, outer to inner: shard_map mesh axes, then jax.vmap axes.

    An element of a test's input is one point of the grid of all axes; the global input's
    leading dimension enumerates them row-major in this order (mesh axes, then vmap axes)."""

    mesh: tuple[tuple[str, int], ...] = ()
    vmap: tuple[tuple[str, int], ...] = ()

    @property
    def size(self) -> int:
        return int(np.prod([s for _, s in self.mesh + self.vmap], dtype=np.int64))

    def __str__(self):
        parts = [f"{n}{s}" for n, s in self.mesh] + [f"vmap:{n}{s}" for n, s in self.vmap]
        return ",".join(parts)


def _mesh_of(axes) -> Mesh:
    n = int(np.prod([s for _, s in axes], dtype=np.int64))
    devs = np.array(jax.devices()[:n]).reshape([s for _, s in axes])
    return Mesh(devs, tuple(a for a, _ in axes))


def run_mapped(fn, layout: Layout, tree, extra=(), *, check_vma=True):
    """jit of `fn` mapped over `layout`: shard_map over its mesh axes around nested jax.vmaps
    over its vmap axes. `tree` leaves are [layout.size, ...] (one row per element); `extra`
    reaches every element as it is (replicated, unbatched): fn(element, extra)."""
    sizes = [s for _, s in layout.vmap]
    f = fn
    for name, _ in reversed(layout.vmap):
        f = jax.vmap(f, in_axes=(0, None), axis_name=name)

    def local(t, e):
        t = jax.tree_util.tree_map(lambda a: a.reshape(*sizes, *a.shape[1:]), t)
        out = f(t, e)
        rows = int(np.prod(sizes, dtype=np.int64))
        return jax.tree_util.tree_map(lambda a: a.reshape(rows, *a.shape[len(sizes) :]), out)

    if layout.mesh:
        names = tuple(a for a, _ in layout.mesh)
        local = jax.shard_map(
            local,
            mesh=_mesh_of(layout.mesh),
            in_specs=(P(names), P()),
            out_specs=P(names),
            check_vma=check_vma,
        )
    return jax.jit(local)(tree, extra)


def run_twin(fn, layout: Layout, tree, extra=(), *, check_vma=True):
    """The same computation with every axis of `layout` a mesh axis (one element per device):
    what a collective over a vmapped axis must equal."""
    axes = layout.mesh + layout.vmap
    names = tuple(a for a, _ in axes)

    def body(t, e):
        out = fn(jax.tree_util.tree_map(lambda a: a[0], t), e)
        return jax.tree_util.tree_map(lambda y: jnp.expand_dims(y, 0), out)

    sm = jax.shard_map(
        body,
        mesh=_mesh_of(axes),
        in_specs=(P(names), P()),
        out_specs=P(names),
        check_vma=check_vma,
    )
    return jax.jit(sm)(tree, extra)
