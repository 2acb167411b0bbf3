"""jax.lax's conveniences over ppermute and all_to_all, with jax.lax's signatures.

``pshuffle(x, axis_name, perm)`` is a ppermute whose permutation names, for each axis index i,
the index perm[i] that i receives from; ``pswapaxes(x, axis_name, axis)`` swaps the named axis
with the positional one, an all_to_all that splits and concatenates along ``axis``. Both run
through the same custom calls as ``jax_rccl.ppermute`` / ``jax_rccl.all_to_all``, so they work
wherever those do (jit, shard_map, vmap, grad, scan).

``psend(x, axis_name, perm)`` / ``precv(token, out_shape, axis_name, perm)`` split a ppermute in
two, as jax.lax's do: psend returns a token, and precv given that token returns what was sent
to this device (zeros where no pair names it as destination). The exchange runs through
ppermute's point-to-point path when psend is called; the token is a real JAX token
(lax.create_token) remembered, while it lives, with psend's result, its axes and pairs. So
precv must get the token psend returned, in the same traced function; a token from anywhere
else (lax.create_token, a loop carry, a jit boundary), or a precv whose axes, pairs, shape or
dtype differ from its psend's, is refused at trace time (jax.lax on GPUs fails at run time or
hangs: a receive without its send).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence

import jax
import numpy as np
from jax import lax

from jax_rccl import _docs, api

__all__ = ["pshuffle", "pswapaxes", "psend", "precv"]


@_docs.fill
def pshuffle(x, axis_name, perm: Sequence[int]):
    """Axis index i gets the value of axis index ``perm[i]``, as :func:`jax.lax.pshuffle`.

    Args:
        {x_axis_name}
        perm: a sequence holding each of ``0 .. len(perm) - 1`` once; indices of the axis beyond
            ``len(perm)`` receive zeros, as jax.lax's ppermute gives them.

    Returns:
        A pytree like ``x``: on device i, device ``perm[i]``'s value.

    Differences from jax.lax.pshuffle:
        it is :func:`ppermute` with the pairs
        ``(perm[i], i)``, on the runtime's point-to-point path; ``perm`` is checked at trace time.

    Example:
        {example_run}
        >>> print(run(lambda x: jr.pshuffle(x, "i", [7, 6, 5, 4, 3, 2, 1, 0]))(np.arange(8)))
        [7 6 5 4 3 2 1 0]
    """
    if isinstance(perm, (str, bytes)) or not isinstance(perm, Iterable):
        raise TypeError(
            f"jax_rccl.pshuffle: perm must be a sequence of ints, got {type(perm).__name__} "
            f"{perm!r}"
        )
    what = "jax_rccl.pshuffle: perm must be a sequence of ints"
    sources = [api._int(p, what) for p in perm]
    if sorted(sources) != list(range(len(sources))):
        raise ValueError(
            f"jax_rccl.pshuffle: perm {sources} is not a permutation of "
            f"range({len(sources)}): it must hold each of 0..{len(sources) - 1} exactly once"
        )
    return api.ppermute(x, axis_name, [(s, d) for d, s in enumerate(sources)])


@_docs.fill
def pswapaxes(x, axis_name, axis: int, *, axis_index_groups=None):
    """Swap the named axis ``axis_name`` with the positional axis ``axis``, as
    :func:`jax.lax.pswapaxes`: ``all_to_all(x, axis_name, axis, axis)``.

    Args:
        {x_axis_name}
        axis: the positional axis; ``x.shape[axis]`` must equal the group size n.
        axis_index_groups: optional list of lists of axis indices, all of one size, covering every
            index once; each group swaps on its own.

    Returns:
        A pytree like ``x``, each leaf of the same shape: element k of ``axis`` on device j is
        element j of ``axis`` on device k.

    Differences from jax.lax.pswapaxes:
        it runs through :func:`all_to_all` on jax_rccl's runtime;
        a size other than n is refused at trace time naming the leaf.

    Example:
        {example_run}
        >>> f = jax.jit(jax.shard_map(lambda x: jr.pswapaxes(x, "i", 1), mesh=mesh,
        ...                           in_specs=P("i"), out_specs=P("i")))
        >>> x = np.arange(64).reshape(8, 8)
        >>> bool((f(x) == x.T).all())
        True
    """
    axes = api._axes(axis_name, "pswapaxes")
    _, n = api._groups(axis_index_groups, axes, "pswapaxes")
    for i, leaf in enumerate(jax.tree_util.tree_leaves(x)):
        shape = np.shape(leaf)
        if not shape:
            raise ValueError(f"jax_rccl.pswapaxes: leaf {i} is a scalar; it needs an axis to swap")
        d = api._canonical_dim(axis, len(shape), "pswapaxes", "axis")
        if shape[d] != n:
            raise ValueError(
                f"jax_rccl.pswapaxes: axis {d} of leaf {i} has size {shape[d]}; it must equal "
                f"the group size {n} of axis_name {axis_name!r}"
            )
    return api.all_to_all(x, axis_name, axis, axis, axis_index_groups=axis_index_groups)


# id(token) -> (a weak reference to the token, what its psend sent and received). An entry goes
# when its token is collected.
_sent: dict[int, tuple[weakref.ref, tuple]] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _sent.get(key)
    if entry is not None and entry[0] is ref:
        del _sent[key]


@_docs.fill
def psend(x, axis_name, perm: Iterable[tuple[int, int]]):
    """Send ``x`` along the (source, destination) pairs of ``perm`` over ``axis_name``, as
    :func:`jax.lax.psend`; :func:`precv` given the returned token receives it.

    Args:
        {x_axis_name}
        perm: (source, destination) pairs of axis indices, each source and destination at most
            once.

    Returns:
        A pytree of tokens shaped like ``x``, one per leaf, to pass to :func:`precv` in the same
        traced function.

    Differences from jax.lax.psend:
        it runs on CPU too (jax.lax lowers psend/precv on GPUs only);
        the data moves when psend is called, as :func:`ppermute` moves it; a precv whose token,
        axes, pairs, shape or dtype do not match its psend is refused at trace time (with jax.lax it
        fails at run time or hangs).

    Example:
        {example_run}
        >>> def f(x):
        ...     perm = [(i, (i + 1) % 8) for i in range(8)]
        ...     token = jr.psend(x, "i", perm)
        ...     return jr.precv(token, jax.ShapeDtypeStruct(x.shape, x.dtype), "i", perm)
        >>> print(run(f)(np.arange(8)))
        [7 0 1 2 3 4 5 6]
    """
    axes = api._axes(axis_name, "psend")
    pairs = api._pairs(perm, "psend")
    leaves, tree = jax.tree_util.tree_flatten(x)
    received = api._ppermute(list(leaves), axes, pairs, "psend") if leaves else []
    tokens = []
    for y in received:
        try:
            token = lax.create_token()
        except AttributeError:  # jax 0.10's eager shard_map holds no tokens
            raise NotImplementedError(
                "jax_rccl.psend returns a token, which an eagerly run shard_map cannot hold: "
                "put jax.jit around the shard_map"
            ) from None
        key = id(token)
        ref = weakref.ref(token, lambda r, key=key: _forget(key, r))
        _sent[key] = (ref, (y, axes, tuple(sorted(pairs))))
        tokens.append(token)
    return jax.tree_util.tree_unflatten(tree, tokens)


@_docs.fill
def precv(token, out_shape, axis_name, perm: Iterable[tuple[int, int]]):
    """What the :func:`psend` that returned ``token`` sent to this device, as :func:`jax.lax.precv`.

    Args:
        token: a token :func:`psend` returned, in the same traced function (not
            ``lax.create_token()``, nor one carried through a loop, a condition or a jit boundary).
        out_shape: a :class:`jax.ShapeDtypeStruct` (anything with ``.shape`` and ``.dtype``): the
            shape and dtype psend sent.
        axis_name: psend's mesh axis name or tuple of names.
        perm: the same (source, destination) pairs as psend's.

    Returns:
        An array of ``out_shape``: what the source of the pair naming this device sent, zeros where
        no pair names it as destination.

    Differences from jax.lax.precv:
        see :func:`psend`; a mismatch with its psend is a ValueError
        at trace time naming what differs.

    Example:
        {example_run}
        >>> def f(x):
        ...     token = jr.psend(x, "i", [(0, 7)])
        ...     return jr.precv(token, jax.ShapeDtypeStruct(x.shape, x.dtype), "i", [(0, 7)])
        >>> print(run(f)(np.arange(1.0, 9.0)))
        [0. 0. 0. 0. 0. 0. 0. 1.]
    """
    axes = api._axes(axis_name, "precv")
    pairs = tuple(sorted(api._pairs(perm, "precv")))
    try:
        shape, dtype = tuple(out_shape.shape), np.dtype(out_shape.dtype)
    except (AttributeError, TypeError):
        raise TypeError(
            "jax_rccl.precv: out_shape must have .shape and .dtype (a jax.ShapeDtypeStruct), "
            f"got {out_shape!r}"
        ) from None
    entry = _sent.get(id(token))
    if entry is None or entry[0]() is not token:
        raise ValueError(
            "jax_rccl.precv: token must be the token a jax_rccl.psend returned, in the same "
            "traced function (not lax.create_token(), nor one carried through a loop, a "
            "condition or a jit boundary): jax_rccl pairs each precv with its psend through it"
        )
    y, sent_axes, sent_pairs = entry[1]
    if sent_axes != axes or sent_pairs != pairs:
        raise ValueError(
            f"jax_rccl.precv: axis_name {axes} and perm {list(pairs)} must be those of the "
            f"psend that returned token: axis_name {sent_axes}, perm {list(sent_pairs)}"
        )
    if tuple(y.shape) != shape or np.dtype(y.dtype) != dtype:
        raise ValueError(
            f"jax_rccl.precv: out_shape is {shape} {dtype.name} but its psend sent "
            f"{tuple(y.shape)} {np.dtype(y.dtype).name}"
        )
    return y
