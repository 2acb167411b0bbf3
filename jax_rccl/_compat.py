"""Every JAX internal jax_rccl uses, and every difference between the JAX versions we support.

The rest of jax_rccl imports JAX internals (``jax._src``) only through this module
(tests/test_compat.py checks it), so a new JAX release means reading this file, not the whole
package. Checked against jax 0.10.2 (CPU), 0.11.0 (CPU) and 0.11.2 (CUDA 13):

=====================================  ======================================================
``jax._src`` module                    what jax_rccl takes from it
=====================================  ======================================================
``core``                               Primitive, Tracer, ShapedArray, typeof, the axis
                                       environment, pvary, NamedAxisEffect, shape predicates
``config``                             check_vma, auto_pcast, string_or_object_state
``interpreters.ad / batching``         Zero, UndefinedPrimal, instantiate_zeros; batching rules
``interpreters.mlir``                  lowering rules and their registry (``_lowerings``,
                                       ``_platform_specific_lowerings``, uncacheable set)
``interpreters.pxla``                  axis_groups (replica groups of a manual axis context)
``lax.lax``                            ``_const`` (constants typed like an example)
``lax.parallel``                       jax.lax's collective primitives and XLA's rules
``sharding_impls``                     SPMDAxisContext
``mesh``                               get_abstract_mesh (the manual axes)
``dispatch``                           apply_primitive (eager execution of our primitives)
``distributed``                        the client and coordinator of jax.distributed
``xla_bridge``                         known platforms and their aliases
``export._export``                     register_stable_custom_call_targets (0.10: the set of
                                       stable targets)
``lib.xla_client``                     CustomCallTargetTraits (command-buffer compatible)
``lib.mlir.ir / dialects.hlo``         MLIR types and StableHLO ops for the custom calls
=====================================  ======================================================
"""

from __future__ import annotations

import numpy as np
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import xla_bridge as _xla_bridge
from jax._src.interpreters import ad, batching, mlir, pxla  # noqa: F401 - re-exported
from jax._src.lax import lax as _lax
from jax._src.lax import parallel as lax_parallel  # noqa: F401 - re-exported
from jax._src.lib import xla_client  # noqa: F401 - re-exported
from jax._src.lib.mlir import ir  # noqa: F401 - re-exported
from jax._src.lib.mlir.dialects import hlo  # noqa: F401 - re-exported
from jax._src.sharding_impls import SPMDAxisContext

Primitive = _core.Primitive
Tracer = _core.Tracer
ShapedArray = _core.ShapedArray
apply_primitive = _dispatch.apply_primitive


def known_platforms() -> set[str]:
    """Every platform name JAX knows, aliases expanded ("gpu" -> "cuda", "rocm")."""
    names: set[str] = set()
    for p in _xla_bridge.known_platforms():
        names.update(_xla_bridge.expand_platform_alias(p))
    return names


def coordinator_address() -> str | None:
    """The address of jax.distributed's coordinator, or None."""
    from jax._src import distributed

    state = getattr(distributed, "global_state", None)
    return getattr(state, "coordinator_address", None)


def is_tracer(x) -> bool:
    return isinstance(x, _core.Tracer)


typeof = _core.typeof
Zero = ad.Zero
UndefinedPrimal = ad.UndefinedPrimal
is_undefined_primal = ad.is_undefined_primal
instantiate_zeros = ad.instantiate_zeros
not_mapped = None  # batching: an unbatched operand


def tangent_zero(primal_value):
    """A symbolic zero tangent for `primal_value`."""
    return Zero(_core.typeof(primal_value).to_tangent_aval())


def ct_zero(undefined_primal):
    """A symbolic zero cotangent for a linear input."""
    return Zero(undefined_primal.aval.to_ct_aval())


# --- varying manual axes ("vma") -------------------------------------------------------------


def varying(aval) -> frozenset:
    """The manual mesh axes over which values of type `aval` may differ."""
    return frozenset(getattr(getattr(aval, "mat", None), "varying", frozenset()))


def reduced(aval) -> frozenset:
    """The manual axes over which values of type `aval` are reduced: equal on every device,
    their cotangents unreduced (explicit sharding)."""
    return frozenset(getattr(getattr(aval, "mat", None), "reduced", frozenset()))


def unreduced(aval) -> frozenset:
    """The manual axes over which values of type `aval` are partial sums still to be added."""
    return frozenset(getattr(getattr(aval, "mat", None), "unreduced", frozenset()))


def with_axis_types(aval, *, varying, reduced=None, unreduced=None):
    """`aval` with its varying (and reduced / unreduced, when given) manual axes replaced."""
    fields = {"varying": frozenset(varying)}
    if reduced is not None:
        fields["reduced"] = frozenset(reduced)
    if unreduced is not None:
        fields["unreduced"] = frozenset(unreduced)
        if not fields["unreduced"] and hasattr(aval.mat, "unreduced_kind"):  # 0.11+
            fields["unreduced_kind"] = None
    return aval.update(manual_axis_type=aval.mat.update(**fields))


def unreduced_by_sum(aval) -> bool:
    """Whether the unreduced partial values of `aval` add up (0.11 records how they combine;
    0.10 has sums only)."""
    kind = getattr(getattr(aval, "mat", None), "unreduced_kind", None)
    return kind is None or getattr(kind, "name", str(kind)).lower().endswith("sum")


def with_varying(aval, vma):
    """`aval` with its varying manual axes replaced by `vma`."""
    return aval.update(manual_axis_type=aval.mat.update(varying=frozenset(vma)))


def preduced(x, axes):
    """Invariant -> reduced cast over `axes` (explicit sharding; the transpose of a sum of
    unreduced values)."""
    from jax._src.lax import parallel

    return parallel.preduced(x, tuple(axes))


def check_vma_enabled() -> bool:
    """True while tracing a shard_map body with check_vma=True."""
    return bool(_config._check_vma.value)


def auto_pcast_enabled() -> bool:
    return bool(getattr(_config, "auto_pcast", None) is None or _config.auto_pcast.value)


def pvary(x, axes):
    """Invariant -> varying cast over `axes` (a no-op where JAX would make it one)."""
    if not axes:
        return x
    return _core.pvary(x, tuple(axes))


def check_unreduced(avals, axes, name):
    _core.check_unreduced_args(list(avals), tuple(axes), name)


def manual_axes() -> tuple:
    """The mesh axes of the enclosing shard_map bodies, in mesh order: the axes a value's type
    may vary over (an axis bound by jax.vmap is none of them)."""
    from jax._src.mesh import get_abstract_mesh

    return tuple(get_abstract_mesh().manual_axes)


def drop_size_one_axes(axes: tuple) -> tuple:
    """Mirror jax.lax: with remove_size_one_mesh_axis_from_type, size-1 mesh axes vanish."""
    flag = getattr(_config, "remove_size_one_mesh_axis_from_type", None)
    if flag is None or not flag.value:
        return axes
    from jax._src.mesh import get_abstract_mesh

    shape = get_abstract_mesh().shape
    return tuple(a for a in axes if shape.get(a) != 1)


# --- named axes in scope ---------------------------------------------------------------------


def bound_axis_names() -> tuple:
    return tuple(_core.get_axis_env().axis_names())


def axis_exists(name) -> bool:
    return _core.get_axis_env().axis_exists(name)


def register_stable_custom_call_targets(names) -> None:
    """Tell jax.export that custom calls to `names` keep a stable ABI (it then serializes them
    without `disabled_checks`)."""
    from jax._src.export import _export

    _export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE.update(names)


def const_like(example, value):
    """`value` typed as jax.lax types a constant next to `example`: a weakly typed Python
    scalar stays a Python scalar of its type (psum(1, axis) is a Python int), anything else a
    NumPy array of `example`'s dtype."""
    return _lax._const(example, value)


def axis_size(name) -> int:
    return int(_core.get_axis_env().axis_size(name))


def named_axis_effects(axes):
    return {_core.NamedAxisEffect(a) for a in axes}


# --- lowering ----------------------------------------------------------------------------------


def device_groups(axis_context, axes) -> np.ndarray:
    """Positions in the flattened mesh of each group of devices along `axes` (rows)."""
    return np.asarray(pxla.axis_groups(axis_context, tuple(axes)), dtype=np.int64)


def mesh_device_ids(axis_context) -> np.ndarray:
    """Physical device ids (jax Device.id) of the mesh, flattened in mesh order."""
    return np.asarray(axis_context.mesh.device_ids, dtype=np.int64).reshape(-1)


def is_spmd_context(axis_context) -> bool:
    return isinstance(axis_context, SPMDAxisContext)


def module_platforms(ctx) -> tuple[str, ...]:
    return tuple(ctx.module_context.platforms)


def trace_state(name: str, default: str, help: str):
    """A thread-local string setting that is part of JAX's trace context and jit key."""
    return _config.string_or_object_state(
        name, default, help, include_in_jit_key=True, include_in_trace_context=True
    )


# --- multi-process: JAX's distributed key-value store -----------------------------------------


def distributed_client():
    """The key-value client of `jax.distributed.initialize`, or None when it was not called.

    0.10.2 .. 0.11.x keep it as ``jax._src.distributed.global_state.client`` (a
    DistributedRuntimeClient with ``key_value_set`` and ``blocking_key_value_get``)."""
    from jax._src import distributed

    state = getattr(distributed, "global_state", None)
    return getattr(state, "client", None)


def kv_set(client, key: str, value: str) -> None:
    client.key_value_set(key, value)


def kv_delete(client, key: str) -> None:
    client.key_value_delete(key)


def kv_get(client, key: str, timeout_s: float) -> str:
    """The value of `key`, waiting up to `timeout_s` for someone to set it (raises past it)."""
    value = client.blocking_key_value_get(key, max(1, int(timeout_s * 1000)))
    return value.decode() if isinstance(value, bytes) else value


def kv_try_get(client, key: str) -> str | None:
    """The value of `key` if it is set now, else None (never waits)."""
    try:
        value = client.key_value_try_get(key)
    except Exception:  # noqa: BLE001 - "not found" is an exception in every version
        return None
    return value.decode() if isinstance(value, bytes) else value


# --- shape polymorphism (jax.export with symbolic dimensions) ----------------------------------


def is_static_shape(shape) -> bool:
    """Whether every dimension of `shape` is a known integer (no symbolic dimension)."""
    return bool(_core.is_constant_shape(shape))


def definitely_empty(shape) -> bool:
    """Whether `shape` has no elements for every value of its symbolic dimensions (a symbolic
    dimension is >= 1 unless its constraints say otherwise, so `b` is never empty)."""
    return any(_core.definitely_equal(d, 0) for d in shape)


def lowering_for_export(ctx) -> bool:
    """Whether `ctx` lowers a program for jax.export (serialized, compiled elsewhere later)."""
    params = getattr(ctx.module_context, "lowering_parameters", None)
    return bool(getattr(params, "for_export", False))
