"""jax_rccl: collective communication for JAX programs.

RCCL's planner ported to C++ (``jax_rccl.planner`` is its Python view), with the project's own
kernels behind XLA FFI custom calls.
"""

from __future__ import annotations

from jax_rccl import planner
from jax_rccl._ffi import reset_runtime_stats, runtime_stats
from jax_rccl._jax_rccl import cpu_topology as _cpu_topology
from jax_rccl._jax_rccl import params as _native_params
from jax_rccl._ragged import ragged_all_to_all
from jax_rccl.api import (
    all_gather,
    all_reduce,
    all_to_all,
    config,
    pbroadcast,
    pmax,
    pmean,
    pmin,
    ppermute,
    preduce,
    psum,
    psum_scatter,
)

__version__ = "0.1.0"

__all__ = [
    "planner",
    "params",
    "__version__",
    "psum",
    "pmax",
    "pmin",
    "pmean",
    "all_gather",
    "psum_scatter",
    "all_to_all",
    "ppermute",
    "ragged_all_to_all",
    "pbroadcast",
    "all_reduce",
    "preduce",
    "config",
    "runtime_stats",
    "reset_runtime_stats",
    "runtime_topology",
]


def params() -> list[dict[str, str]]:
    """Every parameter: name, environment variable, type, default, current value and doc."""
    table, warnings = _native_params()
    for w in warnings:
        import warnings as _w

        _w.warn(w, stacklevel=2)
    return list(table)


def runtime_topology(nranks: int) -> dict[str, object]:
    """The topology the CPU runtime plans a group of ``nranks`` devices with (a dict of
    TopologyView fields; ``planner.Topology.from_native`` turns it into a Topology)."""
    if not isinstance(nranks, int) or nranks < 1:
        raise ValueError(f"nranks must be an integer >= 1, got {nranks!r}")
    return dict(_cpu_topology(nranks))
