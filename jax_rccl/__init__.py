"""jax_rccl: collective communication for JAX programs.

RCCL's planner ported to C++ (``jax_rccl.planner`` is its Python view), with the project's own
kernels behind XLA FFI custom calls.
"""

from __future__ import annotations

import importlib.util as _importlib_util
import os as _os
import sys as _sys


def _installed_extension_dir(here: str) -> str | None:
    """The installed jax_rccl package folder that holds the compiled extension, other than
    `here` (a source checkout's jax_rccl/), or None."""
    for entry in _sys.path:
        folder = _os.path.realpath(_os.path.join(entry or _os.getcwd(), "jax_rccl"))
        if folder == here or not _os.path.isdir(folder):
            continue
        if any(n.startswith("_jax_rccl.") for n in _os.listdir(folder)):
            return folder
    return None


if _importlib_util.find_spec("jax_rccl._jax_rccl") is None:
    # A source checkout ahead of the installed package on sys.path (Python puts the current or the
    # script's folder first): its jax_rccl/ folder has no compiled extension. It imports with
    # the installed package's compiled modules (those `make install` built from this checkout),
    # its Python from here.
    _here = _os.path.realpath(_os.path.dirname(_os.path.abspath(__file__)))
    _installed = _installed_extension_dir(_here)
    if _installed is None:
        raise ImportError(
            "jax_rccl's compiled extension (_jax_rccl) is in neither this source folder "
            f"({_here}) nor an installed jax_rccl package on sys.path: build and install it "
            "with `make install` (or `pip install .`) and run Python from the environment it "
            "installed into (`.venv/bin/python script.py`)."
        )
    __path__.append(_installed)  # noqa: F821 - the package's own __path__

from jax_rccl import planner
from jax_rccl._explain import Explanation, explain
from jax_rccl._export import export_checks
from jax_rccl._export import register_stable as _register_stable
from jax_rccl._ffi import reset_runtime_stats, runtime_stats
from jax_rccl._jax_rccl import cpu_topology as _cpu_topology
from jax_rccl._jax_rccl import params as _native_params
from jax_rccl._profile import Profile, profile
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
from jax_rccl.api_permute import precv, psend, pshuffle, pswapaxes
from jax_rccl.lax_backend import install, installed_platforms, uninstall

__version__ = "0.1.0"

__all__ = [
    "install",
    "uninstall",
    "installed_platforms",
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
    "pshuffle",
    "pswapaxes",
    "psend",
    "precv",
    "ragged_all_to_all",
    "pbroadcast",
    "all_reduce",
    "preduce",
    "config",
    "explain",
    "Explanation",
    "export_checks",
    "runtime_stats",
    "reset_runtime_stats",
    "profile",
    "Profile",
    "runtime_topology",
]


_register_stable()


def params() -> list[dict[str, str]]:
    """Every setting of the runtime (the ``JAX_RCCL_*`` environment variables).

    Returns:
        One dict per setting: ``name``, ``env`` (the variable), ``type`` (int, float, string),
        ``default``, ``value`` (as this process reads it now), ``allowed`` (the values it takes)
        and ``doc``. A value that does not parse is shown as its default, with a warning; when
        jax_rccl first runs, such a value is a ValueError instead.

    Example:
        >>> import jax_rccl
        >>> timeout = {p["env"]: p for p in jax_rccl.params()}["JAX_RCCL_TIMEOUT"]
        >>> timeout["default"], timeout["allowed"]
        ('300', 'a finite number of seconds > 0')
    """
    table, warnings = _native_params()
    for w in warnings:
        import warnings as _w

        _w.warn(w, stacklevel=2)
    return list(table)


def runtime_topology(nranks: int) -> dict[str, object]:
    """The topology the CPU runtime plans a group of ``nranks`` devices with.

    Args:
        nranks: the number of devices in the group (>= 1).

    Returns:
        A dict of the native planner's topology fields (nRanks, arch, intraLink, nChannels,
        buffSizes, ...); ``planner.Topology.from_native`` turns it into a Topology for
        ``planner.plan``. :func:`jax_rccl.explain` uses it to show a jitted function's plans.

    Example:
        >>> import jax_rccl
        >>> from jax_rccl import planner
        >>> topo = planner.Topology.from_native(jax_rccl.runtime_topology(4))
        >>> topo.nranks, topo.arch, topo.link
        (4, 'cpu', 'loopback')
    """
    if not isinstance(nranks, int) or nranks < 1:
        raise ValueError(f"nranks must be an integer >= 1, got {nranks!r}")
    return dict(_cpu_topology(nranks))
