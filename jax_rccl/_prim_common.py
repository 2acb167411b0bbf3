"""What jax_rccl's primitives (jax_rccl.primitives) share: the dtype and axis checks, the typing
of varying manual axes, the linear JVP/transpose rules, and the helpers of collectives over an
axis bound by jax.vmap."""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_rccl import _compat as compat
from jax_rccl import _jax_rccl
from jax_rccl import lowering as L

# --- shared checks and typing -----------------------------------------------------------------

#: Dtypes the runtime knows that no primitive takes: bool travels as uint8 (jax_rccl.api converts
#: it, as it converts complex and the dtypes of jax_rccl._carry).
CONVERTED_DTYPES = frozenset({"bool"})

#: Element types of the contract: the native side's, less those jax_rccl.api converts.
SUPPORTED_DTYPES = frozenset(
    np.dtype(jnp.dtype(name)) for name in _jax_rccl.dtypes() if name not in CONVERTED_DTYPES
)

#: Reduction ops, in the native side's order (an op's index is its code, `L.OP_CODES`).
OPS = tuple(_jax_rccl.reduction_ops())


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
    """jax.lax's rule for collectives that keep the varying type (check_vma only). Axes bound
    by jax.vmap are not part of a value's type, so only mesh axes are checked."""
    if not compat.check_vma_enabled():
        return
    mesh_axes = compat.manual_axes()
    for a in avals:
        missing = [n for n in axes if n in mesh_axes and n not in compat.varying(a)]
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
    p.def_impl(partial(compat.apply_primitive, p))
    return p


def _moveaxis(x, src, dst):
    return x if src == dst else lax.transpose(x, _moved_perm(x.ndim, src, dst))


def _moved_perm(ndim, src, dst):
    perm = [i for i in range(ndim) if i != src]
    perm.insert(dst, src)
    return perm


# --- collectives over an axis bound by jax.vmap ----------------------------------------------
# The batching rule of a collective whose axes hold the vmapped axis `v` (size V) does the `v`
# part as local array operations over the batch dimension, and the rest through the same
# primitive over the remaining axes. A rank of the group over axes (..., v, ...) is row-major:
# r = (a * V + j) * m + b, with a the rank over the axes before `v` (M of them in all), j the
# index along `v`, b the rank over the axes after it (m); a * m + b is the rank over the rest.


def _vmapped_split(axis_data, axes, groups, api: str):
    """(rest axes, M, V, m) of a collective over `axes` that holds the vmapped axis."""
    name = axis_data.name
    if groups is not None:
        raise NotImplementedError(
            f"{api}: axis_index_groups with an axis bound by jax.vmap ({name!r} in axis_name "
            f"{tuple(axes)}) is not supported (nor by jax.lax); use axis_index_groups=None or "
            "a shard_map mesh axis"
        )
    p = axes.index(name)
    major = int(np.prod([compat.axis_size(a) for a in axes[:p]], dtype=np.int64))
    minor = int(np.prod([compat.axis_size(a) for a in axes[p + 1 :]], dtype=np.int64))
    return axes[:p] + axes[p + 1 :], major, int(axis_data.size), minor


def _split_rank(r, V, m):
    """(j, rest rank) of rank r of the whole group."""
    a, rem = divmod(int(r), V * m)
    j, b = divmod(rem, m)
    return j, a * m + b


def _batch_first(x, d, size):
    """x with its batch dimension first (broadcast to `size` when it has none)."""
    return lax.broadcast(x, (size,)) if d is compat.not_mapped else _moveaxis(x, d, 0)


def _sum_batch(x, d, size):
    """The sum over the batch dimension (size * x when x has none)."""
    if d is compat.not_mapped:
        return x * np.asarray(size, x.dtype)
    return lax.reduce_sum(x, (d,))


def _to_rest_major(t, M, V, m):
    """t[n, s] in group-rank order -> [M m, V, s]: rank (a, j, b) -> ((a, b), j)."""
    s = t.shape[1:]
    t = lax.reshape(t, (M, V, m, *s))
    t = lax.transpose(t, (0, 2, 1, *range(3, 3 + len(s))))
    return lax.reshape(t, (M * m, V, *s))


def _from_rest_major(t, M, V, m):
    """The inverse of _to_rest_major: [M m, V, s] -> [n, s] in group-rank order."""
    s = t.shape[2:]
    t = lax.reshape(t, (M, m, V, *s))
    t = lax.transpose(t, (0, 2, 1, *range(3, 3 + len(s))))
    return lax.reshape(t, (M * V * m, *s))


def _take_or_zeros(x, index, size):
    """y[j] = x[index[j]] along the leading dimension; zeros where index[j] == size."""
    index = np.asarray(index)
    if np.array_equal(index, np.arange(size)):
        return x
    return jnp.take(x, index, axis=0, mode="fill", fill_value=0)


def vary_over(x, axes):
    """x typed varying over the mesh axes among `axes` (under check_vma; vmapped axes are
    never part of a type)."""
    if not compat.check_vma_enabled():
        return x
    mesh_axes, have = compat.manual_axes(), compat.varying(compat.typeof(x))
    return compat.pvary(x, tuple(a for a in axes if a in mesh_axes and a not in have))


def _moving_lowering(ctx, *args, axes, groups, axis_size, tuning, kind, api, **typing):
    """The lowering of a data-movement primitive (all_gather, reduce_scatter, all_to_all)."""
    del axis_size, typing  # all_gather's `to`, reduce_scatter's `src`: types only
    return L.lower_collective(
        ctx, *args, kind=kind, axes=axes, groups=groups, tuning=tuning, name=L.label(api, axes)
    )
