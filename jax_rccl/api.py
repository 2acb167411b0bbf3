"""jax_rccl's public collectives: the names, signatures and results of jax.lax.

Swap ``jax.lax.psum`` for ``jax_rccl.psum`` (and so on) inside ``jax.shard_map``. Every leaf
of a pytree goes out in ONE grouped custom call. Extras beyond jax.lax: `all_reduce` (ops
sum/prod/min/max/avg and a pre-multiplier), `preduce` (reduce to one rank) and `config`
(force the runtime's algorithm/protocol for what is traced inside it).

This layer validates arguments (errors at trace time, naming the argument), converts dtypes
the runtime does not take (bool, complex) and moves axes so that the primitives in
`jax_rccl.primitives` see the blocks where the runtime wants them.
"""

from __future__ import annotations

import contextlib
import numbers
import operator
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_rccl import _carry, _docs
from jax_rccl import _compat as compat
from jax_rccl import primitives as P

# The public names are listed once, in jax_rccl/__init__.py's __all__.

# --- tuning overrides --------------------------------------------------------------------------

_ALGORITHM = compat.trace_state(
    "jax_rccl_config_algorithm",
    "",
    "Algorithm(s) for jax_rccl collectives traced in this context (NCCL syntax); '' = the "
    "runtime's JAX_RCCL_ALGO.",
)
_PROTOCOL = compat.trace_state(
    "jax_rccl_config_protocol",
    "",
    "Protocol(s) for jax_rccl collectives traced in this context (NCCL syntax); '' = the "
    "runtime's JAX_RCCL_PROTO.",
)

_IN_PLACE = compat.trace_state(
    "jax_rccl_config_in_place",
    "auto",
    "Whether all_reduce results share their operands' buffers (set through "
    "jax_rccl.config(in_place=...)): 'auto' (temporaries, and the jitted function's own "
    "arguments where donated), 'on' (every operand) or 'off' (none).",
)


@contextlib.contextmanager
@_docs.fill
def config(
    *,
    algorithm: str | None = None,
    protocol: str | None = None,
    in_place: bool | str | None = None,
):
    """A context manager that forces the algorithm and/or protocol of the jax_rccl collectives
    traced inside its block, and whether their all-reduces run in their operands' buffers.

    Args:
        algorithm: NCCL's syntax: a comma list of ``"Tree"``, ``"Ring"``, ``"Direct"`` (any case),
            ``"^"`` in front to exclude them (``"^Tree"``). None keeps the enclosing setting;
            ``""`` defers to ``JAX_RCCL_ALGO``.
        protocol: the same syntax over ``"LL"``, ``"LL128"``, ``"Simple"``; None keeps, ``""``
            defers to ``JAX_RCCL_PROTO``.
        in_place: psum, pmax, pmin, pmean, all_reduce: ``"auto"`` (the default) lets a result share
            its operand's buffer when the operand is a temporary of the program (a gradient) or a
            donated argument of the jitted function itself (pmap), and writes a fresh buffer for an
            argument of shard_map's body, whose donation is not visible where jax_rccl lowers it
            (XLA would copy an argument the caller keeps). ``True`` shares the buffer of every
            operand, for shard_map inputs that are donated (``jax.jit(...,
            donate_argnums=...)``: reduced where they lie, nothing allocated or copied); ``False``
            none. Results are the same either way.

    Yields:
        Nothing: the settings hold for what is traced inside the ``with`` block.

    An unknown name is a ValueError when the block is entered, naming the argument. The settings
    are part of jax.jit's cache key: a jitted function is traced again under new ones. The choice
    must be one the planner can run for each collective (``Tree`` is all-reduce only; on CPU the
    runtime runs ``Direct`` and ``Ring`` with ``Simple``).

    Differences from jax.lax:
        jax.lax has no such control (XLA picks its own algorithm).

    Example:
        {example_run}
        >>> with jr.config(algorithm="Ring"):
        ...     f = run(lambda x: jr.psum(x, "i"))
        ...     print(f(np.arange(8.0)))
        [28. 28. 28. 28. 28. 28. 28. 28.]
    """
    from jax_rccl import _jax_rccl

    parsers = {
        "algorithm": _jax_rccl.internal.parse_algo_mask,
        "protocol": _jax_rccl.internal.parse_proto_mask,
    }
    for arg, val in (("algorithm", algorithm), ("protocol", protocol)):
        if val is not None and not isinstance(val, str):
            raise TypeError(f"jax_rccl.config: {arg} must be a str or None, got {val!r}")
        if val:
            # unknown names fail here, not at the first call, naming this argument:
            # "jax_rccl.config: algorithm='Rnig' has an unknown name 'Rnig'; allowed: ..."
            parsers[arg](val, f"jax_rccl.config: {arg}")
    in_place_mode = _in_place_mode(in_place)
    with contextlib.ExitStack() as stack:
        if in_place_mode is not None:
            stack.enter_context(_IN_PLACE(in_place_mode))
        if algorithm is not None:
            stack.enter_context(_ALGORITHM(algorithm))
        if protocol is not None:
            stack.enter_context(_PROTOCOL(protocol))
        yield


def _in_place_mode(in_place) -> str | None:
    """config's in_place as the trace state's value ('on', 'off', 'auto'), None to keep."""
    if in_place is None:
        return None
    if isinstance(in_place, (bool, np.bool_)):
        return "on" if in_place else "off"
    if isinstance(in_place, str):
        if in_place == "auto":
            return "auto"
        raise ValueError(
            f"jax_rccl.config: in_place must be True, False, 'auto' or None, got {in_place!r}"
        )
    raise TypeError(
        "jax_rccl.config: in_place must be True, False, 'auto' or None, got "
        f"{type(in_place).__name__} {in_place!r}"
    )


def _tuning() -> tuple[str, str, str]:
    return (str(_ALGORITHM.value or ""), str(_PROTOCOL.value or ""), str(_IN_PLACE.value))


# --- argument checks ---------------------------------------------------------------------------


def _axes(axis_name, api: str) -> tuple:
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    for a in axes:
        if isinstance(a, int):
            raise TypeError(f"jax_rccl.{api}: axis_name must name mesh axes, got the integer {a}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"jax_rccl.{api}: axis_name {axes} repeats a name")
    P.check_axis_names(axes, f"jax_rccl.{api}")
    return axes


def _mesh_size(axes) -> int:
    return int(np.prod([compat.axis_size(a) for a in axes], dtype=np.int64))


def _int(value, what: str) -> int:
    """`value` as an int: a Python or NumPy integer (a 0-d integer array too), never a float
    or a bool (which would be truncated or read as 0/1 silently). TypeError naming `what`."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what}; got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what}; got the {type(value).__name__} {value!r}") from None


#: The collectives whose axis_index_groups may have unequal sizes (a result's shape does not
#: depend on its group's size).
_UNEQUAL_GROUPS_OK = ("psum", "pmax", "pmin", "pmean", "all_reduce")


def _groups(axis_index_groups, axes, api: str):
    """Canonical axis_index_groups (tuple of tuples) and the group size (of the first group,
    where the reductions' groups differ in size: see `_group_size_here`)."""
    size = _mesh_size(axes)
    if axis_index_groups is None:
        return None, size
    what = f"jax_rccl.{api}: axis_index_groups must be a list of lists of ints"
    try:
        rows = [list(g) for g in axis_index_groups]
    except TypeError as e:
        raise TypeError(f"{what}, got {axis_index_groups!r}") from e
    groups = tuple(tuple(_int(i, what) for i in g) for g in rows)
    flat = [i for g in groups for i in g]
    if sorted(flat) != list(range(size)):
        raise ValueError(
            f"jax_rccl.{api}: axis_index_groups {axis_index_groups!r} must cover all indices "
            f"0..{size - 1} of axis {axes} exactly once"
        )
    if len({len(g) for g in groups}) != 1 and api not in _UNEQUAL_GROUPS_OK:
        raise ValueError(
            f"jax_rccl.{api}: axis_index_groups {axis_index_groups!r} must all be the same size "
            f"(the shape of {api}'s result depends on it); groups of unequal sizes work with "
            + ", ".join(_UNEQUAL_GROUPS_OK)
        )
    return groups, len(groups[0])


def _canonical_dim(dim, ndim, api, arg):
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"jax_rccl.{api}: {arg} must be an int, got {dim!r}")
    if not -ndim <= dim < ndim:
        raise ValueError(
            f"jax_rccl.{api}: {arg}={dim} is out of range for an operand of rank {ndim}"
        )
    return int(dim) % ndim


def _pvary(x, axes):
    """What jax.lax does to an input not yet varying over `axes` (check_vma + auto_pcast).

    Only mesh axes take part: a value never varies over an axis bound by jax.vmap in its type
    (jax.lax's own pvary fails on one)."""
    if not compat.auto_pcast_enabled():
        return x
    return P.vary_over(x, axes)


# --- dtypes: what the runtime takes, and the conversions around it -----------------------------

_COMPLEX_OK = ("sum", "avg", "move")


def _encode(leaf, api: str, use: str, index: int):
    """Leaf -> (primitive leaves, decode). `use`: sum/avg/prod/max/min/move."""
    x = jnp.asarray(leaf)
    dt = np.dtype(x.dtype)
    if dt == np.bool_:
        if use in ("sum", "avg"):
            return [x.astype(np.int32)], lambda ys: ys[0]  # as jax.lax.psum
        return [x.astype(np.uint8)], lambda ys: ys[0].astype(np.bool_)
    if jnp.issubdtype(dt, jnp.complexfloating):
        if use not in _COMPLEX_OK:
            raise TypeError(
                f"jax_rccl.{api}: leaf {index} has dtype {dt}; complex values support only "
                "sum, mean and data movement"
            )
        return [lax.real(x), lax.imag(x)], lambda ys: lax.complex(ys[0], ys[1])
    carried = _carry.encode(x, use)  # the small floats and integers, as XLA carries them
    if carried is not None:
        return carried
    if dt not in P.SUPPORTED_DTYPES:
        raise TypeError(
            f"jax_rccl.{api}: leaf {index} has unsupported dtype {dt}; supported: bool, "
            f"complex64/128, {', '.join(_carry.carried_names())} and "
            f"{sorted(str(d) for d in P.SUPPORTED_DTYPES)}"
        )
    return [x], lambda ys: ys[0]


def _encode_all(leaves, api, use, axes, *, vary=True):
    """Leaves -> the primitive's leaves (made varying over `axes` unless `vary`, one bool or
    one per leaf, is False), a decoder per leaf and how many primitive leaves each became."""
    varies = [vary] * len(leaves) if isinstance(vary, bool) else list(vary)
    flat, decoders, counts = [], [], []
    for i, (leaf, v) in enumerate(zip(leaves, varies, strict=True)):
        parts, dec = _encode(leaf, api, use, i)
        flat.extend(_pvary(p, axes) if v else p for p in parts)
        decoders.append(dec)
        counts.append(len(parts))
    return flat, decoders, counts


def _decode_all(outs, decoders, counts):
    res, k = [], 0
    for dec, c in zip(decoders, counts, strict=True):
        res.append(dec(list(outs[k : k + c])))
        k += c
    return res


def _map_leaves(x, fn):
    leaves, tree = jax.tree_util.tree_flatten(x)
    if not leaves:
        return x
    return jax.tree_util.tree_unflatten(tree, fn(leaves))


# --- reductions ---------------------------------------------------------------------------------


def _reduce(x, axis_name, api, *, op="sum", axis_index_groups=None, premul=None):
    axes = _axes(axis_name, api)
    axes = compat.drop_size_one_axes(axes)
    if not axes:
        return x
    groups, n = _groups(axis_index_groups, axes, api)
    premul_kind, premul_value, scale = _premul(premul, op, api)

    def run(leaves):
        if premul_kind == 0 and op == "sum" and not any(map(compat.is_tracer, leaves)):
            # Constants, as jax.lax.psum: no communication, and typed as jax.lax types them
            # (psum(1, ax) is the Python int axis size, usable in Python control flow); with
            # groups of unequal sizes, the size of each device's group (a traced value).
            size = P.group_size_here(axes, groups)
            leaves = [
                lax.convert_element_type(leaf, np.int32)
                if np.asarray(leaf).dtype == np.bool_
                else leaf
                for leaf in leaves
            ]
            if not isinstance(size, int):
                return [jnp.asarray(leaf) * size for leaf in leaves]
            return [compat.const_like(leaf, size) * leaf for leaf in leaves]
        if premul_kind:
            for i, leaf in enumerate(leaves):
                dt = jnp.result_type(leaf)
                if not jnp.issubdtype(dt, jnp.inexact):
                    raise TypeError(
                        f"jax_rccl.{api}: premul needs floating leaves; leaf {i} has dtype {dt}"
                    )
        use = "sum" if premul_kind else op
        # as jax.lax.psum: partial sums (typed unreduced over axis_name) are added up, no pvary
        vary = [not _unreduced_source(leaf, axes, api, i, op) for i, leaf in enumerate(leaves)]
        flat, decoders, counts = _encode_all(leaves, api, use, axes, vary=vary)
        scales = []
        if premul_kind == 2:
            scales = [_pvary(scale, axes).astype(v.dtype) for v in flat]
        outs = P.all_reduce_p.bind(
            *flat,
            *scales,
            axes=axes,
            groups=groups,
            op=op if not premul_kind else "sum",
            premul=premul_kind,
            premul_value=premul_value,
            invariant=compat.check_vma_enabled() and groups is None,
            tuning=_tuning(),
        )
        return _decode_all(outs, decoders, counts)

    return _map_leaves(x, run)


def _unreduced_source(leaf, axes, api: str, index: int, op: str) -> bool:
    """Whether `leaf` is typed unreduced over `axes` (partial sums, explicit sharding); such a
    leaf is summed only (psum, pmean, all_reduce with op 'sum' or 'avg'), as by jax.lax."""
    if not compat.is_tracer(leaf) or not P.is_unreduced_over(compat.typeof(leaf), axes):
        return False
    if op not in ("sum", "avg"):
        raise ValueError(
            f"jax_rccl.{api}: leaf {index} is unreduced over {tuple(axes)} (partial sums still "
            f"to be added); only a sum reduces it (psum, pmean, all_reduce(op='sum'|'avg')), "
            f"not op={op!r}"
        )
    return True


def _premul(premul, op, api):
    """(kind, value, array): 0 none, 1 a Python/NumPy scalar, 2 an array scalar per device."""
    if premul is None:
        return 0, 0.0, None
    if op != "sum":
        raise ValueError(f"jax_rccl.{api}: premul works with op='sum' only, got op={op!r}")
    if isinstance(premul, (bool, np.bool_)):
        raise TypeError(f"jax_rccl.{api}: premul must be a real number, got {premul!r}")
    if isinstance(premul, numbers.Real):
        return 1, float(premul), None
    if isinstance(premul, numbers.Number):
        raise TypeError(f"jax_rccl.{api}: premul must be real, got {premul!r}")
    arr = premul if compat.is_tracer(premul) else jnp.asarray(premul)
    if np.shape(arr) != ():
        raise ValueError(
            f"jax_rccl.{api}: premul must be a scalar, got an array of shape {np.shape(arr)}"
        )
    if not jnp.issubdtype(arr.dtype, jnp.floating) and not jnp.issubdtype(arr.dtype, jnp.integer):
        raise TypeError(f"jax_rccl.{api}: premul must be real, got dtype {arr.dtype}")
    return 2, 0.0, arr


@_docs.fill
def psum(x, axis_name, *, axis_index_groups=None):
    """All-reduce sum over ``axis_name``, as :func:`jax.lax.psum`.

    Args:
        {x_axis_name}
        {reduction_groups}

    Returns:
        A pytree like ``x``: each leaf of the same shape and dtype (bool leaves become int32, as in
        jax.lax) holding the sum over the devices of its group, the same on each of them. Values
        that are not traced (``psum(1, "i")``) are multiplied by the group size without any
        communication, as jax.lax does.

    Differences from jax.lax.psum:
        {runs_on_runtime}

    Example:
        {example_run}
        >>> print(run(lambda x: jr.psum(x, "i"))(np.arange(8.0)))
        [28. 28. 28. 28. 28. 28. 28. 28.]
        >>> halves = [[0, 1, 2, 3], [4, 5, 6, 7]]
        >>> print(run(lambda x: jr.psum(x, "i", axis_index_groups=halves))(np.arange(8)))
        [ 6  6  6  6 22 22 22 22]
    """
    return _reduce(x, axis_name, "psum", op="sum", axis_index_groups=axis_index_groups)


@_docs.fill
def pmax(x, axis_name, *, axis_index_groups=None):
    """All-reduce maximum over ``axis_name``, as :func:`jax.lax.pmax`.

    Args:
        {x_axis_name}
        {reduction_groups}

    Returns:
        A pytree like ``x``: each leaf of the same shape and dtype holding the elementwise maximum
        over the devices of its group. Complex leaves are refused (no order).

    Differences from jax.lax.pmax:
        {runs_on_runtime}

    Example:
        {example_run}
        >>> print(run(lambda x: jr.pmax(x, "i"))(np.array([3, 1, 4, 1, 5, 9, 2, 6])))
        [9 9 9 9 9 9 9 9]
    """
    return _reduce(x, axis_name, "pmax", op="max", axis_index_groups=axis_index_groups)


@_docs.fill
def pmin(x, axis_name, *, axis_index_groups=None):
    """All-reduce minimum over ``axis_name``, as :func:`jax.lax.pmin`.

    Args:
        {x_axis_name}
        {reduction_groups}

    Returns:
        A pytree like ``x``: each leaf of the same shape and dtype holding the elementwise minimum
        over the devices of its group. Complex leaves are refused (no order).

    Differences from jax.lax.pmin:
        {runs_on_runtime}

    Example:
        {example_run}
        >>> print(run(lambda x: jr.pmin(x, "i"))(np.array([3, 1, 4, 1, 5, 9, 2, 6])))
        [1 1 1 1 1 1 1 1]
    """
    return _reduce(x, axis_name, "pmin", op="min", axis_index_groups=axis_index_groups)


@_docs.fill
def pmean(x, axis_name, *, axis_index_groups=None):
    """All-reduce mean over ``axis_name``, as :func:`jax.lax.pmean`: :func:`psum`, then a division
    by the size of each device's group.

    Args:
        {x_axis_name}
        axis_index_groups: optional list of lists of axis indices that together cover every
            index once; each group reduces on its own. Their sizes may differ (each device
            divides by its own group's size).

    Returns:
        A pytree like ``x``: each leaf of its shape holding the mean over its group; integer leaves
        become floating point, as in jax.lax.

    Differences from jax.lax.pmean:
        {runs_on_runtime}

    Example:
        {example_run}
        >>> print(run(lambda x: jr.pmean(x, "i"))(np.arange(8.0)))
        [3.5 3.5 3.5 3.5 3.5 3.5 3.5 3.5]
    """
    axes = _axes(axis_name, "pmean")
    groups, _ = _groups(axis_index_groups, axes, "pmean")
    n = P.group_size_here(axes, groups)  # each device's group's size
    x = psum(x, axis_name, axis_index_groups=axis_index_groups)
    if isinstance(n, int):
        return jax.tree_util.tree_map(lambda v: v / n, x)
    return jax.tree_util.tree_map(lambda v: v / n.astype(jnp.result_type(v, 1.0)), x)


@_docs.fill
def all_reduce(x, axis_name, *, op="sum", premul=None, axis_index_groups=None):
    """All-reduce with any of the runtime's reduction ops (jax.lax has one function per op and no
    product, average or pre-multiplier).

    Args:
        {x_axis_name}
        op: ``"sum"``, ``"prod"``, ``"min"``, ``"max"`` or ``"avg"`` (the sum divided by the group
            size, computed by the runtime).
        premul: ``op="sum"`` only, floating leaves: each device's input is multiplied by it before
            the sum (NCCL's PreMulSum). A Python scalar is baked into the program; a 0-d array
            (which may differ per device) is read at run time.
        {reduction_groups}

    Returns:
        A pytree like ``x``: each leaf of the same shape and dtype holding the reduction over the
        devices of its group.

    Differences from jax.lax:
        No single jax.lax function: ``op="sum"`` is :func:`jax.lax.psum`, ``"max"``
        :func:`jax.lax.pmax`, ``"min"`` :func:`jax.lax.pmin`; ``"prod"``, ``"avg"`` and
        ``premul`` have no jax.lax counterpart.
        {runs_on_runtime}

    Example:
        {example_run}
        >>> print(run(lambda x: jr.all_reduce(x, "i", op="prod"))(np.arange(1, 9)))
        [40320 40320 40320 40320 40320 40320 40320 40320]
        >>> print(run(lambda x: jr.all_reduce(x, "i", premul=0.5))(np.ones(8, np.float32)))
        [4. 4. 4. 4. 4. 4. 4. 4.]
    """
    if op not in P.OPS:
        raise ValueError(f"jax_rccl.all_reduce: op={op!r} is not one of {P.OPS}")
    return _reduce(
        x, axis_name, "all_reduce", op=op, axis_index_groups=axis_index_groups, premul=premul
    )


@_docs.fill
def preduce(x, axis_name, root: int, *, axis_index_groups=None):
    """Sum over ``axis_name`` delivered to one device: the device of index ``root`` gets the sum,
    every other device zeros (NCCL's reduce; jax.lax has no counterpart).

    The reduction is the sum only (there is no ``op=``): its gradient is :func:`pbroadcast` from
    ``root``, which a sum's transpose needs. For other ops, :func:`all_reduce` with ``op=``.

    Args:
        {x_axis_name}
        root: the index, along ``axis_name`` (within each group with ``axis_index_groups``), of the
            device that gets the sum.
        axis_index_groups: optional list of lists of axis indices, all of one size, covering every
            index once; each group reduces to its own ``root``-th member.

    Returns:
        A pytree like ``x``: each leaf of the same shape and dtype; on ``root`` the sum over the
        group, elsewhere zeros.

    Differences from jax.lax:
        No jax.lax function does this (``psum`` then masking moves more data).
        {runs_on_runtime}

    Example:
        {example_run}
        >>> print(run(lambda x: jr.preduce(x, "i", root=2))(np.arange(8.0)))
        [ 0.  0. 28.  0.  0.  0.  0.  0.]
    """
    return _rooted(x, axis_name, root, "preduce", "root", P.reduce_p, "sum", axis_index_groups)


@_docs.fill
def pbroadcast(x, axis_name, source: int):
    """Every device gets the value of the device of index ``source``, as :func:`jax.lax.pbroadcast`.

    Args:
        {x_axis_name}
        source: the index, along ``axis_name``, of the device whose value everyone gets.

    Returns:
        A pytree like ``x``: each leaf of the same shape and dtype holding ``source``'s value.

    Differences from jax.lax.pbroadcast:
        Runs on CPU too (jax.lax lowers it on GPUs only), and under jax.vmap.
        {runs_on_runtime}

    Example:
        {example_run}
        >>> print(run(lambda x: jr.pbroadcast(x, "i", source=5))(np.arange(8.0)))
        [5. 5. 5. 5. 5. 5. 5. 5.]
    """
    return _rooted(x, axis_name, source, "pbroadcast", "source", P.broadcast_p, "move", None)


def _rooted(x, axis_name, root, api, arg, prim, use, axis_index_groups):
    axes = _axes(axis_name, api)
    groups, n = _groups(axis_index_groups, axes, api)
    root = _int(root, f"jax_rccl.{api}: {arg} must be an int")
    if not 0 <= root < n:
        raise ValueError(f"jax_rccl.{api}: {arg}={root} is outside the group of size {n}")

    def run(leaves):
        flat, decoders, counts = _encode_all(leaves, api, use, axes)
        outs = prim.bind(*flat, axes=axes, groups=groups, root=root, tuning=_tuning())
        return _decode_all(outs, decoders, counts)

    return _map_leaves(x, run)


# --- data movement ------------------------------------------------------------------------------


def _moveaxis(x, src, dst):
    return x if src == dst else jnp.moveaxis(x, src, dst)


def _split_blocks(x, d: int, n: int):
    """tiled=True's split: dimension `d` of `x` (a multiple of n) as [n, size / n], the block
    index at `d`."""
    shape = list(x.shape)
    shape[d : d + 1] = [n, shape[d] // n]
    return x.reshape(shape)


def _merge_blocks(x, d: int):
    """tiled=True's merge, the inverse of `_split_blocks`: dimensions d and d + 1 of `x` as
    one, block-major."""
    shape = list(x.shape)
    shape[d : d + 2] = [shape[d] * shape[d + 1]]
    return x.reshape(shape)


def _place_blocks(outs, dims, counts, decoders, tiled: bool):
    """The results of a gather-like call, leaf by leaf: each of leaf i's `counts[i]` outputs has
    the group's blocks on axis 0; they move to `dims[i]` (merged into it when `tiled`), then
    leaf i's decoder rebuilds the leaf."""
    res, k = [], 0
    for d, c, dec in zip(dims, counts, decoders, strict=True):
        ys = []
        for y in outs[k : k + c]:
            y = _moveaxis(y, 0, d)
            ys.append(_merge_blocks(y, d) if tiled else y)
        res.append(dec(ys))
        k += c
    return res


@_docs.fill
def all_gather(
    x,
    axis_name,
    *,
    axis_index_groups=None,
    axis: int = 0,
    tiled: bool = False,
    to: str = "varying",
):
    """Gather every device's value, as :func:`jax.lax.all_gather`.

    Args:
        {x_axis_name}
        axis_index_groups: optional list of lists of axis indices, all of one size, covering every
            index once; each group gathers on its own.
        axis: where the group's blocks go in the result: a new axis at this position, or (with
            ``tiled``) the existing axis the blocks are concatenated along.
        tiled: False: a new axis of the group size n; True: concatenate along ``axis``.
        to: how the result is typed over ``axis_name``, as jax.lax does: ``"varying"`` (as the
            input), ``"invarying"`` (the same on every device; its gradient keeps each device's own
            block) or ``"reduced"`` (explicit sharding: a varying input, a result whose cotangent
            is unreduced and goes back through a psum_scatter).

    Returns:
        A pytree like ``x``: a leaf of shape ``s`` becomes ``s[:axis] + (n,) + s[axis:]``, or
        with ``tiled`` ``s`` with ``s[axis]`` multiplied by n; block j is the value of device j
        (of its group).

    Differences from jax.lax.all_gather:
        {runs_on_runtime}

    Example:
        {example_run}
        >>> gather = lambda x: jr.all_gather(x, "i", tiled=True, to="invarying")
        >>> f = jax.jit(jax.shard_map(gather, mesh=mesh, in_specs=P("i"), out_specs=P()))
        >>> print(f(np.arange(8)))
        [0 1 2 3 4 5 6 7]
        >>> print(run(lambda x: jr.all_gather(x, "i")[None])(np.arange(8)).shape)
        (8, 8, 1)
    """
    api = "all_gather"
    if not isinstance(to, str) or to not in P.GATHER_TO:
        raise ValueError(
            f"jax_rccl.{api}: to={to!r} is not one of " + ", ".join(map(repr, P.GATHER_TO))
        )
    axes = _axes(axis_name, api)
    groups, n = _groups(axis_index_groups, axes, api)
    if groups is not None and to != "varying":
        raise NotImplementedError(
            f"jax_rccl.{api}: axis_index_groups with to={to!r} is not supported (nor by "
            "jax.lax); use to='varying'"
        )

    def run(leaves):
        dims = []
        for i, leaf in enumerate(leaves):
            nd = np.ndim(leaf)
            if tiled and nd == 0:
                raise ValueError(
                    f"jax_rccl.{api}: tiled=True needs leaves of rank >= 1; leaf {i} is a scalar"
                )
            dims.append(_canonical_dim(axis, nd if tiled else nd + 1, api, "axis"))
        # as jax.lax: a reduced result needs an input already varying (no pvary)
        flat, decoders, counts = _encode_all(leaves, api, "move", axes, vary=to != "reduced")
        outs = P.all_gather_p.bind(
            *flat, axes=axes, groups=groups, axis_size=n, to=to, tuning=_tuning()
        )
        return _place_blocks(outs, dims, counts, decoders, tiled)  # each out: y[n, *s]

    return _map_leaves(x, run)


def _scatter_source(leaf, axes, api: str, index: int) -> str:
    """ "unreduced" for a leaf typed unreduced over `axes` (partial sums, explicit sharding),
    else "varying"; a leaf unreduced over only some of them is refused, as by jax.lax."""
    u = compat.unreduced(compat.typeof(leaf)) & set(axes)
    if not u:
        return "varying"
    if u != set(axes):
        raise ValueError(
            f"jax_rccl.{api}: leaf {index} is unreduced over {sorted(map(str, u))} but not over "
            f"the rest of axis_name {tuple(axes)}; its type must be the same over all of them"
        )
    return "unreduced"


def _check_blocks(size, n: int, tiled: bool, what: str) -> None:
    """The dimension split into the group's `n` blocks: equal to n, or (tiled) a multiple of it.
    A symbolic size (jax.export) must be so for every value of its dimension variables."""
    if not compat.is_static_shape((size,)):
        if tiled and compat.is_static_shape((size % n,)) and size % n == 0:
            return
        need = f"a multiple of the group size {n}" if tiled else f"the group size {n}"
        raise ValueError(
            f"{what} has the symbolic size {size}, which is not {need} for every value of its "
            f"dimension variables; export it with a size that is (e.g. {n}*k"
            + (")" if tiled else ", and tiled=True)")
        )
    if tiled and size % n:
        raise ValueError(
            f"{what} has size {size}, not divisible by the group size {n} (tiled=True)"
        )
    if not tiled and size != n:
        raise ValueError(
            f"{what} has size {size}; it must equal the group size {n} (or pass tiled=True)"
        )


@_docs.fill
def psum_scatter(
    x,
    axis_name,
    *,
    scatter_dimension: int = 0,
    axis_index_groups=None,
    tiled: bool = False,
):
    """Sum over ``axis_name``, each device keeping its block of ``scatter_dimension``, as
    :func:`jax.lax.psum_scatter` (a reduce-scatter).

    Args:
        {x}
            Values typed unreduced over ``axis_name`` (partial sums under explicit sharding) are
            summed as jax.lax sums them.
        axis_name: a mesh axis name, or a tuple of names (the group is their product).
        scatter_dimension: the dimension split into the group's n blocks.
        axis_index_groups: optional list of lists of axis indices, all of one size, covering every
            index once; each group reduces on its own.
        tiled: False: ``x.shape[scatter_dimension]`` must equal n and the dimension is removed;
            True: it must be a multiple of n and is divided by n.

    Returns:
        A pytree like ``x``: device j's leaf holds block j of the sum over its group.

    Differences from jax.lax.psum_scatter:
        {runs_on_runtime}

    Example:
        {example_run}
        >>> f = jax.jit(jax.shard_map(lambda x: jr.psum_scatter(x, "i", tiled=True), mesh=mesh,
        ...                           in_specs=P(), out_specs=P("i")))
        >>> print(f(np.arange(8.0)))
        [ 0.  8. 16. 24. 32. 40. 48. 56.]
    """
    api = "psum_scatter"
    axes = _axes(axis_name, api)
    axes = compat.drop_size_one_axes(axes)
    if not axes:
        return x
    groups, n = _groups(axis_index_groups, axes, api)

    def run(leaves):
        blocks = []
        for i, leaf in enumerate(leaves):
            shape = np.shape(leaf)
            if not shape:
                raise ValueError(
                    f"jax_rccl.{api}: leaf {i} is a scalar; it needs a scatter_dimension"
                )
            d = _canonical_dim(scatter_dimension, len(shape), api, "scatter_dimension")
            _check_blocks(shape[d], n, tiled, f"jax_rccl.{api}: scatter_dimension {d} of leaf {i}")
            blocks.append(d)
        srcs = [_scatter_source(leaf, axes, api, i) for i, leaf in enumerate(leaves)]
        if groups is not None and "unreduced" in srcs:
            raise NotImplementedError(
                f"jax_rccl.{api}: axis_index_groups with an unreduced input is not supported "
                "(nor by jax.lax)"
            )
        vary = [src == "varying" for src in srcs]  # as jax.lax: no pvary of partial sums
        flat, decoders, counts = _encode_all(leaves, api, "sum", axes, vary=vary)
        ins, flat_srcs, k = [], [], 0
        for d, c, src in zip(blocks, counts, srcs, strict=True):
            for v in flat[k : k + c]:
                ins.append(_moveaxis(_split_blocks(v, d, n) if tiled else v, d, 0))
                flat_srcs.append(src)
            k += c
        outs = [None] * len(ins)
        for src in sorted(set(flat_srcs)):  # one call per type of input (usually one)
            idx = [j for j, s_ in enumerate(flat_srcs) if s_ == src]
            res = P.reduce_scatter_p.bind(
                *[ins[j] for j in idx],
                axes=axes,
                groups=groups,
                axis_size=n,
                src=src,
                tuning=_tuning(),
            )
            for j, r in zip(idx, res, strict=True):
                outs[j] = r
        return _decode_all(outs, decoders, counts)

    return _map_leaves(x, run)


@_docs.fill
def all_to_all(x, axis_name, split_axis, concat_axis, *, tiled=False, axis_index_groups=None):
    """Split ``split_axis`` into the group's n blocks, send block j to device j, and
    concatenate what arrives along ``concat_axis``, as :func:`jax.lax.all_to_all`.

    Args:
        {x_axis_name}
        split_axis: the dimension split into n blocks (its size must be n, or with ``tiled`` a
            multiple of n).
        concat_axis: the dimension the received blocks are stacked (or with ``tiled``,
            concatenated) along, in the senders' order.
        tiled: False: ``split_axis`` of size n is removed and a new axis of size n is inserted at
            ``concat_axis``; True: ``split_axis`` is divided by n and ``concat_axis`` multiplied by
            n.
        axis_index_groups: optional list of lists of axis indices, all of one size, covering every
            index once; each group exchanges on its own.

    Returns:
        A pytree like ``x`` of the shapes above; block i of device j's result is block j of device
        i's input.

    Differences from jax.lax.all_to_all:
        {runs_on_runtime}

    Example:
        {example_run}
        >>> f = jax.jit(jax.shard_map(lambda x: jr.all_to_all(x, "i", 1, 1, tiled=True),
        ...                           mesh=mesh, in_specs=P("i"), out_specs=P("i")))
        >>> x = np.arange(64).reshape(8, 8)  # device i holds row i
        >>> print(f(x)[:, :3])  # device i now holds column i
        [[ 0  8 16]
         [ 1  9 17]
         [ 2 10 18]
         [ 3 11 19]
         [ 4 12 20]
         [ 5 13 21]
         [ 6 14 22]
         [ 7 15 23]]
    """
    api = "all_to_all"
    axes = _axes(axis_name, api)
    groups, n = _groups(axis_index_groups, axes, api)

    def run(leaves):
        plans = []
        for i, leaf in enumerate(leaves):
            shape = np.shape(leaf)
            if not shape:
                raise ValueError(f"jax_rccl.{api}: leaf {i} is a scalar; it needs a split_axis")
            s = _canonical_dim(split_axis, len(shape), api, "split_axis")
            c = _canonical_dim(concat_axis, len(shape), api, "concat_axis")
            _check_blocks(shape[s], n, tiled, f"jax_rccl.{api}: split_axis {s} of leaf {i}")
            plans.append((s, c))
        flat, decoders, counts = _encode_all(leaves, api, "move", axes)
        ins, k = [], 0
        for (s, _), cnt in zip(plans, counts, strict=True):
            for v in flat[k : k + cnt]:
                ins.append(_moveaxis(_split_blocks(v, s, n) if tiled else v, s, 0))  # v[n, ...]
            k += cnt
        outs = P.all_to_all_p.bind(*ins, axes=axes, groups=groups, axis_size=n, tuning=_tuning())
        concat = [c for _, c in plans]
        return _place_blocks(outs, concat, counts, decoders, tiled)  # y[j]: device j's block

    return _map_leaves(x, run)


def _pairs(perm, api: str) -> tuple[tuple[int, int], ...]:
    """perm as a tuple of int pairs: any iterable of (source, destination) pairs, as jax.lax
    takes (a list, a zip, a generator, an (n, 2) integer array)."""
    if isinstance(perm, (str, bytes)) or not isinstance(perm, Iterable):
        raise TypeError(
            f"jax_rccl.{api}: perm must be an iterable of (source, destination) int pairs, "
            f"got {type(perm).__name__} {perm!r}"
        )
    what = f"jax_rccl.{api}: perm must hold (source, destination) int pairs"
    pairs = []
    for pair in perm:
        try:
            s, d = pair
        except (TypeError, ValueError):
            raise TypeError(f"{what}, got {pair!r}") from None
        pairs.append((_int(s, f"{what}; pair {pair!r}"), _int(d, f"{what}; pair {pair!r}")))
    return tuple(pairs)


@_docs.fill
def ppermute(x, axis_name, perm: Iterable[tuple[int, int]]):
    """Send each device's value to another device, as :func:`jax.lax.ppermute`.

    Args:
        {x_axis_name}
        perm: (source, destination) pairs of axis indices, each source and each destination at
            most once: any iterable (a list, a zip, a generator, an (n, 2) integer array).

    Returns:
        A pytree like ``x``: device d's leaves hold what the device s of the pair (s, d) sent, and
        zeros where no pair names d as destination.

    Differences from jax.lax.ppermute:
        it runs on the runtime's point-to-point path; pairs are
        checked at trace time (an index outside the axis, a repeated source or destination name the
        pair); every leaf of ``x`` goes out in one call.

    Example:
        {example_run}
        >>> shift = [(i, (i + 1) % 8) for i in range(8)]
        >>> print(run(lambda x: jr.ppermute(x, "i", shift))(np.arange(8)))
        [7 0 1 2 3 4 5 6]
        >>> print(run(lambda x: jr.ppermute(x, "i", [(0, 3)]))(np.arange(1, 9)))
        [0 0 0 1 0 0 0 0]
    """
    return _ppermute(x, axis_name, perm, "ppermute")


def _ppermute(x, axis_name, perm, api: str):
    """ppermute, its errors naming `api` (psend sends through it)."""
    axes = _axes(axis_name, api)
    n = _mesh_size(axes)
    pairs = _pairs(perm, api)
    for s, d in pairs:
        if not (0 <= s < n and 0 <= d < n):
            raise ValueError(f"jax_rccl.{api}: perm pair {(s, d)} is outside the axis of size {n}")
    srcs, dsts = [s for s, _ in pairs], [d for _, d in pairs]
    if len(set(srcs)) != len(srcs):
        raise ValueError(f"jax_rccl.{api}: perm {list(pairs)} repeats a source")
    if len(set(dsts)) != len(dsts):
        raise ValueError(f"jax_rccl.{api}: perm {list(pairs)} repeats a destination")

    def run(leaves):
        flat, decoders, counts = _encode_all(leaves, api, "move", axes)
        outs = P.ppermute_p.bind(*flat, axes=axes, perm=pairs, tuning=_tuning())
        return _decode_all(outs, decoders, counts)

    return _map_leaves(x, run)
