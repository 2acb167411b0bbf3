"""Registration of the runtime's FFI targets and state types with JAX.

The targets (one per collective kind, see ``TARGETS``) are stateful typed-FFI handlers: an
``instantiate`` stage that runs once per compiled executable and an ``execute`` stage that runs
on every call, on every device. Their state type must be registered after the backend exists
(``jax.devices()``) and before the targets.

CPU targets are always registered. GPU builds (``JAX_RCCL_GPU=cuda|rocm``) also register the
same targets for platform CUDA (or ROCM) when JAX has a GPU backend, with the command-buffer
trait (XLA may capture them into CUDA graphs), plus the table mapping XLA's device ordinals to
JAX's global device ids.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
import threading
import warnings

import jax

from jax_rccl import _bootstrap, _compat, _docs, _jax_rccl

#: One target per collective kind of the FFI contract, named by the native side.
TARGETS = tuple(f"jax_rccl_{kind}" for kind in _jax_rccl.collective_kinds())

#: Variables the build reads (pyproject.toml's ``[tool.scikit-build.cmake.define]``): often
#: still set when a program runs, and not runtime settings.
BUILD_VARIABLES = (
    "JAX_RCCL_GPU",
    "JAX_RCCL_DEVICE_QUICK",
    "JAX_RCCL_DEVICE_TYPES",
    "JAX_RCCL_OPENSSL",
    "JAX_RCCL_TESTING",
    "JAX_RCCL_UCX",
)
#: Settings that existed once, with what became of them.
REMOVED_VARIABLES = {
    "JAX_RCCL_WORK_FIFO_DEPTH": "removed: the runtime's plans are persistent, so no work FIFO "
    "depth applies",
}
#: A prefix the test suite and the benchmarks keep for their own variables.
TEST_PREFIX = "JAX_RCCL_TEST_"

_lock = threading.Lock()


def unknown_settings(environ=None) -> list[str]:
    """One message per ``JAX_RCCL_*`` variable of ``environ`` (default: the process's) that no
    part of jax_rccl reads: a misspelt or removed setting, naming the closest known one."""
    environ = os.environ if environ is None else environ
    table, _ = _jax_rccl.params()
    known = [p["env"] for p in table] + list(BUILD_VARIABLES)
    out = []
    for name in sorted(environ):
        if not name.startswith("JAX_RCCL_") or name in known or name.startswith(TEST_PREFIX):
            continue
        if name in REMOVED_VARIABLES:
            out.append(f"jax_rccl: {name} is ignored ({REMOVED_VARIABLES[name]})")
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        out.append(
            f"jax_rccl: {name} is not a jax_rccl setting and is ignored{hint} "
            "(every setting: jax_rccl.params())"
        )
    return out


def check_settings() -> None:
    """Raises ValueError for the first ``JAX_RCCL_*`` setting whose value is not allowed:
    ``jax_rccl: JAX_RCCL_ALGO='bogus' has an unknown name 'bogus'; allowed: ...`` (the variable,
    its value and the values allowed; every setting, JAX_RCCL_ALGO and JAX_RCCL_PROTO included,
    the same way)."""
    try:
        _jax_rccl.check_params()
    except ValueError as e:
        # Raised afresh so that the error shows this call, not the binding's internals.
        raise ValueError(str(e)) from None


def _library_dirs() -> tuple[str, ...]:
    import jaxlib

    dirs = [os.path.dirname(os.path.abspath(m.__file__)) for m in (jax, jaxlib)]
    dirs.append(os.path.dirname(os.path.abspath(__file__)))  # jax_rccl
    dirs.append(os.path.dirname(os.path.abspath(contextlib.__file__)))  # the standard library
    return tuple(d + os.sep for d in dirs)


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn``, called in the function that asks, that names the
    innermost frame outside jax_rccl, JAX and the standard library: the user's line that led
    here (through jax.jit's tracing and lowering), not a line of jax_rccl."""
    skip = _library_dirs()
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 2


_registered = False


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
        # A bad JAX_RCCL_* value is a ValueError naming it here, before anything is lowered; a
        # JAX_RCCL_* variable that nothing reads (a misspelt setting) is a warning naming it,
        # attributed to the user's line that first used jax_rccl.
        check_settings()
        for message in unknown_settings():
            warnings.warn(message, stacklevel=user_stacklevel())
        # Several JAX processes meet when the first collective runs (the runtime calls
        # ensure_world as it connects its first group), not here: lowering or exporting a
        # program waits for no other process. What can be told without them is told now.
        _bootstrap.check_ready()
        _jax_rccl.set_world_provider(_bootstrap.ensure_world)
        for name, registration in _jax_rccl.cpu_ffi_types().items():
            jax.ffi.register_ffi_type(name, registration, platform="cpu")
        targets = _jax_rccl.cpu_ffi_targets()
        missing = set(TARGETS) - set(targets)
        if missing:
            raise RuntimeError(f"jax_rccl: the native module lacks the targets {sorted(missing)}")
        for name in TARGETS:
            jax.ffi.register_ffi_target(name, targets[name], platform="cpu", api_version=1)
        _register_gpu()
        _registered = True


_gpu_platform: str | None = None


def _native_gpu():
    """The native module's GPU part when it has the FFI handlers, else None."""
    gpu = getattr(_jax_rccl, "gpu", None)
    if gpu is None or not hasattr(gpu, "ffi_targets"):
        return None
    return gpu


def _gpu_devices() -> list:
    try:
        return list(jax.local_devices(backend="gpu"))
    except RuntimeError:  # no GPU backend
        return []


def gpu_platform() -> str | None:
    """ "CUDA" or "ROCM" when the GPU targets are registered with JAX, else None."""
    ensure_registered()
    return _gpu_platform


def _register_gpu() -> None:
    global _gpu_platform
    gpu = _native_gpu()
    if gpu is None:
        return
    devices = _gpu_devices()
    if not devices:
        return
    platform = "ROCM" if gpu.build_info().startswith("HIP") else "CUDA"
    # XLA's execute context names a device by its ordinal on this host; replica groups name
    # global ids.
    table = []
    for i, d in enumerate(devices):
        ordinal = getattr(d, "local_hardware_id", None)
        table.append((int(i if ordinal is None else ordinal), int(d.id)))
    gpu.set_local_devices(table)
    for name, registration in gpu.ffi_types().items():
        jax.ffi.register_ffi_type(name, registration, platform=platform)
    targets = gpu.ffi_targets()
    missing = set(TARGETS) - set(targets)
    if missing:
        raise RuntimeError(f"jax_rccl: the GPU module lacks the targets {sorted(missing)}")
    traits = _compat.xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE
    for name in TARGETS:
        jax.ffi.register_ffi_target(
            name, targets[name], platform=platform, api_version=1, traits=traits
        )
    _gpu_platform = platform


def world() -> dict | None:
    """The world table handed to the runtime (None in a single-process program)."""
    return _bootstrap.world()


@_docs.fill
def runtime_stats() -> dict[str, int]:
    """The runtime's counters since the process started (or since
    :func:`reset_runtime_stats`), summed over every device of this process.

    Returns:
        A dict of integers: ``executions`` counts each device's run of a call, so a collective
        over 8 devices of this process run 10 times counts 80; ``plans_built`` and
        ``instantiations`` (once per compiled program and device), ``rendezvous_timeouts``,
        ``mismatches`` (executions whose ranks disagreed on the call), ``errors``; the gauges
        ``communicators`` and ``rendezvous_pending``; ``net_*``: the network proxies of GPU
        groups across hosts (bytes each way; their connections' time, the part with every slot
        full and the part idle: docs/multiprocess-internals.md). GPU builds add
        ``gpu_communicators``. CPU and GPU handlers count into the same counters.
        :func:`jax_rccl.profile` gives the same figures per call site, with times.

    Example:
        {example_psum}
        >>> _ = f(np.arange(8.0)).block_until_ready()  # compiled (and planned) here
        >>> jr.reset_runtime_stats()
        >>> for _ in range(10):
        ...     _ = f(np.arange(8.0)).block_until_ready()
        >>> jr.runtime_stats()["executions"]  # 10 calls x 8 devices
        80
    """
    stats = dict(_jax_rccl.runtime_stats())
    gpu = _native_gpu()
    if gpu is not None:
        stats["gpu_communicators"] = int(gpu.communicators())
    return stats


def reset_runtime_stats() -> None:
    """Sets the runtime's counters (:func:`runtime_stats`) to zero; the gauges
    (``communicators``, ``rendezvous_pending``) keep their values.

    Returns:
        None.

    Example:
        >>> import jax_rccl as jr
        >>> jr.reset_runtime_stats()
        >>> jr.runtime_stats()["executions"]
        0
    """
    _jax_rccl.reset_runtime_stats()
