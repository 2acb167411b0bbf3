"""jax_rccl as the backend of jax.lax's collectives: `install()` and `uninstall()`.

While installed, every jax.lax collective primitive inside ``jax.shard_map`` or ``jax.pmap``
lowers to jax_rccl's custom calls on the platforms installed (``cpu``, and ``cuda`` / ``rocm``
where the installed build has the GPU runtime): ``psum``, ``pmax``, ``pmin`` (and ``pmean``
through psum), the psum JAX inserts itself (``psum_invariant``: the transpose of an implicit
broadcast, e.g. the gradient all-reduce of replicated parameters), ``all_gather`` (tiled or not,
``all_gather_invariant``), ``psum_scatter``, ``all_to_all`` (and ``pswapaxes``), ``ppermute``
(and ``pshuffle``), ``pbroadcast``, ``ragged_all_to_all`` and ``psend`` / ``precv``. Only where
the collective runs changes: jax.lax's own abstract evaluation, batching, autodiff and typing
rules stay, and each rule here emits the same custom call that jax_rccl's own primitives emit
(`jax_rccl.lowering.lower_collective`: one lowering, two front doors).

What jax_rccl cannot express keeps XLA's lowering for that call (dtypes the runtime does not
carry, ``all_gather`` with ``axis_index_groups``, shapes only known when an exported program is
called, platforms without a jax_rccl runtime) and says so once on stderr when
``JAX_RCCL_DEBUG=INFO``.

``JAX_RCCL_LAX=1`` installs it in a program that never imports jax_rccl: JAX starts the
``jax_plugins`` entry points of installed packages when it starts its backends, and jax_rccl's
(the small ``jax_rccl_plugin`` module, which imports nothing of jax_rccl unless the variable
asks for it) calls `initialize` here (``JAX_RCCL_LAX=cpu,cuda`` names the platforms).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from jax_rccl import _compat as compat
from jax_rccl import _prim_common
from jax_rccl import lowering as L

mlir = compat.mlir
ir = compat.ir
hlo = compat.hlo

#: The platforms install() may take over.
PLATFORMS = L.SUPPORTED_PLATFORMS
#: The variable that installs jax_rccl as jax.lax's backend at JAX's backend start-up.
ENV_VAR = "JAX_RCCL_LAX"

_lock = threading.RLock()
# (platform, primitive) -> the entry JAX had before install() (None: no platform-specific rule)
_saved: dict[tuple[str, Any], Any] = {}
_installed: tuple[str, ...] = ()


def installed_platforms() -> tuple[str, ...]:
    """The platforms whose jax.lax collectives lower to jax_rccl now.

    Returns:
        A tuple of platform names (``()`` when jax_rccl is not installed).

    Example:
        >>> import jax_rccl
        >>> with jax_rccl.install(platforms=("cpu",)):
        ...     print(jax_rccl.installed_platforms())
        ('cpu',)
        >>> jax_rccl.installed_platforms()
        ()
    """
    return _installed


class _Installation:
    """What install() returns: also a context manager that restores, on exit, the platforms
    that were installed before it."""

    def __init__(self, before: tuple[str, ...], now: tuple[str, ...]):
        self._before = before
        self.platforms = now

    def __enter__(self) -> _Installation:
        return self

    def __exit__(self, *exc) -> None:
        if self._before:
            install(self._before)
        else:
            uninstall()

    def __repr__(self) -> str:
        return f"jax_rccl.install(platforms={self.platforms!r})"


def _check_platforms(platforms, what: str) -> tuple[str, ...]:
    if isinstance(platforms, str):
        platforms = (platforms,)
    try:
        out = tuple(dict.fromkeys(platforms))
    except TypeError:
        raise TypeError(
            f"jax_rccl.install: {what} must be a sequence of platform names from {PLATFORMS}, "
            f"got {platforms!r}"
        ) from None
    bad = [p for p in out if p not in PLATFORMS]
    if bad or not out:
        raise ValueError(
            f"jax_rccl.install: {what} must name platforms from {PLATFORMS}, got {platforms!r}"
        )
    return out


def install(platforms: Iterable[str] = PLATFORMS) -> _Installation:
    """Make jax.lax's own collectives inside ``shard_map`` and ``pmap`` run on jax_rccl.

    Every jax.lax collective primitive (psum, pmax, pmin and pmean through psum, the psum JAX
    inserts itself when it differentiates through replicated inputs, all_gather, psum_scatter,
    all_to_all, ppermute, pbroadcast, ragged_all_to_all, psend/precv) lowers to jax_rccl's
    custom calls on the installed platforms; jax.lax's own typing, batching and autodiff rules
    stay, so results are jax.lax's. What jax_rccl cannot express keeps XLA's lowering for that
    call (docs/sharp-bits.md; ``JAX_RCCL_DEBUG=INFO`` says so once). JAX's caches are cleared, so
    functions jitted before are compiled again at their next call. ``JAX_RCCL_LAX=1`` does the
    same in a program that never imports jax_rccl.

    Args:
        platforms: which of ``("cpu", "cuda", "rocm")`` to take over; a GPU platform is used
            only where the installed jax_rccl has its GPU runtime (elsewhere XLA's lowering
            stays). Calling it again replaces the set.

    Returns:
        An object whose ``platforms`` are the platforms installed. It is also a context manager:
        leaving the ``with`` block restores what was installed before it.

    Example:
        >>> import jax, numpy as np, jax_rccl
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> mesh = Mesh(jax.devices(), "i")  # 8 devices
        >>> f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh,
        ...                           in_specs=P("i"), out_specs=P()))
        >>> with jax_rccl.install(platforms=("cpu",)):
        ...     print(f(np.arange(8.0)), "jax_rccl_all_reduce" in f.lower(np.arange(8.0)).as_text())
        [28.] True
    """
    platforms = _check_platforms(platforms, "platforms")
    with _lock:
        before = _installed
        _uninstall_rules()
        everywhere = _known_platforms()
        for prim, rule in _rules().items():
            # ONE rule, as JAX's default for the primitive with every platform-specific rule
            # set aside: JAX then calls it once per call, also in a multi-platform lowering
            # (jax.export with platforms=("cpu", "cuda") gets one custom call, not a copy per
            # platform), and it emits jax_rccl's call on the installed platforms and XLA's
            # rules on the others (a platform switch when the module has both kinds).
            _saved[("", prim)] = mlir._lowerings.get(prim)
            _saved[("uncacheable", prim)] = prim in mlir._uncacheable_primitives
            for p in everywhere:
                _saved[(p, prim)] = mlir._platform_specific_lowerings[p].pop(prim, None)
            mlir.register_lowering(prim, _with_fallback(prim, rule), cacheable=False)
        _set_installed(platforms)
    _clear_caches()
    return _Installation(before, platforms)


def uninstall() -> None:
    """Restore XLA's lowering of jax.lax's collectives (JAX's caches are cleared; a no-op when
    jax_rccl is not installed).

    Returns:
        None.

    Example:
        >>> import jax_rccl
        >>> _ = jax_rccl.install(platforms=("cpu",))
        >>> jax_rccl.uninstall()
        >>> jax_rccl.installed_platforms()
        ()
    """
    with _lock:
        was = bool(_installed)
        _uninstall_rules()
        _set_installed(())
    if was:
        _clear_caches()


def _known_platforms() -> tuple[str, ...]:
    return tuple(sorted(compat.known_platforms() | set(PLATFORMS)))


def _set_installed(platforms: tuple[str, ...]) -> None:
    global _installed
    _installed = platforms


def _uninstall_rules() -> None:
    for (p, prim), entry in _saved.items():
        if p == "":
            if entry is None:
                mlir._lowerings.pop(prim, None)
            else:
                mlir._lowerings[prim] = entry
        elif p == "uncacheable":
            if not entry:
                mlir._uncacheable_primitives.discard(prim)
        elif entry is not None:
            mlir._platform_specific_lowerings[p][prim] = entry
    _saved.clear()


def _clear_caches() -> None:
    import jax

    jax.clear_caches()


def platforms_of_setting(value: str) -> tuple[str, ...]:
    """The platforms a ``JAX_RCCL_LAX`` value names: () for empty or ``0``, every platform for
    ``1``, else its comma-separated list (a ValueError naming the variable otherwise)."""
    value = value.strip()
    if value in ("", "0"):
        return ()
    if value == "1":
        return PLATFORMS
    parts = tuple(p.strip() for p in value.split(","))
    if not all(p in PLATFORMS for p in parts):
        raise ValueError(
            f"{ENV_VAR}={value!r} is not valid: use empty, 0, 1, or a comma-separated list of "
            f"{', '.join(PLATFORMS)}"
        )
    return parts


def initialize() -> None:
    """The ``jax_plugins`` entry point: installs when ``JAX_RCCL_LAX`` asks for it. JAX calls it
    while it starts its backends, so it touches no backend."""
    platforms = platforms_of_setting(os.environ.get(ENV_VAR, ""))
    if platforms:
        install(platforms)


# --- fallback -----------------------------------------------------------------------------------

_told: set[str] = set()


def _debug_level() -> str:
    return os.environ.get("JAX_RCCL_DEBUG", "WARN").strip().upper()


def _say_once(message: str) -> None:
    if message in _told:
        return
    _told.add(message)
    if _debug_level() in ("INFO", "TRACE"):
        print(f"jax_rccl INFO {message}", file=sys.stderr, flush=True)


class _Fallback(Exception):
    """Raised by a rule for a call jax_rccl cannot express: XLA's lowering runs instead."""


def _xla_rules(prim) -> tuple[dict[str, Callable], Callable | None]:
    """XLA's rules for `prim` as they were before install(): per platform, and the default."""
    platform_rules = {}
    default = None
    for (p, q), entry in _saved.items():
        if q is not prim or p == "uncacheable" or entry is None:
            continue
        if p == "":
            default = entry.rule
        else:
            platform_rules[p] = entry.rule
    return platform_rules, default


def _with_fallback(prim, rule):
    """The rule registered for `prim` on EVERY platform JAX knows (one object, so a
    multi-platform lowering calls it once): jax_rccl's call on the installed platforms, XLA's
    rules on the others (a platform switch when the module is lowered for both kinds)."""

    def ours(ctx, *args, **params):
        platforms = L.module_platforms_of(ctx)
        why = None
        if not compat.is_spmd_context(ctx.module_context.axis_context):
            why = "an axis context outside shard_map and pmap"
        elif any(p in L.GPU_PLATFORMS for p in platforms) and not L.gpu_runtime_for(ctx):
            why = "no jax_rccl GPU runtime in this build"
        elif not all(
            compat.is_static_shape(a.shape)
            for a in (*ctx.avals_in, *ctx.avals_out)
            if hasattr(a, "shape")
        ):
            # jax.export with shape polymorphism: the shapes are refined only where the program
            # is called, and a custom call's results inside shard_map's body cannot be
            why = "symbolic shapes"
        if why is None:
            try:
                return rule(ctx, *args, **params)
            except _Fallback as e:
                why = str(e)
        _say_once(f"jax.lax.{prim.name}: XLA's lowering kept ({why})")
        return _xla(ctx, *args, **params)

    def _xla(ctx, *args, **params):
        platform_rules, default = _xla_rules(prim)
        return L.lower_per_platform(ctx, prim, platform_rules, default, *args, **params)

    def lowering(ctx, *args, **params):
        platforms = L.module_platforms_of(ctx)
        mine = [p for p in platforms if p in _installed]
        if len(mine) == len(platforms):
            return ours(ctx, *args, **params)
        if not mine:
            return _xla(ctx, *args, **params)
        platform_rules, default = _xla_rules(prim)
        platform_rules.update({p: ours for p in mine})
        return L.lower_per_platform(ctx, prim, platform_rules, default, *args, **params)

    lowering.__name__ = f"jax_rccl_lax_{prim.name}"
    return lowering


# --- the rules ----------------------------------------------------------------------------------


def _axes_of(axis_name) -> tuple:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _tuning() -> tuple[str, str, str]:
    from jax_rccl import api

    return api._tuning()


def _require_dtypes(ctx, what: str) -> None:
    for a in ctx.avals_in:
        dt = np.dtype(a.dtype)
        if dt not in _prim_common.SUPPORTED_DTYPES:
            raise _Fallback(f"{what} of dtype {dt}, which jax_rccl's runtime does not carry")


def _require_static(ctx, what: str) -> None:
    if not all(compat.is_static_shape(a.shape) for a in (*ctx.avals_in, *ctx.avals_out)):
        raise _Fallback(f"{what} with symbolic shapes")


def _groups(axis_index_groups):
    if axis_index_groups is None:
        return None
    return tuple(tuple(int(i) for i in g) for g in axis_index_groups)


def _reduction_rule(op: str, api: str):
    reducers = {"sum": "reduce_sum", "max": "reduce_max", "min": "reduce_min"}

    def rule(ctx, *args, axes, axis_index_groups=None):
        _require_dtypes(ctx, api)
        named = tuple(a for a in axes if not isinstance(a, int))
        positional = tuple(a for a in axes if isinstance(a, int))
        if positional:  # a local reduction first, as jax.lax
            from jax import lax

            red = getattr(lax, reducers[op])
            args = tuple(
                mlir.lower_fun(lambda x, pos=positional: red(x, pos), multiple_results=False)(
                    ctx.replace(avals_in=[a], avals_out=[o]), x
                )[0]
                for x, a, o in zip(args, ctx.avals_in, ctx.avals_out, strict=True)
            )
            ctx = ctx.replace(avals_in=list(ctx.avals_out))
        if not named:
            return list(args)
        return _lower(
            ctx,
            *args,
            api=f"jax.lax.{api}",
            axes=named,
            kind="all_reduce",
            groups=_groups(axis_index_groups),
            op=op,
        )

    return rule


def _lower(ctx, *args, api: str, axes, **params):
    """jax_rccl's collective (`params`: lower_collective's) of jax.lax's `api` over `axes`,
    tuned by jax_rccl.config and labelled with `api`."""
    return L.lower_collective(
        ctx, *args, axes=axes, tuning=_tuning(), name=L.label(api, axes), **params
    )


def _move_axis(x, src: int, dst: int):
    """`x` (an ir.Value) with dimension `src` moved to `dst`."""
    t = ir.RankedTensorType(x.type)
    order = [d for d in range(t.rank) if d != src]
    order.insert(dst, src)
    if order == list(range(t.rank)):
        return x
    return hlo.transpose(x, ir.DenseI64ArrayAttr.get(order))


def _reshape(x, shape):
    t = ir.RankedTensorType(x.type)
    if list(t.shape) == list(shape):
        return x
    return hlo.reshape(ir.RankedTensorType.get(list(shape), t.element_type), x)


def _blocks_first(x, shape, d: int, n: int):
    """`x` (of `shape`) with dimension `d` split into `n` blocks, the block index first; and
    the shape of one block."""
    shape = tuple(int(v) for v in shape)
    block = (*shape[:d], shape[d] // n, *shape[d + 1 :])
    return _move_axis(_reshape(x, (*shape[:d], n, *block[d:])), d, 0), block


def _group_size(ctx, axes, groups) -> int:
    return int(L.replica_groups(ctx, axes, groups).shape[1])


def _static_collective(ctx, api: str, axis_name, axis_index_groups) -> tuple:
    """The axes and groups of a data-movement collective of jax.lax, which jax_rccl lowers for
    the dtypes its runtime carries and static shapes only (else XLA's rule: `_Fallback`)."""
    _require_dtypes(ctx, api)
    _require_static(ctx, api)
    return _axes_of(axis_name), _groups(axis_index_groups)


def _all_gather_rule(
    ctx, x, *, all_gather_dimension, axis_name, axis_size, axis_index_groups=None, **_
):
    api = "jax.lax.all_gather"
    axes, groups = _static_collective(ctx, api, axis_name, axis_index_groups)
    if groups is not None:
        raise _Fallback(f"{api} with axis_index_groups")
    (x_aval,), (out_aval,) = ctx.avals_in, ctx.avals_out
    n = int(axis_size)
    gathered = x_aval.update(shape=(n, *x_aval.shape))
    (y,) = _lower(ctx.replace(avals_out=[gathered]), x, api=api, axes=axes, kind="all_gather")
    d = int(all_gather_dimension)
    y = _move_axis(y, 0, d)
    return [_reshape(y, out_aval.shape)]


def _psum_scatter_rule(
    ctx, x, *, scatter_dimension, axis_name, axis_index_groups, axis_size, tiled, **_
):
    api = "jax.lax.psum_scatter"
    axes, groups = _static_collective(ctx, api, axis_name, axis_index_groups)
    (x_aval,), (out_aval,) = ctx.avals_in, ctx.avals_out
    n = int(axis_size)
    blocks, block = _blocks_first(x, x_aval.shape, int(scatter_dimension), n)
    (y,) = _lower(
        ctx.replace(
            avals_in=[x_aval.update(shape=(n, *block))], avals_out=[out_aval.update(shape=block)]
        ),
        blocks,
        api=api,
        axes=axes,
        kind="reduce_scatter",
        groups=groups,
    )
    return [_reshape(y, out_aval.shape)]


def _all_to_all_rule(ctx, x, *, split_axis, concat_axis, axis_name, axis_index_groups, tiled, **_):
    api = "jax.lax.all_to_all"
    axes, groups = _static_collective(ctx, api, axis_name, axis_index_groups)
    (x_aval,), (out_aval,) = ctx.avals_in, ctx.avals_out
    n = _group_size(ctx, axes, groups)
    if n == 1:
        return [x]
    blocks, block = _blocks_first(x, x_aval.shape, int(split_axis), n)
    (y,) = _lower(
        ctx.replace(
            avals_in=[x_aval.update(shape=(n, *block))],
            avals_out=[out_aval.update(shape=(n, *block))],
        ),
        blocks,
        api=api,
        axes=axes,
        kind="all_to_all",
        groups=groups,
    )
    # y[j] is rank j's block for this device: concatenated along concat_axis, rank-major
    y = _move_axis(y, 0, int(concat_axis))
    return [_reshape(y, out_aval.shape)]


def _ppermute_rule(ctx, x, *, axis_name, perm, **_):
    return _lower_ppermute(ctx, x, _axes_of(axis_name), perm, "jax.lax.ppermute")


def _lower_ppermute(ctx, x, axes, perm, api: str):
    """jax.lax's ppermute of `x` over `axes` as jax_rccl's (psend's exchange too)."""
    _require_dtypes(ctx, api)
    return _lower(
        ctx,
        x,
        api=api,
        axes=axes,
        kind="ppermute",
        perm=tuple((int(s), int(d)) for s, d in perm),
        sort_groups=True,
    )


def _pbroadcast_rule(ctx, x, *, axis_name, source, **_):
    api = "jax.lax.pbroadcast"
    _require_dtypes(ctx, api)
    axes = _axes_of(axis_name)
    return _lower(ctx, x, api=api, axes=axes, kind="broadcast", root=int(source))


def _ragged_rule(ctx, operand, output, *index, axis_name, axis_index_groups=None, **_):
    from jax_rccl import _ragged

    _require_dtypes(ctx.replace(avals_in=ctx.avals_in[:2]), "jax.lax.ragged_all_to_all")
    _require_static(ctx, "jax.lax.ragged_all_to_all")
    axes = _axes_of(axis_name)
    groups = _groups(axis_index_groups)
    n = _group_size(ctx, axes, groups)
    return _ragged._lower(
        ctx, operand, output, *index, axes=axes, groups=groups, axis_size=n, tuning=_tuning()
    )


# psend / precv: psend moves its operand as a ppermute and returns a fresh token; precv returns
# what the psend of its token received. The table lives with the module being lowered.


def _psend_rule(ctx, x, *, axis_name, perm, **_):
    axes = _axes_of(axis_name)
    ctx_out = ctx.replace(avals_out=list(ctx.avals_in))  # what the exchange receives
    (received,) = _lower_ppermute(ctx_out, x, axes, perm, "jax.lax.psend")
    token = hlo.create_token()
    L.module_state(ctx).sent[token] = (received, axes, tuple(map(tuple, perm)))
    return [token]


def _precv_rule(ctx, token, *, out_shape, axis_name, perm, **_):
    sent = L.module_state(ctx).sent.get(token)
    if sent is None:
        raise NotImplementedError(
            "jax.lax.precv under jax_rccl.install(): its token must come from a jax.lax.psend "
            "lowered in the same function (not through a loop carry, a jit boundary or "
            "lax.create_token())"
        )
    received, axes, pairs = sent
    if axes != _axes_of(axis_name) or pairs != tuple(map(tuple, perm)):
        raise ValueError(
            f"jax.lax.precv: axis_name {axis_name!r} and perm {perm!r} must be those of the "
            f"psend that made its token ({axes!r}, {pairs!r})"
        )
    if tuple(ir.RankedTensorType(received.type).shape) != tuple(out_shape.shape):
        raise ValueError(
            f"jax.lax.precv: out_shape {out_shape.shape} differs from what psend sent "
            f"({tuple(ir.RankedTensorType(received.type).shape)})"
        )
    return [received]


# --- element types the runtime does not carry ------------------------------------------------
# bool travels as uint8 (max and min of 0/1 are jax.lax's or and and); complex as its real and
# imaginary parts on a new innermost axis of 2 (sums add the parts; data moves untouched). Each
# rule runs on the carried types and its results are converted back.


def _carried(aval):
    dt = np.dtype(aval.dtype)
    if dt == np.bool_:
        return aval.update(dtype=np.dtype(np.uint8))
    if np.issubdtype(dt, np.complexfloating):
        part = np.float32 if dt == np.complex64 else np.float64
        return aval.update(shape=(*aval.shape, 2), dtype=np.dtype(part))
    return aval


def _to_carried(x, aval, carried):
    if carried is aval:
        return x
    t = ir.RankedTensorType(x.type)
    elem = mlir.dtype_to_ir_type(np.dtype(carried.dtype))
    if np.dtype(aval.dtype) == np.bool_:
        return hlo.convert(ir.RankedTensorType.get(list(t.shape), elem), x)
    part_t = ir.RankedTensorType.get([*t.shape, 1], elem)
    re = hlo.reshape(part_t, hlo.real(x))
    im = hlo.reshape(part_t, hlo.imag(x))
    return hlo.concatenate([re, im], ir.IntegerAttr.get(ir.IntegerType.get_signless(64), t.rank))


def _from_carried(y, aval, carried):
    if carried is aval:
        return y
    shape = [int(d) for d in aval.shape]
    out_t = ir.RankedTensorType.get(shape, mlir.dtype_to_ir_type(np.dtype(aval.dtype)))
    if np.dtype(aval.dtype) == np.bool_:
        return hlo.convert(out_t, y)
    elem = mlir.dtype_to_ir_type(np.dtype(carried.dtype))
    idx = ir.DenseI64ArrayAttr.get
    rank = len(shape)
    parts = []
    for k in (0, 1):
        part = hlo.SliceOp(y, idx([0] * rank + [k]), idx([*shape, k + 1]), idx([1] * (rank + 1)))
        parts.append(hlo.reshape(ir.RankedTensorType.get(shape, elem), part.result))
    return hlo.complex(*parts)


def _carry_types(rule, *, n_data=None, reduction=None):
    """`rule` run on carried element types (the first `n_data` operands; all by default).
    `reduction`: the op of a reduction rule, for which complex takes sums only."""

    def wrapped(ctx, *args, **params):
        n = len(args) if n_data is None else n_data
        ins = list(ctx.avals_in)
        carried_in = [_carried(a) if i < n else a for i, a in enumerate(ins)]
        if all(c is a for c, a in zip(carried_in, ins, strict=True)):
            return rule(ctx, *args, **params)
        if reduction not in (None, "sum") and any(
            np.issubdtype(np.dtype(a.dtype), np.complexfloating) for a in ins[:n]
        ):
            raise _Fallback(f"{reduction} of complex values")
        outs = list(ctx.avals_out)
        carried_out = [_carried(a) for a in outs]
        args = [_to_carried(x, a, c) for x, a, c in zip(args, ins, carried_in, strict=True)]
        ys = rule(ctx.replace(avals_in=carried_in, avals_out=carried_out), *args, **params)
        return [_from_carried(y, a, c) for y, a, c in zip(ys, outs, carried_out, strict=True)]

    return wrapped


def _rules() -> dict:
    """jax.lax's collective primitives of the running JAX and jax_rccl's rule for each."""
    lax_parallel = compat.lax_parallel

    table = {
        "psum_p": _carry_types(_reduction_rule("sum", "psum"), reduction="sum"),
        "pmax_p": _carry_types(_reduction_rule("max", "pmax"), reduction="max"),
        "pmin_p": _carry_types(_reduction_rule("min", "pmin"), reduction="min"),
        "psum_invariant_p": _carry_types(_reduction_rule("sum", "psum"), reduction="sum"),
        "all_gather_p": _carry_types(_all_gather_rule),
        "all_gather_invariant_p": _carry_types(_all_gather_rule),
        "reduce_scatter_p": _carry_types(_psum_scatter_rule, reduction="sum"),
        "all_to_all_p": _carry_types(_all_to_all_rule),
        "ppermute_p": _carry_types(_ppermute_rule),
        "pbroadcast_p": _carry_types(_pbroadcast_rule),
        "ragged_all_to_all_p": _carry_types(_ragged_rule, n_data=2),
        "psend_p": _psend_rule,
        "precv_p": _precv_rule,
    }
    return {getattr(lax_parallel, k): v for k, v in table.items() if hasattr(lax_parallel, k)}


# --- jax_rccl's own primitives on a platform without a jax_rccl runtime ---------------------------
# A multi-platform export (platforms=("cpu", "tpu")) of a program written with jax_rccl's own
# functions: XLA's collective for the platforms without a runtime, through jax.lax's rules.


def xla_rule(name: str) -> Callable:
    """jax.lax's own (XLA's) default rule for the primitive `name` of jax.lax, also while
    install() has replaced it."""
    lax_parallel = compat.lax_parallel

    prim = getattr(lax_parallel, name)
    entry = _saved.get(("", prim), mlir._lowerings.get(prim))
    if entry is None:
        raise NotImplementedError(f"jax.lax has no default lowering for {name}")
    return entry.rule


def _per_leaf(ctx, leaves, rule, **params):
    outs = []
    for x, a, o in zip(leaves, ctx.avals_in, ctx.avals_out, strict=False):
        outs.extend(rule(ctx.replace(avals_in=[a], avals_out=[o]), x, **params))
    return outs


def own_xla_rule(kind: str) -> Callable:
    """The XLA lowering of jax_rccl's own primitive of `kind` (its parameters as the primitive
    binds them), for platforms without a jax_rccl runtime."""

    def unsupported(what):
        raise NotImplementedError(
            f"jax_rccl: {what} has no XLA equivalent for a platform without a jax_rccl runtime"
        )

    def all_reduce(ctx, *args, axes, groups, op, premul, premul_value, invariant, tuning):
        del premul_value, invariant, tuning
        if premul or op not in ("sum", "max", "min"):
            unsupported(f"all_reduce(op={op!r}, premul={bool(premul)})")
        name = {"sum": "psum_p", "max": "pmax_p", "min": "pmin_p"}[op]
        return _per_leaf(ctx, args, xla_rule(name), axes=tuple(axes), axis_index_groups=groups)

    def blocks(name, sized=True, **dims):
        """all_gather, reduce_scatter, all_to_all: XLA's rule `name` with the group's blocks
        on dimension 0 (`dims`), untiled; `sized`: the rule takes the group's size."""

        def rule(ctx, *leaves, axes, groups, axis_size, tuning, **typing):
            del tuning, typing  # all_gather's `to`, reduce_scatter's `src`: types only
            size = {"axis_size": axis_size} if sized else {}
            return _per_leaf(
                ctx,
                leaves,
                xla_rule(name),
                **dims,
                axis_name=tuple(axes),
                axis_index_groups=groups,
                **size,
                tiled=False,
            )

        return rule

    def ppermute(ctx, *leaves, axes, perm, tuning):
        del tuning
        return _per_leaf(ctx, leaves, xla_rule("ppermute_p"), axis_name=tuple(axes), perm=perm)

    def broadcast(ctx, *leaves, axes, groups, root, tuning):
        del tuning
        if groups is not None:
            unsupported("pbroadcast with axis_index_groups")
        lax_parallel = compat.lax_parallel

        return _per_leaf(
            ctx, leaves, lax_parallel._pbroadcast_lowering, axis_name=tuple(axes), source=root
        )

    rules = {
        "all_reduce": all_reduce,
        "all_gather": blocks("all_gather_p", all_gather_dimension=0),
        "reduce_scatter": blocks("reduce_scatter_p", scatter_dimension=0),
        "all_to_all": blocks("all_to_all_p", sized=False, split_axis=0, concat_axis=0),
        "ppermute": ppermute,
        "broadcast": broadcast,
    }
    if kind not in rules:
        return lambda ctx, *a, **p: unsupported(f"jax_rccl's {kind}")
    return rules[kind]
