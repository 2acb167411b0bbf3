"""The paragraphs that many public docstrings share, written once.

A docstring names a shared paragraph by a line holding only ``{name}``, indented where the
paragraph is to stand; `fill` (a decorator) writes the paragraph there, each of its lines indented
as that line, so the function's ``__doc__`` reads in full (help(), the documentation, doctest).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

_F = TypeVar("_F", bound=Callable)

_X = """\
x: an array or a pytree of arrays, traced inside :func:`jax.shard_map` (or another
    transformation that binds ``axis_name``: jax.pmap, jax.vmap with ``axis_name``)."""

_EXAMPLE_MESH = """\
>>> import jax, numpy as np, jax_rccl as jr
>>> from jax.sharding import Mesh, PartitionSpec as P
>>> mesh = Mesh(jax.devices(), "i")  # 8 devices"""

PARAGRAPHS = {
    # Args: the operand of a collective.
    "x": _X,
    # Args: the operand and the axes of a collective.
    "x_axis_name": _X
    + "\naxis_name: a mesh axis name, or a tuple of names (the group is their product).",
    # Args: the groups of the reductions, whose sizes may differ.
    "reduction_groups": """\
axis_index_groups: optional list of lists of axis indices that together cover every
    index once; each group reduces on its own. Their sizes may differ.""",
    # Differences from jax.lax: where a collective runs.
    "runs_on_runtime": """\
Runs on jax_rccl's runtime (CPU: its host executor; GPU: its own kernels) with the
algorithm and protocol its planner picks (:func:`jax_rccl.explain` shows the choice;
:func:`jax_rccl.config`, ``JAX_RCCL_ALGO`` and ``JAX_RCCL_PROTO`` force it). Every leaf of
``x`` goes out in one grouped call. Arguments are checked at trace time, each error naming
the argument.""",
    # Example: a mesh of the 8 CPU devices and run(fn), fn jitted over it.
    "example_run": _EXAMPLE_MESH
    + """
>>> def run(fn):  # fn on each device's block of an array split over the 8 devices
...     return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P("i")))""",
    # Example: a mesh of the 8 CPU devices and f, a jitted psum over it.
    "example_psum": _EXAMPLE_MESH
    + """
>>> f = jax.jit(jax.shard_map(lambda x: jr.psum(x, "i"), mesh=mesh,
...                           in_specs=P("i"), out_specs=P("i")))""",
}

_MARK = re.compile(r"^( *)\{(\w+)\}$", re.MULTILINE)


def _paragraph(mark: re.Match) -> str:
    indent, name = mark.groups()
    return "\n".join(indent + line for line in PARAGRAPHS[name].splitlines())


def fill(fn: _F) -> _F:
    """`fn` with each ``{name}`` line of its docstring replaced by the paragraph `name`."""
    if fn.__doc__:  # None under python -OO
        fn.__doc__ = _MARK.sub(_paragraph, fn.__doc__)
    return fn
