"""Registration of the CPU runtime's FFI targets and state type with JAX.

The targets (one per collective kind, see ``TARGETS``) are stateful typed-FFI handlers: an
``instantiate`` stage that runs once per compiled executable and an ``execute`` stage that runs
on every call, on every device. Their state type must be registered after the CPU backend exists
(``jax.devices()``) and before the targets.
"""

from __future__ import annotations

import itertools
import threading

import jax

from jax_rccl import _bootstrap, _jax_rccl

STATE_TYPE = "jax_rccl_cpu_state"

TARGETS = (
    "jax_rccl_all_reduce",
    "jax_rccl_all_gather",
    "jax_rccl_reduce_scatter",
    "jax_rccl_broadcast",
    "jax_rccl_reduce",
    "jax_rccl_all_to_all",
    "jax_rccl_ppermute",
)

_lock = threading.Lock()
_registered = False
_call_sites = itertools.count(1)


def ensure_registered() -> None:
    """Registers the state type and the CPU targets with JAX once per process (idempotent)."""
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        # The backend must exist before types are registered, or its start-up fails with
        # "Types used by FFI handlers must be registered before the handler registration".
        jax.devices()
        # Several JAX processes: meet them once and hand the world table to the runtime
        # before anything is lowered (a no-op in a single-process program).
        _bootstrap.ensure_world()
        for name, registration in _jax_rccl.cpu_ffi_types().items():
            jax.ffi.register_ffi_type(name, registration, platform="cpu")
        targets = _jax_rccl.cpu_ffi_targets()
        missing = set(TARGETS) - set(targets)
        if missing:
            raise RuntimeError(f"jax_rccl: the native module lacks the targets {sorted(missing)}")
        for name in TARGETS:
            jax.ffi.register_ffi_target(name, targets[name], platform="cpu", api_version=1)
        _registered = True


def next_call_site() -> int:
    """A process-wide unique id for one lowered custom call (keys the runtime's rendezvous)."""
    return next(_call_sites)


def world() -> dict | None:
    """The world table handed to the runtime (None in a single-process program)."""
    return _bootstrap.world()


def runtime_stats() -> dict[str, int]:
    """The CPU runtime's counters: plans_built, executions, instantiations, ..."""
    return dict(_jax_rccl.runtime_stats())


def reset_runtime_stats() -> None:
    _jax_rccl.reset_runtime_stats()
