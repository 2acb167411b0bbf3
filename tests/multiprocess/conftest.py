"""Multi-process tests: each test starts its own JAX processes (launcher.py) on this host.

Nothing here touches JAX devices in the pytest process. Tests that need collectives across
processes in the runtime are skipped while the installed native module predates
``_jax_rccl.set_world``.
"""

import functools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def runtime_has_world() -> bool:
    try:
        from jax_rccl import _jax_rccl
    except ImportError:
        return False
    return hasattr(_jax_rccl, "set_world")


def pytest_collection_modifyitems(config, items):
    if runtime_has_world():
        return
    skip = pytest.mark.skip(
        reason="the installed jax_rccl runtime has no set_world (no collectives across processes)"
    )
    for it in items:
        if "needs_world" in it.keywords:
            it.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs_world: runs collectives across processes in the jax_rccl runtime"
    )
