"""jax.lax's two conveniences over ppermute and all_to_all, with jax.lax's signatures.

``pshuffle(x, axis_name, perm)`` is a ppermute whose permutation names, for each axis index i,
the index perm[i] that i receives from; ``pswapaxes(x, axis_name, axis)`` swaps the named axis
with the positional one, an all_to_all that splits and concatenates along ``axis``. Both run
through the same custom calls as ``jax_rccl.ppermute`` / ``jax_rccl.all_to_all``, so they work
wherever those do (jit, shard_map, vmap, grad, scan).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import jax
import numpy as np

from jax_rccl import api

__all__ = ["pshuffle", "pswapaxes"]


def pshuffle(x, axis_name, perm: Sequence[int]):
    """Axis index i gets the value of axis index ``perm[i]`` (as jax.lax.pshuffle).

    `perm` holds every integer of ``range(len(perm))`` once; indices of the axis beyond
    ``len(perm)`` receive zeros, as jax.lax's ppermute gives them."""
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


def pswapaxes(x, axis_name, axis: int, *, axis_index_groups=None):
    """Swap the named axis `axis_name` with the positional axis `axis` (as jax.lax.pswapaxes):
    ``all_to_all(x, axis_name, axis, axis)``. ``x.shape[axis]`` must equal the group size."""
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
