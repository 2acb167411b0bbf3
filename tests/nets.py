"""The networks that groups across processes run on in the tests (JAX_RCCL_NET): our TCP, and UCX
over its TCP and over its shared-memory transports (the faked hosts share this machine, so UCX may
use them); GPU groups: our TCP and UCX on the transports it picks itself. UCX is optional: its
cases skip where neither the libucx wheel nor a system libucp is here."""

from __future__ import annotations

import ctypes.util
import importlib.util

import pytest

BACKENDS = {
    "socket": {"JAX_RCCL_NET": "socket"},
    "ucx_tcp": {"JAX_RCCL_NET": "ucx", "UCX_TLS": "tcp"},
    "ucx_sm": {"JAX_RCCL_NET": "ucx", "UCX_TLS": "sm,self"},
}


def ucx_absent() -> str | None:
    """Why UCX is not here (None when it is): neither the libucx wheel nor a system libucp. A
    build without the UCX backend where UCX is here is a broken build, and fails the tests."""
    if importlib.util.find_spec("libucx") is not None or ctypes.util.find_library("ucp"):
        return None
    return "no UCX on this machine (pip install jax_rccl[ucx]); the UCX backend is optional"


NEEDS_UCX = pytest.mark.skipif(ucx_absent() is not None, reason=str(ucx_absent()))
NETS = ["socket", pytest.param("ucx_tcp", marks=NEEDS_UCX), pytest.param("ucx_sm", marks=NEEDS_UCX)]
UCX_NETS = [pytest.param("ucx_tcp", marks=NEEDS_UCX), pytest.param("ucx_sm", marks=NEEDS_UCX)]
# GPU groups across faked hosts (tests/gpu): our TCP, and UCX with the transports it picks.
GPU_BACKENDS = {"socket": {"JAX_RCCL_NET": "socket"}, "ucx": {"JAX_RCCL_NET": "ucx"}}
GPU_NETS = ["socket", pytest.param("ucx", marks=NEEDS_UCX)]
