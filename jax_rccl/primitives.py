"""jax_rccl's JAX primitives: one registration block per collective (the primitive, its
abstract eval, JVP/transpose, batching and lowering side by side; the lowering rules hand their
parameters to `jax_rccl.lowering.lower_collective`).

Every primitive is variadic: all leaves of one public call travel as ONE custom call. Each one
works in the layout the runtime expects, so lowering only flattens operands to 1-D:

=================  ========================  ==========================================
primitive          leaf in -> leaf out       meaning (n = group size, r = my rank)
=================  ========================  ==========================================
all_reduce_p       x[s]     -> y[s]          reduce over the group with `op`
reduce_p           x[s]     -> y[s]          rank `root` gets the sum, the others zeros
broadcast_p        x[s]     -> y[s]          everyone gets rank `root`'s x
all_gather_p       x[s]     -> y[n, s]       y[j] = x of rank j
reduce_scatter_p   x[n, s]  -> y[s]          y = block r of the sum
all_to_all_p       x[n, s]  -> y[n, s]       y[j] = rank j's x[r]
ppermute_p         x[s]     -> y[s]          y = x of the rank sending to me, else zeros
=================  ========================  ==========================================

The public functions in `jax_rccl.api` move axes around these (plain JAX ops, which JAX
differentiates and batches itself) and convert dtypes the runtime does not take.

Shared parameters: `axes` (tuple of mesh axis names), `groups` (axis_index_groups as a tuple
of tuples, or None), `tuning` ((algorithm, protocol, in_place) strings: "" = the runtime's
env; in_place "auto", "on" or "off", see jax_rccl.config).

Typing of varying manual axes follows jax.lax under shard_map(check_vma=True): reductions
(all_reduce_p with `invariant`) make the result invariant over `axes`; everything else keeps
the input's varying axes and requires the input to vary over `axes` (the public functions
insert the pvary, as jax.lax does).
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_rccl import _compat as compat
from jax_rccl import _prim_common
from jax_rccl import lowering as L
from jax_rccl._prim_common import (
    OPS,
    _batch_first,
    _check_leaf_dtypes,
    _common_checks,
    _defprim,
    _from_rest_major,
    _linear_jvp,
    _linear_transpose,
    _moveaxis,
    _moving_lowering,
    _require_varying,
    _split_rank,
    _sum_batch,
    _take_or_zeros,
    _to_rest_major,
    _vmapped_split,
    check_axis_names,
    vary_over,
)
from jax_rccl.lax_backend import own_xla_rule

# Read here by jax_rccl.api and the tests, with the primitives.
CONVERTED_DTYPES = _prim_common.CONVERTED_DTYPES
SUPPORTED_DTYPES = _prim_common.SUPPORTED_DTYPES

# --- all_reduce_p ------------------------------------------------------------------------------
# Operands: the leaves, then (premul == 2) one scalar per leaf. `invariant`: typed as jax.lax
# types psum/pmax/pmin under check_vma (result invariant over `axes`); False with groups.

all_reduce_p = _defprim("all_reduce")


def _all_reduce_abstract_eval(*avals, axes, groups, op, premul, premul_value, invariant, tuning):
    del premul_value, tuning
    nleaves = len(avals) // 2 if premul == 2 else len(avals)
    leaves = avals[:nleaves]
    api = "jax_rccl.all_reduce"
    check_axis_names(axes, api)
    _check_leaf_dtypes(leaves, api)
    if op not in OPS:
        raise ValueError(f"{api}: op {op!r} is not one of {OPS}")
    outs = []
    for i, a in enumerate(leaves):
        if is_unreduced_over(a, axes):
            # jax.lax's Unreduced -> Invariant sum: the partial sums are added up.
            _unreduced_sum_checks(i, a, axes, groups, op, api)
            outs.append(
                compat.with_axis_types(
                    a, varying=compat.varying(a), unreduced=compat.unreduced(a) - set(axes)
                )
            )
            continue
        compat.check_unreduced([a], axes, api)
        if compat.check_vma_enabled():
            vma = compat.varying(a) - set(axes) if invariant else compat.varying(a)
            a = compat.with_varying(a, vma)
        outs.append(a)
    return outs, compat.named_axis_effects(axes)


def is_unreduced_over(aval, axes) -> bool:
    """Whether values of type `aval` are partial sums over (some of) `axes` (explicit
    sharding's unreduced type)."""
    return bool(compat.unreduced(aval) & set(axes))


def _unreduced_sum_checks(i, a, axes, groups, op, api):
    """jax.lax's rule for summing a value typed unreduced over `axes`."""
    if op not in ("sum", "avg"):
        raise ValueError(
            f"{api}: leaf {i} is unreduced over {tuple(axes)} (partial sums still to be added); "
            f"only a sum reduces it (psum, pmean, all_reduce(op='sum'|'avg')), not op={op!r}"
        )
    if groups is not None:
        raise NotImplementedError(
            f"{api}: axis_index_groups with a leaf unreduced over {tuple(axes)} is not "
            "supported (nor by jax.lax)"
        )
    if not compat.unreduced(a) >= set(axes):
        raise ValueError(
            f"{api}: leaf {i} is unreduced over {sorted(map(str, compat.unreduced(a)))} but "
            f"not over the rest of axis_name {tuple(axes)}; its type must be the same over all "
            "of them"
        )
    if compat.varying(a) & set(axes):
        raise ValueError(f"{api}: leaf {i} is unreduced and varying over {tuple(axes)}")
    if not compat.unreduced_by_sum(a):
        raise ValueError(f"{api}: leaf {i} is unreduced with partial values that are no sums")


def _sum_transpose_of(cts, *, axes, groups, invariant, tuning):
    """Cotangent of a plain sum-all-reduce (jax.lax: psum <-> pvary, or psum when untyped).
    Axes bound by jax.vmap are untyped: over them the cotangent is summed (jax.lax's vmap)."""
    if invariant and compat.check_vma_enabled():
        mesh_axes = compat.manual_axes()
        untyped = tuple(a for a in axes if a not in mesh_axes)
        if untyped:
            cts = _sum_transpose_of(cts, axes=untyped, groups=None, invariant=False, tuning=tuning)
        return [vary_over(ct, axes) for ct in cts]
    return _plain_all_reduce(cts, axes, groups, "sum", invariant, tuning)


def _plain_all_reduce(xs, axes, groups, op, invariant, tuning):
    """all_reduce_p of `xs` without a pre-multiplier."""
    return all_reduce_p.bind(
        *xs,
        axes=axes,
        groups=groups,
        op=op,
        premul=0,
        premul_value=0.0,
        invariant=invariant,
        tuning=tuning,
    )


def _all_reduce_jvp(primals, tangents, **params):
    op, premul = params["op"], params["premul"]
    if op not in ("sum", "avg"):
        raise NotImplementedError(
            f"Differentiation rule for jax_rccl all_reduce with op={op!r} is not implemented "
            "(jax.lax defines none for pmax/pmin either)"
        )
    outs = all_reduce_p.bind(*primals, **params)
    n = len(outs)
    xs, scales = primals[:n], primals[n:]
    txs, tscales = tangents[:n], tangents[n:]
    live = [i for i, t in enumerate(txs) if type(t) is not compat.Zero]
    out_t = [compat.tangent_zero(o) for o in outs]
    if live:
        args = [txs[i] for i in live] + ([scales[i] for i in live] if premul == 2 else [])
        for i, t in zip(live, all_reduce_p.bind(*args, **params), strict=True):
            out_t[i] = t
    # premul == 2: the result is also linear in the per-device scale: d(sum s x) += sum x ds.
    live_s = [i for i, t in enumerate(tscales) if type(t) is not compat.Zero]
    if live_s:
        terms = [xs[i] * tscales[i].astype(xs[i].dtype) for i in live_s]
        sp = dict(params, premul=0)
        for i, t in zip(live_s, all_reduce_p.bind(*terms, **sp), strict=True):
            out_t[i] = t if type(out_t[i]) is compat.Zero else out_t[i] + t
    return outs, out_t


def _all_reduce_transpose(cts, *args, axes, groups, op, premul, premul_value, invariant, tuning):
    n = len(cts) if premul != 2 else len(args) // 2
    leaves, scales = args[:n], args[n:]
    if any(compat.is_undefined_primal(s) for s in scales):
        raise NotImplementedError("jax_rccl.all_reduce: transposing w.r.t. the premul scale")
    res = [compat.ct_zero(a) if compat.is_undefined_primal(a) else None for a in args]
    live = [i for i, ct in enumerate(cts) if type(ct) is not compat.Zero]
    if not live:
        return res
    # A leaf typed unreduced transposes as jax.lax's Unreduced -> Invariant sum: its cotangent
    # is the invariant one cast to reduced (no communication).
    unred = [i for i in live if _sums_partial_values(leaves[i], axes)]
    rest = [i for i in live if i not in unred]
    summed = {i: compat.preduced(cts[i], tuple(axes)) for i in unred}
    if rest:
        outs = _sum_transpose_of(
            [cts[i] for i in rest], axes=axes, groups=groups, invariant=invariant, tuning=tuning
        )
        summed.update(zip(rest, outs, strict=True))
    for i in live:
        ct = summed[i]
        if op == "avg":
            size = group_size_here(axes, groups)
            ct = ct / (
                np.asarray(size, ct.dtype) if isinstance(size, int) else size.astype(ct.dtype)
            )
        if premul == 1:
            ct = ct * np.asarray(premul_value, ct.dtype)
        elif premul == 2:
            ct = ct * scales[i].astype(ct.dtype)
        if compat.is_undefined_primal(leaves[i]):
            res[i] = ct
    return res


def _sums_partial_values(leaf, axes) -> bool:
    """Whether the linear input `leaf` of an all_reduce was typed unreduced over `axes`: its
    undefined primal's type is unreduced, or (jax 0.10 types it as its cotangent) reduced
    there (an all_reduce never takes a reduced value)."""
    aval = leaf.aval if compat.is_undefined_primal(leaf) else compat.typeof(leaf)
    return is_unreduced_over(aval, axes) or bool(compat.reduced(aval) & set(axes))


def _all_reduce_batch(axis_data, vals, dims, **params):
    premul = params["premul"]
    n = len(vals) // 2 if premul == 2 else len(vals)
    if axis_data.name in params["axes"]:
        return _all_reduce_over_vmapped_axis(axis_data, vals, dims, n, **params)
    if premul == 2 and any(d is not compat.not_mapped for d in dims[n:]):
        # A batched scale is no longer a scalar: apply it here and sum without a premul.
        pairs = [
            _scaled(*a, axis_data.size)
            for a in zip(vals[:n], dims[:n], vals[n:], dims[n:], strict=True)
        ]
        outs = all_reduce_p.bind(*[x for x, _ in pairs], **dict(params, premul=0))
        return outs, [d for _, d in pairs]
    outs = all_reduce_p.bind(*vals, **params)
    return outs, list(dims[:n])


def _scaled(x, d, scale, ds, size):
    """(x * scale, its batch dimension) for a per-device scale scalar, either one batched."""
    if d is compat.not_mapped and ds is compat.not_mapped:
        return x * scale.astype(x.dtype), d
    x, scale = _batch_first(x, d, size), _batch_first(scale, ds, size)
    return x * lax.broadcast_in_dim(scale.astype(x.dtype), x.shape, (0,)), 0


def _all_reduce_over_vmapped_axis(
    axis_data, vals, dims, n, *, axes, groups, op, premul, premul_value, invariant, tuning
):
    """The vmapped axis reduced over the batch dimension, the rest by the runtime. avg sums
    first and divides by the whole group size once (integers truncate, as the runtime)."""
    rest, M, V, m = _vmapped_split(axis_data, axes, groups, "jax_rccl.all_reduce")
    xs, ds = list(vals[:n]), list(dims[:n])
    if premul == 1:
        xs = [x * np.asarray(premul_value, x.dtype) for x in xs]
    elif premul == 2:
        pairs = [_scaled(*a, V) for a in zip(xs, ds, vals[n:], dims[n:], strict=True)]
        xs, ds = [x for x, _ in pairs], [d for _, d in pairs]
    local_op = "sum" if op == "avg" else op
    outs = []
    for x, d in zip(xs, ds, strict=True):
        if d is not compat.not_mapped:
            x = _REDUCERS[local_op](x, (d,))
        elif local_op == "sum":
            x = x * np.asarray(V, x.dtype)
        elif local_op == "prod":
            x = lax.integer_pow(x, V)
        outs.append(x)
    if rest:
        outs = _plain_all_reduce(outs, rest, None, local_op, invariant, tuning)
    if op == "avg":
        outs = [lax.div(x, np.asarray(M * V * m, x.dtype)) for x in outs]
    return list(outs), [compat.not_mapped] * len(outs)


_REDUCERS = {
    "sum": lax.reduce_sum,
    "prod": lax.reduce_prod,
    "max": lax.reduce_max,
    "min": lax.reduce_min,
}


def group_size_here(axes, groups):
    """The size of this device's group: an int, or (axis_index_groups of unequal sizes, the
    reductions') an int32 value looked up by the device's index over `axes`."""
    sizes = {len(g) for g in groups} if groups is not None else set()
    if len(sizes) <= 1:
        return _group_size(axes, groups)
    table = np.zeros(sum(len(g) for g in groups), np.int32)
    for g in groups:
        table[list(g)] = len(g)
    return jnp.asarray(table)[lax.axis_index(tuple(axes))]


def _group_size(axes, groups):
    if groups is not None:
        return len(groups[0])
    return int(np.prod([compat.axis_size(a) for a in axes]))


#: The public functions named after an op; the others are all_reduce(op).
_REDUCE_NAMES = {"sum": "psum", "max": "pmax", "min": "pmin"}


def _all_reduce_lowering(ctx, *args, axes, groups, op, premul, premul_value, invariant, tuning):
    del invariant
    n = len(args) // 2 if premul == 2 else len(args)
    return L.lower_collective(
        ctx,
        *args,
        kind="all_reduce",
        axes=axes,
        groups=groups,
        op=op,
        premul=premul,
        premul_value=premul_value,
        tuning=tuning,
        n_leaves=n,
        name=L.label(
            "all_reduce(premul)" if premul else _REDUCE_NAMES.get(op, f"all_reduce({op})"), axes
        ),
    )


all_reduce_p.def_effectful_abstract_eval(_all_reduce_abstract_eval)
compat.ad.primitive_jvps[all_reduce_p] = _all_reduce_jvp
compat.ad.primitive_transposes[all_reduce_p] = _all_reduce_transpose
compat.batching.fancy_primitive_batchers[all_reduce_p] = _all_reduce_batch
L.register(all_reduce_p, _all_reduce_lowering, xla=own_xla_rule("all_reduce"))


# --- the primitives linear in every operand (all but all_reduce_p) ---------------------------


def _register_linear(prim, abstract_eval, dual, batch, lowering, xla_kind=None):
    """The rules of `prim`, linear in every operand: its abstract eval, the linear JVP, the
    transpose through `dual(cts, **params)`, the batching rule and the lowering (XLA's rule of
    `xla_kind` where no jax_rccl runtime is, see `own_xla_rule`)."""
    prim.def_effectful_abstract_eval(abstract_eval)
    compat.ad.primitive_jvps[prim] = partial(_linear_jvp, prim)
    compat.ad.primitive_transposes[prim] = partial(_linear_transpose, dual, prim)
    compat.batching.fancy_primitive_batchers[prim] = batch
    L.register(prim, lowering, xla=None if xla_kind is None else own_xla_rule(xla_kind))


# --- reduce_p (sum to `root`, zeros elsewhere) <-> broadcast_p (from `root`) -----------------

reduce_p = _defprim("reduce")
broadcast_p = _defprim("broadcast")


def _rooted_abstract_eval(*avals, axes, groups, root, tuning, api):
    del tuning
    _common_checks(avals, axes, api)
    n = _group_size(axes, groups)
    if not 0 <= root < n:
        raise ValueError(f"{api}: root {root} is outside the group of size {n}")
    _require_varying(avals, axes, api)
    return list(avals), compat.named_axis_effects(axes)


def _rooted_batch(prim, axis_data, vals, dims, *, axes, groups, root, tuning):
    if axis_data.name not in axes:
        return prim.bind(*vals, axes=axes, groups=groups, root=root, tuning=tuning), list(dims)
    api = "jax_rccl.preduce" if prim is reduce_p else "jax_rccl.pbroadcast"
    rest, M, V, m = _vmapped_split(axis_data, axes, groups, api)
    j, rest_root = _split_rank(root, V, m)
    if prim is broadcast_p:  # every element gets element j of the root's device
        xs = [
            x if d is compat.not_mapped else lax.index_in_dim(x, j, d, keepdims=False)
            for x, d in zip(vals, dims, strict=True)
        ]
    else:  # the sum over the batch, delivered to element j of the root's device
        xs = [_sum_batch(x, d, V) for x, d in zip(vals, dims, strict=True)]
    if rest:
        xs = prim.bind(*xs, axes=rest, groups=None, root=rest_root, tuning=tuning)
    if prim is broadcast_p:
        return list(xs), [compat.not_mapped] * len(xs)
    # element j holds the result, the others zeros
    outs = [
        lax.pad(x[None], np.zeros((), x.dtype), [(j, V - 1 - j, 0)] + [(0, 0, 0)] * x.ndim)
        for x in xs
    ]
    return outs, [0] * len(outs)


def _rooted_lowering(ctx, *args, axes, groups, root, tuning, kind, api):
    return L.lower_collective(
        ctx,
        *args,
        kind=kind,
        axes=axes,
        groups=groups,
        root=root,
        tuning=tuning,
        name=L.label(api, axes),
    )


def _register_rooted(prim, dual, kind, api, xla_kind=None):
    """reduce_p's or broadcast_p's rules: each transposes to the other."""
    _register_linear(
        prim,
        partial(_rooted_abstract_eval, api=f"jax_rccl.{api}"),
        lambda cts, **p: dual.bind(*cts, **p),
        partial(_rooted_batch, prim),
        partial(_rooted_lowering, kind=kind, api=api),
        xla_kind=xla_kind,
    )


_register_rooted(reduce_p, broadcast_p, "reduce", "preduce")
_register_rooted(broadcast_p, reduce_p, "broadcast", "pbroadcast", xla_kind="broadcast")


# --- all_gather_p (x[s] -> y[n, s]) <-> reduce_scatter_p (x[n, s] -> y[s]) ------------------
# all_gather_p's `to` types its result over `axes` as jax.lax.all_gather(to=...) does:
# "varying" (keeps the input's type), "invarying" (invariant over `axes`; transposes to each
# device's own block) or "reduced" (explicit sharding: reduced over `axes`, its cotangent
# unreduced). reduce_scatter_p's `src` is "varying", or "unreduced" for the dual of "reduced"
# (partial sums in, varying blocks out: jax.lax.psum_scatter of an unreduced value).

all_gather_p = _defprim("all_gather")
reduce_scatter_p = _defprim("reduce_scatter")

GATHER_TO = ("varying", "invarying", "reduced")


def _all_gather_abstract_eval(*avals, axes, groups, axis_size, to, tuning):
    del groups, tuning
    api = "jax_rccl.all_gather"
    check_axis_names(axes, api)
    _check_leaf_dtypes(avals, api)
    if to not in GATHER_TO:
        raise ValueError(f"{api}: to={to!r} is not one of {GATHER_TO}")
    if to == "reduced":
        _reduced_gather_checks(avals, axes, api)
    else:
        compat.check_unreduced(avals, axes, api)
    if to == "varying":
        _require_varying(avals, axes, api)
    outs = []
    for a in avals:
        out = a.update(shape=(axis_size, *a.shape))
        if to != "varying":
            vma = compat.varying(a) - set(axes)
            red = compat.reduced(a) | set(axes) if to == "reduced" else None
            out = compat.with_axis_types(out, varying=vma, reduced=red)
        outs.append(out)
    return outs, compat.named_axis_effects(axes)


def _reduced_gather_checks(avals, axes, api):
    """jax.lax's rule for a Varying -> Reduced gather."""
    for i, a in enumerate(avals):
        vma = compat.varying(a)
        if not vma & set(axes):
            raise ValueError(
                f"{api}(to='reduced'): leaf {i} must be varying over axis_name {tuple(axes)}, "
                f"but its type varies over {sorted(map(str, vma))} (a shard_map body under "
                "check_vma, with the value split over those axes)"
            )
        if compat.reduced(a) & set(axes):
            raise ValueError(
                f"{api}(to='reduced'): leaf {i} is already reduced over axis_name {tuple(axes)}"
            )


def _all_gather_dual(cts, *, axes, groups, axis_size, to, tuning):
    if to == "invarying":  # each device's own block of the invariant cotangent
        r = lax.axis_index(tuple(axes))
        return [lax.dynamic_index_in_dim(ct, r, 0, keepdims=False) for ct in cts]
    src = "unreduced" if to == "reduced" else "varying"
    return reduce_scatter_p.bind(
        *cts, axes=axes, groups=groups, axis_size=axis_size, src=src, tuning=tuning
    )


def _all_gather_batch(axis_data, vals, dims, **params):
    if axis_data.name in params["axes"]:
        return _all_gather_over_vmapped_axis(axis_data, vals, dims, **params)
    # A batched leaf x[B, s] gathers to y[n, B, s]: the batch dimension ends up at 1.
    xs = [
        v if d is compat.not_mapped else _moveaxis(v, d, 0) for v, d in zip(vals, dims, strict=True)
    ]
    return all_gather_p.bind(*xs, **params), [
        compat.not_mapped if d is compat.not_mapped else 1 for d in dims
    ]


def _all_gather_over_vmapped_axis(axis_data, vals, dims, *, axes, groups, axis_size, to, tuning):
    """y[n, s] = every element's x, the same for all elements (unbatched)."""
    if to == "reduced":
        raise NotImplementedError(
            "jax_rccl.all_gather: to='reduced' over an axis bound by jax.vmap "
            f"({axis_data.name!r}) is not supported (nor by jax.lax)"
        )
    rest, M, V, m = _vmapped_split(axis_data, axes, groups, "jax_rccl.all_gather")
    # Batched leaves x[V, s] gather over the rest to [M m, V, s]; unbatched ones to [M m, s].
    xs = [
        x if d is compat.not_mapped else _moveaxis(x, d, 0) for x, d in zip(vals, dims, strict=True)
    ]
    if rest:
        xs = all_gather_p.bind(*xs, axes=rest, groups=None, axis_size=M * m, to=to, tuning=tuning)
    outs = []
    for x, d in zip(xs, dims, strict=True):
        if not rest:
            x = x[None]
        if d is compat.not_mapped:
            shape = (x.shape[0], V, *x.shape[1:])
            x = lax.broadcast_in_dim(x, shape, (0, *range(2, len(shape))))
        outs.append(_from_rest_major(x, M, V, m))
    return outs, [compat.not_mapped] * len(outs)


_register_linear(
    all_gather_p,
    _all_gather_abstract_eval,
    _all_gather_dual,
    _all_gather_batch,
    partial(_moving_lowering, kind="all_gather", api="all_gather"),
    xla_kind="all_gather",
)


def _leading_blocks_check(avals, axis_size, api):
    for i, a in enumerate(avals):
        if not a.shape or a.shape[0] != axis_size:
            raise ValueError(
                f"{api}: leaf {i} of shape {a.shape} must have a leading dimension equal "
                f"to the group size {axis_size}"
            )


def _reduce_scatter_abstract_eval(*avals, axes, groups, axis_size, src, tuning):
    del groups, tuning
    api = "jax_rccl.psum_scatter"
    _leading_blocks_check(avals, axis_size, api)
    if src == "varying":
        _common_checks(avals, axes, api)
        _require_varying(avals, axes, api)
        return [a.update(shape=a.shape[1:]) for a in avals], compat.named_axis_effects(axes)
    check_axis_names(axes, api)
    _check_leaf_dtypes(avals, api)
    outs = []
    for i, a in enumerate(avals):  # jax.lax's rule for an Unreduced -> Varying scatter
        if not compat.unreduced(a) & set(axes):
            raise ValueError(f"{api}: leaf {i} is not unreduced over axis_name {tuple(axes)}")
        if compat.varying(a) & set(axes):
            raise ValueError(f"{api}: leaf {i} is unreduced and varying over {tuple(axes)}")
        if not compat.unreduced_by_sum(a):
            raise ValueError(f"{api}: leaf {i} is unreduced with partial values that are no sums")
        out = a.update(shape=a.shape[1:])
        outs.append(
            compat.with_axis_types(
                out,
                varying=compat.varying(a) | set(axes),
                unreduced=compat.unreduced(a) - set(axes),
            )
        )
    return outs, compat.named_axis_effects(axes)


def _reduce_scatter_dual(cts, *, axes, groups, axis_size, src, tuning):
    to = "reduced" if src == "unreduced" else "varying"
    return all_gather_p.bind(
        *cts, axes=axes, groups=groups, axis_size=axis_size, to=to, tuning=tuning
    )


def _blocks_batch(prim, axis_data, vals, dims, **params):
    """x[n, s] with a batch dimension: put it right after the block dimension."""
    if axis_data.name in params["axes"]:
        over = (
            _reduce_scatter_over_vmapped_axis
            if prim is reduce_scatter_p
            else _all_to_all_over_vmapped_axis
        )
        return over(axis_data, vals, dims, **params)
    xs = [
        v if d is compat.not_mapped else _moveaxis(v, d, 1) for v, d in zip(vals, dims, strict=True)
    ]
    out_dim = 0 if prim is reduce_scatter_p else 1
    return prim.bind(*xs, **params), [
        compat.not_mapped if d is compat.not_mapped else out_dim for d in dims
    ]


def _reduce_scatter_over_vmapped_axis(
    axis_data, vals, dims, *, axes, groups, axis_size, src, tuning
):
    """Element j of device (a, b) gets block (a, j, b) of the sum: sum the batch here, then
    scatter the blocks over the rest, each device keeping its V blocks."""
    if src == "unreduced":
        raise NotImplementedError(
            "jax_rccl.psum_scatter of an unreduced value over an axis bound by jax.vmap "
            f"({axis_data.name!r}) is not supported (nor by jax.lax)"
        )
    rest, M, V, m = _vmapped_split(axis_data, axes, groups, "jax_rccl.psum_scatter")
    ts = [_sum_batch(x, d, V) for x, d in zip(vals, dims, strict=True)]  # t[n, s]
    if rest:
        ts = reduce_scatter_p.bind(
            *[_to_rest_major(t, M, V, m) for t in ts],
            axes=rest,
            groups=None,
            axis_size=M * m,
            src=src,
            tuning=tuning,
        )
    return list(ts), [0] * len(ts)


_register_linear(
    reduce_scatter_p,
    _reduce_scatter_abstract_eval,
    _reduce_scatter_dual,
    partial(_blocks_batch, reduce_scatter_p),
    partial(_moving_lowering, kind="reduce_scatter", api="psum_scatter"),
    xla_kind="reduce_scatter",
)


# --- all_to_all_p (x[n, s] -> y[n, s]; its own transpose) ------------------------------------

all_to_all_p = _defprim("all_to_all")


def _all_to_all_abstract_eval(*avals, axes, groups, axis_size, tuning):
    del groups, tuning
    _common_checks(avals, axes, "jax_rccl.all_to_all")
    _leading_blocks_check(avals, axis_size, "jax_rccl.all_to_all")
    _require_varying(avals, axes, "jax_rccl.all_to_all")
    return [a.update(weak_type=False) for a in avals], compat.named_axis_effects(axes)


def _all_to_all_over_vmapped_axis(axis_data, vals, dims, *, axes, groups, axis_size, tuning):
    """Element j of device (a, b) gets block (a, j, b) of every element (a', j', b'):
    x[j', (a, j, b)] is swapped to [(a, b), j, j'] here, exchanged over the rest, and the
    arriving [(a', b'), j, j'] is laid out as y[j, (a', j', b')]."""
    rest, M, V, m = _vmapped_split(axis_data, axes, groups, "jax_rccl.all_to_all")
    xs = [_batch_first(x, d, V) for x, d in zip(vals, dims, strict=True)]  # x[V, n, s]
    if not rest:
        return [_moveaxis(x, 1, 0) for x in xs], [0] * len(xs)
    ins = []
    for x in xs:
        s = x.shape[2:]
        x = lax.reshape(x, (V, M, V, m, *s))
        x = lax.transpose(x, (1, 3, 2, 0, *range(4, 4 + len(s))))
        ins.append(lax.reshape(x, (M * m, V, V, *s)))
    outs = all_to_all_p.bind(*ins, axes=rest, groups=None, axis_size=M * m, tuning=tuning)
    ys = []
    for y in outs:
        s = y.shape[3:]
        y = lax.reshape(y, (M, m, V, V, *s))
        y = lax.transpose(y, (2, 0, 3, 1, *range(4, 4 + len(s))))
        ys.append(lax.reshape(y, (V, M * V * m, *s)))
    return ys, [0] * len(ys)


_register_linear(
    all_to_all_p,
    _all_to_all_abstract_eval,
    lambda cts, **p: all_to_all_p.bind(*cts, **p),
    partial(_blocks_batch, all_to_all_p),
    partial(_moving_lowering, kind="all_to_all", api="all_to_all"),
    xla_kind="all_to_all",
)


# --- ppermute_p (transpose: the inverse permutation) -----------------------------------------

ppermute_p = _defprim("ppermute")


def _ppermute_abstract_eval(*avals, axes, perm, tuning):
    del tuning
    _common_checks(avals, axes, "jax_rccl.ppermute")
    _require_varying(avals, axes, "jax_rccl.ppermute")
    return list(avals), compat.named_axis_effects(axes)


def _ppermute_transpose_dual(cts, *, axes, perm, tuning):
    inverse = tuple((dst, src) for src, dst in perm)
    return ppermute_p.bind(*cts, axes=axes, perm=inverse, tuning=tuning)


def _ppermute_batch(axis_data, vals, dims, **params):
    if axis_data.name in params["axes"]:
        return _ppermute_over_vmapped_axis(axis_data, vals, dims, **params)
    return ppermute_p.bind(*vals, **params), list(dims)


def _ppermute_rank_order(axes) -> tuple:
    """The axes of a ppermute, major to minor in its rank numbering."""
    mesh_axes = compat.manual_axes()
    return tuple(a for a in mesh_axes if a in axes) + tuple(a for a in axes if a not in mesh_axes)


def _ppermute_over_vmapped_axis(axis_data, vals, dims, *, axes, perm, tuning):
    """Pairs (a, j, b) -> (a', j', b') grouped by their pairs over the rest: the pairs of one
    group move as one local gather along the batch (j -> j') and one ppermute over the rest.

    jax.lax.ppermute over several mesh axes numbers the devices in mesh order whatever the
    order of `axes`; with vmapped axes among them, the mesh axes stay major (in mesh order)
    and the vmapped ones follow in the order of `axes`."""
    axes = _ppermute_rank_order(axes)
    rest, M, V, m = _vmapped_split(axis_data, axes, None, "jax_rccl.ppermute")
    xs = [_batch_first(x, d, V) for x, d in zip(vals, dims, strict=True)]
    rest_pairs: dict = {}  # (j, j') -> the pairs over the rest
    for src, dst in perm:
        (js, rs), (jd, rd) = _split_rank(src, V, m), _split_rank(dst, V, m)
        rest_pairs.setdefault((js, jd), []).append((rs, rd))
    moves: dict = {}  # pairs over the rest -> the batch index each element takes (V: none)
    for (js, jd), pairs in rest_pairs.items():
        moves.setdefault(tuple(sorted(pairs)), np.full(V, V)).__setitem__(jd, js)
    if not moves:
        moves[()] = np.full(V, V)
    outs = None
    for pairs, index in moves.items():
        ys = [_take_or_zeros(x, index, V) for x in xs]
        if rest and pairs and outs is None:
            ys = ppermute_p.bind(*ys, axes=rest, perm=pairs, tuning=tuning)
        elif rest and pairs:
            # The groups deliver to disjoint (element, device) pairs: a flag per element
            # travels with the data and says where this group's result is the one to keep.
            flag = _take_or_zeros(vary_over(np.ones(V, np.uint8), rest), index, V)
            *ys, flag = ppermute_p.bind(*ys, flag, axes=rest, perm=pairs, tuning=tuning)
            keep = flag.astype(np.bool_)
            ys = [
                lax.select(lax.broadcast_in_dim(keep, y.shape, (0,)), y, o)
                for y, o in zip(ys, outs, strict=True)
            ]
        outs = list(ys)
    return outs, [0] * len(outs)


def _ppermute_lowering(ctx, *args, axes, perm, tuning):
    return L.lower_collective(
        ctx,
        *args,
        kind="ppermute",
        axes=axes,
        perm=perm,
        tuning=tuning,
        sort_groups=True,
        name=L.label("ppermute", axes),
    )


_register_linear(
    ppermute_p,
    _ppermute_abstract_eval,
    _ppermute_transpose_dual,
    _ppermute_batch,
    _ppermute_lowering,
    xla_kind="ppermute",
)


ALL_PRIMITIVES = (
    all_reduce_p,
    reduce_p,
    broadcast_p,
    all_gather_p,
    reduce_scatter_p,
    all_to_all_p,
    ppermute_p,
)
