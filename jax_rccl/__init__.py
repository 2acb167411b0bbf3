"""jax_rccl: collective communication for JAX programs.

RCCL's planner ported to C++ (``jax_rccl.planner`` is its Python view), with the project's own
kernels behind XLA FFI custom calls.
"""

from __future__ import annotations

from jax_rccl import planner
from jax_rccl._jax_rccl import params as _native_params

__version__ = "0.1.0"

__all__ = ["planner", "params", "__version__"]


def params() -> list[dict[str, str]]:
    """Every parameter: name, environment variable, type, default, current value and doc."""
    table, warnings = _native_params()
    for w in warnings:
        import warnings as _w

        _w.warn(w, stacklevel=2)
    return list(table)
