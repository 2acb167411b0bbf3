"""Collectives over axes bound by jax.vmap, alone or mixed with shard_map mesh axes.

Each case runs three ways: jax_rccl with the layout's vmap axes bound by jax.vmap (inside a
shard_map over its mesh axes), the same body in jax.lax on a mesh where every axis is a mesh
axis (the twin: what a vmapped axis must behave like), and, where jax.lax itself supports the
collective under vmap, jax.lax under the same vmaps.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import (
    EMPTY_LEAF_IN_TREE_OK,
    Layout,
    assert_same,
    needs_runtime,
    run_mapped,
    run_twin,
    sample,
)
from jax import lax

import jax_rccl


class LaxRef:
    """jax.lax on the twin mesh of a layout, plus what it lacks written with jax.lax:
    pbroadcast (jax.lax lowers it on GPUs only, and its vmap rule fails in 0.10), preduce and
    all_reduce.

    ppermute over several axes numbers the ranks with the mesh axes major (in mesh order, as
    jax.lax) and the vmapped axes after them in the order of axis_name. Where the twin mesh
    orders them otherwise, the reference is a gather (jax.lax.all_gather over the axes in
    that order, each device taking its source's block)."""

    def __init__(self, mesh=(), twin=()):
        self.mesh, self.twin = tuple(mesh), tuple(twin)  # axis names, in mesh order

    @staticmethod
    def of(layout):
        names = [a for a, _ in layout.mesh + layout.vmap]
        return LaxRef([a for a, _ in layout.mesh], names)

    def __getattr__(self, name):
        return getattr(lax, name)

    def ppermute(self, x, axis_name, perm):
        axes = axis_name if isinstance(axis_name, tuple) else (axis_name,)
        order = tuple(a for a in self.mesh if a in axes) + tuple(
            a for a in axes if a not in self.mesh
        )
        if order == tuple(a for a in self.twin if a in axes) or len(axes) == 1:
            return lax.ppermute(x, axis_name, perm)
        n = lax.axis_size(order)
        source = np.full(n, n)  # n: no source, zeros
        for s, d in perm:
            source[d] = s
        me = lax.axis_index(order)

        def one(v):
            return jnp.take(
                lax.all_gather(v, order), jnp.asarray(source)[me], axis=0, mode="fill", fill_value=0
            )

        return jax.tree_util.tree_map(one, x)

    @staticmethod
    def pbroadcast(x, axis_name, source):
        def one(v):
            return lax.psum(jnp.where(lax.axis_index(axis_name) == source, v, 0), axis_name)

        return jax.tree_util.tree_map(one, x)

    @staticmethod
    def preduce(x, axis_name, root):
        def one(v):
            return jnp.where(lax.axis_index(axis_name) == root, lax.psum(v, axis_name), 0)

        return jax.tree_util.tree_map(one, x)

    @staticmethod
    def all_reduce(x, axis_name, *, op="sum", premul=None):
        def one(v):
            if premul is not None:
                v = v * jnp.asarray(premul).astype(v.dtype)
            if op == "prod":
                return jnp.prod(lax.all_gather(v, axis_name), axis=0, dtype=v.dtype)
            if op == "avg":
                s, n = lax.psum(v, axis_name), lax.axis_size(axis_name)
                return s / n if jnp.issubdtype(v.dtype, jnp.floating) else lax.div(s, n)
            return {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[op](v, axis_name)

        return jax.tree_util.tree_map(one, x)


LAX = LaxRef()  # replaced by LaxRef.of(layout) in _case
DTYPES = ("float32", "int32", "bfloat16")

# --- the cases: per family, element shapes for a group of size n and the collective(s) per leaf


def _reductions(lib, axes, n, lax_vmap=False):
    shapes = {"scalar": (), "odd": (3, 5), "empty": (0,)}

    def op(key, v):
        return [lib.psum(v, axes), lib.pmax(v, axes), lib.pmin(v, axes), lib.pmean(v, axes)]

    return shapes, op


def _all_reduce(lib, axes, n, lax_vmap=False):
    shapes = {"scalar": (), "odd": (3, 5), "empty": (0,)}

    def op(key, v):
        # factors 1 and 2: products exact in bfloat16 whatever the order of the multiplications
        out = [lib.all_reduce(v % 2 + 1, axes, op="prod"), lib.all_reduce(v, axes, op="avg")]
        if jnp.issubdtype(v.dtype, jnp.floating):
            scale = jnp.sum(v, dtype=jnp.float32) / 8 + 2  # a scale of each element
            out += [lib.all_reduce(v, axes, premul=0.5), lib.all_reduce(v, axes, premul=scale)]
        return out

    return shapes, op


def _all_gather(lib, axes, n, lax_vmap=False):
    shapes = {"scalar": (), "odd": (7,), "2d": (3, 5), "empty": (0,)}
    kws = {
        "scalar": [{}],
        "odd": [dict(axis=1), dict(tiled=True)],
        "2d": [dict(axis=1), dict(axis=2), dict(axis=-1, tiled=True)],
        "empty": [{}, dict(axis=1)],  # (jax.lax cannot gather an empty dimension tiled)
    }
    if not lax_vmap:  # jax.lax's own to="invarying" fails over a vmapped axis (its pvary)
        kws["2d"].append(dict(to="invarying"))
    return shapes, lambda key, v: [lib.all_gather(v, axes, **kw) for kw in kws[key]]


def _psum_scatter(lib, axes, n, lax_vmap=False):
    shapes = {"blocks": (n, 3), "tiled": (3, 2 * n), "flat": (2 * n,), "empty": (n, 0)}
    kws = {
        "blocks": dict(scatter_dimension=0),
        "tiled": dict(scatter_dimension=1, tiled=True),
        "flat": dict(tiled=True),
        "empty": dict(scatter_dimension=0),
    }
    return shapes, lambda key, v: lib.psum_scatter(v, axes, **kws[key])


def _all_to_all(lib, axes, n, lax_vmap=False):
    shapes = {"blocks": (n, 3), "tiled": (3, 2 * n), "tiled0": (2 * n, 5), "empty": (n, 0)}
    args = {
        "blocks": [(0, 1, False), (0, 0, False)],
        "tiled": [(1, 0, True), (1, 1, True)],
        "tiled0": [(0, 1, True)],
        "empty": [(0, 1, False)],
    }
    return shapes, lambda key, v: [lib.all_to_all(v, axes, s, c, tiled=t) for s, c, t in args[key]]


def _perms(n):
    return {
        "shift": [(j, (j + 1) % n) for j in range(n)],
        "partial": [(j, n - 1 - j) for j in range(0, n, 2)],  # odd ranks get zeros
        "swap": [(j, j ^ 1) for j in range(n) if j ^ 1 < n],
        "identity": [(j, j) for j in range(n)],
        "empty": [],
    }


def _ppermute(lib, axes, n, lax_vmap=False):
    shapes = {"scalar": (), "odd": (3, 5), "empty": (0,)}
    perms = _perms(n)
    if lax_vmap:  # jax.lax's vmap rule takes only permutations of the whole axis
        perms = {k: p for k, p in perms.items() if len(p) == n}
    return shapes, lambda key, v: [lib.ppermute(v, axes, p) for p in perms.values()]


def _pbroadcast(lib, axes, n, lax_vmap=False):
    shapes = {"scalar": (), "odd": (3, 5), "empty": (0,)}
    return shapes, lambda key, v: [lib.pbroadcast(v, axes, s) for s in sorted({0, n // 2, n - 1})]


def _preduce(lib, axes, n, lax_vmap=False):
    shapes = {"scalar": (), "odd": (3, 5), "empty": (0,)}
    return shapes, lambda key, v: [lib.preduce(v, axes, r) for r in sorted({0, n - 1})]


FAMILIES = {
    "reductions": _reductions,
    "all_reduce": _all_reduce,
    "all_gather": _all_gather,
    "psum_scatter": _psum_scatter,
    "all_to_all": _all_to_all,
    "ppermute": _ppermute,
    "pbroadcast": _pbroadcast,
    "preduce": _preduce,
}
EXTRA_DTYPES = {"all_gather": ("bool", "complex64"), "ppermute": ("bool", "complex64")}

I4V2 = Layout(mesh=(("i", 4),), vmap=(("v", 2),))
B2A3 = Layout(vmap=(("b", 2), ("a", 3)))
COMBOS = [
    (Layout(vmap=(("v", 3),)), "v"),
    (I4V2, "v"),
    (I4V2, ("v", "i")),
    (I4V2, ("i", "v")),
    (I4V2, "i"),  # the vmapped axis is not the collective's: ordinary batching
    (Layout(mesh=(("x", 2), ("y", 2)), vmap=(("v", 2),)), ("x", "v", "y")),
    (B2A3, ("a", "b")),
    (B2A3, ("b", "a")),
    (B2A3, "b"),  # the inner vmap batches, the outer one is the collective's
    (Layout(mesh=(("i", 2),), vmap=(("b", 2), ("a", 2))), ("a", "i", "b")),
]


def _group_size(layout, axes):
    sizes = dict(layout.mesh + layout.vmap)
    return int(np.prod([sizes[a] for a in (axes if isinstance(axes, tuple) else (axes,))]))


def _case(family, lib, layout, axes, **kw):
    """(body of one element, input tree of [layout.size, ...] leaves)."""
    n = _group_size(layout, axes)
    if isinstance(lib, LaxRef) and not (lib.mesh or lib.twin):
        lib = LaxRef.of(layout)
    shapes, op = FAMILIES[family](lib, axes, n, **kw)
    dtypes = DTYPES + EXTRA_DTYPES.get(family, ())
    tree = {
        f"{key}/{dt}": sample((layout.size, *shape), dt, seed=k)
        for k, (key, shape) in enumerate(shapes.items())
        for dt in dtypes
        if EMPTY_LEAF_IN_TREE_OK or 0 not in shape
    }
    return (lambda t, e: {k: op(k.split("/")[0], v) for k, v in t.items()}), tree


def _ids(combo):
    layout, axes = combo
    return f"{layout}-{axes}"


@needs_runtime
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("combo", COMBOS, ids=_ids)
def test_matches_the_mesh_twin(combo, family):
    layout, axes = combo
    fn, tree = _case(family, jax_rccl, layout, axes)
    ref, _ = _case(family, LAX, layout, axes)
    assert_same(run_mapped(fn, layout, tree), run_twin(ref, layout, tree))


@needs_runtime
@pytest.mark.parametrize("family", list(FAMILIES))
def test_without_check_vma(family):
    layout, axes = I4V2, ("i", "v")
    fn, tree = _case(family, jax_rccl, layout, axes)
    ref, _ = _case(family, LAX, layout, axes)
    assert_same(run_mapped(fn, layout, tree, check_vma=False), run_twin(ref, layout, tree))


# jax.lax's own vmap rules: one vmapped axis per collective (psum also mixed with mesh axes),
# inside shard_map only with check_vma=False (its pvary fails on a vmapped axis).
LAX_VMAP_COMBOS = [(c, f) for c in COMBOS[:2] + COMBOS[4:5] + COMBOS[8:9] for f in FAMILIES]
LAX_VMAP_COMBOS = [
    (c, f) for c, f in LAX_VMAP_COMBOS if f not in ("pbroadcast", "preduce", "all_reduce")
] + [((I4V2, ("v", "i")), "reductions"), ((B2A3, ("a", "b")), "reductions")]


@needs_runtime
@pytest.mark.parametrize(
    "combo, family", LAX_VMAP_COMBOS, ids=lambda v: _ids(v) if isinstance(v, tuple) else v
)
def test_matches_lax_under_the_same_vmap(combo, family):
    layout, axes = combo
    fn, tree = _case(family, jax_rccl, layout, axes, lax_vmap=True)
    ref, _ = _case(family, lax, layout, axes, lax_vmap=True)
    assert_same(
        run_mapped(fn, layout, tree, check_vma=False),
        run_mapped(ref, layout, tree, check_vma=False),
    )


# --- transforms around and inside the vmaps ----------------------------------------------------


def _reductions_gathers_scatters(lib, v, axes, n, invarying):
    """psum, pmean, all_gathers (to="invarying" too if `invarying`) and psum_scatters of v."""
    return [
        lib.psum(v, axes),
        lib.pmean(v * v, axes),
        lib.all_gather(v, axes, axis=1),
        lib.all_gather(v, axes, tiled=True),
        *([lib.all_gather(v * v, axes, axis=1, to="invarying")] if invarying else []),
        lib.psum_scatter(v, axes, tiled=True),
        lib.psum_scatter(v[:n], axes),
    ]


def _linear(lib, axes, n, *, invarying=True):
    """Every differentiable collective on one float32 element x[2n, 3]."""
    perm = _perms(n)["partial"]

    def fn(t, e):
        v = t["x"]
        scale = jnp.sum(v) / 16 + 1
        return [
            *_reductions_gathers_scatters(lib, v, axes, n, invarying),
            lib.all_to_all(v, axes, 0, 1, tiled=True),
            lib.ppermute(v, axes, perm),
            lib.pbroadcast(v, axes, n - 1),
            lib.preduce(v, axes, 0),
            lib.all_reduce(v, axes, premul=scale),
        ]

    return fn


def _loss(out):
    leaves = jax.tree_util.tree_leaves(out)
    return sum(
        jnp.sum(y * jnp.sin(jnp.arange(y.size, dtype=y.dtype)).reshape(y.shape)) for y in leaves
    )


GRAD_COMBOS = [COMBOS[0], COMBOS[2], COMBOS[3], COMBOS[6], COMBOS[9]]


def _float_input(layout, axes):
    n = _group_size(layout, axes)
    return {"x": sample((layout.size, 2 * n, 3), "float32", seed=5) / 4}


@needs_runtime
@pytest.mark.parametrize("combo", GRAD_COMBOS, ids=_ids)
def test_grad_through_the_vmaps(combo):
    layout, axes = combo
    n, tree = _group_size(layout, axes), _float_input(layout, axes)
    fn, ref = _linear(jax_rccl, axes, n), _linear(LaxRef.of(layout), axes, n)
    got = jax.grad(lambda t: _loss(run_mapped(fn, layout, t)))(tree)
    want = jax.grad(lambda t: _loss(run_twin(ref, layout, t)))(tree)
    assert_same(got, want, rtol=1e-5)


@needs_runtime
@pytest.mark.parametrize("combo", GRAD_COMBOS, ids=_ids)
def test_grad_inside_the_vmaps(combo):
    """Transposes bound over the vmapped axis, then batched (per-example gradients).

    A vmapped axis is untyped, as in jax.lax's own vmap rules: with only vmapped axes, the
    twin is the mesh without check_vma (psum transposes to psum, an invariant gather to each
    device's own block). With mesh axes too, those follow check_vma's types, as in jax.lax;
    the twin is then typed throughout, with each element's loss summed over the axes that
    the layout vmaps (which is what transposing a psum to a psum computes). (to="invarying"
    has no such twin there: its transpose takes each element's own block.)"""
    layout, axes = combo
    n, tree = _group_size(layout, axes), _float_input(layout, axes)
    vmapped = tuple(a for a, _ in layout.vmap)
    typed = bool(layout.mesh)

    def per_element(lib, total):
        body = _linear(lib, axes, n, invarying=not typed)
        return lambda t, e: jax.grad(lambda u: total(_loss(body(u, e))))(t)

    got = run_mapped(per_element(jax_rccl, lambda v: v), layout, tree)
    if typed:
        ref = per_element(LaxRef.of(layout), lambda v: lax.psum(v, vmapped))
    else:
        ref = per_element(LaxRef.of(layout), lambda v: v)
    assert_same(got, run_twin(ref, layout, tree, check_vma=typed), rtol=1e-5)


def _lax_linear(lib, axes, n):
    """What jax.lax's own vmap rules differentiate: one vmapped axis, whole permutations (and
    no all_to_all: jax 0.10's transpose of a batched one fails on its cotangent's shape)."""

    def fn(t, e):
        v = t["x"]
        return [
            *_reductions_gathers_scatters(lib, v, axes, n, invarying=False),
            lib.ppermute(v, axes, _perms(n)["shift"]),
        ]

    return fn


@needs_runtime
@pytest.mark.parametrize("combo", [COMBOS[0], COMBOS[8]], ids=_ids)
def test_grad_inside_the_vmaps_matches_lax(combo):
    layout, axes = combo
    n, tree = _group_size(layout, axes), _float_input(layout, axes)

    def per_element(lib):
        body = _lax_linear(lib, axes, n)
        return lambda t, e: jax.grad(lambda u: _loss(body(u, e)))(t)

    got = run_mapped(per_element(jax_rccl), layout, tree)
    assert_same(got, run_mapped(per_element(lax), layout, tree), rtol=1e-5)


def _jitted(fn):
    return lambda t, e: jax.jit(fn)(t, e)


def _scanned(fn):
    return lambda t, e: lax.scan(lambda c, _: (c, fn(t, e)), 0, None, length=2)[1]


@needs_runtime
@pytest.mark.parametrize("wrap", [_jitted, _scanned], ids=["jit", "scan"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_jit_and_scan_inside_the_vmap(family, wrap):
    """The collective traced into an inner jaxpr first (typed with the vmapped axis)."""
    layout, axes = I4V2, ("v", "i")
    fn, tree = _case(family, jax_rccl, layout, axes)
    ref, _ = _case(family, LAX, layout, axes)
    assert_same(run_mapped(wrap(fn), layout, tree), run_twin(wrap(ref), layout, tree))


@needs_runtime
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("combo", [COMBOS[0], COMBOS[2], COMBOS[6]], ids=_ids)
def test_unbatched_operands(combo, family):
    """Operands that the vmaps do not batch (the same in every element)."""
    layout, axes = combo
    fn, tree = _case(family, jax_rccl, layout, axes)
    ref, _ = _case(family, LAX, layout, axes)

    def on_extra(f):
        return lambda t, e: f(jax.tree_util.tree_map(lambda a: a[0], e), e)

    assert_same(
        run_mapped(on_extra(fn), layout, tree, tree), run_twin(on_extra(ref), layout, tree, tree)
    )


def _vmap_of_shard_map(fn, tree, *, check_vma):
    """vmap (axis 'v', 2) of a shard_map over 'i' (4 devices): element (v, i) is row v*4+i."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("i",))

    def body(t, e):
        out = fn(jax.tree_util.tree_map(lambda a: a[0], t), e)
        return jax.tree_util.tree_map(lambda y: jnp.expand_dims(y, 0), out)

    sm = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(jax.P("i"), jax.P()),
        out_specs=jax.P("i"),
        check_vma=check_vma,
    )
    f = jax.jit(jax.vmap(sm, in_axes=(0, None), axis_name="v"))
    out = f(jax.tree_util.tree_map(lambda a: a.reshape(2, 4, *a.shape[1:]), tree), ())
    return jax.tree_util.tree_map(lambda a: a.reshape(8, *a.shape[2:]), out)


@needs_runtime
@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_vmap_of_shard_map(family, check_vma):
    twin = Layout(mesh=(("v", 2), ("i", 4)))
    axes = ("i", "v")
    fn, tree = _case(family, jax_rccl, twin, axes)
    ref, _ = _case(family, LaxRef(mesh=("i",), twin=("v", "i")), twin, axes)
    assert_same(_vmap_of_shard_map(fn, tree, check_vma=check_vma), run_twin(ref, twin, tree))
    if family == "reductions" and not check_vma:  # jax.lax's own rule, mixed axes
        assert_same(
            _vmap_of_shard_map(fn, tree, check_vma=False),
            _vmap_of_shard_map(ref, tree, check_vma=False),
        )


def test_all_gather_to_reduced_over_a_vmapped_axis_is_refused_like_lax():
    x = jnp.zeros((2, 3))
    for lib in (lax, jax_rccl):
        with pytest.raises((NotImplementedError, ValueError)):
            jax.vmap(lambda v, lib=lib: lib.all_gather(v, "v", to="reduced"), axis_name="v")(x)
    with pytest.raises(NotImplementedError, match="to='reduced' over an axis bound by jax.vmap"):
        jax.jit(
            jax.shard_map(
                jax.vmap(lambda v: jax_rccl.all_gather(v, ("v", "i"), to="reduced"), axis_name="v"),
                mesh=jax.sharding.Mesh(np.array(jax.devices()[:4]), ("i",)),
                in_specs=jax.P("i"),
                out_specs=jax.P("i"),
            )
        ).trace(jnp.zeros((8, 3)))


# --- axis_index_groups --------------------------------------------------------------------------

GROUPED = {
    "psum": lambda lib, v, ax, g: lib.psum(v, ax, axis_index_groups=g),
    "all_gather": lambda lib, v, ax, g: lib.all_gather(v, ax, axis_index_groups=g),
    "psum_scatter": lambda lib, v, ax, g: lib.psum_scatter(v, ax, axis_index_groups=g, tiled=True),
    "all_to_all": lambda lib, v, ax, g: lib.all_to_all(
        v, ax, 0, 0, axis_index_groups=g, tiled=True
    ),
}


@pytest.mark.parametrize("name", list(GROUPED))
def test_axis_index_groups_over_a_vmapped_axis_is_refused_like_lax(name):
    x, groups, op = jnp.zeros((4, 4)), [[0, 1], [2, 3]], GROUPED[name]
    with pytest.raises(NotImplementedError):
        jax.vmap(lambda v: op(lax, v, "v", groups), axis_name="v")(x)
    with pytest.raises(NotImplementedError, match=r"axis_index_groups with an axis bound by"):
        jax.vmap(lambda v: op(jax_rccl, v, "v", groups), axis_name="v")(x)


def test_axis_index_groups_of_preduce_over_a_vmapped_axis_is_refused():
    with pytest.raises(NotImplementedError, match=r"jax_rccl.preduce: axis_index_groups"):
        jax.vmap(
            lambda v: jax_rccl.preduce(v, "v", 0, axis_index_groups=[[0, 1], [2, 3]]),
            axis_name="v",
        )(jnp.zeros((4, 4)))


@needs_runtime
@pytest.mark.parametrize("name", list(GROUPED))
def test_axis_index_groups_over_a_mesh_axis_under_vmap(name):
    """The vmap batches, the groups are over the mesh axis: jax.lax on each element in turn
    (jax.lax's own vmap rule of all_to_all refuses groups)."""
    tree = {dt: sample((8, 4, 3), dt) for dt in DTYPES}
    op, groups = GROUPED[name], [[0, 3], [2, 1]]

    def element(t, e):
        return jax.tree_util.tree_map(lambda v: op(jax_rccl, v, "i", groups), t)

    def unrolled(t):
        rows = [
            jax.tree_util.tree_map(lambda a, j=j: op(lax, a[j], "i", groups), t) for j in range(2)
        ]
        return jax.tree_util.tree_map(lambda *r: jnp.stack(r), *rows)

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("i",))
    # jax.lax's psum takes axis_index_groups only without check_vma
    want = jax.jit(
        jax.shard_map(
            unrolled, mesh=mesh, in_specs=jax.P("i"), out_specs=jax.P("i"), check_vma=False
        )
    )(tree)
    for check_vma in (True, False):
        assert_same(run_mapped(element, I4V2, tree, check_vma=check_vma), want)
