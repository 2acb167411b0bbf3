"""jax_rccl's JAX primitives: one registration block per collective.

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
from jax._src import dispatch

from jax_rccl import _compat as compat

# --- shared checks and typing -----------------------------------------------------------------

#: Element types of the contract (bool and complex are converted by jax_rccl.api).
SUPPORTED_DTYPES = frozenset(
    np.dtype(jnp.dtype(name))
    for name in (
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
    )
)

OPS = ("sum", "prod", "max", "min", "avg")
OP_CODES = {op: i for i, op in enumerate(OPS)}


def check_axis_names(axes, api: str) -> None:
    """NameError for an axis name that no shard_map / vmap binds here."""
    for a in axes:
        if not compat.axis_exists(a):
            bound = compat.bound_axis_names()
            raise NameError(
                f"{api}: axis_name {a!r} is not bound here; bound axis names: "
                f"{bound if bound else 'none'} (call it inside jax.shard_map over a mesh "
                "with that axis, or jax.vmap(..., axis_name=...))"
            )


def _check_leaf_dtypes(avals, api: str) -> None:
    for i, a in enumerate(avals):
        if np.dtype(a.dtype) not in SUPPORTED_DTYPES:
            raise TypeError(f"{api}: leaf {i} has unsupported dtype {a.dtype}")


def _require_varying(avals, axes, api: str) -> None:
    """jax.lax's rule for collectives that keep the varying type (check_vma only)."""
    if not compat.check_vma_enabled():
        return
    for a in avals:
        missing = [n for n in axes if n not in compat.varying(a)]
        if missing:
            raise ValueError(
                f"{api} must be applied to a value varying over {tuple(axes)}, but its type "
                f"varies over {sorted(map(str, compat.varying(a)))}; the public jax_rccl "
                "functions insert the pvary themselves (or use shard_map(check_vma=False))"
            )


def _common_checks(avals, axes, api):
    check_axis_names(axes, api)
    compat.check_unreduced(avals, axes, api)
    _check_leaf_dtypes(avals, api)


def _linear_jvp(prim, primals, tangents, **params):
    """JVP of a primitive linear in every operand: bind it again on the nonzero tangents."""
    outs = prim.bind(*primals, **params)
    live = [i for i, t in enumerate(tangents) if type(t) is not compat.Zero]
    if not live:
        return outs, [compat.tangent_zero(o) for o in outs]
    t_outs = prim.bind(*[tangents[i] for i in live], **params)
    out_t = [compat.tangent_zero(o) for o in outs]
    for i, t in zip(live, t_outs, strict=True):
        out_t[i] = t
    return outs, out_t


def _linear_transpose(dual, prim, cts, *args, **params):
    """Transpose of a linear variadic primitive through `dual(cts, avals, **params)`."""
    live = [i for i, ct in enumerate(cts) if type(ct) is not compat.Zero]
    res = [compat.ct_zero(a) if compat.is_undefined_primal(a) else None for a in args]
    if live:
        outs = dual([cts[i] for i in live], **params)
        for i, o in zip(live, outs, strict=True):
            res[i] = o
    return res


def _defprim(name: str):
    p = compat.Primitive(f"jax_rccl_{name}")
    p.multiple_results = True
    p.def_impl(partial(dispatch.apply_primitive, p))
    return p


def _moveaxis(x, src, dst):
    return x if src == dst else lax.transpose(x, _moved_perm(x.ndim, src, dst))


def _moved_perm(ndim, src, dst):
    perm = [i for i in range(ndim) if i != src]
    perm.insert(dst, src)
    return perm


def _vmap_over_collective_axis(prim_name: str):
    raise NotImplementedError(
        f"jax_rccl.{prim_name}: a collective over an axis bound by jax.vmap is not supported; "
        "use it over shard_map mesh axes"
    )


# --- all_reduce_p ------------------------------------------------------------------------------
# Operands: the leaves, then (premul == 2) one scalar per leaf. `invariant`: typed as jax.lax
# types psum/pmax/pmin under check_vma (result invariant over `axes`); False with groups.

all_reduce_p = _defprim("all_reduce")


def _all_reduce_abstract_eval(*avals, axes, groups, op, premul, premul_value, invariant, tuning):
    del groups, premul_value, tuning
    nleaves = len(avals) // 2 if premul == 2 else len(avals)
    leaves = avals[:nleaves]
    _common_checks(leaves, axes, "jax_rccl.all_reduce")
    if op not in OPS:
        raise ValueError(f"jax_rccl.all_reduce: op {op!r} is not one of {OPS}")
    outs = []
    for a in leaves:
        if compat.check_vma_enabled():
            vma = compat.varying(a) - set(axes) if invariant else compat.varying(a)
            a = compat.with_varying(a, vma)
        outs.append(a)
    return outs, compat.named_axis_effects(axes)


def _sum_transpose_of(cts, *, axes, groups, invariant, tuning):
    """Cotangent of a plain sum-all-reduce (jax.lax: psum <-> pvary, or psum when untyped)."""
    if invariant and compat.check_vma_enabled():
        return [
            compat.pvary(ct, tuple(a for a in axes if a not in compat.varying(compat.typeof(ct))))
            for ct in cts
        ]
    return all_reduce_p.bind(
        *cts,
        axes=axes,
        groups=groups,
        op="sum",
        premul=0,
        premul_value=0.0,
        invariant=invariant,
        tuning=tuning,
    )


def _all_reduce_jvp(
    primals, tangents, *, axes, groups, op, premul, premul_value, invariant, tuning
):
    params = dict(
        axes=axes,
        groups=groups,
        op=op,
        premul=premul,
        premul_value=premul_value,
        invariant=invariant,
        tuning=tuning,
    )
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
    summed = _sum_transpose_of(
        [cts[i] for i in live], axes=axes, groups=groups, invariant=invariant, tuning=tuning
    )
    for i, ct in zip(live, summed, strict=True):
        if op == "avg":
            ct = ct / np.asarray(_group_size(axes, groups), ct.dtype)
        if premul == 1:
            ct = ct * np.asarray(premul_value, ct.dtype)
        elif premul == 2:
            ct = ct * scales[i].astype(ct.dtype)
        if compat.is_undefined_primal(leaves[i]):
            res[i] = ct
    return res


def _all_reduce_batch(
    axis_data, vals, dims, *, axes, groups, op, premul, premul_value, invariant, tuning
):
    params = dict(
        axes=axes,
        groups=groups,
        op=op,
        premul=premul,
        premul_value=premul_value,
        invariant=invariant,
        tuning=tuning,
    )
    n = len(vals) // 2 if premul == 2 else len(vals)
    if axis_data.name in axes:
        return _all_reduce_over_vmapped_axis(axis_data, vals[:n], dims[:n], **params)
    if premul == 2 and any(d is not compat.not_mapped for d in dims[n:]):
        # A batched scale is no longer a scalar: apply it here and sum without a premul.
        xs = []
        for x, d, s, ds in zip(vals[:n], dims[:n], vals[n:], dims[n:], strict=True):
            x = (
                lax.broadcast(x, (axis_data.size,))
                if d is compat.not_mapped
                else _moveaxis(x, d, 0)
            )
            s = lax.broadcast(s, (axis_data.size,)) if ds is compat.not_mapped else s
            s = lax.broadcast_in_dim(s.astype(x.dtype), x.shape, (0,))
            xs.append(x * s)
        outs = all_reduce_p.bind(*xs, **dict(params, premul=0))
        return outs, [0] * n
    outs = all_reduce_p.bind(*vals, **params)
    return outs, list(dims[:n])


def _all_reduce_over_vmapped_axis(
    axis_data, xs, dims, *, axes, groups, op, premul, premul_value, invariant, tuning
):
    if groups is not None or premul == 2:
        _vmap_over_collective_axis("all_reduce with axis_index_groups or an array premul")
    size = axis_data.size
    outs = []
    for x, d in zip(xs, dims, strict=True):
        if premul == 1:
            x = x * np.asarray(premul_value, x.dtype)
        if d is compat.not_mapped:
            if op == "sum":
                x = x * np.asarray(size, x.dtype)
            elif op == "prod":
                x = lax.integer_pow(x, size)
        else:
            if op == "avg":
                x = lax.reduce_sum(x, (d,)) / np.asarray(size, x.dtype)
            else:
                x = _REDUCERS[op](x, (d,))
        outs.append(x)
    rest = tuple(a for a in axes if a != axis_data.name)
    if rest:
        outs = all_reduce_p.bind(
            *outs,
            axes=rest,
            groups=None,
            op=op,
            premul=0,
            premul_value=0.0,
            invariant=invariant,
            tuning=tuning,
        )
    return list(outs), [compat.not_mapped] * len(outs)


_REDUCERS = {
    "sum": lax.reduce_sum,
    "prod": lax.reduce_prod,
    "max": lax.reduce_max,
    "min": lax.reduce_min,
}


def _group_size(axes, groups):
    if groups is not None:
        return len(groups[0])
    return int(np.prod([compat.axis_size(a) for a in axes]))


all_reduce_p.def_effectful_abstract_eval(_all_reduce_abstract_eval)
compat.ad.primitive_jvps[all_reduce_p] = _all_reduce_jvp
compat.ad.primitive_transposes[all_reduce_p] = _all_reduce_transpose
compat.batching.fancy_primitive_batchers[all_reduce_p] = _all_reduce_batch


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


def _rooted_batch(prim, axis_data, vals, dims, **params):
    if axis_data.name in params["axes"]:
        _vmap_over_collective_axis(prim.name)
    return prim.bind(*vals, **params), list(dims)


reduce_p.def_effectful_abstract_eval(partial(_rooted_abstract_eval, api="jax_rccl.preduce"))
compat.ad.primitive_jvps[reduce_p] = partial(_linear_jvp, reduce_p)
compat.ad.primitive_transposes[reduce_p] = partial(
    _linear_transpose, lambda cts, **p: broadcast_p.bind(*cts, **p), reduce_p
)
compat.batching.fancy_primitive_batchers[reduce_p] = partial(_rooted_batch, reduce_p)

broadcast_p.def_effectful_abstract_eval(partial(_rooted_abstract_eval, api="jax_rccl.pbroadcast"))
compat.ad.primitive_jvps[broadcast_p] = partial(_linear_jvp, broadcast_p)
compat.ad.primitive_transposes[broadcast_p] = partial(
    _linear_transpose, lambda cts, **p: reduce_p.bind(*cts, **p), broadcast_p
)
compat.batching.fancy_primitive_batchers[broadcast_p] = partial(_rooted_batch, broadcast_p)


# --- all_gather_p (x[s] -> y[n, s]) <-> reduce_scatter_p (x[n, s] -> y[s]) ------------------

all_gather_p = _defprim("all_gather")
reduce_scatter_p = _defprim("reduce_scatter")


def _all_gather_abstract_eval(*avals, axes, groups, axis_size, tuning):
    del groups, tuning
    _common_checks(avals, axes, "jax_rccl.all_gather")
    _require_varying(avals, axes, "jax_rccl.all_gather")
    return ([a.update(shape=(axis_size, *a.shape)) for a in avals], compat.named_axis_effects(axes))


def _all_gather_batch(axis_data, vals, dims, **params):
    if axis_data.name in params["axes"]:
        _vmap_over_collective_axis("all_gather")
    # A batched leaf x[B, s] gathers to y[n, B, s]: the batch dimension ends up at 1.
    xs = [
        v if d is compat.not_mapped else _moveaxis(v, d, 0) for v, d in zip(vals, dims, strict=True)
    ]
    return all_gather_p.bind(*xs, **params), [
        compat.not_mapped if d is compat.not_mapped else 1 for d in dims
    ]


all_gather_p.def_effectful_abstract_eval(_all_gather_abstract_eval)
compat.ad.primitive_jvps[all_gather_p] = partial(_linear_jvp, all_gather_p)
compat.ad.primitive_transposes[all_gather_p] = partial(
    _linear_transpose, lambda cts, **p: reduce_scatter_p.bind(*cts, **p), all_gather_p
)
compat.batching.fancy_primitive_batchers[all_gather_p] = _all_gather_batch


def _leading_blocks_check(avals, axis_size, api):
    for i, a in enumerate(avals):
        if not a.shape or a.shape[0] != axis_size:
            raise ValueError(
                f"{api}: leaf {i} of shape {a.shape} must have a leading dimension equal "
                f"to the group size {axis_size}"
            )


def _reduce_scatter_abstract_eval(*avals, axes, groups, axis_size, tuning):
    del groups, tuning
    _common_checks(avals, axes, "jax_rccl.psum_scatter")
    _leading_blocks_check(avals, axis_size, "jax_rccl.psum_scatter")
    _require_varying(avals, axes, "jax_rccl.psum_scatter")
    return [a.update(shape=a.shape[1:]) for a in avals], compat.named_axis_effects(axes)


def _blocks_batch(prim, axis_data, vals, dims, **params):
    """x[n, s] with a batch dimension: put it right after the block dimension."""
    if axis_data.name in params["axes"]:
        _vmap_over_collective_axis(prim.name)
    xs = [
        v if d is compat.not_mapped else _moveaxis(v, d, 1) for v, d in zip(vals, dims, strict=True)
    ]
    out_dim = 0 if prim is reduce_scatter_p else 1
    return prim.bind(*xs, **params), [
        compat.not_mapped if d is compat.not_mapped else out_dim for d in dims
    ]


reduce_scatter_p.def_effectful_abstract_eval(_reduce_scatter_abstract_eval)
compat.ad.primitive_jvps[reduce_scatter_p] = partial(_linear_jvp, reduce_scatter_p)
compat.ad.primitive_transposes[reduce_scatter_p] = partial(
    _linear_transpose, lambda cts, **p: all_gather_p.bind(*cts, **p), reduce_scatter_p
)
compat.batching.fancy_primitive_batchers[reduce_scatter_p] = partial(
    _blocks_batch, reduce_scatter_p
)


# --- all_to_all_p (x[n, s] -> y[n, s]; its own transpose) ------------------------------------

all_to_all_p = _defprim("all_to_all")


def _all_to_all_abstract_eval(*avals, axes, groups, axis_size, tuning):
    del groups, tuning
    _common_checks(avals, axes, "jax_rccl.all_to_all")
    _leading_blocks_check(avals, axis_size, "jax_rccl.all_to_all")
    _require_varying(avals, axes, "jax_rccl.all_to_all")
    return [a.update(weak_type=False) for a in avals], compat.named_axis_effects(axes)


all_to_all_p.def_effectful_abstract_eval(_all_to_all_abstract_eval)
compat.ad.primitive_jvps[all_to_all_p] = partial(_linear_jvp, all_to_all_p)
compat.ad.primitive_transposes[all_to_all_p] = partial(
    _linear_transpose, lambda cts, **p: all_to_all_p.bind(*cts, **p), all_to_all_p
)
compat.batching.fancy_primitive_batchers[all_to_all_p] = partial(_blocks_batch, all_to_all_p)


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
        _vmap_over_collective_axis("ppermute")
    return ppermute_p.bind(*vals, **params), list(dims)


ppermute_p.def_effectful_abstract_eval(_ppermute_abstract_eval)
compat.ad.primitive_jvps[ppermute_p] = partial(_linear_jvp, ppermute_p)
compat.ad.primitive_transposes[ppermute_p] = partial(
    _linear_transpose, _ppermute_transpose_dual, ppermute_p
)
compat.batching.fancy_primitive_batchers[ppermute_p] = _ppermute_batch


ALL_PRIMITIVES = (
    all_reduce_p,
    reduce_p,
    broadcast_p,
    all_gather_p,
    reduce_scatter_p,
    all_to_all_p,
    ppermute_p,
)
