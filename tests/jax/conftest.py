"""JAX tests run on 8 virtual CPU devices.

XLA reads ``--xla_force_host_platform_device_count`` when the CPU backend starts, so the flag is
set here, before any test touches a device. If the backend already started with fewer devices
(another conftest or plugin used JAX first), the tests of this folder are skipped.
"""

import os

import pytest

NUM_DEVICES = 8

_flag = "--xla_force_host_platform_device_count"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {_flag}={NUM_DEVICES}").strip()


def _cpu_device_count() -> int:
    import jax

    try:
        return len(jax.devices("cpu"))
    except RuntimeError:
        return 0


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    mine = [it for it in items if str(it.fspath).startswith(here)]
    if not mine:
        return
    n = _cpu_device_count()
    if n >= NUM_DEVICES:
        return
    skip = pytest.mark.skip(
        reason=f"needs {NUM_DEVICES} CPU devices (XLA_FLAGS={_flag}={NUM_DEVICES} before JAX "
        f"starts); the CPU backend has {n}"
    )
    for it in mine:
        it.add_marker(skip)


@pytest.fixture(scope="session")
def registered_runtime():
    """jax_rccl's CPU runtime registered with JAX; its error, if any, fails the test."""
    from jax_rccl import _ffi

    _ffi.ensure_registered()
