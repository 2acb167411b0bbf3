"""Making UCX loadable for the UCX network backend (``JAX_RCCL_NET=auto|ucx``).

The runtime opens UCP by its soname, ``libucp.so.0`` (ffi/comm/ucx_api.h); it links no UCX. A UCX
the system provides (a cluster's, built with verbs for InfiniBand or RoCE) is preferred: when the
dynamic loader finds one, it is the one used. Otherwise the libucx wheel's libraries
(``pip install jax_rccl[ucx]``: ``libucx-cu13``) are loaded with ``libucx.load_library()``; the
soname then resolves to them. ``load()`` does this once, before the runtime first needs UCX (the
bootstrap of a run across hosts, jax_rccl/_bootstrap.py).

UCX reads ``UCX_HANDLE_ERRORS`` when its libraries load; unless it is set, it is set to ``none``
first, so that UCX does not install its own handlers of crash signals in a JAX process (set it to
``bt`` for UCX's backtraces).
"""

from __future__ import annotations

import ctypes
import os
import threading

SONAME = "libucp.so.0"

_lock = threading.Lock()
_source: str | None = None


def _open(name: str) -> bool:
    try:
        ctypes.CDLL(name, mode=os.RTLD_LOCAL)
    except OSError:
        return False
    return True


def _load() -> str:
    os.environ.setdefault("UCX_HANDLE_ERRORS", "none")
    if _open(SONAME):
        return "system"
    try:
        import libucx
    except ImportError:
        return ""
    libucx.load_library()
    return "wheel" if _open(SONAME) else ""


def load() -> str:
    """Makes UCX loadable by the runtime (once per process) and says where it comes from:
    ``"system"`` (the dynamic loader's), ``"wheel"`` (the libucx wheel's) or ``""`` (none: the
    runtime's networks run on TCP, and ``JAX_RCCL_NET=ucx`` fails with an error saying why)."""
    global _source
    with _lock:
        if _source is None:
            _source = _load()
        return _source
